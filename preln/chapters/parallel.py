"""What the chapter "The block on many devices" (book/many_devices.ipynb) computes: memory per
device under data parallel and ZeRO, the bytes and time of the collectives, the pipeline bubble,
simulated data-parallel and ZeRO steps of the book's block, the measured memory of a training
step, and the 2-rank check of :mod:`preln.parallel`.

    from preln.chapters import parallel as par

    par.zero_memory(par.param_count(par.MODELS["Llama 2 7B"]), world=64, stage=3)   # bytes per device
    par.tp_traffic(d_model=4096, batch=1, seq=4096, world=8)   # bytes a rank sends per layer, TP
    par.collective_time(nbytes, par.LINKS["NVLink 4"], steps)  # bytes / bandwidth + steps x latency
    par.bubble_fraction(p=4, m=8)                              # (p - 1) / (m + p - 1)
    par.one_f_one_b_schedule(p=4, m=8).peak_in_flight          # [4 3 2 1]; GPipe: [8 8 8 8]

Memory per device (Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054, section 3.1): mixed-precision
Adam keeps, per parameter, 2 bytes of 16-bit weights, 2 of 16-bit gradients and K = 12 of fp32
optimizer state (a master copy of the weights, the first and second moments): 16 bytes. ZeRO
stage 1 shards the optimizer state over the P data-parallel ranks, stage 2 the gradients too,
stage 3 the weights too. The book's numpy training keeps everything in one dtype (the
``"float32"`` layout: 4 + 4 + 8 bytes, Adam's two moments and no master copy). Activations are
not sharded by ZeRO: every rank keeps its own micro-batch's.

Bytes on the wire are the ring formula of :func:`preln.parallel.comm.ring_bytes` (what
:func:`preln.parallel.predicted_traffic` adds up for the sharded block; the tests check the two
agree). Times are ``bytes / bandwidth + steps * latency`` with the links' per-direction bandwidth
from their datasheets (:data:`LINKS`); the latency per ring step is an assumption, stated as one.
"""
from __future__ import annotations

import copy
import re
import subprocess
import sys
from typing import NamedTuple

import numpy as np

from preln.blas import blas_threads
from preln.chapters.inference import PUBLISHED, PUBLISHED_MODELS, ModelShape
from preln.measure import peak_bytes
from preln.models.optim import Adam
from preln.parallel.comm import ring_bytes, run_simulated
from preln.validation import positive_int

__all__ = ["MODELS", "param_count", "BYTES_PER_PARAM", "ZERO_STAGES", "DeviceMemory", "zero_memory",
           "zero_traffic", "checkpointed_activation_bytes", "Link", "LINKS", "LINK_LATENCY",
           "collective_time", "tp_traffic", "sp_traffic", "tp_layer_times", "tp_break_even",
           "largest_paying_tp", "bubble_fraction", "gpipe_schedule", "PipelineSchedule",
           "gpipe_train_schedule", "one_f_one_b_schedule", "data_parallel_grads",
           "zero_adam_step", "peak_train_step_bytes", "ParallelRun", "run_parallel_check",
           "parse_parallel_report", "flat_grads"]

#: Published models, as their papers or released configurations give them (ModelShape of
#: :mod:`preln.chapters.inference`). GPT-2 (Radford et al. 2019, Table 2): small 12 layers of width
#: 768, XL 48 of 1600; 12 and 25 heads, MLP 4D, vocabulary 50,257, 1024 learned positions, the LM
#: head tied to the embedding (released configuration). Llama 2 70B (Touvron et al. 2023b): 80
#: layers, width 8192, 64 heads, 8 key/value heads, F = 28,672 (released configuration).
MODELS = {
    "GPT-2 small": ModelShape("GPT-2 small", 12, 768, 12, 12, 3072, 50257, False, 1024,
                              "radford2019language", tied_embeddings=True),
    "GPT-2 XL": ModelShape("GPT-2 XL", 48, 1600, 25, 25, 6400, 50257, False, 1024,
                           "radford2019language", tied_embeddings=True),
    "Llama 2 7B": PUBLISHED_MODELS["Llama 2 7B"],
    "Llama 2 70B": ModelShape("Llama 2 70B", 80, 8192, 64, 8, 28672, 32000, True, 4096,
                              "touvron2023llama2"),
    "Llama 3 8B": PUBLISHED_MODELS["Llama 3 8B"],
}


def param_count(model):
    """Every parameter of ``model`` (a ModelShape): its matrices (``weight_params``) plus what that
    count leaves out -- for a GPT-2-style model (ungated MLP) the biases and LayerNorms (9 D + F per
    layer), the final LayerNorm (2 D) and the learned positions (max_context x D); for a Llama-style
    one (gated) the two RMSNorms per layer and the final one."""
    if not isinstance(model, ModelShape):
        raise TypeError(f"model: expected a preln.chapters.inference.ModelShape (see MODELS); got "
                        f"{type(model).__name__}")
    D, L = model.d_model, model.n_layers
    if model.gated:
        extra = 2 * D * L + D
    else:
        extra = (9 * D + model.d_ff) * L + 2 * D + model.max_context * D
    return model.weight_params() + extra


#: bytes per parameter: (weights, gradients, optimizer state). "mixed": 16-bit weights and
#: gradients, fp32 master weights and Adam moments (ZeRO's K = 12); "float32": the book's numpy
#: training (one dtype, Adam's m and v)
BYTES_PER_PARAM = {"mixed": (2, 2, 12), "float32": (4, 4, 8)}
#: 0: plain data parallel; 1: optimizer state sharded; 2: + gradients; 3: + weights
ZERO_STAGES = (0, 1, 2, 3)


class DeviceMemory(NamedTuple):
    """Bytes one device holds."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0

    @property
    def total(self):
        return self.params + self.grads + self.optimizer + self.activations


def _stage(stage):
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage: expected one of {ZERO_STAGES}; got {stage!r}")
    return stage


def zero_memory(n_params, world, stage, precision="mixed", activations=0.0):
    """Memory per device of data parallel over ``world`` ranks at ZeRO ``stage``: the sharded
    parts divided by ``world``; ``activations`` (bytes, per device) added as they are."""
    n_params, world, stage = positive_int(n_params, "n_params"), positive_int(world, "world"), _stage(stage)
    if precision not in BYTES_PER_PARAM:
        raise ValueError(f"precision: expected one of {sorted(BYTES_PER_PARAM)}; got {precision!r}")
    w, g, o = (n_params * b for b in BYTES_PER_PARAM[precision])
    return DeviceMemory(w / world if stage >= 3 else w, g / world if stage >= 2 else g,
                        o / world if stage >= 1 else o, float(activations))


def zero_traffic(n_params, world, stage, itemsize=2):
    """Bytes one rank sends per step, ring collectives over ``world`` ranks (ZeRO section 7):
    stages 0-2 reduce-scatter and all-gather the gradients or the updated weights once, the bytes of
    one all-reduce (2 (P - 1)/P of the 16-bit model); stage 3 all-gathers the weights in the forward
    and again in the backward and reduce-scatters the gradients: 1.5 times that."""
    n = positive_int(n_params, "n_params") * itemsize
    world, stage = positive_int(world, "world"), _stage(stage)
    if stage < 3:
        return ring_bytes("all_reduce", n, world)
    return 2 * ring_bytes("all_gather", n, world) + ring_bytes("reduce_scatter", n, world)


def checkpointed_activation_bytes(model, tokens, itemsize=2):
    """Activations a rank keeps with activation checkpointing (``TransformerStack(checkpoint=True)``):
    every block's input, n_layers x tokens x D x itemsize; one block's recomputed activations come
    on top during its backward."""
    return model.n_layers * positive_int(tokens, "tokens") * model.d_model * itemsize


# ---- the communication roofline ------------------------------------------------------------------

class Link(NamedTuple):
    """A link as the ring sees it: bytes per second in one direction, per device."""

    name: str
    bandwidth: float
    source: str


#: Per-direction bandwidth per device, from the datasheets. NVLink 4 on an H100 SXM: 900 GB/s
#: total, 450 GB/s each way; PCIe 5.0 x16: 128 GB/s total, 64 GB/s each way (both in NVIDIA's
#: H100 specifications, nvidia2022h100); InfiniBand NDR: 400 Gb/s per port, 50 GB/s
#: (NVIDIA ConnectX-7 datasheet, nvidia2022connectx7).
LINKS = {
    "NVLink 4": Link("NVLink 4", 450e9, "nvidia2022h100"),
    "PCIe 5.0 x16": Link("PCIe 5.0 x16", 64e9, "nvidia2022h100"),
    "InfiniBand NDR": Link("InfiniBand NDR", 50e9, "nvidia2022connectx7"),
}
#: seconds per ring step (one send and receive of a chunk): an assumption of the order a small
#: NCCL message takes, not a datasheet value; the chapter shows what changes with it
LINK_LATENCY = 5e-6
#: the accelerator the compute side of the roofline is (dense BF16, its datasheet)
GPU = PUBLISHED["H100 SXM"]


def collective_time(nbytes, link, steps, latency=LINK_LATENCY):
    """Seconds of a collective that sends ``nbytes`` per rank in ``steps`` ring steps."""
    if not isinstance(link, Link):
        raise TypeError(f"link: expected a Link (see LINKS); got {type(link).__name__}")
    return nbytes / link.bandwidth + steps * latency


def tp_traffic(d_model, batch, seq, world, itemsize=2):
    """Bytes a rank sends per layer, forward + backward, in Megatron tensor parallel: 4 all-reduces
    of one (B, S, D) activation -- :func:`preln.parallel.predicted_traffic`'s count, for any size."""
    n = positive_int(batch, "batch") * positive_int(seq, "seq") * positive_int(d_model, "d_model") * itemsize
    return {"all_reduce": (4, 4 * ring_bytes("all_reduce", n, positive_int(world, "world")))}


def sp_traffic(d_model, batch, seq, world, replicated, itemsize=2):
    """As :func:`tp_traffic` with sequence parallel: 4 reduce-scatters and 4 all-gathers of one
    (B, S, D) activation, and one all-reduce of the ``replicated`` parameters' gradients (padded to
    P equal chunks) -- :func:`preln.parallel.predicted_traffic`'s count."""
    world = positive_int(world, "world")
    n = positive_int(batch, "batch") * positive_int(seq, "seq") * positive_int(d_model, "d_model") * itemsize
    n_rep = -(-int(replicated) // world) * world * itemsize
    return {"all_reduce": (1, ring_bytes("all_reduce", n_rep, world)),
            "reduce_scatter": (4, 4 * ring_bytes("reduce_scatter", n, world)),
            "all_gather": (4, 4 * ring_bytes("all_gather", n, world))}


def tp_layer_times(model, tokens, world, link, gpu=GPU, latency=LINK_LATENCY, itemsize=2):
    """(compute, communication) seconds of one layer's training step (forward + backward) on each of
    ``world`` tensor-parallel ranks: the matmuls' 6 x (matrix weights) FLOPs per token split P ways
    at the GPU's peak; the 4 all-reduces of :func:`tp_traffic` over ``link``, 2 (P - 1) ring steps
    each. Attention's S^2 products are left out (they split by heads too, and only add compute)."""
    world = positive_int(world, "world")
    compute = 6 * model.layer_matrix_params() * tokens / (world * gpu.peak_flops)
    if world == 1:
        return compute, 0.0
    calls, sent = tp_traffic(model.d_model, 1, tokens, world, itemsize)["all_reduce"]
    return compute, collective_time(sent, link, calls * 2 * (world - 1), latency)


def tp_break_even(model, link, gpu=GPU, itemsize=2):
    """The P at which communication equals compute, latency left out: 6 Psi / (P R_peak) = 8 (P-1)/P
    D s / BW gives P - 1 = 3 Psi BW / (4 D s R_peak) for Psi matrix weights per layer, width D, s bytes
    per value and R_peak the GPU's peak FLOP/s (the chapter's letters)."""
    return 1 + 3 * model.layer_matrix_params() * link.bandwidth / (4 * model.d_model * itemsize * gpu.peak_flops)


def largest_paying_tp(model, tokens, link, degrees=(1, 2, 4, 8, 16, 32, 64), **kw):
    """The largest of ``degrees`` whose communication time is at most its compute time (so that
    overlapping the two could hide it); 1 if none of the others is."""
    ok = [p for p in degrees if p == 1 or (lambda c, m: m <= c)(*tp_layer_times(model, tokens, p, link, **kw))]
    return max(ok)


# ---- pipeline parallel -------------------------------------------------------------------------

def bubble_fraction(p, m):
    """Idle share of a GPipe schedule of p stages and m micro-batches: (p - 1)/(m + p - 1)."""
    p, m = positive_int(p, "p"), positive_int(m, "m")
    return (p - 1) / (m + p - 1)


def gpipe_schedule(p, m):
    """(p, m + p - 1) int array of the forward pass of a GPipe schedule: the micro-batch stage s
    works on at time step t (micro-batch i reaches stage s at step i + s), -1 where it idles."""
    p, m = positive_int(p, "p"), positive_int(m, "m")
    return gpipe_train_schedule(p, m).forward[:, :m + p - 1]


class PipelineSchedule(NamedTuple):
    """A whole training step of a pipeline, forward and backward one time step each: at step t,
    stage s runs the forward of micro-batch ``forward[s, t]`` or the backward of
    ``backward[s, t]`` (-1: it does not), two (p, T) int arrays laid out as gpipe_schedule's."""
    forward: np.ndarray
    backward: np.ndarray

    @property
    def makespan(self) -> int:
        return self.forward.shape[1]

    @property
    def bubble(self) -> float:
        """The idle share of the stage-steps."""
        return float(((self.forward < 0) & (self.backward < 0)).mean())

    @property
    def in_flight(self) -> np.ndarray:
        """(p, T): micro-batches whose activations stage s holds after step t (forward done,
        backward not yet)."""
        return np.cumsum(self.forward >= 0, axis=1) - np.cumsum(self.backward >= 0, axis=1)

    @property
    def peak_in_flight(self) -> np.ndarray:
        """(p,): the most micro-batches' activations each stage holds at once."""
        return self.in_flight.max(axis=1)


def _run_pipeline(orders, p):
    """Each stage runs its ``orders[s]`` (("F" or "B", micro-batch) in turn), each op as soon as
    the stage is free and its input has arrived: forward i from stage s - 1, backward i from
    stage s + 1 (the last stage's from its own forward, earlier in its order)."""
    end = {}                                           # (kind, stage, micro-batch) -> end step
    free, nxt = [0] * p, [0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, i = orders[s][nxt[s]]
                dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else \
                      ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if dep is not None and dep not in end:
                    break                              # its input is not computed yet
                end[kind, s, i] = max(free[s], end.get(dep, 0)) + 1
                free[s], nxt[s], moved = end[kind, s, i], nxt[s] + 1, True
        if not moved:
            raise ValueError("orders: a stage waits for an op that never runs")
    grids = {k: np.full((p, max(end.values())), -1) for k in "FB"}
    for (kind, s, i), t in end.items():
        grids[kind][s, t - 1] = i
    return PipelineSchedule(grids["F"], grids["B"])


def gpipe_train_schedule(p, m):
    """GPipe's training step (Huang et al. 2019): every stage runs the m forwards, then the m
    backwards. Makespan 2 (m + p - 1), bubble (p - 1)/(m + p - 1); a stage holds all m
    micro-batches' activations at the turn."""
    p, m = positive_int(p, "p"), positive_int(m, "m")
    order = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    return _run_pipeline([order] * p, p)


def one_f_one_b_schedule(p, m):
    """The non-interleaved 1F1B schedule (PipeDream-flush, Narayanan et al. 2021, Megatron-LM):
    stage s runs p - 1 - s forwards to warm up, then alternates one forward and one backward, and
    ends with the backwards left. The same makespan and bubble as GPipe, but stage s holds at most
    min(p - s, m) micro-batches' activations instead of m."""
    p, m = positive_int(p, "p"), positive_int(m, "m")
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        steady = [op for j in range(m - warm) for op in (("F", warm + j), ("B", j))]
        orders.append([("F", i) for i in range(warm)] + steady
                      + [("B", i) for i in range(m - warm, m)])
    return _run_pipeline(orders, p)


# ---- simulated data parallel and ZeRO ------------------------------------------------------------

def flat_grads(grads, names):
    """The gradients of ``names`` as one flat float array (what a data-parallel all-reduce sends)."""
    return np.concatenate([grads[k].ravel() for k in names])


def _unflat(flat, like, names):
    out, i = {}, 0
    for k in names:
        out[k] = flat[i:i + like[k].size].reshape(like[k].shape)
        i += like[k].size
    return out


def _local_grads(block, x, dy):
    b = copy.deepcopy(block)
    b.zero_grad()
    b.forward(x)
    b.backward(dy)
    return b


def _check_batch(x, dy, world):
    if x.shape != dy.shape:
        raise ValueError(f"dy: expected x's shape {x.shape}; got {dy.shape}")
    if x.shape[0] % world:
        raise ValueError(f"x: expected a batch divisible by world={world}; got B={x.shape[0]}")


def data_parallel_grads(block, x, dy, world, timeout=60.0):
    """Data parallel on ``world`` simulated ranks: each runs a copy of ``block`` on its B/P
    sequences, then one all-reduce sums the flat gradients. -> (rank 0's summed gradients, each
    rank's traffic table). ``block`` itself is not changed."""
    world = positive_int(world, "world")
    _check_batch(x, dy, world)
    names = list(block.params)

    def rank(comm):
        b = _local_grads(block, np.split(x, world)[comm.rank], np.split(dy, world)[comm.rank])
        total = comm.all_reduce(flat_grads(b.grads, names))
        return _unflat(total, b.grads, names), comm.traffic.table()

    out = run_simulated(world, rank, timeout=timeout)
    return out[0][0], [t for _, t in out]


def zero_adam_step(block, x, dy, world, lr=1e-3, timeout=60.0):
    """One Adam step under ZeRO stage 2 on ``world`` simulated ranks: reduce-scatter the flat
    gradients (each rank gets the sum of its 1/P slice), update that slice of the weights with
    Adam -- whose moments then exist only for the slice -- and all-gather the updated weights.
    -> (the new parameters, each rank's traffic table, each rank's Adam-state bytes)."""
    world = positive_int(world, "world")
    _check_batch(x, dy, world)
    names = list(block.params)

    def rank(comm):
        b = _local_grads(block, np.split(x, world)[comm.rank], np.split(dy, world)[comm.rank])
        g = flat_grads(b.grads, names)
        pad = -g.size % world
        g_slice = comm.reduce_scatter(np.concatenate([g, np.zeros(pad)]))       # (n / P,)
        w = np.concatenate([flat_grads(b.params, names), np.zeros(pad)])
        w_slice = np.split(w, world)[comm.rank].copy()
        opt = Adam({"slice": w_slice}, lr=lr)
        opt.step({"slice": g_slice})
        new = comm.all_gather(w_slice)[:g.size]
        state = opt.m["slice"].nbytes + opt.v["slice"].nbytes
        return _unflat(new, b.params, names), comm.traffic.table(), state

    out = run_simulated(world, rank, timeout=timeout)
    return out[0][0], [t for _, t, _ in out], [s for _, _, s in out]


# ---- measured memory -----------------------------------------------------------------------------

def peak_train_step_bytes(model, x, dy, threads=1):
    """Peak bytes allocated (tracemalloc) by one ``model(x)`` and ``model.backward(dy)``, beyond
    what was allocated before it, after a warm-up step (one-off allocations happen there). The
    model's previous cache is dropped first, so it does not count."""
    def step():
        model.zero_grad()
        model(x)
        model.backward(dy)

    with blas_threads(threads):                 # the last step's activations are not this step's
        return peak_bytes(step, setup=model.drop_cache, warmup=1)


# ---- the check of preln.parallel, on gloo or simulated ---------------------------------------------

class ParallelRun(NamedTuple):
    """What ``python -m preln.parallel`` printed, parsed: ``cases`` maps (block, mode) to
    {"error": worst relative error, "traffic": {collective: (calls, bytes, formula bytes)}}."""

    backend: str
    world: int
    returncode: int
    cases: dict
    ok: bool


_ROW = re.compile(r"^(?:(\w+)\s+(tensor|sequence)\s+(\S+))?\s+(all_reduce|reduce_scatter|all_gather)"
                  r"\s+(\d+)\s+(\d+)\s+(\d+)")


def parse_parallel_report(text):
    """{(block, mode): {"error", "traffic"}} from the table :func:`preln.parallel.distributed.report`
    prints, and whether it ended in success."""
    cases, key = {}, None
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        if m.group(1):
            key = (m.group(1), m.group(2))
            cases[key] = {"error": float(m.group(3)), "traffic": {}}
        if key is None:
            raise ValueError(f"text: a collective's row before any block's: {line!r}")
        cases[key]["traffic"][m.group(4)] = tuple(int(m.group(i)) for i in (5, 6, 7))
    ok = "equal to the single-process block and the formula" in text and "MISMATCH" not in text
    return cases, ok


def run_parallel_check(world=2, timeout=120.0, simulate=None):
    """Run ``python -m preln.parallel --world N`` in a subprocess (bounded by ``timeout`` seconds):
    on torch.distributed (gloo) if torch is importable, else (or with ``simulate=True``) in
    simulated ranks. -> :class:`ParallelRun`."""
    world = positive_int(world, "world")
    if simulate is None:
        try:
            import torch.distributed  # noqa: F401 -- the engine, optional
            simulate = False
        except ImportError:
            simulate = True
    cmd = [sys.executable, "-m", "preln.parallel", "--world", str(world), "--timeout", str(timeout)]
    cmd += ["--simulate"] if simulate else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
    cases, ok = parse_parallel_report(proc.stdout)
    backend = "simulated ranks" if simulate else "torch.distributed (gloo)"
    return ParallelRun(backend, world, proc.returncode, cases, ok and proc.returncode == 0)
