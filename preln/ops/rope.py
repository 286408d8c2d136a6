"""Rotary position embeddings, RoPE (Su et al. 2021, "RoFormer", arXiv 2104.09864), in the
rotate-half layout that transformers' Llama uses (the GPT-NeoX layout).

A head's d_h dimensions form d_h / 2 pairs, dimension i with dimension i + d_h / 2, and at
position p pair i is rotated by the angle p * w_i, with frequencies falling geometrically:

    w_i      = theta^(-2 i / d_h),  i = 0 .. d_h/2 - 1          (theta = rope_theta, 10000 in Llama 2)
    cos, sin = cos(p w), sin(p w), each repeated over both halves   (..., S, d_h)
    out      = x * cos + rotate_half(x) * sin,   rotate_half(x) = concat(-x2, x1)

Rotating q at position m and k at position n makes their dot product a function of m - n alone,
<R_m q, R_n k> = <q, R_(n - m) k>, because R_m^T R_n = R_(n - m): attention scores see where two
tokens are relative to each other, not where they are. Rotations keep norms: |R_m q| = |q|.

Backward: a rotation is orthogonal, so dx = R^T dout -- the rotation by -p w:

    dx = dout * cos - rotate_half(dout) * sin

Positions are an argument, so a decoder with a KV cache rotates its new queries and keys at the
positions where they stand (``kv.length`` onwards). cos and sin are computed in float64 and rounded
once to the compute dtype (float32 for 16-bit storage).
"""
from typing import NamedTuple

import numpy as np

from preln.precision import elementwise_dtype

__all__ = ["ROPE_THETA", "RopeCache", "rope_frequencies", "rope_cos_sin", "rotate_half",
           "rope_forward", "rope_backward"]

#: Llama 2's base (Llama 3 uses 500000)
ROPE_THETA = 10000.0


class RopeCache(NamedTuple):
    cos: np.ndarray   # (S, d_h) or (B, 1, S, d_h), in the compute dtype
    sin: np.ndarray   # same shape


def _check_d_head(d_head, name):
    if isinstance(d_head, bool) or not isinstance(d_head, (int, np.integer)) or d_head < 2 or d_head % 2:
        raise ValueError(f"{name}: expected an even head width d_h >= 2 (RoPE rotates pairs of "
                         f"dimensions); got d_h = {d_head!r}")
    return int(d_head)


def _check_theta(theta):
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating)) or not theta > 1:
        raise ValueError(f"theta: expected a base rope_theta > 1 (10000 in Llama 2); got {theta!r}")
    return float(theta)


def rope_frequencies(d_head, theta=ROPE_THETA):  # -> (d_h/2,) float64
    """w_i = 1 / theta^(2 i / d_h) for i = 0 .. d_h/2 - 1, transformers' inv_freq, in float64."""
    d_head = _check_d_head(d_head, "d_head")
    return 1.0 / (_check_theta(theta) ** (np.arange(0, d_head, 2, dtype=np.float64) / d_head))


def check_positions(positions, name="positions"):
    if hasattr(positions, "detach") and hasattr(positions, "numpy"):   # a torch tensor
        positions = positions.detach().cpu().numpy()
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu" or pos.ndim not in (1, 2) or pos.size == 0:
        raise ValueError(f"{name}: expected a non-empty (S,) or (B, S) integer array; got "
                         f"shape {pos.shape}, dtype {pos.dtype}")
    if pos.min() < 0:
        raise ValueError(f"{name}: expected positions >= 0; got {pos.min()}")
    return pos


def rope_cos_sin(positions, d_head, theta=ROPE_THETA, dtype=np.float64):  # (S,) | (B, S) -> 2 x (..., d_h)
    """cos(p w) and sin(p w) for every position p, each repeated over both halves of the head.

    positions: (S,) ints -> (S, d_h) tables, shared by the whole batch; (B, S) ints -> (B, 1, S, d_h),
    one row of positions per sequence (broadcast over the heads). Computed in float64, then cast.
    """
    pos = check_positions(positions)
    angle = pos[..., None].astype(np.float64) * rope_frequencies(d_head, theta)   # (..., S, d_h/2)
    angle = np.concatenate([angle, angle], axis=-1)                               # (..., S, d_h)
    if pos.ndim == 2:
        angle = angle[:, None]                                                    # (B, 1, S, d_h)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def rotate_half(x):  # (..., d_h) -> (..., d_h)
    """concat(-x2, x1) with x1, x2 the two halves of the last axis: each pair (x1_i, x2_i) turned
    by 90 degrees, the sin part of the rotation."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _tables(x, positions, theta, cos_sin):
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D (B, H, S, d_h) array; got shape {x.shape}")
    B, _, S, d_head = x.shape
    _check_d_head(d_head, "x")
    ct = elementwise_dtype(x.dtype)
    if cos_sin is not None:
        cos, sin = cos_sin
        return cos.astype(ct, copy=False), sin.astype(ct, copy=False)
    pos = check_positions(positions)
    if pos.shape not in ((S,), (B, S)):
        raise ValueError(f"positions: expected shape (S,) = ({S},) or (B, S) = ({B}, {S}) for x of "
                         f"shape (B, H, S, d_h) = {x.shape}; got {pos.shape}")
    return rope_cos_sin(pos, d_head, theta, ct)


def rope_forward(x, positions=None, theta=ROPE_THETA, cos_sin=None):  # (B, H, S, d_h) -> (B, H, S, d_h)
    """Return ``(x * cos + rotate_half(x) * sin, cache)``: x rotated at ``positions``.

    x: (B, H, S, d_h), d_h even; positions: (S,) or (B, S) ints >= 0; theta: the base.
    cos_sin: the (cos, sin) of :func:`rope_cos_sin`, when the caller has them already (a block
    rotates q and k with the same tables); positions and theta are then not used.
    """
    cos, sin = _tables(x, positions, theta, cos_sin)
    xc = x.astype(cos.dtype, copy=False)
    out = rotate_half(xc)
    out *= sin
    out += xc * cos
    return out.astype(x.dtype, copy=False), RopeCache(cos, sin)


def rope_backward(dout, cache):  # (B, H, S, d_h) -> (B, H, S, d_h)
    """dx = R^T dout = dout * cos - rotate_half(dout) * sin: the rotation by the opposite angle."""
    cos, sin = cache
    dc = dout.astype(cos.dtype, copy=False)
    dx = rotate_half(dc)
    dx *= -sin
    dx += dc * cos
    return dx.astype(dout.dtype, copy=False)
