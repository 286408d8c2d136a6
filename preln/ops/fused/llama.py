"""Fused kernels for the Llama block's memory-bound chains, in the manner of :mod:`preln.ops.fused`.

The modern block has its own elementwise chains between the matmuls, each several numpy passes
op by op and one pass here:

- RMSNorm, and the residual add with the RMSNorm after it (r = x + a; y = RMSNorm(r));
- RoPE, which also moves q and k from the projections' (B, S, H, d_h) layout to the attention's
  (B, H, S, d_h) -- the rotation and the transpose in one pass; its backward moves them back;
- the SwiGLU gate, g = SiLU(a) * b, and its backward (da, db from dg, a and b);
- RMSNorm's backward, with the residual stream's gradient added in the same pass.

The softmax is :func:`preln.ops.fused.softmax`, as in the Pre-LN block. Each kernel runs on the
calling thread (see :mod:`preln.ops.fused` for why not prange), takes float32 or float64, and
equals the numpy ops (:mod:`preln.ops.rms_norm`, :mod:`preln.ops.rope`, :mod:`preln.ops.swiglu`)
to round-off (tests/test_modern_fused.py). Row statistics accumulate in float64.
"""
import math

import numpy as np
from numba import njit

from preln.ops.fused._numba import FAST, JIT, exp, rows
from preln.ops.rms_norm import RMSNormCache

__all__ = ["rms_norm", "add_rms_norm", "rms_norm_backward", "silu_mul", "silu_mul_backward",
           "rope", "rope_backward"]


# ---- RMSNorm, optionally after a residual add ---------------------------------------------------
@njit(fastmath=FAST, **JIT)
def _rms_normrows(x, res, gamma, eps, r, y, rrms):  # (N, D) rows
    """r = x + res when res has rows (else r is x); y = r / sqrt(mean(r^2) + eps) * gamma."""
    N, D = x.shape
    add = res.shape[0] > 0
    for i in range(N):
        ss = 0.0
        if add:
            for j in range(D):
                v = x[i, j] + res[i, j]
                r[i, j] = v
                ss += v * v
        else:
            for j in range(D):
                ss += x[i, j] * x[i, j]
        src = r if add else x
        rs = 1.0 / math.sqrt(ss / D + eps)
        for j in range(D):
            y[i, j] = src[i, j] * rs * gamma[j]
        rrms[i, 0] = rs


def _norm(x, res, gamma, eps):
    x2 = rows(x)
    N, D = x2.shape
    add = res is not None
    res2 = rows(res) if add else np.empty((0, D), x.dtype)
    r = np.empty_like(x2) if add else np.empty((0, D), x.dtype)
    y, rrms = np.empty_like(x2), np.empty((N, 1), x.dtype)
    _rms_normrows(x2, res2, gamma, eps, r, y, rrms)
    src = r.reshape(x.shape) if add else x
    return src, y.reshape(x.shape), RMSNormCache(src, gamma, rrms.reshape(x.shape[:-1] + (1,)))


def rms_norm(x, gamma, eps=1e-6):  # (..., D) -> (..., D)
    """Fused ``rms_norm_forward``: ``(y, RMSNormCache)``, the cache the numpy op keeps (rrms in
    x's dtype), so either backward applies."""
    _, y, cache = _norm(x, None, gamma, eps)
    return y, cache


def add_rms_norm(x, res, gamma, eps=1e-6):  # (..., D) x 2 -> (..., D) x 2
    """r = x + res and y = RMSNorm(r) in one pass: a residual add and the norm after it.
    Returns ``(r, y, RMSNormCache of r)``."""
    return _norm(x, res, gamma, eps)


@njit(fastmath=FAST, **JIT)
def _rms_norm_backwardrows(dy, x, gamma, rrms, dres, dx, dgamma):  # (N, D) rows; dgamma (D,) float64
    """dx = rrms (g - xhat mean(g xhat)) [+ dres], g = gamma dy, xhat = x rrms; dgamma += dy xhat."""
    N, D = x.shape
    add = dres.shape[0] > 0
    for i in range(N):
        rs = rrms[i, 0]
        dot = 0.0
        for j in range(D):
            xh = x[i, j] * rs
            dgamma[j] += dy[i, j] * xh
            dot += dy[i, j] * gamma[j] * xh
        m = dot / D
        if add:
            for j in range(D):
                dx[i, j] = dres[i, j] + rs * (dy[i, j] * gamma[j] - x[i, j] * rs * m)
        else:
            for j in range(D):
                dx[i, j] = rs * (dy[i, j] * gamma[j] - x[i, j] * rs * m)


def rms_norm_backward(dy, cache, dres=None):  # (..., D) -> (..., D), (D,)
    """Fused ``rms_norm_backward``: ``(dx, dgamma)``; with ``dres`` the returned dx is dres + dx,
    the gradient of a residual stream that also feeds the norm (x1 -> x1 + MLP(RMSNorm(x1)))."""
    x, gamma, rrms = cache
    x2, dy2 = rows(x), rows(dy)
    N, D = x2.shape
    dres2 = rows(dres) if dres is not None else np.empty((0, D), x.dtype)
    dx = np.empty_like(x2)
    dgamma = np.zeros(D, np.float64)
    _rms_norm_backwardrows(dy2, x2, gamma, rows(rrms), dres2, dx, dgamma)
    return dx.reshape(x.shape), dgamma.astype(x.dtype)


# ---- the SwiGLU gate ------------------------------------------------------------------------------
@njit(fastmath=FAST, **JIT)
def _silu_mulrows(a, b, one, g):  # (N, F) rows
    N, F = a.shape
    for i in range(N):
        for j in range(F):
            v = a[i, j]
            g[i, j] = v / (one + exp(-v)) * b[i, j]               # SiLU(a) b, SiLU(a) = a / (1 + e^-a)


def silu_mul(a, b, out=None):  # (..., F) x 2 -> (..., F)
    """g = SiLU(a) * b in one pass; ``out=a`` writes g over a (inference: a is not needed again)."""
    a2, b2 = rows(a), rows(b)
    g = np.empty_like(a2) if out is None else out.reshape(a2.shape)
    _silu_mulrows(a2, b2, a2.dtype.type(1), g)
    return g.reshape(a.shape)


@njit(fastmath=FAST, **JIT)
def _silu_mul_backwardrows(dg, a, b, one, da, db):  # (N, F) rows
    """Each row through 1-D views: with five 2-D arrays indexed [i, j] the compiler's overlap checks
    give up and the loop runs scalar (measured 2x slower)."""
    N, F = a.shape
    for i in range(N):
        g_i, a_i, b_i, da_i, db_i = dg[i], a[i], b[i], da[i], db[i]
        for j in range(F):
            v = a_i[j]
            sig = one / (one + exp(-v))                            # sigma(a), recomputed
            db_i[j] = g_i[j] * (v * sig)                            # g = SiLU(a) b
            da_i[j] = g_i[j] * b_i[j] * (sig * (one + v * (one - sig)))   # SiLU'(a)


def silu_mul_backward(dg, a, b):  # (..., F) x 3 -> (..., F) x 2
    """da = dg b SiLU'(a), db = dg SiLU(a) in one pass."""
    a2 = rows(a)
    da, db = np.empty_like(a2), np.empty_like(a2)
    _silu_mul_backwardrows(rows(dg), a2, rows(b), a2.dtype.type(1), da, db)
    return da.reshape(a.shape), db.reshape(a.shape)


# ---- RoPE with the head transpose ---------------------------------------------------------------
@njit(fastmath=FAST, **JIT)
def _roperows(x, cos, sin, out):  # x (B, S, H, d_h); cos, sin (Bc, S, d_h/2); out (B, H, S, d_h)
    B, S, H, dh = x.shape
    half = dh // 2
    per_seq = cos.shape[0] > 1
    for b in range(B):
        cb = b if per_seq else 0
        for s in range(S):
            for h in range(H):
                for j in range(half):
                    x1, x2 = x[b, s, h, j], x[b, s, h, j + half]
                    c, sn = cos[cb, s, j], sin[cb, s, j]
                    out[b, h, s, j] = x1 * c - x2 * sn              # x cos + rotate_half(x) sin
                    out[b, h, s, j + half] = x2 * c + x1 * sn


@njit(fastmath=FAST, **JIT)
def _rope_backwardrows(d, cos, sin, dx):  # d (B, H, S, d_h) -> dx (B, S, H, d_h)
    B, H, S, dh = d.shape
    half = dh // 2
    per_seq = cos.shape[0] > 1
    for b in range(B):
        cb = b if per_seq else 0
        for s in range(S):
            for h in range(H):
                for j in range(half):
                    d1, d2 = d[b, h, s, j], d[b, h, s, j + half]
                    c, sn = cos[cb, s, j], sin[cb, s, j]
                    dx[b, s, h, j] = d1 * c + d2 * sn               # the rotation by -angle
                    dx[b, s, h, j + half] = d2 * c - d1 * sn


def _half_tables(cos_sin, dtype):  # (S, d_h) | (B, 1, S, d_h) -> 2 x (Bc, S, d_h/2) contiguous
    out = []
    for t in cos_sin:
        t = t.reshape(-1, t.shape[-2], t.shape[-1])                  # (Bc, S, d_h)
        out.append(np.ascontiguousarray(t[..., :t.shape[-1] // 2], dtype=dtype))
    return out


def rope(x, n_heads, cos_sin):  # (B, S, H d_h) -> (B, H, S, d_h)
    """RoPE of a projection's output: x (B, S, H d_h), as the linear wrote it, is rotated with the
    tables of :func:`preln.ops.rope.rope_cos_sin` and written out as (B, H, S, d_h), contiguous."""
    B, S, W = x.shape
    dh = W // n_heads
    cos, sin = _half_tables(cos_sin, x.dtype)
    out = np.empty((B, n_heads, S, dh), x.dtype)
    _roperows(np.ascontiguousarray(x).reshape(B, S, n_heads, dh), cos, sin, out)
    return out


def rope_backward(dout, cos_sin):  # (B, H, S, d_h) -> (B, S, H d_h)
    """dx = R^T dout, written in the projection's (B, S, H d_h) layout for its linear backward."""
    B, H, S, dh = dout.shape
    cos, sin = _half_tables(cos_sin, dout.dtype)
    dx = np.empty((B, S, H, dh), dout.dtype)
    _rope_backwardrows(np.ascontiguousarray(dout), cos, sin, dx)
    return dx.reshape(B, S, H * dh)
