"""Book code wraps at 79 characters (issue 33): no code line of a chapter notebook, and no line of a
code block in its markdown, is longer, so that no code scrolls sideways on the site and a reader's
editor shows it whole.

The bootstrap cell is the one exception: it is written into every notebook (and every assignment,
whose nbgrader checksums cover it) from scripts/bootstrap_cell.py by scripts/sync_bootstrap.py,
tests/test_bootstrap.py holds it to that file, and the site never shows it (remove-cell).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
MAX_WIDTH = 79
BOOTSTRAP_MARKER = "# preln bootstrap:"
# A fence opens with ``` / ~~~ / ::: and an info string; it closes with the same character, at
# least as many of them and nothing after (CommonMark and MyST's colon fences).
FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*(.*)$")
# Fenced directives hold prose (admonitions, tables, dropdowns), except these, which hold code.
CODE_DIRECTIVES = {"code", "code-block", "code-cell", "sourcecode"}


def fenced_code(text: str):
    """(line number, line) of every line inside a code block of a markdown cell: a fence without
    a directive (```python, ```) or a code directive, also when nested in another directive."""
    stack = []          # open fences: (marker, is_code)
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            marker, info = m.groups()
            top = stack[-1][0] if stack else None
            closes = (top is not None and not info and marker[0] == top[0]
                      and len(marker) >= len(top))
            if closes:
                stack.pop()
                continue
            if not (stack and stack[-1][1]):        # a fence inside code is code
                directive = re.match(r"\{([\w-]+)\}", info)
                stack.append((marker, directive is None
                              or directive.group(1) in CODE_DIRECTIVES))
                continue
        if stack and stack[-1][1]:
            yield number, line


def too_long(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    found = []
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and not source.startswith(BOOTSTRAP_MARKER):
            lines = enumerate(source.splitlines(), 1)
        elif cell["cell_type"] == "markdown":
            lines = fenced_code(source)
        else:
            continue
        found += [f"cell {index} line {n} ({len(line)} chars): {line}"
                  for n, line in lines if len(line) > MAX_WIDTH]
    return found


def test_fenced_code_is_found():
    """The fence reader sees code blocks, nested ones too, and not a directive's prose."""
    text = ("```{admonition} Note\nprose " + "x" * 90 + "\n\n```python\nlong = 1\n```\n```\n"
            "::: {dropdown} A\n~~~\ncode\n~~~\n:::\n")
    assert [line for _, line in fenced_code(text)] == ["long = 1", "code"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_79(notebook):
    found = too_long(notebook)
    assert not found, (f"{notebook.name}: {len(found)} code line(s) over {MAX_WIDTH} "
                       "characters; wrap them inside brackets:\n" + "\n".join(found))


def printed_tables_too_wide(notebook: Path) -> list[str]:
    """Printed outputs that read as tables (preln.nb.reads_as_table) with a line wider than the
    site's output column: the site wraps prose, but a wrapped table loses its columns."""
    from preln.nb import OUTPUT_COLUMNS, reads_as_table

    found = []
    for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if out.get("output_type") == "stream":
                text = "".join(out["text"])
            elif "text/plain" in data and not {"text/html", "image/png"} & set(data):
                text = "".join(data["text/plain"])
            else:
                continue
            width = max(map(len, text.splitlines()), default=0)
            if width > OUTPUT_COLUMNS and reads_as_table(text):
                found.append(f"cell {index} ({width} chars): {text.splitlines()[0][:60]}")
    return found


def test_reads_as_table():
    from preln.nb import reads_as_table

    assert reads_as_table("model   bytes\nGPT-2   124\nLlama   7000\n")
    assert not reads_as_table("P = 2: ZeRO-2 step == data-parallel step: True; sent 199936 bytes\n")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_printed_tables_fit_the_column(notebook):
    found = printed_tables_too_wide(notebook)
    assert not found, (f"{notebook.name}: printed tables wider than the output column; narrow, "
                       "split or transpose them:\n" + "\n".join(found))
