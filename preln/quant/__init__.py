"""Quantisation: INT8 (int8), weight-only groups (groups), GPTQ, AWQ, quantised matvecs."""
