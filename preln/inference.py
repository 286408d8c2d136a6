"""Inference costs of the block: the roofline, bytes per op, attention I/O and decoding.

    from preln import BlockConfig
    from preln import inference as inf

    roof = inf.measure_roofline()                        # this machine: peak GEMM FLOP/s, bandwidth
    ops = inf.op_traffic(BlockConfig(512, 8, 2048), B=4, S=512, schedule="unfused")
    ops[0].intensity                                     # FLOPs per byte of main-memory traffic
    out, io = inf.tiled_attention_io(q, k, v, M=4096)    # FlashAttention, slow-memory accesses counted
    inf.decode_cost(cfg, n_layers=40, batch=8, context=2048, itemsize=2)

The roofline (Williams, Waterman & Patterson 2009, CACM 52(4)) bounds the speed of a kernel that
does F FLOPs and moves Q bytes between main memory and the processor by
``min(peak, bandwidth * F / Q)``: below the *ridge point* ``peak / bandwidth`` (FLOPs per byte)
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
cache. FLOPs are :mod:`preln.shapes`'s counts (a multiply-add is 2).

Attention I/O
-------------
:func:`standard_attention_io` and :func:`tiled_attention_io` compute attention for one head while
counting every element moved between *slow* memory (HBM, or main memory) and a *fast* memory of M
elements (SRAM, or cache), following Dao et al. 2022 (FlashAttention, arXiv 2205.14135):
Algorithm 0 (standard: S and P are written to and read back from slow memory) and Algorithm 1
(tiled, block sizes ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``, online softmax). Theorem 2:
standard attention needs Theta(Nd + N^2) accesses, FlashAttention Theta(N^2 d^2 / M).
:func:`attention_accesses` is the closed form both instrumented functions are tested against.

Decoding
--------
:func:`kv_cache_bytes` is ``2 * n_layers * batch * seq * d_model * itemsize`` (K and V per layer;
multi-head attention, d_model = n_heads * d_head); Kwon et al. 2023 (vLLM, arXiv 2309.06180, §3)
give OPT-13B's 800 KB per token. :func:`decode_cost` counts one decoding step: every weight is
read once per step and shared by the batch, each sequence reads its own KV cache, so the
arithmetic intensity is about ``2 * batch / itemsize`` FLOPs per byte while the weights dominate
the traffic -- about the batch size in 16-bit formats.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from .blas import blas_threads
from .config import BlockConfig
from .shapes import shape_flow

__all__ = ["Roofline", "PUBLISHED", "measure_gemm", "measure_bandwidth", "measure_roofline",
           "OpTraffic", "op_traffic", "SCHEDULES", "FUSED_KERNELS", "time_ops",
           "IOCount", "standard_attention_io", "tiled_attention_io", "attention_accesses",
           "flash_block_sizes", "reference_attention", "kv_cache_bytes", "DecodeCost",
           "decode_cost", "block_params", "time_decode", "FusionTiming", "time_fusion"]

SCHEDULES = ("unfused", "fused")
#: the memory-bound chains the fused schedule runs as one pass each (preln.ops.fused)
FUSED_KERNELS = ("LayerNorm", "bias + residual + LayerNorm", "bias + GELU", "softmax",
                 "bias + residual")


# ---- the roofline ---------------------------------------------------------------------------

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


def _best_time(fn, repeats, clock=time.process_time):
    fn()                                     # warm-up: page faults, BLAS buffers
    best = math.inf
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


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
        t = _best_time(lambda: np.matmul(a, b, out=out), repeats)
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

    return {"copy": 2 * size / _best_time(lambda: np.copyto(b, a), repeats),
            "add": 3 * size / _best_time(lambda: np.add(a, b, out=c), repeats),
            "triad": 5 * size / _best_time(triad, repeats)}


def measure_roofline(n=2048, nbytes=128 * 2**20, repeats=3, threads=1):
    """This machine's roofline: measured GEMM peak and the best STREAM-like bandwidth."""
    peak = measure_gemm(n, repeats, threads)
    bw = measure_bandwidth(nbytes, repeats)
    return Roofline("this machine", peak, max(bw.values()), "measured"), bw


# ---- bytes per op ---------------------------------------------------------------------------

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

    @property
    def intensity(self):
        """FLOPs per byte of traffic."""
        return self.flops / self.nbytes


def _check_size(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int; got {value!r}")
    return int(value)


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
    B, S = _check_size("B", B), _check_size("S", S)
    itemsize = _check_size("itemsize", itemsize)
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

    from .ops.attention import split_heads
    t = dict(x=r(B, S, D), a=r(B, S, D), ones=np.ones(D, f32), zeros=np.zeros(D, f32),
             w_in=r(3 * D, D, scale=D**-0.5), b_in=r(3 * D), w_out=r(D, D, scale=D**-0.5),
             b_out=r(D), w1=r(F, D, scale=D**-0.5), b1=r(F), w2=r(D, F, scale=F**-0.5), b2=r(D),
             s=r(B, H, S, S), o=np.ascontiguousarray(r(B, H, S, D // H)), u=r(B, S, F),
             u_fused=r(B, S, F), scale=f32(1 / np.sqrt(D // H)))
    t["q"], t["k"], t["v"] = (split_heads(r(B, S, D), H) for _ in range(3))
    return t


def _run_table(config, t, schedule):
    """{op name: zero-argument function} for the ops of ``op_traffic(config, ..., schedule)``."""
    from .ops import activation_forward, layer_norm_forward, linear_forward, merge_heads, softmax_forward
    from .precision import SAFE, matmul

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
    from .ops import fused
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
    B, S = _check_size("B", B), _check_size("S", S)
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
    from .ops import activation_forward, fused, layer_norm_forward, softmax_forward

    n = _check_size("nbytes", nbytes) // 4
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


# ---- attention I/O --------------------------------------------------------------------------

class IOCount(NamedTuple):
    """Elements moved between slow and fast memory by one attention call (one head)."""

    reads: int
    writes: int
    peak_fast: int        # the most elements held in fast memory at once

    @property
    def accesses(self):
        return self.reads + self.writes


class _Slow:
    """Slow memory: every load and store is counted in elements."""

    def __init__(self):
        self.reads = self.writes = 0

    def load(self, array):
        self.reads += array.size
        return np.array(array)           # a copy: the fast-memory working copy

    def store(self, dst, index, value):
        value = np.asarray(value)
        self.writes += value.size
        dst[index] = value


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, np.ndarray) or t.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D (N, d) array (one head); got "
                             f"{type(t).__name__} of shape {getattr(t, 'shape', None)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v: expected equal shapes (N, d); got {q.shape}, {k.shape}, {v.shape}")


def reference_attention(q, k, v):  # (N, d) x 3 -> (N, d)
    """softmax(q k^T / sqrt(d)) v, in one piece: the value both instrumented versions must give."""
    s = (q @ k.T) / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def standard_attention_io(q, k, v):  # (N, d) x 3 -> (N, d), IOCount
    """Dao et al. 2022, Algorithm 0, with slow-memory traffic counted.

    1. load Q, K; S = Q K^T / sqrt(d); write S.   2. read S; P = softmax(S); write P.
    3. load P, V; O = P V; write O.   Each step streams its operands once (the theorem's model: the
    products' own blocking is assumed perfect), so reads + writes = 4 N d + 4 N^2.
    """
    _check_qkv(q, k, v)
    N, d = q.shape
    mem = _Slow()
    S_hbm, P_hbm, O_hbm = np.empty((N, N)), np.empty((N, N)), np.empty((N, d))
    mem.store(S_hbm, ..., (mem.load(q) @ mem.load(k).T) / np.sqrt(d))
    s = mem.load(S_hbm)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    mem.store(P_hbm, ..., p / p.sum(axis=1, keepdims=True))
    mem.store(O_hbm, ..., mem.load(P_hbm) @ mem.load(v))
    return O_hbm, IOCount(mem.reads, mem.writes, peak_fast=2 * N * N)


def flash_block_sizes(M, d):
    """FlashAttention's block sizes for fast memory M and head dim d: B_c = ceil(M/4d), B_r = min(B_c, d)."""
    M, d = _check_size("M", M), _check_size("d", d)
    if M < d:
        raise ValueError(f"M: expected at least d = {d} elements of fast memory; got {M}")
    b_c = -(-M // (4 * d))
    return b_c, min(b_c, d)


def tiled_attention_io(q, k, v, M):  # (N, d) x 3, int -> (N, d), IOCount
    """Dao et al. 2022, Algorithm 1 (FlashAttention forward), with slow-memory traffic counted.

    O, l, m start in slow memory (O = 0, l = 0, m = -inf: N d + 2 N writes). For each key block j
    (B_c rows of K and V, loaded once) and each query block i (B_r rows): load Q_i, O_i, l_i, m_i;
    S = Q_i K_j^T / sqrt(d); m~ = rowmax(S); P~ = exp(S - m~); l~ = rowsum(P~);
    m' = max(m_i, m~); l' = e^(m_i - m') l_i + e^(m~ - m') l~;
    O_i = (l_i e^(m_i - m') O_i + e^(m~ - m') P~ V_j) / l'; write O_i, l', m'.
    """
    _check_qkv(q, k, v)
    N, d = q.shape
    b_c, b_r = flash_block_sizes(M, d)
    tau = 1 / np.sqrt(d)
    mem = _Slow()
    O_hbm, l_hbm, m_hbm = np.empty((N, d)), np.empty(N), np.empty(N)
    mem.store(O_hbm, ..., np.zeros((N, d)))
    mem.store(l_hbm, ..., np.zeros(N))
    mem.store(m_hbm, ..., np.full(N, -np.inf))
    peak = 0
    for j0 in range(0, N, b_c):
        kj, vj = mem.load(k[j0:j0 + b_c]), mem.load(v[j0:j0 + b_c])
        for i0 in range(0, N, b_r):
            rows = slice(i0, i0 + b_r)
            qi, oi = mem.load(q[rows]), mem.load(O_hbm[rows])
            li, mi = mem.load(l_hbm[rows]), mem.load(m_hbm[rows])
            s = tau * (qi @ kj.T)                                  # (B_r, B_c), in fast memory
            m_t = s.max(axis=1)
            p_t = np.exp(s - m_t[:, None])
            l_t = p_t.sum(axis=1)
            m_new = np.maximum(mi, m_t)
            l_new = np.exp(mi - m_new) * li + np.exp(m_t - m_new) * l_t
            o_new = ((li * np.exp(mi - m_new))[:, None] * oi
                     + np.exp(m_t - m_new)[:, None] * (p_t @ vj)) / l_new[:, None]
            peak = max(peak, kj.size + vj.size + qi.size + oi.size + s.size + 4 * len(li))
            mem.store(O_hbm, rows, o_new)
            mem.store(l_hbm, rows, l_new)
            mem.store(m_hbm, rows, m_new)
    return O_hbm, IOCount(mem.reads, mem.writes, peak)


def attention_accesses(N, d, M=None, kind="tiled"):
    """Closed-form slow-memory accesses (elements) of one head, as the instrumented functions count.

    standard: 4 N d + 4 N^2.
    tiled: N d + 2 N (initialise O, l, m) + 2 N d (K and V, once) + T_c (3 N d + 4 N)
    (per key block: read Q, O, l, m and write O, l, m for every query row), T_c = ceil(N / B_c).
    """
    N, d = _check_size("N", N), _check_size("d", d)
    if kind == "standard":
        return 4 * N * d + 4 * N * N
    if kind != "tiled":
        raise ValueError(f"kind: expected 'standard' or 'tiled'; got {kind!r}")
    if M is None:
        raise ValueError("M: the tiled count needs the fast-memory size M (elements)")
    b_c, _ = flash_block_sizes(M, d)
    t_c = -(-N // b_c)
    return N * d + 2 * N + 2 * N * d + t_c * (3 * N * d + 4 * N)


# ---- decoding -------------------------------------------------------------------------------

def kv_cache_bytes(n_layers, batch, seq, d_model, itemsize):
    """K and V of every layer for every position: 2 * n_layers * batch * seq * d_model * itemsize."""
    for name, value in (("n_layers", n_layers), ("batch", batch), ("seq", seq),
                        ("d_model", d_model), ("itemsize", itemsize)):
        _check_size(name, value)
    return 2 * n_layers * batch * seq * d_model * itemsize


def block_params(config):
    """Parameters of one block: 4 D^2 + 2 D F weights, 3D + D + F + D biases, 4 D of LayerNorm."""
    D, F = config.d_model, config.d_ff
    return 4 * D * D + 2 * D * F + 3 * D + D + F + D + 4 * D


class DecodeCost(NamedTuple):
    """One decoding step of ``batch`` sequences at context length ``context`` (blocks only)."""

    flops: int
    weight_bytes: int     # every block's weights, read once per step
    kv_bytes: int         # the KV caches read (and the new K, V written)
    batch: int

    @property
    def nbytes(self):
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self):
        return self.flops / self.nbytes


def decode_cost(config, n_layers, batch, context, itemsize=2):
    """FLOPs and main-memory bytes of one decoding step (one new token per sequence).

    Per layer and sequence: the matmuls with the weights, 2 (4 D^2 + 2 D F) FLOPs, and attention
    over ``context`` cached positions, 4 context D FLOPs (q k^T and p v). Bytes: the weights once
    per step (all sequences share them), and each sequence's K and V at ``context`` positions.
    Activations (a few D per sequence) are left out.
    """
    if not isinstance(config, BlockConfig):
        raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
    n_layers, batch = _check_size("n_layers", n_layers), _check_size("batch", batch)
    context, itemsize = _check_size("context", context), _check_size("itemsize", itemsize)
    D, F = config.d_model, config.d_ff
    flops = n_layers * batch * (2 * (4 * D * D + 2 * D * F) + 4 * context * D)
    weights = n_layers * block_params(config) * itemsize
    kv = kv_cache_bytes(n_layers, batch, context, D, itemsize)
    return DecodeCost(int(flops), int(weights), int(kv), batch)


def time_decode(step, n_tokens, repeats=3, clock=time.process_time):
    """Best CPU seconds per call of ``step(t)`` for t in range(n_tokens), as an array (n_tokens,).

    ``step(t)`` does the work of generating token t; repeats run the whole sequence again (the
    caller's step resets its state at t = 0) and the best time of each t is kept.
    """
    best = np.full(n_tokens, np.inf)
    for _ in range(repeats):
        for t in range(n_tokens):
            t0 = clock()
            step(t)
            best[t] = min(best[t], clock() - t0)
    return best
