"""The book's structure: every notebook is in the table of contents and in the nbval run, has
stored outputs, and gives every image alt text; the site configuration stays self-contained."""
from __future__ import annotations

import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.book_toc import toc_files

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def load(nb_path: Path) -> dict:
    return json.loads(nb_path.read_text())


def code_cells(nb: dict):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def skipped(cell) -> bool:
    return "skip-execution" in cell.get("metadata", {}).get("tags", [])


nb_ids = [p.name for p in NOTEBOOKS]


# -- table of contents and Makefile ---------------------------------------------------------
def test_toc_format_and_entries_exist():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert toc["format"] == "jb-book"
    missing = [f for f in toc_files()
               if not any((ROOT / f"{f}{ext}").is_file() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    assert len(set(toc_files())) == len(toc_files()), "a page is listed twice in _toc.yml"


def test_every_notebook_is_in_the_toc():
    listed = set(toc_files())
    missing = [p.name for p in NOTEBOOKS if f"book/{p.stem}" not in listed]
    assert not missing, (f"notebooks in book/ missing from _toc.yml: {missing}; "
                         f"add `  - file: book/<name>` under chapters:")


def _makefile_notebooks() -> list[str] | None:
    if shutil.which("make") is None:
        return None
    out = subprocess.run(["make", "-np", "-f", "Makefile", "install"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    m = re.search(r"^NOTEBOOKS := ?(.*)$", out, re.MULTILINE)
    return m.group(1).split() if m else None


def _nbval_parts() -> dict[str, list[list[str]]] | None:
    """{kernel: [the notebooks of each of its parts]} of what `make -n test-notebooks` would run."""
    if shutil.which("make") is None:
        return None
    out = subprocess.run(["make", "-n", "--no-print-directory", "test-notebooks"], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "MAKEFLAGS": ""}).stdout
    parts: dict[str, list[list[str]]] = {}
    for kernel, nbs in re.findall(r'^kernel="([^"]+)"; part="[^"]+"; \\\n'
                                  r'nbs="([^"]*)"', out, re.MULTILINE):
        parts.setdefault(kernel, []).append(nbs.split())
    return parts


def test_every_notebook_is_in_the_nbval_run():
    makefile = (ROOT / "Makefile").read_text()
    kernels = re.search(r"^NB_KERNELS \?= (.*)$", makefile, re.MULTILINE).group(1).split()
    assert {"default", "Haswell", "SkylakeX", "Prescott"} <= set(kernels), \
        f"the OpenBLAS kernel matrix lost a kernel: {kernels}"
    assert re.search(r"^NBVAL\s*:=.*--nbval(\s|$)", makefile, re.MULTILINE), \
        "nbval must compare outputs (--nbval, not --nbval-lax)"
    expanded = _makefile_notebooks()
    if expanded is None:   # no make: the glob itself is the contract
        assert re.search(r"^NOTEBOOKS\s*:=\s*\$\(sort \$\(wildcard book/\*\.ipynb\)\)", makefile,
                         re.MULTILINE)
        return
    assert sorted(expanded) == [f"book/{p.name}" for p in NOTEBOOKS]
    parts = _nbval_parts()
    assert set(parts) == set(kernels), f"make test-notebooks runs kernels {sorted(parts)}, not {kernels}"
    for kernel, lists in parts.items():
        every = [nb for part in lists for nb in part]
        assert sorted(every) == sorted(expanded), \
            f"the parts of kernel {kernel} do not run every notebook exactly once: {lists}"


# -- notebooks --------------------------------------------------------------------------------
# A chapter a reader follows in one sitting (issue 21): a longer one is split where its material
# has two subjects, the second part named <chapter>_<part> (see _toc.yml).
MAX_CELLS = 60


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_ids)
def test_chapter_is_short_enough(path):
    n = len(load(path)["cells"])
    assert n <= MAX_CELLS, (f"{path.name} has {n} cells, more than {MAX_CELLS}: split it where its "
                            "material has two subjects, as a second chapter book/<name>_<part>.ipynb")


def test_a_split_chapter_follows_its_first_part():
    files = toc_files()
    for f in files:
        stem = f.rsplit("/", 1)[-1]
        firsts = [g for g in files if stem.startswith(g.rsplit("/", 1)[-1] + "_") and (ROOT / f"{g}.ipynb").is_file()]
        for first in firsts:
            if (ROOT / f"{f}.ipynb").is_file():
                assert files.index(first) < files.index(f), f"{f} comes before its first part {first} in _toc.yml"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_ids)
def test_notebook_has_stored_outputs(path):
    nb = load(path)
    cells = [c for c in code_cells(nb) if not skipped(c)]
    unexecuted = [i for i, c in enumerate(code_cells(nb)) if not skipped(c) and c["execution_count"] is None]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} have no stored outputs: run `make notebooks`"
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(counts) + 1)), \
        f"{path.name}: cells were not executed top to bottom in one run ({counts}); run `make notebooks`"
    assert any(c["outputs"] for c in cells), f"{path.name}: no outputs at all"
    errors = [i for i, c in enumerate(code_cells(nb)) for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name}: code cells {errors} stored an error"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_ids)
def test_images_have_alt_text(path):
    problems = []
    for i, cell in enumerate(code_cells(load(path))):
        outputs = cell.get("outputs", [])
        has_image = any(m in o.get("data", {}) for o in outputs for m in IMAGE_MIMES)
        # one source: the words come from the figure's code (preln.nb.set_alt) through the output's
        # HTML copy, which the site reads too (book/_ext/preln_site.py); metadata would be a second
        if "alt" in cell.get("metadata", {}).get("mystnb", {}).get("image", {}):
            problems.append(f"code cell {i}: alt text in metadata mystnb.image.alt (give it to set_alt)")
        if has_image and not any("<img" in "".join(o.get("data", {}).get("text/html", "")) for o in outputs):
            problems.append(f"code cell {i}: image output without its HTML <img alt> copy")
        for o in outputs:
            html = o.get("data", {}).get("text/html", "")
            html = "".join(html) if isinstance(html, list) else html
            for tag in re.findall(r"<img\b[^>]*>", html):
                if not re.search(r'\balt="[^"]*\S[^"]*"', tag):
                    problems.append(f"code cell {i}: <img> in HTML output without alt text")
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=nb_ids)
def test_widget_views_have_saved_state(path):
    nb = load(path)
    views = [o for c in code_cells(nb) for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
    if views:
        state = nb["metadata"].get("widgets", {}).get(WIDGET_STATE, {}).get("state")
        assert state, (f"{path.name}: widget outputs but no saved widget state: the site would show "
                       "nothing (run `make notebooks`, or save widget state in JupyterLab)")
        for v in views:
            assert v["data"][WIDGET_VIEW]["model_id"] in state, f"{path.name}: a widget's state is missing"


# -- site configuration -------------------------------------------------------------------------
def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def test_config_renders_stored_outputs_strictly():
    cfg = _config()
    assert cfg["only_build_toc_files"] is True
    assert cfg["execute"]["execute_notebooks"] == "off"
    assert cfg["execute"]["allow_errors"] is False
    assert cfg["bibtex_bibfiles"] == ["book/references.bib"]


def test_config_serves_every_script_from_the_site():
    sphinx = _config()["sphinx"]["config"]
    static_dirs = [ROOT / d for d in sphinx["html_static_path"]]

    def served(rel):
        return any((d / rel).is_file() for d in static_dirs)

    assert "://" not in sphinx["mathjax_path"] and served(sphinx["mathjax_path"])
    for path in sphinx["nb_ipywidgets_js"]:
        assert "://" not in path and served(path), f"nb_ipywidgets_js: {path} is not in html_static_path"
    assert served("mathjax/output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff")


def test_vendored_assets_match_the_manifest():
    manifest = json.loads((ROOT / "vendor" / "manifest.json").read_text())
    assert {p["name"] for p in manifest["packages"]} >= {"mathjax", "requirejs", "@jupyter-widgets/html-manager"}
    assert all(p["license"] and p["version"] for p in manifest["packages"])
    out = subprocess.run([sys.executable, "scripts/vendor_assets.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_api_page_covers_every_module():
    import preln

    api = (BOOK / "api.md").read_text()
    modules = [m.name for m in pkgutil.walk_packages(preln.__path__, "preln.")
               if not m.name.rsplit(".", 1)[-1].startswith("_")]
    missing = [m for m in ["preln", *modules] if not re.search(rf"automodule:: {re.escape(m)}\s*$", api, re.M)]
    assert not missing, f"book/api.md has no `.. automodule::` for {missing}"
