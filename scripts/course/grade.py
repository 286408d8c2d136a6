"""make grade: autograde a folder of submissions with nbgrader, one CSV per assignment.

    python scripts/course/grade.py SUBMISSIONS [--roster roster.csv] [--out _build/grades]
                                   [--timeout 60] [--mem-mb 2048] [--cpu-s 600] [--assignment NAME]

SUBMISSIONS is nbgrader's layout, SUBMISSIONS/<student>/<assignment>/<assignment>.ipynb. The
roster (optional) is a CSV with a column `student` (or `id`); a roster student with no submission
gets a row with status `missing`. For each assignment in assignments/source/, writes
<out>/<assignment>.csv with the columns

    student, <one per graded question>, total, possible, manual_possible, status

`total`/`possible` count the autograded questions; the written answers (graded by hand, e.g. in
formgrader) have empty cells and their points are in `manual_possible`. status is `ok`, `missing`,
or `failed: <reason>` (a file that is not a notebook, or whose nbgrader cell metadata is gone).
nbgrader's HTML feedback per student goes to <out>/feedback/<student>/<assignment>.html.

Nothing is written into assignments/: a temporary course directory holds a copy of the sources,
a fresh gradebook (generate_assignment registers the cells and their hidden tests) and the
submissions. Each notebook runs in the kernel of limited_kernel.py (memory and CPU capped) with
nbgrader's per-cell timeout, so a looping or memory-hungry answer loses its own question only.
"""
import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import nbformat

import nbtools

KERNEL = "preln-grader"


def read_roster(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and not ({"student", "id"} & set(rows[0])):
        raise SystemExit(f"--roster: expected a CSV with a column `student` or `id`; got columns {list(rows[0])}")
    return [(r.get("student") or r.get("id")).strip() for r in rows if (r.get("student") or r.get("id"))]


def check_submission(path, source_nb):
    """None if ``path`` is a notebook with every graded cell of the source, else the reason it is not."""
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as e:                                       # noqa: BLE001: any unreadable file
        return f"not a readable notebook ({type(e).__name__})"
    have = {nbtools.grade_id(c) for c in nb.cells if nbtools.nbgrader_meta(c)}
    need = [gid for gid, _, _ in nbtools.graded_cells(source_nb)]
    need += [nbtools.grade_id(c) for c in source_nb.cells if nbtools.nbgrader_meta(c).get("solution")]
    missing = sorted(set(need) - have)
    if missing:
        return f"nbgrader metadata missing for {len(missing)} cells ({', '.join(missing[:3])}...)"
    return None


def write_kernel(data_dir, args):
    spec = Path(data_dir) / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, str(Path(__file__).with_name("limited_kernel.py")),
            "--mem-mb", str(args.mem_mb), "--cpu-s", str(args.cpu_s), "-f", "{connection_file}"]
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": str(nbtools.ROOT)}
    (spec / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "preln grader (capped)", "language": "python", "env": env}))


def make_api(course_root, args):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(nbtools.COURSE)).load_config()
    cfg.merge(Config({
        "CourseDirectory": {"root": str(course_root), "db_url": f"sqlite:///{course_root}/gradebook.db"},
        "Execute": {"timeout": args.timeout, "kernel_name": KERNEL},
        "ExecutePreprocessor": {"kernel_name": KERNEL},
    }))
    return NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)


def grade(args):
    # nbgrader's gradebook code triggers SQLAlchemy deprecation warnings on every submission: noise here
    warnings.filterwarnings("ignore", module=r"nbgrader(\..*)?$")
    submissions = Path(args.submissions)
    if not submissions.is_dir():
        raise SystemExit(f"SUBMISSIONS: expected a folder <student>/<assignment>/<assignment>.ipynb; "
                         f"got {submissions} (not a folder)")
    names = [args.assignment] if args.assignment else nbtools.assignments()
    students = sorted({p.name for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")}
                      | set(read_roster(args.roster) if args.roster else []))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="preln-grade-"))
    # nbgrader runs `alembic` (its gradebook migrations) from PATH: use the one next to this Python
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    os.environ["JUPYTER_PATH"] = str(tmp / "share") + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    write_kernel(tmp / "share", args)
    try:
        course = tmp / "course"
        shutil.copytree(nbtools.SOURCE, course / "source")
        api = make_api(course, args)
        for name in names:
            grade_assignment(api, name, students, submissions, course, out)
    finally:
        if args.keep:
            print(f"temporary course directory kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def grade_assignment(api, name, students, submissions, course, out):
    source_nb = nbtools.read(nbtools.source_path(name))
    res = api.generate_assignment(name, force=True, create=True)        # fills the gradebook
    if not res["success"]:
        raise SystemExit(f"{name}: generate_assignment failed:\n{res.get('log')}\n{res['error']}")
    cells = nbtools.graded_cells(source_nb)
    columns = [nbtools.column_name(source_nb, gid) for gid, _, _ in cells]
    possible = sum(p for _, p, kind in cells if kind == "auto")
    manual = sum(p for _, p, kind in cells if kind == "manual")
    rows = []
    for student in students:
        path = submissions / student / name / f"{name}.ipynb"
        row = {"student": student, "possible": fmt(possible), "manual_possible": fmt(manual)}
        if not path.exists():
            others = sorted(p.name for p in path.parent.glob("*.ipynb")) if path.parent.is_dir() else []
            status = f"failed: expected {name}.ipynb, found {', '.join(others)}" if others else "missing"
            rows.append({**row, "total": "", "status": status})
            continue
        reason = check_submission(path, source_nb)
        if reason is None:
            dest = course / "submitted" / student / name
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest / f"{name}.ipynb")
            result = api.autograde(name, student, force=True, create=True)
            if not result["success"]:
                reason = "autograde error: " + why(result)
        if reason is not None:
            rows.append({**row, "total": "", "status": f"failed: {reason}"})
            print(f"{name} / {student}: failed: {reason}")
            continue
        scores = gradebook_scores(api, name, student)
        for col, (gid, _, kind) in zip(columns, cells):
            row[col] = fmt(scores.get(gid)) if kind == "auto" else ""
        row["total"] = fmt(sum(scores.get(gid) or 0 for gid, _, kind in cells if kind == "auto"))
        rows.append({**row, "status": "ok"})
        feedback(api, name, student, course, out)
        print(f"{name} / {student}: {row['total']} / {row['possible']}")
    header = ["student", *columns, "total", "possible", "manual_possible", "status"]
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, header, restval="")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / f'{name}.csv'}")


def gradebook_scores(api, name, student):
    from nbgrader.api import Gradebook
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        sub = gb.find_submission_notebook(name, name, student)
        return {g.name: g.score for g in sub.grades}


def feedback(api, name, student, course, out):
    res = api.generate_feedback(name, student, force=True)
    html = course / "feedback" / student / name / f"{name}.html"
    if res["success"] and html.exists():
        dest = out / "feedback" / student
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(html, dest / f"{name}.html")


def fmt(x):
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def why(result):
    """One line saying why nbgrader could not grade a submission (its log holds the traceback)."""
    text = f"{result.get('log') or ''}\n{result.get('error') or ''}"
    for needle, reason in (("DeadKernelError", "the kernel died (CPU-time or memory cap, or a crash)"),
                           ("Kernel died", "the kernel died (CPU-time or memory cap, or a crash)"),
                           ("UnresponsiveKernelError", "the kernel stopped responding")):
        if needle in text:
            return reason
    errors = [ln for ln in text.splitlines() if ln.startswith("[ERROR]") and "Please see" not in ln]
    return last_line(errors[-1] if errors else text)


def last_line(text):
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("submissions")
    ap.add_argument("--roster", default=None, help="CSV with a column `student` (or `id`)")
    ap.add_argument("--out", default=str(nbtools.ROOT / "_build" / "grades"))
    ap.add_argument("--assignment", default=None, help="grade only this assignment")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    ap.add_argument("--mem-mb", type=int, default=2048, help="address-space cap of a grading kernel")
    ap.add_argument("--cpu-s", type=int, default=600, help="CPU seconds cap of a grading kernel")
    ap.add_argument("--keep", action="store_true", help="keep the temporary course directory")
    grade(ap.parse_args(argv))


if __name__ == "__main__":
    main()
