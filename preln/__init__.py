"""preln: the Pre-LN Transformer residual block in numpy, for teaching.

    x: (B, S, D) -> LN -> Attn -> + x -> LN -> MLP -> + x -> y: (B, S, D)

Every op has a forward and a hand-written backward (``preln.ops``); :class:`TransformerBlock`
assembles them and matches ``torch.nn.TransformerEncoderLayer`` given the same weights.
"""
from .block import KVCache, PreLNTransformerBlock, TransformerBlock, default_heads, param_shapes
from .config import BlockConfig
from .llama import LlamaBlock, LlamaConfig, LlamaKVCache
from .precision import NAIVE, SAFE, Overflow, Policy, SUPPORTED_DTYPES, Watch
from .stack import StackKVCache, TransformerStack

__version__ = "0.2.0"
__all__ = ["BlockConfig", "TransformerBlock", "PreLNTransformerBlock", "Policy", "SAFE", "NAIVE",
           "Overflow", "Watch", "TransformerStack", "KVCache", "StackKVCache", "SUPPORTED_DTYPES",
           "default_heads", "param_shapes", "LlamaBlock", "LlamaConfig", "LlamaKVCache"]
