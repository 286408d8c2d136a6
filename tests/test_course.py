"""The course edition, fast part: preln.course (the "no credit for calling preln" check) and the
structure every assignment in assignments/source/ must have (assignments/CONVENTIONS.md).

The slow part (executing the notebooks, grading the fixture class, mutation) is in
tests/test_course_*.py and runs under `make test-course`.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

import preln.ops
from preln.course import assert_does_not_use, names_used
from preln.ops import softmax as renamed_softmax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "course"))
import nbtools  # noqa: E402

NAMES = nbtools.assignments()
MIN_QUESTIONS, MAX_QUESTIONS = 4, 8


# --- preln.course.assert_does_not_use --------------------------------------------------------
def softmax(x):                       # "the student's own" softmax, defined in this module
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def own(x):
    return softmax(x) * 2


def via_attribute(x):
    return preln.ops.softmax(x)


def via_alias(x):
    return renamed_softmax(x)


def via_import(x):
    from preln.ops import softmax_forward
    return softmax_forward(x)[0]


def via_helper(x):                   # the library call hides one level down, in a notebook function
    return via_alias(x)


def via_lambda(x):
    return (lambda y: preln.ops.softmax(y))(x)


def both(x):                         # its own softmax AND the library's: still no credit
    return softmax(x) + preln.ops.softmax(x)


def make_closure():
    sm = renamed_softmax

    def inner(x):
        return sm(x)
    return inner


class Callable:
    def __call__(self, x):
        return preln.ops.softmax(x)


FORBIDDEN = ["softmax", "softmax_forward"]


def test_own_code_passes():
    assert_does_not_use(own, FORBIDDEN)
    assert_does_not_use(softmax, FORBIDDEN)


@pytest.mark.parametrize("fn", [via_attribute, via_alias, via_import, via_helper, via_lambda, both,
                                make_closure(), Callable()],
                         ids=["attribute", "alias", "import", "helper", "lambda", "both", "closure",
                              "callable"])
def test_library_use_is_caught(fn):
    with pytest.raises(AssertionError, match="No credit"):
        assert_does_not_use(fn, FORBIDDEN)


def test_names_used_follows_notebook_functions():
    names = {name for name, _ in names_used(via_helper)}
    assert {"via_alias", "renamed_softmax"} <= names


def test_bad_arguments():
    with pytest.raises(TypeError, match="forbidden"):
        assert_does_not_use(own, "softmax")
    with pytest.raises(TypeError, match="fn"):
        names_used(np.exp)


# --- every assignment follows the conventions -------------------------------------------------
@pytest.fixture(params=NAMES)
def source(request):
    return request.param, nbtools.read(nbtools.source_path(request.param))


def test_there_are_assignments():
    assert "derivation_ops" in NAMES


def test_questions_and_points(source):
    name, nb = source
    qs = nbtools.questions(nb)
    assert MIN_QUESTIONS <= len(qs) <= MAX_QUESTIONS, (name, len(qs))
    ids = [nbtools.grade_id(c) for c in nb.cells if nbtools.nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), f"{name}: duplicate grade_ids"
    for q in qs:
        assert q.answers, f"{name} {q.key}: a tests cell without an answer cell"
        assert q.points > 0, f"{name} {q.key}: no points"
        tests = nb.cells[q.tests].source
        assert nbtools.BEGIN_HIDDEN in tests and nbtools.END_HIDDEN in tests, f"{name} {q.key}: no hidden tests"
        hidden = "\n".join(t for _, t in nbtools.regions(tests, nbtools.BEGIN_HIDDEN, nbtools.END_HIDDEN))
        assert "assert_does_not_use" in hidden, f"{name} {q.key}: hidden tests never check for library calls"
        for i in q.answers:
            assert nbtools.regions(nb.cells[i].source, nbtools.BEGIN_SOLUTION, nbtools.END_SOLUTION), \
                f"{name} {q.key}: answer cell without a solution region"
    manual = [g for g in nbtools.graded_cells(nb) if g[2] == "manual"]
    assert 1 <= len(manual) <= 2, f"{name}: expected 1-2 written answers, got {len(manual)}"


def test_first_cell_states_time_and_points(source):
    name, nb = source
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), name
    total = sum(p for _, p, _ in nbtools.graded_cells(nb))
    assert f"{total:g}" in first.source, f"{name}: the header should state the total, {total:g} points"
    assert "hour" in first.source or "minutes" in first.source, f"{name}: the header should state the time"


def test_secret_lines_are_found():
    nb = nbtools.read(nbtools.source_path("derivation_ops"))
    secrets = nbtools.secret_lines(nb)
    assert any("keepdims=True" in s for s in secrets)              # a solution line
    assert any("assert_does_not_use" in s for s in secrets)        # a hidden-test line
    assert any("Model answer" in s for s in secrets)               # the written answer's scheme


# --- the Course page and the instructor guide list the released assignments -------------------
def test_pages_list_every_released_assignment():
    import release
    assert release.update_pages(NAMES, check=True) == [], "run `make assignments`"
    course = (nbtools.ROOT / "book" / "course.md").read_text()
    for name in NAMES:
        path = f"assignments/release/{name}/{name}.ipynb"
        assert (nbtools.ROOT / path).is_file(), f"{path} is missing: run `make assignments`"
        assert f"<../{path}>" in course, f"book/course.md does not link {path}"
        assert f"colab.research.google.com/github/" in course and f"mybinder.org/v2/gh/" in course


def test_course_page_loads_nothing_from_elsewhere():
    course = (nbtools.ROOT / "book" / "course.md").read_text()
    for pattern in ("<img", "<script", "<iframe", "![", "badge"):
        assert pattern not in course, f"book/course.md: {pattern!r} would load from another origin"


def test_toc_has_course_page_after_running():
    toc = (nbtools.ROOT / "_toc.yml").read_text()
    assert toc.index("- file: book/running") < toc.index("- file: book/course")


def test_setup_cell_makes_preln_importable_anywhere(source):
    """The student notebook must run on Binder and Colab too: its setup cell finds the repository
    above the notebook or installs the package from _config.yml's repository."""
    import release
    name, nb = source
    setup = next(c for c in nb.cells if nbtools.grade_id(c) == "setup")
    repo, _ = release.repository()
    assert "except ModuleNotFoundError" in setup.source and "Path.cwd" in setup.source, name
    assert f"git+https://github.com/{repo}" in setup.source, f"{name}: installs from another repository"
