"""The course edition, fast part: the hidden-check API (preln.course), what crosses the sandbox's
boundary (wire.py), the views of preln a question sees (views.py), the static "no credit for
calling preln" check (namecheck.py), and the structure every assignment must have
(assignments/CONVENTIONS.md): its plan builds, its solutions pass it, each question's view
withholds its references.

The slow part (the plans, executing the notebooks, the sandbox, grading the fixture class,
mutation) is in tests/test_course_*.py and runs under `make test-course`.
"""
import collections
import json
import subprocess
import sys
import textwrap

import nbformat
from pathlib import Path

import numpy as np
import pytest

import preln.course as api
from preln.course import arg_after, call, check, close, code, equal, raises, returns, satisfies, unchanged

ROOT = Path(__file__).resolve().parents[1]
from preln.grade import checks  # noqa: E402
from preln.grade import namecheck  # noqa: E402
from preln.grade import nbtools  # noqa: E402
from preln.grade import views  # noqa: E402
from preln.grade import wire  # noqa: E402

NAMES = nbtools.assignments()
MIN_QUESTIONS, MAX_QUESTIONS = 4, 8


# --- preln.course: expectations, evaluated at once in the instructor's kernel -----------------
def fails(what, subject, *expectations):
    with pytest.raises(AssertionError) as e:
        check(what, subject, *expectations)
    return str(e.value)


def test_close_passes_and_names_the_input_and_property():
    x = np.linspace(0, 1, 5)
    check("a ramp", x + 1e-12, close(x, rtol=1e-9, atol=1e-12, what="y"))
    msg = fails("a ramp", x + 1e-3, close(x, rtol=1e-9, what="y"))
    assert msg.startswith("hidden check on a ramp: y: ") and "rtol=1e-09" in msg and "differ" in msg
    assert str(x[1]) not in msg                              # the expected values are not given away


@pytest.mark.parametrize("got, needle", [(np.zeros(4), "shape (4,), expected (5,)"),
                                         (np.zeros(5, np.float32), "dtype float32, expected float64"),
                                         ([0.0] * 5, "a list of 5 items, expected an array"),
                                         (np.full(5, np.nan), "NaN in 5 entries")])
def test_close_checks_type_shape_dtype_nan(got, needle):
    assert needle in fails("zeros", got, close(np.zeros(5), what="y"))


def test_close_handles_inf_and_parts():
    want = np.array([1.0, -np.inf, 0.0])
    check("with -inf", (np.array([1.0, -np.inf, 0.0]), 3), close(want, part=0), equal(3, part=1))
    assert "inf" in fails("with -inf", (np.array([1.0, np.inf, 0.0]), 3), close(want, part=0))
    assert "no item [2]" in fails("a pair", (1, 2), close(1.0, part=2))


def test_equal_is_exact_and_integers_must_be_integers():
    check("counts", {"a": 3, "b": np.int64(4)}, equal({"a": 3, "b": 4}))
    assert "expected an integer" in fails("counts", {"a": 3.0, "b": 4}, equal({"a": 3, "b": 4}))
    assert "keys differ" in fails("counts", {"a": 3}, equal({"a": 3, "b": 4}))
    msg = fails("floats", np.array([0.1 + 0.2]), equal(np.array([0.3]), why="one rounding"))
    assert "bit for bit: one rounding" in msg


def test_raises_returns_satisfies():
    def boom(x):
        raise OverflowError("too big")

    check("a big input", call(boom, 1), raises(OverflowError))
    assert "returned normally" in fails("a small input", call(abs, -1), raises(OverflowError))
    assert "your function raised OverflowError" in fails("a big input", call(boom, 1), close(1.0))
    check("a float", 2.5, returns(float))
    assert "expected float" in fails("an int", 2, returns(float))
    check("a sum", np.ones(3), satisfies(lambda y, n: y.sum() == n, "sums to n", 3))
    assert "rows sum to 1: does not hold" in fails("rows", np.ones(3), satisfies(lambda y: False, "rows sum to 1"))
    assert "could not be checked" in fails("rows", None, satisfies(lambda y: y.sum() > 0, "positive"))


def test_unchanged_and_arg_after_need_the_arguments():
    def in_place(a):
        a += 1
        return a

    def pure(a):
        return a + 1

    a = np.zeros(3)
    check("zeros", call(pure, a), unchanged(0))
    assert "changed argument 0 in place" in fails("zeros", call(in_place, np.zeros(3)), unchanged(0))
    assert "use call(answer" in fails("zeros", pure(a), unchanged(0))
    want = np.random.default_rng(0)
    want.random(4)
    nxt = want.random()
    check("one draw", call(lambda g: g.random(4), np.random.default_rng(0)),
          arg_after(0, satisfies(lambda g, n: g.random() == n, "one draw", nxt)))


def test_call_within_counts_lines_and_bytes_not_time():
    """call_within's limits are counts: a Python loop over the data runs more lines than a vectorised
    answer, one that catches the exception or turns the count off is over all the same, and an array
    larger than the byte limit is over it; within the limits the value comes back."""
    lines, nbytes = 500, 400_000                     # the 10,000 floats below take 80,000 bytes
    x = np.arange(10_000.0)

    def vectorised(v):
        return float((v * 2).sum())

    def loop(v):
        return sum(float(e) for e in v)

    def swallows(v):
        s = 0.0
        for e in v:
            try:
                s += float(e)
            except Exception:                        # noqa: BLE001: the answer hides the limit
                pass
        return s

    def untraced(v):
        sys.settrace(None)
        return loop(v)

    def hog(v):
        return float(np.repeat(v, 8).sum())           # 640,000 bytes at once

    tracer = sys.gettrace()                           # a coverage run's, or None
    ok = api.call_within({"lines": lines, "bytes": nbytes}, vectorised, x)
    assert ok.kind == "value" and ok.value == 2 * x.sum()
    for fn in (loop, swallows, untraced):
        out = api.call_within({"lines": lines}, fn, x)
        assert out.kind == "raised" and out.exc_type == "LimitExceeded" and f"more than {lines} lines" in out.message
    out = api.call_within({"bytes": nbytes}, hog, x)
    assert out.kind == "raised" and "at their peak" in out.message, out.message
    assert api.call_within({"lines": lines}, hog, x).kind == "value"
    assert sys.gettrace() is tracer                   # restored after every call
    for bad in ({}, {"lines": 0}, {"seconds": 3}, [("lines", 5)]):
        with pytest.raises(TypeError, match="limits"):
            api.call_within(bad, vectorised, x)


def test_code_is_a_function_that_keeps_its_source():
    f = code("lambda v: bool(v[0] >= c)", c=2.0)
    assert f(np.array([3.0])) and not f(np.array([1.0]))
    assert f._preln_source == ("lambda v: bool(v[0] >= c)", {"c": 2.0})
    with pytest.raises(TypeError, match="lambda"):
        code("import os")


def test_bad_arguments():
    with pytest.raises(TypeError, match="what"):
        check("", 1, close(1.0))
    with pytest.raises(TypeError, match="at least one expectation"):
        check("x", 1)
    with pytest.raises(TypeError, match="import paths"):
        api.no_credit_for("softmax")
    with pytest.raises(TypeError, match="module names"):
        api.grading_view("ops")


# --- wire.py: data only across the boundary ----------------------------------------------------
Pair = collections.namedtuple("Pair", "a b")


def test_wire_round_trips_data():
    import ml_dtypes
    value = {"x": np.arange(6.0).reshape(2, 3), "i": 7, "big": 10 ** 30, "f": float("nan"), "s": "é",
             "t": (None, True, np.float32(1.5), [1, 2]), 3: np.zeros((), np.int8),
             "bf": np.array([1.5, -2], ml_dtypes.bfloat16), "dt": np.dtype(np.float16), "ty": np.float32}
    back = wire.decode(*wire.encode(value), trusted=True)
    assert back["x"].shape == (2, 3) and back["x"].dtype == np.float64 and np.array_equal(back["x"], value["x"])
    assert back["i"] == 7 and back["big"] == 10 ** 30 and np.isnan(back["f"]) and back["s"] == "é"
    assert back["t"][2].dtype == np.float32 and back["t"][3] == [1, 2] and back[3].shape == ()
    assert back["bf"].dtype == np.dtype(ml_dtypes.bfloat16) and back["dt"] == np.float16 and back["ty"] is np.float32
    g = np.random.default_rng(3)
    g2 = wire.decode(*wire.encode(g), trusted=True)
    assert g2.random() == np.random.default_rng(3).random()


def test_wire_trusted_side_rejects_code_objects_and_bad_arrays():
    tree, blobs = wire.encode(wire.Pickled(object()), allow_pickle=True)
    with pytest.raises(wire.WireError, match="pickle"):
        wire.decode(tree, blobs, trusted=True)
    with pytest.raises(wire.WireError, match="not data"):
        wire.encode(object())
    with pytest.raises(wire.WireError):
        wire.encode(np.array([object()], dtype=object))
    bad = {"t": "array", "blob": "b0"}
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode(bad, {"b0": b"\x93NUMPY garbage"}, trusted=True)
    import io
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(wire.WireError):
        wire.decode(bad, {"b0": buf.getvalue()}, trusted=True)
    deep = {"t": "list", "v": []}
    for _ in range(wire.MAX_DEPTH + 2):
        deep = {"t": "list", "v": [deep]}
    with pytest.raises(wire.WireError, match="deeply"):
        wire.decode(deep, {}, trusted=True)
    assert isinstance(wire.decode(*wire.encode_result(object()), trusted=True), wire.Unsupported)
    # an ndarray subclass is sent as its data; a MaskedArray only with nothing masked (issue 22)
    got = wire.decode(*wire.encode_result(np.matrix([[1.0, 2.0]])), trusted=True)
    assert type(got) is np.ndarray and got.tolist() == [[1.0, 2.0]]
    got = wire.decode(*wire.encode_result(np.ma.masked_array([1.0, 2.0], mask=[False, False])), trusted=True)
    assert type(got) is np.ndarray and got.tolist() == [1.0, 2.0]
    hidden = wire.decode(*wire.encode_result(np.ma.masked_array([1.0, 2.0], mask=[False, True])), trusted=True)
    assert isinstance(hidden, wire.Unsupported) and "masked values" in str(hidden)


def test_wire_namedtuples_and_dataclasses():
    from preln import BlockConfig
    tree, blobs = wire.encode((Pair(1, np.ones(2)), BlockConfig(d_model=8, n_heads=2, d_ff=16)))
    trusted = wire.decode(tree, blobs, trusted=True)
    assert type(trusted[0]) is tuple and isinstance(trusted[1], wire.Unsupported)
    sandbox = wire.decode(tree, blobs, trusted=False)          # the real classes, when importable
    assert sandbox[0].a == 1 and sandbox[1] == BlockConfig(d_model=8, n_heads=2, d_ff=16)
    tree["v"][0]["cls"] = "nowhere:Gone"                      # not in the view: a stand-in, same fields
    stand_in = wire.decode(tree, blobs, trusted=False)[0]
    assert stand_in._fields == ("a", "b") and stand_in.b.shape == (2,)


# --- namecheck.py: the second line of "no credit for calling preln" ---------------------------
REFS = ["preln.ops.softmax", "preln.ops.softmax_forward"]
CASES = {
    "attribute": "import preln.ops\ndef f(x):\n    return preln.ops.softmax(x)",
    "alias": "from preln.ops import softmax as sm\ndef f(x):\n    return sm(x)",
    "import inside": "def f(x):\n    from preln.ops import softmax_forward\n    return softmax_forward(x)[0]",
    "helper": "from preln.ops import softmax as sm\ndef g(x):\n    return sm(x)\ndef f(x):\n    return g(x)",
    "lambda": "import preln.ops\ndef f(x):\n    return (lambda y: preln.ops.softmax(y))(x)",
    "getattr": "import importlib\ndef f(x):\n    return getattr(importlib.import_module('preln.ops'), 'soft' + 'max')(x)",
    "f-string": "import importlib\ndef f(x):\n    m = importlib.import_module('preln.ops')\n    return getattr(m, f'softmax')(x)",
    "global": "import preln.ops\nSM = preln.ops.softmax\ndef f(x):\n    return SM(x)",
    "class": "import preln.ops\nclass C:\n    def __call__(self, x):\n        return preln.ops.softmax(x)\ndef f(x):\n    return C()(x)",
    "magic cell": "%time x = 1\nimport preln.ops\ndef f(x):\n    return preln.ops.softmax(x)",
    # a cell magic whose body IPython runs as code: read as that code (issue 36, item 5)
    "%%capture": "%%capture\nfrom preln.ops import softmax\ndef f(x):\n    return softmax(x)",
    "%%writefile": "%%writefile mine.py\nimport preln.ops\ndef f(x):\n    return preln.ops.softmax(x)",
}


@pytest.mark.parametrize("label", list(CASES))
def test_library_use_is_found(label):
    assert namecheck.forbidden_uses([CASES[label]], ["f"], REFS), label


def test_own_code_is_fine():
    own = ["import numpy as np\ndef softmax(x):\n    e = np.exp(x - x.max())\n    return e / e.sum()",
           "def f(x):\n    softmax_forward = 2\n    return softmax(x) * softmax_forward"]
    assert namecheck.forbidden_uses(own, ["f"], REFS) == []
    assert namecheck.forbidden_uses(["def f(x):\n    return x"], ["f"], ["preln.TransformerBlock.backward"]) == []
    assert namecheck.forbidden_uses(["def f(b, x):\n    return TransformerBlock(b)"], ["f"],
                                    ["preln.TransformerBlock.backward"])
    assert namecheck.forbidden_uses(["def f(:\n"], ["f"], REFS) == []          # unparsable: nothing to find


OWN_SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis, keepdims=True))\n    return e / e.sum(axis, keepdims=True)"
ATTENTION = "def attention(q):\n    return softmax(q)"


@pytest.mark.parametrize("magics", ["%%time", "%%capture", "%%time -o t", "%%capture out\n%%time"])
def test_an_answer_in_a_python_cell_magic_is_the_students_own(magics):
    """q4's attention calls the student's softmax, defined in a cell that starts with %%time or
    %%capture (issue 36, item 5: such a cell used to read as empty, and softmax as preln's)."""
    cells = [f"{magics}\n{OWN_SOFTMAX}", ATTENTION]
    assert namecheck.forbidden_uses(cells, ["attention"], ["preln.ops.softmax"]) == []
    # the same cell under a magic whose body is not Python (a shell script) defines nothing
    bash = [f"%%bash\n{OWN_SOFTMAX}", ATTENTION]
    assert namecheck.forbidden_uses(bash, ["attention"], ["preln.ops.softmax"])


# --- views.py: the package as a graded question sees it ----------------------------------------
def run_in_view(tmp_path, modules, without, script):
    views.build_view(tmp_path, modules, without)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_a_view_withholds_the_rest_of_the_package(tmp_path):
    out = run_in_view(tmp_path, ["preln.nn.config"], [], """
        import importlib, numpy as np
        import preln
        from preln import BlockConfig, TransformerBlock          # imports work: a stand-in
        from preln.ops import softmax
        print(preln.__file__)
        print(BlockConfig(d_model=8, n_heads=2, d_ff=16).d_model)
        for f in (lambda: TransformerBlock(BlockConfig(d_model=8, n_heads=2, d_ff=16)),
                  lambda: softmax(np.zeros(3)),
                  lambda: getattr(importlib.import_module("preln.ops"), "soft" + "max")(np.zeros(3)),
                  lambda: importlib.import_module("preln.ops.softmax").softmax_forward(np.zeros(3)),
                  lambda: preln.TransformerBlock.backward):
            try:
                f()
                print("REACHED")
            except RuntimeError as e:
                print("withheld" if "not available while your notebook is graded" in str(e) else e)
        """)
    lines = out.split()
    assert lines[0].startswith(str(tmp_path)) and lines[1] == "8"
    assert lines[2:] == ["withheld"] * 5
    assert not (tmp_path / "preln" / "block.py").exists() and not (tmp_path / "preln" / "ops" / "softmax.py").exists()


def test_views_resolve_dependencies_and_leaks():
    config = views.resolve(["preln.nn.config"])
    assert {"preln.nn.config", "preln.ops.activations", "preln.precision"} <= config and "preln.nn.block" not in config
    chosen = views.resolve(["preln.ops"], ["preln.ops.softmax"])
    assert "preln.ops.softmax" not in chosen and "preln.ops.layernorm" in chosen
    assert views.leaks(chosen, ["preln.ops.softmax", "preln.ops.layer_norm_forward"]) == ["preln.ops.layer_norm_forward"]
    assert views.leaks(views.resolve(["preln.nn.block"]), ["preln.TransformerBlock.backward"]) == [
        "preln.TransformerBlock.backward"]
    with pytest.raises(ValueError, match="no module"):
        views.resolve(["preln.nothing"])


# --- every assignment follows the conventions ---------------------------------------------------
@pytest.fixture(params=NAMES)
def source(request):
    return request.param, nbtools.read(nbtools.source_path(request.param))


def test_there_are_assignments():
    assert {"derivation_ops", "int8"} <= set(NAMES)


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
        assert nbtools.BEGIN_HIDDEN in tests and nbtools.END_HIDDEN in tests, f"{name} {q.key}: no hidden checks"
        hidden = checks.hidden_region(tests)
        assert "check(" in hidden and "no_credit_for(" in hidden, f"{name} {q.key}: see CONVENTIONS.md"
        assert "assert " not in hidden, f"{name} {q.key}: an assert in a hidden region runs nowhere: use check()"
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


def test_bit_for_bit_only_where_the_question_says_so(source):
    """equal() on floats only where the question's prompt says "bit for bit" (issue 14.5): a
    question's hidden region that passes why= to equal() must say bit for bit in its prompt."""
    name, nb = source
    prompts = {nbtools.grade_id(c).split("_")[0]: c.source for c in nb.cells
               if (nbtools.grade_id(c) or "").endswith("_prompt")}
    for q in nbtools.questions(nb):
        hidden = checks.hidden_region(nb.cells[q.tests].source)
        if "why=" in hidden:
            assert "bit for bit" in prompts[q.key].lower(), f"{name} {q.key}: say 'bit for bit' in the prompt"


def test_secret_lines_are_found():
    nb = nbtools.read(nbtools.source_path("derivation_ops"))
    secrets = nbtools.secret_lines(nb)
    assert any("keepdims=True" in s for s in secrets)              # a solution line
    assert any("check(" in s for s in secrets)                    # a hidden-check line
    assert any("Model answer" in s for s in secrets)               # the written answer's scheme


# --- the Course page and the instructor guide list the released assignments -------------------
def test_pages_list_every_released_assignment():
    from preln.grade import release
    assert release.update_pages(NAMES, check=True) == [], "run `make assignments`"
    course = (nbtools.ROOT / "book" / "course.md").read_text()
    for name in NAMES:
        path = f"assignments/release/{name}/{name}.ipynb"
        assert (nbtools.ROOT / path).is_file(), f"{path} is missing: run `make assignments`"
        assert f"<../{path}>" in course, f"book/course.md does not link {path}"
        assert "colab.research.google.com/github/" in course
    # issue 32: the student edition alone — no Binder (a copy of the repository, sources included),
    # no clone to work in; instructors are pointed to the private-fork section
    told = " ".join(course.split())
    assert "mybinder.org" not in course and "inside a clone" not in told, "book/course.md sends students to the repository"
    assert "Do not work in a clone of the book's repository" in told
    assert "{ref}`private-fork`" in course


def test_course_page_loads_nothing_from_elsewhere():
    course = (nbtools.ROOT / "book" / "course.md").read_text()
    for pattern in ("<img", "<script", "<iframe", "![", "badge"):
        assert pattern not in course, f"book/course.md: {pattern!r} would load from another origin"


def test_toc_has_course_page_after_running():
    toc = (nbtools.ROOT / "_toc.yml").read_text()
    assert toc.index("- file: book/running") < toc.index("- file: book/course")


def test_setup_cell_needs_nothing_the_grader_withholds(source):
    """The setup cell imports only names that exist in every view (stand-ins for the rest), so it
    runs in the sandbox; and it no longer imports the old in-kernel check."""
    name, nb = source
    setup = next(c for c in nb.cells if nbtools.grade_id(c) == "setup")
    assert "assert_does_not_use" not in setup.source, name


def test_feedback_counts_failed_checks_not_failed_expectations():
    """One check with two failing expectations is one failed check of the question's checks."""
    from types import SimpleNamespace

    exps = [equal(np.array([1.0, 2.0])), satisfies(lambda v: v.sum() > 100, "a sum over 100")]
    qp = SimpleNamespace(checks=[("the first input", 0, exps), ("the second input", 1, exps[:1])],
                         calls=[{"id": "c0", "keep_args": False}, {"id": "c1", "keep_args": False}],
                         references=(), answers=(), points=3, requirements=[])
    value = {"kind": "value", "value": wire.dumps(*wire.encode_result(np.array([5.0, 6.0])))}
    right = {"kind": "value", "value": wire.dumps(*wire.encode_result(np.array([1.0, 2.0])))}
    plan = SimpleNamespace(questions={"q1": qp})
    v = checks.evaluate(plan, {"c0": value, "c1": right}, {"q1": "ok"})["q1"]
    assert len(v.failures) == 2 and v.n_failed == 1
    assert v.lines()[0] == "Hidden checks: 1 of 2 failed."


# --- cli.py: rosters, student ids and the grades CSV (issue 37; issue 36, item 4) ---------------
from preln.grade import cli  # noqa: E402

#: José as a Mac zip writes a folder's name (decomposed, NFD) and as a roster holds it (composed, NFC)
JOSE_NFD, JOSE_NFC = "Jose\u0301", "Jos\u00e9"


def test_a_roster_saved_by_excel_as_csv_utf8_is_read(tmp_path, capsys):
    """A byte-order mark and CRLF line ends (Excel's "CSV UTF-8"): the column is found (named as a
    spreadsheet may name it, "Student "), ids are NFC, and two spellings of one id are one student,
    with a warning naming both."""
    roster = tmp_path / "roster.csv"
    roster.write_bytes(f"\ufeffStudent ,name\r\n{JOSE_NFC},a\r\n{JOSE_NFD},b\r\nx[1],c\r\n".encode())
    assert cli.read_roster(roster) == [JOSE_NFC, "x[1]"]
    assert "'Jose\\u0301', 'Jos\\xe9': one row, José" in capsys.readouterr().err


@pytest.mark.parametrize("data, found", [
    ("student\r\nJos\u00e9\r\n".encode("cp1252"), "byte 0xe9 on line 2, which is not UTF-8"),
    ("student\r\nJos\u00e9\r\n".encode("utf-16"), "UTF-16 (Excel's \"Unicode Text\") text"),
])
def test_a_roster_in_another_encoding_is_refused_with_what_was_found(tmp_path, data, found):
    roster = tmp_path / "roster.csv"
    roster.write_bytes(data)
    with pytest.raises(SystemExit) as e:
        cli.read_roster(roster)
    assert str(e.value).startswith("--roster: expected a CSV in UTF-8 (with or without a byte-order mark")
    assert found in str(e.value), str(e.value)


def test_student_folders_merge_by_nfc_and_warn_on_a_collision(tmp_path, capsys):
    for folder in (JOSE_NFD, "Zo\u00eb", "Zoe\u0308", "x[1]"):
        (tmp_path / folder).mkdir()
    got = cli.student_folders(tmp_path, [JOSE_NFC, "heidi"])
    assert got == {JOSE_NFC: [JOSE_NFD], "Zo\u00eb": sorted(["Zo\u00eb", "Zoe\u0308"]), "heidi": [], "x[1]": ["x[1]"]}
    err = capsys.readouterr().err
    assert "2 folders are one student after Unicode normalisation (NFC)" in err
    assert "the folder 'Jose\\u0301' is not in Unicode NFC (a Mac zip writes names decomposed): graded as José" in err
    ids = {cli.nbgrader_id(s) for s in got}
    assert len(ids) == len(got) and all(i.isalnum() and i.isascii() for i in ids)    # nothing to glob


def test_the_csv_is_inert_in_a_spreadsheet_and_numbers_stay_numbers(tmp_path):
    """OWASP's CSV-injection rule on the text columns (student, status); scores stay numbers, negative
    ones too (a penalty written by hand, say)."""
    sheet = cli.Sheet(tmp_path, "derivation_ops")
    q1 = next(gid for gid, _, kind in sheet.cells if kind == "auto")
    formulas = ['=HYPERLINK("example.invalid","ok")', "+1", "-2", "@SUM(A1)", "\tx", "\rx"]
    for student in formulas:
        sheet.add(student, "ok", {q1: -1.5})
    sheet.add("alice", "failed: =1+1 in a reason", {})
    sheet.finish()
    import csv as _csv
    with open(tmp_path / "derivation_ops.csv", newline="") as f:
        rows = list(_csv.DictReader(f))
    assert sorted(r["student"] for r in rows) == sorted(["alice"] + ["'" + s for s in formulas])
    assert all(not r["student"].startswith(cli.FORMULA_START) for r in rows)
    col = sheet.columns[0]
    assert {r[col] for r in rows if r["student"] != "alice"} == {"-1.5"}
    assert {r["total"] for r in rows if r["student"] != "alice"} == {"-1.5"}


# --- autograde.py and feedback.py: what the feedback shows ------------------------------------
from preln.grade import autograde  # noqa: E402
from preln.grade import feedback  # noqa: E402


def _figure(png):
    return [{"output_type": "display_data", "data": {"text/plain": "<Figure>", "image/png": png}}]


@pytest.mark.parametrize("png, why", [
    ({"dropped": 1000}, "the notebook's outputs passed the grader's limit"),      # the runner's budget
    ({"dropped": wire.MAX_PNG + 4}, "over the grader's limit of 1536 kB per figure"),
    ("A" * (wire.MAX_PNG + 4), "over the grader's limit of 1536 kB per figure"),
    ("aGVsbG8=", "it is not a PNG image"),
])
def test_a_figure_not_kept_is_said_so(png, why):
    out = autograde.sanitize_outputs(_figure(png))
    assert [o["output_type"] for o in out] == ["display_data", "stream"]
    assert "image/png" not in out[0]["data"] and why in out[1]["text"], out


def test_student_markdown_is_reduced_to_inert_html():
    html = feedback.clean('<p onclick="x()">a</p><script>s()</script><iframe src="f"></iframe><style>*{}</style>'
                          '<form><input></form><a href="javascript:j()">l</a><div class="panel" style="top:0">b</div>'
                          '<img src="data:image/svg+xml;base64,AA" onerror="e()"><span class="kn">import</span>')
    assert "<p>a</p>" in html and '<span class="kn">' in html and "<div>b</div>" in html
    for active in ("<script", "<iframe", "<style", "<form", "<input", "onclick", "onerror", "javascript:",
                   "style=", 'class="panel"', "svg"):
        assert active not in html.replace("&lt;", "\0"), active


# --- issue 32: every requirement a prompt states has a visible test and a hidden group ---------
import ast  # noqa: E402
import re  # noqa: E402

#: a prompt's requirement list: "**Requirements (4 points):**" then "- **name** (2 points): ..."
REQUIREMENTS_HEAD = re.compile(r"\*\*Requirements \((\d+(?:\.\d+)?) points?\):\*\*")
REQUIREMENT_ITEM = re.compile(r"^- \*\*(.+?)\*\* \((\d+(?:\.\d+)?) points?\):", re.M)
#: the line that opens a requirement's visible test in a tests cell
VISIBLE = re.compile(r"^# requirement: (.+?)\s*$", re.M)


def prompt_requirements(text):
    """(stated total, [(name, points)]) of a prompt, or None if it lists no requirements."""
    head = REQUIREMENTS_HEAD.search(text)
    if head is None:
        return None
    return float(head.group(1)), [(n, float(p)) for n, p in REQUIREMENT_ITEM.findall(text[head.end():])]


def visible_tests(public):
    """{requirement: its visible test's code} of a tests cell's public part."""
    marks = list(VISIBLE.finditer(public))
    return {m.group(1): public[m.end():(marks[i + 1].start() if i + 1 < len(marks) else len(public))]
            for i, m in enumerate(marks)}


def hidden_requirements(hidden):
    """[(name, points)] of the requirement(...) calls of a hidden region, in order."""
    return [(c.args[0].value, float(c.args[1].value)) for c in ast.walk(ast.parse(hidden))
            if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "requirement"]


def test_the_requirement_parsers_read_a_prompt_and_a_tests_cell():
    prompt = "**Requirements (3 points):**\n- **values** (2 points): y.\n- **dtype** (1 point): x's.\n"
    assert prompt_requirements(prompt) == (3.0, [("values", 2.0), ("dtype", 1.0)])
    assert prompt_requirements("no list") is None
    public = "x = 1\n# requirement: values\nassert x\n# requirement: dtype\ny = 2\n"
    assert visible_tests(public) == {"values": "\nassert x\n", "dtype": "\ny = 2\n"}
    assert hidden_requirements('requirement("values", 2, "y")\ncheck(1)') == [("values", 2.0)]


def test_every_stated_requirement_has_a_visible_test_and_a_hidden_group(source):
    """Issue 32: each requirement a prompt lists has a visible test (its own '# requirement:'
    block with an assert) and is a group of the hidden checks with the same points; the points
    add up to the question's."""
    name, nb = source
    prompts = {nbtools.grade_id(c)[:-len("_prompt")]: c.source for c in nb.cells
               if (nbtools.grade_id(c) or "").endswith("_prompt")}
    for q in nbtools.questions(nb):
        stated = prompt_requirements(prompts.get(q.key, ""))
        tests = nb.cells[q.tests].source
        hidden = hidden_requirements(checks.hidden_region(tests))
        if stated is None:
            assert not hidden, f"{name} {q.key}: hidden requirement groups the prompt does not list"
            continue
        total, items = stated
        assert items, f"{name} {q.key}: a requirements heading without items"
        assert total == q.points == sum(p for _, p in items), (name, q.key, total, q.points, items)
        assert hidden == items, f"{name} {q.key}: the hidden groups {hidden} are not the prompt's {items}"
        visible = visible_tests(nbtools.without_hidden(tests))
        for req, _ in items:
            assert req in visible, f"{name} {q.key}: requirement {req!r} has no visible test"
            assert "assert " in visible[req], f"{name} {q.key}: the visible test of {req!r} asserts nothing"
        assert set(visible) <= {req for req, _ in items}, f"{name} {q.key}: a visible test of no stated requirement"


# --- issue 32: partial credit by requirement groups, worded feedback, no cascades --------------
def _verdict(groups_passed, core=(0,), name_uses=()):
    """A verdict whose groups (1 point each but the first, 2) pass as ``groups_passed`` says."""
    groups = [{"name": f"r{i}", "points": 2 if i == 0 else 1, "says": f"requirement {i}", "core": i in core,
               "n_checks": 1, "failures": [] if ok else [f"input {i}: wrong"]}
              for i, ok in enumerate(groups_passed)]
    failures = [f for g in groups for f in g["failures"]]
    return checks.Verdict("q1", sum(g["points"] for g in groups), failures, len(groups), name_uses, groups=groups)


def test_a_question_scores_the_groups_it_passes_and_says_which_failed():
    v = _verdict([True, True, False])
    assert v.score() == 3 and v.score(all_or_nothing=True) == 0 and not v.passed
    lines = v.lines()
    assert lines[0] == "Score: 3 of 4 points." and "- met: r0 (2 points)" in lines
    assert "- NOT MET: r2 (1 point): requirement 2" in lines and any("input 2: wrong" in ln for ln in lines)
    assert _verdict([True, True, True]).score() == 4


def test_no_group_counts_without_a_core_group_nor_with_a_forbidden_name():
    """A cheat that meets a side requirement by accident (a hard-coded shape, zeros) gets nothing."""
    assert _verdict([False, True, True]).score() == 0
    assert "do not count" in _verdict([False, True, True]).lines()[0]
    assert _verdict([False, True, True], core=(0, 1)).score() == 2        # another core group passed
    assert _verdict([True, True, True], name_uses=["softmax (attribute)"]).score() == 0


def test_partial_credit_reaches_nbgrader_as_a_number():
    from nbgrader.utils import determine_grade
    import nbformat
    from preln.grade import autograde
    for verdict, want in ((_verdict([True, False, True]), 3.0), (_verdict([False, True, True]), 0.0),
                          (_verdict([True, True, True]), 4.0)):
        cell = nbformat.v4.new_code_cell("", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                     "points": 4, "grade_id": "q1_tests"}})
        cell.outputs = autograde.verdict_outputs(verdict)
        assert determine_grade(cell)[0] == want, cell.outputs
        cell.outputs = autograde.verdict_outputs(verdict, all_or_nothing=True)
        assert determine_grade(cell)[0] == (4.0 if want == 4.0 else 0.0)


def test_diagnose_adds_words_only_to_a_failure_it_recognises():
    from preln.course import diagnose
    uniform = diagnose(lambda o: np.allclose(o, o.mean()), "yours average the values: a -1e9 fill does this")
    msg = fails("a fully masked row", np.full(3, 0.5), close(np.zeros(3), what="O"), uniform)
    assert "differ from the reference" in msg and "a -1e9 fill does this" in msg
    assert "-1e9" not in fails("a fully masked row", np.arange(3.0), close(np.zeros(3), what="O"), uniform)
    check("a fully masked row", np.zeros(3), close(np.zeros(3), what="O"), uniform)


def test_a_value_error_is_told_against_the_reference_scale_not_entry_by_entry():
    """An entry that should be 0 gave 'largest relative difference 6.5e+307' (issue 32)."""
    msg = fails("a masked row", np.array([0.5, 1.0]), close(np.array([0.0, 1.0]), rtol=1e-9, what="O"))
    assert "largest error 0.5, against values of size up to 1" in msg and "e+307" not in msg
    assert "every leading axis" in fails("a 3-D input", np.zeros((4, 6)), close(np.zeros(6), what="dgamma"))


def test_requirement_and_in_place_of_check_their_arguments():
    from preln.course import in_place_of, requirement
    with pytest.raises(ValueError, match="points: expected a number > 0; got 0"):
        requirement("dtype", 0, "keeps x's dtype")
    with pytest.raises(TypeError, match="says: expected"):
        requirement("dtype", 1, "")
    with pytest.raises(TypeError, match="reference: expected a function written as code"):
        in_place_of("softmax", np.exp)


def test_an_earlier_answer_is_the_reference_while_a_later_question_is_graded(tmp_path):
    """No cascade: question 2 calls the notebook's `double`, replaced by the grader's while q2's
    calls run, and the student's own again afterwards; the name check does not read it."""
    from preln.grade import checks
    src = textwrap.dedent('''
        from preln.course import check, close, code, in_place_of, no_credit_for, requirement
        no_credit_for("preln.ops.softmax")
        in_place_of("double", code("lambda x: 2 * x"))
        requirement("values", 1, "four times x")
        check("x = 1.5", quad(np.array([1.5])), close(np.array([6.0]), what="y"))
    ''')
    qp = checks.QuestionPlan("q2", 1, ["quad"], 0)
    ns = {"np": np, "quad": checks.Answer("quad", qp)}
    with api.collecting(qp):
        exec(src, ns)                                                   # noqa: S102: the test's own code
    qp.finish()
    plan = type("P", (), {"questions": {"q2": qp}})()
    student = {"double": lambda x: 3 * x, "quad": lambda x: student["double"](student["double"](x))}
    results, status = checks.run_in_process(plan, student)
    assert student["double"](1) == 3                                    # restored after the calls
    sources = ["import preln.ops\ndef double(x):\n    return preln.ops.softmax(x)\n"
               "def quad(x):\n    return double(double(x))\n"]
    v = checks.evaluate(plan, results, status, sources)["q2"]
    assert v.passed and v.score() == 1, v.lines()


def test_the_references_put_in_place_of_earlier_answers_agree_with_the_package():
    """preln/grade/references.py: what a later question's calls see instead of an earlier answer
    (in_place_of) is that answer done right, checked against the package's implementation."""
    from preln import BlockConfig, ops
    from preln.chapters import inference
    from preln.grade import references as R
    from preln.quant import groups, int8
    same = 1e-12                         # float64: the same formula computed another way
    rng = np.random.default_rng(32)
    x = np.array([[0.5, -np.inf, 1.5], [-np.inf] * 3, [1000.0, 999.0, -1e4]])
    assert np.array_equal(R.SOFTMAX(x), ops.softmax(x)) and R.SOFTMAX(x.astype(np.float16)).dtype == np.float16
    s, dp = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    p = ops.softmax(s, axis=0)
    assert np.allclose(R.SOFTMAX_BACKWARD(dp, p, axis=0), ops.softmax_backward(dp, p, axis=0), rtol=same, atol=same)
    for dt in (np.float64, np.float32, np.float16):
        x = (3 * rng.standard_normal((4, 6))).astype(dt)
        for per_row in (False, True):
            q, scale = R.QUANTIZE_ABSMAX(x, per_row=per_row)
            want = int8.quantize(x, granularity="channel" if per_row else "tensor")
            assert np.array_equal(q, want.q) and np.array_equal(scale, want.scale), (dt, per_row)
    a, b = rng.integers(-127, 128, (3, 50)).astype(np.int8), rng.integers(-127, 128, (2, 50)).astype(np.int8)
    assert np.array_equal(R.INT8_MATMUL(a, b), a.astype(np.int64) @ b.astype(np.int64).T)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 16), (3, 16), (3,)))
    assert np.array_equal(R.INT8_LINEAR(x, w, bias), int8.QLinear(w, bias, "w8a8")(x))
    w = rng.standard_normal((3, 16))
    got, want = R.RTN_GROUPS(w, 4, 8), groups.rtn(w, bits=4, group_size=8)
    assert all(np.allclose(g, r, rtol=same, atol=0) for g, r in zip(got, (want.q, want.scale, want.zero)))
    x, pos = rng.standard_normal((2, 3, 5, 8)), np.arange(5) + 7
    assert np.allclose(R.ROPE(x, pos, 500.0), ops.rope_forward(x, positions=pos, theta=500.0)[0], rtol=same, atol=same)
    q, k, v = rng.standard_normal((2, 4, 5, 8)), rng.standard_normal((2, 2, 5, 8)), rng.standard_normal((2, 2, 5, 8))
    for causal in (False, True):
        assert np.allclose(R.GQA_ATTENTION(q, k, v, causal=causal), ops.attention_forward(q, k, v, causal=causal)[0],
                           rtol=same, atol=same)
    cfg = BlockConfig(d_model=64, n_heads=4, d_ff=256)
    cost = inference.decode_cost(cfg, n_layers=2, batch=3, context=100, itemsize=2)
    assert R.DECODE_STEP_COST(cfg, 2, 3, 100) == (cost.flops, cost.nbytes)
    assert R.KV_CACHE_BYTES(2, 3, 100, 4, 16, 2) == inference.kv_cache_bytes(2, 3, 100, 4 * 16, 2)
    from preln.parallel import run_simulated
    for P, shape, dt in ((1, (3,), np.float64), (3, (6, 2), np.float32), (5, (10,), np.float64)):
        # eight decades: another order of addition gives other bits
        xs = [(rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape)).astype(dt) for _ in range(P)]
        ring = run_simulated(P, lambda comm, xs: comm.reduce_scatter(xs[comm.rank], axis=0), xs)
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(R.RING_REDUCE_SCATTER(xs), ring))
        ys = [x[:-1] for x in xs]                                   # a size P does not divide: padded
        ring = run_simulated(P, lambda comm, ys: comm.all_reduce(ys[comm.rank]), ys)
        assert all(np.array_equal(a, b) and a.shape == b.shape for a, b in zip(R.RING_ALL_REDUCE(ys), ring))
    from preln import TransformerBlock
    for config in ({}, {"dropout": 0.3, "causal": True, "activation": "relu"}):
        cfg = BlockConfig(d_model=12, n_heads=3, d_ff=20, **config)
        blk = TransformerBlock(cfg, dtype=np.float64, seed=5, attention="plain", fused=False)
        blk(rng.standard_normal((2, 5, 12)), rng.random((2, 5)) < 0.3)
        _, attn, _, mlp = blk.sublayers()
        for ref, branch, c in ((R.ATTN_BRANCH_BACKWARD, attn, blk.cache.attn), (R.MLP_BRANCH_BACKWARD, mlp, blk.cache.mlp)):
            d = rng.standard_normal((2, 5, 12))
            blk.zero_grad()
            want = branch.backward(d, c)              # adds the branch's 4 gradients into blk.grads
            got, grads = ref(d, c, cfg)
            assert np.allclose(got, want, rtol=same, atol=same) and len(grads) == 4, config
            assert all(np.allclose(g, blk.grads[k], rtol=same, atol=same) for k, g in grads.items()), config


def test_formgraders_pages_show_student_markdown_inert():
    """formgrader renders the autograded notebook with a plain HTMLExporter and its own template;
    assignments/nbgrader_config.py replaces the filter that template applies to rendered markdown,
    so a student's script, handler, frame, form or style reaches the page only as text."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT / "assignments")).load_config()
    config.HTMLExporter.template_name = "formgrade"                  # as formgrader's own extra config
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    evil = ('FINA-ANSWER <script>document.title="x"</script><img src=x onerror="e()">'
            '<iframe src="https://example.invalid"></iframe><style>.panel{display:none}</style>'
            '<form><input></form>')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(evil, metadata={"nbgrader": {
        "solution": True, "grade": True, "points": 2, "grade_id": "w1_answer", "locked": False}}),
        nbformat.v4.new_markdown_cell("own cell " + evil)])
    resources = {"assignment_id": "a", "notebook_id": "a", "submission_id": "s", "index": 0, "total": 1,
                 "base_url": "", "student": "fina", "last_name": "", "first_name": "", "notebook_path": "a"}
    page, _ = HTMLExporter(config=config).from_notebook_node(nb, resources=resources)  # as handlers.py
    student = page[page.index("FINA-ANSWER"):]                       # the template's own scripts come before
    for active in ("<script", "onerror=", "<iframe", "<style", "<form", "<input"):
        assert active not in student, active
    assert "&lt;script&gt;document.title" in student                # shown as what it was


@pytest.mark.parametrize("argv, words", [
    (["--jobs", "-3"], "argument --jobs: expected at least 1 students, got -3"),
    (["--jobs", "0"], "argument --jobs: expected at least 1 students, got 0"),
    (["--timeout", "0"], "argument --timeout: expected at least 1 seconds, got 0"),
    (["--timeout", "1.5"], "argument --timeout: expected an integer number of seconds, got '1.5'"),
    (["--mem-mb", "10"], f"argument --mem-mb: expected at least {cli.MIN_MEM_MB} MB, got 10"),
    (["--worker-mem-mb", "-1"], f"argument --worker-mem-mb: expected at least {cli.MIN_MEM_MB} MB, got -1"),
    (["--notebook-s", "0"], "argument --notebook-s: expected at least 1 seconds, got 0"),
])
def test_grading_options_out_of_range_are_named(argv, words, capsys):
    """`python -m preln.grade --jobs -3` (and the other caps) is an error naming the option, what it
    expects and what it got, never a silent clamp."""
    with pytest.raises(SystemExit) as e:
        cli.main(["submissions"] + argv)
    assert e.value.code == 2 and words in capsys.readouterr().err
