"""What the precision chapter computes beyond the block: format limits, overflow thresholds, the
residual stream's growth with depth, error against float64, and loss scaling.

- Format limits from the bit layout (IEEE 754-2019; float8 e4m3fn of Micikevicius et al. 2022,
  arXiv 2209.05433): :func:`format_limits`, checked against ``ml_dtypes.finfo``.
- Overflow thresholds, closed form and found by search in the dtype itself:
  exp overflows above ln(max + ulp/2) (:func:`exp_threshold`), x*x above sqrt(max + ulp/2)
  (:func:`square_threshold`), and a LayerNorm whose sum of squares is kept in float16 overflows
  once d * rms^2 >= 65520 (:func:`layernorm_rms_threshold`, and by bisection with the package's
  naive LayerNorm, :func:`layernorm_rms_threshold_empirical`).
- The Pre-LN residual stream through a sequence of ``TransformerBlock`` s (:func:`residual_stream`,
  PyTorch's initialisation) and through Xiong et al.'s theory stack (:func:`theory_stream`, Xavier
  initialisation): the depth at which a float16 LayerNorm overflows depends on which.
- The grid of where inf/NaN appear (:func:`overflow_grid`, cached), stored in
  preln/data/precision/overflow_grids.json (:func:`write_overflow_grids`, :func:`stored_overflow_grid`)
  so that the chapter's interactive figure only draws: the map of model width against input rms
  after a chosen block (:func:`overflow_map`), where the float16 wall is the diagonal
  sqrt(65520 / D).
- Error against float64 per dtype and policy (:func:`precision_error`).
- Loss scaling for float16 gradients (Micikevicius et al. 2018, arXiv 1710.03740): how many
  gradient entries flush to zero with and without a scale (:func:`gradient_underflow`) and dynamic
  loss scaling (:func:`dynamic_loss_scaling`).
"""
from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np

from preln.blas import blas_threads
from preln.nn.block import TransformerBlock, default_heads
from preln.nn.config import BlockConfig
from preln.ops import layer_norm_forward
from preln.precision import BFLOAT16, FLOAT8_E4M3, NAIVE, Watch, resolve_policy
from preln.resources import data_path

__all__ = [
    "FORMATS", "DTYPES", "format_limits", "format_rows", "overflow_bound", "exp_threshold",
    "exp_threshold_empirical", "square_threshold", "square_threshold_empirical",
    "layernorm_rms_threshold", "layernorm_rms_threshold_empirical", "stack_config",
    "residual_stream", "theory_stream", "overflow_grid", "stored_overflow_grid", "write_overflow_grids",
    "overflow_map", "STATUS", "precision_error", "gradient_underflow",
    "dynamic_loss_scaling",
]

#: name -> (exponent bits, mantissa bits, kind); "ieee": the all-ones exponent is inf/NaN;
#: "fn" (finite, NaN): no inf, only S.1111.111 is NaN, so the top binade holds normal numbers
FORMATS = {
    "float64": (11, 52, "ieee"),
    "float32": (8, 23, "ieee"),
    "float16": (5, 10, "ieee"),
    "bfloat16": (8, 7, "ieee"),
    "float8_e4m3fn": (4, 3, "fn"),
}
DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32),
          "float16": np.dtype(np.float16), "bfloat16": BFLOAT16, "float8_e4m3fn": FLOAT8_E4M3}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# The error and loss-scaling experiments default to 8 tokens: every matmul then stays below
# OpenBLAS's multithreading threshold (m * n * k < 262144), so the float32 results -- and the
# numbers the chapter quotes -- do not depend on the number of BLAS threads.


def _name(dtype):
    dt = np.dtype(DTYPES.get(dtype, dtype)) if isinstance(dtype, str) else np.dtype(dtype)
    for name, d in DTYPES.items():
        if d == dt:
            return name
    raise TypeError(f"dtype: expected one of {list(DTYPES)}; got {dtype!r}")


def format_limits(exponent_bits, mantissa_bits, kind="ieee"):
    """Limits of a binary floating-point format from its bit layout (exact, as Python floats).

    bias = 2^(e-1) - 1; the smallest normal exponent is 1 - bias. IEEE formats reserve the all-ones
    exponent for inf/NaN, so the largest exponent is 2^e - 2 - bias and max = (2 - 2^-m) 2^emax.
    "fn" formats (float8 e4m3fn) keep that binade and reserve only the all-ones mantissa in it:
    emax = 2^e - 1 - bias and max = (2 - 2^(1-m)) 2^emax.

    Returns a dict: bits, bias, emin, emax, max, min_normal, min_subnormal, eps (2^-m, the gap
    after 1), ulp_max (the gap below max).
    """
    e, m = int(exponent_bits), int(mantissa_bits)
    if kind not in ("ieee", "fn"):
        raise ValueError(f"kind: expected 'ieee' or 'fn'; got {kind!r}")
    bias = 2 ** (e - 1) - 1
    emin = 1 - bias
    if kind == "ieee":
        emax = 2 ** e - 2 - bias
        top = 2.0 - math.ldexp(1.0, -m)          # mantissa all ones
    else:
        emax = 2 ** e - 1 - bias
        top = 2.0 - math.ldexp(1.0, 1 - m)       # all ones is NaN: one step below
    return dict(bits=1 + e + m, bias=bias, emin=emin, emax=emax, max=math.ldexp(top, emax),
                min_normal=math.ldexp(1.0, emin), min_subnormal=math.ldexp(1.0, emin - m),
                eps=math.ldexp(1.0, -m), ulp_max=math.ldexp(1.0, emax - m))


def format_rows(names=("float32", "float16", "bfloat16", "float8_e4m3fn")):
    """For each format: the limits from its bits and from ``ml_dtypes.finfo``, side by side.

    Returns a list of dicts: name, exponent_bits, mantissa_bits, then ``<limit>`` (from the bits)
    and ``<limit>_finfo`` for limit in max, min_normal, min_subnormal, eps.
    """
    rows = []
    for name in names:
        e, m, kind = FORMATS[name]
        lim = format_limits(e, m, kind)
        fi = ml_dtypes.finfo(DTYPES[name])
        row = dict(name=name, exponent_bits=e, mantissa_bits=m, bits=lim["bits"])
        for key, fkey in (("max", "max"), ("min_normal", "smallest_normal"),
                          ("min_subnormal", "smallest_subnormal"), ("eps", "eps")):
            row[key] = lim[key]
            row[key + "_finfo"] = float(getattr(fi, fkey))
        rows.append(row)
    return rows


def overflow_bound(dtype):
    """max + ulp/2: the midpoint between the largest finite value and the next power of two.

    Under round-to-nearest-even a value overflows once it passes this bound; exactly at it the tie
    goes to the even neighbour. IEEE maxima have an all-ones (odd) mantissa, so the tie overflows
    (float16: 65520 -> inf); e4m3fn's max 448 has mantissa 110 (even), so 464 -> 448 and only
    values above 464 give NaN.
    """
    lim = format_limits(*FORMATS[_name(dtype)])
    return lim["max"] + lim["ulp_max"] / 2


def exp_threshold(dtype):
    """ln(max + ulp/2): exp(x) rounds to inf (NaN in e4m3fn) for x above it. float16: ln 65520."""
    return math.log(overflow_bound(dtype))


def square_threshold(dtype):
    """sqrt(max + ulp/2): x * x rounds to inf for |x| above it. float16: sqrt 65520 = 255.97."""
    return math.sqrt(overflow_bound(dtype))


def _first_positive(dtype, overflows):
    """The smallest positive finite value v of ``dtype`` with ``overflows(v)`` True (a bisection
    over bit patterns, which are ordered like the positive values they encode)."""
    dt = np.dtype(DTYPES.get(dtype, dtype)) if isinstance(dtype, str) else np.dtype(dtype)
    ut = _UINT[dt.itemsize]
    value = lambda bits: np.array([bits], dtype=ut).view(dt)
    lo = 0                                                     # +0: does not overflow
    hi = int(np.array([ml_dtypes.finfo(dt).max], dtype=dt).view(ut)[0])
    if not overflows(value(hi)):
        raise ValueError(f"no finite {dt} value overflows")
    while hi - lo > 1:                                         # invariant: lo ok, hi overflows
        mid = (lo + hi) // 2
        if overflows(value(mid)):
            hi = mid
        else:
            lo = mid
    return float(value(hi)[0].astype(np.float64))


def exp_threshold_empirical(dtype):
    """The smallest value x of ``dtype`` whose ``np.exp`` in ``dtype`` is not finite."""
    with np.errstate(all="ignore"):
        return _first_positive(dtype, lambda v: not np.isfinite(np.exp(v).astype(np.float64)).all())


def square_threshold_empirical(dtype):
    """The smallest value x of ``dtype`` whose square in ``dtype`` is not finite."""
    with np.errstate(all="ignore"):
        return _first_positive(dtype, lambda v: not np.isfinite((v * v).astype(np.float64)).all())


def layernorm_rms_threshold(d, dtype=np.float16):
    """The input rms at which a LayerNorm that sums squares in ``dtype`` overflows:
    d * rms^2 = max + ulp/2, so rms = sqrt(65520 / d) in float16 (11.31 at d = 512)."""
    return math.sqrt(overflow_bound(dtype) / d)


def _rms(x):
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.mean((x - x.mean(-1, keepdims=True)) ** 2)))


def layernorm_rms_threshold_empirical(d, dtype=np.float16, seed=0, iters=60):
    """Find by bisection the rms of a (1, d) input at which the package's naive LayerNorm
    (``policy=NAIVE``: statistics kept in ``dtype``) first returns a non-finite variance.

    The input is r * z for a fixed standard-normal z (centred, unit rms), rounded to ``dtype``.
    Returns ``(rms_ok, rms_overflow)``: the measured rms of the rounded inputs on either side of
    the threshold (the largest r found finite and the smallest found to overflow).
    """
    z = np.random.default_rng(seed).standard_normal(d)
    z = (z - z.mean()) / np.sqrt(np.mean((z - z.mean()) ** 2))
    gamma, beta = np.ones(d, dtype=dtype), np.zeros(d, dtype=dtype)

    def case(r):
        x = (r * z).astype(dtype)[None, :]                     # (1, d)
        watch = Watch(enabled=True)
        with np.errstate(all="ignore"):                        # the overflow is what we look for
            layer_norm_forward(x, gamma, beta, 1e-5, NAIVE, watch)
        return watch.first is not None, x

    lo, hi = 0.0, 1.0
    while not case(hi)[0]:
        lo, hi = hi, 2 * hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if case(mid)[0]:
            hi = mid
        else:
            lo = mid
    return _rms(case(lo)[1]), _rms(case(hi)[1])


# ---- the residual stream through a sequence of blocks -------------------------------------------

def stack_config(d):
    """The block of the depth experiments: width d, default_heads(d) heads, F = 4 d, exact GELU."""
    return BlockConfig(d_model=d, n_heads=default_heads(d), d_ff=4 * d)


@functools.lru_cache(maxsize=120)    # the overflow map's 5 widths x 24 blocks
def _block64(d, seed):
    """Block ``seed`` of a stack in float64, its weights drawn once per (d, seed): the template of
    :func:`_block` (never run; its gradient buffers are dropped)."""
    block = TransformerBlock(stack_config(d), dtype=np.float64, seed=seed, trace=True).eval()
    block.grads = {}
    for v in block.params.values():
        v.setflags(write=False)
    return block


@functools.lru_cache(maxsize=512)    # 5 widths x 2 dtypes x 24 blocks, and the chapter's others
def _weights(d, dtype_name, seed):
    """The float64 weights of block (d, seed) rounded to the dtype once, for every policy."""
    out = {k: v.astype(DTYPES[dtype_name]) for k, v in _block64(d, seed).params.items()}
    for v in out.values():
        v.setflags(write=False)
    return out


@functools.lru_cache(maxsize=1024)   # 5 widths x 2 dtypes x 2 policies x 24 blocks, and others
def _block(d, dtype_name, policy, seed):
    """Block ``seed`` of a stack (weights depend only on d and seed, then rounded to the dtype).

    The forward of ``TransformerBlock(stack_config(d), dtype, seed=seed, policy=policy,
    trace=True).eval()``, whose initialisation draws the weights in float64 and rounds them to the
    dtype, without drawing and rounding them again for every dtype and policy: the float64 block of
    (d, seed) is copied and given the dtype, the policy, its generator's state after the draws and
    the weights rounded once per dtype (:func:`_weights`, read-only, shared by the policies).
    For the forward only: it has no gradient buffers.
    """
    base = _block64(d, seed)
    block = copy.copy(base)
    block.dtype, block.policy = DTYPES[dtype_name], resolve_policy(policy)
    block.rng = copy.deepcopy(base.rng)
    block.params, block.grads = dict(_weights(d, dtype_name, seed)), {}
    return block


#: categories of :func:`overflow_grid`
STATUS = ("finite", "LayerNorm variance inf (output silently zero)", "inf in the stream",
          "NaN in the stream")


def residual_stream(d, scale, depth, dtype="float16", policy="naive", tokens=16, batch=1, seed=0):
    """Run ``depth`` Pre-LN blocks in sequence on x0 = scale * N(0, 1) of shape (batch, tokens, d).

    ``scale`` may be a sequence of length ``batch``: batch row b is then scaled by scale[b] (rows
    never interact, so one run covers every scale). Block l has seed ``seed + l``.

    Returns a dict of arrays over depth l = 0 .. depth (l = 0 is the input):
      ms (batch, depth+1)          mean square of the stream per batch row (float64)
      max_token_ss (batch, depth+1)  largest per-token sum of squares about the mean
      status (batch, depth+1)      index into STATUS of the stream after block l; for l >= 1,
                                   1 means block l's first LayerNorm saw an infinite variance
      overflow                     list of the tracer's Overflow (or None) per block, l = 1 .. depth
      first                        (l, Overflow) of the first block whose tracer fired, or None
    """
    name, pol = _name(dtype), resolve_policy(policy)
    scales = np.broadcast_to(np.asarray(scale, dtype=np.float64), (batch,))
    z = np.random.default_rng(seed).standard_normal((tokens, d))     # the same z in every row
    with np.errstate(over="ignore"):
        x = (scales[:, None, None] * z).astype(DTYPES[name])          # (B, S, D)
    ms = np.zeros((batch, depth + 1))
    ss = np.zeros((batch, depth + 1))
    status = np.zeros((batch, depth + 1), dtype=np.int64)
    overflow, first = [], None

    def record(l, x, ln_dead=None):
        x64 = x.astype(np.float64)
        with np.errstate(all="ignore"):
            ms[:, l] = np.mean(x64 ** 2, axis=(1, 2))
            ss[:, l] = np.max(np.sum((x64 - x64.mean(-1, keepdims=True)) ** 2, axis=-1), axis=-1)
        nan = np.isnan(x64).any(axis=(1, 2))
        inf = np.isinf(x64).any(axis=(1, 2))
        st = np.where(nan, 3, np.where(inf, 2, 0))
        if ln_dead is not None:
            st = np.where(st == 0, np.where(ln_dead, 1, 0), st)
        status[:, l] = st

    record(0, x)
    with np.errstate(all="ignore"):
        for l in range(1, depth + 1):
            block = _block(d, name, pol, seed + l)
            p = block.params
            # the block's first LayerNorm on its own input, per batch row: rstd = 0 <=> var = inf
            _, ln = layer_norm_forward(x, p["norm1.weight"], p["norm1.bias"], block.config.eps, pol)
            dead = (np.asarray(ln.rstd) == 0).any(axis=(1, 2))
            x = block(x)
            overflow.append(block.overflow)
            if first is None and block.overflow is not None:
                first = (l, block.overflow)
            record(l, x, dead)
    return dict(ms=ms, max_token_ss=ss, status=status, overflow=overflow, first=first)


def theory_stream(d, depth, tokens=16, seed=0):
    """The residual stream of a Pre-LN stack in Xiong et al.'s theory setting (Xavier
    initialisation, uniform attention, ReLU FFN; :func:`preln.chapters.xiong.theory_stack`), float64, on the
    same input as :func:`residual_stream` (``N(0, 1)`` of shape (1, tokens, d), seeded with ``seed``).

    Returns dict(ms=(depth+1,) mean square, max_token_ss=(depth+1,) largest per-token sum of
    squares about the mean), l = 0 .. depth: the statistics :func:`residual_stream` records, so
    the two initialisations can be compared (the package's blocks use PyTorch's initialisation).
    """
    from preln.chapters.xiong import theory_stack

    z = np.random.default_rng(seed).standard_normal((1, tokens, d))   # (1, S, D), as residual_stream
    _, hidden = theory_stack(True, depth, d, seed)(z, return_hidden=True)
    ms = np.array([np.mean(h ** 2) for h in hidden])
    ss = np.array([np.max(np.sum((h - h.mean(-1, keepdims=True)) ** 2, axis=-1)) for h in hidden])
    return dict(ms=ms, max_token_ss=ss)


#: the grid of the overflow map: input rms 2^0 .. 2^15 in half powers of two, depth 1 .. 24, and
#: widths 8 .. 128, over which the float16 wall sqrt(65520 / D) falls from 2^6.5 to 2^4.5: half a
#: power of two per doubling of D, one column of the grid
GRID_SCALES = tuple(float(2 ** (k / 2)) for k in range(31))
GRID_DEPTH = 24
GRID_D = (8, 16, 32, 64, 128)
#: the depths the map shows, one frame each: the wall does not move with depth
MAP_DEPTHS = (1, GRID_DEPTH // 3, GRID_DEPTH)
GRID_DTYPES = ("float16", "bfloat16")
GRID_POLICIES = ("naive", "safe")


@functools.lru_cache(maxsize=None)
def overflow_grid(dtype="float16", policy="naive", d=64, depth=GRID_DEPTH, scales=GRID_SCALES,
                  tokens=2):
    """Status (index into STATUS) of the residual stream for every input rms and depth.

    One batched :func:`residual_stream` run (a batch row per input rms), on one BLAS thread (see
    :func:`preln.blas.blas_threads`). Cached: the first call for a setting runs the blocks, later calls
    are free. Returns ``status`` (depth, n_scales) for blocks 1 .. depth.
    """
    with blas_threads(1):   # tiny matmuls: waking a second BLAS thread costs more than it saves
        run = residual_stream(d, list(scales), depth, dtype, policy, tokens=tokens,
                              batch=len(scales))
    out = run["status"][:, 1:].T.copy()                               # (depth, n_scales)
    out.setflags(write=False)
    return out


def precompute_overflow_grids():
    """Fill the cache of :func:`overflow_grid` for every setting of the chapter's overflow map."""
    return {(t, p, d): overflow_grid(t, p, d)
            for t in GRID_DTYPES for p in GRID_POLICIES for d in GRID_D}


#: the overflow map's grids, stored so that a frame of the figure is a lookup plus a plot (a grid
#: runs GRID_DEPTH blocks in numpy's float16 loops: 100-300 ms, more than a frame may take);
#: the precision chapter and tests/test_numerics.py recompute them and compare
OVERFLOW_GRIDS_PATH = data_path("precision", "overflow_grids.json")


def _grid_key(dtype, policy, d):
    return f"{dtype}/{policy}/{d}"


def write_overflow_grids(path=OVERFLOW_GRIDS_PATH):
    """Compute every grid of the overflow map and store them, with the grid's axes, as JSON."""
    grids = precompute_overflow_grids()
    doc = {"provenance": {"command": "python -c 'from preln import numerics; numerics.write_overflow_grids()'",
                          "numpy": np.__version__},
           "scales": list(GRID_SCALES), "depth": GRID_DEPTH, "status": list(STATUS),
           # one string per depth (block 1 first), one digit (index into status) per input rms
           "grids": {_grid_key(*k): ["".join(map(str, row)) for row in v] for k, v in grids.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


@functools.lru_cache(maxsize=None)
def _stored_grids(path=OVERFLOW_GRIDS_PATH):
    doc = json.loads(Path(path).read_text())
    if doc["scales"] != list(GRID_SCALES) or doc["depth"] != GRID_DEPTH:
        raise ValueError(f"{path}: stored for other grid axes; rewrite it with write_overflow_grids()")
    return doc["grids"]


def stored_overflow_grid(dtype="float16", policy="naive", d=64):
    """The stored :func:`overflow_grid` of one setting, (depth, n_scales), read-only."""
    grids = _stored_grids()
    key = _grid_key(dtype, policy, d)
    if key not in grids:
        raise KeyError(f"dtype, policy, d: no stored grid for {key!r}; stored: {sorted(grids)}")
    out = np.array([[int(c) for c in row] for row in grids[key]], dtype=np.int64)
    out.setflags(write=False)
    return out


def overflow_map(dtype="float16", policy="naive", depth=1):
    """The overflow map: the status (index into STATUS) of the stream after block ``depth``, for
    every model width of GRID_D (rows) and input rms of GRID_SCALES (columns), read from the
    stored grids: (len(GRID_D), len(GRID_SCALES)), read-only."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not 1 <= depth <= GRID_DEPTH:
        raise ValueError(f"depth: expected an int from 1 to GRID_DEPTH={GRID_DEPTH}; got {depth!r}")
    out = np.stack([stored_overflow_grid(dtype, policy, d)[depth - 1] for d in GRID_D])
    out.setflags(write=False)
    return out


# ---- error against float64 ----------------------------------------------------------------------

def _rel(a, ref):
    a, ref = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def precision_error(settings=(("float32", "safe"), ("float16", "safe"), ("float16", "naive"),
                              ("bfloat16", "safe"), ("bfloat16", "naive")),
                    d=64, batch=1, tokens=8, seed=0):
    """Relative error ||a - a64|| / ||a64|| of one block's output y and input gradient dx against
    the float64 block with the same weights, for each (dtype, policy).

    The weights are drawn once in float64 and rounded to each dtype; x and dy are N(0, 1).
    Returns a list of dicts: dtype, policy, eps, forward (error of y), backward (error of dx).
    """
    cfg = stack_config(d)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, tokens, d))
    dy = rng.standard_normal((batch, tokens, d))
    ref = TransformerBlock(cfg, dtype=np.float64, seed=seed)
    y64 = ref(x)
    dx64 = ref.backward(dy)
    rows = []
    for name, policy in settings:
        blk = TransformerBlock(cfg, dtype=DTYPES[name], seed=seed, policy=policy)
        blk.load_state_dict(ref.state_dict())
        y = blk(x.astype(DTYPES[name]))
        dx = blk.backward(dy.astype(DTYPES[name]))
        rows.append(dict(dtype=name, policy=policy, eps=float(ml_dtypes.finfo(DTYPES[name]).eps),
                         forward=_rel(y, y64), backward=_rel(dx, dx64)))
    return rows


# ---- loss scaling -------------------------------------------------------------------------------

def _grads_of(block, x, dy):
    block.zero_grad()
    block(x)
    dx = block.backward(dy)
    return {"dx": dx, **{k: v for k, v in block.grads.items()}}


@functools.lru_cache(maxsize=8)
def _loss_scaling_setup(d, batch, tokens, seed):
    """A float64 block, its float16 copy (safe policy), x and a unit-rms upstream gradient g."""
    cfg = stack_config(d)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, tokens, d))
    g = rng.standard_normal((batch, tokens, d))
    ref = TransformerBlock(cfg, dtype=np.float64, seed=seed)
    half = TransformerBlock(cfg, dtype=np.float16, seed=seed, policy="safe")
    half.load_state_dict(ref.state_dict())
    return ref, half, x, g


def gradient_underflow(loss_scales=(1.0,), grad_rms=2.0 ** -22, d=64, batch=1, tokens=8, seed=0):
    """Fraction of gradient entries lost in a float16 backward, with and without a loss scale.

    The upstream gradient is dy = grad_rms * g with g ~ N(0, 1): the gradient of a loss averaged
    over many tokens is small (the mean over 2^22 tokens gives about 2^-22 per entry). For each
    loss scale s the float16 block (safe policy) runs ``backward(fp16(s * dy))`` and its gradients
    are unscaled in float64; they are compared with the float64 block's gradients for dy.

    Returns a list of dicts, one per scale: scale; flushed (fraction of the entries of dx and the
    12 parameter gradients that are nonzero in float64 but zero in float16); overflowed (fraction
    of all entries that are not finite); error (||g16 - g64|| / ||g64|| over the finite entries, all tensors together);
    per_tensor (name -> flushed fraction); max_abs (largest |reference gradient|);
    flushed_dx and flushed_params: the flushed fraction of the activation gradient dx alone and
    of the 12 parameter gradients together (sums over the tokens, so sized differently).
    """
    ref, half, x, g = _loss_scaling_setup(d, batch, tokens, seed)
    dy = grad_rms * g
    g64 = _grads_of(ref, x, dy)
    max_abs = max(float(np.abs(v).max()) for v in g64.values())
    rows = []
    x16 = x.astype(np.float16)
    for s in loss_scales:
        with np.errstate(all="ignore"):
            g16 = _grads_of(half, x16, (s * dy).astype(np.float16))
        lost = total = bad = entries = 0
        lost_p = total_p = 0
        per = {}
        num = den = 0.0
        for k, ref_k in g64.items():
            v = g16[k].astype(np.float64) / s
            nz = ref_k != 0
            flushed = (v == 0) & nz
            per[k] = float(flushed.sum() / max(1, nz.sum()))
            lost += int(flushed.sum())
            total += int(nz.sum())
            if k != "dx":
                lost_p += int(flushed.sum())
                total_p += int(nz.sum())
            fin = np.isfinite(v)
            bad += int((~fin).sum())
            entries += v.size
            num += float(np.sum((v[fin] - ref_k[fin]) ** 2))
            den += float(np.sum(ref_k[fin] ** 2))
        rows.append(dict(scale=float(s), flushed=lost / total, overflowed=bad / entries,
                         error=math.sqrt(num / den) if den else float("nan"),
                         per_tensor=per, max_abs=max_abs, flushed_dx=per["dx"],
                         flushed_params=lost_p / total_p))
    return rows


def dynamic_loss_scaling(grad_rms, init_scale=2.0 ** 16, growth_interval=20, growth=2.0,
                         backoff=0.5, d=64, batch=1, tokens=8, seed=0):
    """Dynamic loss scaling (Micikevicius et al. 2018, section 3.2) on the float16 block's backward.

    At step t the upstream gradient is grad_rms[t] * g. The scaler multiplies it by the current
    scale; if any gradient is inf or NaN the step is skipped and the scale multiplied by
    ``backoff``; after ``growth_interval`` finite steps in a row it is multiplied by ``growth``
    (PyTorch's GradScaler has the same rule with 2^16, 2, 0.5 and 2000 steps).

    Returns a dict of arrays over steps: scale (used at that step), skipped (bool), max_abs
    (largest |float64 gradient|), flushed (fraction of entries lost, as in gradient_underflow),
    flushed_unscaled (the same with scale 1).
    """
    scale, good = float(init_scale), 0
    out = {k: [] for k in ("scale", "skipped", "max_abs", "flushed", "flushed_unscaled")}
    for r in grad_rms:
        row, row1 = gradient_underflow((scale, 1.0), grad_rms=float(r), d=d, batch=batch,
                                       tokens=tokens, seed=seed)
        skipped = row["overflowed"] > 0
        out["scale"].append(scale)
        out["skipped"].append(skipped)
        out["max_abs"].append(row["max_abs"])
        out["flushed"].append(row["flushed"] if not skipped else np.nan)
        out["flushed_unscaled"].append(row1["flushed"])
        if skipped:
            scale, good = scale * backoff, 0
        else:
            good += 1
            if good == growth_interval:
                scale, good = scale * growth, 0
    return {k: np.array(v) for k, v in out.items()}
