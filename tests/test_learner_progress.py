"""tests/nbval_progress.py: `make test-notebooks` prints one line per notebook as it finishes, on the
descriptor the Makefile opens, while pytest's own report still goes to the log."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def notebook(path, cells):
    """A notebook whose code cells store the given outputs: ``cells`` is [(source, stored_text)]."""
    nb = nbformat.v4.new_notebook()
    for count, (source, text) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, execution_count=count)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)] if text else []
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def run_nbval(tmp_path, *notebooks, extra=()):
    """nbval over the notebooks with the plugin writing to a pipe; (progress lines, log, exit status)."""
    read, write = os.pipe()
    log = tmp_path / "nbval.log"
    with open(log, "w") as fh:
        p = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-p", "tests.nbval_progress", "--nbval", "--nbval-current-env",
                              "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"),   # as the Makefile
                              f"--rootdir={tmp_path}",    # (pytest's node ids of files outside rootdir lose their path)
                              f"--progress-fd={write}", "--progress-label=nbval test", f"--progress-log={log}",
                              *extra, *map(str, notebooks)],
                             cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, pass_fds=(write,))
        os.close(write)
        with os.fdopen(read) as r:
            lines = r.read().splitlines()
        p.wait(timeout=600)
    return lines, log.read_text(), p.returncode


def test_one_line_per_notebook_with_its_result(tmp_path):
    good = notebook(tmp_path / "good.ipynb", [("print(1)", "1\n"), ("x = 2", None), ("print(x)", "2\n")])
    bad = notebook(tmp_path / "bad.ipynb", [("print(1)", "1\n"), ("print(3)", "2\n")])
    lines, log, rc = run_nbval(tmp_path, good, bad)
    assert rc != 0
    assert len(lines) == 2, lines
    assert lines[0].startswith("[nbval test] good.ipynb: passed, 3 cells in ")
    assert lines[1].startswith("[nbval test] bad.ipynb: FAILED 1 of 2 cells (Cell 1) in ")
    assert lines[1].endswith(f"; see {tmp_path / 'nbval.log'}")
    # the log still has pytest's report; the progress lines are not in it
    assert "1 failed" in log and "[nbval test]" not in log


def test_a_notebook_that_cannot_be_read_is_reported(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{ not json")
    lines, _, rc = run_nbval(tmp_path, broken)
    assert rc != 0
    assert lines and lines[0].startswith("[nbval test] ") and "broken.ipynb: could not be collected" in lines[0]


def test_without_the_option_it_is_silent(tmp_path):
    good = notebook(tmp_path / "good.ipynb", [("print(1)", "1\n")])
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.nbval_progress",
                        "--nbval", "--nbval-current-env", str(good)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0 and "[nbval" not in p.stdout


def test_makefile_uses_the_plugin_and_streams_lines():
    makefile = (ROOT / "Makefile").read_text()
    assert "-p tests.nbval_progress --progress-fd=3" in makefile and "$$nbs 3>&1 > $$log" in makefile
    # --output-sync would hold every line back until a kernel's whole run is over
    recipe = makefile[makefile.index("test-notebooks: install"):makefile.index("test-notebooks-busy:")]
    assert "--output-sync" not in recipe and "-j2" in recipe


@pytest.mark.parametrize("fd", [97])
def test_a_closed_descriptor_is_a_clear_error(tmp_path, fd):
    good = notebook(tmp_path / "good.ipynb", [("print(1)", "1\n")])
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.nbval_progress",
                        "--nbval", "--nbval-current-env", f"--progress-fd={fd}", str(good)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "Bad file descriptor" in (p.stdout + p.stderr)
