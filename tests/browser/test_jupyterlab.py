"""An explorable in a real JupyterLab (issue 24): a downloaded notebook is untrusted, and
JupyterLab's sanitizer strips the explorable's <script> and <style>. It must then show its first
frame with its alt and a one-line note, and no control (a slider without its style is 0 px wide);
trusted, its script runs and the controls replace the note.

A headless JupyterLab (this venv's) on 127.0.0.1 serves a temporary folder with two copies of a
one-cell notebook whose stored output is an explorable; one is signed (`jupyter trust`). Jupyter's
data and settings folders are temporary too, so the reader's signatures database is not touched."""
from __future__ import annotations

import os
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
    ex = explorable(_plot, {"scale": control("slope", [0.5, 1.0, 2.0]),
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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL, token, explorable id) of a JupyterLab serving untrusted.ipynb and trusted.ipynb."""
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("jupyter")
    env = {**os.environ, "JUPYTER_DATA_DIR": str(home / "data"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(home / "ws")}
    uid = _notebook(root / "untrusted.ipynb")
    _notebook(root / "trusted.ipynb")
    subprocess.run([str(BIN / "jupyter"), "trust", str(root / "trusted.ipynb")], env=env, check=True,
                   capture_output=True)
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
        yield url, token, uid
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
  const controls = [...fig.querySelectorAll('select, .preln-slider')];
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
        assert [c["tag"] for c in got["controls"] if c["shown"] and c["width"] > 0] == ["span", "select"], got
    finally:
        context.close()
