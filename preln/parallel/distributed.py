"""The sharded block on torch.distributed: N gloo processes on 127.0.0.1, each checking its share
against the single-process block in float64 and its bytes against the ring formula.

torch only moves the bytes (:class:`preln.parallel.comm.TorchComm`); numpy does the maths.
``python -m preln.parallel --world N`` is :func:`main`.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

from preln.nn.block import BlockConfig, TransformerBlock
from preln.nn.llama import LlamaBlock, LlamaConfig
from preln.parallel.comm import TorchComm, run_simulated
from preln.parallel.tensor import MODES, ParallelBlock, check_parallel, predicted_traffic, shard_params
from preln.validation import positive_float

__all__ = ["REL_TOL", "FAMILIES", "example_block", "check_rank", "main"]

#: float64: the sharded sums differ from the whole ones only in their order of addition
REL_TOL = 1e-12
FAMILIES = ("transformer", "llama")
BATCH, SEQ = 2, 8


def example_block(family, seed=0):
    """A small float64 block that splits over 1, 2 or 4 ranks (heads, key/value groups, d_ff)."""
    if family == "llama":
        block = LlamaBlock(LlamaConfig(d_model=32, n_heads=8, n_kv_heads=4, d_ff=48), dtype=np.float64, seed=seed)
    else:
        block = TransformerBlock(BlockConfig(d_model=32, n_heads=4, d_ff=64, causal=True),
                                 dtype=np.float64, seed=seed)
    return block.eval()


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def check_rank(comm, family, mode, seed=0):
    """Forward and backward of rank ``comm.rank``'s share; -> {"error": the worst relative error
    of y, dL/dx and every gradient slice, "traffic": sent, "predicted": the formula's}."""
    block = example_block(family, seed)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, SEQ, block.config.d_model))
    dy = rng.normal(size=x.shape)
    y = block.forward(x)                                      # the single-process block
    block.zero_grad()
    dx = block.backward(dy)
    check_parallel(block, comm.world, SEQ, mode)
    mine = (lambda a: np.split(a, comm.world, axis=1)[comm.rank]) if mode == "sequence" else (lambda a: a)
    shard = ParallelBlock(block, comm, mode)
    y_r = shard.forward(mine(x))
    dx_r = shard.backward(mine(dy))
    expected = shard_params(block, block.grads, comm.world, comm.rank)
    errors = [_rel(y_r, mine(y)), _rel(dx_r, mine(dx))] + [_rel(shard.grads[k], expected[k]) for k in expected]
    return {"rank": comm.rank, "error": max(errors), "traffic": comm.traffic.table(),
            "predicted": predicted_traffic(block, BATCH, SEQ, comm.world, mode)}


def _rank_main(args):
    import datetime

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        results = [check_rank(TorchComm(dist), f, m) for f in args.families for m in args.modes]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(json.dumps(results))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args):
    """Start the ranks, wait at most ``timeout`` seconds, kill every one that is left."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    port = _free_port()
    common = ["--world", str(args.world), "--port", str(port), "--timeout", str(args.timeout),
              "--family", *args.families, "--mode", *args.modes]
    procs = [subprocess.Popen([sys.executable, "-m", "preln.parallel", "--rank", str(r), *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(args.world)]
    deadline, outs = time.monotonic() + args.timeout, []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            if p.returncode:
                raise RuntimeError(f"rank {procs.index(p)} exited {p.returncode}:\n{err[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the {args.world} ranks did not finish in {args.timeout} s") from None
    finally:
        for p in procs:              # no process left behind, whatever happened
            if p.poll() is None:
                p.kill()
                p.wait()
    return [[outs[r][i] for r in range(args.world)] for i in range(len(outs[0]))]


def report(rows, families, modes, world, backend):
    """Print the table; return True if every rank of every case met REL_TOL and the formula."""
    ok = True
    print(f"sharded block over {world} ranks ({backend}), B={BATCH}, S={SEQ}, float64; bytes: sent per rank, "
          "forward + backward")
    print(f"{'block':12} {'mode':9} {'max rel err':>11}  {'collective':15} {'calls':>5} {'bytes':>8} "
          f"{'formula':>8}")
    cases = [(f, m) for f in families for m in modes]
    for (family, mode), ranks in zip(cases, rows):
        err = max(r["error"] for r in ranks)
        good = err <= REL_TOL and all({k: tuple(v) for k, v in r["traffic"].items()} ==
                                      {k: tuple(v) for k, v in r["predicted"].items()} for r in ranks)
        ok &= good
        for i, (kind, (calls, sent)) in enumerate(sorted(ranks[0]["traffic"].items())):
            pred = ranks[0]["predicted"].get(kind, (0, 0))[1]
            lead = f"{family:12} {mode:9} {err:11.1e}" if i == 0 else " " * 34
            print(f"{lead}  {kind:15} {calls:5d} {sent:8d} {pred:8d}" + ("" if good else "  MISMATCH"))
    print("equal to the single-process block and the formula" if ok else "FAILED")
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m preln.parallel", description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="ranks (processes); default 2")
    ap.add_argument("--family", nargs="+", choices=FAMILIES, default=list(FAMILIES), dest="families")
    ap.add_argument("--mode", nargs="+", choices=MODES, default=list(MODES), dest="modes")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole run")
    ap.add_argument("--simulate", action="store_true", help="P threads in this process, no torch")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.world < 1:
        ap.error(f"--world: expected an int >= 1; got {args.world}")
    try:                                     # 0, a negative or nan time: a usage error, not a traceback
        positive_float(args.timeout, "--timeout")
    except ValueError as e:
        ap.error(str(e))
    if args.rank is not None:
        return _rank_main(args)
    for f in args.families:                  # a configuration that does not split: say so, spawn nothing
        for m in args.modes:
            try:
                check_parallel(example_block(f), args.world, SEQ, m)
            except ValueError as e:
                ap.error(f"--world {args.world} does not split the {f} block ({m} parallel): {e}")
    if args.simulate:
        rows = [run_simulated(args.world, check_rank, f, m, timeout=args.timeout)
                for f in args.families for m in args.modes]
        backend = "simulated in threads"
    else:
        try:
            import torch.distributed  # noqa: F401 -- the engine, optional
        except ImportError:
            print("torch is not installed: pip install torch (CPU), or run with --simulate", file=sys.stderr)
            return 2
        try:
            rows = _spawn(args)
        except RuntimeError as e:
            print(f"python -m preln.parallel: {e}", file=sys.stderr)
            return 1
        backend = "torch.distributed, gloo on 127.0.0.1"
    return 0 if report(rows, args.families, args.modes, args.world, backend) else 1
