"""The functional core: each op is a ``*_forward(...) -> (out, cache)`` and a
``*_backward(dout, cache) -> grads`` pair (the interface of CS231n's layers.py)."""
from preln.ops.activations import ACTIVATIONS, activation_backward, activation_forward, gelu, gelu_tanh, relu
from preln.ops.attention import (attention_backward, attention_forward, flash_attention_backward,
                                 flash_attention_forward, flash_attention_train, mask_bias, merge_heads,
                                 repeat_kv, sdpa, split_heads)
from preln.ops.batchnorm import BatchNorm1d, batchnorm_backward, batchnorm_forward
from preln.ops.dropout import dropout_backward, dropout_forward
from preln.ops.layernorm import layer_norm_backward, layer_norm_forward
from preln.ops.linear import linear_backward, linear_forward
from preln.ops.rms_norm import rms_norm_backward, rms_norm_forward
from preln.ops.rope import rope_backward, rope_cos_sin, rope_forward, rotate_half
from preln.ops.softmax import softmax, softmax_backward, softmax_forward
from preln.ops.swiglu import silu, silu_backward, silu_forward, swiglu_backward, swiglu_forward

__all__ = [
    "ACTIVATIONS", "activation_backward", "activation_forward", "gelu", "gelu_tanh", "relu",
    "attention_backward", "attention_forward", "flash_attention_backward", "flash_attention_forward",
    "flash_attention_train", "mask_bias", "sdpa",
    "merge_heads", "split_heads", "BatchNorm1d", "batchnorm_backward", "batchnorm_forward",
    "dropout_backward", "dropout_forward", "layer_norm_backward",
    "layer_norm_forward", "linear_backward", "linear_forward", "softmax", "softmax_backward",
    "softmax_forward",
    "repeat_kv", "rms_norm_backward", "rms_norm_forward", "rope_backward", "rope_cos_sin",
    "rope_forward", "rotate_half", "silu", "silu_backward", "silu_forward", "swiglu_backward",
    "swiglu_forward",
]
