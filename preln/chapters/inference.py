"""Inference costs of the block: the roofline, bytes per op, attention I/O and decoding.

    from preln import BlockConfig
    from preln.chapters import inference as inf

    roof = inf.measure_roofline()                        # this machine: peak GEMM FLOP/s, bandwidth
    ops = inf.op_traffic(BlockConfig(512, 8, 2048), B=4, S=512, schedule="unfused")
    ops[0].intensity                                     # FLOPs per byte of main-memory traffic
    out, io = inf.tiled_attention_io(q, k, v, C=4096)    # FlashAttention, slow-memory accesses counted
    inf.decode_cost(cfg, n_layers=40, batch=8, context=2048, itemsize=2)
    llama = inf.PUBLISHED_MODELS["Llama 3 8B"]           # grouped-query attention, 8 KV heads
    inf.step_ops(llama, batch=16, new=1, context=4096)  # one decode step's ops, one layer
    inf.predict_generation(llama, inf.PUBLISHED["H100 SXM"], batch=1, prompt=512, n_new=128)

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
cache. FLOPs are :mod:`preln.chapters.shapes`'s counts (a multiply-add is 2).

Attention I/O
-------------
:func:`standard_attention_io` and :func:`tiled_attention_io` compute attention for one head while
counting every element moved between *slow* memory (HBM, or main memory) and a *fast* memory of C
elements (SRAM, or cache; the paper's M, renamed because the book's M is the attention mask),
following Dao et al. 2022 (FlashAttention, arXiv 2205.14135) with the paper's N (sequence length)
and d (head width): Algorithm 0 (standard: the scores Z and P are written to and read back from
slow memory) and Algorithm 1 (tiled, block sizes ``B_c = ceil(C / 4d)``, ``B_r = min(B_c, d)``,
online softmax, outer loop over key blocks: "fa1"), and the loop order of FlashAttention-2 (Dao
2023, arXiv 2307.08691: outer loop over query blocks, an unnormalised accumulator, "fa2").
Theorem 2: standard attention needs Theta(Nd + N^2) accesses, FlashAttention Theta(N^2 d^2 / C).
:func:`attention_access_terms` and :func:`attention_accesses` are the closed forms, term by term
and summed, that the instrumented functions are tested against.

Decoding
--------
:func:`kv_cache_bytes` is ``2 * n_layers * batch * seq * n_kv * d_head * itemsize`` (K and V per
layer; multi-head attention has n_kv * d_head = d_model; grouped-query attention fewer KV heads);
Kwon et al. 2023 (vLLM, arXiv 2309.06180, section 3) give OPT-13B's 800 KB per token.
:func:`decode_cost` counts one decoding step: every weight is read once per step and shared by the
batch, each sequence reads its own KV cache, so the arithmetic intensity is about
``2 * batch / itemsize`` FLOPs per byte while the weights dominate the traffic -- about the batch
size in 16-bit formats (Pope et al. 2022, arXiv 2211.05102, section 2).

:func:`step_ops` splits a forward step of a :class:`ModelShape` (published configurations in
:data:`PUBLISHED_MODELS`) into its ops, for a prefill (all prompt positions at once) or a decode
step (one position per sequence): the per-op roofline. :func:`step_time` sums the ops' roofline
bounds, :func:`predict_generation` turns them into time to first token (TTFT) and time per output
token (TPOT), :func:`compute_bound_batch` finds the batch at which an op crosses a ridge point, and
:func:`time_generation` measures TTFT and TPOT of a :class:`preln.models.lm.TinyLM` on this machine.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from preln.blas import blas_threads
from preln.measure import best_time
from preln.nn.config import BlockConfig
from preln.ops.attention import online_softmax_step, tiles
from preln.validation import nonnegative_int, positive_int
from preln.chapters.shapes import shape_flow

__all__ = ["Roofline", "PUBLISHED", "measure_gemm", "measure_bandwidth", "measure_roofline",
           "OpTraffic", "op_traffic", "SCHEDULES", "FUSED_KERNELS", "time_ops",
           "IOCount", "standard_attention_io", "tiled_attention_io", "ORDERS", "attention_accesses",
           "attention_access_terms", "flash_block_sizes", "reference_attention", "kv_cache_bytes",
           "weight_bytes_per_value", "DecodeCost", "decode_cost", "block_params", "ModelShape",
           "PUBLISHED_MODELS", "model_shape", "step_ops", "head_ops", "step_time",
           "GenerationTimes", "predict_generation", "compute_bound_batch", "GenerationTiming",
           "time_generation", "time_decode", "FusionTiming", "time_fusion"]

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

    intensity = property(lambda self: _intensity(self), doc="FLOPs per byte of traffic.")


def _intensity(traffic):  # FLOPs per byte of main-memory traffic
    return traffic.flops / traffic.nbytes


def _check_size(name, value):
    return positive_int(value, name)


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
    from preln.ops import activation_forward, fused, layer_norm_forward, softmax_forward

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
    by_array: dict = None  # {(array name, "read" | "write"): elements}: the terms of the count

    @property
    def accesses(self):
        return self.reads + self.writes


class _Slow:
    """Slow memory: every load and store is counted in elements, in total and per named array."""

    def __init__(self):
        self.reads = self.writes = 0
        self.by_array = {}

    def _tally(self, name, kind, n):
        self.by_array[name, kind] = self.by_array.get((name, kind), 0) + n

    def load(self, name, array):
        self.reads += array.size
        self._tally(name, "read", array.size)
        return np.array(array)           # a copy: the fast-memory working copy

    def store(self, name, dst, index, value):
        value = np.asarray(value)
        self.writes += value.size
        self._tally(name, "write", value.size)
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
    z = (q @ k.T) / np.sqrt(q.shape[1])
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def standard_attention_io(q, k, v):  # (N, d) x 3 -> (N, d), IOCount
    """Dao et al. 2022, Algorithm 0, with slow-memory traffic counted.

    1. load Q, K; Z = Q K^T / sqrt(d); write Z.   2. read Z; P = softmax(Z); write P.
    3. load P, V; O = P V; write O.   Each step streams its operands once (the theorem's model: the
    products' own blocking is assumed perfect), so reads + writes = 4 N d + 4 N^2. No mask and no
    dropout: each would be one more pass over an (N, N) array, 2 N^2 accesses.
    """
    _check_qkv(q, k, v)
    N, d = q.shape
    mem = _Slow()
    Z_hbm, P_hbm, O_hbm = np.empty((N, N)), np.empty((N, N)), np.empty((N, d))
    mem.store("Z", Z_hbm, ..., (mem.load("Q", q) @ mem.load("K", k).T) / np.sqrt(d))
    z = mem.load("Z", Z_hbm)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    mem.store("P", P_hbm, ..., p / p.sum(axis=1, keepdims=True))
    mem.store("O", O_hbm, ..., mem.load("P", P_hbm) @ mem.load("V", v))
    return O_hbm, IOCount(mem.reads, mem.writes, 2 * N * N, mem.by_array)


def flash_block_sizes(C, d):
    """FlashAttention's block sizes for a fast memory of C elements (the paper's M) and head dim d:
    B_c = ceil(C / 4d) key rows, B_r = min(B_c, d) query rows (Dao et al. 2022, Algorithm 1)."""
    C, d = _check_size("C", C), _check_size("d", d)
    if C < d:
        raise ValueError(f"C: expected at least d = {d} elements of fast memory; got {C}")
    b_c = -(-C // (4 * d))
    return b_c, min(b_c, d)


#: the two loop orders of tiled attention (see tiled_attention_io)
ORDERS = ("fa1", "fa2")


def tiled_attention_io(q, k, v, C, order="fa1"):  # (N, d) x 3, int -> (N, d), IOCount
    """Tiled attention with slow-memory traffic counted; C: fast-memory size in elements.

    order="fa1": Dao et al. 2022, Algorithm 1 (FlashAttention). The *outer* loop runs over key
    blocks, so the output cannot stay in fast memory: O, l, m start in slow memory (O = 0, l = 0,
    m = -inf: N d + 2 N writes) and, for each key block j (B_c rows of K and V, loaded once) and
    each query block i (B_r rows), are read, updated and written back, normalised every time:
    Z = Q_i K_j^T / sqrt(d); m~ = rowmax(Z); P~ = exp(Z - m~); l~ = rowsum(P~);
    m' = max(m_i, m~); l' = e^(m_i - m') l_i + e^(m~ - m') l~;
    O_i = (l_i e^(m_i - m') O_i + e^(m~ - m') P~ V_j) / l'.

    order="fa2": the loop order of FlashAttention-2 (Dao 2023, arXiv 2307.08691, Algorithm 1) and of
    derivation_ops' online softmax. The *outer* loop runs over query blocks: Q_i is loaded once, an
    unnormalised accumulator A = sum_j e^(Z - m) V_j and its l, m stay in fast memory while every
    key block streams past, and O_i = A / l is written once, with the log-sum-exp m + log l that
    the backward needs (N values). The block sizes swap roles, since now the query block stays:
    B_r = ceil(C / 4d) query rows, B_c = min(B_r, d) key rows.
    """
    _check_qkv(q, k, v)
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}; got {order!r}")
    N, d = q.shape
    tau = 1 / np.sqrt(d)
    mem = _Slow()
    O_hbm = np.empty((N, d))
    peak = 0
    if order == "fa1":
        b_c, b_r = flash_block_sizes(C, d)
        l_hbm, m_hbm = np.empty(N), np.empty(N)
        mem.store("O", O_hbm, ..., np.zeros((N, d)))
        mem.store("l", l_hbm, ..., np.zeros(N))
        mem.store("m", m_hbm, ..., np.full(N, -np.inf))
        for j0, j1 in tiles(N, b_c):
            kj, vj = mem.load("K", k[j0:j1]), mem.load("V", v[j0:j1])
            for i0, i1 in tiles(N, b_r):
                rows = slice(i0, i1)
                qi, oi = mem.load("Q", q[rows]), mem.load("O", O_hbm[rows])
                li, mi = mem.load("l", l_hbm[rows]), mem.load("m", m_hbm[rows])
                z = tau * (qi @ kj.T)                                  # (B_r, B_c), in fast memory
                m_t = z.max(axis=1)
                p_t = np.exp(z - m_t[:, None])
                l_t = p_t.sum(axis=1)
                m_new = np.maximum(mi, m_t)
                l_new = np.exp(mi - m_new) * li + np.exp(m_t - m_new) * l_t
                o_new = ((li * np.exp(mi - m_new))[:, None] * oi
                         + np.exp(m_t - m_new)[:, None] * (p_t @ vj)) / l_new[:, None]
                peak = max(peak, kj.size + vj.size + qi.size + oi.size + z.size + 4 * len(li))
                mem.store("O", O_hbm, rows, o_new)                    # normalised, every key block
                mem.store("l", l_hbm, rows, l_new)
                mem.store("m", m_hbm, rows, m_new)
        return O_hbm, IOCount(mem.reads, mem.writes, peak, mem.by_array)
    b_r, b_c = flash_block_sizes(C, d)                                # the roles swap
    L_hbm = np.empty(N)
    for i0, i1 in tiles(N, b_r):
        qi = mem.load("Q", q[i0:i1])                                  # once
        acc = np.zeros((len(qi), d))                                  # unnormalised, in fast memory
        li, mi = np.zeros((len(qi), 1)), np.full((len(qi), 1), -np.inf)
        for j0, j1 in tiles(N, b_c):
            kj, vj = mem.load("K", k[j0:j1]), mem.load("V", v[j0:j1])
            z = tau * (qi @ kj.T)                                      # (B_r, B_c)
            mi, li, acc = online_softmax_step(mi, li, acc, z, vj)     # the rescale of what came before
            peak = max(peak, qi.size + acc.size + kj.size + vj.size + z.size + 2 * len(li))
        mem.store("O", O_hbm, slice(i0, i1), acc / li)               # normalised once
        mem.store("L", L_hbm, slice(i0, i1), (mi + np.log(li))[:, 0])  # log-sum-exp, for a backward
    return O_hbm, IOCount(mem.reads, mem.writes, peak, mem.by_array)


def attention_access_terms(N, d, C=None, kind="fa1"):
    """The closed-form slow-memory accesses (elements) of one head, term by term:
    {(array, "read" | "write"): count}, as the instrumented functions tally them.

    standard (Algorithm 0): Q, K read once (N d each); Z written, read (N^2 each); P written, read
    (N^2 each); V read, O written (N d each): 4 N d + 4 N^2 in all.
    fa1 (Algorithm 1), T_c = ceil(N / B_c) key blocks: K, V read once (N d each); per key block, all
    of Q, O, l, m read and O, l, m written: Q read T_c N d; O read T_c N d, written (1 + T_c) N d
    (the first write is the initialisation); l and m read T_c N, written (1 + T_c) N each.
    fa2, T_r = ceil(N / B_r) query blocks: Q read once (N d); per query block, all of K and V
    read: T_r N d each; O written once (N d); the log-sum-exp L written once (N).
    """
    N, d = _check_size("N", N), _check_size("d", d)
    if kind == "standard":
        return {("Q", "read"): N * d, ("K", "read"): N * d, ("Z", "write"): N * N,
                ("Z", "read"): N * N, ("P", "write"): N * N, ("P", "read"): N * N,
                ("V", "read"): N * d, ("O", "write"): N * d}
    if kind not in ORDERS:
        raise ValueError(f"kind: expected 'standard', 'fa1' or 'fa2'; got {kind!r}")
    if C is None:
        raise ValueError("C: a tiled count needs the fast-memory size C (elements); got None")
    first, _ = flash_block_sizes(C, d)                # B_c for fa1, B_r for fa2
    T = -(-N // first)
    if kind == "fa1":
        return {("K", "read"): N * d, ("V", "read"): N * d, ("Q", "read"): T * N * d,
                ("O", "read"): T * N * d, ("O", "write"): (1 + T) * N * d,
                ("l", "read"): T * N, ("l", "write"): (1 + T) * N,
                ("m", "read"): T * N, ("m", "write"): (1 + T) * N}
    return {("Q", "read"): N * d, ("K", "read"): T * N * d, ("V", "read"): T * N * d,
            ("O", "write"): N * d, ("L", "write"): N}


def attention_accesses(N, d, C=None, kind="fa1"):
    """Closed-form slow-memory accesses (elements) of one head: the sum of
    :func:`attention_access_terms`.

    standard: 4 N d + 4 N^2.
    fa1: 3 N d + 2 N + T_c (3 N d + 4 N), T_c = ceil(N / B_c).
    fa2: 2 N d + N + 2 T_r N d, T_r = ceil(N / B_r). kind="tiled" is "fa1".
    """
    kind = "fa1" if kind == "tiled" else kind
    return sum(attention_access_terms(N, d, C, kind).values())


# ---- decoding -------------------------------------------------------------------------------

def kv_cache_bytes(n_layers, batch, seq, d_model, itemsize, n_heads=None, n_kv_heads=None):
    """K and V of every layer for every position: 2 * n_layers * batch * seq * n_kv * d_h * itemsize.

    Multi-head attention (``n_kv_heads`` None): n_kv d_h = d_model, so 2 L B S D itemsize.
    Grouped-query attention (Ainslie et al. 2023, arXiv 2305.13245): ``n_kv_heads`` key/value heads
    of d_h = d_model / n_heads each, shared by groups of n_heads / n_kv_heads query heads;
    multi-query attention (Shazeer 2019, arXiv 1911.02150) is n_kv_heads = 1.
    """
    for name, value in (("n_layers", n_layers), ("batch", batch), ("seq", seq),
                        ("d_model", d_model), ("itemsize", itemsize)):
        _check_size(name, value)
    width = _kv_width(d_model, n_heads, n_kv_heads)
    return 2 * n_layers * batch * seq * width * itemsize


def _kv_width(d_model, n_heads, n_kv_heads):  # -> n_kv * d_h, the width of one position's K (or V)
    if n_kv_heads is None:
        return d_model
    if n_heads is None:
        raise ValueError("n_heads: grouped-query attention needs n_heads (d_h = d_model / n_heads) "
                         f"with n_kv_heads = {n_kv_heads}; got None")
    n_heads, n_kv_heads = _check_size("n_heads", n_heads), _check_size("n_kv_heads", n_kv_heads)
    if d_model % n_heads or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected n_heads = {n_heads} to divide d_model = {d_model} and "
                         f"n_kv_heads to divide n_heads; got n_kv_heads = {n_kv_heads}")
    return n_kv_heads * (d_model // n_heads)


def weight_bytes_per_value(bits=16, group_size=None, scale_bytes=2):
    """Bytes per stored weight: bits / 8, plus (scale_bytes + bits / 8) / group_size when every
    group of ``group_size`` weights of a row shares a scale (scale_bytes) and a zero point (bits).
    Per-channel scales (group_size None) cost one scale per row: left out (D times fewer)."""
    bits = _check_size("bits", bits)
    if bits > 64:
        raise ValueError(f"bits: expected at most 64; got {bits}")
    if group_size is None:
        return bits / 8
    return bits / 8 + (scale_bytes + bits / 8) / _check_size("group_size", group_size)


def block_params(config, n_kv_heads=None):
    """Parameters of one block: 4 D^2 + 2 D F weights, 3D + D + F + D biases, 4 D of LayerNorm.
    With ``n_kv_heads`` (grouped-query attention) the key and value projections are
    (n_kv d_h, D) each: 2 D^2 + 2 D n_kv d_h + 2 D F weights, 2 D + 2 n_kv d_h + F + D biases."""
    return _block_matrices(config, n_kv_heads) + _block_vectors(config, n_kv_heads)


def _block_matrices(config, n_kv_heads=None):
    D, F = config.d_model, config.d_ff
    kv = _kv_width(D, config.n_heads, n_kv_heads)
    return 2 * D * D + 2 * D * kv + 2 * D * F


def _block_vectors(config, n_kv_heads=None):
    D, F = config.d_model, config.d_ff
    kv = _kv_width(D, config.n_heads, n_kv_heads)
    return (D + 2 * kv) + D + F + D + 4 * D


class DecodeCost(NamedTuple):
    """One decoding step of ``batch`` sequences at context length ``context`` (blocks only)."""

    flops: int
    weight_bytes: int     # every block's weights, read once per step
    kv_bytes: int         # the KV caches read (and the new K, V written)
    batch: int

    @property
    def nbytes(self):
        return self.weight_bytes + self.kv_bytes

    intensity = property(lambda self: _intensity(self), doc="FLOPs per byte of traffic.")


def decode_cost(config, n_layers, batch, context, itemsize=2, n_kv_heads=None, weight_bits=None,
                group_size=None):
    """FLOPs and main-memory bytes of one decoding step (one new token per sequence).

    Per layer and sequence: the matmuls with the weights, 2 (4 D^2 + 2 D F) FLOPs (with
    ``n_kv_heads``, 2 (2 D^2 + 2 D n_kv d_h + 2 D F)), and attention over ``context`` cached
    positions, 4 context D FLOPs (q k^T and p v: every query head still attends). Bytes: the weights
    once per step (all sequences share them) -- the matrices at ``weight_bits`` bits (None: the
    activations' 8 itemsize; groups as :func:`weight_bytes_per_value`), biases and LayerNorm at
    ``itemsize`` -- and each sequence's K and V at ``context`` positions
    (:func:`kv_cache_bytes`). Activations (a few D per sequence) are left out.
    """
    if not isinstance(config, BlockConfig):
        raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
    n_layers, batch = _check_size("n_layers", n_layers), _check_size("batch", batch)
    context, itemsize = _check_size("context", context), _check_size("itemsize", itemsize)
    D = config.d_model
    per_weight = weight_bytes_per_value(8 * itemsize if weight_bits is None else weight_bits,
                                        group_size)
    matrices = _block_matrices(config, n_kv_heads)
    flops = n_layers * batch * (2 * matrices + 4 * context * D)
    weights = n_layers * (matrices * per_weight + _block_vectors(config, n_kv_heads) * itemsize)
    kv = kv_cache_bytes(n_layers, batch, context, D, itemsize, config.n_heads, n_kv_heads)
    return DecodeCost(int(flops), int(round(weights)), int(kv), batch)


# ---- published model shapes, per-op steps, prefill and decode -----------------------------------

class ModelShape(NamedTuple):
    """A decoder-only language model's shape, as its paper or released configuration gives it.

    Biases and normalisation parameters are left out of every count below (a few D per layer), and
    so are learned position embeddings (OPT's: 2048 x D, 0.1 % of OPT-13B)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int       # = n_heads: multi-head; 1: multi-query; in between: grouped-query attention
    d_ff: int
    vocab_size: int
    gated: bool           # True: a gated MLP (SwiGLU: gate, up, down, three D x F matrices)
    max_context: int      # positions the model was trained for
    source: str = ""      # a citation key of book/references.bib
    tied_embeddings: bool = False   # True: the LM head is the token embedding (OPT), one V x D matrix

    d_head = property(lambda self: self.d_model // self.n_heads, doc="The width of one head.")
    group = property(lambda self: self.n_heads // self.n_kv_heads,
                     doc="Query heads per key/value head: 1 for multi-head attention.")

    def layer_matrix_params(self):
        """Weights of one layer's matrices: q and out (D x D), k and v (n_kv d_h x D), the MLP."""
        D = self.d_model
        return 2 * D * D + 2 * D * self.n_kv_heads * self.d_head + (3 if self.gated else 2) * D * self.d_ff

    def weight_params(self):
        """Every matrix weight: n_layers blocks, the token embedding and the LM head (V x D each, or
        one matrix for both when they are tied)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.d_model
        return self.n_layers * self.layer_matrix_params() + embeddings

    def kv_bytes_per_token(self, itemsize=2):
        """2 n_layers n_kv d_h itemsize: one position's keys and values in every layer."""
        return kv_cache_bytes(self.n_layers, 1, 1, self.d_model, itemsize, self.n_heads,
                              self.n_kv_heads)


#: Published configurations. OPT-13B: Zhang et al. 2022, Table 1 (ReLU MLP of 4D; the vocabulary,
#: context and tied embedding and head from the released configuration). Llama 2 7B: Touvron et al. 2023 (multi-head
#: attention; F = 11,008, vocabulary 32,000 from the released configuration). Llama 3 8B:
#: Grattafiori et al. 2024, Table 3 (8 key/value heads, F = 14,336, vocabulary 128,256).
PUBLISHED_MODELS = {
    "OPT-13B": ModelShape("OPT-13B", 40, 5120, 40, 40, 20480, 50272, False, 2048, "zhang2022opt",
                          tied_embeddings=True),
    "Llama 2 7B": ModelShape("Llama 2 7B", 32, 4096, 32, 32, 11008, 32000, True, 4096,
                             "touvron2023llama2"),
    "Llama 3 8B": ModelShape("Llama 3 8B", 32, 4096, 32, 8, 14336, 128256, True, 8192,
                             "grattafiori2024llama3"),
}


def model_shape(lm, name="reference LM"):
    """The :class:`ModelShape` of a :class:`preln.models.lm.TinyLM` (or its :class:`preln.models.lm.LMConfig`):
    multi-head attention, an ungated MLP."""
    from preln.models.lm import LMConfig, TinyLM
    cfg = lm.config if isinstance(lm, TinyLM) else lm
    if not isinstance(cfg, LMConfig):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM or LMConfig; got {type(lm).__name__}")
    return ModelShape(name, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_heads, cfg.d_ff,
                      cfg.vocab_size, False, cfg.max_len, "")


def _check_model(model):
    if not isinstance(model, ModelShape):
        raise TypeError(f"model: expected a preln.chapters.inference.ModelShape (see PUBLISHED_MODELS, "
                        f"model_shape); got {type(model).__name__}")


def step_ops(model, batch, new=1, context=0, itemsize=2, weight_bits=None, group_size=None):
    """Per-op FLOPs and bytes of ONE layer's forward over ``new`` positions of each of ``batch``
    sequences, which attend causally to ``context`` cached positions and to themselves.

    A prefill is ``new`` = the prompt's length, ``context`` = 0; a decode step is ``new`` = 1,
    ``context`` = the positions generated so far. Every op is one kernel that reads its inputs and
    writes its outputs once (the fused schedule of a GPU, not numpy's pass per operation):

    norm1, norm2     read and write N D (N = batch * new rows); 7 FLOPs per element, 5 per row
    qkv_proj         x (N, D) @ W^T, W ((D + 2 n_kv d_h), D): its output holds q and the new K, V
    attention        one fused kernel (FlashAttention or Flash-Decoding): reads q and the cached K
                     and V of every position (context + new, per sequence and KV head) once, writes
                     o; 4 d_h + 5 FLOPs per (query head, key) pair, causal pairs only
    out_proj         o (N, D) @ W^T, W (D, D)
    residual1, 2     read 2 N D, write N D
    linear1, linear2 (ungated) D -> F, F -> D with the activation between (read and write N F)
    gate_up, down    (gated) D -> 2F (gate and up in one product), F -> D; swiglu between them
                     reads 2 N F and writes N F

    Weights are read at ``weight_bits`` bits (None: 8 itemsize), activations and the KV cache at
    ``itemsize`` bytes. Returns a list of :class:`OpTraffic` (``matmul`` marks the contractions).
    """
    _check_model(model)
    batch, new = _check_size("batch", batch), _check_size("new", new)
    context = nonnegative_int(context, "context")
    itemsize = _check_size("itemsize", itemsize)
    s = itemsize
    w = weight_bytes_per_value(8 * s if weight_bits is None else weight_bits, group_size)
    D, H, kv, dh, F = model.d_model, model.n_heads, model.n_kv_heads, model.d_head, model.d_ff
    N, T = batch * new, context + new
    pairs = batch * (new * context + new * (new + 1) // 2)        # causal (query, key) pairs per head
    ops = []

    def add(name, flops, read, written, matmul=False):        # bytes
        ops.append(OpTraffic(name, int(flops), int(round(read)), int(round(written)), matmul))

    def matmul(name, k_in, n_out):
        add(name, 2 * N * k_in * n_out, k_in * n_out * w + N * k_in * s, N * n_out * s, True)

    def norm(name):
        add(name, 7 * N * D + 5 * N, N * D * s, N * D * s)

    norm("norm1")
    matmul("qkv_proj", D, D + 2 * kv * dh)
    add("attention", H * pairs * (4 * dh + 5), N * D * s + 2 * batch * kv * T * dh * s, N * D * s,
        True)
    matmul("out_proj", D, D)
    add("residual1", N * D, 2 * N * D * s, N * D * s)
    norm("norm2")
    if model.gated:
        matmul("gate_up", D, 2 * F)
        add("swiglu", 5 * N * F, 2 * N * F * s, N * F * s)
        matmul("down", F, D)
    else:
        matmul("linear1", D, F)
        add("activation", 5 * N * F, N * F * s, N * F * s)
        matmul("linear2", F, D)
    add("residual2", N * D, 2 * N * D * s, N * D * s)
    return ops


def head_ops(model, batch, itemsize=2, weight_bits=None, group_size=None):
    """The final LayerNorm and the LM head (D -> vocabulary) on one position per sequence: the
    only logits that generation needs, after a prefill as after a decode step."""
    _check_model(model)
    batch, s = _check_size("batch", batch), _check_size("itemsize", itemsize)
    w = weight_bytes_per_value(8 * s if weight_bits is None else weight_bits, group_size)
    D, V = model.d_model, model.vocab_size
    return [OpTraffic("final norm", 7 * batch * D + 5 * batch, batch * D * s, batch * D * s, False),
            OpTraffic("lm_head", 2 * batch * D * V, int(round(D * V * w + batch * D * s)),
                      batch * V * s, True)]


def step_time(model, roof, batch, new=1, context=0, itemsize=2, weight_bits=None, group_size=None):
    """The roofline's lower bound on one forward step of the whole model (seconds): the sum over
    ops of max(FLOPs / peak, bytes / bandwidth) -- every layer's ops, then the head. Time is a sum
    over ops: an op left of the ridge costs its bytes even when the step's total intensity is high."""
    if not isinstance(roof, Roofline):
        raise TypeError(f"roof: expected a preln.chapters.inference.Roofline; got {type(roof).__name__}")
    layer = sum(float(roof.time(o.flops, o.nbytes))
                for o in step_ops(model, batch, new, context, itemsize, weight_bits, group_size))
    head = sum(float(roof.time(o.flops, o.nbytes))
               for o in head_ops(model, batch, itemsize, weight_bits, group_size))
    return model.n_layers * layer + head


class GenerationTimes(NamedTuple):
    """Time to first token (the prefill and its logits) and time per output token (decode steps)."""

    ttft: float           # seconds
    tpot: float           # seconds, mean over the decode steps


def predict_generation(model, roof, batch, prompt, n_new, itemsize=2, weight_bits=None,
                       group_size=None):
    """The roofline's prediction of TTFT and TPOT for ``batch`` prompts of ``prompt`` tokens each
    and ``n_new`` generated tokens: the first token comes from the prefill, token t > 1 from a
    decode step whose context holds prompt + t - 2 positions."""
    prompt, n_new = _check_size("prompt", prompt), _check_size("n_new", n_new)
    ttft = step_time(model, roof, batch, prompt, 0, itemsize, weight_bits, group_size)
    steps = [step_time(model, roof, batch, 1, prompt + t, itemsize, weight_bits, group_size)
             for t in range(n_new - 1)]
    return GenerationTimes(ttft, float(np.mean(steps)) if steps else math.nan)


def compute_bound_batch(model, roof, op, context, itemsize=2, weight_bits=None, group_size=None,
                        max_batch=2**20):
    """The smallest batch at which decode op ``op`` (a name of :func:`step_ops`) reaches the ridge
    point of ``roof``, or None if it stays memory-bound up to ``max_batch``. A weight matmul's
    intensity grows with the batch (2 B k n / (k n w + B (k + n) s)); attention's and the
    elementwise ops' do not depend on it."""
    def intensity(b):
        ops = {o.name: o for o in step_ops(model, b, 1, context, itemsize, weight_bits, group_size)}
        if op not in ops:
            raise ValueError(f"op: expected one of {list(ops)}; got {op!r}")
        return ops[op].intensity

    if intensity(max_batch) < roof.ridge:
        return None
    lo, hi = 1, max_batch                      # intensity(hi) >= ridge; it grows with the batch
    if intensity(lo) >= roof.ridge:
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if intensity(mid) >= roof.ridge else (mid, hi)
    return hi


class GenerationTiming(NamedTuple):
    """Measured generation: time to first token and the time of each decode step (CPU seconds)."""

    ttft: float                 # best over repeats: prefill + first token
    tpot: np.ndarray            # (n_new - 1,) best over repeats, one per decode step

    @property
    def mean_tpot(self):
        return float(np.mean(self.tpot))


def time_generation(lm, prompt_ids, n_new, repeats=5, clock=time.process_time):
    """Measure greedy generation with a :class:`preln.models.lm.TinyLM` and its KV cache.

    prompt_ids: (B, S0) ints. Each repeat makes a fresh cache, times the prefill with the first
    token (TTFT) and then each of the n_new - 1 decode steps (TPOT); prefill and decode steps
    alternate in every repeat, so a slow spell of a shared machine slows both. The best time of
    each is kept. CPU time by default: time the process spends descheduled does not count.
    """
    from preln.models.lm import TinyLM
    if not isinstance(lm, TinyLM):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM; got {type(lm).__name__}")
    ids = np.asarray(prompt_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt_ids: expected a (B, S0) integer array; got shape {ids.shape}")
    n_new = _check_size("n_new", n_new)
    B, S0 = ids.shape
    best_ttft, best_tpot = math.inf, np.full(n_new - 1, math.inf)
    lm.eval()
    for r in range(_check_size("repeats", repeats) + 1):       # round 0 warms up
        kv = lm.kv_cache(B, S0 + n_new)
        t0 = clock()
        tok = lm.decode(ids, kv)[:, -1].argmax(axis=-1)[:, None]          # (B, 1)
        ttft = clock() - t0
        tpot = np.empty(n_new - 1)
        for t in range(n_new - 1):
            t0 = clock()
            tok = lm.decode(tok, kv)[:, -1].argmax(axis=-1)[:, None]
            tpot[t] = clock() - t0
        if r > 0:
            best_ttft = min(best_ttft, ttft)
            best_tpot = np.minimum(best_tpot, tpot)
    return GenerationTiming(best_ttft, best_tpot)


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
