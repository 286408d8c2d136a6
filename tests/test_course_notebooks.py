"""The course edition, slow part 1 (`make test-course`): every source notebook runs top to bottom in
an instructor's kernel (the full package) with its solutions, its self-checks and its hidden checks
(preln.course evaluates them at once there) passing; every student notebook runs with its stubs
without crashing and fails exactly its graded test cells (their public self-checks, as in
JupyterLab, Binder or Colab); the release is up to date and leaks nothing."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from preln.grade import nbtools  # noqa: E402

pytest.importorskip("nbgrader", reason="the course edition needs requirements-course.txt (make test-course)")
from nbclient import NotebookClient  # noqa: E402

NAMES = nbtools.assignments()
#: CONVENTIONS.md: a solved source notebook runs top to bottom in < 60 s (on a quiet machine;
#: the bound asserted leaves room for the other core being busy)
SOURCE_SECONDS = 120


def execute(path, allow_errors):
    nb = nbtools.read(path)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(ROOT)}})
    t0 = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - t0


def errors(cell):
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_source_passes_every_test(name):
    nb, seconds = execute(nbtools.source_path(name), allow_errors=True)
    failed = [(nbtools.grade_id(c), errors(c)[0].ename, errors(c)[0].evalue[:200])
              for c in nb.cells if c.cell_type == "code" and errors(c)]
    assert not failed, f"{name}: cells fail with the solutions: {failed}"
    print(f"{name}: source notebook ran in {seconds:.1f} s")
    assert seconds < SOURCE_SECONDS, f"{name}: {seconds:.0f} s"


@pytest.mark.parametrize("name", NAMES)
def test_release_runs_and_scores_zero(name):
    nb, _ = execute(nbtools.release_path(name), allow_errors=True)
    graded = {q.tests for q in nbtools.questions(nb)}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if i in graded:      # nbgrader gives a graded code cell its points iff it has no error output
            assert errors(cell), f"{name} {nbtools.grade_id(cell)}: passes with the stub (would score points)"
        else:
            assert not errors(cell), f"{name} {nbtools.grade_id(cell)}: crashes the student notebook: " \
                                     f"{errors(cell)[0].ename}"
    for cell in nb.cells:
        if nbtools.nbgrader_meta(cell).get("solution") and cell.cell_type == "code":
            assert "raise NotImplementedError()" in cell.source, nbtools.grade_id(cell)


def test_release_up_to_date_and_no_leaks():
    res = subprocess.run([sys.executable, "-m", "preln.grade.release", "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", NAMES)
def test_release_has_no_hidden_tests_or_solutions(name):
    rel = nbtools.read(nbtools.release_path(name))
    text = "\n".join(c.source for c in rel.cells)
    for marker in (nbtools.BEGIN_SOLUTION, nbtools.BEGIN_HIDDEN, "Model answer", "MARK SCHEME", "no_credit_for"):
        assert marker not in text, (name, marker)
    assert all(not c.get("outputs") for c in rel.cells if c.cell_type == "code"), f"{name}: stored outputs"
