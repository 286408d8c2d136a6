"""Storage dtypes, the precision policy, and the overflow tracer.

A block stores parameters and activations in its dtype (float64, float32, float16 or bfloat16).
The *policy* says where arithmetic happens:

- ``"safe"`` (default): 16-bit values are widened to float32 for matmuls, reductions, LayerNorm
  statistics and softmax, and the result is rounded back -- what mixed-precision training does
  (Micikevicius et al. 2018, arXiv 1710.03740).
- ``"naive"``: everything stays in the storage dtype, the softmax does not subtract the row max and
  attention logits are scaled after the product -- it exists to show how 16-bit formats fail.

Single fixes can be turned on one at a time with ``Policy(...)``, which is what the precision
chapter does.

What "naive" can and cannot show: its matmuls and sums are numpy's own 16-bit kernels. Their
results are rounded to the storage dtype, so they overflow exactly when a real 16-bit unit would
(a sum of squares past 65504 is inf), but numpy carries partial sums more precisely than a plain
16-bit accumulator (pairwise summation; float32 inner loops for float16 matmul; ml_dtypes promotes
bfloat16 matmul to float32). Naive *rounding errors* are therefore an optimistic bound; naive
*overflows* are the real ones. The tracer (:class:`Watch`) reports the first op whose output is not finite.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
#: dtypes a block can store its parameters and activations in
SUPPORTED_DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
_DTYPE_NAMES = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": BFLOAT16}


def resolve_dtype(dtype, name="dtype"):
    """Return ``dtype`` as a ``np.dtype`` if it is one of SUPPORTED_DTYPES, else raise TypeError."""
    try:
        dt = np.dtype(_DTYPE_NAMES.get(dtype, dtype)) if not isinstance(dtype, np.dtype) else dtype
    except TypeError:
        dt = None
    if dt is None or dt not in SUPPORTED_DTYPES:   # (None == float64 to numpy: test it first)
        raise TypeError(
            f"{name}: expected one of float64, float32, float16, bfloat16; got {dtype!r}")
    return dt


@dataclass(frozen=True)
class Policy:
    """Where a 16-bit block does its arithmetic. Each flag is one of the standard fixes."""

    name: str = "custom"
    #: widen 16-bit matmuls, reductions, LayerNorm statistics and softmax to float32
    accumulate_fp32: bool = True
    #: subtract the row max before exp in softmax (exp(x) overflows float16 above ln 65520 = 11.09)
    subtract_max: bool = True
    #: scale q by 1/sqrt(d_h) before q @ k.T, so the logits never exist unscaled
    prescale_queries: bool = True


SAFE = Policy("safe")
NAIVE = Policy("naive", accumulate_fp32=False, subtract_max=False, prescale_queries=False)
POLICIES = {"safe": SAFE, "naive": NAIVE}


def resolve_policy(policy, name="policy"):
    """Accept "safe", "naive" or a Policy; anything else is a ValueError naming the argument."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) and policy in POLICIES:
        return POLICIES[policy]
    raise ValueError(f"{name}: expected 'safe', 'naive' or a preln.Policy; got {policy!r}")


def compute_dtype(dtype, policy=SAFE):
    """The dtype arithmetic happens in: float32 for 16-bit storage under an accumulating policy."""
    dtype = np.dtype(dtype)
    if dtype.itemsize < 4 and policy.accumulate_fp32:
        return np.dtype(np.float32)
    return dtype


def elementwise_dtype(dtype):
    """Elementwise functions (exp, erf, tanh) are evaluated in at least float32 and rounded to the
    storage dtype: one rounding, the same as a native 16-bit unit would give."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def matmul(a, b):
    """``a @ b``; 16-bit operands are multiplied through float32 BLAS and rounded back once.

    numpy's own float16 matmul already accumulates every dot product in float32 and rounds once
    (and ml_dtypes promotes bfloat16 to float32), but in a loop without BLAS: widening first is the
    same arithmetic, up to summation order, and hundreds of times faster. So a naive 16-bit matmul
    still overflows exactly when its result leaves the format.
    """
    if a.dtype.itemsize >= 4:
        return a @ b
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)


@dataclass(frozen=True)
class Overflow:
    """The first op whose output was not finite."""

    op: str
    shape: tuple
    dtype: str
    max_abs_input: float  # the largest finite |value| among the op's inputs
    #: "inf", "nan" or "inf and nan" if an input already held them (the op only passed them on), else ""
    nonfinite_input: str = field(default="", compare=False)

    def __str__(self):
        head = f"{self.op}: output {self.dtype}{list(self.shape)} is not finite; "
        if self.nonfinite_input:      # "largest |input| was 0" alone would hide where it came from
            return (head + f"an input already held {self.nonfinite_input} (passed on, not "
                    f"an overflow of this op); largest finite |input| was {self.max_abs_input:.6g}")
        return head + f"largest |input| was {self.max_abs_input:.6g}"


def _max_abs(arrays):  # -> (largest finite |value|, which non-finite values the arrays hold)
    m, inf, nan = 0.0, False, False
    for a in arrays:
        a = np.asarray(a)
        if a.size and a.dtype != bool:
            a = np.abs(a.astype(np.float64))
            finite = np.isfinite(a)
            inf, nan = inf or bool(np.isinf(a).any()), nan or bool(np.isnan(a).any())
            if finite.any():
                m = max(m, float(a[finite].max()))
    return m, " and ".join(k for k, held in (("inf", inf), ("nan", nan)) if held)


class Watch:
    """Called after every op as ``watch(op, out, *inputs)``; returns ``out`` unchanged.

    Disabled, it costs one attribute test. Enabled, it records the first op whose output holds an
    inf or NaN (``watch.first``), and with ``raise_error`` raises FloatingPointError naming it.
    """

    def __init__(self, enabled=False, raise_error=False):
        self.enabled = enabled or raise_error
        self.raise_error = raise_error
        self.first = None

    def __call__(self, op, out, *inputs):
        if self.enabled and self.first is None and not np.isfinite(out).all():
            self.first = Overflow(op, tuple(np.shape(out)), str(np.asarray(out).dtype), *_max_abs(inputs))
            if self.raise_error:
                raise FloatingPointError(str(self.first))
        return out

    def scope(self, prefix):
        """A watch that prefixes op names: ``watch.scope("norm1")("variance", ...)`` -> ``norm1.variance``."""
        return lambda op, out, *inputs: self(f"{prefix}.{op}", out, *inputs)


def no_watch(op, out, *inputs):
    """The default watch: checks nothing."""
    return out


def format_table():
    """Limits of the number formats the book uses, computed with ml_dtypes.finfo.

    Returns a list of dicts: name, bits, max, min_normal, min_subnormal, eps.
    """
    rows = []
    for name, dt in [("float64", np.float64), ("float32", np.float32), ("float16", np.float16),
                     ("bfloat16", BFLOAT16), ("float8_e4m3fn", FLOAT8_E4M3)]:
        fi = ml_dtypes.finfo(dt)
        rows.append(dict(name=name, bits=np.dtype(dt).itemsize * 8, max=float(fi.max),
                         min_normal=float(fi.smallest_normal),
                         min_subnormal=float(fi.smallest_subnormal), eps=float(fi.eps)))
    return rows
