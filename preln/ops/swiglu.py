"""The gated MLP of the Llama family: SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer",
arXiv 2002.05202), with SiLU (Elfwing et al. 2018, arXiv 1702.03118; "Swish", Ramachandran et al.
2017, arXiv 1710.05941) as the gate's nonlinearity.

    a = x W_gate^T                    (..., F)   the gate's pre-activation
    b = x W_up^T                      (..., F)   the value it gates
    g = SiLU(a) * b                   (..., F)   SiLU(a) = a sigma(a)
    y = g W_down^T                    (..., D)

Weights are stored (out, in) as nn.Linear does: W_gate, W_up (F, D), W_down (D, F); no biases.
Three projections instead of two: with F = 8D/3 the MLP has the 8 D^2 weights of a 4D GELU MLP.

Backward, the forward read from the bottom up:

    dg = dy W_down;                  dW_down = dy^T g
    db = dg * SiLU(a);               ds = dg * b                  (g = s * b, s = SiLU(a))
    da = ds * sigma(a) (1 + a (1 - sigma(a)))                     (SiLU'(a))
    dx = da W_gate + db W_up;        dW_gate = da^T x;  dW_up = db^T x
"""
from typing import NamedTuple

import numpy as np
from scipy.special import expit

from preln.precision import SAFE, elementwise_dtype, no_watch
from preln.ops.linear import LinearCache, linear_backward, linear_forward

__all__ = ["SiLUCache", "SwiGLUCache", "silu", "silu_forward", "silu_backward", "swiglu_forward",
           "swiglu_backward"]


class SiLUCache(NamedTuple):
    a: np.ndarray      # the input; SiLU' is a function of it alone


def silu_forward(a):  # (...) -> (...)
    """Return ``(a * sigma(a), cache)``; sigma is scipy's expit (no overflow for large |a|),
    evaluated in at least float32 and rounded once to a's dtype."""
    ct = elementwise_dtype(a.dtype)
    ac = a.astype(ct, copy=False)
    s = expit(ac)
    s *= ac                                                      # a sigma(a)
    return s.astype(a.dtype, copy=False), SiLUCache(a)


def silu_backward(ds, cache):  # (...) -> (...)
    """da = ds * sigma(a) (1 + a (1 - sigma(a)))."""
    ct = elementwise_dtype(cache.a.dtype)
    ac = cache.a.astype(ct, copy=False)
    sig = expit(ac)
    grad = 1 - sig                                               # one new array, then in place
    grad *= ac
    grad += 1
    grad *= sig                                                  # sigma(a) (1 + a (1 - sigma(a)))
    grad *= ds.astype(ct, copy=False)
    return grad.astype(ds.dtype, copy=False)


def silu(a):
    """SiLU(a) = a sigma(a) (forward only)."""
    return silu_forward(np.asarray(a))[0]


class SwiGLUCache(NamedTuple):
    gate: LinearCache   # a = x W_gate^T: (x, W_gate)
    up: LinearCache     # b = x W_up^T: (x, W_up)
    a: np.ndarray       # (..., F) the gate's pre-activation
    b: np.ndarray       # (..., F) the up projection
    down: LinearCache   # y = g W_down^T: (g, W_down)


def swiglu_forward(x, w_gate, w_up, w_down, policy=SAFE, watch=no_watch):  # (..., D) -> (..., D)
    """Return ``(y, cache)``, y = (SiLU(x W_gate^T) * (x W_up^T)) W_down^T.

    x: (..., D); w_gate, w_up: (F, D); w_down: (D, F). Matmuls accumulate under ``policy``;
    SiLU and the product are elementwise in at least float32, rounded once to x's dtype.
    """
    a, c_gate = linear_forward(x, w_gate, None, policy)         # (..., F)
    watch("gate_proj", a, x)
    b, c_up = linear_forward(x, w_up, None, policy)             # (..., F)
    watch("up_proj", b, x)
    s, _ = silu_forward(a)                                      # s = SiLU(a)
    ct = elementwise_dtype(x.dtype)
    g = (s.astype(ct, copy=False) * b.astype(ct, copy=False)).astype(x.dtype, copy=False)
    watch("gate", g, s, b)                                      # g = s * b
    y, c_down = linear_forward(g, w_down, None, policy)         # (..., D)
    watch("down_proj", y, g)
    return y, SwiGLUCache(c_gate, c_up, a, b, c_down)


def swiglu_backward(dy, cache, policy=SAFE):  # (..., D) -> (..., D), (F, D), (F, D), (D, F)
    """Return ``(dx, dw_gate, dw_up, dw_down)``."""
    c_gate, c_up, a, b, c_down = cache
    dg, dw_down, _ = linear_backward(dy, c_down, policy)        # y = g W_down^T
    ct = elementwise_dtype(a.dtype)
    s, c_silu = silu_forward(a)                                 # recomputed: SiLU(a)
    dgc = dg.astype(ct, copy=False)
    db = (dgc * s.astype(ct, copy=False)).astype(dg.dtype, copy=False)   # g = s * b
    ds = (dgc * b.astype(ct, copy=False)).astype(dg.dtype, copy=False)
    da = silu_backward(ds, c_silu)                              # s = SiLU(a)
    dx, dw_gate, _ = linear_backward(da, c_gate, policy)        # a = x W_gate^T
    dx_up, dw_up, _ = linear_backward(db, c_up, policy)         # b = x W_up^T
    dx += dx_up                                                 # x feeds both projections
    return dx, dw_gate, dw_up, dw_down
