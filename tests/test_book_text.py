"""The book's text (issue 24): every content table is named, and transposes speak.

- A markdown pipe table in a chapter's markdown cells or a book/*.md page must sit inside a
  captioned ``{table}`` directive; a ``{list-table}`` needs a caption and a header row. Tables in
  plain code blocks (```` ```text ````) are examples, not content.
- MathJax's speech reads ``\\top`` as "down tack": a transpose is written ``^{\\mathsf{T}}``.
  Checked where MathJax renders: markdown cells and book/*.md (the API page's docstrings reach
  no MathJax: they hold no math roles, which is checked too).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"

FENCE = re.compile(r"^\s*(`{3,}|:{3,})\s*(.*?)\s*$")
ROW = re.compile(r"^\s*\|.*\|\s*$")
SEPARATOR = re.compile(r"^\s*\|[\s:|-]+\|\s*$")
DIRECTIVE = re.compile(r"^\{([\w-]+)\}\s*(.*)$")
TOP = re.compile(r"\\top(?![A-Za-z])")
MATH_ROLE = re.compile(r":math:`|\.\. math::")
MIN_TABLES = 39           # the book has 39 content tables (issue 24); fewer means the scanner broke


def markdown_sources() -> list[tuple[str, str]]:
    """(where, text) of every markdown cell of book/*.ipynb and every book/*.md page."""
    out = []
    for nb_path in sorted(BOOK.glob("*.ipynb")):
        cells = json.loads(nb_path.read_text())["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                src = cell["source"]
                out.append((f"{nb_path.name} cell {i}", "".join(src) if isinstance(src, list) else src))
    out += [(p.name, p.read_text()) for p in sorted(BOOK.glob("*.md"))]
    return out


def tables(text: str) -> list[dict]:
    """Every pipe table and list-table of a MyST text, with the directive around it.

    Fences nest (an outer fence is longer); a code block without a directive holds no content.
    """
    found, stack = [], []           # stack: (fence, directive name or None, argument, options)
    lines = text.split("\n")
    for k, line in enumerate(lines):
        m = FENCE.match(line)
        if m:
            fence, info = m.groups()
            top = stack[-1] if stack else None
            if top and not info and fence[0] == top[0][0] and len(fence) >= len(top[0]):
                stack.pop()
                continue
            if not (top and top[1] is None):            # inside a code block nothing opens
                d = DIRECTIVE.match(info)
                stack.append((fence, d.group(1) if d else None, d.group(2) if d else "", []))
                if d and d.group(1) == "list-table":
                    found.append({"line": k + 1, "kind": "list-table", "caption": d.group(2),
                                  "options": stack[-1][3]})
                continue
        if stack and stack[-1][1] is None:
            continue
        if stack and line.lstrip().startswith(":") and stack[-1][1] == "list-table":   # (in a list item: indented)
            stack[-1][3].append(line.strip())
        if (ROW.match(line) and k + 1 < len(lines) and SEPARATOR.match(lines[k + 1])
                and not (k and ROW.match(lines[k - 1]))):
            inside = stack[-1] if stack else None
            found.append({"line": k + 1, "kind": "pipe", "header": line.strip(),
                          "caption": inside[2] if inside and inside[1] == "table" else None})
    return found


def test_the_scanner_finds_tables_and_their_captions():
    text = ("| a | b |\n|---|---|\n| 1 | 2 |\n\n:::{table} Named\n| a | b |\n|---|---|\n:::\n\n"
            "```text\n| a | b |\n|---|---|\n```\n\n```{list-table} Listed\n:header-rows: 1\n\n* - a\n```\n")
    got = tables(text)
    assert [(t["kind"], t["caption"]) for t in got] == [("pipe", None), ("pipe", "Named"), ("list-table", "Listed")]
    assert got[2]["options"] == [":header-rows: 1"]


SOURCES = markdown_sources()


def test_there_are_tables_to_check():
    assert sum(len(tables(text)) for _, text in SOURCES) >= MIN_TABLES, "the scanner found too few tables"


@pytest.mark.parametrize("where,text", SOURCES, ids=[w for w, _ in SOURCES])
def test_every_content_table_has_a_caption(where, text):
    bad = []
    for t in tables(text):
        if not (t["caption"] or "").strip():
            bad.append(f"line {t['line']}: {t.get('header', 'list-table')[:80]}")
        elif t["kind"] == "list-table" and ":header-rows: 1" not in t["options"]:
            bad.append(f"line {t['line']}: list-table {t['caption']!r} has no :header-rows: 1")
    assert not bad, (f"{where}: tables without a caption (wrap them in ```{{table}} Caption``` or a "
                     "captioned {list-table}):\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("where,text", SOURCES, ids=[w for w, _ in SOURCES])
def test_no_top_in_math(where, text):
    hits = [text[max(0, m.start() - 30):m.end() + 10] for m in TOP.finditer(text)]
    assert not hits, f"{where}: \\top reads as 'down tack'; write ^{{\\mathsf{{T}}}}: {hits}"


def test_docstrings_reach_no_mathjax():
    """The API page renders docstrings; plain-text ones (q k^T) never reach MathJax."""
    with_math = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "preln").rglob("*.py"))
                 if MATH_ROLE.search(p.read_text()) and TOP.search(p.read_text())]
    assert not with_math, f"docstrings with math roles and \\top: {with_math}"
