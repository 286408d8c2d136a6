"""Fused numba kernels for the blocks' memory-bound chains: one pass over memory instead of one per op.

- :mod:`preln.ops.fused.transformer`: bias + residual + LayerNorm, bias + GELU, softmax (the Pre-LN
  block), and their backwards; its names are re-exported here (``preln.ops.fused.softmax``).
- :mod:`preln.ops.fused.llama`: RMSNorm (+ residual), RoPE, SiLU * gate (the Llama block).
- ``_numba``: the JIT options, a vectorisable exp and the rows view both files share.
"""
from preln.ops.fused import llama
from preln.ops.fused.transformer import (FUSED_DTYPES, add_layer_norm, bias_gelu, bias_residual,
                                         gelu_backward, layer_norm, softmax, softmax_backward)

__all__ = ["FUSED_DTYPES", "layer_norm", "add_layer_norm", "bias_gelu", "bias_residual", "softmax",
           "gelu_backward", "softmax_backward", "llama"]
