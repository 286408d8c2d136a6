"""The long computations of the Pre-LN vs Post-LN chapter; results go to preln/data/preln_vs_postln/.

    nice .venv/bin/python scripts/sweep_preln_postln.py            # everything (~10-20 min on 2 cores)
    nice .venv/bin/python scripts/sweep_preln_postln.py --only theory
    nice .venv/bin/python scripts/sweep_preln_postln.py --only train --workers 2

Writes (package data, preln/data/, see preln/data/README.md)
    corpus.txt                      the synthetic corpus (if missing)
    preln_vs_postln/runs.json       tiny-LM training runs: Pre-LN vs Post-LN, with and without
                                    warm-up, over learning rates, depths and seeds
    preln_vs_postln/extras.json     the exercises' runs: short warm-ups and clipping for Post-LN
    preln_vs_postln/theory.json     Xiong et al.'s theory setting: Lemma 2 residual norms,
                                    Theorem 1 last-layer gradient norms per depth and seed,
                                    per-layer gradient norms over depth and width

Each file records the command, the grid and the package version that produced it. Every run is
deterministic given its seed, so the notebook re-runs a slice and asserts it agrees.
"""
import argparse
import itertools
import json
import os
import platform
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")        # one BLAS thread per worker process
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# preln is the installed package (`make install`: this checkout, editable)
import preln  # noqa: E402
from preln.chapters import xiong  # noqa: E402
from preln.models.lm import grammar_corpus  # noqa: E402

from preln.resources import data_path  # noqa: E402

OUT = data_path("preln_vs_postln")

# ---- the grids -------------------------------------------------------------------------------
TRAIN_GRID = {
    "norm_first": [True, False],
    "n_layers": [6, 2],
    "lr": [1e-3, 3e-3, 1e-2],
    "warmup": [0, 100],
    "seed": [0, 1],
}
TRAIN_FIXED = dict(steps=300, d_model=32, n_heads=2, d_ff=128, seq_len=32, batch_size=16,
                   activation="relu", clip=None, eval_every=25, eval_batches=4, dtype="float64")

# the exercises' runs: Post-LN, 6 layers, peak lr 1e-2, seed 0, with short warm-ups or clipping
EXTRAS = [dict(norm_first=False, n_layers=6, lr=1e-2, warmup=w, seed=0) for w in (10, 30)] + \
         [dict(norm_first=False, n_layers=6, lr=1e-2, warmup=0, seed=0, clip=1.0)]

THEORY = {
    "d": 64, "n_tokens": 16, "batch": 32, "vocab": 64,
    "lemma2_layers": 24, "lemma2_seeds": list(range(4)),
    "thm1_depths": [6, 8, 10, 12, 16, 20, 24], "thm1_seeds": list(range(12)),
    "grid_depths": [6, 12, 18, 24], "grid_widths": [16, 32, 64], "grid_seeds": list(range(4)),
}


def sig(x, digits=10):
    """A float rounded to ``digits`` significant digits (NaN -> None for JSON)."""
    return None if not np.isfinite(x) else float(f"{x:.{digits}g}")


def run_one(kw):
    t0, c0 = time.perf_counter(), time.process_time()
    result = xiong.train_lm(**{**TRAIN_FIXED, **kw})
    result["train_loss"] = [sig(v) for v in result["train_loss"]]
    result["grad_norm"] = [sig(v, 6) for v in result["grad_norm"]]
    result["eval_loss"] = [sig(v) for v in result["eval_loss"]]
    result["seconds"] = round(time.perf_counter() - t0, 1)          # wall (the machine is shared)
    result["cpu_seconds"] = round(time.process_time() - c0, 1)      # what the run itself cost
    return result


def sweep_train(workers, extras=False):
    keys = list(TRAIN_GRID)
    jobs = [dict(zip(keys, values)) for values in itertools.product(*TRAIN_GRID.values())]
    if extras:
        jobs = EXTRAS
    t0 = time.perf_counter()
    if workers > 1:
        from multiprocessing import Pool
        with Pool(workers) as pool:
            runs = []
            for i, r in enumerate(pool.imap(run_one, jobs)):
                runs.append(r)
                print(f"[{i + 1}/{len(jobs)}] {'Pre' if r['config']['norm_first'] else 'Post'}-LN L={r['config']['n_layers']} "
                      f"lr={r['config']['lr']} warmup={r['config']['warmup']} seed={r['config']['seed']} "
                      f"final eval {r['eval_loss'][-1]} ({r['seconds']} s wall, {r['cpu_seconds']} s CPU)", flush=True)
    else:
        runs = [run_one(kw) for kw in jobs]
    return {"grid": EXTRAS if extras else TRAIN_GRID, "fixed": TRAIN_FIXED, "runs": runs,
            "wall_seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs), 1)}


def sweep_theory():
    t0 = time.perf_counter()
    T = THEORY
    common = dict(d=T["d"], n_tokens=T["n_tokens"], batch=T["batch"])
    out = {"setting": T}
    out["lemma2"] = {name: [sig(v, 8) for v in xiong.residual_norms(nf, T["lemma2_layers"], **common,
                                                                      seeds=T["lemma2_seeds"])]
                     for name, nf in (("pre", True), ("post", False))}
    print("lemma2 done", flush=True)
    # Theorem 1: per depth and per seed, so that a slice can be re-run exactly
    out["thm1"] = {name: {str(L): [sig(xiong.layer_grad_norms(nf, L, "linear2.weight", **common,
                                                              vocab=T["vocab"], seeds=[s])[-1], 10)
                                   for s in T["thm1_seeds"]] for L in T["thm1_depths"]}
                   for name, nf in (("pre", True), ("post", False))}
    out["thm1_sample"] = {name: {str(L): [sig(xiong.last_layer_sample_grad_norm(nf, L, **common, vocab=T["vocab"],
                                                                             seeds=[s]), 10)
                                          for s in T["thm1_seeds"]] for L in T["thm1_depths"]}
                          for name, nf in (("pre", True), ("post", False))}
    print("thm1 done", flush=True)
    # per-layer gradient norms of W1 and W2 over depth and width (for the explorable)
    grid = {}
    for name, nf in (("pre", True), ("post", False)):
        for L in T["grid_depths"]:
            for d in T["grid_widths"]:
                kw = dict(d=d, n_tokens=T["n_tokens"], batch=T["batch"], vocab=T["vocab"], seeds=T["grid_seeds"])
                grid[f"{name}/{L}/{d}"] = {
                    "linear1.weight": [sig(v, 8) for v in xiong.layer_grad_norms(nf, L, "linear1.weight", **kw)],
                    "linear2.weight": [sig(v, 8) for v in xiong.layer_grad_norms(nf, L, "linear2.weight", **kw)],
                    "residual": [sig(v, 8) for v in xiong.residual_norms(nf, L, d=d, n_tokens=T["n_tokens"],
                                                                          batch=T["batch"], seeds=T["grid_seeds"])],
                }
    out["grid"] = grid
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def provenance(args):
    return {"command": "python scripts/sweep_preln_postln.py " + " ".join(sys.argv[1:]),
            "preln_version": preln.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "args": vars(args)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["train", "theory", "extras"], help="run one part only")
    ap.add_argument("--workers", type=int, default=2, help="processes for the training runs")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    corpus = data_path("corpus.txt")
    if not corpus.exists():
        corpus.write_text(grammar_corpus(200_000, seed=0), encoding="utf-8")
    if args.only in (None, "theory"):
        theory = sweep_theory()
        theory["provenance"] = provenance(args)
        (OUT / "theory.json").write_text(json.dumps(theory, separators=(",", ":")))
        print(f"theory: {theory['wall_seconds']} s", flush=True)
    if args.only in (None, "train"):
        runs = sweep_train(args.workers)
        runs["provenance"] = provenance(args)
        (OUT / "runs.json").write_text(json.dumps(runs, separators=(",", ":")))
        print(f"train: {runs['wall_seconds']} s", flush=True)
    if args.only in (None, "extras"):
        extras = sweep_train(args.workers, extras=True)
        extras["provenance"] = provenance(args)
        (OUT / "extras.json").write_text(json.dumps(extras, separators=(",", ":")))
        print(f"extras: {extras['wall_seconds']} s", flush=True)


if __name__ == "__main__":
    main()
