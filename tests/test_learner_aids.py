"""The learner aids of issue 31, in the one form every chapter uses (the learner-path conventions):

- "Predict, then run": a markdown cell with an admonition of class `predict`, then the code cell
  that shows the answer (>= 2 per chapter, core or not);
- "Write the line": a code cell tagged `exercise` holding a blank (`...`), then a code cell that
  calls `check_line` (>= 1 per core chapter);
- "Deeper -- skip on a first reading": every cell of a side road tagged `deeper`, the run opening
  with a markdown heading "Deeper: ..." and the paragraph "*Skip on a first reading: ...*"; a core
  chapter's first pass (its markdown words outside `deeper` cells) at most FIRST_PASS_MAX words;
- "Summary", then "Exercises": the last two `##` sections of every chapter.

Each chapter is its own test case, so that a failing run names every chapter that fails. The last
tests build a tiny book with the site's extension (book/_ext/preln_site.py) and check that each run
of `deeper` cells becomes one closed <details> with a summary, the main path outside it.
"""
from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
# the core path (a first reading), as _config.yml's preln_core_path states it for the intro's map
CORE = yaml.safe_load((BOOK.parent / "_config.yml").read_text())["sphinx"]["config"]["preln_core_path"]
CORE_CHAPTERS = [name for name in CORE if (BOOK / f"{name}.ipynb").is_file()]
CHAPTERS = sorted(p.stem for p in BOOK.glob("*.ipynb"))
# "a first pass through a core chapter is at most ~2,500 words" (issue 31): the ~ is this margin
FIRST_PASS_MAX = 2600
MIN_PREDICT = 2
MIN_EXERCISE = 1

DEEPER = "deeper"
DEEPER_HEADING = re.compile(r"^#{1,6} Deeper: \S")
SKIP_LINE = re.compile(r"^\*Skip on a first reading: .+\*$")
PREDICT = re.compile(r"^(`{3,}|:{3,})\{admonition\} Predict, then run\s*\n:class:[^\n]*\bpredict\b", re.M)
# a fence that opens code (no info, a language, or a code directive), not a directive's prose
CODE_INFO = re.compile(r"^(?:[\w+-]*|\{(?:code-block|code-cell|code)\}.*)$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})(.*)$")


def load(name: str) -> list[dict]:
    cells = json.loads((BOOK / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
    return [c for c in cells if "".join(c["source"]).strip()]       # empty cells are not rendered


def source(cell) -> str:
    return "".join(cell["source"])


def tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def without_code(markdown: str) -> str:
    """A markdown cell's text without its fenced code blocks (directives' fences stay: prose)."""
    kept, stack = [], []                         # the open fences: (marker, is code)
    for line in markdown.splitlines():
        m = FENCE.match(line)
        if m and stack and m.group(1)[0] == stack[-1][0][0] and len(m.group(1)) >= len(stack[-1][0]) \
                and not m.group(2).strip():
            closed = stack.pop()                 # a bare fence of the open kind closes it
            if not closed[1] and not any(code for _, code in stack):
                kept.append(line)
            continue
        if m and not any(code for _, code in stack):
            stack.append((m.group(1), bool(CODE_INFO.match(m.group(2).strip())) and m.group(1)[0] != ":"))
        if not any(code for _, code in stack):
            kept.append(line)
    return "\n".join(kept)


#: a directive's option line (:alt:, :name:, ...): alt text is read to a screen reader in place of
#: the figure, not shown beside it, and the others are not shown at all
OPTION_LINE = re.compile(r"^:[a-z-]+:.*$", re.M)


def prose_words(markdown: str) -> int:
    """Words a reader reads in a markdown cell: fenced code and directive options left out (math
    and roles count as words)."""
    return len(OPTION_LINE.sub("", without_code(markdown)).split())


def first_pass_words(cells) -> int:
    return sum(prose_words(source(c)) for c in cells if c["cell_type"] == "markdown" and DEEPER not in tags(c))


def deeper_runs(cells) -> list[list[dict]]:
    runs, run = [], []
    for cell in cells:
        if DEEPER in tags(cell):
            run.append(cell)
        elif run:
            runs.append(run)
            run = []
    return runs + ([run] if run else [])


def h2_sections(cells) -> list[str]:
    heads = []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            text = without_code(source(cell))
            heads += [m.strip() for m in re.findall(r"^## (.+)$", text, re.M)]
    return heads


# ---- every chapter: predict, then run (the core chapters and the others alike) --------------------

@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_has_predict_prompts_each_answered_by_the_next_code_cell(name):
    cells = load(name)
    prompts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and PREDICT.search(source(c))]
    assert len(prompts) >= MIN_PREDICT, f"{name}: {len(prompts)} 'Predict, then run' prompts, want >= {MIN_PREDICT}"
    unanswered = [i for i in prompts if i + 1 >= len(cells) or cells[i + 1]["cell_type"] != "code"]
    assert not unanswered, f"{name}: prompts at cells {unanswered} are not followed by the code cell that answers them"


# ---- the core chapters: the other aids are there ---------------------------------------------------

@pytest.mark.parametrize("name", CORE_CHAPTERS)
def test_core_chapter_has_a_write_the_line_exercise_checked_by_check_line(name):
    cells = load(name)
    checked = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and "exercise" in tags(cell):
            assert "..." in source(cell), f"{name}: the exercise cell {i} holds no blank (`...`)"
            after = next((c for c in cells[i + 1:] if c["cell_type"] == "code"), None)
            assert after is not None and "check_line(" in source(after), \
                f"{name}: the exercise cell {i} is not followed by a code cell calling check_line"
            checked.append(i)
    assert len(checked) >= MIN_EXERCISE, f"{name}: {len(checked)} `exercise` cells, want >= {MIN_EXERCISE}"


@pytest.mark.parametrize("name", CORE_CHAPTERS)
def test_core_chapter_first_pass_is_short(name):
    words = first_pass_words(load(name))
    assert words <= FIRST_PASS_MAX, (f"{name}: {words} words of markdown outside `deeper` cells, want "
                                     f"<= {FIRST_PASS_MAX} (mark side roads as deeper)")


# ---- every chapter: the deeper runs and the ending ---------------------------------------------------

@pytest.mark.parametrize("name", CHAPTERS)
def test_every_deeper_run_opens_with_its_heading_and_the_skip_line(name):
    for run in deeper_runs(load(name)):
        first = run[0]
        # the heading (one line), then the paragraph after it (one line, or wrapped over several)
        heading, _, rest = source(first).strip().partition("\n")
        blocks = [heading] + [" ".join(b.split()) for b in re.split(r"\n\s*\n", rest.strip())]
        where = f"{name}: the deeper run starting {source(first)[:60]!r}"
        assert first["cell_type"] == "markdown", f"{where} opens with a code cell"
        assert DEEPER_HEADING.match(blocks[0]), f"{where} does not open with a heading 'Deeper: ...'"
        assert len(blocks) > 1 and SKIP_LINE.match(blocks[1]), \
            f"{where}: the heading is not followed by '*Skip on a first reading: ...*'"
        # the site collapses the run's section: a heading above its level inside the run would leave it
        level = len(heading) - len(heading.lstrip("#"))
        above = [h for c in run if c["cell_type"] == "markdown"
                 for h in re.findall(r"^(#{1,6}) ", without_code(source(c)), re.M) if len(h) < level]
        assert not above, f"{where} holds a heading of a higher level than its own (end the run before it)"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_ends_with_summary_then_exercises(name):
    heads = h2_sections(load(name))
    assert heads[-2:] == ["Summary", "Exercises"], f"{name}: its last `##` sections are {heads[-2:]}"


def test_the_counts_see_what_they_count():
    """The helpers on a made-up chapter: a fence's words and deeper cells are not first-pass."""
    md = lambda text, *t: {"cell_type": "markdown", "source": text, "metadata": {"tags": list(t)}}
    cells = [md("## A\n\none two\n\n```python\nx = 1 + 2\n```\n\n```{note}\nthree\n```"),
             md("### Deeper: X\n*Skip on a first reading: y.*\n\nmany words here", DEEPER),
             md("## Summary\n\nfour"), md("## Exercises")]
    # "## A", "one two", the note's fences and word; "## Summary", "four"; "## Exercises"
    assert first_pass_words(cells) == 2 + 2 + 3 + 3 + 2
    assert [len(r) for r in deeper_runs(cells)] == [1]
    assert h2_sections(cells) == ["A", "Summary", "Exercises"]
    assert PREDICT.search("```{admonition} Predict, then run\n:class: tip predict\nWill it?\n```")
    assert not PREDICT.search("```{admonition} Predict, then run\n:class: tip\nWill it?\n```")


# ---- the site: each run of deeper cells, one closed <details> -----------------------------------

def _site_extension():
    """book/_ext/preln_site.py (loaded by its path, as tests/test_viz.py does)."""
    spec = importlib.util.spec_from_file_location("preln_site", BOOK / "_ext" / "preln_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["preln_site"] = module          # Sphinx pickles the doctrees, with its node classes
    spec.loader.exec_module(module)
    return module


def _tiny_notebook(path: Path, cells):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    nb.metadata.update({"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                        "language_info": {"name": "python"}})
    for kind, text, cell_tags in cells:
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell(text)
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"out of {text}\n")]
        cell.metadata["tags"] = list(cell_tags)
        nb.cells.append(cell)
    nbformat.write(nb, str(path))


TINY = [
    ("md", "# Tiny\n\nMain one.", ()),
    ("md", "## Part A\n\nMain A.", ()),
    ("code", "print('main 1')", ()),
    ("md", "### Deeper: BatchNorm and $x^2$\n\n*Skip on a first reading: little.*\n\nDeeper one.", (DEEPER,)),
    ("code", "print('deeper 1')", (DEEPER, "hide-input")),
    ("md", "#### A sub-heading of the side road\n\nDeeper two.", (DEEPER,)),
    ("md", "Main resumes here.", ()),                   # the main path goes on in the same section
    ("code", "print('main 2')", ()),
    ("md", "## Part B\n\nMain B.", ()),
    ("md", "### Deeper: a second road\n\n*Skip on a first reading: nothing.*", (DEEPER,)),
    ("code", "print('deeper 2')", (DEEPER,)),
    ("md", "### Deeper: a third road, right after\n\n*Skip on a first reading: nothing.*", (DEEPER,)),
    ("code", "print('deeper 3')", (DEEPER,)),             # one run with the second: one <details>
    ("md", "## Summary\n\nMain summary.", ()),          # a heading ends the run
    ("md", "Not a side road.", (DEEPER,)),               # no "Deeper:" heading: left open, warned
]


@pytest.fixture(scope="module")
def tiny_site(tmp_path_factory):
    pytest.importorskip("myst_nb")
    from sphinx.application import Sphinx

    site = _site_extension()
    src = tmp_path_factory.mktemp("tiny")
    _tiny_notebook(src / "tiny.ipynb", TINY)
    (src / "index.md").write_text("# Index\n\n```{toctree}\ntiny\n```\n")
    (src / "conf.py").write_text('extensions = ["myst_nb"]\nnb_execution_mode = "off"\n'
                                 'myst_enable_extensions = ["dollarmath"]\n'
                                 "def setup(app):\n    import preln_site\n    preln_site.setup_deeper(app)\n")
    warnings = io.StringIO()
    app = Sphinx(str(src), str(src), str(src / "_build"), str(src / "_doctrees"), "html",
                 status=None, warning=warnings, freshenv=True)
    app.build()
    html = (src / "_build" / "tiny.html").read_text(encoding="utf-8")
    return site, app, html, warnings.getvalue()


def _details(html: str) -> list[str]:
    """The inside of each <details class="preln-deeper"> (nested <details> included)."""
    blocks = []
    for start in re.finditer(r'<details class="preln-deeper">', html):
        depth, pos = 0, start.start()
        for tag in re.compile(r"<(/?)details\b").finditer(html, pos):
            depth += -1 if tag.group(1) else 1
            if depth == 0:
                blocks.append(html[start.end():tag.start()])
                break
    return blocks


def test_each_deeper_run_is_one_closed_details_with_a_summary(tiny_site):
    site, app, html, _ = tiny_site
    blocks = _details(html)
    assert len(blocks) == 2 and "<details class=\"preln-deeper\" open" not in html
    summaries = [re.match(r'\s*<summary class="preln-deeper-summary">(.*?)</summary>', b, re.S).group(1) for b in blocks]
    assert summaries[0].startswith(site.DEEPER_SUMMARY + "BatchNorm and <span class=\"math")
    assert summaries[1] == site.DEEPER_SUMMARY + "a second road"
    # the whole run is inside: its code cell (hidden input and all), its sub-heading
    assert "out of print(" in blocks[0] and "deeper 1" in blocks[0]
    assert 'id="a-sub-heading-of-the-side-road"' in blocks[0] and "Deeper two." in blocks[0]
    assert "deeper 2" in blocks[1] and "a third road" in blocks[1] and "deeper 3" in blocks[1]


def test_the_main_path_stays_outside_and_headings_stay_anchors(tiny_site):
    site, app, html, warnings = tiny_site
    inside = "".join(_details(html))
    for main in ("Main one.", "Main A.", "main 1", "Main resumes here.", "main 2", "Main B.", "Main summary."):
        assert main in html and main not in inside, main
    # the run's headings keep their ids and stay in the page's contents
    assert 'id="deeper-batchnorm-and-x-2"' in inside
    toc = app.env.tocs["tiny"].astext()
    assert "Deeper: a second road" in toc and "A sub-heading of the side road" in toc
    assert "preln-cell" not in html, "the cell markers are removed"
    # a run without its heading is left open, and the build says so
    assert "Not a side road." in html and "Not a side road." not in inside
    assert "must start with a markdown cell whose heading begins" in warnings


def test_cell_markers_only_in_notebooks_with_deeper_cells():
    site = _site_extension()
    plain = json.dumps({"cells": [{"cell_type": "markdown", "source": "# A", "metadata": {}}]})
    assert site.mark_markdown_cells(plain) == plain
    marked = json.loads(site.mark_markdown_cells(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["# A\n", "text"], "metadata": {}},
        {"cell_type": "code", "source": "x", "metadata": {"tags": [DEEPER]}, "outputs": []},
        {"cell_type": "markdown", "source": "### Deeper: B", "metadata": {"tags": [DEEPER]}},
        {"cell_type": "markdown", "source": "", "metadata": {}}]})))["cells"]
    assert [c["source"] for c in marked] == ["% preln-cell 0 main\n# A\ntext", "x",
                                             "% preln-cell 2 deeper\n### Deeper: B", ""]
