"""One name per chapter (issue 33): the sidebar, the page's heading and every link to the chapter
name it alike — its number and its short title of _toc.yml ("6. Why Pre-LN: ..." in the sidebar
and the heading, "Chapter 6, Why Pre-LN: ..." in a sentence, book/_ext/preln_site.py), on the
built site.
"""
from __future__ import annotations

import html
import re

import pytest
import yaml

from tests.browser.conftest import ROOT, SITE

pytestmark = pytest.mark.browser

TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
# chapter -> (number, title), numbered across the parts as the sidebar numbers them
CHAPTERS = {}
for part in TOC["parts"]:
    if part.get("numbered"):
        for entry in part["chapters"]:
            name = entry["file"].rsplit("/", 1)[-1]
            CHAPTERS[name] = (len(CHAPTERS) + 1, entry["title"])
TAG = re.compile(r"<[^>]+>")


def _text(fragment: str) -> str:
    return " ".join(html.unescape(TAG.sub("", fragment)).split())


def _page(name: str) -> str:
    path = SITE / "book" / f"{name}.html"
    if not path.is_file():
        pytest.skip(f"{path} is not built: run `make book`")
    return path.read_text(encoding="utf-8")


def test_chapters_are_numbered_from_one():
    assert len(CHAPTERS) >= 15 and list(CHAPTERS)[0] == "build_and_train"


@pytest.mark.parametrize("name", sorted(CHAPTERS))
def test_sidebar_and_heading_name_the_chapter_alike(name):
    number, title = CHAPTERS[name]
    page = _page(name)
    # the article's heading (the theme's print header has an <h1> of its own, unnumbered)
    h1 = re.search(r'<h1>(<span class="section-number">.*?)<a class="headerlink"', page, re.S)
    assert h1 and _text(h1.group(1)) == f"{number}. {title}", (name, h1 and _text(h1.group(1)))
    side = re.search(rf'<a class="reference internal" href="{name}\.html">(.*?)</a>', _page("intro"), re.S)
    assert side and _text(side.group(1)) == f"{number}. {title}", (name, side and side.group(1))


def test_links_to_chapters_carry_number_and_title():
    wrong, seen = [], 0
    for path in sorted((SITE / "book").glob("*.html")):
        page = path.read_text(encoding="utf-8")
        for href, text in re.findall(r'<a class="reference internal" href="([\w]+)\.html">'
                                     r'<span class="doc">(.*?)</span></a>', page, re.S):
            if href in CHAPTERS:
                seen += 1
                number, title = CHAPTERS[href]
                if _text(text) != f"Chapter {number}, {title}":
                    wrong.append(f"{path.name} -> {href}: {_text(text)!r}")
    if not seen:
        pytest.skip("the site is not built (no chapter links found)")
    assert seen > 50, seen
    assert wrong == []
