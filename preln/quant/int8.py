"""INT8 quantisation of the block: scales, rounding, clamping, exact int32 accumulation, outliers.

Affine quantisation (Jacob et al. 2018, arXiv 1712.05877, Eq. 1) maps a real r to an integer q::

    r = S (q - Z)                  S > 0 the scale, Z the integer zero point
    q = clamp(round(r / S) + Z)    round half to even (np.rint), then clamp into the integer range

Symmetric *absmax* quantisation (Z = 0, the form LLM.int8 uses, Dettmers et al. 2022, arXiv
2208.07339, section 2.1) keeps int8 values in [-127, 127] with S = max abs(r) / 127, so that -q is
always representable; *asymmetric* quantisation uses uint8 [0, 255] with S = (max - min) / 255.
The max is taken over the whole tensor ("tensor"), or over each row: for a weight W (out, in) a
row is one output channel ("channel"), for activations X (N, in) one token ("token").

A quantised linear layer multiplies integers and accumulates in int32 (Jacob et al., Eq. 10)::

    y = (q_x q_w^T) * (S_x S_w^T) + b          q_x (N, K) int8, q_w (M, K) int8 -> int32 (N, M)

numpy has no int8 BLAS, so :func:`int_matmul` computes the integer product through float64 GEMM:
each product of two int8 values is an integer of magnitude <= 127^2 = 16,129, and every partial sum
is an integer of magnitude <= K 16,129; float64 represents every integer below 2^53 exactly, so as
long as K 16,129 < 2^53 no addition rounds, in any order the BLAS kernel chooses, and the result is
the exact integer. The int32 accumulator itself holds K 16,129 <= 2^31 - 1 only for K <= 133,144
(131,071 if -128 is allowed): :func:`int_matmul` checks that bound and raises OverflowError.

:func:`quantize_block` turns a float block (or a stack, or a :class:`preln.models.lm.TinyLM`) into an
inference-only model whose four linear layers run in int8 while LayerNorm, softmax, GELU and the
residual additions stay in float32. Schemes::

    "w8a16"        int8 weights per channel, activations float16 (weight-only quantisation)
    "w8a8-tensor"  per-tensor weights, static per-tensor activation scales from ``calib``, set by
                   ``calibration`` ("absmax", "percentile" or "mse": :func:`calibrate_scale`), or
                   ``calibration="dynamic"``: per tensor, from each input as it comes
    "w8a8"         per-channel weights, dynamic per-token activations
    "llm.int8"     "w8a8" (vector-wise) plus LLM.int8's mixed-precision decomposition: feature
                   columns with any |x| >= threshold (default 6.0) are multiplied in float16
                   (Dettmers et al. 2022, section 3.2) -- from a float16 copy of the
                   weights (the paper's Eq. 8) or, with ``fp16_weights=False``, dequantised from
                   the int8 weights, as bitsandbytes' inference path does (no float16 copy kept)
    "smoothquant"  SmoothQuant's migration (Xiao et al. 2022, arXiv 2211.10438, Eq. 4):
                   s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), X / s and W * s, with alpha = 0.5
                   and max|X_j| from ``calib``, on the layers that follow a LayerNorm (in_proj,
                   linear1, as the authors' code does), then "w8a8" (granularity="token") or
                   per-tensor weights and static per-tensor activations (granularity="tensor")
    "fp8-e4m3"     weights and activations in float8 e4m3 with per-tensor scales max|.| / 448
                   (Micikevicius et al. 2022, arXiv 2209.05433), products accumulated in float32

:func:`inject_outliers` makes the outlier features of large models appear in a small Pre-LN one
without changing its function: it scales LayerNorm output channels up and the matching input
columns of the next linear layer down by the same factor.
"""
import copy
from typing import NamedTuple

import ml_dtypes
import numpy as np

from preln.nn.block import LINEAR_PARAMS, TransformerBlock
from preln.models.lm import TinyLM
from preln.ops import layer_norm_forward
from preln.precision import Watch
from preln.validation import check_all_finite, check_bits, check_bool, check_choice, check_input, check_mask
from preln.nn.stack import TransformerStack

__all__ = ["QTensor", "qmax", "quantize", "dequantize", "int_matmul", "accumulate", "int32_max_terms",
           "CALIBRATIONS", "calibrate_scale", "linear_inputs",
           "SCHEMES", "LINEARS", "quantize_block", "QuantizedBlock", "QuantizedStack", "QuantizedLM",
           "block_forward", "inject_outliers", "FP8_E4M3_MAX", "SCHEME_OPTIONS"]

INT32_MAX = 2 ** 31 - 1
FP8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)   # 448
SCHEMES = ("w8a16", "w8a8-tensor", "w8a8", "llm.int8", "smoothquant", "fp8-e4m3")
#: the block's four linear layers: (parameter prefix, the name the book uses)
LINEARS = ("in_proj", "out_proj", "linear1", "linear2")
LINEAR_WEIGHTS = LINEAR_PARAMS
_NEEDS_CALIB = ("w8a8-tensor", "smoothquant")
#: how a static per-tensor activation scale is set from calibration inputs (calibrate_scale)
CALIBRATIONS = ("absmax", "percentile", "mse")
_OPTIONS = {"w8a16": {}, "w8a8-tensor": {"calibration": "absmax"}, "w8a8": {},
            "llm.int8": {"threshold": 6.0, "fp16_weights": True},
            "smoothquant": {"alpha": 0.5, "granularity": "token"}, "fp8-e4m3": {}}
#: each scheme's options and their defaults (quantize_block's **options): LLM.int8's outlier
#: threshold, SmoothQuant's migration strength alpha, ...
SCHEME_OPTIONS = _OPTIONS


# ---- one tensor ----------------------------------------------------------------------------------
class QTensor(NamedTuple):
    q: np.ndarray            # integers, int8 / uint8 (int16 / uint16 above 8 bits), x's shape
    scale: np.ndarray        # S, float: () per tensor, or (..., 1) per row
    zero_point: np.ndarray   # Z, int64 of scale's shape: 0 for symmetric
    bits: int
    symmetric: bool


def qmax(bits=8):
    """Largest symmetric integer: 2^(bits-1) - 1 (127 for int8; -127 is the smallest used)."""
    return 2 ** (bits - 1) - 1


def _int_dtype(bits, symmetric):
    if bits <= 8:
        return np.dtype(np.int8 if symmetric else np.uint8)
    return np.dtype(np.int16 if symmetric else np.uint16)


def _as_float(x, name):
    x = np.asarray(x)
    if x.dtype.kind not in "fiu" or x.dtype == np.bool_:
        raise TypeError(f"{name}: expected an array of real numbers; got dtype {x.dtype}")
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _check_zero_point(zero_point, hi):  # -> int64 array in [0, hi]
    z = np.asarray(zero_point)
    if z.dtype.kind not in "iu" or z.size and not 0 <= z.min() <= z.max() <= hi:
        raise ValueError(f"zero_point: expected integers in [0, {hi}]; got {zero_point!r}")
    return z.astype(np.int64)


def quantize(x, bits=8, granularity="tensor", symmetric=True, scale=None, zero_point=None):
    """x (...) float -> :class:`QTensor` with explicit rounding (half to even) and clamping.

    granularity: "tensor" (one scale) or "channel" / "token" (one scale per row: the max over the
                 last axis; "channel" for weights (out, in), "token" for activations (N, in)).
    symmetric:   True: q in [-qmax, qmax], S = max abs(x) / qmax, Z = 0 (absmax);
                 False: q in [0, 2^bits - 1], S = (max - min) / (2^bits - 1), Z = round(-min / S).
                 The range always contains 0, so 0 is represented exactly.
    scale, zero_point: given (static, e.g. from calibration) instead of computed from x; values
                 outside the range are then clamped. zero_point only with symmetric=False and a
                 given scale, integers in [0, 2^bits - 1].
    A tensor (or row) of zeros gets S = 1 (any S represents it exactly). x must be finite: NaN
    has no code (it became 0) and an inf would make the scale inf.
    """
    x = check_all_finite(_as_float(x, "x"), "x")
    bits = check_bits(bits)
    symmetric = check_bool(symmetric, "symmetric")                # "no" is not True
    check_choice(granularity, ("tensor", "channel", "token"), "granularity")
    if zero_point is not None and (symmetric or scale is None):
        when = "with symmetric=True (Z = 0)" if symmetric else "when the scale is computed from x"
        raise ValueError(f"zero_point: expected None {when}; got {zero_point!r}")
    if granularity != "tensor" and x.ndim < 1:
        raise ValueError(f"x: per-{granularity} quantisation needs at least 1 axis; got a scalar")
    axis, keep = (None, False) if granularity == "tensor" else (-1, True)
    ft = np.result_type(x.dtype, np.float32)                   # scales in float32 or wider
    xs = x.astype(ft, copy=False)
    if symmetric:
        lo, hi = -qmax(bits), qmax(bits)
        if scale is None:
            amax = np.max(np.abs(xs), axis=axis, keepdims=keep) if xs.size else ft.type(0)
            scale = np.where(amax > 0, amax / ft.type(hi), ft.type(1))
        zero_point = np.zeros(np.shape(scale), np.int64)
    else:
        lo, hi = 0, 2 ** bits - 1
        if scale is None:
            mn = np.minimum(np.min(xs, axis=axis, keepdims=keep), 0)   # the range contains 0
            mx = np.maximum(np.max(xs, axis=axis, keepdims=keep), 0)
            scale = np.where(mx > mn, (mx - mn) / ft.type(hi), ft.type(1))
            zero_point = np.clip(np.rint(-mn / scale), lo, hi).astype(np.int64)
        elif zero_point is None:
            raise ValueError("zero_point: expected an integer array with a given asymmetric scale; got None")
    scale = np.asarray(scale, dtype=ft)
    if np.any(~(scale > 0)) or not np.all(np.isfinite(scale)):
        raise ValueError(f"scale: expected positive finite values; got min {np.min(scale)}")
    zero_point = _check_zero_point(zero_point, hi)
    q = np.rint(xs / scale) + zero_point                       # round half to even ...
    q = np.clip(q, lo, hi)                                      # ... then clamp: never wrap around
    return QTensor(q.astype(_int_dtype(bits, symmetric)), scale, zero_point, bits, bool(symmetric))


def dequantize(qt, dtype=None):
    """QTensor -> S (q - Z) as a float array (the scale's dtype unless ``dtype`` is given)."""
    if not isinstance(qt, QTensor):
        raise TypeError(f"qt: expected a preln.quant.int8.QTensor; got {type(qt).__name__}")
    out = qt.scale * (qt.q.astype(np.int64) - qt.zero_point).astype(qt.scale.dtype)
    return out if dtype is None else out.astype(dtype)


# ---- integer accumulation ------------------------------------------------------------------------
def int32_max_terms(bits=8, allow_min=False):
    """How many products of two ``bits``-bit integers an int32 accumulator can always sum:
    floor((2^31 - 1) / m^2), m = 2^(bits-1) - 1 (or 2^(bits-1) when -2^(bits-1) is allowed).
    133,144 for int8 in [-127, 127]; 131,071 with -128."""
    m = 2 ** (check_bits(bits) - 1) - (0 if allow_min else 1)
    return INT32_MAX // (m * m)


def int_matmul(a, b):  # (N, K) int, (M, K) int -> (N, M) int32
    """Exact integer a @ b.T with int32 accumulation, computed through float64 GEMM.

    b is in the weight layout (out, in), as ``linear_forward``'s W. Raises OverflowError if an
    int32 accumulator could overflow: K max abs(a) max abs(b) > 2^31 - 1 (then some order of the K terms
    may leave the range). Below that bound every partial sum is an integer below 2^31 < 2^53, so
    the float64 GEMM is exact whatever order the BLAS kernel adds in.
    """
    a, b = np.asarray(a), np.asarray(b)
    for name, m in (("a", a), ("b", b)):
        if m.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected an integer array; got dtype {m.dtype}")
        if m.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D array; got shape {m.shape}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"b: expected K = {a.shape[1]} columns (a is {a.shape}); got shape {b.shape}")
    K = a.shape[1]
    amax = int(np.max(np.abs(a.astype(np.int64)))) if a.size else 0
    bmax = int(np.max(np.abs(b.astype(np.int64)))) if b.size else 0
    if K * amax * bmax > INT32_MAX:
        raise OverflowError(f"int_matmul: K max|a| max|b| = {K} x {amax} x {bmax} = {K * amax * bmax} "
                            f"exceeds the int32 accumulator's 2^31 - 1 = {INT32_MAX}")
    acc = a.astype(np.float64) @ b.astype(np.float64).T          # exact: integers below 2^31
    return acc.astype(np.int32)


def accumulate(terms, dtype):  # (..., K) -> (...)
    """Sum ``terms`` along the last axis one term after another in an accumulator of ``dtype``,
    as a simple multiply-accumulate unit does: an integer accumulator wraps around modulo 2^bits
    (numpy's integer arithmetic), a float one rounds after every addition. Returns the final sums."""
    dtype = np.dtype(dtype)
    terms = np.asarray(terms)
    if dtype.kind not in "iuf":
        raise TypeError(f"dtype: expected an integer or float dtype; got {dtype}")
    with np.errstate(over="ignore"):
        return np.cumsum(terms.astype(dtype), axis=-1, dtype=dtype)[..., -1]


# ---- calibration: a static activation scale -------------------------------------------------------
def calibrate_scale(x, method="absmax", bits=8, percentile=99.99, n_grid=200):
    """A symmetric per-tensor scale S for activations like ``x`` (calibration data) -> float.

    "absmax":     S = max|x| / qmax: nothing is clipped, the rounding step is set by the largest value.
    "percentile": S = (the ``percentile``-th percentile of |x|) / qmax: the rare values above it are
                  clipped to +-qmax S, for a finer step on the rest (Wu et al. 2020, arXiv
                  2004.09602, section 4.1: 99.9 to 99.999).
    "mse":        the clip c that minimises the mean squared error mean((x - S q(x))^2), S = c / qmax,
                  over the grid c = max|x| i / n_grid, i = 1 .. n_grid (Nagel et al. 2021, arXiv
                  2106.08295, section 3.5: the trade-off between clipping and rounding error).
    """
    x = _as_float(x, "x").astype(np.float64, copy=False).ravel()
    if method not in CALIBRATIONS:
        raise ValueError(f"method: expected one of {CALIBRATIONS}; got {method!r}")
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"x: expected a non-empty array of finite numbers; got {x.size} values")
    hi = qmax(check_bits(bits))
    a = np.abs(x)
    amax = float(a.max())
    if amax == 0:
        return 1.0
    if method == "absmax":
        return amax / hi
    if method == "percentile":
        if not 0 < percentile <= 100:
            raise ValueError(f"percentile: expected a number in (0, 100]; got {percentile!r}")
        c = float(np.percentile(a, percentile))
        return (c if c > 0 else amax) / hi
    clips = amax * np.arange(1, int(n_grid) + 1) / int(n_grid)             # (n_grid,)
    errs = [np.mean((x - (c / hi) * np.clip(np.rint(x / (c / hi)), -hi, hi)) ** 2) for c in clips]
    return float(clips[int(np.argmin(errs))] / hi)


# ---- the float reference of the block, with a pluggable linear -----------------------------------
class _Record(Watch):
    """The watch of :func:`block_forward`'s pass: it keeps the named intermediates in ``record``
    as the block's ops hand them over (``watch(op, out, *inputs)``)."""

    NAMES = {"norm1": "ln1", "attn.in_proj": "in_proj", "attn.out_proj": "out_proj",
             "residual1": "residual1", "norm2": "ln2", "mlp.linear1": "linear1", "mlp.linear2": "linear2"}

    def __init__(self, record, activation):
        super().__init__()
        self.record, self.names = record, dict(self.NAMES, **{f"mlp.{activation}": "act"})

    def __call__(self, op, out, *inputs):
        if op == "attn.out_proj":
            self.record["attn"] = inputs[0]               # the heads' output, out_proj's input
        if op in self.names:
            self.record[self.names[op]] = out
        return out


class _OpByOpBlock(TransformerBlock):
    """A block on given ``params`` in eval mode, op by op (plain attention, no fused kernel), its
    linears swapped for ``linear(name, h (N, in)) -> (N, out)`` (None: its own) and its watch for
    a :class:`_Record`: what :func:`block_forward` runs."""

    init_of = staticmethod(lambda config, rng, dtype: {})     # the parameters are given

    def __init__(self, params, config, dtype, linear, record):
        super().__init__(config, dtype=dtype, attention="plain", fused=False)
        self.params, self.grads, self.swapped, self.record = params, {}, linear, record
        self.eval()

    def linear(self, name, bias=True):  # -> h (B, S, in) -> ((B, S, out) in h's dtype, None)
        if self.swapped is None:
            return super().linear(name, bias)

        def run(h):
            out = np.asarray(self.swapped(name, h.reshape(-1, h.shape[-1])), dtype=h.dtype)
            return out.reshape(*h.shape[:-1], -1), None
        return run

    def _watch(self):
        return _Record(self.record, self.config.activation)


def block_forward(params, config, x, key_padding_mask=None, linear=None, record=None):
    """The block's eval-mode forward, op by op, with ``linear(name, h)`` for the four linear layers:
    :meth:`preln.TransformerBlock.forward` on ``params`` with its linears swapped.

    params: the block's 12 arrays (already in x's dtype); x: (B, S, D).
    linear: callable (name in LINEARS, h (N, in)) -> (N, out); None: the block's own, h W^T + b.
    record: a dict to receive every named intermediate (ln1, in_proj, attn, out_proj, residual1,
            ln2, linear1, act, linear2, y), for the op-by-op error.
    """
    x = np.asarray(x)
    record = {} if record is None else record
    y = _OpByOpBlock(params, config, x.dtype, linear, record)(x, key_padding_mask)
    record["y"] = y
    return y


def linear_inputs(lm, tokens):
    """The inputs of every block's four linear layers in a float forward of a TinyLM: one dict
    {name in LINEARS: (B S, in) array} per block -- the calibration data of a per-layer method."""
    if not isinstance(lm, TinyLM):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM; got {type(lm).__name__}")
    h, _ = lm.io.embed(lm.own, tokens)                                 # (B, S, D)
    out = []
    for layer in lm.stack.layers:
        h, seen = _forward_seeing_linear_inputs(layer.params, layer.config, h)   # the float stream
        out.append(seen)
    return out


def _forward_seeing_linear_inputs(params, config, x):  # (B, S, D) -> (B, S, D), {name: (B S, in)}
    """:func:`block_forward` with the linears h W^T + b on ``params``, keeping each one's input."""
    seen = {}

    def linear(name, h):
        seen[name] = h                                                  # (N, in)
        w, b = LINEAR_WEIGHTS[name]
        return h @ params[w].T + params[b]

    return block_forward(params, config, x, linear=linear), seen


# ---- one quantised linear layer -----------------------------------------------------------------
class QLinear:
    """One linear layer y = x W^T + b under a scheme. x_absmax: (in,) per-feature max abs(x) from
    calibration (needed by "w8a8-tensor" and "smoothquant"). granularity: SmoothQuant's
    quantisation after the migration, "token" (per-channel weights, dynamic per-token
    activations) or "tensor" (per-tensor weights, static per-tensor activations)."""

    def __init__(self, w, b, scheme, x_absmax=None, threshold=6.0, alpha=0.5, smooth=True,
                 granularity="token", x_scale=None, fp16_weights=True):
        w = np.asarray(w, np.float64)                               # (M, K)
        self.scheme, self.threshold = scheme, threshold
        self.bias = np.asarray(b, np.float32)
        self.smooth = None
        if scheme == "smoothquant" and smooth:
            w_absmax = np.max(np.abs(w), axis=0)                    # max|W_j| over output rows, (K,)
            ok = (x_absmax > 0) & (w_absmax > 0)
            s = np.ones_like(w_absmax)
            s[ok] = x_absmax[ok] ** alpha / w_absmax[ok] ** (1 - alpha)   # Eq. 4
            self.smooth = s.astype(np.float32)
            w = w * s                                               # W' = diag(s) W (columns)
            x_absmax = x_absmax / s                                 # what the smoothed X will reach
        self.static = scheme == "w8a8-tensor" or (scheme == "smoothquant" and granularity == "tensor")
        self.dynamic_tensor = self.static and x_scale == "dynamic"    # per tensor, from each input
        if self.static:
            self.qw = quantize(w.astype(np.float32), granularity="tensor")
            if x_scale is None:                                     # absmax of the calibration data
                amax = float(np.max(x_absmax))
                x_scale = amax / 127 if amax > 0 else 1.0
            self.x_scale = None if self.dynamic_tensor else np.float32(x_scale)   # static
        elif scheme == "fp8-e4m3":
            amax = float(np.max(np.abs(w)))
            self.w_scale = np.float32(amax / FP8_E4M3_MAX if amax > 0 else 1.0)
            self.w8 = (w.astype(np.float32) / self.w_scale).astype(FP8_E4M3)
        else:
            self.qw = quantize(w.astype(np.float32), granularity="channel")
        if scheme == "llm.int8":                                    # weights of the outlier columns:
            self.fp16_weights = bool(fp16_weights)                  # a float16 copy (Eq. 8), or
            self.w16 = (w.astype(np.float16) if self.fp16_weights   # dequantised from the int8 ones
                        else dequantize(self.qw, np.float32).astype(np.float16))   # (bitsandbytes)
            self.outlier_columns = set()
        if scheme == "w8a16":
            self.w_deq = dequantize(self.qw, np.float32)

    def weight_nbytes(self):
        """Bytes of the stored weight: its integers (or fp8), scales and float32 bias. LLM.int8's
        float16 columns are counted for the columns flagged so far (:attr:`outlier_columns`)."""
        if self.scheme == "fp8-e4m3":
            n = self.w8.nbytes + 4
        else:
            n = self.qw.q.nbytes + self.qw.scale.nbytes
        if self.scheme == "llm.int8" and self.fp16_weights:
            n += 2 * self.w16.shape[0] * len(self.outlier_columns)
        if self.smooth is not None:
            n += self.smooth.nbytes
        return n + self.bias.nbytes

    def __call__(self, x):  # (N, K) float32 -> (N, M) float32
        x = np.asarray(x, np.float32)
        sch = self.scheme
        if self.smooth is not None:
            x = x / self.smooth                                     # X' = X diag(s)^-1
        if sch == "w8a16":
            return x.astype(np.float16).astype(np.float32) @ self.w_deq.T + self.bias
        if sch == "fp8-e4m3":
            amax = float(np.max(np.abs(x)))
            sx = np.float32(amax / FP8_E4M3_MAX if amax > 0 else 1.0)
            x8 = (x / sx).astype(FP8_E4M3)
            acc = x8.astype(np.float32) @ self.w8.astype(np.float32).T
            return acc * (sx * self.w_scale) + self.bias
        outliers = None
        if sch == "llm.int8":
            outliers = np.flatnonzero(np.any(np.abs(x) >= self.threshold, axis=0))   # feature columns
            self.outlier_columns.update(int(j) for j in outliers)
            if outliers.size:
                x_out = x[:, outliers]
                x = x.copy()
                x[:, outliers] = 0.0                                # they take the float16 path
        if self.dynamic_tensor:
            qx = quantize(x, granularity="tensor")                  # dynamic: absmax of this input
        elif self.static:
            qx = quantize(x, granularity="tensor", scale=self.x_scale)
        else:
            qx = quantize(x, granularity="token")                   # dynamic, one scale per row
        acc = int_matmul(qx.q, self.qw.q)                           # (N, M) int32
        y = acc.astype(np.float32) * (qx.scale * self.qw.scale.reshape(1, -1)) + self.bias
        if outliers is not None and outliers.size:
            y += (x_out.astype(np.float16).astype(np.float32)
                  @ self.w16[:, outliers].astype(np.float32).T)     # sum over h in O of X^h W^h
        return y


# ---- a quantised block, stack, LM ---------------------------------------------------------------
def _check_options(scheme, calib, options):
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}; got {scheme!r}")
    allowed = _OPTIONS[scheme]
    extra = [k for k in options if k not in allowed]
    if extra:
        raise TypeError(f"quantize_block: unexpected option {extra[0]!r} for scheme {scheme!r}; "
                        f"it takes {list(allowed) or 'no options'}")
    opts = dict(allowed, **options)
    if "threshold" in opts and not (np.isfinite(opts["threshold"]) and opts["threshold"] > 0):
        raise ValueError(f"threshold: expected a positive number; got {opts['threshold']!r}")
    if "alpha" in opts and not 0.0 <= opts["alpha"] <= 1.0:
        raise ValueError(f"alpha: expected a number in [0, 1]; got {opts['alpha']!r}")
    if "granularity" in opts and opts["granularity"] not in ("token", "tensor"):
        raise ValueError(f"granularity: expected 'token' or 'tensor'; got {opts['granularity']!r}")
    if "calibration" in opts and opts["calibration"] not in CALIBRATIONS + ("dynamic",):
        raise ValueError(f"calibration: expected one of {CALIBRATIONS + ('dynamic',)}; got "
                         f"{opts['calibration']!r}")
    dynamic = opts.get("calibration") == "dynamic"                  # no calibration data needed
    if scheme in _NEEDS_CALIB and calib is None and not dynamic:
        raise ValueError(f"calib: scheme {scheme!r} needs calibration inputs (its activation "
                         f"scales come from them); got None")
    return opts


def _check_float_model(dtype, training, what):
    if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{what}: expected a float32 or float64 model to quantise; got dtype {np.dtype(dtype)}")
    if training:
        raise ValueError(f"{what}: expected a model in eval mode (quantised models are for inference "
                         f"only); call .eval() first")


class QuantizedBlock:
    """An inference-only block whose four linear layers are :class:`QLinear` (see the module)."""

    def __init__(self, block, scheme, calib=None, **options):
        if not isinstance(block, TransformerBlock):
            raise TypeError(f"block: expected a preln.TransformerBlock; got {type(block).__name__}")
        _check_float_model(block.dtype, block.training, "block")
        opts = _check_options(scheme, calib, options)
        self.config, self.scheme, self.options = block.config, scheme, opts
        p64 = {k: v.astype(np.float64) for k, v in block.params.items()}
        self.params = {k: v.astype(np.float32) for k, v in p64.items()}      # LN, biases: float32
        x_absmax = {name: None for name in LINEARS}
        x_scale = {name: None for name in LINEARS}
        how = opts.get("calibration", "absmax")
        if how == "dynamic":
            x_scale = dict.fromkeys(LINEARS, "dynamic")
        elif calib is not None:
            calib = np.asarray(calib, dtype=np.float64)
            if calib.ndim != 3 or calib.shape[-1] != block.config.d_model:
                raise ValueError(f"calib: expected (B, S, D) inputs with D = {block.config.d_model}; "
                                 f"got shape {calib.shape}")
            _, seen = _forward_seeing_linear_inputs(p64, block.config, calib)
            x_absmax = {name: np.max(np.abs(h), axis=0) for name, h in seen.items()}   # (in,) each
            if scheme == "w8a8-tensor" and how != "absmax":
                x_scale = {name: calibrate_scale(h, how) for name, h in seen.items()}
        smooth = ("in_proj", "linear1")                                      # after a LayerNorm
        self.linears = {name: QLinear(p64[LINEAR_WEIGHTS[name][0]], p64[LINEAR_WEIGHTS[name][1]], scheme,
                                      x_absmax[name], opts.get("threshold", 6.0),
                                      opts.get("alpha", 0.5), smooth=name in smooth,
                                      granularity=opts.get("granularity", "token"),
                                      x_scale=x_scale[name],
                                      fp16_weights=opts.get("fp16_weights", True))
                        for name in LINEARS}

    def __call__(self, x, key_padding_mask=None, record=None):
        """x: (B, S, D) -> (B, S, D) float32. ``record``: a dict for the named intermediates."""
        x = check_input(x, self.config.d_model, np.float32)              # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        return block_forward(self.params, self.config, x, kpm, lambda name, h: self.linears[name](h), record)

    forward = __call__

    def weight_nbytes(self):
        """Bytes of the four linear layers' stored weights (see :meth:`QLinear.weight_nbytes`)."""
        return sum(l.weight_nbytes() for l in self.linears.values())


def float_weight_nbytes(block, itemsize):
    """Bytes of a block's four linear layers stored in a float format of ``itemsize`` bytes."""
    return sum(block.params[w].size + block.params[b].size for w, b in LINEAR_WEIGHTS.values()) * itemsize


class QuantizedStack:
    """Each block of a :class:`TransformerStack` quantised; the final LayerNorm in float32."""

    def __init__(self, stack, scheme, calib=None, **options):
        _check_float_model(stack.dtype, stack.training, "stack")
        _check_options(scheme, calib, options)
        self.config = stack.config
        self.norm = {k: v.astype(np.float32) for k, v in stack.norm.items()}
        self.layers = []
        h = None if calib is None else np.asarray(calib, np.float64)
        for layer in stack.layers:
            self.layers.append(QuantizedBlock(layer, scheme, h, **options))
            if h is not None:
                h = layer(h)                                     # the next layer's calibration input
        self.scheme = scheme

    def __call__(self, x, key_padding_mask=None):
        x = np.asarray(x, np.float32)
        for layer in self.layers:
            x = layer(x, key_padding_mask)
        if self.norm:
            x = layer_norm_forward(x, self.norm["weight"], self.norm["bias"], self.config.eps)[0]
        return x

    def weight_nbytes(self):
        return sum(l.weight_nbytes() for l in self.layers)


class QuantizedLM:
    """A :class:`TinyLM` with every block quantised; embeddings and the LM head stay float32."""

    def __init__(self, lm, scheme, calib=None, **options):
        _check_float_model(lm.dtype, lm.stack.training, "lm")
        h0 = None if calib is None else lm.io.embed(lm.own, calib, name="calib")[0]   # (B, S, D)
        self.config, self.io = lm.config, lm.io
        self.own = {k: v.astype(np.float32) for k, v in lm.own.items()}
        self.stack = QuantizedStack(lm.stack, scheme, h0, **options)
        self.scheme = scheme

    def __call__(self, tokens):  # (B, S) int -> (B, S, V) float32 logits
        h, _ = self.io.embed(self.own, tokens)                                        # (B, S, D)
        return self.io.logits(self.own, self.stack(h))[0]                             # (B, S, V)

    forward = __call__

    def weight_nbytes(self):
        return self.stack.weight_nbytes()


def quantize_block(model, scheme, calib=None, **options):
    """An inference-only INT8 (or FP8) copy of ``model`` under ``scheme`` (see the module docstring).

    model: a :class:`TransformerBlock` -> :class:`QuantizedBlock`, calib (B, S, D) inputs;
           a :class:`TransformerStack` -> :class:`QuantizedStack`, calib (B, S, D) inputs;
           a :class:`TinyLM` -> :class:`QuantizedLM`, calib (B, S) token ids.
    options: ``threshold`` (llm.int8, default 6.0) and ``fp16_weights`` (llm.int8, default True:
             a float16 copy of the weights for the outlier columns; False: dequantised from int8);
             ``alpha`` (smoothquant, default 0.5) and ``granularity`` (smoothquant, "token" by
             default or "tensor"); ``calibration`` (w8a8-tensor: "absmax" by default,
             "percentile", "mse", or "dynamic" -- then no calib is needed).
    The model must be float32 or float64 and in eval mode.
    """
    if isinstance(model, TransformerBlock):
        return QuantizedBlock(model, scheme, calib, **options)
    if isinstance(model, TransformerStack):
        return QuantizedStack(model, scheme, calib, **options)
    if isinstance(model, TinyLM):
        return QuantizedLM(model, scheme, calib, **options)
    raise TypeError(f"model: expected a preln.TransformerBlock, TransformerStack or preln.models.lm.TinyLM; "
                    f"got {type(model).__name__}")


# ---- outliers ------------------------------------------------------------------------------------
def inject_outliers(model, channels, factor):
    """A copy of a Pre-LN ``model`` (block, stack or TinyLM) with outlier features, same function.

    In every block, LayerNorm output channel j in ``channels`` is scaled up (gamma_j, beta_j times
    ``factor``) and the matching input column j of the linear layer it feeds is scaled down
    (W[:, j] / factor): norm1 -> in_proj, norm2 -> linear1. The product is unchanged; a power-of-2
    factor changes no bit of the float output. Post-LN is refused: its LayerNorm outputs also feed
    the residual stream, so scaling them would change the function.
    """
    if isinstance(model, TinyLM):
        blocks_of = lambda m: m.stack.layers
    elif isinstance(model, TransformerStack):
        blocks_of = lambda m: m.layers
    elif isinstance(model, TransformerBlock):
        blocks_of = lambda m: [m]
    else:
        raise TypeError(f"model: expected a preln.TransformerBlock, TransformerStack or TinyLM; "
                        f"got {type(model).__name__}")
    cfg = blocks_of(model)[0].config
    if not cfg.norm_first:
        raise ValueError("model: expected a Pre-LN model (norm_first=True); in Post-LN the LayerNorm "
                         "outputs also feed the residual stream, so scaling them changes the function")
    channels = np.asarray(channels)
    if channels.ndim != 1 or channels.dtype.kind not in "iu" or channels.size == 0 or \
            channels.min() < 0 or channels.max() >= cfg.d_model or np.unique(channels).size != channels.size:
        raise ValueError(f"channels: expected distinct ints in [0, {cfg.d_model}); got {channels.tolist()}")
    if not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"factor: expected a positive number; got {factor!r}")
    out = copy.deepcopy(model)
    for block in blocks_of(out):
        p = block.params
        for norm, w in (("norm1", "self_attn.in_proj_weight"), ("norm2", "linear1.weight")):
            p[f"{norm}.weight"][channels] *= factor
            p[f"{norm}.bias"][channels] *= factor
            p[w][:, channels] /= factor
    return out
