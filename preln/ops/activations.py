"""Activations of the MLP: GELU (Hendrycks & Gimpel 2016, arXiv 1606.08415), exact and tanh, and ReLU.

    gelu(x)      = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));   gelu'(x) = Phi(x) + x phi(x)
    gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    relu(x)      = max(x, 0)
"""
from typing import NamedTuple

import numpy as np
from scipy.special import erf

from ..precision import elementwise_dtype

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
SQRT_2 = np.sqrt(2.0)
SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)
INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)
GELU_TANH_COEF = 0.044715


class ActivationCache(NamedTuple):
    x: np.ndarray  # the input; every derivative below is a function of x alone
    kind: str


def activation_forward(x, kind="gelu"):  # (...) -> (...)
    """Return ``(act(x), cache)`` for kind in ACTIVATIONS."""
    ct = elementwise_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    if kind == "gelu":
        out = 0.5 * xc * (1.0 + erf(xc / ct.type(SQRT_2)))
    elif kind == "gelu_tanh":
        out = 0.5 * xc * (1.0 + np.tanh(ct.type(SQRT_2_OVER_PI) * (xc + ct.type(GELU_TANH_COEF) * xc ** 3)))
    elif kind == "relu":
        out = np.maximum(xc, 0)
    else:
        raise ValueError(f"kind: expected one of {ACTIVATIONS}; got {kind!r}")
    return out.astype(x.dtype, copy=False), ActivationCache(x, kind)


def activation_backward(dout, cache):  # (...) -> (...)
    """Return dL/dx = dout * act'(x)."""
    x, kind = cache
    ct = elementwise_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    if kind == "gelu":
        cdf = 0.5 * (1.0 + erf(xc / ct.type(SQRT_2)))                      # Phi(x)
        grad = cdf + xc * ct.type(INV_SQRT_2PI) * np.exp(-0.5 * xc * xc)   # + x phi(x)
    elif kind == "gelu_tanh":
        u = ct.type(SQRT_2_OVER_PI) * (xc + ct.type(GELU_TANH_COEF) * xc ** 3)
        t = np.tanh(u)
        du = ct.type(SQRT_2_OVER_PI) * (1.0 + 3.0 * ct.type(GELU_TANH_COEF) * xc * xc)
        grad = 0.5 * (1.0 + t) + 0.5 * xc * (1.0 - t * t) * du
    else:  # relu; the derivative at 0 is taken as 0, as PyTorch does
        grad = (xc > 0).astype(ct)
    return (dout.astype(ct, copy=False) * grad).astype(dout.dtype, copy=False)


def gelu(x):
    """Exact GELU, x * Phi(x)."""
    return activation_forward(np.asarray(x), "gelu")[0]


def gelu_tanh(x):
    """The tanh approximation of GELU."""
    return activation_forward(np.asarray(x), "gelu_tanh")[0]


def relu(x):
    return activation_forward(np.asarray(x), "relu")[0]
