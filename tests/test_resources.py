"""preln.resources.data_path: every data file the package reads lives in preln/data/ (package data)."""
import json

import pytest

from preln.resources import data_path

FILES = ["corpus.txt", "precision/overflow_grids.json", "preln_vs_postln/runs.json",
         "preln_vs_postln/extras.json", "preln_vs_postln/theory.json"]


@pytest.mark.parametrize("name", FILES)
def test_data_files_are_in_the_package(name):
    path = data_path(*name.split("/"))
    assert path.is_file() and path.parent.parts[-1 if "/" not in name else -2] == "data"
    if name.endswith(".json"):
        assert json.loads(path.read_text())


@pytest.mark.parametrize("bad", ["../pyproject.toml", "/etc/passwd", ""])
def test_rejects_paths_outside_the_data_folder(bad):
    with pytest.raises(ValueError, match="parts: expected relative path components"):
        data_path(bad)
