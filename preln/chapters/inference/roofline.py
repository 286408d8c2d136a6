"""The roofline of a machine and the bytes each op of the block's forward moves.

    roof = measure_roofline()                            # this machine: peak GEMM FLOP/s, bandwidth
    ops = op_traffic(BlockConfig(512, 8, 2048), B=4, S=512, schedule="unfused")
    ops[0].intensity                                     # FLOPs per byte of main-memory traffic

The roofline (Williams, Waterman & Patterson 2009, CACM 52(4)) bounds the speed of a kernel that
does ``flops`` FLOPs and moves ``nbytes`` bytes between main memory and the processor by
``min(peak, bandwidth * flops / nbytes)``: below the *ridge point* ``peak / bandwidth`` (FLOPs per byte)
a kernel is memory-bound.

Bytes per op
------------
:func:`op_traffic` lists, for each op of one eval-mode forward (plain attention, no mask), the
bytes it reads from and writes to main memory under two schedules, counting a pass over every
array of at least B*S elements and every weight matrix (per-row statistics, biases and LayerNorm's
gamma and beta are a few KiB and are left out):

``"unfused"``
    one pass per numpy operation, as the package's own ops run (``preln.ops``): LayerNorm is
    sum, subtract, square, sum, and three in-place scalings (7 reads and 5 writes of x's size);
    softmax is max, subtract, exp, sum, divide (5 reads, 3 writes); the exact float32 GELU makes
    Phi(u) in cache-sized chunks (1 read, 1 write) and then u * Phi(u) (2 reads, 1 write); a Linear
    is its matmul (reads x and W, writes y) and then the bias, in place (1 read, 1 write); the
    scores scale q first (1 read, 1 write of q's size).
``"fused"``
    the kernels of :mod:`preln.ops.fused`: the memory-bound chains as single passes. LayerNorm
    reads x and writes y once; out_proj's bias, the residual add and LayerNorm 2 read x and the
    branch and write the sum and the normalised output; bias + GELU reads u and writes g; softmax
    with its scale reads s and writes p; linear2's bias and the residual add read two arrays and
    write one. The matmuls write their products without a bias pass, except in_proj's.

It assumes nothing stays in cache between ops, which holds once the arrays exceed the last-level
cache. FLOPs are :mod:`preln.chapters.shapes`'s counts (a multiply-add is 2). :func:`time_ops` and
:func:`time_fusion` time the ops and the fused kernels on this machine.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from preln.blas import blas_threads
from preln.chapters.shapes import shape_flow
from preln.measure import best_time
from preln.nn.config import BlockConfig
from preln.validation import positive_int

__all__ = ["Roofline", "PUBLISHED", "measure_gemm", "measure_bandwidth", "measure_roofline",
           "OpTraffic", "arithmetic_intensity", "op_traffic", "SCHEDULES", "FUSED_KERNELS", "time_ops",
           "FusionTiming", "time_fusion"]

SCHEDULES = ("unfused", "fused")
#: the memory-bound chains the fused schedule runs as one pass each (preln.ops.fused)
FUSED_KERNELS = ("LayerNorm", "bias + residual + LayerNorm", "bias + GELU", "softmax",
                 "bias + residual")


class Roofline(NamedTuple):
    """A machine as the roofline sees it: peak FLOP/s and main-memory bandwidth (bytes/s)."""

    name: str
    peak_flops: float     # FLOP/s
    bandwidth: float      # bytes/s
    source: str = ""      # "measured" or a citation key

    @property
    def ridge(self):
        """FLOPs per byte above which a kernel can reach the peak: peak / bandwidth."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity):
        """min(peak, bandwidth * intensity), FLOP/s, for intensity in FLOPs per byte."""
        return np.minimum(self.peak_flops, self.bandwidth * np.asarray(intensity, dtype=float))

    def time(self, flops, nbytes):
        """The roofline's lower bound on the time of a kernel: max(flops / peak, bytes / bandwidth)."""
        return np.maximum(np.asarray(flops, dtype=float) / self.peak_flops,
                          np.asarray(nbytes, dtype=float) / self.bandwidth)


#: Published GPUs, as NVIDIA's datasheets state them: memory bandwidth and dense BF16 Tensor Core
#: throughput (the datasheets print BF16 "with sparsity", twice the dense rate, for H100 and H200).
PUBLISHED = {
    "A100 SXM 40GB": Roofline("A100 SXM 40GB", 312e12, 1555e9, "nvidia2020a100"),
    "A100 SXM 80GB": Roofline("A100 SXM 80GB", 312e12, 2039e9, "nvidia2020a100"),
    "H100 SXM": Roofline("H100 SXM", 989e12, 3.35e12, "nvidia2022h100"),
    "H200 SXM": Roofline("H200 SXM", 989e12, 4.8e12, "nvidia2024h200"),
}


def measure_gemm(n=2048, repeats=3, threads=1, dtype=np.float32, seed=0):
    """Best FLOP/s of an (n, n) @ (n, n) product in numpy's BLAS: 2 n^3 / best CPU time.

    CPU time (``time.process_time``) does not count the moments another program holds the core;
    with more than one thread it adds the threads' times, so keep ``threads=1`` for a per-core peak.
    """
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype)
    with blas_threads(threads):
        t = best_time(lambda: np.matmul(a, b, out=out), repeats)
    return 2 * n**3 / t


def measure_bandwidth(nbytes=128 * 2**20, repeats=5, dtype=np.float32):
    """STREAM-like bandwidths in bytes/s, {"copy", "add", "triad"}, over arrays of ``nbytes`` each
    (best CPU time of ``repeats``; one thread: numpy's ufuncs do not thread).

    Counted traffic, as STREAM counts it (McCalpin 1995) plus what numpy really moves:
    copy ``b = a`` reads a and writes b (2 arrays); add ``c = a + b`` 3 arrays; numpy's triad
    ``a = b + s c`` is two passes (``a = s c``; ``a += b``): 5 arrays. Choose ``nbytes`` a few
    times the last-level cache, or the bandwidth of the cache is measured instead.
    """
    n = int(nbytes) // np.dtype(dtype).itemsize
    a, b, c = (np.full(n, v, dtype) for v in (1.0, 2.0, 0.5))   # touched: no page faults timed
    s = np.dtype(dtype).type(3.0)
    size = a.nbytes

    def triad():
        np.multiply(c, s, out=a)
        np.add(a, b, out=a)

    return {"copy": 2 * size / best_time(lambda: np.copyto(b, a), repeats),
            "add": 3 * size / best_time(lambda: np.add(a, b, out=c), repeats),
            "triad": 5 * size / best_time(triad, repeats)}


def measure_roofline(n=2048, nbytes=128 * 2**20, repeats=3, threads=1):
    """This machine's roofline: measured GEMM peak and the best STREAM-like bandwidth."""
    peak = measure_gemm(n, repeats, threads)
    bw = measure_bandwidth(nbytes, repeats)
    return Roofline("this machine", peak, max(bw.values()), "measured"), bw


def arithmetic_intensity(cost):
    """FLOPs per byte of main-memory traffic of anything with ``flops`` and ``nbytes`` (an
    :class:`OpTraffic`, a :class:`DecodeCost`)."""
    return cost.flops / cost.nbytes


class OpTraffic(NamedTuple):
    """One op (or fused kernel) of the forward: FLOPs and main-memory traffic in bytes."""

    name: str
    flops: int
    read: int             # bytes read from main memory
    written: int          # bytes written to main memory
    matmul: bool          # a tensor contraction (compute-bound when large)

    @property
    def nbytes(self):
        return self.read + self.written

    intensity = property(arithmetic_intensity, doc="FLOPs per byte of traffic.")


def op_traffic(config, B, S, schedule="unfused", itemsize=4):
    """Per-op FLOPs and bytes of one eval-mode Pre-LN forward (plain attention), in order.

    ``schedule``: "unfused" (one pass per numpy operation) or "fused" (the three fused kernels);
    the module docstring lists what each pass reads and writes. ``itemsize``: bytes per element
    (4 for float32). Returns a list of :class:`OpTraffic`.
    """
    if not isinstance(config, BlockConfig):
        raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
    if not config.norm_first:
        raise ValueError("config: op_traffic models the Pre-LN block (norm_first=True); got Post-LN")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}; got {schedule!r}")
    B, S = positive_int(B, "B"), positive_int(S, "S")
    itemsize = positive_int(itemsize, "itemsize")
    D, H, F = config.d_model, config.n_heads, config.d_ff
    flow = shape_flow(config, B, S, training=False, attention="plain")
    fl = {r.name: r.flops for r in flow.rows}
    bsd, bsf, bhss = B * S * D, B * S * F, B * H * S * S
    act = f"mlp.{config.activation}"
    ops = []

    def add(name, flops, reads, writes, matmul=False):      # reads, writes in elements
        ops.append(OpTraffic(name, int(flops), int(reads) * itemsize, int(writes) * itemsize,
                             matmul))

    def linear(name, n_in, n_out, w, bias_pass=True):      # matmul, then (unfused) the bias pass
        flops = fl[name] - (0 if bias_pass else n_out)      # without its bias, a Linear is its matmul
        add(name, flops, n_in + w + (n_out if bias_pass else 0),
            n_out * (2 if bias_pass else 1), matmul=True)

    gelu_reads, gelu_writes = {"gelu": (3, 2), "gelu_tanh": (10, 8), "relu": (1, 1)}[config.activation]
    if schedule == "unfused":
        add("norm1", fl["norm1"], 7 * bsd, 5 * bsd)
        linear("attn.in_proj", bsd, 3 * bsd, 3 * D * D)
        add("attn.scores", fl["attn.scores"], 3 * bsd, bsd + bhss, matmul=True)  # q * scale, then q k^T
        add("attn.softmax", fl["attn.softmax"], 5 * bhss, 3 * bhss)
        add("attn.weighted_sum", fl["attn.weighted_sum"], bhss + bsd, bsd, matmul=True)
        add("attn.merge_heads", 0, bsd, bsd)
        linear("attn.out_proj", bsd, bsd, D * D)
        add("residual1", fl["residual1"], 2 * bsd, bsd)
        add("norm2", fl["norm2"], 7 * bsd, 5 * bsd)
        linear("mlp.linear1", bsd, bsf, D * F)
        add(act, fl[act], gelu_reads * bsf, gelu_writes * bsf)
        linear("mlp.linear2", bsf, bsd, D * F)
        add("residual2", fl["residual2"], 2 * bsd, bsd)
    else:                                                     # preln.ops.fused's kernels
        add("norm1", fl["norm1"], bsd, bsd)
        linear("attn.in_proj", bsd, 3 * bsd, 3 * D * D)
        scale = fl["attn.scores"] - 2 * B * H * S * S * (D // H)   # the q scaling moves into softmax
        add("attn.scores", fl["attn.scores"] - scale, 2 * bsd, bhss, matmul=True)
        add("attn.softmax", fl["attn.softmax"] + scale, bhss, bhss)
        add("attn.weighted_sum", fl["attn.weighted_sum"], bhss + bsd, bsd, matmul=True)
        add("attn.merge_heads", 0, bsd, bsd)
        linear("attn.out_proj", bsd, bsd, D * D, bias_pass=False)
        add("bias + residual1 + norm2", bsd + fl["residual1"] + fl["norm2"], 2 * bsd, 2 * bsd)
        linear("mlp.linear1", bsd, bsf, D * F, bias_pass=False)
        add(f"bias + {config.activation}", fl[act] + bsf, bsf, bsf)
        linear("mlp.linear2", bsf, bsd, D * F, bias_pass=False)
        add("bias + residual2", bsd + fl["residual2"], 2 * bsd, bsd)
    return ops


def _timing_inputs(config, B, S, seed):
    rng = np.random.default_rng(seed)
    D, H, F = config.d_model, config.n_heads, config.d_ff
    f32 = np.float32

    def r(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(f32)

    from preln.ops.attention import split_heads
    t = dict(x=r(B, S, D), a=r(B, S, D), ones=np.ones(D, f32), zeros=np.zeros(D, f32),
             w_in=r(3 * D, D, scale=D**-0.5), b_in=r(3 * D), w_out=r(D, D, scale=D**-0.5),
             b_out=r(D), w1=r(F, D, scale=D**-0.5), b1=r(F), w2=r(D, F, scale=F**-0.5), b2=r(D),
             s=r(B, H, S, S), o=np.ascontiguousarray(r(B, H, S, D // H)), u=r(B, S, F),
             u_fused=r(B, S, F), scale=f32(1 / np.sqrt(D // H)))
    t["q"], t["k"], t["v"] = (split_heads(r(B, S, D), H) for _ in range(3))
    return t


def _run_table(config, t, schedule):
    """{op name: zero-argument function} for the ops of ``op_traffic(config, ..., schedule)``."""
    from preln.ops import activation_forward, layer_norm_forward, linear_forward, merge_heads, softmax_forward
    from preln.precision import SAFE, matmul

    act = f"mlp.{config.activation}"
    kt = t["k"].swapaxes(-1, -2)
    common = {
        "attn.in_proj": lambda: linear_forward(t["x"], t["w_in"], t["b_in"]),
        "attn.weighted_sum": lambda: matmul(t["s"], t["v"]),
        "attn.merge_heads": lambda: merge_heads(t["o"]),
    }
    if schedule == "unfused":
        return {
            "norm1": lambda: layer_norm_forward(t["x"], t["ones"], t["zeros"]),
            "attn.in_proj": common["attn.in_proj"],
            "attn.scores": lambda: matmul(t["q"] * t["scale"], kt),
            "attn.softmax": lambda: softmax_forward(t["s"], -1, SAFE),
            "attn.weighted_sum": common["attn.weighted_sum"],
            "attn.merge_heads": common["attn.merge_heads"],
            "attn.out_proj": lambda: linear_forward(t["x"], t["w_out"], t["b_out"]),
            "residual1": lambda: t["x"] + t["a"],
            "norm2": lambda: layer_norm_forward(t["x"], t["ones"], t["zeros"]),
            "mlp.linear1": lambda: linear_forward(t["x"], t["w1"], t["b1"]),
            act: lambda: activation_forward(t["u"], config.activation),
            "mlp.linear2": lambda: linear_forward(t["u"], t["w2"], t["b2"]),
            "residual2": lambda: t["x"] + t["a"],
        }
    from preln.ops import fused
    if config.activation != "gelu":
        raise ValueError(f"config: the fused kernels implement the exact GELU; got activation "
                         f"{config.activation!r}")
    return {
        "norm1": lambda: fused.layer_norm(t["x"], t["ones"], t["zeros"]),
        "attn.in_proj": common["attn.in_proj"],
        "attn.scores": lambda: matmul(t["q"], kt),
        "attn.softmax": lambda: fused.softmax(t["s"], t["scale"]),
        "attn.weighted_sum": common["attn.weighted_sum"],
        "attn.merge_heads": common["attn.merge_heads"],
        "attn.out_proj": lambda: linear_forward(t["x"], t["w_out"], None),
        "bias + residual1 + norm2": lambda: fused.add_layer_norm(t["x"], t["a"], t["b_out"],
                                                                 t["ones"], t["zeros"]),
        "mlp.linear1": lambda: linear_forward(t["x"], t["w1"], None),
        "bias + gelu": lambda: fused.bias_gelu(t["u_fused"], t["b1"], keep=False),   # in place
        "mlp.linear2": lambda: linear_forward(t["u"], t["w2"], None),
        "bias + residual2": lambda: fused.bias_residual(t["x"], t["a"], t["b2"]),
    }


def _cold_best(run, repeats, clock, flush_bytes):
    # Before each timed call an untimed copy of 2 x flush_bytes evicts the last-level cache, so
    # every op starts with its inputs in main memory, as op_traffic assumes.
    flush_src = np.ones(flush_bytes // 4, np.float32)
    flush_dst = np.empty_like(flush_src)
    best = dict.fromkeys(run, math.inf)
    for fn in run.values():
        fn()                                                 # warm-up (and numba's compilation)
    for _ in range(repeats):                                 # rounds interleave the ops
        for name, fn in run.items():
            np.copyto(flush_dst, flush_src)
            t0 = clock()
            fn()
            best[name] = min(best[name], clock() - t0)
    return best


def time_ops(config, B, S, schedule="unfused", repeats=5, threads=1, seed=0,
             clock=time.process_time, flush_bytes=64 * 2**20):
    """Best CPU time (seconds) of each op of ``op_traffic(config, B, S, schedule)``, run alone.

    "unfused" runs the package's own functional ops (:mod:`preln.ops`), "fused" the kernels of
    :mod:`preln.ops.fused` and the matmuls without their bias pass; float32, eval mode, plain
    attention, fresh random inputs. Returns {op name: seconds} in the order of :func:`op_traffic`.
    Rounds interleave the ops, so a slow spell on a shared machine slows them all alike; the best
    of ``repeats`` is kept. BLAS and the fused kernels run ``threads`` threads. Choose
    ``flush_bytes`` at least the size of the last-level cache.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}; got {schedule!r}")
    B, S = positive_int(B, "B"), positive_int(S, "S")
    run = _run_table(config, _timing_inputs(config, B, S, seed), schedule)
    with blas_threads(threads):   # the fused kernels are single-threaded numba loops
        return _cold_best(run, repeats, clock, flush_bytes)


class FusionTiming(NamedTuple):
    """One fused kernel against the numpy ops it replaces, at one size."""

    name: str
    shape: tuple
    unfused_bytes: int      # counted main-memory traffic, as op_traffic counts it
    fused_bytes: int
    unfused_s: float        # best CPU seconds
    fused_s: float
    max_abs_diff: float     # |fused - unfused|, largest over the output

    @property
    def speedup(self):
        return self.unfused_s / self.fused_s


def time_fusion(nbytes=64 * 2**20, width=1024, repeats=3, threads=1, seed=0,
                clock=time.process_time, flush_bytes=64 * 2**20):
    """Each fused kernel of :mod:`preln.ops.fused` against its numpy ops, on float32 arrays of
    ``nbytes`` each (rows of ``width``; softmax on (1, 16, R, R) scores of the same size).

    Returns a list of :class:`FusionTiming`. Counted traffic per element E of the main array:
    LayerNorm 12 E vs 2 E; bias + residual + LayerNorm 17 E (bias pass 2, add 3, LayerNorm 12)
    vs 4 E; bias + GELU 7 E (bias 2, GELU 5) vs 2 E; softmax 8 E vs 2 E; bias + residual 5 E vs 3 E.
    """
    from preln.ops import activation_forward, fused, layer_norm_forward, softmax_forward

    n = positive_int(nbytes, "nbytes") // 4
    rows = max(1, n // width)
    rng = np.random.default_rng(seed)
    f32 = np.float32
    x, a = (rng.standard_normal((rows, width)).astype(f32) for _ in range(2))
    g, b, bias = np.ones(width, f32), np.zeros(width, f32), rng.standard_normal(width).astype(f32)
    side = int(math.isqrt(n // 16))
    s = rng.standard_normal((1, 16, side, side)).astype(f32)
    u_in = x.copy()

    def bias_gelu_fused():
        np.copyto(u_in, x)                 # bias_gelu(keep=False) overwrites its input: refill it
        return fused.bias_gelu(u_in, bias, keep=False)[0]

    def unfused_add_ln():
        z = a + bias                       # the sublayer's bias pass
        r = x + z                          # the residual add
        return layer_norm_forward(r, g, b)[0]

    def unfused_bias_gelu():
        u = x + bias
        return activation_forward(u, "gelu")[0]

    cases = [
        ("LayerNorm", x.shape, 12, 2, lambda: layer_norm_forward(x, g, b)[0],
         lambda: fused.layer_norm(x, g, b)[0]),
        ("bias + residual + LayerNorm", x.shape, 17, 4, unfused_add_ln,
         lambda: fused.add_layer_norm(x, a, bias, g, b)[1]),
        ("bias + GELU", x.shape, 7, 2, unfused_bias_gelu, bias_gelu_fused),
        ("softmax", s.shape, 8, 2, lambda: softmax_forward(s)[0], lambda: fused.softmax(s)),
        ("bias + residual", x.shape, 5, 3, lambda: x + (a + bias),
         lambda: fused.bias_residual(x, a, bias)),
    ]
    run = {}
    for name, _, _, _, un, fu in cases:
        run[(name, "unfused")] = un
        run[(name, "fused")] = fu
    with blas_threads(threads):   # the fused kernels are single-threaded numba loops
        best = _cold_best(run, repeats, clock, flush_bytes)
        out = []
        for name, shape, k_un, k_fu, un, fu in cases:
            elements = int(np.prod(shape))
            diff = float(np.abs(np.asarray(fu(), np.float64) - np.asarray(un(), np.float64)).max())
            out.append(FusionTiming(name, tuple(shape), k_un * elements * 4, k_fu * elements * 4,
                                    best[(name, "unfused")], best[(name, "fused")], diff))
    return out
