"""preln.resources.data_path: every data file the package reads lives in preln/data/ (package data),
every file there is readable through data_path, and pyproject.toml's package-data covers each one."""
import json
from pathlib import Path

import numpy as np
import pytest

from preln.resources import data_path

try:
    import tomllib
except ModuleNotFoundError:      # Python 3.10: the same parser as the tomli package (requirements.txt)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "preln" / "data"
#: every file under preln/data/, as data_path's "a/b" names (found on disk, not listed by hand)
FILES = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts)


def test_the_data_folder_is_found():
    """The scan above sees the corpus and the stored results (an empty list would test nothing)."""
    assert {"corpus.txt", "README.md", "precision/overflow_grids.json",
            "preln_vs_postln/runs.json"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_data_files_are_in_the_package_and_readable(name):
    path = data_path(*name.split("/"))
    assert path.is_file() and path.resolve() == (DATA / name).resolve()
    if name.endswith(".json"):
        assert json.loads(path.read_text())
    elif name.endswith(".npz"):
        with np.load(path, allow_pickle=False) as arrays:
            assert arrays.files and all(arrays[k].size for k in arrays.files)
    else:
        assert path.read_text().strip()


@pytest.mark.parametrize("name", FILES)
def test_package_data_declares_every_data_file(name):
    """pyproject.toml's [tool.setuptools.package-data] patterns (globbed from preln/, recursively, as
    setuptools does) match the file, so every wheel carries it (tests/test_learner_packaging.py
    builds one and checks its contents)."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["preln"]
    matched = {p.resolve() for pattern in patterns for p in (ROOT / "preln").glob(pattern) if p.is_file()}
    assert (DATA / name).resolve() in matched, f"preln/data/{name} is not matched by package-data {patterns}"


@pytest.mark.parametrize("bad", ["../pyproject.toml", "/etc/passwd", ""])
def test_rejects_paths_outside_the_data_folder(bad):
    with pytest.raises(ValueError, match="parts: expected relative path components"):
        data_path(bad)
