"""The chapters in a real JupyterLab with jupyterlab-myst, as `make lab` opens them.

An explorable (issue 24): a downloaded notebook is untrusted, and JupyterLab's sanitizer strips the
explorable's <script> and <style>. It must then show its first frame with its alt and a one-line
note, and no control (a slider without its style is 0 px wide); trusted, its script runs and the
controls replace the note.

The prose's numbers (issue 31): every chapter, opened untrusted and never run, shows each number its
prose quotes: each `{eval}` role renders the value stored in its markdown cell (no expression
left as code, no error), and no `{glue:...}` role is left (JupyterLab cannot resolve one).
PRELN_LAB_CHAPTERS=<folder> checks the notebooks of another folder instead of book/.

A headless JupyterLab (this venv's) on 127.0.0.1 serves a temporary folder: two copies of a
one-cell notebook whose stored output is an explorable, one signed (`jupyter trust`); copies of the
chapters. Jupyter's data and settings folders are temporary too, so the reader's signatures
database and settings are not touched."""
from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from preln.chapters.viz import UNTRUSTED_NOTE, control, explorable  # noqa: E402
from preln.nb import eval_expressions  # noqa: E402

pytestmark = pytest.mark.browser

BIN = Path(sys.executable).parent
START_S = 60          # upper bound for JupyterLab to answer (a cold start on a busy machine: ~10 s)
RENDER_MS = 30_000    # upper bound for the notebook and its output to render


def _plot(scale, side):
    fig, ax = plt.subplots()
    x = np.linspace(-3, 3, 31)
    ax.plot(x, np.tanh(scale * (x - {"left": -1.0, "centre": 0.0}[side])))
    return fig


def _notebook(path: Path) -> str:
    ex = explorable(_plot, {"scale": control("slope", [0.5, 1.0, 2.0, 4.0]),
                            "side": control("centre", ["left", "centre"])},
                    alt=lambda scale, side: f"A tanh curve of slope {scale:g}, centred {side}.",
                    initial={"scale": 1.0}, title="A tanh curve")
    plt.close("all")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("ex", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": ex.to_html(),
                                                                  "text/plain": repr(ex)})]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return ex.id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path) -> dict:
    return {**os.environ, "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "ws")}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL, token, explorable id) of a JupyterLab serving untrusted.ipynb and trusted.ipynb."""
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("jupyter")
    uid = _notebook(root / "untrusted.ipynb")
    _notebook(root / "trusted.ipynb")
    subprocess.run([str(BIN / "jupyter"), "trust", str(root / "trusted.ipynb")], env=_env(home), check=True,
                   capture_output=True)
    with _jupyterlab(root, home) as (url, token):
        yield url, token, uid


@contextlib.contextmanager
def _jupyterlab(root: Path, home: Path):
    """(base URL, token) of a headless JupyterLab serving ``root``, with ``home`` its Jupyter folders."""
    env = _env(home)
    token, port = secrets.token_hex(16), _free_port()
    cmd = [str(BIN / "jupyter"), "lab", "--no-browser", f"--ServerApp.token={token}", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "lab.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start in {START_S} s: {(home / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


SHOWN_JS = """(selector) => {
  const fig = document.querySelector(selector);
  const shown = el => !!el && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
  const img = fig.querySelector('img.preln-explorable-frame');
  const note = fig.querySelector('.preln-explorable-note');
  const controls = [...fig.querySelectorAll('select, .preln-slider, .preln-segmented')];
  return {scripts: fig.querySelectorAll('script').length, styled: getComputedStyle(fig).marginTop,
          img: shown(img) && img.naturalWidth > 0, alt: img ? img.alt : null,
          note: shown(note) ? note.textContent : null,
          controls: controls.map(c => ({tag: c.localName, shown: shown(c), width: c.getBoundingClientRect().width}))};
}"""


def _open(browser, lab, name):
    url, token, _ = lab
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{url}/lab/tree/{name}?token={token}&reset", wait_until="domcontentloaded")
    # (one explorable in the notebook; untrusted, the sanitizer renames its id to data-jupyter-id)
    figure = ".jp-OutputArea-output figure.preln-explorable"
    page.wait_for_selector(f"{figure} img.preln-explorable-frame", state="attached", timeout=RENDER_MS)
    return context, page.evaluate(SHOWN_JS, figure)


def test_untrusted_explorable_degrades_to_its_first_frame_with_a_note(browser, lab):
    context, got = _open(browser, lab, "untrusted.ipynb")
    try:
        assert got["scripts"] == 0, "untrusted: JupyterLab's sanitizer should have removed the <script>s"
        assert got["img"] and got["alt"] == "A tanh curve of slope 1, centred left.", got
        assert got["note"] == UNTRUSTED_NOTE, got
        assert len(got["controls"]) == 2, got
        assert not any(c["shown"] for c in got["controls"]), f"controls shown without the script: {got}"
    finally:
        context.close()


def test_trusted_explorable_shows_its_controls(browser, lab):
    context, got = _open(browser, lab, "trusted.ipynb")
    try:
        assert got["note"] is None, f"the script should have removed the note: {got}"
        assert [c["tag"] for c in got["controls"] if c["shown"] and c["width"] > 0] == ["span", "span"], got
    finally:
        context.close()


# ---- the prose's numbers in every chapter (issue 31) -------------------------------------------
CHAPTERS = Path(os.environ.get("PRELN_LAB_CHAPTERS") or Path(__file__).resolve().parents[2] / "book")
GLUE_ROLE = re.compile(r"\{glue(?::[\w-]+)?\}`[^`]*`")
# every cell laid out, not only those near the viewport: the test reads every markdown cell's text
NOTEBOOK_SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"}}

RENDERED_JS = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')]
  .map(c => {
    const md = c.classList.contains('jp-MarkdownCell') ? c.querySelector('.myst') : null;
    return md === null ? null : {
      text: md.textContent,   // (innerText skips a closed dropdown's body)
      errors: md.querySelectorAll('.myst-RenderedExpressionError, [data-mime-type="application/vnd.jupyter.stderr"]').length};
  })"""

RENDERED_WAIT_JS = """([cells, withRoles]) => {
  const all = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')];
  return all.length === cells && withRoles.every(i => {
    const md = all[i].querySelector('.myst');
    return md !== null && md.textContent.trim().length > 0;
  });
}"""
SETTLE_MS = 1000


@pytest.fixture(scope="module")
def chapters_lab(tmp_path_factory):
    """(base URL, token) of a JupyterLab serving copies of the chapters (CHAPTERS/*.ipynb)."""
    root = tmp_path_factory.mktemp("chapters")
    home = tmp_path_factory.mktemp("jupyter-chapters")
    for path in sorted(CHAPTERS.glob("*.ipynb")):
        shutil.copy(path, root / path.name)
    for name, settings in NOTEBOOK_SETTINGS.items():
        (home / "settings" / name).parent.mkdir(parents=True, exist_ok=True)
        (home / "settings" / name).write_text(json.dumps(settings))
    with _jupyterlab(root, home) as served:
        yield served


def unresolved_numbers(nb, rendered) -> list[str]:
    """What a reader of notebook ``nb`` would not see as a number, given each cell's ``rendered``
    markdown (JupyterLab's text and error count per cell, None for other cells): glue roles left
    in the prose, expressions shown as code or as an error, stored values missing from the text."""
    problems = []
    for index, (cell, shown) in enumerate(zip(nb.cells, rendered)):
        if cell.cell_type != "markdown":
            continue
        where = f"cell {index}"
        problems += [f"{where}: {m.group(0)} (a glue role: JupyterLab shows it raw)"
                     for m in GLUE_ROLE.finditer(cell.source)]
        roles = eval_expressions(cell.source)
        if not roles:
            continue
        if shown is None:
            problems.append(f"{where}: not rendered")
            continue
        problems += [f"{where}: an expression shows an error"] * shown["errors"]
        stored = {u["expression"]: u["result"] for u in cell.metadata.get("user_expressions", [])}
        for expr in roles:
            result = stored.get(expr, {})
            value = result.get("data", {}).get("text/plain") if result.get("status") == "ok" else None
            if value is None:
                problems.append(f"{where}: {expr} has no stored value")
            elif expr in shown["text"]:
                problems.append(f"{where}: {expr} is shown as written")
            elif str(ast.literal_eval(value)) not in shown["text"]:
                problems.append(f"{where}: {expr}: its value {value} is not in the text")
    return problems


@pytest.mark.parametrize("chapter", [p.name for p in sorted(CHAPTERS.glob("*.ipynb"))])
def test_every_number_the_prose_quotes_renders_without_a_kernel(browser, chapters_lab, chapter):
    url, token = chapters_lab
    nb = nbformat.read(CHAPTERS / chapter, as_version=4)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{url}/lab/tree/{chapter}?token={token}&reset", wait_until="domcontentloaded")
        # rendered: every cell is on the page, and every markdown cell with numbers shows its MyST text
        with_roles = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and eval_expressions(c.source)]
        page.wait_for_function(RENDERED_WAIT_JS, arg=[len(nb.cells), with_roles], timeout=RENDER_MS)
        page.wait_for_timeout(SETTLE_MS)   # React's effects after the render (MIME-rendered expressions)
        rendered = page.evaluate(RENDERED_JS)
        assert len(rendered) == len(nb.cells), f"{len(rendered)} cells on the page, {len(nb.cells)} in {chapter}"
        problems = unresolved_numbers(nb, rendered)
        roles = sum(len(eval_expressions(c.source)) for c in nb.cells if c.cell_type == "markdown")
        assert not problems, (f"{chapter}: {len(problems)} of the prose's numbers unresolved in JupyterLab "
                              f"({roles} {{eval}} expressions):\n" + "\n".join(problems[:40]))
    finally:
        context.close()
