"""The PDF edition (`make pdf`, scripts/make_pdf.py): the whole book, readable offline.

Its text (extracted with pypdf) holds every chapter's title and every figure caption of the site,
the explorables' captions with the settings of the frame printed, and no navigation; each chapter
has a bookmark and starts a page; formulas are typeset (no TeX source left) and the figures are
there. It is tagged (issue 24): one structure tree with every chapter's headings, its tables and
its figures' alt text, its formulas as /Formula elements named by their speech, the language and
title set, and bookmarks that are the headings' plain text, formulas included. Pages come from
_toc.yml.
"""
from __future__ import annotations

import concurrent.futures
import html
import re
import unicodedata
from functools import lru_cache

import pytest
import yaml

from tests.book_toc import toc_files
from tests.browser.browser_checks import sitebrowser
from tests.browser.conftest import IN_CI

pytestmark = pytest.mark.browser

PDF = sitebrowser.ROOT / "_build" / "pdf" / "preln-book.pdf"
IN_SITE = sitebrowser.SITE / "preln-book.pdf"
BOOK_TITLE = yaml.safe_load((sitebrowser.ROOT / "_config.yml").read_text())["title"]
NAVIGATION = ["Skip to main content", "Ctrl+K", "Color mode", "previous page", "next page"]
TEX_LEFT = ["$$", "\\frac", "\\mathrm", "\\begin{", "\\("]


def _norm(text: str) -> str:
    """For matching what a PDF's text layer says: NFKC (ligatures), no whitespace at all, lower case."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text)).replace("\u00ad", "").casefold()


def _strip_tags(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment)).replace("#", " ").strip()


def _prose(fragment: str, shortest: int = 12) -> list[str]:
    """The runs of plain text of an HTML fragment between its formulas (a PDF holds MathJax's
    glyphs, not the TeX), those of at least ``shortest`` characters."""
    parts = re.split(r'<span class="math[^"]*">.*?</span>', fragment, flags=re.S)
    return [t for t in (" ".join(_strip_tags(p).split()) for p in parts) if len(t) >= shortest]


@lru_cache(maxsize=None)
def _site_page(name: str) -> str:
    return (sitebrowser.SITE / f"{name}.html").read_text(encoding="utf-8")


def _article(name: str) -> str:
    page = _site_page(name)
    a, b = page.find('<article class="bd-article">'), page.find("</article>")
    return page[a:b] if a >= 0 and b > a else page


def _chapter_title(name: str) -> str:
    m = re.search(r"<h1[^>]*>(.*?)</h1>", _article(name), re.S)
    return " ".join(_strip_tags(m.group(1)).split()) if m else ""


@lru_cache(maxsize=None)
def _pdf():
    if not PDF.is_file():
        if IN_CI:
            pytest.fail(f"{PDF} is missing: `make test-site` runs `make pdf` first", pytrace=False)
        pytest.skip(f"{PDF} is missing: run `make pdf`")
    from pypdf import PdfReader

    reader = PdfReader(str(PDF))
    # pypdf's text extraction is the slowest part of the browser stage (~40 s for 450 pages):
    # both cores, each its own reader over half the pages
    n = len(reader.pages)
    halves = [(0, n // 2), (n // 2, n)]
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        texts = [t for part in pool.map(_page_texts, [str(PDF)] * 2, *zip(*halves)) for t in part]
    assert len(texts) == n
    return reader, texts


def _page_texts(path: str, start: int, stop: int) -> list[str]:
    from pypdf import PdfReader

    reader = PdfReader(path)
    return [reader.pages[i].extract_text() or "" for i in range(start, stop)]


def test_the_site_publishes_the_pdf():
    _pdf()
    assert IN_SITE.is_file() and IN_SITE.read_bytes() == PDF.read_bytes(), \
        f"{IN_SITE} (linked from the Course page) is not the PDF make pdf wrote"
    assert 'href="../preln-book.pdf"' in _site_page("book/course"), "the Course page does not link the PDF"


def _header(text: str) -> str:
    """A page's running header as make_pdf prints it: the page's <title>, "<chapter> — <book>"."""
    book = _norm(BOOK_TITLE)
    return next((_norm(line) for line in text.splitlines() if _norm(line).endswith("—" + book)), "")


def test_every_chapter_has_a_bookmark_and_starts_a_page():
    reader, texts = _pdf()
    top = [(item.title, reader.get_destination_page_number(item)) for item in reader.outline
           if not isinstance(item, list)]
    titles = {_norm(t): p for t, p in top}
    assert len(top) == len(toc_files()), f"{len(toc_files())} chapters, {len(top)} top-level bookmarks"
    for name in toc_files():
        title = _chapter_title(name)
        assert title, f"{name}: no <h1> in the built page"
        assert _norm(title) in titles, f"{name}: no bookmark {title!r} in the PDF's outline ({[t for t, _ in top]})"
        at = titles[_norm(title)]
        assert _norm(texts[at]).startswith(_norm(title)), \
            f"{name}: the bookmark leads to page {at + 1}, which does not open with the title {title!r}"
        assert _header(texts[at]).startswith(_norm(title)), f"{name}: page {at + 1} has another running header"
        assert at == 0 or _header(texts[at - 1]) != _header(texts[at]), \
            f"{name}: the chapter does not start a page (page {at} belongs to it too)"
    assert len(reader.pages) > 2 * len(toc_files())


def test_figure_captions_and_explorable_settings_are_printed():
    _, texts = _pdf()
    book = _norm(" ".join(texts))
    missing, n = [], 0
    for name in toc_files():
        article = _article(name)
        for caption in re.findall(r"<figcaption[^>]*>(.*?)</figcaption>", article, re.S):
            n += 1
            # an explorable's "Interactive" badge is not printed: paper has no controls
            caption = re.sub(r'<span class="preln-explorable-badge">.*?</span>', "", caption, flags=re.S)
            missing += [f"{name}: {text[:90]!r}" for text in _prose(caption) if _norm(text) not in book]
        for settings in re.findall(r'<span class="preln-explorable-settings">(.*?)</span>', article, re.S):
            n += 1
            if _norm(_strip_tags(settings)) not in book:
                missing.append(f"{name}: explorable settings {settings[:90]!r}")
    assert n >= 10, f"only {n} captions found in the built site"
    assert not missing, f"{len(missing)} of {n} captions are not in the PDF:\n  " + "\n  ".join(missing)


def test_dropdowns_print_open_and_navigation_does_not():
    _, texts = _pdf()
    book = _norm(" ".join(texts))
    for word in NAVIGATION:
        assert _norm(word) not in book, f"the PDF prints the site's navigation ({word!r})"
    n = 0
    for name in toc_files():
        article = _article(name)
        # <details> dropdowns (sphinx-design; not myst-nb's hidden code cells, details.hide) and
        # sphinx-togglebutton's dropdown admonitions (the exercises' solutions): the first words
        # of each body
        bodies = re.findall(r'<details class="(?![^"]*\bhide\b)[^"]*"[^>]*>.*?</summary>(.*?)</details>', article, re.S)
        bodies += re.findall(r'<div class="[^"]*\bdropdown\b[^"]*">\s*<p class="admonition-title">.*?</p>(.*?)</div>',
                             article, re.S)
        for body in bodies:
            # the prose of its paragraphs (code blocks print as wrapped, highlighted lines)
            runs = [r for para in re.findall(r"<p>(.*?)</p>", body, re.S) for r in _prose(para, shortest=20)]
            if runs:
                n += 1
                assert _norm(runs[0]) in book, f"{name}: a dropdown's content is not printed: {runs[0][:80]!r}"
    assert n, "no dropdown found in the site (the exercises' solutions are dropdowns)"


def test_math_is_typeset_and_figures_are_present():
    reader, texts = _pdf()
    book = " ".join(texts)
    left = [t for t in TEX_LEFT if t in book]
    assert not left, f"TeX source left in the PDF (untypeset math): {left}"
    n_images = 0
    for page in reader.pages:
        xobjects = (page.get("/Resources") or {}).get("/XObject") or {}
        n_images += sum(1 for x in xobjects.values() if x.get_object().get("/Subtype") == "/Image")
    # raster images (an SVG, the intro's block diagram, is printed as vector paths)
    # (a figure's dark-mode variant, class only-dark, is not printed: the PDF shows the light one)
    expected = sum(len(re.findall(r'<img\s(?![^>]*only-dark)[^>]*src="[^"]+\.(?:png|jpe?g|gif|webp)"',
                                  _article(name)))
                   for name in toc_files())
    assert expected >= 10, f"only {expected} raster images in the site's chapters"
    assert n_images >= expected, f"{expected} images in the site's chapters, {n_images} in the PDF"


# ---- tagging (issue 24): one structure tree for the whole book ------------------------------------

def _struct_elements(reader) -> list:
    """Every structure element of the PDF's tree (/StructTreeRoot), in document order."""
    root = reader.trailer["/Root"]
    assert "/StructTreeRoot" in root, "the PDF has no structure tree (untagged)"
    out, stack = [], [root["/StructTreeRoot"].get_object()]
    while stack:
        node = stack.pop()
        if "/S" in node:
            out.append(node)
        kids = node.get("/K")
        kids = kids if isinstance(kids, list) else [] if kids is None else [kids]
        # marked-content ids (numbers) and marked-content references are leaves, not elements
        stack += reversed([k.get_object() for k in kids
                           if hasattr(k.get_object(), "get") and k.get_object().get("/Type") != "/MCR"])
    return out


def _site_lang() -> str:
    return re.search(r'<html lang="([^"]+)"', _site_page(toc_files()[0]))[1]


def test_the_pdf_is_tagged_with_language_and_title():
    reader, _ = _pdf()
    root = reader.trailer["/Root"]
    assert "/StructTreeRoot" in root, "the PDF has no structure tree (untagged): a screen reader gets no headings"
    # (pypdf's BooleanObject equals True; it is not the object True)
    assert root.get("/MarkInfo", {}).get("/Marked") == True, "the PDF is not marked as tagged (/MarkInfo /Marked)"  # noqa: E712
    assert root.get("/Lang") == _site_lang(), f"/Lang is {root.get('/Lang')!r}, the site's pages say {_site_lang()!r}"
    doc_title = (root.get("/ViewerPreferences") or {}).get("/DisplayDocTitle")
    assert doc_title == True, "DisplayDocTitle is not set: a reader's title bar shows the file name, not the title"  # noqa: E712
    assert reader.metadata.title == BOOK_TITLE, f"the PDF's title is {reader.metadata.title!r}"
    assert reader.metadata.author, "the PDF names no author"


def _article_count(pattern: str) -> int:
    return sum(len(re.findall(pattern, _article(name))) for name in toc_files())


def test_the_structure_has_chapters_sections_tables_and_figures_with_alt():
    reader, _ = _pdf()
    elements = _struct_elements(reader)
    kinds = [str(e["/S"]) for e in elements]
    # one H1 per chapter: the chapters' trees were not dropped when the book was put together
    assert kinds.count("/H1") == len(toc_files()), f"{kinds.count('/H1')} H1 elements, {len(toc_files())} chapters"
    assert kinds.count("/H2") >= len(toc_files()), f"only {kinds.count('/H2')} H2 elements"
    tables = _article_count(r"<table\b")
    assert kinds.count("/Table") >= tables, f"{tables} tables in the site's chapters, {kinds.count('/Table')} in the PDF"
    assert "/TH" in kinds, "no table header cell (TH) in the PDF"
    # a Figure that holds the image itself (not the <figure> around an image and its caption)
    def holds_figure(e):      # a <figure> (image, caption) holds the image's Figure at any depth
        kids = e.get("/K") if isinstance(e.get("/K"), list) else [e.get("/K")]
        for k in kids:
            k = k.get_object() if k is not None and hasattr(k, "get_object") else k
            if hasattr(k, "get") and (str(k.get("/S", "")) == "/Figure" or holds_figure(k)):
                return True
        return False

    images = [e for e in elements if e["/S"] == "/Figure" and not holds_figure(e)]
    no_alt = [i for i, e in enumerate(images) if not str(e.get("/Alt", "")).strip()]
    described = _article_count(r'<img\s(?![^>]*only-dark)[^>]*alt="[^"]+')
    assert described >= 10, f"only {described} images with alt text in the site's chapters"
    assert len(images) >= described, f"{described} images with alt text in the site, {len(images)} Figure elements"
    assert not no_alt, f"{len(no_alt)} of {len(images)} figures in the PDF have no /Alt"
    # every formula of the site's chapters a /Formula element, named by its speech (MathJax's
    # semantic-enrich, as the site speaks it), not TeX
    formulas = [e for e in elements if e["/S"] == "/Formula"]
    in_site = _article_count(r'class="math notranslate nohighlight"')
    assert len(formulas) >= in_site > 100, f"{in_site} formulas in the site's chapters, {len(formulas)} /Formula elements"
    unnamed = [i for i, e in enumerate(formulas) if not str(e.get("/Alt", "")).strip()]
    assert not unnamed, f"{len(unnamed)} of {len(formulas)} formulas in the PDF have no /Alt"
    tex = [str(e["/Alt"])[:60] for e in formulas if "\\" in str(e["/Alt"])]
    assert not tex, f"formulas named by their TeX source: {tex[:3]}"


def _site_headings() -> list[tuple[str, bool]]:
    """Every heading of the site's chapters in reading order: its prose (formulas cut out) and
    whether it holds a formula."""
    out = []
    for name in toc_files():
        for inner in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", _article(name), re.S):
            inner = re.sub(r'<a class="headerlink".*?</a>', "", inner, flags=re.S)
            out.append((inner, 'class="math' in inner))
    return out


def _flat_outline(reader) -> list[str]:
    out, stack = [], list(reversed(reader.outline))
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack += reversed(item)
        else:
            out.append(item.title)
    return out


def test_bookmarks_are_the_headings_plain_text_with_formulas():
    reader, _ = _pdf()
    marks, headings = _flat_outline(reader), _site_headings()
    assert len(marks) == len(headings), f"{len(headings)} headings in the site's chapters, {len(marks)} bookmarks"
    wrong, with_math = [], 0
    for mark, (inner, has_math) in zip(marks, headings):
        # the bookmark's text is the heading's, in order: no doubled or run-together words
        # ("LayerNormLayerNorm", "every tensor, everyFLOP"); a formula is kept as text, no TeX
        # its text between formulas, tags removed without a space (`<code>pip</code>,` is "pip,")
        prose = [" ".join(html.unescape(re.sub(r"<[^>]+>", "", p)).split())
                 for p in re.split(r'<span class="math[^"]*">.*?</span>', inner, flags=re.S)]
        prose = [p for p in prose if p]
        at = 0
        for part in prose:
            at = mark.find(part, at)
            if at < 0:
                break
            at += len(part)
        if at < 0 or re.search(r"\b(\w{3,})\1\b", mark) or "\\" in mark:
            wrong.append(f"{mark!r} for {_strip_tags(inner)!r}")
        elif has_math:
            with_math += 1
            if len(_norm(mark)) <= len(_norm("".join(prose))):
                wrong.append(f"{mark!r}: the formula of {_strip_tags(inner)!r} is missing")
    assert not wrong, f"{len(wrong)} of {len(marks)} bookmarks are not the heading's text:\n  " + "\n  ".join(wrong[:20])
    assert with_math >= 3, f"only {with_math} headings with a formula checked"
    assert any("√" in m for m in marks), "no bookmark keeps a formula as text (Why 1/√d_h)"


def test_links_between_chapters_stay_in_the_pdf():
    reader, _ = _pdf()
    internal, local = 0, []
    for page in reader.pages:
        for annot in page.get("/Annots") or []:
            annot = annot.get_object()
            action = annot.get("/A")
            action = action.get_object() if action is not None else {}
            if "/URI" in action:
                if re.match(r"https?://(127\.0\.0\.1|localhost)[:/]", str(action["/URI"])):
                    local.append(str(action["/URI"]))
            elif "/Dest" in annot or action.get("/S") == "/GoTo":
                internal += 1
    assert not local, f"{len(local)} links point at the local server make pdf ran: {local[:5]}"
    # cross-references (to a section, a figure, another chapter) are destinations inside the book
    assert internal >= _article_count(r'<a class="reference internal" href="#'), f"only {internal} internal links"
