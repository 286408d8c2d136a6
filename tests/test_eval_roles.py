"""Issue 31: the prose's numbers as MyST inline expressions, {eval}`glue.text("name:fmt")`.

preln.nb (glue.text formats as myst-nb's {glue:text} did; the expressions of a markdown cell; storing
and checking their values), scripts/glue_to_eval.py (the converter), scripts/execute_notebooks.py
(`make notebooks`) and tests/nbval_history.py (`make test-notebooks`) on a real kernel, and
book/_ext/preln_eval.py in a strict Sphinx build."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from preln import nb as pnb

ROOT = Path(__file__).resolve().parents[1]


def load_by_path(path: Path):
    """A script or Sphinx extension of the repository (not a package on sys.path), loaded by its
    path: sys.path and the neighbouring tests stay as they were."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


glue_to_eval = load_by_path(ROOT / "scripts" / "glue_to_eval.py")

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# values x format specs the chapters use (grep -o '{glue[^}]*}`[^`]*`' book/*.ipynb), and a few more
VALUES = [63.41, 0.0, -0.001, 2e-06, 1e-12, 0.25, 12345, 7, 2 ** 20, 65504.0, True, "int8", "160 to 345", 1 / 3]
SPECS = ["", "s", ".2f", "d", ".1f", ".3f", ".3g", ".4g", ".4f", ".2g", ".0e", ".0f", ",", ".6g", "+.2f", "g",
         ".5g", ",.0f", ".2e", ".1e"]


def _glued(name, text_plain, index=0):
    """A code cell that glued ``name`` the way myst-nb stores it."""
    cell = nbformat.v4.new_code_cell(f"glue({name!r}, ...)", execution_count=index + 1)
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={glue_to_eval.GLUE_MIME: text_plain},
        metadata={"scrapbook": {"mime_prefix": "application/papermill.record/", "name": name}})]
    return cell


# ---- preln.nb ------------------------------------------------------------------------------------
def test_glue_text_formats_exactly_as_myst_nb_glue_text():
    format_plain_text = pytest.importorskip("myst_nb.core.variables").format_plain_text
    from IPython.lib.pretty import pretty

    compared = 0
    for value in VALUES:
        for spec in SPECS:
            try:
                want = format_plain_text(pretty(value), spec or "s")   # the site's {glue:text}
            except (ValueError, TypeError):
                continue                                            # myst-nb refuses: so must we
            pnb.glue("v", value, display=False)
            assert pnb.glue.text(f"v:{spec}" if spec else "v") == want, (value, spec)
            compared += 1
    assert compared > 150


def test_glue_text_names_what_is_missing():
    with pytest.raises(KeyError, match="nothing glued under 'never_glued'"):
        pnb.glue.text("never_glued:.1f")
    with pytest.raises(TypeError, match="spec: expected 'name' or 'name:format'"):
        pnb.glue.text(3)


def test_eval_expressions_are_the_roles_each_once_in_order():
    src = 'a {eval}`glue.text("x:.1f")`, b {eval}``1 + 1``, {eval}`glue.text("x:.1f")`; {glue:text}`y`'
    assert pnb.eval_expressions(src) == ['glue.text("x:.1f")', "1 + 1"]
    assert pnb.eval_expressions("no roles") == []
    with pytest.raises(TypeError, match="source: expected a markdown cell's source"):
        pnb.eval_expressions(None)


def _ok(text):
    return {"status": "ok", "data": {"text/plain": repr(text)}, "metadata": {}}


def test_store_and_stale_expressions():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell('x is {eval}`f(1)` and {eval}`f(2)`'),
                nbformat.v4.new_markdown_cell("no roles")]
    nb.cells[1].metadata["user_expressions"] = [{"expression": "gone", "result": _ok("1")}]
    values = {"f(1)": _ok("1.0"), "f(2)": {"status": "error", "ename": "KeyError", "evalue": "'k'", "traceback": []}}
    failed = pnb.store_expressions(nb, lambda exprs: {e: values[e] for e in exprs})
    assert failed == [(0, "f(2)", "KeyError: 'k'")]
    assert [u["expression"] for u in nb.cells[0].metadata["user_expressions"]] == ["f(1)", "f(2)"]
    assert "user_expressions" not in nb.cells[1].metadata          # stale metadata dropped
    values["f(2)"] = _ok("2.0")
    stale = pnb.stale_expressions(nb, lambda exprs: {e: values[e] for e in exprs})
    assert stale == [(0, "f(2)", "KeyError: 'k'", "'2.0'")]        # a stored error is stale too
    pnb.store_expressions(nb, lambda exprs: {e: values[e] for e in exprs})
    assert pnb.stale_expressions(nb, lambda exprs: {e: values[e] for e in exprs}) == []
    values["f(1)"] = _ok("1.1")
    assert pnb.stale_expressions(nb, lambda exprs: {e: values[e] for e in exprs}) == [(0, "f(1)", "'1.0'", "'1.1'")]


def test_a_measured_value_need_only_exist():
    """A number glued by a `# NBVAL_IGNORE_OUTPUT` cell (a timing) may differ from run to run, as that
    cell's outputs may; it must still be stored and evaluate without an error."""
    timed = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nglue('ms', 12.3)")
    timed.outputs = [nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "12.3"},
                                            metadata={"scrapbook": {"name": "ms"}})]
    exact = nbformat.v4.new_code_cell("glue('n', 4)")
    exact.outputs = [nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "4"},
                                            metadata={"scrapbook": {"name": "n"}})]
    md = nbformat.v4.new_markdown_cell('{eval}`glue.text("ms:.1f")` ms for {eval}`glue.text("n")` tokens')
    nb = nbformat.v4.new_notebook()
    nb.cells = [timed, exact, md]
    measured = pnb.measured_expressions(nb)
    assert measured == {'glue.text("ms:.1f")'}
    values = {'glue.text("ms:.1f")': _ok("12.3"), 'glue.text("n")': _ok("4")}
    pnb.store_expressions(nb, lambda exprs: {e: values[e] for e in exprs})
    values['glue.text("ms:.1f")'] = _ok("14.0")                      # another run, another time
    run = lambda exprs: {e: values[e] for e in exprs}
    assert pnb.stale_expressions(nb, run, measured=measured) == []
    assert len(pnb.stale_expressions(nb, run)) == 1                   # without the exemption: stale
    values['glue.text("n")'] = _ok("5")                               # an exact value still counts
    assert [e for _, e, _, _ in pnb.stale_expressions(nb, run, measured=measured)] == ['glue.text("n")']
    values['glue.text("ms:.1f")'] = {"status": "error", "ename": "KeyError", "evalue": "'ms'", "traceback": []}
    assert 'glue.text("ms:.1f")' in [e for _, e, _, _ in pnb.stale_expressions(nb, run, measured=measured)]


# ---- scripts/glue_to_eval.py ----------------------------------------------------------------------
def _chapter():
    nb = nbformat.v4.new_notebook()
    nb.cells = [_glued("var", "63.41", 0),
                nbformat.v4.new_markdown_cell("v {glue:text}`var:.1f`, twice {glue:text}`var:.1f`, n {glue:text}`n:,` "
                                              "and {glue:text}`var`; other {glue}`var`, {glue:md}`m` and "
                                              "{glue:text}`other.ipynb::var:.1f`\n\n```{glue:figure} fig\n```"),
                _glued("n", "12345", 2),
                nbformat.v4.new_markdown_cell("unknown {glue:text}`nope:.2f`")]
    return nb


def test_converter_rewrites_fills_in_reports_and_is_idempotent():
    nb = _chapter()
    changed, report = glue_to_eval.convert(nb, "ch")
    md = nb.cells[1]
    assert changed
    assert md.source.startswith('v {eval}`glue.text("var:.1f")`, twice {eval}`glue.text("var:.1f")`, '
                                'n {eval}`glue.text("n:,")` and {eval}`glue.text("var")`')
    stored = {u["expression"]: u["result"]["data"]["text/plain"] for u in md.metadata["user_expressions"]}
    assert stored == {'glue.text("var:.1f")': "'63.4'", 'glue.text("n:,")': "'12,345'", 'glue.text("var")': "'63.41'"}
    assert report[0] == "ch: 5 {glue:text} roles rewritten, 3 stored values filled in"
    text = "\n".join(report)
    for left in ("{glue}`var`", "{glue:md}`m`", "{glue:text}`other.ipynb::var:.1f`", "```{glue:figure} fig"):
        assert f"NOT CONVERTED ch cell 1: {left}" in text and left in md.source
    assert "LATER GLUE ch cell 1: 'n' is glued by cell 2" in text
    assert "NO STORED VALUE ch cell 3: glue.text(\"nope:.2f\")" in text
    again = copy.deepcopy(nb)
    changed, _ = glue_to_eval.convert(again, "ch")
    assert not changed and again == nb                       # a second run changes nothing


def test_converter_never_overwrites_a_stored_value(tmp_path):
    nb = _chapter()
    glue_to_eval.convert(nb, "ch")
    nb.cells[1].metadata["user_expressions"][0]["result"] = _ok("63.5")   # as `make notebooks` stored it
    path = tmp_path / "ch.ipynb"
    nbformat.write(nb, path)
    before = path.read_bytes()
    assert glue_to_eval.main([str(path)]) == 0 and path.read_bytes() == before
    assert glue_to_eval.main(["--dry-run", str(path)]) == 0     # nothing to do: exit 0


# ---- a real kernel: make notebooks, make test-notebooks -----------------------------------------
def _executable_chapter(path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("from preln.nb import glue\nglue('ratio', round(2 / 3, 3), display=False)"),
                nbformat.v4.new_markdown_cell('The ratio is {eval}`glue.text("ratio:.2f")`, later {eval}`glue.text("late:d")`.'),
                nbformat.v4.new_code_cell("glue('late', 41 + 1, display=False)")]
    nbformat.write(nb, path)


def test_make_notebooks_stores_and_nbval_checks_the_values(tmp_path):
    path = tmp_path / "chapter.ipynb"
    _executable_chapter(path)
    env = {**os.environ, **ONE_THREAD}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), str(path)], check=True,
                   env=env, cwd=ROOT, capture_output=True)
    md = nbformat.read(path, as_version=4).cells[1]
    assert md.metadata["user_expressions"] == [
        {"expression": 'glue.text("ratio:.2f")', "result": _ok("0.67")},
        {"expression": 'glue.text("late:d")', "result": _ok("42")}]        # glued after the cell: evaluated at the end

    def nbval(nb_path):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.nbval_history",
                               "--nbval", "--nbval-current-env", str(nb_path)], env=env, cwd=ROOT,
                              capture_output=True, text=True)

    ok = nbval(path)
    assert ok.returncode == 0 and "3 passed" in ok.stdout, ok.stdout[-2000:]   # 2 cells + the expressions
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["user_expressions"][0]["result"] = _ok("0.68")        # a stale value
    nbformat.write(nb, path)
    stale = nbval(path)
    assert stale.returncode == 1 and "stored '0.68', computed '0.67'" in stale.stdout, stale.stdout[-2000:]


def test_make_notebooks_refuses_an_expression_that_fails(tmp_path):
    path = tmp_path / "chapter.ipynb"
    _executable_chapter(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source += ' {eval}`glue.text("never")`'
    nbformat.write(nb, path)
    before = path.read_bytes()
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), str(path)],
                         env={**os.environ, **ONE_THREAD}, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0 and "nothing glued under 'never'" in run.stderr
    assert path.read_bytes() == before                          # left unwritten


# ---- book/_ext/preln_eval.py in a strict build ---------------------------------------------------
CONF = """
import sys
sys.path.insert(0, {ext!r})
extensions = ["myst_nb", "preln_eval"]
nb_execution_mode = "off"
exclude_patterns = ["_build"]
"""


def _build(tmp_path, nb):
    (tmp_path / "conf.py").write_text(CONF.format(ext=str(ROOT / "book" / "_ext")))
    nbformat.write(nb, tmp_path / "index.ipynb")
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "-n", "-q", "-b", "html", str(tmp_path),
                           str(tmp_path / "_build")], capture_output=True, text=True)


def _stored_page():
    nb = _chapter()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Page"), nb.cells[0], nb.cells[1], nb.cells[2]]
    nb.cells[2].source = "v {glue:text}`var:.1f`, n {glue:text}`n:,` and {glue:text}`var`."
    return nb


def test_the_site_prints_the_stored_values_as_glue_did(tmp_path):
    nb = _stored_page()
    (tmp_path / "glue").mkdir()
    (tmp_path / "eval").mkdir()
    glue_site = _build(tmp_path / "glue", copy.deepcopy(nb))     # today's {glue:text} roles
    glue_to_eval.convert(nb, "page")
    eval_site = _build(tmp_path / "eval", nb)
    assert glue_site.returncode == 0 and eval_site.returncode == 0, glue_site.stderr + eval_site.stderr

    def spans(site):
        html = (tmp_path / site / "_build" / "index.html").read_text()
        return [line for line in html.splitlines() if "pasted-text" in line]

    assert spans("eval") == spans("glue")
    assert '<span class="pasted-text">63.4</span>' in "".join(spans("eval"))
    assert '<span class="pasted-text">12,345</span>' in "".join(spans("eval"))


@pytest.mark.parametrize("broken", ["missing", "error"])
def test_the_strict_build_fails_on_a_value_it_cannot_show(tmp_path, broken):
    nb = _stored_page()
    glue_to_eval.convert(nb, "page")
    stored = nb.cells[2].metadata["user_expressions"]
    if broken == "missing":
        del stored[0]
    else:
        stored[0]["result"] = {"status": "error", "ename": "KeyError", "evalue": "'var'", "traceback": []}
    build = _build(tmp_path, nb)
    assert build.returncode != 0
    assert ("no stored value" if broken == "missing" else "the stored result is an error: KeyError") in build.stderr


def test_shown_text_reads_a_stored_result():
    preln_eval = load_by_path(ROOT / "book" / "_ext" / "preln_eval.py")

    assert preln_eval.shown_text(_ok("1e-07")) == "1e-07"
    assert preln_eval.shown_text({"status": "ok", "data": {"text/plain": "42"}}) == "42"
    with pytest.raises(ValueError, match="no text/plain"):
        preln_eval.shown_text({"status": "ok", "data": {"text/html": "<b>1</b>"}})
    assert json.dumps(preln_eval.stored_results({"cells": []})) == "{}"
