"""Layer normalisation (Ba, Kiros & Hinton 2016, arXiv 1607.06450), over the last axis.

    mean = x.mean(-1);  var = ((x - mean)**2).mean(-1)      (biased, as PyTorch)
    rstd = 1 / sqrt(var + eps)                              (eps inside the square root)
    y    = (x - mean) * rstd * gamma + beta

The statistics are computed in float32 or wider under the safe policy; under the naive policy a
16-bit sum of squares overflows silently: var = inf, rstd = 0, and the output is just beta.
"""
from typing import NamedTuple

import numpy as np

from preln.precision import SAFE, compute_dtype, no_watch


class LayerNormCache(NamedTuple):
    x: np.ndarray      # (..., D) the input
    gamma: np.ndarray  # (D,)
    mean: np.ndarray   # (..., 1) in the statistics dtype
    rstd: np.ndarray   # (..., 1) in the statistics dtype; xhat is recomputed in backward to save memory


def layer_norm_forward(x, gamma, beta, eps=1e-5, policy=SAFE, watch=no_watch):  # (..., D) -> (..., D)
    """Return ``(y, cache)``; x: (..., D), gamma and beta: (D,)."""
    ct = compute_dtype(x.dtype, policy)
    xc = x.astype(ct, copy=False)
    d = x.shape[-1]
    mean = xc.sum(-1, keepdims=True, dtype=ct) / ct.type(d)      # (..., 1)
    xm = xc - mean
    var = watch("variance", (xm * xm).sum(-1, keepdims=True, dtype=ct) / ct.type(d), x)  # (..., 1)
    rstd = 1 / np.sqrt(var + ct.type(eps))
    y = xm                                        # xm is not needed again: y is computed in its place
    y *= rstd
    y *= gamma.astype(ct, copy=False)
    y += beta.astype(ct, copy=False)
    return y.astype(x.dtype, copy=False), LayerNormCache(x, gamma, mean, rstd)


def layer_norm_backward(dy, cache, policy=SAFE):  # (..., D) -> (..., D), (D,), (D,)
    """Return ``(dx, dgamma, dbeta)``.

    With xhat = (x - mean) * rstd and g = gamma * dy:
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    """
    x, gamma, mean, rstd = cache
    ct = mean.dtype
    dyc = dy.astype(ct, copy=False)
    xhat = x.astype(ct, copy=False) - mean                        # recomputed, not cached
    xhat *= rstd
    axes = tuple(range(dy.ndim - 1))
    dgamma = (dyc * xhat).sum(axis=axes, dtype=ct)                # y = xhat * gamma + beta
    dbeta = dyc.sum(axis=axes, dtype=ct)
    g = dyc * gamma.astype(ct, copy=False)                        # dL/dxhat
    g_mean = g.mean(-1, keepdims=True, dtype=ct)                  # (..., 1)
    gx_mean = (g * xhat).mean(-1, keepdims=True, dtype=ct)        # (..., 1)
    dx = np.subtract(g, g_mean, out=g)                            # g and xhat are not needed again:
    xhat *= gx_mean                                               # dx is computed in their memory
    dx -= xhat
    dx *= rstd                                                    # rstd (g - mean(g) - xhat mean(g xhat))
    dt = dy.dtype
    return dx.astype(dt, copy=False), dgamma.astype(dt, copy=False), dbeta.astype(dt, copy=False)
