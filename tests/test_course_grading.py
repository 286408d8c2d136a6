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
import unicodedata
from pathlib import Path

import pytest

from preln.grade import cli, nbtools

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "course"
pytest.importorskip("nbgrader", reason="the course edition needs requirements-course.txt (make test-course)")

#: per-cell time limit for the fixture run (a top-level loop costs this much); a call's limit below
TIMEOUT_S, CALL_TIMEOUT_S = 20, 10
#: the sandbox's memory cap for all its processes: tina's memory hogs must hit it
TOTAL_MEM_MB = 2048
#: graded in this order (a worker grades a student's notebooks in it): kai's derivation_block, whose
#: view holds preln.ops, before its derivation_ops, which looks for what the first one stored
NAMES = ("derivation_block", "derivation_ops", "int8", "preln_vs_postln", "precision", "shape_flow",
         "modern_block", "inference", "many_devices", "real_model")
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
#: derivation_ops' autograded and written points: honest work scores all the autograded ones
AUTO, MANUAL = nbtools.points(nbtools.read(nbtools.source_path("derivation_ops")))
FULL = f"{AUTO:g}"


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
        row = got[cli.inert(student)]                  # the CSV's cell: a formula-like id escaped
        assert row["status"].startswith(want["status"]), f"{name}/{student}: {row['status']!r}"
        if want["scores"] is not None:
            scores = {k: row[k] for k in want["scores"]}
            assert scores == {k: f"{v:g}" for k, v in want["scores"].items()}, f"{name}/{student}: {row}"
            assert row["total"] == f"{sum(want['scores'].values()):g}"


def test_honest_work_full_marks_cheats_zero(graded):
    d = rows(graded["out"] / "derivation_ops.csv")
    assert all(d[s]["total"] == d[s]["possible"] == FULL for s in ("alice", "kim", "liam", "sam", "victor"))
    assert all(d[s]["total"] == "0" for s in ("mallory", "nina", "oscar", "peggy", "judy"))
    i = rows(graded["out"] / "int8.csv")
    assert all(i[s]["total"] == i[s]["possible"] == "31" for s in ("alice", "kim", "liam"))   # 7 questions
    assert all(i[s]["total"] == "0" for s in ("mallory", "oscar", "peggy", "judy"))
    assert i["wendy"]["q3_int8_linear"] == "3"          # quantised in float64: loses "float32 first" only


def test_nothing_outside_the_submissions_changed(graded):
    before, after = graded["before"], graded["after"]
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not changed, changed
    assert graded["other"].read_text() == "student,total,status\nzed,7,ok\n"


def test_a_progress_line_per_notebook(graded):
    lines = [ln for ln in graded["res"].stdout.splitlines() if ln.startswith("[")]
    # missing and refused rows (a link: decided before any worker starts) are not graded notebooks
    n = sum(1 for name in NAMES for s in EXPECTED[name]
            if not EXPECTED[name][s]["status"].startswith(("missing", "failed: refused", "failed: 2 submissions")))
    assert len(lines) == n, lines
    pattern = re.compile(r"^\[\s*\d+/\d+\] \S+/\S+  .+  \d+\.\d s  elapsed \d+:\d\d  ETA \d+:\d\d$")
    assert all(pattern.match(ln) for ln in lines), [ln for ln in lines if not pattern.match(ln)]


def test_feedback_says_what_was_checked(graded):
    fb = graded["out"] / "feedback"
    bob = (fb / "bob" / "derivation_ops.html").read_text()
    # q1 (eps outside the root) scores 0: its failed requirement in the prompt's words, and the check
    assert "HiddenCheckFailed" in bob and "eps inside the square root" in bob and "differ from the reference" in bob
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
    # its core requirement (the values: 21 checks) fails, so its side requirements do not count
    failed = [int(n) for n in re.findall(r"NOT MET: values \(2 points\)[^\n]*\n\s*(\d+) of 21 checks failed", pia)]
    assert "Score: 0 of 5 points: a core requirement failed" in pia and failed and failed[0] >= 18, failed
    bea = _text(fb / "bea" / "preln_vs_postln.html")
    assert "No credit: the code touches the grader's harness: grader_capture (a name)" in bea
    p = rows(graded["out"] / "preln_vs_postln.csv")
    assert p["alice"]["total"] == p["alice"]["possible"] == "21" and p["bea"]["total"] == "0"


# ---- issue 37 and issue 36, items 3-5: ids, rosters, figures, magics, the student's HTML --------
from preln.grade.make_fixtures import FORMULA_ID, NFD_ID, TWO_FOLDERS_ID  # noqa: E402

JOSE = unicodedata.normalize("NFC", NFD_ID)


def test_the_excel_roster_and_mac_names_give_one_row_per_student(graded):
    """roster.csv is saved as Excel's "CSV UTF-8" (a byte-order mark, CRLF), and holds José composed
    and decomposed; José's folder is decomposed (a Mac zip), Zoë has a folder of each form. One row
    per student, under the composed (NFC) id: José full marks, Zoë refused with both folders named,
    and a warning for each collision."""
    raw = (FIXTURES / "roster.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfstudent\r\n") and NFD_ID.encode() in raw and JOSE.encode() in raw
    with open(graded["out"] / "derivation_ops.csv", newline="", encoding="utf-8") as f:
        ids = [r["student"] for r in csv.DictReader(f)]
    assert len(ids) == len({unicodedata.normalize("NFC", i) for i in ids}) == len(set(ids)), ids
    assert all(i == unicodedata.normalize("NFC", i) for i in ids)
    d = rows(graded["out"] / "derivation_ops.csv")
    assert d[JOSE]["total"] == d[JOSE]["possible"] == FULL and d["heidi"]["status"] == "missing"
    assert d[TWO_FOLDERS_ID]["status"].startswith("failed: 2 submissions of one student, in the folders "
                                                  "'Zoe\\u0308', 'Zo\\xeb'"), d[TWO_FOLDERS_ID]
    err = graded["res"].stderr
    assert "the roster spells one student in 2 ways that are the same after Unicode normalisation" in err
    assert "2 folders are one student after Unicode normalisation (NFC)" in err
    assert f"the folder {ascii(NFD_ID)} is not in Unicode NFC" in err
    assert (graded["out"] / "feedback" / JOSE / "derivation_ops.html").is_file()


def _pngs(html):
    return re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)


def test_figures_reach_the_feedback_whole_or_are_said_dropped(graded):
    """mia's plt.show() with no magic (the sandbox's backend is the inline one) and finn's ~300 kB
    figure are in the feedback, whole (the runner cuts text at 64 kB, never an image); finn's figure
    past the limit per PNG is replaced by a line that says so and why. Both keep full marks."""
    import base64
    fb = graded["out"] / "feedback"
    mia = _pngs((fb / "mia" / "derivation_ops.html").read_text())
    assert len(mia) == 1 and base64.b64decode(mia[0])[:8] == b"\x89PNG\r\n\x1a\n"
    finn = (fb / "finn" / "derivation_ops.html").read_text()
    big = [p for p in _pngs(finn) if len(p) > 64 * 1024]
    assert len(big) == 1 and base64.b64decode(big[0])[-8:] == b"IEND\xaeB`\x82", [len(p) for p in _pngs(finn)]
    assert re.search(r"\[grader\] a figure was not kept here: its PNG is \d+ kB, over the grader's limit "
                     r"of 1536 kB per figure", finn)
    d = rows(graded["out"] / "derivation_ops.csv")
    assert d["mia"]["total"] == d["finn"]["total"] == FULL


def test_any_roster_id_grades_and_the_csv_is_inert(graded):
    """x[1] (a glob to nbgrader) and a folder named as a spreadsheet formula grade in full; the
    formula's CSV cell starts with ', and no text cell of any CSV starts like a formula."""
    d = rows(graded["out"] / "derivation_ops.csv")
    assert d["x[1]"]["total"] == d["'" + FORMULA_ID]["total"] == FULL
    assert (graded["out"] / "feedback" / "x[1]" / "derivation_ops.html").is_file()
    assert (graded["out"] / "feedback" / FORMULA_ID / "derivation_ops.html").is_file()
    for name in NAMES:
        for row in rows(graded["out"] / f"{name}.csv").values():
            for key, cell in row.items():
                if cell.startswith(cli.FORMULA_START):
                    float(cell)                          # only a number (none here) may start so


def test_an_answer_in_a_time_or_capture_cell_keeps_its_marks(graded):
    """tess: q1 in a %%capture cell, q3's softmax (which q4's attention calls) in a %%time cell."""
    t = rows(graded["out"] / "derivation_ops.csv")["tess"]
    assert (t["q3_softmax"], t["q4_attention"], t["total"]) == ("4", "4", FULL), t


class _Active(__import__("html.parser").parser.HTMLParser):
    """What in a page could run or restyle: scripts, handlers, frames, forms, styles, script links."""

    def __init__(self):
        super().__init__()
        self.found, self._in = [], None

    def handle_starttag(self, tag, attrs):
        if tag in ("iframe", "frame", "form", "input", "object", "embed", "svg", "math"):
            self.found.append(tag)
        self.found += [f"{tag} {k}" for k, v in attrs if k.startswith("on")
                       or (v or "").strip().lower().startswith("javascript:")]
        self._in = tag if tag in ("script", "style") else None

    def handle_data(self, data):
        if self._in and "XENA" in data:
            self.found.append(f"{self._in}: {data.strip()[:60]}")


def test_the_feedback_runs_none_of_the_students_html(graded):
    """xena's written answer and its own markdown cell hold a script, an img onerror, an iframe, a
    form, a style hiding the failed checks and a fixed "all passed" banner: in the feedback each is
    text or gone, the answer itself is shown, and the grader's score banner is there. Full marks."""
    page = (graded["out"] / "feedback" / "xena" / "derivation_ops.html").read_text()
    parser = _Active()
    parser.feed(page)
    assert parser.found == [], parser.found
    assert "XENA-ANSWER" in page and "XENA-OWN-ANSWER" in page
    assert "&lt;script&gt;document.title" in page                   # shown as what it was
    assert 'style="position: fixed' not in page and 'class="alert alert-success"' not in page
    assert f"derivation_ops (Score: {AUTO:.1f} / {AUTO + MANUAL:.1f})" in page
    assert rows(graded["out"] / "derivation_ops.csv")["xena"]["total"] == FULL


#: issue 32: each of the five mistakes' feedback names the requirement it broke, in words
MISTAKE_WORDS = {
    "lena": ("NOT MET: dtype (1 point)", "dtype float64, expected float32"),
    "axel": ("NOT MET: leading axes (1 point)", "it should sum (or reduce) over every leading axis"),
    "noor": ("NOT MET: all −∞ slices (1 point)", "-inf - (-inf) is NaN"),
    "ines": ("NOT MET: fully masked rows (1 point)", "a finite fill such as -1e9 does this"),
    "hugo": ("NOT MET: dtype (1 point)", "dtype float64, expected float16"),
}


#: issue 32: one honest slip per other assignment (make_fixtures.SLIPS): its requirement, in words
SLIP_WORDS = {
    ("dora", "derivation_block"): ("NOT MET: stale cache (1 point)", "holds the cache of another input"),
    ("ruth", "preln_vs_postln"): ("NOT MET: eps (1 point)", "puts eps inside the square root"),
    ("olga", "precision"): ("NOT MET: growth (1 point)", "the count must restart at 0 when the scale grows"),
    ("sven", "shape_flow"): ("NOT MET: 16-bit dtypes (2 points)", "4 bytes each, not the storage dtype's 2"),
    ("mona", "modern_block"): ("NOT MET: dk and dv (2 points)", "the chain rule sums; it does not average"),
    ("tara", "inference"): ("NOT MET: garbage past the length (2 points)", "must not be read"),
    ("ivo", "many_devices"): ("NOT MET: inputs unchanged (1 point)", "argument `xs` was written in place"),
    ("cora", "real_model"): ("NOT MET: constant groups (1 point)", "the prompt sets S = 1 there"),
    ("nils", "derivation_block"): ("NOT MET: dropout (2 points)", "each dropout undone with its mask"),
    ("lars", "real_model"): ("NOT MET: vectorised (1 point)", "a loop in Python over the data"),
    ("remy", "real_model"): ("NOT MET: no weight matrix (1 point)", "bytes at their peak on this input"),
}


@pytest.mark.parametrize("student, name", sorted(SLIP_WORDS))
def test_a_slip_loses_its_requirement_and_is_told_in_words(graded, student, name):
    text = " ".join(_text(graded["out"] / "feedback" / student / f"{name}.html").split())
    for words in SLIP_WORDS[student, name]:
        assert words in text, (student, words)
    assert text.count("NOT MET") == 1, student


@pytest.mark.parametrize("student", sorted(MISTAKE_WORDS))
def test_a_mistake_loses_its_requirement_and_is_told_in_words(graded, student):
    text = " ".join(_text(graded["out"] / "feedback" / student / "derivation_ops.html").split())
    for words in MISTAKE_WORDS[student]:
        assert words in text, (student, words)
    assert text.count("NOT MET") == 1 and "e+307" not in text, student
    assert re.search(r"Score: \d of \d points\.", text), student
