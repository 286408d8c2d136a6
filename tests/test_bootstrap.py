"""The notebooks' bootstrap (scripts/bootstrap_cell.py): the same in every notebook, pointing at the
repository and release the book publishes, silent where preln is importable, and able to find a
checkout above the notebook when it is not. (Installing from PRELN_INSTALL in a fresh environment is
exercised end to end by the learner stage of `make test`.)"""
from __future__ import annotations

import importlib.util
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
# scripts/ is not a package on sys.path: the script is loaded by its path
_spec = importlib.util.spec_from_file_location("sync_bootstrap", ROOT / "scripts" / "sync_bootstrap.py")
sync_bootstrap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_bootstrap)

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


def test_bootstrap_ends_with_its_end_line():
    assert BOOTSTRAP.splitlines()[-1] == sync_bootstrap.END


@pytest.mark.parametrize("old", ["current", "longer", "before the end line"])
def test_replacing_any_old_bootstrap_keeps_the_setup_cells_own_code(old):
    """An assignment's setup cell is the bootstrap, a blank line, then its imports: the sync replaces
    the bootstrap whatever its length (a line count would eat the imports when the new one is longer)."""
    rest = "import numpy as np\n\nfrom preln import BlockConfig"
    marker, end = sync_bootstrap.MARKER, sync_bootstrap.END
    bootstraps = {
        "current": BOOTSTRAP,
        "longer": marker + "\n" + "_x = 1\n" * (len(BOOTSTRAP.splitlines()) + 20) + end,
        "before the end line": marker + "\nimport sys\n\ntry:\n    import preln\nexcept ModuleNotFoundError:\n"
                               "    _root = None\n    import preln",
    }
    assert sync_bootstrap._strip_old(bootstraps[old] + "\n\n" + rest) == rest


def test_default_install_is_this_repository_and_release():
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    req = re.search(r'or "([^"]+)"', BOOTSTRAP).group(1)
    assert req == f"preln[notebooks] @ git+{url}@v{preln.__version__}", (
        f"the bootstrap installs {req!r}; _config.yml's repository.url is {url!r} and the "
        f"package version {preln.__version__}: edit scripts/bootstrap_cell.py, then sync")


def _run(cwd, *flags, **env_vars):
    """Execute the bootstrap in a fresh interpreter in ``cwd`` (``env_vars`` added to its environment);
    returns (returncode, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PRELN_INSTALL")} | env_vars
    code = BOOTSTRAP + "\nprint('imported', preln.__file__)\n"
    p = subprocess.run([sys.executable, *flags, "-c", code], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_silent_where_preln_is_importable(tmp_path):
    rc, out, err = _run(tmp_path)
    assert rc == 0, err
    assert out.splitlines() == [f"imported {preln.__file__}"]


def _checkout(tmp_path):
    """A stand-in checkout with a subpackage (run under python -S: no site-packages, so the installed
    preln is invisible)."""
    checkout = tmp_path / "clone"
    (checkout / "preln" / "ops").mkdir(parents=True)
    (checkout / "preln" / "__init__.py").write_text('__version__ = "0.0.0"\n')
    (checkout / "preln" / "ops" / "__init__.py").write_text("WHERE = __file__\n")
    (checkout / "pyproject.toml").write_text("")
    (checkout / "book").mkdir()
    return checkout


def test_finds_the_checkout_above_the_notebook(tmp_path):
    checkout = _checkout(tmp_path)
    rc, out, err = _run(checkout / "book", "-S")
    assert rc == 0, err
    assert out.splitlines() == [f"preln: using the checkout at {checkout.resolve()}",
                                f"imported {checkout.resolve() / 'preln' / '__init__.py'}"]


def test_the_checkout_is_loaded_by_path_not_put_on_sys_path(tmp_path):
    """Its subpackages import through the package's own __path__; sys.path is left as it was."""
    checkout = _checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PRELN_INSTALL")}
    code = ("import sys; before = list(sys.path)\n" + BOOTSTRAP
            + "\nimport preln.ops; print(preln.ops.WHERE); print(sys.path == before)\n")
    p = subprocess.run([sys.executable, "-S", "-c", code], cwd=checkout / "book", env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-2:] == [str(checkout.resolve() / "preln" / "ops" / "__init__.py"), "True"]


def test_a_leftover_folder_is_not_an_installation(tmp_path):
    """After `pip uninstall preln`, numba's cache files keep a preln/ folder without __init__.py that
    imports as an empty namespace package: the bootstrap must install, not stay silent. Here the
    install cannot succeed (PRELN_INSTALL names a wheel that is not there), which also shows the hint."""
    leftover = tmp_path / "site"
    (leftover / "preln" / "ops" / "fused" / "__pycache__").mkdir(parents=True)
    (leftover / "preln" / "ops" / "fused" / "__pycache__" / "_numba.kernel-1.py311.nbi").write_bytes(b"")
    missing = tmp_path / "nowhere" / "preln-0.0.0-py3-none-any.whl"
    rc, out, err = _run(tmp_path, PYTHONPATH=str(leftover), PRELN_INSTALL=str(missing))
    assert rc != 0
    assert out.splitlines() == [f"preln: not installed here; pip install {missing}"]
    assert "RuntimeError: preln: pip could not install" in err and "Set PRELN_INSTALL" in err


def test_offline_install_fails_with_the_hint(tmp_path):
    """Offline, pip fails to fetch the release (for git+https, a git error): the cell shows pip's own
    words and then says how to point PRELN_INSTALL at something installable."""
    checkout_free = tmp_path / "alone"
    checkout_free.mkdir()
    # an unreachable requirement stands in for the network: a git URL on a closed local port
    req = "preln[notebooks] @ git+https://127.0.0.1:9/preln/preln@v0.0.0"
    rc, out, err = _run(checkout_free, PRELN_INSTALL=req, PYTHONPATH=str(_shadow(tmp_path)),
                        GIT_TERMINAL_PROMPT="0")
    assert rc != 0
    assert out.splitlines() == [f"preln: not installed here; pip install {req}"]
    assert "git" in err.lower()                                     # pip's words reach the notebook
    hint = err[err.index("RuntimeError: preln: pip could not install"):]
    assert "PRELN_INSTALL" in hint and "os.environ['PRELN_INSTALL']" in hint
    assert "CalledProcessError" not in err                           # no traceback of the subprocess


def _shadow(tmp_path):
    """A folder that, first on PYTHONPATH, makes the installed preln invisible: a preln/ with only a
    cache folder (an empty namespace package, which the bootstrap does not count as installed)."""
    shadow = tmp_path / "shadow"
    (shadow / "preln" / "__pycache__").mkdir(parents=True, exist_ok=True)
    return shadow


def test_a_missing_dependency_is_not_hidden(tmp_path):
    checkout = tmp_path / "clone"
    (checkout / "preln").mkdir(parents=True)
    (checkout / "preln" / "__init__.py").write_text("import numpy_that_is_not_installed\n")
    (checkout / "pyproject.toml").write_text("")
    rc, out, err = _run(checkout, "-S")
    assert rc != 0 and "numpy_that_is_not_installed" in err


def test_a_fork_gets_its_own_default_requirement(tmp_path, monkeypatch):
    """Publishing a fork: set _config.yml's repository.url (or bump __version__), run
    sync_bootstrap.py, and the bootstrap of every notebook installs from the fork's release."""
    for rel in ["_config.yml", "preln/__init__.py", "scripts/bootstrap_cell.py", CHAPTERS[0].relative_to(ROOT),
                ASSIGNMENTS[0].relative_to(ROOT)]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    config = tmp_path / "_config.yml"
    url = yaml.safe_load(config.read_text())["repository"]["url"]
    config.write_text(config.read_text().replace(url, "https://github.com/someone/preln-course"))
    init = tmp_path / "preln" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{preln.__version__}"', '__version__ = "9.8.7"'))
    monkeypatch.setattr(sync_bootstrap, "ROOT", tmp_path)
    monkeypatch.setattr(sync_bootstrap, "BOOTSTRAP_FILE", tmp_path / "scripts" / "bootstrap_cell.py")
    monkeypatch.setattr(sync_bootstrap, "BOOTSTRAP", BOOTSTRAP)   # main() rebinds it: restored after the test
    wanted = "preln[notebooks] @ git+https://github.com/someone/preln-course@v9.8.7"
    assert sync_bootstrap.release_requirement() == wanted
    assert sync_bootstrap.main(["--check"]) == 1             # reports, writes nothing
    assert (tmp_path / "scripts" / "bootstrap_cell.py").read_text() == BOOTSTRAP + "\n"
    assert sync_bootstrap.main([]) == 0
    new = (tmp_path / "scripts" / "bootstrap_cell.py").read_text()
    assert f'or "{wanted}"' in new and new.replace(wanted, "") == BOOTSTRAP.replace(
        re.search(r'or "([^"]+)"', BOOTSTRAP).group(1), "") + "\n"
    chapter = nbformat.read(str(tmp_path / CHAPTERS[0].relative_to(ROOT)), as_version=4)
    assert next(c for c in chapter.cells if c.cell_type == "code").source == new.rstrip("\n")
    assignment = nbformat.read(str(tmp_path / ASSIGNMENTS[0].relative_to(ROOT)), as_version=4)
    assert wanted in next(c for c in assignment.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup").source
    assert sync_bootstrap.BOOTSTRAP == new.rstrip("\n")
    assert sync_bootstrap.main(["--check"]) == 0             # and then it is in step
