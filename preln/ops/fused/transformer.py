"""Fused kernels for the block's memory-bound chains: one pass over memory instead of one per op.

Between its matmuls the block runs chains of elementwise ops and row reductions. In numpy each op
is a separate pass that reads its inputs from main memory and writes a new array back: LayerNorm
alone is about eight passes (sum, subtract, square, sum, sqrt, and the scale and shift), softmax
five (scale, mask, max, exp, sum, divide), bias + GELU about twenty (A&S erf in numpy). On a CPU, as
on a GPU, such ops are limited by memory bandwidth, not arithmetic (Ivanov et al. 2021, "Data
Movement Is All You Need", arXiv 2007.00072; Dao et al. 2022, arXiv 2205.14135, section 2), so the
cure is the same: *fuse* each chain into one kernel that reads its inputs once, keeps a row in
registers and L1 cache while it works, and writes its outputs once.

The kernels are written in numba (https://numba.readthedocs.io): plain Python loops over rows,
compiled to machine code on first use and cached on disk (``__pycache__``; the first use in a fresh
checkout compiles every kernel once, which takes tens of seconds). Each kernel runs on the calling
thread. Rows are independent, so ``numba.prange`` could spread them over the cores, and was tried:
on the project's shared 2-vCPU machine a second thread bought nothing under load, the OpenMP
threads it starts spun against OpenBLAS's for the same two cores (a forward measured 3x slower
than its matmuls), and parallel kernels took four times longer to compile.

numba was chosen over numexpr (elementwise expressions, but no row max or row sum inside an
expression, so softmax and LayerNorm would still take several passes) and over cache-blocked numpy
-- the unfused ops run on chunks of rows that stay in the L2 cache, no new dependency -- which
``python -m preln.bench`` measures beside the fused kernels: on the project's machine it was no
faster than the plain ops (every numpy op is still a separate loop that loads and stores every
element, with a call's overhead per chunk), while the fused kernels were 3-5x faster.

exp and Phi are evaluated with polynomials the compiler turns into SIMD code (a call to the C
library's exp would stop it from vectorising the loop): exp by Cody & Waite's range reduction and
Cephes' expf polynomial (float32, within a few units of 2^-23) or the Taylor series to r^13
(float64); Phi by Abramowitz & Stegun 7.1.26 in float32 (the formula of
``preln.ops.activations.normal_cdf``) and the C library's erfc in float64.

Every kernel equals the unfused ops (:mod:`preln.ops`) to round-off (tests/test_fused.py). They
cover float32 and float64 under the safe policy; 16-bit storage, the naive policy and the overflow
tracer use the unfused ops, op by op.
"""
import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from preln.ops.fused._numba import FAST, FUSED_DTYPES, JIT, exp, exp32, exp64, rows
from preln.ops.activations import AS_A, AS_P, INV_SQRT_2PI, SQRT_2, ActivationCache
from preln.ops.layernorm import LayerNormCache

__all__ = ["FUSED_DTYPES", "layer_norm", "add_layer_norm", "bias_gelu", "bias_residual", "softmax",
           "gelu_backward", "softmax_backward"]


# ---- Phi and phi as polynomials the compiler can vectorise ----------------------------------------
_f = np.float32
_A1, _A2, _A3, _A4, _A5 = (_f(a) for a in AS_A)
_AS_P32 = _f(AS_P / SQRT_2)
_ZERO32, _HALF32, _ONE32, _MHALF32, _INF32 = _f(0), _f(0.5), _f(1), _f(-0.5), _f(np.inf)
_INV_SQRT_2PI_32 = _f(INV_SQRT_2PI)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _phi(x):
    """Phi(x), the standard normal CDF, in the dtype of x."""


@overload(_phi, inline="never")
def _phi_impl(x):
    if x == types.float32:
        def phi32(x):   # A&S 7.1.26, as preln.ops.activations.normal_cdf does it for float32
            t = _ONE32 / (_ONE32 + _AS_P32 * abs(x))
            poly = _A1 + t * (_A2 + t * (_A3 + t * (_A4 + t * _A5)))
            tail = _HALF32 * t * poly * exp32(_MHALF32 * x * x)
            return _ONE32 - tail if x >= _ZERO32 else tail      # Phi(-|x|) = 0.5 erfc(|x| / sqrt 2)
        return phi32
    return lambda x: 0.5 * math.erfc(-x * _INV_SQRT2)


def _pdf(x):
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi), in the dtype of x."""


@overload(_pdf, inline="never")
def _pdf_impl(x):
    if x == types.float32:
        return lambda x: _INV_SQRT_2PI_32 * exp32(_MHALF32 * x * x)
    return lambda x: INV_SQRT_2PI * exp64(-0.5 * x * x)


# ---- LayerNorm, optionally after a residual add -------------------------------------------------
@njit(fastmath=FAST, **JIT)
def _layer_normrows(x, res, bias, gamma, beta, eps, r, y, mean, rstd):  # (N, D) rows
    """r = x + (res + bias) when res has rows (else r is x); y = (r - mean) rstd gamma + beta.
    Statistics in float64: one read of the row for the sum, one for the squares, one to write y."""
    N, D = x.shape
    add = res.shape[0] > 0
    for i in range(N):
        s = 0.0
        if add:
            for j in range(D):
                v = x[i, j] + (res[i, j] + bias[j])
                r[i, j] = v
                s += v
        else:
            for j in range(D):
                s += x[i, j]
        src = r if add else x
        m = s / D
        ss = 0.0
        for j in range(D):
            d = src[i, j] - m
            ss += d * d
        rs = 1.0 / math.sqrt(ss / D + eps)
        for j in range(D):
            y[i, j] = (src[i, j] - m) * rs * gamma[j] + beta[j]
        mean[i, 0] = m
        rstd[i, 0] = rs



def layer_norm(x, gamma, beta, eps=1e-5):  # (..., D) -> (..., D)
    """Fused ``layer_norm_forward``: returns ``(y, LayerNormCache)``, the same cache the unfused
    op keeps (x, gamma, mean and rstd in x's dtype), so ``layer_norm_backward`` applies."""
    x2 = rows(x)
    N, D = x2.shape
    y = np.empty_like(x2)
    mean, rstd = np.empty((N, 1), x.dtype), np.empty((N, 1), x.dtype)
    empty = np.empty((0, D), x.dtype)
    _layer_normrows(x2, empty, np.empty(0, x.dtype), gamma, beta, eps, empty, y, mean, rstd)
    stat_shape = x.shape[:-1] + (1,)
    return y.reshape(x.shape), LayerNormCache(x, gamma, mean.reshape(stat_shape), rstd.reshape(stat_shape))


def add_layer_norm(x, res, bias, gamma, beta, eps=1e-5):  # (..., D) x 2, (D,) -> (..., D) x 2
    """r = x + (res + bias), y = LayerNorm(r), in one pass: the residual add of a sublayer whose
    last linear's bias was left out, and the LayerNorm after it. Returns ``(r, y, LayerNormCache
    of r)``; ``bias=None`` adds nothing."""
    x2, res2 = rows(x), rows(res)
    N, D = x2.shape
    bias = np.zeros(D, x.dtype) if bias is None else bias
    r, y = np.empty_like(x2), np.empty_like(x2)
    mean, rstd = np.empty((N, 1), x.dtype), np.empty((N, 1), x.dtype)
    _layer_normrows(x2, res2, bias, gamma, beta, eps, r, y, mean, rstd)
    r = r.reshape(x.shape)
    stat_shape = x.shape[:-1] + (1,)
    return r, y.reshape(x.shape), LayerNormCache(r, gamma, mean.reshape(stat_shape), rstd.reshape(stat_shape))


# ---- bias + GELU, bias + residual --------------------------------------------------------------
@njit(fastmath=FAST, **JIT)
def _bias_gelurows(u, b, cdf, g, keep):  # (N, F) rows
    """u <- u + b; with keep, cdf = Phi(u) and g = u Phi(u); without, u <- u Phi(u) (g, cdf unused).
    u is read and written as one array: were the matmul's output and u separate arguments that may
    overlap, the compiler would need more run-time overlap checks than it makes, and not vectorise."""
    N, F = u.shape
    for i in range(N):
        if keep:
            for j in range(F):
                v = u[i, j] + b[j]
                c = _phi(v)
                u[i, j] = v
                cdf[i, j] = c
                g[i, j] = v * c
        else:
            for j in range(F):
                v = u[i, j] + b[j]
                u[i, j] = v * _phi(v)


def bias_gelu(u0, b, keep=True):  # (..., F), (F,) -> (..., F)
    """g = GELU(u0 + b) with the exact GELU, u Phi(u), in one pass; u = u0 + b is written over u0
    (the output of the matmul before, needed by nothing else), so pass an array you own.

    keep=True (training): returns ``(g, ActivationCache(u, "gelu", Phi(u)))`` -- what
    ``activation_backward`` needs. keep=False (inference): returns ``(g, None)`` with g written
    over u0 too, so no (..., F) array is allocated at all.
    """
    u2 = rows(u0)
    if keep:
        cdf, g = np.empty_like(u2), np.empty_like(u2)
        _bias_gelurows(u2, b, cdf, g, True)
        return g.reshape(u0.shape), ActivationCache(u2.reshape(u0.shape), "gelu", cdf.reshape(u0.shape))
    _bias_gelurows(u2, b, u2, u2, False)
    return u2.reshape(u0.shape), None


@njit(**JIT)   # no reassociation: x + (z0 + b) exactly as numpy adds it
def _bias_residualrows(x, z0, b, y):  # (N, D) rows
    N, D = x.shape
    for i in range(N):
        for j in range(D):
            y[i, j] = x[i, j] + (z0[i, j] + b[j])


def bias_residual(x, z0, b):  # (..., D) x 2, (D,) -> (..., D)
    """y = x + (z0 + b): a sublayer's last bias and the residual add, in one pass."""
    x2 = rows(x)
    y = np.empty_like(x2)
    _bias_residualrows(x2, rows(z0), b, y)
    return y.reshape(x.shape)


# ---- softmax: scale, mask, max, exp, sum, divide ------------------------------------------------
def _like(value, x):
    """``value`` as a number of x's type (float32 arithmetic must not meet a float64 constant)."""


@overload(_like, inline="never")
def _like_impl(value, x):
    if x == types.float32:
        return lambda value, x: np.float32(value)
    return lambda value, x: np.float64(value)


@njit(fastmath=FAST, **JIT)
def _softmaxrows(s, scale, kpm, causal, q_offset, p):  # (B, H, Sq, Sk) -> (B, H, Sq, Sk)
    """p = softmax(scale s + mask) along the last axis. Masked keys (kpm[b, j], or j > q_offset + i
    when causal) get exactly 0; a row with no visible key is all 0. The row stays in L1 cache
    across the three loops. p must not be s: the compiler cannot then prove that the loops'
    reads and writes do not overlap, and does not vectorise them (measured 4x slower)."""
    B, H, Sq, Sk = s.shape
    pad = kpm.shape[1] > 0
    zero = _like(0.0, scale)
    for n in range(B * H * Sq):
        b, h, i = n // (H * Sq), (n // Sq) % H, n % Sq
        row, out = s[b, h, i], p[b, h, i]                        # (Sk,) views
        end = min(Sk, q_offset + i + 1) if causal else Sk        # keys from `end` on are masked
        m = _like(-np.inf, scale)
        if pad:
            for j in range(end):                                 # 1: the row max over visible keys
                if not kpm[b, j]:
                    m = max(m, row[j] * scale)
        else:
            for j in range(end):
                m = max(m, row[j] * scale)
        if m == -np.inf:                                         # no visible key: a row of zeros
            out[:] = zero
            continue
        total = zero
        if pad:
            for j in range(end):                                 # 2: exp(scaled - max), and its sum
                e = zero if kpm[b, j] else exp(row[j] * scale - m)
                out[j] = e
                total += e
        else:
            for j in range(end):
                e = exp(row[j] * scale - m)
                out[j] = e
                total += e
        inv = _like(1.0, scale) / total
        for j in range(end):                                     # 3: normalise
            out[j] *= inv
        out[end:] = zero                                         # causally masked keys


def softmax(s, scale=1.0, key_padding_mask=None, causal=False, q_offset=0):
    """p = softmax(scale * s + mask) over the last axis of s: (B, H, Sq, Sk) -> (B, H, Sq, Sk).

    The mask is the attention's: key_padding_mask (B, Sk) bool, True = padding key; causal hides
    key j from query i when j > q_offset + i. P is a new array (see _softmax_rows for why not s).
    """
    if s.ndim != 4:
        raise ValueError(f"s: expected a 4-D (B, H, Sq, Sk) array; got shape {s.shape}")
    s = np.ascontiguousarray(s)
    kpm = np.zeros((1, 0), np.bool_) if key_padding_mask is None else np.ascontiguousarray(key_padding_mask)
    p = np.empty_like(s)
    _softmaxrows(s, s.dtype.type(scale), kpm, bool(causal), int(q_offset), p)
    return p


# ---- backward kernels ------------------------------------------------------------------------------
@njit(fastmath=FAST, **JIT)
def _gelu_backwardrows(u, cdf, dg, du):  # (N, F) rows
    N, F = u.shape
    for i in range(N):
        for j in range(F):
            v = u[i, j]
            du[i, j] = dg[i, j] * (cdf[i, j] + v * _pdf(v))     # GELU'(u) = Phi(u) + u phi(u)


def gelu_backward(dg, cache):  # (..., F) -> (..., F)
    """du = dg * (Phi(u) + u phi(u)) in one pass, from the cache of :func:`bias_gelu`."""
    u2 = rows(cache.x)
    du = np.empty_like(u2)
    _gelu_backwardrows(u2, rows(cache.cdf), rows(dg), du)
    return du.reshape(dg.shape)


@njit(fastmath=FAST, **JIT)
def _softmax_backwardrows(p, dp, ds):  # (R, C) rows
    R, C = p.shape
    for i in range(R):
        dot = 0.0
        for j in range(C):
            dot += p[i, j] * dp[i, j]                            # <p, dp> of the row
        for j in range(C):
            ds[i, j] = p[i, j] * (dp[i, j] - dot)


def softmax_backward(dp, p, out=None):  # (..., C) -> (..., C)
    """ds = p * (dp - <p, dp>) along the last axis in one pass; ``out=dp`` overwrites dp."""
    p2, dp2 = rows(p), rows(dp)
    ds = np.empty_like(dp2) if out is None else out.reshape(dp2.shape)
    _softmax_backwardrows(p2, dp2, ds)
    return ds.reshape(dp.shape)
