"""The benchmark: a program that prints markdown tables, never a timed assertion.

    python -m preln.bench                      # float32, B,S,D,H,F = 8,256,512,8,2048, all threads
    python -m preln.bench --threads 1 --seq 512
    python -m preln.bench --threads 1 --clock cpu   # CPU time: steadier on a busy machine
    python -m preln.bench --widgets            # time every frame of every explorable (target 100 ms)

Block mode times, for one float32 block on the machine's threads (median over repeats, after
warm-up): the training-mode forward (dropout 0), the backward, the training step (forward +
backward) and the eval-mode forward (tiled attention). Each time is compared with

- PyTorch (optional, never a dependency): ``torch.nn.TransformerEncoderLayer`` in float32 with the
  same weights, ``batch_first=True``, the same number of threads; numpy and torch run interleaved,
  pair by pair (a busy machine slows both alike), and the ratio is the one of the two medians;
- the block's matmuls alone: the same GEMMs (the four linears and the two attention batched
  matmuls, forward and backward) done with plain numpy on the same shapes -- the floor that
  everything else (LayerNorm, softmax, GELU, copies) is added to.

It also reports the peak memory (tracemalloc) of the forward, the training step and the eval
forward, and ``block.cache_nbytes()``, then PASS/MISS per target.

Then three more tables (``--no-fused`` / ``--no-decode`` skip them):

- the fused kernels (:mod:`preln.ops.fused`) against the numpy ops they replace, one by one, on the
  block's shapes -- op by op (the unfused path), row-blocked numpy (the same ops on chunks of rows
  that stay in the L2 cache: the no-new-dependency alternative) and the fused numba kernel;
- the block's forward, training step and eval forward with ``fused=False`` against
  ``fused=True``, interleaved;
- decoding one token of a causal block with and without the KV cache, in ms per generated token,
  by context length (B = 1) and by batch size (context 256): without the cache every token re-runs
  the block over the whole context.

Then the Llama rows (``--no-llama`` skips them, ``--llama-only`` runs only them): one float32
:class:`preln.LlamaBlock` (RMSNorm, RoPE, grouped-query attention with ``--kv-heads`` key/value
heads, SwiGLU of width ``--llama-d-ff``) on the same B, S, D, H -- the training-mode forward, the
training step and the eval forward, interleaved pair by pair with transformers' ``LlamaDecoderLayer``
(optional, test-only; sdpa attention, float32, the same weights and threads, RoPE's cos/sin
computed inside the timed call as the block does) and with the block's own matmuls alone.
"""
import argparse
import gc
import itertools
import os
import statistics
import sys
import time

import numpy as np

from preln.measure import best_time, peak_bytes, time_interleaved
from preln.nn.block import TransformerBlock
from preln.nn.config import BlockConfig
from preln.ops import (activation_backward, activation_forward, fused, layer_norm_forward,
                  softmax_backward, softmax_forward)

#: (name, pass, reference, limit): the pass's time must be at most limit x the reference's
TARGETS = (
    ("training step <= 1.0x PyTorch CPU", "training step", "torch", 1.0),
    ("eval forward <= 1.3x PyTorch CPU", "eval forward", "torch", 1.3),
    ("forward <= 1.25x its matmuls alone", "forward", "gemm", 1.25),
)
#: decode table: context lengths at B = 1, and batch sizes at context DECODE_CONTEXT
DECODE_CONTEXTS = (64, 256, 1024)
DECODE_BATCHES = (1, 4, 16, 64)
DECODE_CONTEXT = 256
#: (name, pass, reference, limit) for the Llama block
LLAMA_TARGETS = (
    ("Llama training step <= 1.0x PyTorch (transformers)", "training step", "torch", 1.0),
    ("Llama forward <= 1.3x its matmuls alone", "forward", "gemm", 1.3),
)
WIDGET_TARGET_MS = 100.0
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m preln.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", "-B", type=int, default=8)
    ap.add_argument("--seq", "-S", type=int, default=256)
    ap.add_argument("--d-model", "-D", type=int, default=512)
    ap.add_argument("--heads", "-H", type=int, default=8)
    ap.add_argument("--d-ff", "-F", type=int, default=2048)
    ap.add_argument("--post-ln", action="store_true", help="benchmark the Post-LN block")
    ap.add_argument("--threads", type=int, default=None,
                    help="BLAS / torch threads (default: every CPU this process may use)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per measurement")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs before them")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    ap.add_argument("--widgets", action="store_true",
                    help="time the explorables' callbacks instead of the block")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or this process's CPU time (steadier on a busy machine with --threads 1)")
    ap.add_argument("--no-fused", action="store_true", help="skip the fused-kernel tables")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode table")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="Llama rows: key/value heads (default H / 4, grouped-query attention)")
    ap.add_argument("--llama-d-ff", type=int, default=None,
                    help="Llama rows: SwiGLU width (default 8D/3 rounded up to a multiple of 64)")
    ap.add_argument("--no-llama", action="store_true", help="skip the Llama rows")
    ap.add_argument("--llama-only", action="store_true", help="only the Llama rows")
    ap.add_argument("--training-memory", action="store_true",
                    help="only the training-memory tables: tiled vs plain attention over S, and "
                         "activation checkpointing of a stack against its formula")
    return ap.parse_args(argv)


def machine_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def ensure_threads(n, argv):
    """OpenBLAS reads its thread count when numpy is first imported, which has already happened
    (``import preln`` imports numpy). So if the environment does not already ask for ``n``
    threads, restart this program once with it set; torch gets the same number in ``torch_setup``."""
    if all(os.environ.get(v) == str(n) for v in _THREAD_VARS):
        return
    env = dict(os.environ, **{v: str(n) for v in _THREAD_VARS})
    sys.stdout.flush()
    main_spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = main_spec.name if main_spec is not None else __name__   # "preln.bench" under python -m
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def blas_name():
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:   # older numpy: no mode="dicts"
        return "see numpy.show_config()"


# ---- timing -------------------------------------------------------------------------------------
#: the clock of every timing: wall time (default), or with --clock cpu this process's CPU time,
#: which other processes competing for the cores do not inflate (meaningful with --threads 1,
#: where no thread of ours waits for another)
CLOCK = time.perf_counter


def time_pairs(np_fn, refs, setup_np=None, repeats=10, warmup=2):
    """Run ``np_fn`` and each reference interleaved (:func:`preln.measure.time_interleaved`, on
    :data:`CLOCK`), so that a machine busy with something else slows both sides alike.
    ``refs``: {name: (fn, setup) or None}.

    Returns (median numpy s, {name: median s}, {name: median numpy / median ref}): the ratio is
    the one of the two medians, so a table's ratio column equals its two time columns (issue 34).
    """
    refs = {k: v for k, v in refs.items() if v is not None}
    ours = object()                                  # a key no reference's name can equal
    fns = {ours: np_fn, **{k: fn for k, (fn, _) in refs.items()}}
    setups = {ours: setup_np, **{k: setup for k, (_, setup) in refs.items()}}
    t = time_interleaved(fns, repeats, warmup, threads=None, clock=CLOCK, setups=setups, collect=True)
    medians = {k: t[k].median for k in refs}
    return t[ours].median, medians, {k: t[ours].median / m for k, m in medians.items()}


# ---- the block's GEMMs alone --------------------------------------------------------------------
def gemm_fns(cfg, B, S, rng):
    """Two callables doing exactly the forward / backward matmuls of the block, on contiguous
    float32 arrays of the same shapes, with nothing else around them."""
    D, H, F = cfg.d_model, cfg.n_heads, cfg.d_ff
    dh, N = D // H, B * S
    r = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    w_in, w_out, w1, w2 = r(3 * D, D), r(D, D), r(F, D), r(D, F)
    h, o, g = r(N, D), r(N, D), r(N, F)                         # inputs of the four linears
    q, k, v = r(B, H, S, dh), r(B, H, S, dh), r(B, H, S, dh)
    p = r(B, H, S, S)
    d_qkv, d_a, d_u, d_z = r(N, 3 * D), r(N, D), r(N, F), r(N, D)   # output gradients
    d_o, d_s = r(B, H, S, dh), r(B, H, S, S)

    linears = ((h, w_in, d_qkv), (o, w_out, d_a), (h, w1, d_u), (g, w2, d_z))   # (x, W, dL/dout)
    return _gemm_callables(linears, q, k, v, p, d_o, d_s)


def _gemm_callables(linears, q, k, v, p, d_o, d_s):
    """forward / backward callables doing a block's matmuls alone: the linears' x W^T (and dout W,
    dout^T x), the attention's q k^T and P V (and their four gradient products)."""
    def forward():
        q @ k.swapaxes(-1, -2)           # scores
        p @ v                            # o
        for x, w, _ in linears:
            x @ w.T                      # each linear's output

    def backward():
        for x, w, dout in linears:
            dout @ w                     # dx
            dout.T @ x                   # dW
        p.swapaxes(-1, -2) @ d_o         # dV
        d_o @ v.swapaxes(-1, -2)         # dP
        d_s @ k                          # dQ
        d_s.swapaxes(-1, -2) @ q         # dK

    return forward, backward


def numpy_passes(block, x, dy):
    """The timed passes of a preln block: a training-mode forward, a training step (forward and
    backward), an eval-mode forward."""
    def train_forward():
        block.train()
        block(x)

    def step():
        train_forward()
        block.backward(dy)

    def eval_forward():
        block.eval()
        block(x)

    return train_forward, step, eval_forward


# ---- PyTorch (optional) -------------------------------------------------------------------------
def torch_setup(block, threads):
    """A torch.nn.TransformerEncoderLayer with the block's weights, or (None, reason)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed (it is optional): no ratios to PyTorch"
    torch.set_num_threads(threads)
    cfg = block.config
    layer = torch.nn.TransformerEncoderLayer(
        cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0,
        activation={"gelu": "gelu", "relu": "relu"}.get(cfg.activation, "gelu"),
        layer_norm_eps=cfg.eps, batch_first=True, norm_first=cfg.norm_first, dtype=torch.float32)
    layer.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in block.state_dict().items()})
    return layer, f"torch {torch.__version__}, {torch.get_num_threads()} threads"


# ---- block mode ---------------------------------------------------------------------------------
def run_block(args, threads):
    B, S = args.batch, args.seq
    cfg = BlockConfig(d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff,
                      norm_first=not args.post_ln, dropout=0.0)
    block = TransformerBlock(cfg, dtype=np.float32, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, cfg.d_model), dtype=np.float32)
    dy = rng.standard_normal((B, S, cfg.d_model), dtype=np.float32)

    layer, torch_note = (None, "skipped (--no-torch)") if args.no_torch else torch_setup(block, threads)
    print(f"# preln benchmark: float32, B={B} S={S} D={cfg.d_model} H={cfg.n_heads} F={cfg.d_ff}, "
          f"{'Pre' if cfg.norm_first else 'Post'}-LN, GELU, dropout 0\n")
    print(f"- threads: {threads} (OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')})")
    import numba
    print(f"- numpy {np.__version__}, BLAS: {blas_name()}; numba {numba.__version__} "
          "(the fused kernels, one thread each)")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if var in os.environ:
            print(f"- {var}={os.environ[var]} (left as set; numpy and torch both run under it)")
    print(f"- PyTorch: {torch_note}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 1.0:
        print(f"- load average {load:.1f} on {machine_threads()} CPUs before the run: other processes "
              "compete; the interleaved ratios are steadier than the absolute times")
    print(f"- clock: {'wall time' if args.clock == 'wall' else 'CPU time of this process'}; "
          f"median of {args.repeats} runs after {args.warmup} warm-up runs; "
          "numpy and torch interleaved pair by pair\n")

    # numpy side
    np_train_forward, np_step, np_eval = numpy_passes(block, x, dy)

    def np_backward():
        block.backward(dy)

    # torch side (None when torch is absent)
    t_fwd = t_bwd = t_step = t_eval = t_setup_bwd = None
    if layer is not None:
        import torch
        xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)
        state = {}

        def t_fwd():
            layer.train()
            state["y"] = layer(xt.requires_grad_(True))

        def t_bwd():
            state.pop("y").backward(dyt)

        def t_setup_bwd():
            layer.train()
            state["y"] = layer(xt.requires_grad_(True))

        def t_step():
            layer.train()
            layer(xt.requires_grad_(True)).backward(dyt)

        def t_eval():
            layer.eval()
            with torch.inference_mode():   # the fused "fast path" PyTorch takes for inference
                layer(xt.detach())

    gemm_fwd, gemm_bwd = gemm_fns(cfg, B, S, rng)

    def gemm_step():
        gemm_fwd()
        gemm_bwd()

    torch_ref = lambda fn, setup=None: (fn, setup) if layer is not None else None
    passes = {   # pass: (numpy fn, its setup, torch reference, matmuls-alone reference)
        "forward": (np_train_forward, None, torch_ref(t_fwd), (gemm_fwd, None)),
        "backward": (np_backward, np_train_forward, torch_ref(t_bwd, t_setup_bwd), (gemm_bwd, None)),
        "training step": (np_step, None, torch_ref(t_step), (gemm_step, None)),
        "eval forward": (np_eval, None, torch_ref(t_eval), (gemm_fwd, None)),
    }
    print("| pass | numpy ms | PyTorch ms | numpy / PyTorch | its matmuls ms | numpy / matmuls |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for name, (fn, setup, t_ref, g_ref) in passes.items():
        t_n, t_refs, r = time_pairs(fn, {"torch": t_ref, "gemm": g_ref}, setup_np=setup,
                                    repeats=args.repeats, warmup=args.warmup)
        ratios[(name, "torch")] = r.get("torch")
        ratios[(name, "gemm")] = r["gemm"]
        torch_cols = (f"{t_refs['torch'] * 1e3:.1f} | {r['torch']:.2f}x" if "torch" in r else "- | -")
        label = name + (" (tiled attention)" if name == "eval forward" else "")
        print(f"| {label} | {t_n * 1e3:.1f} | {torch_cols} | {t_refs['gemm'] * 1e3:.1f} | "
              f"{r['gemm']:.2f}x |", flush=True)

    # memory: only what each pass allocates (the previous cache is dropped first)
    mem = {"forward (train mode)": peak_bytes(np_train_forward, block.drop_cache),
           "training step": peak_bytes(np_step, block.drop_cache),
           "eval forward (tiled attention)": peak_bytes(np_eval, block.drop_cache)}
    block.train()
    block(x)
    act = x.nbytes
    print("\n| memory | MiB | x input size |\n|---|---:|---:|")
    for name, nbytes in mem.items():
        print(f"| peak, {name} | {nbytes / 2**20:.1f} | {nbytes / act:.1f} |")
    c = block.cache_nbytes()
    print(f"| block.cache_nbytes() after a training forward | {c / 2**20:.1f} | {c / act:.1f} |")

    print("\n| target | measured | result |\n|---|---:|---|")
    for label, name, ref, limit in TARGETS:
        r = ratios[(name, ref)]
        if r is None:
            print(f"| {label} | - | not measured (no PyTorch) |")
        else:
            print(f"| {label} | {r:.2f}x | {'PASS' if r <= limit else 'MISS'} |")
    if not args.no_fused:
        run_fused(args, block, x, dy)
    if not args.no_decode:
        run_decode(args)
    if not args.no_llama:
        run_llama(args, threads)


# ---- fused kernels ------------------------------------------------------------------------------
ROW_BLOCK_BYTES = 256 * 1024   # a chunk of rows this large stays in a 512 KiB-1 MiB L2 cache


def _row_blocks(n_rows, row_bytes):
    step = max(1, ROW_BLOCK_BYTES // row_bytes)
    return [(i, min(i + step, n_rows)) for i in range(0, n_rows, step)]


def blocked_add_layer_norm(x, a, b, gamma, beta, eps=1e-5):  # (N, D) -> (N, D) x 2
    """The unfused ops, on chunks of rows that fit in L2: each op still a numpy pass, but over
    cached memory; the comparison point that needs no new dependency."""
    r, y = np.empty_like(x), np.empty_like(x)
    for i, j in _row_blocks(x.shape[0], x.shape[1] * x.itemsize):
        np.add(a[i:j], b, out=r[i:j])
        r[i:j] += x[i:j]
        y[i:j] = layer_norm_forward(r[i:j], gamma, beta, eps)[0]
    return r, y


def blocked_bias_gelu(u0, b):  # (N, F) -> (N, F) x 3
    u, g, cdf = np.empty_like(u0), np.empty_like(u0), np.empty_like(u0)
    for i, j in _row_blocks(u0.shape[0], u0.shape[1] * u0.itemsize):
        np.add(u0[i:j], b, out=u[i:j])
        g[i:j], c = activation_forward(u[i:j], "gelu")
        cdf[i:j] = c.cdf
    return g, u, cdf


def blocked_softmax(s, scale):  # (R, C) -> (R, C)
    p = np.empty_like(s)
    for i, j in _row_blocks(s.shape[0], s.shape[1] * s.itemsize):
        np.multiply(s[i:j], scale, out=p[i:j])
        p[i:j] = softmax_forward(p[i:j])[0]
    return p


def run_fused(args, block, x, dy):
    """The fused kernels against the ops they replace, then the block with and without them."""
    cfg, B, S = block.config, args.batch, args.seq
    D, H, Fw, N = cfg.d_model, cfg.n_heads, cfg.d_ff, args.batch * args.seq
    rng = np.random.default_rng(1)
    r = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    xr, ar, bd, gam, bet = r(N, D), r(N, D), r(D), 1 + r(D), r(D)
    u0, bf, dg = r(N, Fw), r(Fw), r(N, Fw)
    s, dp = r(B * H * S, S), r(B * H * S, S)
    scale = np.float32(1 / np.sqrt(D // H))
    _, act_cache = activation_forward(u0 + bf, "gelu")
    p = softmax_forward(s * scale)[0]
    s4 = s.reshape(B, H, S, S)
    u_work = u0.copy()                                     # bias_gelu writes u over its input
    restore_u = lambda: np.copyto(u_work, u0)              # (untimed, before each fused call)
    kernels = {   # name: (shape, op by op, row-blocked numpy or None, fused, fused's setup)
        "LayerNorm": (f"({N}, {D})", lambda: layer_norm_forward(xr, gam, bet),
                      None, lambda: fused.layer_norm(xr, gam, bet), None),
        "bias + residual + LayerNorm": (
            f"({N}, {D})", lambda: layer_norm_forward(xr + (ar + bd), gam, bet),
            lambda: blocked_add_layer_norm(xr, ar, bd, gam, bet),
            lambda: fused.add_layer_norm(xr, ar, bd, gam, bet), None),
        "bias + GELU (keeps u, Phi(u))": (
            f"({N}, {Fw})", lambda: activation_forward(u0 + bf, "gelu"),
            lambda: blocked_bias_gelu(u0, bf), lambda: fused.bias_gelu(u_work, bf), restore_u),
        "softmax (scale, max, exp, sum, divide)": (
            f"({B}, {H}, {S}, {S})", lambda: softmax_forward(s * scale),
            lambda: blocked_softmax(s, scale), lambda: fused.softmax(s4, scale), None),
        "GELU backward": (f"({N}, {Fw})", lambda: activation_backward(dg, act_cache), None,
                          lambda: fused.gelu_backward(dg, act_cache), None),
        "softmax backward": (f"({B}, {H}, {S}, {S})", lambda: softmax_backward(dp, p), None,
                             lambda: fused.softmax_backward(dp, p), None),
    }
    print("\n## Fused kernels (float32, one thread) against the numpy ops they replace\n")
    print("| kernel | shape | op by op ms | row-blocked numpy ms | fused ms | op by op / fused |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (shape, unfused, blocked, fast, fast_setup) in kernels.items():
        refs = {"blocked": (blocked, None) if blocked else None, "fused": (fast, fast_setup)}
        t_u, t_r, ratio = time_pairs(unfused, refs, repeats=args.repeats, warmup=args.warmup)
        t_b = f"{t_r['blocked'] * 1e3:.2f}" if "blocked" in t_r else "-"
        print(f"| {name} | {shape} | {t_u * 1e3:.2f} | {t_b} | {t_r['fused'] * 1e3:.2f} | "
              f"{ratio['fused']:.1f}x |", flush=True)

    plain = TransformerBlock(cfg, dtype=np.float32, seed=0, fused=False)
    plain.load_state_dict(block.state_dict())
    print("\n| block pass | fused=False ms | fused=True ms | unfused / fused |\n|---|---:|---:|---:|")

    def step(b):
        b.train()
        b(x)
        b.backward(dy)

    def evalf(b):
        b.eval()
        b(x)

    for name, fn in (("forward", lambda b: b.train()(x)), ("training step", step),
                     ("eval forward", evalf)):
        t_u, t_r, ratio = time_pairs(lambda: fn(plain), {"fused": (lambda: fn(block), None)},
                                     repeats=args.repeats, warmup=args.warmup)
        print(f"| {name} | {t_u * 1e3:.1f} | {t_r['fused'] * 1e3:.1f} | {ratio['fused']:.2f}x |",
              flush=True)


# ---- decoding -------------------------------------------------------------------------------------
def decode_times(block, batch, context, repeats, warmup):
    """(ms per token with the KV cache, ms without): one new token after ``context - 1`` others.

    With the cache: ``block.decode`` of one position, the cache holding context - 1 positions.
    Without: the whole causal forward over the ``context`` positions (what a decoder without a
    cache computes for every token), in eval mode.
    """
    D = block.config.d_model
    rng = np.random.default_rng(2)
    ctx = rng.standard_normal((batch, context, D), dtype=np.float32)
    kv = block.kv_cache(batch, context)
    block.decode(ctx[:, :-1], kv)                                  # the cache of the context

    def with_cache():
        kv.length = context - 1                                    # forget the last step, redo it
        block.decode(ctx[:, -1:], kv)

    t_c, t_r, _ = time_pairs(with_cache, {"full": (lambda: block(ctx), None)},
                             repeats=repeats, warmup=warmup)
    return t_c * 1e3, t_r["full"] * 1e3


def run_decode(args):
    cfg = BlockConfig(d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff,
                      norm_first=not args.post_ln, causal=True)
    block = TransformerBlock(cfg, dtype=np.float32, seed=0).eval()
    print(f"\n## Decoding one token: one causal float32 block, D={cfg.d_model} H={cfg.n_heads} "
          f"F={cfg.d_ff}, eval mode\n")
    print("| batch | context | with KV cache ms/token | without ms/token | without / with | "
          "with: tokens/s | KV cache MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = [(1, c) for c in DECODE_CONTEXTS] + [(b, DECODE_CONTEXT) for b in DECODE_BATCHES if b != 1]
    for batch, context in rows:
        t_c, t_f = decode_times(block, batch, context, max(3, args.repeats // 2), 1)
        mib = block.kv_cache(batch, context).nbytes / 2**20
        print(f"| {batch} | {context} | {t_c:.2f} | {t_f:.2f} | {t_f / t_c:.1f}x | "
              f"{batch / t_c * 1e3:.0f} | {mib:.1f} |", flush=True)


# ---- the Llama block ----------------------------------------------------------------------------
def llama_config(args):
    from preln.nn.llama import LlamaConfig
    D, H = args.d_model, args.heads
    n_kv = args.kv_heads or max(1, H // 4)
    d_ff = args.llama_d_ff or 64 * -(-8 * D // (3 * 64))        # ceil(8D/3) to a multiple of 64
    return LlamaConfig(d_model=D, n_heads=H, n_kv_heads=n_kv, d_ff=d_ff)


def llama_gemm_fns(cfg, B, S, rng):
    """The forward / backward matmuls of the Llama block alone, on float32 arrays of its shapes
    (the grouped attention products as the block does them: G query heads stacked per k/v head)."""
    D, H, Hkv, F, dh = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.d_head
    G, N = H // Hkv, B * S
    r = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    wq, wk, wv, wo = r(H * dh, D), r(Hkv * dh, D), r(Hkv * dh, D), r(D, H * dh)
    wg, wu, wd = r(F, D), r(F, D), r(D, F)
    h, o, g = r(N, D), r(N, H * dh), r(N, F)                    # inputs of the linears
    q, k, v = r(B, Hkv, G * S, dh), r(B, Hkv, S, dh), r(B, Hkv, S, dh)
    p = r(B, Hkv, G * S, S)
    d_q, d_kv, d_a, d_f = r(N, H * dh), r(N, Hkv * dh), r(N, D), r(N, F)   # output gradients
    d_o, d_s = r(B, Hkv, G * S, dh), r(B, Hkv, G * S, S)

    linears = ((h, wq, d_q), (h, wk, d_kv), (h, wv, d_kv), (o, wo, d_a), (h, wg, d_f), (h, wu, d_f),
               (g, wd, d_a))                                    # (x, W, dL/dout)
    return _gemm_callables(linears, q, k, v, p, d_o, d_s)


def llama_torch_setup(block, threads):
    """transformers' LlamaDecoderLayer (sdpa, float32) with the block's weights and its rotary
    embedding, or (None, None, reason)."""
    try:
        import torch
        from transformers import LlamaConfig as HFConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    except ImportError:
        return None, None, ("torch and transformers are not both installed (optional, test-only): "
                            "no ratios to PyTorch")
    torch.set_num_threads(threads)
    cfg = block.config
    hcfg = HFConfig(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_attention_heads=cfg.n_heads,
                    num_key_value_heads=cfg.n_kv_heads, num_hidden_layers=1, vocab_size=16,
                    rms_norm_eps=cfg.eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                    attn_implementation="sdpa")
    layer = LlamaDecoderLayer(hcfg, layer_idx=0).to(torch.float32)
    layer.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in block.state_dict().items()})
    import transformers
    return layer, LlamaRotaryEmbedding(hcfg), (f"transformers {transformers.__version__} LlamaDecoderLayer "
                                               f"(sdpa), torch {torch.__version__}, "
                                               f"{torch.get_num_threads()} threads")


def run_llama(args, threads):
    from preln.nn.llama import LlamaBlock
    B, S = args.batch, args.seq
    cfg = llama_config(args)
    block = LlamaBlock(cfg, dtype=np.float32, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, cfg.d_model), dtype=np.float32)
    dy = rng.standard_normal((B, S, cfg.d_model), dtype=np.float32)
    layer, rot, note = ((None, None, "skipped (--no-torch)") if args.no_torch
                        else llama_torch_setup(block, threads))
    print(f"\n## The Llama block: float32, B={B} S={S} D={cfg.d_model} H={cfg.n_heads} "
          f"H_kv={cfg.n_kv_heads} F={cfg.d_ff} (SwiGLU), RMSNorm, RoPE, causal\n")
    print(f"- threads: {threads}; PyTorch: {note}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(f"- load average {load:.1f} on {machine_threads()} CPUs before the run; median of "
          f"{args.repeats} runs after {args.warmup} warm-up runs, interleaved pair by pair\n")

    np_fwd, np_step, np_eval = numpy_passes(block, x, dy)

    t_fwd = t_step = t_eval = None
    if layer is not None:
        import torch
        xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)
        pos = torch.arange(S)[None]

        def t_fwd():
            layer.train()
            xx = xt.requires_grad_(True)
            layer(xx, position_embeddings=rot(xx, pos))

        def t_step():
            layer.train()
            xx = xt.requires_grad_(True)
            layer(xx, position_embeddings=rot(xx, pos)).backward(dyt)

        def t_eval():
            layer.eval()
            with torch.inference_mode():
                xx = xt.detach()
                layer(xx, position_embeddings=rot(xx, pos))

    gemm_fwd, gemm_bwd = llama_gemm_fns(cfg, B, S, rng)

    def gemm_step():
        gemm_fwd()
        gemm_bwd()

    ref = lambda fn: (fn, None) if layer is not None else None
    passes = {"forward": (np_fwd, ref(t_fwd), gemm_fwd), "training step": (np_step, ref(t_step), gemm_step),
              "eval forward": (np_eval, ref(t_eval), gemm_fwd)}
    print("| Llama pass | numpy ms | PyTorch ms | numpy / PyTorch | its matmuls ms | numpy / matmuls |")
    print("|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for name, (fn, t_ref, g_ref) in passes.items():
        t_n, t_refs, r = time_pairs(fn, {"torch": t_ref, "gemm": (g_ref, None)},
                                    repeats=args.repeats, warmup=args.warmup)
        ratios[(name, "torch")], ratios[(name, "gemm")] = r.get("torch"), r["gemm"]
        torch_cols = f"{t_refs['torch'] * 1e3:.1f} | {r['torch']:.2f}x" if "torch" in r else "- | -"
        label = name + (" (tiled attention)" if name == "eval forward" else "")
        print(f"| {label} | {t_n * 1e3:.1f} | {torch_cols} | {t_refs['gemm'] * 1e3:.1f} | "
              f"{r['gemm']:.2f}x |", flush=True)
    block.train()
    block(x)
    kv = block.kv_cache(B, S).nbytes
    print(f"\n- cache for the backward (`block.cache_nbytes()`): {block.cache_nbytes() / 2**20:.1f} MiB; "
          f"KV cache for B={B}, {S} positions: {kv / 2**20:.1f} MiB with H_kv={cfg.n_kv_heads} "
          f"({kv * cfg.n_groups / 2**20:.1f} MiB with H_kv = H = {cfg.n_heads})")
    print("\n| target | measured | result |\n|---|---:|---|")
    for label, name, ref_name, limit in LLAMA_TARGETS:
        r = ratios[(name, ref_name)]
        if r is None:
            print(f"| {label} | - | not measured (no PyTorch) |")
        else:
            print(f"| {label} | {r:.2f}x | {'PASS' if r <= limit else 'MISS'} |")


# ---- widgets mode -------------------------------------------------------------------------------
def run_widgets(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from preln.chapters.figures import all_explorables
    from preln.chapters.viz import figure_png

    found = all_explorables()
    print(f"# explorable callbacks: every frame, target {WIDGET_TARGET_MS:.0f} ms\n")
    if not found:
        print("No explorables yet: preln.chapters.figures.all_explorables() is empty.")
        return
    print("plot = the callback, plot(**values), judged against the target; frame = plot + PNG "
          "render (what a live widget shows per move).\n")
    print("| explorable | frames | plot median ms | plot max ms | frame median ms | frame max ms | result |")
    print("|---|---:|---:|---:|---:|---:|---|")
    # numba compiles (first use) or loads (on-disk cache) the fused kernels once per process, for
    # each dtype. A reader's kernel has done that before any control moves, so it is not a
    # callback's cost: pay it here, before the first timed frame.
    from preln.nn.config import BlockConfig
    for dtype in (np.float32, np.float64):
        warm = TransformerBlock(BlockConfig(d_model=8, n_heads=2, d_ff=16, causal=True), dtype=dtype)
        warm.backward(warm(np.ones((1, 3, 8), dtype)))
        warm.eval()
        warm(np.ones((1, 3, 8), dtype))
    for name, (plot, controls) in sorted(found.items()):
        names = list(controls)
        plot_ms, frame_ms = [], []
        for values in itertools.product(*(controls[n] for n in names)):
            gc.collect()   # the previous frames' garbage is collected here, not inside the next timing
            t0 = time.perf_counter()
            fig = plot(**dict(zip(names, values)))
            t1 = time.perf_counter()
            try:
                figure_png(fig)
            finally:
                plt.close(fig)
            t2 = time.perf_counter()
            plot_ms.append((t1 - t0) * 1e3)
            frame_ms.append((t2 - t0) * 1e3)
        worst = max(plot_ms)   # the target is on the callback; the PNG render is shown alongside
        print(f"| {name} | {len(plot_ms)} | {statistics.median(plot_ms):.1f} | {worst:.1f} | "
              f"{statistics.median(frame_ms):.1f} | {max(frame_ms):.1f} | "
              f"{'PASS' if worst <= WIDGET_TARGET_MS else 'MISS'} |")


def _train_step_peak(model, x, repeats=1):  # -> (peak extra bytes, best seconds) of forward + backward
    def step():
        model(x)
        model.backward(x)

    # model.drop_cache: the last step's activations are not this one's
    seconds = time_interleaved({"step": step}, repeats, 0, None, time.perf_counter,
                               {"step": model.drop_cache})["step"].best
    return peak_bytes(step, setup=model.drop_cache), seconds


def run_training_memory(args):
    """Peak memory (tracemalloc) of one training step: plain vs tiled attention for S and 4 S, and a
    stack of L blocks with and without activation checkpointing, against the formulas."""
    from preln.nn.stack import TransformerStack
    cfg = BlockConfig(d_model=args.d_model, n_heads=args.heads, d_ff=args.d_ff, dropout=0.1)
    rng = np.random.default_rng(0)
    S0 = args.seq
    print(f"\n| training step, B = 1, D = {cfg.d_model}, H = {cfg.n_heads}, F = {cfg.d_ff}, float32 "
          f"| peak MiB at S = {S0} | at S = {4 * S0} | growth for 4x S |\n|---|---:|---:|---:|")
    for att in ("plain", "tiled"):
        peaks = []
        for S in (S0, 4 * S0):
            block = TransformerBlock(cfg, dtype=np.float32, seed=0, attention=att)
            peaks.append(_train_step_peak(block, rng.standard_normal((1, S, cfg.d_model)).astype(np.float32))[0])
        print(f"| {att} attention | {peaks[0] / 2**20:.1f} | {peaks[1] / 2**20:.1f} | {peaks[1] / peaks[0]:.2f}x |")
    L, B, S = 8, args.batch, S0
    x = rng.standard_normal((B, S, cfg.d_model)).astype(np.float32)
    one = TransformerBlock(cfg, dtype=np.float32, seed=0, attention="tiled")
    one(x)
    act = one.cache_nbytes()                                      # one block's kept activations
    one_step = _train_step_peak(one, x)[0]                        # one block's forward + backward
    inp = x.nbytes                                                # one block input, B S D
    print(f"\n| stack of L = {L}, B = {B}, S = {S}, tiled | peak MiB | formula MiB | step s | "
          f"formula s |\n|---|---:|---:|---:|---:|")
    rows = {}
    for ckpt in (False, True):
        stack = TransformerStack(cfg, L, dtype=np.float32, seed=0, attention="tiled", checkpoint=ckpt)
        rows[ckpt] = _train_step_peak(stack, x, repeats=args.repeats)
    t_fwd = best_time(lambda: one(x), args.repeats, warmup=0, clock=CLOCK)
    # the backward's working memory (gradients, tiles) comes on top of the kept activations once:
    # one block's whole step peak stands for "one block's activations" in the formulas
    formula = {False: ((L - 1) * act + one_step, rows[False][1]),
               True: (L * inp + one_step, rows[False][1] + L * t_fwd)}
    for ckpt, label in ((False, "no checkpointing (formula: (L-1) x kept activations + one block's step)"),
                        (True, "checkpoint=True (formula: L x input + one block's step; time +1 forward)")):
        (peak, t), (f_mem, f_t) = rows[ckpt], formula[ckpt]
        print(f"| {label} | {peak / 2**20:.1f} | {f_mem / 2**20:.1f} | {t:.3f} | {f_t:.3f} |")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.widgets:
        run_widgets(args)
        return
    threads = args.threads or machine_threads()
    ensure_threads(threads, argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.llama_only:
        run_llama(args, threads)
        return
    if args.training_memory:
        run_training_memory(args)
        return
    run_block(args, threads)


if __name__ == "__main__":
    main()
