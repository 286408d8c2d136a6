"""The course edition, slow part 3 (`make test-course`): what is not a notebook is refused, and the
grader's own work on a notebook is bounded (issue 22, items 1 and 2).

A class is made here, at test time, of what git cannot hold — a FIFO, a socket, a device, a hard
link — next to an honest student whose folder also holds a FIFO and a link (never opened, never
followed: the run must not hang on them), a notebook with an oversized cell, and notebooks whose
size used to make the grader's own steps quadratic (a hidden-tests marker in a 12,000-line
markdown cell; a 12,000-line cell with 60 magics for the name check). The links git can hold are
in the fixture class (xavier, yara, zack: tests/test_course_grading.py). A second run checks the
wall-clock limit on one notebook's work: the worker is stopped, its row says so, and the same
student's next notebook and the rest of the class are graded.
"""
import csv
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest

from preln.grade import nbtools

ROOT = Path(__file__).resolve().parents[1]
SUBS = ROOT / "tests" / "fixtures" / "course" / "submissions"
pytest.importorskip("nbgrader", reason="the course edition needs requirements-course.txt (make test-course)")

NAME = "derivation_ops"
#: its autograded points, as the grades CSV writes them: honest work scores all of them
FULL = f"{nbtools.points(nbtools.read(nbtools.source_path(NAME)))[0]:g}"
#: what a refused or bounded class may take at most, start to end, on a loaded 2-core machine
#: (a quadratic step would take minutes: 55 s for the 12,000-line cell alone)
RUN_LIMIT_S = 300
#: the per-notebook limit of the second run: far above an honest notebook's ~10 s, far below the
#: 60 s cell timeout the looping notebook would otherwise wait for
NOTEBOOK_S = 30


#: the first run's cell time limit (the patient student's cells sleep twice as long)
CELL_S = 15
# a softmax through scipy's (alice's own code where a row is all -inf, which scipy turns into NaN)
SCIPY_SOFTMAX = """import scipy.special

def softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    if np.isfinite(m).all():
        return scipy.special.softmax(x, axis=axis)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return e / np.where(s == 0, 1, s)
"""
_OWN = """def _softmax(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return e / np.where(s == 0, 1, s)
"""
# the answer's name bound to a lambda (q4's attention calls it: a global that is the notebook's own)
LAMBDA_SOFTMAX = _OWN + "\nsoftmax = lambda x, axis=-1: _softmax(x, axis)\n"
# a MaskedArray with nothing masked
MASKED_SOFTMAX = _OWN + "\ndef softmax(x, axis=-1):\n    return np.ma.masked_array(_softmax(x, axis))\n"


def answer(nb, grade_id, source):
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    cell.source = source
    return nb


def honest(student="alice", name=NAME):
    return nbformat.read(str(SUBS / student / name / f"{name}.ipynb"), as_version=4)


def write(nb, subs, student, name=NAME):
    path = subs / student / name / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def completed(res, *ours):
    """The run finished and graded everything. Its own after-run check (exit status 3 when a file
    outside the sandboxes changed) is tested by test_course_grading.py on a quiet tree; here the
    repository may be edited meanwhile, so a 3 passes only if none of the changes is ours."""
    text = res.stdout[-3000:] + res.stderr[-3000:]
    assert res.returncode in (0, 3), text
    assert "make grade: " in res.stdout and " notebook(s) in " in res.stdout, text
    if res.returncode == 3:
        changed = [ln for ln in res.stderr.splitlines() if ln.startswith("  ")]
        assert changed and not [ln for ln in changed if any(str(p) in ln for p in ours)], text


def rows(path):
    with open(path, newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def grade(subs, out, *extra):
    cmd = [sys.executable, "-m", "preln.grade", str(subs), "--out", str(out), "--assignment", NAME,
           "--jobs", "2", "--no-feedback", *extra]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * RUN_LIMIT_S)
    return res, time.monotonic() - t0


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusals")
    subs = tmp / "class"
    alice = write(honest(), subs, "alice")
    os.mkfifo(alice.parent / "notes.fifo")                    # never opened: no hang
    (alice.parent / "passwd.link").symlink_to("/etc/passwd")  # never followed
    made = {}
    (subs / "fifo" / NAME).mkdir(parents=True)
    os.mkfifo(subs / "fifo" / NAME / f"{NAME}.ipynb")          # opening it would block the grader
    made["fifo"] = "failed: refused: derivation_ops.ipynb is a FIFO"
    sock_path = subs / "sock" / NAME / f"{NAME}.ipynb"
    sock_path.parent.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    made["sock"] = "failed: refused: derivation_ops.ipynb is a socket"
    dev = subs / "dev" / NAME / f"{NAME}.ipynb"
    dev.parent.mkdir(parents=True)
    try:
        os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers (root only)
        made["dev"] = "failed: refused: derivation_ops.ipynb is a device"
    except PermissionError:
        shutil.rmtree(dev.parent.parent)
    outside = tmp / "outside.ipynb"                            # e.g. an instructor's file
    nbformat.write(honest(), str(outside))
    (subs / "hard" / NAME).mkdir(parents=True)
    os.link(outside, subs / "hard" / NAME / f"{NAME}.ipynb")
    made["hard"] = "failed: refused: derivation_ops.ipynb has 2 hard links"
    (subs / "folder").mkdir()
    (subs / "folder" / NAME).symlink_to(alice.parent, target_is_directory=True)
    made["folder"] = "failed: refused: the folder derivation_ops/ is a symbolic link"
    big = honest()
    big.cells.append(nbformat.v4.new_code_cell("# " + "x" * (300 * 1024)))
    write(big, subs, "bigcell")
    made["bigcell"] = "failed: refused: cell"
    scan = honest()                                            # quadratic hidden-region scan: 55 s before
    scan.cells.append(nbformat.v4.new_markdown_cell("BEGIN HIDDEN TESTS\n" + "x\n" * 12000))
    write(scan, subs, "scan")
    magics = honest()                                          # IPython's transform_cell: once per magic
    magics.cells.append(nbformat.v4.new_code_cell(
        "".join("%time _ = 1\n" if i % 200 == 0 else f"v{i} = {i}\n" for i in range(12000))))
    write(magics, subs, "magics")
    # honest but unusual (issue 22, item 5): each must get full marks
    printer = honest()                                         # an 80 MB debugging print: cut, not failed
    printer.cells.append(nbformat.v4.new_code_cell("print('x' * 80_000_000)"))
    write(printer, subs, "printer")
    patient = honest()                                         # four experiments past the cell time limit:
    for _ in range(4):                                         # each costs its cell, not a kernel session
        patient.cells.append(nbformat.v4.new_code_cell(f"import time\ntime.sleep({2 * CELL_S})"))
    write(patient, subs, "patient")
    write(answer(honest(), "q3_softmax", SCIPY_SOFTMAX), subs, "scipy")
    write(answer(honest(), "q3_softmax", LAMBDA_SOFTMAX), subs, "lam")
    masked = answer(honest(), "q3_softmax", MASKED_SOFTMAX)    # q4 uses the plain one: numpy's
    q4 = next(c for c in masked.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q4_attention")
    answer(masked, "q4_attention", q4.source.replace("return softmax(", "return _softmax("))   # MaskedArray @ raises
    write(masked, subs, "masked")
    try:
        res, seconds = grade(subs, tmp / "out", "--timeout", str(CELL_S))
    finally:
        sock.close()
    return {"res": res, "seconds": seconds, "rows": rows(tmp / "out" / f"{NAME}.csv"), "made": made, "tmp": tmp}


def test_the_run_completes_in_bounded_time(refused):
    completed(refused["res"], refused["tmp"])
    assert refused["seconds"] < RUN_LIMIT_S, refused["seconds"]


@pytest.mark.parametrize("student", ["fifo", "sock", "dev", "hard", "folder", "bigcell"])
def test_what_is_not_a_notebook_is_refused(refused, student):
    if student not in refused["made"]:
        pytest.fail(f"{student}: could not be made here")
    row = refused["rows"][student]
    assert row["status"].startswith(refused["made"][student]), row
    assert row["total"] == ""


@pytest.mark.parametrize("student", ["alice", "scan", "magics", "printer", "patient", "scipy", "lam", "masked"])
def test_the_rest_is_graded_in_full(refused, student):
    row = refused["rows"][student]
    assert row["status"] == "ok" and row["total"] == row["possible"] == FULL, row


def test_a_notebook_past_its_time_limit_costs_its_row_only(tmp_path):
    subs = tmp_path / "class"
    write(honest(), subs, "alice")
    loop = honest()                                            # the answers, then a cell that never ends
    loop.cells.append(nbformat.v4.new_code_cell("while True:\n    pass"))
    write(loop, subs, "loop")
    write(honest(name="int8"), subs, "loop", name="int8")       # the same student's next notebook
    cmd = [sys.executable, "-m", "preln.grade", str(subs), "--out", str(tmp_path / "out"), "--assignment", NAME,
           "--assignment", "int8", "--jobs", "1", "--no-feedback", "--timeout", "60",
           "--notebook-s", str(NOTEBOOK_S)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * RUN_LIMIT_S)
    completed(res, tmp_path)
    d, i = rows(tmp_path / "out" / f"{NAME}.csv"), rows(tmp_path / "out" / "int8.csv")
    assert d["loop"]["status"].startswith(f"failed: grading this notebook took longer than {NOTEBOOK_S} s"), d["loop"]
    assert "stopped" in d["loop"]["status"]
    assert d["alice"]["total"] == FULL and i["alice"]["status"] == "missing"
    assert i["loop"]["status"] == "ok" and i["loop"]["total"] == i["loop"]["possible"], i["loop"]


# ---- issue 22 items 4 and 6: nothing hidden reaches the feedback; a course secret keeps honest marks
#: a student cell that looks for the hidden calls before they are handed over (root-only files in
#: /job/calls; the capture's copy appears only after every student cell has run)
SNOOP_CELL = """import os, glob
print("NORMAL" + "-CELL-OUT")    # the marker is output, not source
for d in ("/job/calls", os.environ.get("PRELN_GRADER_CALLS", "/tmp/calls")):
    for p in glob.glob(os.path.join(d, "*")):
        try:
            print(p, open(p).read())
        except OSError as e:
            print(p, "unreadable:", type(e).__name__)
"""
# a softmax that prints its (hidden) inputs at full precision while the grader's calls run
SNOOP_SOFTMAX = _OWN + """
def softmax(x, axis=-1):
    print("DURING" + "-HIDDEN-OUT", [repr(float(v)) for v in np.ravel(x)[:8] if np.isfinite(v)])
    return _softmax(x, axis)
"""


def test_feedback_shows_no_hidden_input_and_a_secret_keeps_honest_marks(tmp_path):
    from preln.grade import checks, nbtools, wire
    secret = "a course secret for this test"
    (tmp_path / "secret").write_text(secret + "\n")
    subs = tmp_path / "class"
    write(honest(), subs, "alice")
    snoop = answer(honest(), "q3_softmax", SNOOP_SOFTMAX)
    snoop.cells.insert(1, nbformat.v4.new_code_cell(SNOOP_CELL))
    write(snoop, subs, "snoop")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "preln.grade", str(subs), "--out", str(out), "--assignment", NAME,
           "--jobs", "2", "--timeout", str(CELL_S), "--secret-file", str(tmp_path / "secret")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * RUN_LIMIT_S)
    completed(res, tmp_path)
    got = rows(out / f"{NAME}.csv")
    for student in ("alice", "snoop"):             # honest answers: full marks under the secret
        assert got[student]["status"] == "ok" and got[student]["total"] == got[student]["possible"] == FULL, got
    html = "\n".join(p.read_text(errors="replace") for p in out.rglob("*.html") if "snoop" in str(p))
    assert "NORMAL-CELL-OUT" in html                    # the feedback is there, with the cell's own output
    assert "DURING-HIDDEN-OUT" not in html
    # the hidden inputs of q3 under this secret (and the published ones): none appears
    hidden = set()
    for s in (secret, ""):
        qp = checks.build_plan(nbtools.source_path(NAME), s).questions["q3"]
        for c in qp.calls:
            args, _ = wire.decode(qp.batch.trees[c["input"]], qp.batch.blobs, trusted=False)
            # the random entries, printed in full (a short literal such as 0.5 is in any notebook)
            hidden |= {r for r in (repr(float(v)) for v in np.ravel(args[0])[:8] if np.isfinite(v)) if len(r) >= 15}
    assert hidden
    assert not [v for v in hidden if v in html], "hidden inputs in the feedback"
    if os.geteuid() == 0:                           # root-only files: the cell found nothing to read
        assert "/job/calls/" not in html


# ---- issue 36, item 2: the grader's own work on a notebook is bounded before and after the sandbox
#: what a notebook may hold before the grader parses it (preln/grade/cli.py)
from preln.grade import cli  # noqa: E402
from preln.grade import feedback as feedback_html  # noqa: E402

#: a written answer mistune takes quadratic time on (100,000 characters took 90 s to render)
BRACKETS = "[a](" * 25_000
#: the feedback of one notebook, rendering included, on a loaded 2-core machine (unbounded: minutes)
FEEDBACK_S = 60


def test_the_grader_bounds_its_own_work_on_a_notebook(tmp_path):
    """A notebook too wide (a cell's metadata holding more empty lists than a notebook has lists
    and objects) or too deep is refused by a scan of its bytes before any parse, with the reason in
    its row; a written answer of 100,000 characters of nested brackets is rendered from a bounded
    copy (the feedback says what it left out) in bounded time, with full marks; the rest of the
    class is graded."""
    subs = tmp_path / "class"
    write(honest(), subs, "alice")
    wide = honest()
    wide.cells[0].metadata["wide"] = [[] for _ in range(cli.MAX_CONTAINERS + 1)]
    write(wide, subs, "wide")
    deep = honest()
    nest = []
    for _ in range(cli.MAX_DEPTH + 1):
        nest = [nest]
    deep.cells[0].metadata["deep"] = nest
    write(deep, subs, "deep")
    fat = honest()                                   # few containers, but megabytes of metadata
    fat.cells[0].metadata["fat"] = "x" * (cli.MAX_METADATA_KB * 1024 + 1)
    write(fat, subs, "fat")
    many = honest()
    many.cells += [nbformat.v4.new_markdown_cell("") for _ in range(cli.MAX_CELLS)]
    write(many, subs, "many")
    long_md = honest()
    written = next(c for c in long_md.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "w1_choices")
    written.source = "LONG-ANSWER " + BRACKETS
    write(long_md, subs, "longmd")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "preln.grade", str(subs), "--out", str(out), "--assignment", NAME,
           "--jobs", "2", "--timeout", str(CELL_S), "--verbose"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * RUN_LIMIT_S)
    completed(res, tmp_path)
    got = rows(out / f"{NAME}.csv")
    assert got["wide"]["status"].startswith(f"failed: refused: the notebook holds more than "
                                            f"{cli.MAX_CONTAINERS:,} JSON lists and objects"), got["wide"]
    assert got["deep"]["status"].startswith("failed: refused: the notebook's JSON is nested"), got["deep"]
    assert got["fat"]["status"].startswith("failed: refused: the notebook's metadata"), got["fat"]
    n_many = cli.MAX_CELLS + len(honest().cells)
    assert got["many"]["status"].startswith(f"failed: refused: the notebook has {n_many:,} cells"), got["many"]
    for student in ("alice", "longmd"):
        assert got[student]["status"] == "ok" and got[student]["total"] == FULL, got[student]
    page = (out / "feedback" / "longmd" / f"{NAME}.html").read_text()
    assert "LONG-ANSWER" in page
    assert f"[... {len(BRACKETS) + 12 - feedback_html.MAX_MARKDOWN_CELL} more characters not shown in the feedback" in page
    seconds = [float(m) for m in re.findall(r"feedback (\d+\.\d) s", res.stdout)]
    assert seconds and max(seconds) < FEEDBACK_S, res.stdout[-2000:]


def test_the_shape_check_passes_every_fixture_notebook():
    """Every notebook of the fixture class is far below the shape limits (none is refused by them)."""
    for path in SUBS.glob("*/*/*.ipynb"):
        if path.is_file() and not path.is_symlink():
            assert cli.shape_refusal(path.read_bytes()) is None, path
            try:
                raw = json.loads(path.read_bytes())
            except ValueError:                       # the fixtures that are no JSON at all
                continue
            assert cli.size_refusal(raw) is None, path


#: a worker's cap in the test below, measured here by bisecting the cap: an honest notebook needs
#: 450-550 MB (the worker's own libraries included); the heavy one, HEAVY_MB of ASCII and one emoji,
#: 1100-1300 MB: the emoji makes Python store every character of the string in 4 bytes (PEP 393), so
#: each of its copies (nbformat, nbgrader, the grader) holds 4 * HEAVY_MB. With 60 ASCII MB alone the
#: run on CI's machine stayed under a 900 MB cap: how many copies are made varies between machines
TEST_WORKER_MB, HEAVY_MB = 800, 60
WIDE = "\N{GRINNING FACE}"


def test_the_worker_has_a_memory_cap_of_its_own(tmp_path):
    """A notebook under every size limit (a 60 MB output, 240 MB as a string) whose parses and copies take the grading
    worker past its address-space cap (--worker-mem-mb) loses its row, with the reason; the honest one is graded."""
    subs = tmp_path / "class"
    write(honest(), subs, "alice")
    heavy = honest()                                 # the blob in an output: under the metadata cap
    code = next(c for c in heavy.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * (HEAVY_MB * 2 ** 20) + WIDE)]
    write(heavy, subs, "heavy")
    res, _ = grade(subs, tmp_path / "out", "--timeout", str(CELL_S), "--worker-mem-mb", str(TEST_WORKER_MB))
    completed(res, tmp_path)
    got = rows(tmp_path / "out" / f"{NAME}.csv")
    assert got["heavy"]["status"] == (f"failed: grading this notebook needed more than {TEST_WORKER_MB} MB in "
                                      "the grader's own worker (--worker-mem-mb)"), got["heavy"]
    assert got["alice"]["status"] == "ok" and got["alice"]["total"] == FULL, got["alice"]
