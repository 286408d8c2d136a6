"""Activations of the MLP: GELU (Hendrycks & Gimpel 2016, arXiv 1606.08415), exact and tanh, and ReLU.

    gelu(x)      = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));   gelu'(x) = Phi(x) + x phi(x)
    gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    relu(x)      = max(x, 0)
"""
from typing import NamedTuple

import numpy as np
from scipy.special import erf

from preln.precision import elementwise_dtype

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
SQRT_2 = np.sqrt(2.0)
SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)
INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)
GELU_TANH_COEF = 0.044715


#: Abramowitz & Stegun (1964) 7.1.26: erfc(z) ~ t (a1 + a2 t + ... + a5 t^4) exp(-z^2), t = 1/(1 + p z),
#: for z >= 0, |error| <= 1.5e-7 -- the formula PyTorch's own CPU float32 erf uses.
AS_P = 0.3275911
AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)   # a1 .. a5
#: float32 Phi works through its input in chunks of this many elements, so that the dozen passes of
#: _normal_cdf_chunk run in the L2 cache rather than each streaming the (B, S, F) hidden layer from memory
CHUNK = 16384


def normal_cdf(x):  # (...) -> (...)
    """Phi(x) = 0.5 (1 + erf(x / sqrt 2)), the standard normal CDF.

    float64 (and anything not float32): scipy.special.erf, exact to round-off.
    float32: scipy's erf costs ~18 ns an element there (it is evaluated in double), ten times
    numpy's exp, and was the dearest op of the block after the matmuls; A&S 7.1.26 in numpy, chunk by
    chunk, is ~4x cheaper. It gives the lower tail Phi(-|x|) = 0.5 erfc(|x| / sqrt 2) directly, and
    Phi(x) = 1 - Phi(-x) for x >= 0: no 1 + erf cancellation, so GELU is as accurate as with scipy's
    float32 erf (max |error| ~6e-7 for |x| < 8).
    """
    if x.dtype != np.float32:
        return 0.5 * (1.0 + erf(x / x.dtype.type(SQRT_2)))
    cdf = np.empty(x.shape, np.float32)
    e, t = np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32)  # scratch, reused by every chunk
    m = np.empty(CHUNK, bool)
    xs, cs = x.reshape(-1), cdf.reshape(-1)                           # flat views
    for i in range(0, xs.size, CHUNK):
        j = min(i + CHUNK, xs.size)
        _normal_cdf_chunk(xs[i:j], cs[i:j], e[:j - i], t[:j - i], m[:j - i])
    return cdf


def _normal_cdf_chunk(x, cdf, e, t, m):  # 1-D float32 arrays of one length
    """Write Phi(x) into cdf and exp(-x^2/2) into e; t and m are scratch. Every op is in place."""
    f = np.float32
    np.multiply(x, x, out=e)
    e *= f(-0.5)
    np.exp(e, out=e)                                         # e = exp(-x^2 / 2)
    np.abs(x, out=t)
    t *= f(AS_P / SQRT_2)
    t += 1
    np.divide(f(1), t, out=t)                                # t = 1 / (1 + p |x| / sqrt 2)
    np.multiply(t, f(AS_A[4]), out=cdf)
    for a in AS_A[3::-1]:                                    # Horner: ((((a5 t + a4) t + a3) t + a2) t + a1) t
        cdf += f(a)
        cdf *= t
    cdf *= e
    cdf *= f(0.5)                                            # Phi(-|x|) = 0.5 erfc(|x| / sqrt 2)
    np.greater_equal(x, 0, out=m)                            # where Phi(x) = 1 - Phi(-|x|)
    np.copyto(t, m)
    t *= f(-2)
    t += 1                                                   # t = -1 where x >= 0, else +1
    cdf *= t
    cdf += m                                                 # 1 - Phi(-|x|) where x >= 0, else Phi(-|x|)


class ActivationCache(NamedTuple):
    x: np.ndarray    # the input; every derivative below is a function of x alone
    kind: str
    cdf: np.ndarray  # gelu only: Phi(x), kept so the backward does not evaluate erf a second time
                     # (one (B, S, F) array more in the cache buys ~60% of the GELU backward's time)


def activation_forward(x, kind="gelu"):  # (...) -> (...)
    """Return ``(act(x), cache)`` for kind in ACTIVATIONS."""
    ct = elementwise_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    cdf = None
    if kind == "gelu":
        cdf = normal_cdf(xc)                                      # Phi(x), kept for the backward
        out = cdf * xc                                            # x Phi(x)
    elif kind == "gelu_tanh":
        out = 0.5 * xc * (1.0 + np.tanh(ct.type(SQRT_2_OVER_PI) * (xc + ct.type(GELU_TANH_COEF) * xc ** 3)))
    elif kind == "relu":
        out = np.maximum(xc, 0)
    else:
        raise ValueError(f"kind: expected one of {ACTIVATIONS}; got {kind!r}")
    return out.astype(x.dtype, copy=False), ActivationCache(x, kind, cdf)


def activation_backward(dout, cache):  # (...) -> (...)
    """Return dL/dx = dout * act'(x)."""
    x, kind, cdf = cache
    ct = elementwise_dtype(x.dtype)
    xc = x.astype(ct, copy=False)
    if kind == "gelu":
        grad = np.multiply(xc, xc)                                         # one fresh array, then in place:
        grad *= ct.type(-0.5)
        np.exp(grad, out=grad)                                             # exp(-x^2 / 2)
        grad *= xc
        grad *= ct.type(INV_SQRT_2PI)                                      # x phi(x)
        grad += cdf                                                        # Phi(x) + x phi(x)
    elif kind == "gelu_tanh":
        u = ct.type(SQRT_2_OVER_PI) * (xc + ct.type(GELU_TANH_COEF) * xc ** 3)
        t = np.tanh(u)
        du = ct.type(SQRT_2_OVER_PI) * (1.0 + 3.0 * ct.type(GELU_TANH_COEF) * xc * xc)
        grad = 0.5 * (1.0 + t) + 0.5 * xc * (1.0 - t * t) * du
    else:  # relu; the derivative at 0 is taken as 0, as PyTorch does
        grad = (xc > 0).astype(ct)
    grad *= dout.astype(ct, copy=False)                                   # grad is a fresh array
    return grad.astype(dout.dtype, copy=False)


def gelu(x):
    """Exact GELU, x * Phi(x)."""
    return activation_forward(np.asarray(x), "gelu")[0]


def gelu_tanh(x):
    """The tanh approximation of GELU."""
    return activation_forward(np.asarray(x), "gelu_tanh")[0]


def relu(x):
    return activation_forward(np.asarray(x), "relu")[0]
