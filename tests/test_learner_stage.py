"""scripts/learner_check.py (`make test-learner`): what counts as a notebook that ran the way a
learner's would, and the environment it gives the kernel. The stage itself runs in `make test`."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# scripts/ is not a package on sys.path: the script is loaded by its path
_spec = importlib.util.spec_from_file_location("learner_check", ROOT / "scripts" / "learner_check.py")
learner_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learner_check)

REQ = "preln[notebooks] @ file:///tmp/dist/preln-0.2.0-py3-none-any.whl"


def summary(venv, **changes):
    """What the executor reports for a clean Colab-like run of a notebook."""
    s = {"notebook": "x.ipynb", "error": None, "errors": [], "seconds": 1.0,
         "bootstrap_output": f"preln: not installed here; pip install {REQ}\n",
         "probe": {"file": f"{venv}/lib/python3.11/site-packages/preln/__init__.py", "version": "0.2.0",
                   "prefix": str(venv), "pythonpath": None, "data": str(ROOT / "preln" / "data" / "corpus.txt"),
                   "cwd": "/tmp/x"}}
    for k, v in changes.items():
        if k in s["probe"]:
            s["probe"][k] = v
        else:
            s[k] = v
    return s


def problems(s, venv, **kw):
    return learner_check.judge(s, expect_install=kw.pop("expect_install", REQ), venv=venv, version="0.2.0", **kw)


def test_a_clean_colab_run_passes(tmp_path):
    assert problems(summary(tmp_path), tmp_path) == []


@pytest.mark.parametrize("change, message", [
    (dict(error="CellExecutionError: ModuleNotFoundError: No module named 'matplotlib'"), "CellExecutionError"),
    (dict(bootstrap_output="preln: using the checkout at /work/preln\n"), "did not install preln from PRELN_INSTALL"),
    (dict(bootstrap_output=""), "did not install preln from PRELN_INSTALL"),
    (dict(file=str(ROOT / "preln" / "__init__.py")), "not from the venv it installed into"),
    (dict(version="0.1.0"), "the checkout is 0.2.0"),
    (dict(pythonpath=str(ROOT)), "PYTHONPATH was set"),
    (dict(prefix="/usr"), "the kernel ran in /usr"),
    (dict(data="/nowhere/corpus.txt"), "does not exist"),
    (dict(probe=None), "the probe cell printed nothing"),
])
def test_what_a_colab_run_must_not_do(tmp_path, change, message):
    found = problems(summary(tmp_path, **change), tmp_path)
    assert any(message in p for p in found), found


def test_binder_run_must_import_the_checkout_silently(tmp_path):
    ok = summary(tmp_path, bootstrap_output="", file=str(ROOT / "preln" / "__init__.py"))
    expected = ROOT / "preln" / "__init__.py"
    assert problems(ok, tmp_path, expect_install=None, expect_file=expected) == []
    noisy = summary(tmp_path, file=str(ROOT / "preln" / "__init__.py"))
    assert any("the bootstrap printed" in p for p in problems(noisy, tmp_path, expect_install=None, expect_file=expected))
    elsewhere = summary(tmp_path, bootstrap_output="")
    assert any("not from" in p for p in problems(elsewhere, tmp_path, expect_install=None, expect_file=expected))


def test_the_kernel_environment_carries_nothing_of_the_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("VIRTUAL_ENV", str(ROOT / ".venv"))
    monkeypatch.setenv("PATH", f"{ROOT / '.venv' / 'bin'}:/usr/bin")
    env = learner_check.clean_env(PRELN_INSTALL=REQ)
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
    assert env["PATH"] == "/usr/bin" and env["PRELN_INSTALL"] == REQ
    assert env["PIP_CONSTRAINT"] == str(ROOT / "requirements.txt")
    assert "PIP_CONSTRAINT" not in learner_check.clean_env(PIP_CONSTRAINT=None)


def test_wheel_problems_lists_missing_package_files(tmp_path):
    import zipfile
    whl = tmp_path / "preln-0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("preln/__init__.py", "")
    files = ["preln/__init__.py", "preln/data/corpus.txt", "preln/ops/x.py", "README.md", "tests/test_x.py"]
    assert learner_check.wheel_problems(whl, files) == ["preln/data/corpus.txt", "preln/ops/x.py"]


def test_checkout_files_are_what_a_clone_has():
    files = learner_check.checkout_files()
    assert "pyproject.toml" in files and "preln/data/corpus.txt" in files and "binder/runtime.txt" in files
    assert not [f for f in files if f.startswith((".venv/", "_build/", ".git/"))]


def test_binder_import_check_reads_the_chapters_and_names_what_does_not_import(tmp_path, monkeypatch):
    """The Binder step's import check: the chapters' imports are found, and a module the environment
    lacks is a problem that names it."""
    mods = learner_check.chapter_imports()
    assert {"numpy", "matplotlib", "preln", "ml_dtypes"} <= set(mods), mods
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setattr(learner_check, "chapter_imports", lambda: ["json", "no_such_module_for_binder"])
    problems, checked = learner_check.check_binder_imports(venv)
    assert checked == ["json", "no_such_module_for_binder"]
    assert len(problems) == 1 and problems[0].startswith("no_such_module_for_binder does not import"), problems
