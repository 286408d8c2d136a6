"""Serving: the paged KV cache and continuous batching."""
