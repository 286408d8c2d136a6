"""Weight-only quantisation in groups: b-bit weights, a scale and a zero point per group.

    from preln import groupquant as gq
    g = gq.rtn(w, bits=4, group_size=32)             # round to nearest; w (M, K), out x in
    w_hat = g.dequantize()                            # (M, K)
    qlm = gq.quantize_weights(lm, "gptq", bits=4, group_size=16, calib=tokens)   # or "rtn", "awq"
    perplexity(qlm, val_ids)

The grid. For a weight W (M, K) (out, in, as a Linear stores it) and a group size g dividing K,
the weights W[m, j g : (j + 1) g] of row m share a scale S and a zero point Z. Asymmetric (the
default of the GPTQ and AWQ reference code; min <= 0 <= max, so 0 is exactly representable)::

    S = (max - min) / (2^b - 1),   Z = round(-min / S),   q = clamp(round(w / S) + Z, 0, 2^b - 1)
    w^ = S (q - Z)

symmetric: S = max |w| / (2^(b-1) - 1), Z = 0, q in [-(2^(b-1) - 1), 2^(b-1) - 1]. ``group_size``
None is one group per row (per-channel scales). Rounding is half to even (np.rint).

Storage (:meth:`GroupQuant.nbytes`): b bits per weight -- 4-bit codes are packed two per byte,
:func:`pack_int4` -- plus a float16 scale and a b-bit zero point per group, so 4-bit with groups
of 128 costs 4 + 20/128 ~ 4.16 bits per weight.

Three methods choose the integers (:func:`quantize_weights`):

``"rtn"``
    round to nearest, each weight on its own.
``"gptq"``
    Frantar et al. 2022 (arXiv 2210.17323), :func:`preln.gptq.gptq`: quantise one input column at
    a time and move the rounding error onto the columns not yet quantised, by the inverse Hessian
    of the layer's squared output error on calibration inputs.
``"awq"``
    Lin et al. 2023 (arXiv 2306.00978), :func:`preln.awq.awq`: scale input channel k of W up by
    s_k = mean|x_k|^alpha (and the input down by s_k) before rounding, alpha chosen by a grid
    search on calibration inputs, so the channels that carry large activations lose less.

GPTQ and AWQ calibrate layer after layer ("true sequential", as GPTQ's reference code can): each
linear layer's calibration inputs come from a forward pass in which every earlier linear layer is
already quantised. Only the four linear layers of each block are quantised; embeddings, the LM
head, LayerNorm and the biases stay float32.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["GroupQuant", "METHODS", "group_grid", "round_to_grid", "rtn", "pack_int4",
           "unpack_int4", "WeightOnlyLinear", "WeightOnlyBlock", "WeightOnlyLM", "quantize_weights"]

#: the methods of :func:`quantize_weights`
METHODS = ("rtn", "gptq", "awq")
#: bytes of one stored scale (float16, as the GPTQ and AWQ kernels keep them)
SCALE_BYTES = 2


def _check_bits(bits):
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 8:
        raise ValueError(f"bits: expected an int in [2, 8]; got {bits!r}")
    return int(bits)


def _check_weight(w, name="w"):
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype.kind not in "fiu" or w.dtype == np.bool_:
        raise ValueError(f"{name}: expected a 2-D (M, K) array of real numbers (out, in); got "
                         f"shape {w.shape}, dtype {w.dtype}")
    return w.astype(np.float64)


def _groups(K, group_size):  # -> g, the number of input columns per group
    if group_size is None:
        return K
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"group_size: expected a positive int or None (one group per row); "
                         f"got {group_size!r}")
    if K % group_size:
        raise ValueError(f"group_size: expected a divisor of the K = {K} input columns; got {group_size}")
    return int(group_size)


def group_grid(w, bits, symmetric=False):  # (..., g) -> scale (..., 1), zero (..., 1)
    """The grid of each group, the last axis of ``w``: scale S and integer zero point Z."""
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        amax = np.abs(w).max(axis=-1, keepdims=True)
        return np.where(amax > 0, amax / qmax, 1.0), np.zeros(amax.shape)
    lo = np.minimum(w.min(axis=-1, keepdims=True), 0.0)             # the range holds 0
    hi = np.maximum(w.max(axis=-1, keepdims=True), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    return scale, np.rint(-lo / scale)


def round_to_grid(w, scale, zero, bits, symmetric=False):  # -> (q, w^), both w's shape
    """q = clamp(round(w / S) + Z) and w^ = S (q - Z), elementwise (S, Z broadcast)."""
    lo, hi = (-(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)
    q = np.clip(np.rint(w / scale) + zero, lo, hi)
    return q, scale * (q - zero)


class GroupQuant(NamedTuple):
    """A weight (M, K) quantised in groups of ``group_size`` input columns."""

    q: np.ndarray            # (M, K) integer codes, int16
    scale: np.ndarray        # (M, K // group_size) float
    zero: np.ndarray         # (M, K // group_size) integer zero points, as float (0: symmetric)
    bits: int
    group_size: int
    symmetric: bool

    def dequantize(self):  # -> (M, K) float64
        M, K = self.q.shape
        g = self.group_size
        q = self.q.reshape(M, K // g, g).astype(np.float64)
        return (self.scale[..., None] * (q - self.zero[..., None])).reshape(M, K)

    def nbytes(self):
        """Bytes stored: the codes at ``bits`` bits, a float16 scale and a ``bits``-bit zero
        point per group (no zero point when symmetric)."""
        n_groups = self.scale.size
        code_bits = self.q.size * self.bits + (0 if self.symmetric else n_groups * self.bits)
        return -(-code_bits // 8) + n_groups * SCALE_BYTES


def rtn(w, bits=4, group_size=None, symmetric=False):  # (M, K) -> GroupQuant
    """Round to nearest, in groups of ``group_size`` input columns of each row."""
    w = _check_weight(w)
    bits = _check_bits(bits)
    M, K = w.shape
    g = _groups(K, group_size)
    wg = w.reshape(M, K // g, g)                                      # (M, groups, g)
    scale, zero = group_grid(wg, bits, symmetric)                     # (M, groups, 1)
    q, _ = round_to_grid(wg, scale, zero, bits, symmetric)
    return GroupQuant(q.reshape(M, K).astype(np.int16), scale[..., 0], zero[..., 0], bits, g,
                      bool(symmetric))


def pack_int4(q, group_size):  # (M, K) ints in [0, 15] -> (M, K // 2) uint8
    """Two 4-bit codes per byte: in each group of g columns, byte k holds column k in its low
    nibble and column k + g/2 in its high one -- so a kernel that unpacks a byte multiplies the
    low and high halves of the group by two contiguous runs of the input (preln.qmatvec)."""
    q = np.asarray(q)
    M, K = q.shape
    g = _groups(K, group_size)
    if g % 2:
        raise ValueError(f"group_size: expected an even group size to pack two codes per byte; got {g}")
    if q.min() < 0 or q.max() > 15:
        raise ValueError(f"q: expected 4-bit codes in [0, 15]; got [{q.min()}, {q.max()}]")
    qg = q.reshape(M, K // g, 2, g // 2).astype(np.uint8)            # (M, groups, halves, g/2)
    return (qg[:, :, 0] | (qg[:, :, 1] << 4)).reshape(M, K // 2)


def unpack_int4(packed, group_size):  # (M, K // 2) uint8 -> (M, K) uint8
    """The inverse of :func:`pack_int4`."""
    packed = np.asarray(packed, np.uint8)
    M, K2 = packed.shape
    g = _groups(2 * K2, group_size)
    pg = packed.reshape(M, 2 * K2 // g, 1, g // 2)
    return np.concatenate([pg & 15, pg >> 4], axis=2).reshape(M, 2 * K2)


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
        from .quant import block_forward
        x = np.asarray(x, np.float32)
        return block_forward(self.params, self.config, x, key_padding_mask,
                             lambda name, h: self.linears[name](h))

    def weight_nbytes(self):
        return sum(l.weight_nbytes() for l in self.linears.values())


class WeightOnlyLM:
    """A :class:`preln.lm.TinyLM` whose blocks are :class:`WeightOnlyBlock`; embeddings, LM head
    and the final LayerNorm stay float32. Maps (B, S) token ids to (B, S, V) logits."""

    def __init__(self, lm, blocks, method, bits, group_size):
        self.config = lm.config
        self.own = {k: v.astype(np.float32) for k, v in lm.own.items()}
        self.norm = {k: v.astype(np.float32) for k, v in lm.stack.norm.items()}
        self.eps = lm.stack.config.eps
        self.blocks, self.method, self.bits, self.group_size = blocks, method, bits, group_size

    def __call__(self, tokens):  # (B, S) int -> (B, S, V) float32
        from .ops import layer_norm_forward
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens: expected a (B, S) integer array; got shape {tokens.shape}, "
                             f"dtype {tokens.dtype}")
        S = tokens.shape[1]
        h = self.own["tok_emb.weight"][tokens] + self.own["pos_emb.weight"][:S]     # (B, S, D)
        for block in self.blocks:
            h = block(h)
        if self.norm:
            h = layer_norm_forward(h, self.norm["weight"], self.norm["bias"], self.eps)[0]
        w = self.own["tok_emb.weight"] if self.config.tie_weights else self.own["head.weight"]
        return h @ w.T + self.own["head.bias"]                                       # (B, S, V)

    forward = __call__

    def weight_nbytes(self):
        return sum(b.weight_nbytes() for b in self.blocks)


def _attention_output(x, shape, p, cfg):
    """in_proj's effective weight -> the attention sublayer's output on inputs x (B S, D): what
    AWQ's search compares for the q, k, v projection."""
    from .ops import attention_forward, merge_heads, split_heads

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
        from .gptq import gptq
        return WeightOnlyLinear(gptq(w, x, bits, group_size, symmetric, **options), b)
    from .awq import awq
    res = awq(w, x, bits, group_size, symmetric, output=output, **options)
    return WeightOnlyLinear(res.quant, b, in_scale=res.scale)


def quantize_weights(lm, method, bits=4, group_size=None, calib=None, symmetric=False, **options):
    """A weight-only quantised copy of a :class:`preln.lm.TinyLM` -> :class:`WeightOnlyLM`.

    method: "rtn", "gptq" or "awq" (module docstring). calib: (B, S) token ids (GPTQ and AWQ;
    ignored by RTN). options: passed on -- GPTQ's ``block_size`` and ``damp``, AWQ's ``n_grid``.
    """
    from .lm import TinyLM
    from .quant import _WEIGHT, block_forward
    if not isinstance(lm, TinyLM):
        raise TypeError(f"lm: expected a preln.lm.TinyLM; got {type(lm).__name__}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}; got {method!r}")
    bits = _check_bits(bits)
    if method == "rtn" and options:
        raise TypeError(f"quantize_weights: method 'rtn' takes no options; got {sorted(options)}")
    h = None
    if method != "rtn":
        if calib is None:
            raise ValueError(f"calib: method {method!r} needs calibration token ids (B, S); got None")
        tokens = np.asarray(calib)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"calib: expected (B, S) integer token ids; got shape {tokens.shape}, "
                             f"dtype {tokens.dtype}")
        h = lm.own["tok_emb.weight"][tokens] + lm.own["pos_emb.weight"][:tokens.shape[1]]   # (B, S, D)
    blocks = []
    for layer in lm.stack.layers:
        p64 = {k: v.astype(np.float64) for k, v in layer.params.items()}
        linears = {}

        def linear(name, x):          # quantise each linear the first time it runs, from its input
            w, b = _WEIGHT[name]
            if name not in linears:
                out = (_attention_output(x, h.shape, p64, layer.config)
                       if method == "awq" and name == "in_proj" else None)
                linears[name] = _quantize_linear(method, p64[w], p64[b], x, bits, group_size,
                                                 symmetric, options, out)
            return linears[name](x).astype(np.float64)

        if h is None:                                                  # RTN: no data needed
            for name, (w, b) in _WEIGHT.items():
                linears[name] = _quantize_linear(method, p64[w], p64[b], None, bits, group_size,
                                                 symmetric, options)
        else:                         # true sequential: the next inputs come from quantised layers
            h = block_forward(p64, layer.config, h, linear=linear)
        blocks.append(WeightOnlyBlock(p64, layer.config, linears))
    return WeightOnlyLM(lm, blocks, method, bits, group_size)
