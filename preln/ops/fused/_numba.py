"""The numba helpers both fused kernel files share (preln.ops.fused.transformer, .llama): the JIT
options, exp as a polynomial the compiler can vectorise (float32: Cody & Waite's range reduction and
Cephes' expf polynomial; float64: the Taylor series to r^13), and the rows view. Why a polynomial and
not the C library's exp: a call stops the compiler from vectorising the loop."""
import math

import numpy as np
from numba import njit, types
from numba.extending import overload

__all__ = ["FUSED_DTYPES", "JIT", "FAST", "exp", "exp32", "exp64", "rows"]

#: storage dtypes the fused kernels take
FUSED_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))
#: error_model="numpy": x / 0 is inf, as in numpy, not a ZeroDivisionError check (a branch in every
#: loop that divides, which stops the compiler from vectorising it)
JIT = dict(nogil=True, cache=True, error_model="numpy")
#: reassociation lets the compiler vectorise the row sums (a different summation order: round-off)
FAST = {"reassoc", "contract", "nsz"}



_f = np.float32
_LOG2E, _LN2_HI, _LN2_LO = _f(1.4426950408889634), _f(0.693359375), _f(-2.12194440e-4)
#: Cephes expf: exp(r) ~ 1 + r + r^2 (c5 + c4 r + ... + c0 r^5) on |r| <= ln(2) / 2 (max error ~1 ulp)
_E0, _E1, _E2, _E3, _E4, _E5 = (_f(1.9875691500e-4), _f(1.3981999507e-3), _f(8.3334519073e-3),
                                _f(4.1665795894e-2), _f(1.6666665459e-1), _f(5.0000001201e-1))
#: below _EXP_MIN exp is under float32's smallest normal number and is returned as 0 (numpy gives a
#: subnormal there, < 1.2e-38); above _EXP_MAX = ln 2^127.5 the 2^k of the reduction would not be a
#: float32, and inf is returned (the kernels only take exp of numbers <= 0)
_EXP_MIN, _EXP_MAX = _f(-87.33654), _f(88.37626)
_ZERO32, _HALF32, _ONE32, _INF32 = _f(0), _f(0.5), _f(1), _f(np.inf)


@njit(fastmath=FAST, **JIT)
def exp32(x):  # float32 -> float32
    """exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts, Cody & Waite).
    Written without branches (the range checks are selects) so that loops calling it vectorise."""
    xc = min(max(x, _EXP_MIN), _EXP_MAX)
    k = np.floor(xc * _LOG2E + _HALF32)
    r = xc - k * _LN2_HI - k * _LN2_LO
    p = ((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5
    y = p * (r * r) + r + _ONE32
    two_k = (np.int32(k) + np.int32(127)) << np.int32(23)         # the bits of the float32 2^k
    y = y * np.int32(two_k).view(np.float32)
    y = _ZERO32 if x < _EXP_MIN else y
    return _INF32 if x > _EXP_MAX else y


_LN2_HI64, _LN2_LO64 = 6.93145751953125e-1, 1.42860682030941723212e-6
#: exp(r) for |r| <= ln(2) / 2 by its Taylor series to r^13 (the next term is below 4e-18 relatively)
_TAYLOR64 = tuple(1.0 / math.factorial(n) for n in range(14))
_EXP64_MIN, _EXP64_MAX = -708.3964185322641, 709.4361393031041   # 2^k stays a normal float64


@njit(fastmath=FAST, **JIT)
def exp64(x):  # float64 -> float64, the same reduction as exp32
    xc = min(max(x, _EXP64_MIN), _EXP64_MAX)
    k = np.floor(xc * 1.4426950408889634 + 0.5)
    r = xc - k * _LN2_HI64 - k * _LN2_LO64
    c = _TAYLOR64
    p = c[13]
    p = p * r + c[12]
    p = p * r + c[11]
    p = p * r + c[10]
    p = p * r + c[9]
    p = p * r + c[8]
    p = p * r + c[7]
    p = p * r + c[6]
    p = p * r + c[5]
    p = p * r + c[4]
    p = p * r + c[3]
    p = p * r + c[2]
    y = p * (r * r) + r + 1.0
    two_k = (np.int64(k) + np.int64(1023)) << np.int64(52)         # the bits of the float64 2^k
    y = y * np.int64(two_k).view(np.float64)
    y = 0.0 if x < _EXP64_MIN else y
    return np.inf if x > _EXP64_MAX else y


def exp(x):
    """exp in the dtype of x, as a polynomial the compiler can vectorise."""


@overload(exp, inline="never")
def _exp_impl(x):
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: exp64(x)


def rows(a):  # (..., D) -> (N, D), a view when a is contiguous
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])
