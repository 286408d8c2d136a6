"""Root-mean-square layer normalisation (Zhang & Sennrich 2019, arXiv 1910.07467), over the last axis.

    ms   = mean(x**2, -1)                 the second moment: no mean is subtracted
    rrms = 1 / sqrt(ms + eps)             eps inside the square root, as transformers' LlamaRMSNorm
    y    = x * rrms * gamma               a gain and no bias

LayerNorm re-centres and re-scales; RMSNorm only re-scales. Zhang & Sennrich found the re-centring
bought nothing measurable in their models and cost a reduction, so the Llama family dropped it.

Backward, with xhat = x * rrms and g = gamma * dy (the gradient reaching xhat):

    dx     = rrms * (g - xhat * mean(g * xhat))      LayerNorm's, without its "- mean(g)" term
    dgamma = sum over rows of dy * xhat

The statistic is computed in float32 or wider under the safe policy (16-bit storage); under the
naive policy a 16-bit sum of squares overflows past 65504 and the output is 0.
"""
from typing import NamedTuple

import numpy as np

from preln.precision import SAFE, compute_dtype, no_watch

__all__ = ["RMSNormCache", "rms_norm_forward", "rms_norm_backward"]


class RMSNormCache(NamedTuple):
    x: np.ndarray      # (..., D) the input
    gamma: np.ndarray  # (D,)
    rrms: np.ndarray   # (..., 1) in the statistics dtype; xhat is recomputed in backward to save memory


def rms_norm_forward(x, gamma, eps=1e-6, policy=SAFE, watch=no_watch):  # (..., D), (D,) -> (..., D)
    """Return ``(y, cache)`` with y = x / sqrt(mean(x**2) + eps) * gamma; x: (..., D), gamma: (D,)."""
    ct = compute_dtype(x.dtype, policy)
    xc = x.astype(ct, copy=False)
    d = x.shape[-1]
    ms = watch("mean_square", (xc * xc).sum(-1, keepdims=True, dtype=ct) / ct.type(d), x)  # (..., 1)
    rrms = 1 / np.sqrt(ms + ct.type(eps))                        # (..., 1)
    y = xc * rrms                                                # xhat, a new array: y is made in it
    y *= gamma.astype(ct, copy=False)
    return y.astype(x.dtype, copy=False), RMSNormCache(x, gamma, rrms)


def rms_norm_backward(dy, cache, policy=SAFE):  # (..., D) -> (..., D), (D,)
    """Return ``(dx, dgamma)``: dx = rrms * (g - xhat * mean(g * xhat)), g = gamma * dy."""
    x, gamma, rrms = cache
    ct = rrms.dtype
    dyc = dy.astype(ct, copy=False)
    xhat = x.astype(ct, copy=True)                               # recomputed, not cached
    xhat *= rrms                                                 # xhat = x * rrms
    axes = tuple(range(dy.ndim - 1))
    dgamma = (dyc * xhat).sum(axis=axes, dtype=ct)               # y = xhat * gamma
    g = dyc * gamma.astype(ct, copy=False)                       # dL/dxhat
    gx_mean = (g * xhat).mean(-1, keepdims=True, dtype=ct)       # (..., 1)
    xhat *= gx_mean                                              # xhat is not needed again:
    dx = np.subtract(g, xhat, out=g)                             # dx is computed in g's memory
    dx *= rrms                                                   # rrms (g - xhat mean(g xhat))
    dt = dy.dtype
    return dx.astype(dt, copy=False), dgamma.astype(dt, copy=False)
