"""make bench-grading: how long `make grade` takes per notebook, for a whole class.

    python -m preln.grade.bench_grading [--students 100] [--jobs 1 2] [--assignment NAME ...]
                                           [--keep DIR] [--no-feedback]

Writes a class of ``--students`` fixture students outside the repository (a temporary folder):
every student hands in every assignment, each answer cell filled, by a fixed seed, from the
solution (most answers), left as the stub, or replaced by a wrong answer (a mutant of the
solution, as `make mutation` makes them) — roughly what a real class hands in. The class is then
graded by python -m preln.grade, sandboxed, with feedback, once per ``--jobs`` value (the whole
class each time, into a fresh output folder). Prints a table: notebooks, wall seconds, seconds per
notebook, notebooks per hour, and the machine's load average before and after (the machine may be
shared: the numbers are what this machine did then, not a property of the grader alone).
"""
import argparse
import copy
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from . import mutate
from . import nbtools


def make_class(root, n_students, names, seed=0):
    rng = random.Random(seed)
    counts = {"solution": 0, "stub": 0, "wrong": 0}
    for name in names:
        source, release = nbtools.read(nbtools.source_path(name)), nbtools.read(nbtools.release_path(name))
        answers = {nbtools.grade_id(c): c for c in source.cells
                   if nbtools.nbgrader_meta(c).get("solution") and c.cell_type == "code"}
        mutants = {}
        for gid, cell in answers.items():
            lines = cell.source.split("\n")
            out = []
            for li, text in nbtools.regions(cell.source, nbtools.BEGIN_SOLUTION, nbtools.END_SOLUTION):
                for _, new in mutate.line_mutants(text):
                    src = "\n".join(lines[:li] + [new] + lines[li + 1:])
                    try:
                        compile(src, "<mutant>", "exec")
                    except SyntaxError:
                        continue
                    out.append(src)
            mutants[gid] = out
        for s in range(n_students):
            nb = copy.deepcopy(release)
            for cell in nb.cells:
                gid = nbtools.grade_id(cell)
                if gid not in answers:
                    continue
                r = rng.random()
                if r < 0.75:
                    kind, src = "solution", answers[gid].source
                elif r < 0.85 or not mutants[gid]:
                    kind, src = "stub", None
                else:
                    kind, src = "wrong", rng.choice(mutants[gid])
                counts[kind] += 1
                if src is not None:
                    cell.source = "\n".join(ln for ln in src.split("\n")
                                            if nbtools.BEGIN_SOLUTION not in ln and nbtools.END_SOLUTION not in ln)
            path = Path(root) / f"student{s:03d}" / name / f"{name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, str(path))
    return counts


def load():
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--students", type=int, default=100)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--assignment", action="append", default=None)
    ap.add_argument("--keep", default=None, help="write the class and the grades here (kept)")
    ap.add_argument("--no-feedback", action="store_true")
    args = ap.parse_args(argv)
    names = args.assignment or nbtools.assignments()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="preln-bench-class-"))
    cls = root / "class"
    shutil.rmtree(cls, ignore_errors=True)
    counts = make_class(cls, args.students, names)
    n = args.students * len(names)
    print(f"class: {args.students} students x {len(names)} assignments = {n} notebooks in {cls}; answer cells: "
          + ", ".join(f"{v} {k}" for k, v in counts.items()), flush=True)
    rows = []
    for jobs in args.jobs:
        out = root / f"grades-jobs{jobs}"
        shutil.rmtree(out, ignore_errors=True)
        before = load()
        cmd = [sys.executable, "-m", "preln.grade", str(cls), "--out", str(out),
               "--jobs", str(jobs)] + (["--no-feedback"] if args.no_feedback else [])
        for name in names:
            cmd += ["--assignment", name]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        graded, tail = 0, []
        for line in proc.stdout:                  # progress as it comes: a run cut short still says
            tail = (tail + [line])[-40:]          # how many notebooks it graded in how long
            if line.startswith("["):
                graded += 1
                if graded % 10 == 0:
                    print(f"  JOBS={jobs}: {graded} notebooks in {time.perf_counter() - t0:.0f} s "
                          f"(load {load()})", flush=True)
        rc = proc.wait()
        wall = time.perf_counter() - t0
        if rc != 0:
            print("".join(tail), file=sys.stderr)
        rows.append((jobs, graded, wall, before, load(), rc))
        print(f"JOBS={jobs}: {graded} notebooks in {wall:.0f} s (exit {rc})", flush=True)
    print()
    print("| JOBS | notebooks | wall (s) | s per notebook | notebooks per hour | load before | load after |")
    print("|---:|---:|---:|---:|---:|---|---|")
    for jobs, graded, wall, before, after, rc in rows:
        per = wall / max(graded, 1)
        print(f"| {jobs} | {graded} | {wall:.0f} | {per:.2f} | {3600 / per:.0f} | {before} | {after} |")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return max(r[-1] for r in rows)


if __name__ == "__main__":
    sys.exit(main())
