"""The learner's path (issue 31): the book in parts by dependency, each chapter relying only on the
chapters before it.

- _toc.yml is in captioned parts; the reference pages (running, course, benchmarks, api) are the
  last part, after every chapter;
- every chapter opens with a one-line **Prerequisites** (its title, then that line) whose links all
  point to earlier chapters;
- a link to a later chapter says that it is later ("later", "next", "will", ...): a forward pointer,
  never a result the reader is assumed to have seen;
- the on-ramp chapter comes first, and every chapter that uses the tiny language model
  (TinyLM, train_lm, reference_lm) comes after it.
"""
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.book_toc import toc_files

ROOT = Path(__file__).resolve().parents[1]
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
ORDER = [f.rsplit("/", 1)[-1] for f in toc_files()]
CHAPTERS = [n for n in ORDER if (ROOT / "book" / f"{n}.ipynb").is_file()]
REFERENCE_PAGES = ["notation", "running", "course", "benchmarks", "api", "references"]
ONRAMP = "build_and_train"
# the tiny language model's names: a chapter that calls them relies on the on-ramp, which builds it in view
TINY_LM = re.compile(r"\b(TinyLM|train_lm|reference_lm)\b")
DOC_LINK = re.compile(r"\{doc\}`(?:[^`<]*<)?([\w/]+)>?`")
# words that make a link to a later chapter a forward pointer
FORWARD = re.compile(r"\b(later|next|will|ahead|comes? back|goes on|returns?|turns? to|takes? up|"
                     r"continues?|following|afterwards|then)\b", re.I)


def cells(name):
    return json.loads((ROOT / "book" / f"{name}.ipynb").read_text())["cells"]


def text(cell):
    return "".join(cell["source"])


def sentences(src):
    """The markdown's sentences (roughly: split at '. ', line-breaks folded)."""
    return re.split(r"(?<=[.!?:;])\s+(?=[A-Z{(*])", " ".join(src.split()))


def test_toc_is_in_captioned_parts_with_the_reference_pages_last():
    parts = TOC.get("parts")
    assert parts and "chapters" not in TOC, "_toc.yml: the book is in parts (`parts:` with `caption:`)"
    assert all(p.get("caption") for p in parts), "every part of _toc.yml has a caption"
    last = [e["file"].rsplit("/", 1)[-1] for e in parts[-1]["chapters"]]
    assert sorted(last) == sorted(REFERENCE_PAGES), f"the last part holds the reference pages alone; got {last}"
    assert all(ORDER.index(c) < ORDER.index(r) for c in CHAPTERS for r in REFERENCE_PAGES), \
        "a chapter comes after a reference page"


def test_the_on_ramp_comes_first():
    assert CHAPTERS[0] == ONRAMP, f"the first chapter is the on-ramp {ONRAMP}; got {CHAPTERS[0]}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_opens_with_prerequisites_of_earlier_chapters(name):
    first = next(text(c) for c in cells(name) if c["cell_type"] == "markdown")
    lines = [l for l in first.splitlines() if l.strip()]
    assert lines[0].startswith("# "), f"{name}: the first markdown cell starts with the chapter's title"
    assert lines[1].startswith("**Prerequisites:**"), (
        f"{name}: the line after the title is '**Prerequisites:** ...'; got {lines[1][:80]!r}")
    for target in DOC_LINK.findall(lines[1]):
        assert target in CHAPTERS, f"{name}: prerequisite {target} is not a chapter"
        assert ORDER.index(target) < ORDER.index(name), (
            f"{name}: prerequisite {target} comes later in _toc.yml: a chapter relies only on earlier ones")


@pytest.mark.parametrize("name", CHAPTERS)
def test_links_to_later_chapters_are_forward_pointers(name):
    later = set(CHAPTERS[CHAPTERS.index(name) + 1:])
    bad = []
    for i, c in enumerate(cells(name)):
        if c["cell_type"] != "markdown":
            continue
        for s in sentences(text(c)):
            if s.startswith("**Prerequisites:**"):
                continue
            targets = set(DOC_LINK.findall(s)) & later
            if targets and not FORWARD.search(s):
                bad.append(f"cell {i} -> {sorted(targets)}: {s[:160]}")
    assert not bad, (f"{name} links to later chapters without saying they come later (write "
                     "'{doc}`x` measures this later', or move the material):\n" + "\n".join(bad))


def test_chapters_using_the_tiny_lm_come_after_the_on_ramp():
    users = [n for n in CHAPTERS
             if any(c["cell_type"] == "code" and TINY_LM.search(text(c)) for c in cells(n))]
    assert ONRAMP in users, f"the on-ramp {ONRAMP} builds the tiny language model in view"
    early = [n for n in users if CHAPTERS.index(n) < CHAPTERS.index(ONRAMP)]
    assert not early, f"chapters use the tiny LM before the on-ramp builds it: {early}"


# -- the intro's map (book/_ext/chapter_map.py) -------------------------------------------------
def chapter_map():
    import importlib.util

    spec = importlib.util.spec_from_file_location("chapter_map", ROOT / "book" / "_ext" / "chapter_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
CORE = CONFIG["sphinx"]["config"]["preln_core_path"]


def test_core_path_is_chapters_in_reading_order_starting_with_the_on_ramp():
    assert CORE[0] == ONRAMP
    assert set(CORE) <= set(CHAPTERS), f"preln_core_path names pages that are not chapters: {set(CORE) - set(CHAPTERS)}"
    assert CORE == sorted(CORE, key=ORDER.index), "preln_core_path is in _toc.yml's order"
    for name in CORE:   # a core chapter's prerequisites are on the core path too
        first = next(text(c) for c in cells(name) if c["cell_type"] == "markdown")
        prereqs = DOC_LINK.findall(first.splitlines()[2] if first.splitlines()[1] == "" else first.splitlines()[1])
        off = [p for p in prereqs if p not in CORE]
        assert not off, f"core chapter {name} needs {off}, which the core path skips"


def test_the_map_shows_every_chapter_with_a_time_and_both_paths():
    m = chapter_map()
    rows = m.chapter_rows(ROOT, CORE)
    shown = [c["name"] for _, cs in rows for c in cs]
    assert shown == CHAPTERS, "the map lists the chapters of _toc.yml, in order, once each"
    # numbered as the sidebar numbers them, across the parts
    assert [c["title"].split(". ", 1)[0] for _, cs in rows for c in cs] == \
        [str(k) for k in range(1, len(CHAPTERS) + 1)]
    assert [cap for cap, _ in rows] == [p["caption"] for p in TOC["parts"]][:len(rows)]
    assert all(c["minutes"] >= m.ROUND_MIN and c["minutes"] % m.ROUND_MIN == 0 for _, cs in rows for c in cs)
    svg = m.chapter_map_svg(ROOT, CORE)
    assert "<title" in svg and "<desc" in svg and 'role="img"' in svg
    for _, cs in rows:
        for c in cs:
            assert f'{c["minutes"]} min' in svg
    # the core path's dots: one per core chapter
    assert svg.count(f'r="7" fill="{m.CORE_COLOUR}"') == len(CORE)
    with pytest.raises(ValueError, match="preln_core_path"):
        m.chapter_map_svg(ROOT, CORE + ["no_such_chapter"])


def test_the_map_reads_on_a_phone():
    """Drawn about a phone's column wide: its smallest text is shown at >= 11 px on a 390 px phone,
    and every line of text fits the drawing (titles wrap rather than run into the times)."""
    from preln.chapters.diagrams import text_width

    m = chapter_map()
    assert m.CAPTION_FONT * m.PHONE_PX / m.WIDTH >= m.MIN_SHOWN_PX
    svg = m.chapter_map_svg(ROOT, CORE)
    texts = re.findall(r'<text x="([\d.]+)" y="[\d.]+"([^>]*)>(.*?)</text>', svg)
    assert len(texts) > 2 * len(CHAPTERS)
    for x, attrs, words in texts:
        words = re.sub(r"<[^>]+>", "", words)
        size = float((re.search(r'font-size="([\d.]+)"', attrs) or [0, m.FONT])[1])
        extent = (float(x) - text_width(words, size) if "text-anchor=\"end\"" in attrs
                  else float(x) + text_width(words, size, "bold" in attrs))
        assert 0 <= extent <= m.WIDTH, f"{words!r} runs out of the {m.WIDTH} px map"
        if "text-anchor" not in attrs and not words.isupper() and float(x) == m.TEXT_X:
            # a chapter's title stops short of the times column (bold titles measured bold)
            times_left = m.WIDTH - 8 - max(text_width(f"{c['minutes']} min", m.FONT)
                                           for _, cs in m.chapter_rows(ROOT, CORE) for c in cs)
            assert extent <= times_left, f"{words!r} runs into the reading times"
    intro = (ROOT / "book" / "intro.md").read_text()
    assert f":width: {m.WIDTH}px" in intro, "the intro shows the map at its own width"


def test_reading_time_leaves_out_deeper_cells_and_hidden_code(tmp_path):
    m = chapter_map()
    (tmp_path / "book").mkdir()
    words = " ".join(["word"] * m.READ_WPM * 10)          # ten minutes of prose
    nb = {"cells": [{"cell_type": "code", "source": "# bootstrap", "metadata": {}},
                    {"cell_type": "markdown", "source": words, "metadata": {}},
                    {"cell_type": "markdown", "source": words, "metadata": {"tags": ["deeper"]}},
                    {"cell_type": "code", "source": "x = 1\n" * m.CODE_LPM * 10, "metadata": {}},
                    {"cell_type": "code", "source": "y = 2\n" * 500, "metadata": {"tags": ["hide-input"]}}]}
    (tmp_path / "book" / "t.ipynb").write_text(json.dumps(nb))
    assert m.reading_minutes(tmp_path, "t", first_pass=True) == 20      # prose 10 + code 10
    assert m.reading_minutes(tmp_path, "t", first_pass=False) == 30     # and the side road's 10


# -- numbers glued above the prose that quotes them ------------------------------------------------
# A learner who runs a chapter top to bottom in JupyterLab re-renders each markdown cell when it is
# reached: a number glued by a later cell is not there yet (jupyterlab-myst shows an error). The
# stored outputs say which code cell glued each name (myst-nb's glue output, "scrapbook" metadata).
QUOTE = re.compile(r"""\{glue(?::\w+)?\}`([^`:]+)|glue\.text\(["']([^"':]+)""")


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_quoted_number_is_glued_by_an_earlier_cell(name):
    cs = cells(name)
    glued_at = {}
    for i, c in enumerate(cs):
        for out in c.get("outputs", []):
            key = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if key:
                glued_at.setdefault(key, i)
    late = [f"cell {i} quotes {key!r}, glued " + (f"by cell {glued_at[key]}" if key in glued_at else "by no cell")
            for i, c in enumerate(cs) if c["cell_type"] == "markdown"
            for a, b in QUOTE.findall(text(c)) for key in [a or b]
            if glued_at.get(key, len(cs)) > i]
    assert not late, (f"{name}: move each glue(...) above the first markdown cell that quotes it "
                      "(Run All in JupyterLab would show an error there):\n" + "\n".join(late))
