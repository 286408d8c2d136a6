"""Weight-only quantisation in groups: b-bit weights, a scale and a zero point per group.

    from preln.quant import groups as gq
    g = gq.rtn(w, bits=4, group_size=32)             # round to nearest; w (M, K), out x in
    w_hat = g.dequantize()                            # (M, K)
    qlm = quantize_model(lm, "gptq", bits=4, group_size=16, calib=tokens)   # preln.quant.weight_only
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

Three methods choose the integers (:func:`preln.quant.weight_only.quantize_model`):

``"rtn"``
    round to nearest, each weight on its own.
``"gptq"``
    Frantar et al. 2022 (arXiv 2210.17323), :func:`preln.quant.gptq.gptq`: quantise one input column at
    a time and move the rounding error onto the columns not yet quantised, by the inverse Hessian
    of the layer's squared output error on calibration inputs.
``"awq"``
    Lin et al. 2023 (arXiv 2306.00978), :func:`preln.quant.awq.awq`: scale input channel k of W up by
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

from preln.validation import check_all_finite, check_bits, check_bool, positive_int

__all__ = ["GroupQuant", "SCALE_BYTES", "group_grid", "round_to_grid", "rtn", "pack_int4", "unpack_int4",
           "MAX_BITS", "check_weight", "group_size_of"]

#: bytes of one stored scale (float16, as the GPTQ and AWQ kernels keep them)
SCALE_BYTES = 2


#: the widest code of the group grid (int8's tensors take up to 16 bits, these pack into bytes)
MAX_BITS = 8


def check_weight(w, name="w"):
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype.kind not in "fiu" or w.dtype == np.bool_:
        raise ValueError(f"{name}: expected a 2-D (M, K) array of real numbers (out, in); got "
                         f"shape {w.shape}, dtype {w.dtype}")
    return check_all_finite(w.astype(np.float64), name)


def group_size_of(K, group_size):  # -> g, the number of input columns per group
    if group_size is None:
        return K
    group_size = positive_int(group_size, "group_size")
    if K % group_size:
        raise ValueError(f"group_size: expected a divisor of the K = {K} input columns; got {group_size}")
    return group_size


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
    w = check_weight(w)
    bits = check_bits(bits, hi=MAX_BITS)
    symmetric = check_bool(symmetric, "symmetric")
    M, K = w.shape
    g = group_size_of(K, group_size)
    wg = w.reshape(M, K // g, g)                                      # (M, groups, g)
    scale, zero = group_grid(wg, bits, symmetric)                     # (M, groups, 1)
    q, _ = round_to_grid(wg, scale, zero, bits, symmetric)
    return GroupQuant(q.reshape(M, K).astype(np.int16), scale[..., 0], zero[..., 0], bits, g, symmetric)


def pack_int4(q, group_size):  # (M, K) ints in [0, 15] -> (M, K // 2) uint8
    """Two 4-bit codes per byte: in each group of g columns, byte k holds column k in its low
    nibble and column k + g/2 in its high one -- so a kernel that unpacks a byte multiplies the
    low and high halves of the group by two contiguous runs of the input (preln.quant.qmatvec)."""
    q = np.asarray(q)
    M, K = q.shape
    g = group_size_of(K, group_size)
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
    g = group_size_of(2 * K2, group_size)
    pg = packed.reshape(M, 2 * K2 // g, 1, g // 2)
    return np.concatenate([pg & 15, pg >> 4], axis=2).reshape(M, 2 * K2)
