"""The notebooks' bootstrap (scripts/bootstrap_cell.py): the same in every notebook, pointing at the
repository and release the book publishes, silent where preln is importable, and able to find a
checkout above the notebook when it is not. (Installing from PRELN_INSTALL in a fresh environment is
exercised end to end by the learner stage of `make test`.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

import preln

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sync_bootstrap  # noqa: E402

BOOTSTRAP = sync_bootstrap.BOOTSTRAP
CHAPTERS = sync_bootstrap.chapters()
ASSIGNMENTS = sync_bootstrap.assignment_notebooks()
RELEASES = sorted((ROOT / "assignments" / "release").glob("*/*.ipynb"))


def test_every_notebook_is_covered():
    assert CHAPTERS and ASSIGNMENTS and RELEASES
    assert {p.stem for p in ASSIGNMENTS} == {p.stem for p in RELEASES}


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_starts_with_the_bootstrap(path):
    nb = nbformat.read(str(path), as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == BOOTSTRAP, f"{path.name}: run python scripts/sync_bootstrap.py"
    assert "remove-cell" in first.metadata.get("tags", []), f"{path.name}: the bootstrap is shown on the site"
    assert not first.get("outputs"), f"{path.name}: the bootstrap printed where preln is importable"


@pytest.mark.parametrize("path", ASSIGNMENTS + RELEASES, ids=lambda p: f"{p.parts[-3]}/{p.name}")
def test_assignment_setup_starts_with_the_bootstrap(path):
    nb = nbformat.read(str(path), as_version=4)
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    assert setup.source.startswith(BOOTSTRAP + "\n"), (
        f"{path}: run python scripts/sync_bootstrap.py, then make assignments")


def test_default_install_is_this_repository_and_release():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    req = re.search(r'or "([^"]+)"', BOOTSTRAP).group(1)
    assert req == f"preln[notebooks] @ git+{url}@v{preln.__version__}", (
        f"the bootstrap installs {req!r}; _config.yml's repository.url is {url!r} and the "
        f"package version {preln.__version__}: edit scripts/bootstrap_cell.py, then sync")


def _run(cwd, *flags):
    """Execute the bootstrap in a fresh interpreter in ``cwd``; returns (returncode, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PRELN_INSTALL")}
    code = BOOTSTRAP + "\nprint('imported', preln.__file__)\n"
    p = subprocess.run([sys.executable, *flags, "-c", code], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_silent_where_preln_is_importable(tmp_path):
    rc, out, err = _run(tmp_path)
    assert rc == 0, err
    assert out.splitlines() == [f"imported {preln.__file__}"]


def test_finds_the_checkout_above_the_notebook(tmp_path):
    # a stand-in checkout (python -S: no site-packages, so the installed preln is invisible)
    checkout = tmp_path / "clone"
    (checkout / "preln").mkdir(parents=True)
    (checkout / "preln" / "__init__.py").write_text("")
    (checkout / "pyproject.toml").write_text("")
    (checkout / "book").mkdir()
    rc, out, err = _run(checkout / "book", "-S")
    assert rc == 0, err
    assert out.splitlines() == [f"preln: using the checkout at {checkout.resolve()}",
                                f"imported {checkout.resolve() / 'preln' / '__init__.py'}"]


def test_a_missing_dependency_is_not_hidden(tmp_path):
    checkout = tmp_path / "clone"
    (checkout / "preln").mkdir(parents=True)
    (checkout / "preln" / "__init__.py").write_text("import numpy_that_is_not_installed\n")
    (checkout / "pyproject.toml").write_text("")
    rc, out, err = _run(checkout, "-S")
    assert rc != 0 and "numpy_that_is_not_installed" in err
