"""A weight-only quantised model: every linear layer of a :class:`preln.models.lm.TinyLM` stored in
groups of ``bits``-bit codes (:mod:`preln.quant.groups`), chosen by round to nearest, GPTQ or AWQ;
activations stay float32, each weight is dequantised as it is used."""
from __future__ import annotations

import numpy as np

from preln.models.lm import TinyLM
from preln.ops import attention_forward, layer_norm_forward, merge_heads, split_heads
from preln.quant.awq import awq
from preln.quant.gptq import gptq
from preln.quant.groups import MAX_BITS, SCALE_BYTES, rtn
from preln.quant.int8 import LINEAR_WEIGHTS, block_forward
from preln.validation import check_bits, check_choice, check_input, check_mask

__all__ = ["METHODS", "WeightOnlyLinear", "WeightOnlyBlock", "WeightOnlyLM", "check_quantize_args",
           "quantize_weights"]

#: the methods of :func:`quantize_weights`
METHODS = ("rtn", "gptq", "awq")


# ---- a weight-only quantised model ---------------------------------------------------------------
class WeightOnlyLinear:
    """y = (x / s) W^^T + b, with W^ the dequantised group codes of W diag(s) (s = 1 unless AWQ):
    float32 arithmetic on weights that are stored in ``bits`` bits."""

    def __init__(self, gq, bias, in_scale=None):
        self.gq = gq
        self.in_scale = None if in_scale is None else np.asarray(in_scale, np.float32)   # (K,)
        self.w_hat = gq.dequantize().astype(np.float32)                                  # (M, K)
        if self.in_scale is not None:
            self.w_hat = self.w_hat / self.in_scale                   # (x / s) W^T = x (W^ / s)^T
        self.bias = np.asarray(bias, np.float32)

    def __call__(self, x):  # (N, K) -> (N, M)
        return np.asarray(x, np.float32) @ self.w_hat.T + self.bias

    def weight_nbytes(self):
        """Codes, scales and zero points, AWQ's float16 input scales, the float32 bias."""
        extra = 0 if self.in_scale is None else self.in_scale.size * SCALE_BYTES
        return self.gq.nbytes() + extra + self.bias.nbytes


class WeightOnlyBlock:
    """An inference-only block whose four linear layers are :class:`WeightOnlyLinear`."""

    def __init__(self, params, config, linears):
        self.params = {k: v.astype(np.float32) for k, v in params.items()}
        self.config, self.linears = config, linears

    def __call__(self, x, key_padding_mask=None):  # (B, S, D) -> (B, S, D) float32
        x = check_input(x, self.config.d_model, np.float32)              # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        return block_forward(self.params, self.config, x, kpm, lambda name, h: self.linears[name](h))

    def weight_nbytes(self):
        return sum(l.weight_nbytes() for l in self.linears.values())


class WeightOnlyLM:
    """A :class:`preln.models.lm.TinyLM` whose blocks are :class:`WeightOnlyBlock`; embeddings, LM head
    and the final LayerNorm stay float32. Maps (B, S) token ids to (B, S, V) logits."""

    def __init__(self, lm, blocks, method, bits, group_size):
        self.config, self.io = lm.config, lm.io
        self.own = {k: v.astype(np.float32) for k, v in lm.own.items()}
        self.norm = {k: v.astype(np.float32) for k, v in lm.stack.norm.items()}
        self.eps = lm.stack.config.eps
        self.blocks, self.method, self.bits, self.group_size = blocks, method, bits, group_size

    def __call__(self, tokens):  # (B, S) int -> (B, S, V) float32
        h, _ = self.io.embed(self.own, tokens)                                       # (B, S, D)
        for block in self.blocks:
            h = block(h)
        if self.norm:
            h = layer_norm_forward(h, self.norm["weight"], self.norm["bias"], self.eps)[0]
        return self.io.logits(self.own, h)[0]                                        # (B, S, V)

    forward = __call__

    def weight_nbytes(self):
        return sum(b.weight_nbytes() for b in self.blocks)


def _attention_output(x, shape, p, cfg):
    """in_proj's effective weight -> the attention sublayer's output on inputs x (B S, D): what
    AWQ's search compares for the q, k, v projection."""
    def output(w_eff):
        qkv = x.reshape(shape) @ w_eff.T + p["self_attn.in_proj_bias"]            # (B, S, 3D)
        q, k, v = (split_heads(t, cfg.n_heads) for t in np.split(qkv, 3, axis=-1))  # (B, H, S, d_h)
        o = merge_heads(attention_forward(q, k, v, None, cfg.causal)[0])           # (B, S, D)
        return o @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
    return output


def _quantize_linear(method, w, b, x, bits, group_size, symmetric, options, output=None):
    if method == "rtn":
        return WeightOnlyLinear(rtn(w, bits, group_size, symmetric), b)
    if method == "gptq":
        return WeightOnlyLinear(gptq(w, x, bits, group_size, symmetric, **options), b)
    res = awq(w, x, bits, group_size, symmetric, output=output, **options)
    return WeightOnlyLinear(res.quant, b, in_scale=res.scale)


def check_quantize_args(method, bits, calib, options, caller):
    """The checks every weight-only quantiser makes -> bits: a method of METHODS, bits in range,
    no options for RTN, calibration ids for GPTQ and AWQ."""
    check_choice(method, METHODS, "method")
    bits = check_bits(bits, hi=MAX_BITS)
    if method == "rtn" and options:
        raise TypeError(f"{caller}: method 'rtn' takes no options; got {sorted(options)}")
    if method != "rtn" and calib is None:
        raise ValueError(f"calib: method {method!r} needs calibration token ids (B, S); got None")
    return bits


def quantize_weights(lm, method, bits=4, group_size=None, calib=None, symmetric=False, **options):
    """A weight-only quantised copy of a :class:`preln.models.lm.TinyLM` -> :class:`WeightOnlyLM`.

    method: "rtn", "gptq" or "awq" (module docstring). calib: (B, S) token ids (GPTQ and AWQ;
    ignored by RTN). options: passed on -- GPTQ's ``block_size`` and ``damp``, AWQ's ``n_grid``.
    """
    if not isinstance(lm, TinyLM):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM; got {type(lm).__name__}")
    bits = check_quantize_args(method, bits, calib, options, "quantize_weights")
    h = None
    if method != "rtn":
        h, _ = lm.io.embed(lm.own, calib, name="calib")                # (B, S, D)
    blocks = []
    for layer in lm.stack.layers:
        p64 = {k: v.astype(np.float64) for k, v in layer.params.items()}
        linears = {}

        def linear(name, x):          # quantise each linear the first time it runs, from its input
            w, b = LINEAR_WEIGHTS[name]
            if name not in linears:
                out = (_attention_output(x, h.shape, p64, layer.config)
                       if method == "awq" and name == "in_proj" else None)
                linears[name] = _quantize_linear(method, p64[w], p64[b], x, bits, group_size,
                                                 symmetric, options, out)
            return linears[name](x).astype(np.float64)

        if h is None:                                                  # RTN: no data needed
            for name, (w, b) in LINEAR_WEIGHTS.items():
                linears[name] = _quantize_linear(method, p64[w], p64[b], None, bits, group_size,
                                                 symmetric, options)
        else:                         # true sequential: the next inputs come from quantised layers
            h = block_forward(p64, layer.config, h, linear=linear)
        blocks.append(WeightOnlyBlock(p64, layer.config, linears))
    return WeightOnlyLM(lm, blocks, method, bits, group_size)
