"""Models built from blocks: the tiny LMs, the optimiser, the pretrained reference LM."""
