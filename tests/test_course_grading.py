"""The course edition, slow part 2 (`make test-course`): the fixture class in tests/fixtures/course/
grades, with nbgrader in capped kernels, to the expected CSV — a correct, a partly wrong, a raising,
a looping, a memory-hungry, a library-calling and an untouched submission, a corrupt and a
metadata-stripped file, and a roster student who submitted nothing."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "course"
pytest.importorskip("nbgrader", reason="the course edition needs requirements-course.txt (make test-course)")

#: per-cell timeout for the fixture run: the looping answer costs this much; a correct tests cell
#: takes < 1 s
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out = tmp_path_factory.mktemp("grades")
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "course" / "grade.py"),
                          str(FIXTURES / "submissions"), "--roster", str(FIXTURES / "roster.csv"),
                          "--out", str(out), "--assignment", "derivation_ops", "--timeout", str(TIMEOUT_S)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_is_the_expected_one(graded):
    got, want = rows(graded / "derivation_ops.csv"), rows(FIXTURES / "expected" / "derivation_ops.csv")
    assert [r["student"] for r in got] == [r["student"] for r in want]
    for g, w in zip(got, want):
        assert g == w, f"{g['student']}: got {g}, expected {w}"


def test_statuses_and_scores(graded):
    by = {r["student"]: r for r in rows(graded / "derivation_ops.csv")}
    assert by["alice"]["total"] == by["alice"]["possible"] == "20"           # the solutions: full marks
    assert by["judy"]["total"] == "0"                                          # the untouched notebook
    assert by["heidi"]["status"] == "missing"
    assert by["erin"]["status"].startswith("failed: not a readable notebook")
    assert by["frank"]["status"].startswith("failed: nbgrader metadata missing")
    assert by["dave"]["q5_gelu"] == "0" and by["dave"]["total"] == "17"       # the loop loses q5 only
    assert by["grace"]["q4_attention"] == "0" and by["grace"]["total"] == "16"  # the allocation: q4 only
    assert by["ivan"]["q3_softmax"] == "0"                                     # calls preln.ops.softmax


def test_feedback_next_to_the_csv(graded):
    for student in ("alice", "bob", "dave", "grace"):
        html = graded / "feedback" / student / "derivation_ops.html"
        assert html.exists(), html
    text = (graded / "feedback" / "grace" / "derivation_ops.html").read_text()
    assert "MemoryError" in text                        # killed by the kernel's address-space cap
    assert "CellTimeoutError" in (graded / "feedback" / "dave" / "derivation_ops.html").read_text()
