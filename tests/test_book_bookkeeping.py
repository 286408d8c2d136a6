"""The reader sees what teaches (issue 16.7): ``glue(...)`` only feeds numbers to the prose, so it
lives in code cells the site hides — a cell tagged ``remove-cell`` right after the teaching cell
(myst-nb still reads glue data from removed cells), or ``remove-input``. Every chapter in book/ is
checked, and every ``{glue:text}`` the prose uses must be glued in its notebook's stored outputs."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
HIDDEN = {"remove-cell", "remove-input"}           # the tags under which the site shows no code
# a quoted glued number: myst-nb's role, or the inline expression the chapters' prose uses
# ({eval}`glue.text("name:fmt")`, preln.nb): group 1 or 2 is the name
GLUE_ROLE = re.compile(r"""\{glue(?::[a-z]*)?\}`([^`:]+)|glue\.text\(["']([^"':]+)""")


def _source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def glue_calls(source: str) -> int:
    """The number of calls ``glue(...)`` or ``<module>.glue(...)`` in a code cell's source."""
    # IPython magics and shell escapes are not Python: comment them out before parsing
    py = "\n".join("#" + line if line.lstrip().startswith(("%", "!")) else line
                   for line in source.split("\n"))
    try:
        tree = ast.parse(py)
    except SyntaxError:                               # not Python: count what reads like a call
        return len(re.findall(r"\bglue\s*\(", py))
    return sum(isinstance(node, ast.Call)
               and ((isinstance(node.func, ast.Name) and node.func.id == "glue")
                    or (isinstance(node.func, ast.Attribute) and node.func.attr == "glue"))
               for node in ast.walk(tree))


def shown_code_cells(nb: dict):
    """(index, cell) of every code cell whose code the site shows (hide-input: behind a toggle)."""
    return [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
            and not HIDDEN & set(c.get("metadata", {}).get("tags", []))]


def test_glue_calls_counts_calls_not_mentions():
    assert glue_calls('glue("a", 1, display=False)\nx = 2; glue("b", x)') == 2
    assert glue_calls('for k, v in d.items():\n    glue(f"r_{k}", v, display=False)') == 1
    assert glue_calls('%matplotlib inline\nfrom preln.nb import glue\nnb.glue("a", 1)') == 1
    assert glue_calls('# glue("a", 1) in a comment\ns = "glue(x)"\nglue_all = 3') == 0
    assert glue_calls("glue(\n  'a',\n  1) +") == 1   # not Python: still counted


def test_hidden_tags_are_what_myst_nb_hides():
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["remove-cell"]}, "source": "glue('a', 1)"},
                    {"cell_type": "code", "metadata": {"tags": ["remove-input"]}, "source": "glue('b', 1)"},
                    {"cell_type": "code", "metadata": {"tags": ["hide-input"]}, "source": "glue('c', 1)"},
                    {"cell_type": "code", "metadata": {}, "source": ["x = 1\n", "glue('d', x)"]},
                    {"cell_type": "markdown", "metadata": {}, "source": "glue('e', 1)"}]}
    assert [glue_calls(_source(c)) for _, c in shown_code_cells(nb)] == [1, 1]   # hide-input still shows


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_glue_in_shown_cells(path):
    nb = json.loads(path.read_text())
    offenders = [(i, n) for i, c in shown_code_cells(nb) if (n := glue_calls(_source(c)))]
    total = sum(n for _, n in offenders)
    assert total == 0, (
        f"{path.name}: {total} glue(...) call(s) in code cells the site shows, as (cell index, calls): "
        f"{offenders}. Move them into a code cell tagged remove-cell right after the teaching cell.")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_glue_role_is_glued(path):
    nb = json.loads(path.read_text())
    used = {m.group(1) or m.group(2) for c in nb["cells"] if c["cell_type"] == "markdown"
            for m in GLUE_ROLE.finditer(_source(c))}
    glued = {o.get("metadata", {}).get("scrapbook", {}).get("name")
             for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])}
    missing = sorted(used - glued)
    assert not missing, f"{path.name}: the prose uses glue keys no stored output holds: {missing}"
