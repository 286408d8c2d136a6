"""The table of contents as the tests read it: one parser for the structure and browser tests."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def toc_files(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """Every `file:` in _toc.yml (root first, then in reading order), without extension."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            for key in ("chapters", "sections", "parts"):
                walk(entry.get(key))

    for key in ("parts", "chapters", "sections"):
        walk(toc.get(key))
    return [re.sub(r"\.(md|ipynb|rst)$", "", f) for f in files]
