"""Numerically stable softmax: subtract the row max before exp, so the largest exponent is 0.

A row with no finite entry (every key masked with -inf) gives zeros, never NaN.
"""
import numpy as np

from preln.precision import SAFE, compute_dtype, no_watch


def softmax_forward(x, axis=-1, policy=SAFE, watch=no_watch):  # (...) -> (...)
    """Return ``(p, cache)`` with ``p = exp(x) / sum(exp(x))`` along ``axis``; the cache is p."""
    ct = compute_dtype(x.dtype, policy)
    xc = x.astype(ct, copy=False)
    # One new array, e; exp and the division then work in place on it (the (B, H, S, S) scores
    # are the block's largest tensor: every temporary of that size costs a pass over memory).
    if policy.subtract_max:
        m = xc.max(axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)        # all -inf row: keep exp(-inf) = 0, avoid inf - inf
        e = np.subtract(xc, m)
        np.exp(e, out=e)
    else:
        e = np.exp(xc)                            # overflows float16 once x > ln 65520 = 11.09
    e = watch("exp", e, x)
    s = e.sum(axis=axis, keepdims=True, dtype=ct)
    s[s == 0] = 1                                 # a fully masked row: 0 / 1 = 0
    p = watch("normalize", np.divide(e, s, out=e), e)
    p = p.astype(x.dtype, copy=False)
    return p, p


def softmax_backward(dp, p, axis=-1, policy=SAFE):  # (...) -> (...)
    """ds = p * (dp - <p, dp>) along ``axis``."""
    ct = compute_dtype(dp.dtype, policy)
    pc, dpc = p.astype(ct, copy=False), dp.astype(ct, copy=False)
    ds = pc * dpc                                                     # one new array, then in place
    dot = ds.sum(axis=axis, keepdims=True, dtype=ct)                  # <p, dp> per row
    np.subtract(dpc, dot, out=ds)
    ds *= pc
    return ds.astype(dp.dtype, copy=False)


def softmax(x, axis=-1, policy=SAFE):
    """Softmax of ``x`` along ``axis`` (forward only)."""
    return softmax_forward(np.asarray(x), axis, policy)[0]
