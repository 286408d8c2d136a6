"""The block and its parts: configs, TransformerBlock, LlamaBlock, the KV caches, the stack."""
