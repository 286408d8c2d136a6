"""The course edition, slow part 2 (`make test-course`): the fixture class of tests/fixtures/course/
graded by `make grade`'s script, sandboxed, two students at a time, on derivation_ops and int8 (and
issue 22's students on derivation_block and preln_vs_postln).

Honest work in any style (einsum, loops, other formulas, a computation that warns on stderr) gets
full marks; every cheat (preln/grade/make_fixtures.py lists them: reading the solutions from
disk, patching numpy and the grader's helpers, calling the library directly and through getattr,
an AST transformer, the gradebook, the CSVs, a planted sitecustomize.py, writes into the
repository) gets 0; each hostile submission (kills its parent, os._exit, a fork bomb, a memory
hog, an infinite loop) costs at most its own row; the run completes, and nothing outside the
submissions' sandboxes changes — checked here independently of the grader's own check."""
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "course"
pytest.importorskip("nbgrader", reason="the course edition needs requirements-course.txt (make test-course)")

#: per-cell time limit for the fixture run (a top-level loop costs this much); a call's limit below
TIMEOUT_S, CALL_TIMEOUT_S = 20, 10
#: the sandbox's memory cap for all its processes: tina's memory hogs must hit it
TOTAL_MEM_MB = 2048
#: graded in this order (a worker grades a student's notebooks in it): kai's derivation_block, whose
#: view holds preln.ops, before its derivation_ops, which looks for what the first one stored
NAMES = ("derivation_block", "derivation_ops", "int8", "preln_vs_postln")
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def fingerprint(*roots):
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


PROTECTED = [FIXTURES, ROOT / "assignments", ROOT / "scripts", ROOT / "preln", ROOT / "tests" / "test_course_grading.py"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out = tmp_path_factory.mktemp("grades")
    other = out / "some_other_assignment.csv"
    other.write_text("student,total,status\nzed,7,ok\n")
    before = fingerprint(*[p for p in PROTECTED if p.is_dir()])
    cmd = [sys.executable, "-m", "preln.grade", str(FIXTURES / "submissions"),
           "--roster", str(FIXTURES / "roster.csv"), "--out", str(out), "--jobs", "2",
           "--timeout", str(TIMEOUT_S), "--call-timeout", str(CALL_TIMEOUT_S), "--total-mem-mb", str(TOTAL_MEM_MB)]
    for name in NAMES:
        cmd += ["--assignment", name]
    res = subprocess.run(cmd, capture_output=True, text=True)
    after = fingerprint(*[p for p in PROTECTED if p.is_dir()])
    return {"out": out, "res": res, "before": before, "after": after, "other": other}


def rows(path):
    with open(path, newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def test_the_run_completes(graded):
    res = graded["res"]
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "nothing outside the graded notebooks' sandboxes changed" in res.stdout


@pytest.mark.parametrize("name", NAMES)
def test_every_row_is_the_expected_one(graded, name):
    got = rows(graded["out"] / f"{name}.csv")
    for student, want in EXPECTED[name].items():
        row = got[student]
        assert row["status"].startswith(want["status"]), f"{name}/{student}: {row['status']!r}"
        if want["scores"] is not None:
            scores = {k: row[k] for k in want["scores"]}
            assert scores == {k: f"{v:g}" for k, v in want["scores"].items()}, f"{name}/{student}: {row}"
            assert row["total"] == f"{sum(want['scores'].values()):g}"


def test_honest_work_full_marks_cheats_zero(graded):
    d = rows(graded["out"] / "derivation_ops.csv")
    assert all(d[s]["total"] == d[s]["possible"] == "20" for s in ("alice", "kim", "liam", "sam", "victor"))
    assert all(d[s]["total"] == "0" for s in ("mallory", "nina", "oscar", "peggy", "judy"))
    i = rows(graded["out"] / "int8.csv")
    assert all(i[s]["total"] == i[s]["possible"] == "31" for s in ("alice", "kim", "liam"))   # 7 questions
    assert all(i[s]["total"] == "0" for s in ("mallory", "oscar", "peggy", "judy"))
    assert i["wendy"]["q3_int8_linear"] == "0"          # quantised in float64, cast at the end


def test_nothing_outside_the_submissions_changed(graded):
    before, after = graded["before"], graded["after"]
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not changed, changed
    assert graded["other"].read_text() == "student,total,status\nzed,7,ok\n"


def test_a_progress_line_per_notebook(graded):
    lines = [ln for ln in graded["res"].stdout.splitlines() if ln.startswith("[")]
    # missing and refused rows (a link: decided before any worker starts) are not graded notebooks
    n = sum(1 for name in NAMES for s in EXPECTED[name]
            if not EXPECTED[name][s]["status"].startswith(("missing", "failed: refused")))
    assert len(lines) == n, lines
    pattern = re.compile(r"^\[\s*\d+/\d+\] \S+/\S+  .+  \d+\.\d s  elapsed \d+:\d\d  ETA \d+:\d\d$")
    assert all(pattern.match(ln) for ln in lines), [ln for ln in lines if not pattern.match(ln)]


def test_feedback_says_what_was_checked(graded):
    fb = graded["out"] / "feedback"
    bob = (fb / "bob" / "derivation_ops.html").read_text()
    assert "HiddenCheckFailed" in bob and "eps=" in bob and "differ from the reference" in bob
    assert "(x - 2.5)" not in bob and "BEGIN HIDDEN" not in bob          # no hidden code in feedback
    grace = (fb / "grace" / "derivation_ops.html").read_text()      # its hoard hits the memory cap,
    assert "MemoryError" in grace or "time limit" in grace           # or the time limit on a busy machine
    assert "time limit" in (fb / "dave" / "derivation_ops.html").read_text()
    assert "All" in (fb / "alice" / "int8.html").read_text() or "passed" in (fb / "alice" / "int8.html").read_text()
    liam = (fb / "liam" / "derivation_ops.html").read_text()
    assert "softmax: computed" in liam                # its stderr is shown, and costs nothing
    assert "<script>alert" not in liam


def _text(path):
    import html
    return html.unescape(re.sub(r"<[^>]+>", "", Path(path).read_text(errors="replace")))


def test_issue_22_verdicts_cannot_be_read_or_steered(graded):
    """The hidden inputs stay out of the feedback (sol prints them and updates an earlier cell's
    display handle with them while the calls run); kai's keyring relay finds nothing; pia's
    candidate-picking Adam fails q2; bea's in-place Adam with the patched harness gets no credit;
    the honest answer keeps full marks with every `unchanged` argument handed over read-only."""
    fb = graded["out"] / "feedback"
    sol = _text(fb / "sol" / "derivation_ops.html")
    assert "'SNOOP waiting'" in sol            # the display's own output (a repr), never updated
    assert not any(k in sol for k in ('"blobs"', "call_timeout", "k05VTVBZ")), "hidden inputs in the feedback"
    if os.geteuid() == 0:                      # root-only files: the cell could not read them
        assert "SNOOP now: /job/calls: PermissionError" in sol
    assert "RELAY nothing" in _text(fb / "kai" / "derivation_ops.html")
    pia = _text(fb / "pia" / "preln_vs_postln.html")
    failed = [int(n) for n in re.findall(r"Hidden checks: (\d+) of 24 failed", pia)]
    assert failed and failed[0] >= 21, failed
    bea = _text(fb / "bea" / "preln_vs_postln.html")
    assert "No credit: the code touches the grader's harness: grader_capture (a name)" in bea
    p = rows(graded["out"] / "preln_vs_postln.csv")
    assert p["alice"]["total"] == p["alice"]["possible"] == "21" and p["bea"]["total"] == "0"
