"""Reading the course's nbgrader notebooks: assignments, questions, solution and hidden-test regions.

Shared by release.py (make assignments), cli.py (make grade), mutate.py (make mutation) and
tests/test_course*.py. The conventions are in assignments/CONVENTIONS.md.

The instructor edition (``source/`` and ``nbgrader_config.py``) is ``preln/grade/edition/``: in a
clone a link to the repository's ``assignments/``, in a wheel a copy of what grading needs (no
``release/``). ``python -m preln.grade --course DIR`` grades against another one (a private fork).
"""
from pathlib import Path
from typing import NamedTuple

import nbformat

HERE = Path(__file__).resolve().parent
#: the course directory: the clone's assignments/ (through the link), or the wheel's copy
COURSE = (HERE / "edition").resolve()
SOURCE = COURSE / "source"
RELEASE = COURSE / "release"
#: the repository when this is a clone (the package's parent holds pyproject.toml), else None
_TOP = HERE.parents[1]
ROOT = _TOP if (_TOP / "pyproject.toml").is_file() and (_TOP / "assignments").is_dir() else None

BEGIN_SOLUTION, END_SOLUTION = "BEGIN SOLUTION", "END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"


def use_course(course):
    """Grade against another instructor edition (``--course DIR``: a directory with
    ``nbgrader_config.py`` and ``source/<name>/<name>.ipynb``)."""
    global COURSE, SOURCE, RELEASE
    course = Path(course).resolve()
    if not (course / "nbgrader_config.py").is_file() or not (course / "source").is_dir():
        raise ValueError(f"course: expected a directory with nbgrader_config.py and source/, got {course}")
    COURSE, SOURCE, RELEASE = course, course / "source", course / "release"


def assignments(source=None):
    """Names of the assignments: every source/<name>/<name>.ipynb, sorted."""
    return sorted(p.parent.name for p in Path(source or SOURCE).glob("*/*.ipynb") if p.stem == p.parent.name)


def source_path(name, source=None):
    return Path(source or SOURCE) / name / f"{name}.ipynb"


def release_path(name, release=None):
    return Path(release or RELEASE) / name / f"{name}.ipynb"


def read(path):
    return nbformat.read(str(path), as_version=4)


def nbgrader_meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def grade_id(cell):
    return nbgrader_meta(cell).get("grade_id")


class Question(NamedTuple):
    key: str           # "q1": the grade_id prefix shared by the prompt, answer and tests cells
    answers: list      # indices of the answer (solution) code cells
    tests: int         # index of the graded tests cell
    points: float


def questions(nb):
    """Autograded questions: each graded code cell ("qk_tests") with the answer cells of its prefix."""
    out = []
    for i, cell in enumerate(nb.cells):
        m = nbgrader_meta(cell)
        if cell.cell_type == "code" and m.get("grade") and not m.get("solution"):
            key = m["grade_id"].split("_")[0]
            answers = [j for j, c in enumerate(nb.cells)
                       if c.cell_type == "code" and nbgrader_meta(c).get("solution")
                       and grade_id(c).split("_")[0] == key]
            out.append(Question(key, answers, i, float(m.get("points", 0))))
    return out


def graded_cells(nb):
    """(grade_id, points, kind) of every cell that carries points; kind 'auto' or 'manual'."""
    out = []
    for cell in nb.cells:
        m = nbgrader_meta(cell)
        if m.get("grade"):
            kind = "auto" if cell.cell_type == "code" and not m.get("solution") else "manual"
            out.append((m["grade_id"], float(m.get("points", 0)), kind))
    return out


def points(nb):
    """(autograded, manually graded) points of an assignment notebook."""
    cells = graded_cells(nb)
    return (sum(p for _, p, k in cells if k == "auto"), sum(p for _, p, k in cells if k == "manual"))


def column_name(nb, gid):
    """CSV column of a graded cell: the answer's grade_id for "qk_tests" (e.g. q1_layer_norm_forward)."""
    if gid.endswith("_tests"):
        key = gid.split("_")[0]
        names = [grade_id(c) for c in nb.cells
                 if nbgrader_meta(c).get("solution") and grade_id(c).split("_")[0] == key]
        if len(names) == 1:
            return names[0]
    return gid


def regions(source, begin, end):
    """Lines strictly between each ``begin`` and ``end`` delimiter line, as (line index, text)."""
    out, inside = [], False
    for i, line in enumerate(source.split("\n")):
        if begin in line:
            inside = True
        elif end in line:
            inside = False
        elif inside:
            out.append((i, line))
    return out


def without_hidden(source):
    """``source`` without its hidden-test regions and their delimiter lines (one pass: linear)."""
    hidden = {i for i, _ in regions(source, BEGIN_HIDDEN, END_HIDDEN)}
    return "\n".join(ln for i, ln in enumerate(source.split("\n"))
                     if i not in hidden and BEGIN_HIDDEN not in ln and END_HIDDEN not in ln)


def secret_lines(nb):
    """Every non-trivial line a student must not see: solutions, hidden tests, written model answers.

    A line that also appears in a public part of the source (a self-check repeated in the hidden
    tests, say) is not a secret, nor is an import.
    """
    secret, public = set(), set()
    for cell in nb.cells:
        m = nbgrader_meta(cell)
        lines = cell.source.split("\n")
        hidden = set()
        if m.get("solution"):
            if cell.cell_type == "markdown" and BEGIN_SOLUTION not in cell.source:
                hidden = set(range(len(lines)))                   # the whole cell is the model answer
            else:
                hidden = {i for i, _ in regions(cell.source, BEGIN_SOLUTION, END_SOLUTION)}
        if m.get("grade"):
            hidden |= {i for i, _ in regions(cell.source, BEGIN_HIDDEN, END_HIDDEN)}
        for i, ln in enumerate(lines):
            (secret if i in hidden else public).add(ln.strip())
    return {ln for ln in secret - public
            if len(ln) > 3 and ln not in TRIVIAL and not ln.startswith(("import ", "from "))}


#: lines that may legitimately appear in both editions (stubs, brackets, bare keywords)
TRIVIAL = {"pass", "else:", "try:", "finally:", "return", "continue", "break", "YOUR ANSWER HERE",
           "raise NotImplementedError()", "# YOUR CODE HERE", ")", "]", "})", "])", "))"}
