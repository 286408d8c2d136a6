"""The experiment of "The modern block": a Llama-style LM against the reference Pre-LN LM.

    nice .venv/bin/python scripts/llama_vs_gpt.py                # everything (~10-25 min, 1 core)
    nice .venv/bin/python scripts/llama_vs_gpt.py --only main    # 3 models x 5 seeds, 500 steps
    nice .venv/bin/python scripts/llama_vs_gpt.py --only long    # GPT and Llama, 2 seeds, 2000 steps

Every model is trained by :func:`preln.models.llama_lm.train_lm`, the training loop of
:mod:`preln.models.pretrained` (the book's reference LM's recipe, ``preln.models.pretrained.RECIPE``), on the
first 90 % of ``preln/data/corpus.txt``, with the same batches for the same seed. The models and
their matched parameter counts are :func:`preln.chapters.figures.modern_block.experiment_configs`.

Writes (package data, see preln/data/README.md)
    llama_vs_gpt/runs.json          per model and seed: per-step training loss, held-out loss every
                                    25 steps (32 windows), the final held-out perplexity (every
                                    window), the RoPE models' perplexity at contexts 128 and 256,
                                    wall and CPU seconds; the recipe; provenance; and
                                    "long_runs": the GPT and the Llama model trained 4x longer
                                    (2 seeds), to tell faster learning from a better end point
    llama_vs_gpt/weights_seed0.npz  the float32 weights of seed 0 of each model

Deterministic given the seed: the chapter re-runs a slice and checks it against this file, and the
GPT's seed-0 losses are checked here against ``preln.models.pretrained.reference_lm_log()``.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")        # one BLAS thread per worker process
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# preln is the installed package (`make install`: this checkout, editable)
import preln  # noqa: E402
from preln.chapters.figures import modern_block as mb  # noqa: E402
from preln.models.pretrained import perplexity, reference_lm_log, split_ids  # noqa: E402
from preln.resources import data_path  # noqa: E402
from preln.models.corpus import load_corpus  # noqa: E402

OUT = data_path("llama_vs_gpt")
#: the longer runs: 4x the recipe's steps, two seeds, the GPT and the Llama model
LONG = dict(steps=2000, seeds=(0, 1))


def one_run(job):
    name, seed, steps = job
    model, log = mb.train_run(name, seed, steps)
    _, _, ids = load_corpus()
    _, val_ids = split_ids(ids)
    seq = mb.EXPERIMENT["recipe"]["seq_len"]
    run = {"seed": seed, "train_loss": [round(v, 7) for v in log["train_loss"]],
           "val_steps": log["val_steps"], "val_loss": [round(v, 7) for v in log["val_loss"]],
           "val_ppl": perplexity(model, val_ids, seq_len=seq), "seconds": round(log["seconds"], 2),
           "cpu_seconds": round(log["cpu_seconds"], 2)}
    if name != "gpt":     # RoPE has no table to run out of: evaluate past the trained context
        run["long_ppl"] = {str(c): perplexity(model, val_ids, seq_len=c) for c in mb.EXPERIMENT["long_contexts"]}
    keep = seed == 0 and steps is None
    weights = {f"{name}/{k}": v.astype(np.float32) for k, v in model.params.items()} if keep else None
    return name, run, model.num_params(), weights


def provenance(argv):
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"command": "python scripts/llama_vs_gpt.py " + " ".join(argv), "git_commit": commit,
            "preln_version": preln.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "unset")}


def run_long(workers):
    """The GPT and the Llama model, LONG["seeds"], for LONG["steps"] steps (4x the recipe)."""
    jobs = [(name, seed, LONG["steps"]) for seed in LONG["seeds"] for name in ("gpt", "llama")]
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(one_run, jobs))
    out = {"steps": LONG["steps"], "seeds": list(LONG["seeds"]), "models": {}}
    for name, run, _, _ in results:
        out["models"].setdefault(name, []).append(run)
    out["wall_seconds"] = round(time.perf_counter() - start, 1)
    out["provenance"] = provenance(sys.argv[1:])
    return out


def run_main(workers):
    _, vocab, _ = load_corpus()
    configs = mb.experiment_configs(len(vocab))
    jobs = [(name, seed, None) for seed in mb.EXPERIMENT["seeds"] for name in mb.MODELS]
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(one_run, jobs))
    models = {name: {"what": mb.MODELS[name], "config": configs[name]._asdict(), "runs": []} for name in mb.MODELS}
    weights = {}
    for name, run, n_params, w in results:
        models[name]["params"] = n_params
        models[name]["runs"].append(run)
        weights.update(w or {})
    # the GPT is the book's reference LM: its seed-0 training is preln.models.pretrained's, loss for loss
    ref = reference_lm_log(seed=0)["train_loss"]
    gpt0 = next(r for r in models["gpt"]["runs"] if r["seed"] == 0)["train_loss"]
    same = bool(np.allclose(gpt0, ref, rtol=0, atol=1e-6))
    if not same:
        raise SystemExit("the GPT's seed-0 run does not reproduce preln.models.pretrained.reference_lm_log()")
    out = {"experiment": {k: (list(v) if isinstance(v, tuple) else v) for k, v in mb.EXPERIMENT.items()},
           "models": models, "checks": {"gpt_seed0_equals_reference_lm_log": same},
           "wall_seconds": round(time.perf_counter() - start, 1), "provenance": provenance(sys.argv[1:])}
    return out, weights


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["main", "long"], help="run one part only (the other is kept)")
    ap.add_argument("--workers", type=int, default=1, help="processes (each on one BLAS thread)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "runs.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if args.only in (None, "main"):
        out, weights = run_main(args.workers)
        np.savez_compressed(OUT / "weights_seed0.npz", **weights)
    else:
        out = old
    if args.only in (None, "long"):
        out["long_runs"] = run_long(args.workers)
    elif "long_runs" in old:
        out["long_runs"] = old["long_runs"]
    path.write_text(json.dumps(out, separators=(",", ":")))
    for name, row in mb.runs_table(out).items():
        print(f"{name:10s} params {row['params']:6d}  held-out ppl {row['mean']:.3f} +- {row['std']:.3f}"
              f"  {np.round(row['ppl'], 3)}")
    for name, rs in out.get("long_runs", {}).get("models", {}).items():
        print(f"{name:10s} {out['long_runs']['steps']} steps: held-out ppl {[round(r['val_ppl'], 3) for r in rs]}")


if __name__ == "__main__":
    main()
