"""Every page of the table of contents, the index, the search page and a search with results, in
headless Chromium, in three states of one visit (one load: MathJax typesets once):

1. light mode, 1280 px: the page loads cleanly and offline (nothing from another origin, no
   error); its first load meets the weight targets and skips the theme's 1.5 MB fontawesome.js;
   math is typeset, out of the Tab order, with assistive MathML; widgets render where there are
   widgets and nothing of the widget manager loads where there are none; explorable frames are
   files, not inlined; images load and have alt text; axe-core 4.14 finds no WCAG 2.1 A/AA
   violation; every explorable works as an accessible widget (named, grouped, keyboard,
   announcing, focus ring >= 3:1); each side road ("Deeper", a run of `deeper` cells) is a closed
   <details> named by its summary that Enter opens, and all are then opened for the checks.
2. dark mode (prefers-color-scheme, which the theme turns into html[data-theme=dark]): axe finds
   nothing; the explorables' focus rings stand out against the dark page.
3. 320 CSS px: no sideways scrolling; whatever is wider scrolls in a focusable, named group (not a landmark); axe
   (all rules but colour contrast, already checked) finds nothing.

Each state's failures are collected and reported together. Screenshots go to _build/screenshots.
Pages come from _toc.yml, so a new chapter is tested as soon as it is listed.
"""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.book_toc import toc_files
from tests.browser.browser_checks import (AXE_JS, assert_clean, axe_version, axe_violations,
                                          check_explorables, check_math, scroll_regions,
                                          scrolls_sideways, sitebrowser)
from preln import nb

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.browser

PAGES = toc_files()
SEARCH_TERM = "softmax"
SEARCH = f"search.html?q={SEARCH_TERM}"
SPECIAL = ["genindex", "search", SEARCH]   # Sphinx's own pages
AXE_VERSION = "4.14"                       # the audit's axe-core (vendor/tests/axe-core)
WIDGET_FILES = ("requirejs/require.js", "jupyter-widgets/embed-amd.js", "preln-widgets.js")
# The weight targets (HTML <= 400 kB, first load <= 4 MB) hold for every chapter; the API
# reference is held to the first-load target only (sitebrowser.REFERENCE_PAGES says why).
REFERENCE_PAGES = sitebrowser.REFERENCE_PAGES


def _shot(page, screenshot_dir, name, suffix="", full=True):
    stem = name.replace("/", "__").replace(".html?q=", "-")
    page.screenshot(path=str(screenshot_dir / f"{stem}{suffix}.png"), full_page=full)


def _check_axe(page, name, mode, contrast=True):
    assert page.evaluate("() => document.documentElement.dataset.theme") == mode, \
        f"{name}: prefers-color-scheme {mode} did not give html[data-theme={mode}]"
    stem = name.replace("/", "__").replace(".html?q=", "-")
    found = axe_violations(page, contrast=contrast, record=f"{stem}-{mode}-{page.viewport_size['width']}")
    assert axe_version(page).startswith(AXE_VERSION), f"axe-core {axe_version(page)}, not {AXE_VERSION}"
    assert not found, f"{name} ({mode}, {page.viewport_size['width']} px): axe-core WCAG 2.1 A/AA " \
                      "violations:\n  " + "\n  ".join(found)


def _check_weight(name, log):
    html = (sitebrowser.SITE / f"{name}.html").stat().st_size
    first = sitebrowser.weigh(log["requests"])
    if name not in REFERENCE_PAGES:
        assert html <= sitebrowser.HTML_LIMIT, f"{name}: {html / 1e3:.0f} kB of HTML (target <= 400 kB)"
    assert first["total"] <= sitebrowser.FIRST_LOAD_LIMIT, \
        f"{name}: the first load transfers {first['total'] / 1e6:.2f} MB (target <= 4 MB): {first}"


def _check_widgets(page, name, log):
    n_views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    has_state = page.locator('script[type="application/vnd.jupyter.widget-state+json"]').count()
    loaded = [u for u in log["requests"] if any(f in u for f in WIDGET_FILES)]
    if not n_views:
        assert not has_state and not loaded, \
            f"{name}: no widget on the page, but widget state / the widget manager is loaded: {loaded}"
        return
    assert has_state, f"{name}: widget views but no widget state (save the notebook's widget state)"
    try:
        page.wait_for_function(
            "n => document.querySelectorAll('.widget-subarea .jupyter-widgets').length >= n",
            arg=n_views, timeout=sitebrowser.SETTLE_MS)
    except Exception:
        rendered = page.locator(".widget-subarea .jupyter-widgets").count()
        pytest.fail(f"{name}: {n_views} widget views, {rendered} rendered by the widget manager")
    errors = page.locator(".widget-subarea .widget-error, .jupyter-widgets.widget-error").count()
    assert not errors, f"{name}: {errors} widgets show a rendering error"


def _check_frames_are_files(page, name, log):
    """The page's HTML carries no image data; explorable frames load when needed, not all at once."""
    html = page.request.get(page.url).text()
    assert "data:image/png;base64" not in html, f"{name}: PNG data inlined in the page's HTML"
    n_explorables = page.locator("figure.preln-explorable").count()
    frames = [u for u in log["requests"] if "/_frames/" in u]
    assert len(frames) <= n_explorables, \
        f"{name}: {len(frames)} frames fetched on load for {n_explorables} explorables (only the first, lazily)"


def _check_images(page, name):
    missing = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article img'))
        .filter(i => !(i.getAttribute('alt') || '').trim()).map(i => i.src.slice(0, 80))""")
    assert not missing, f"{name}: images without alt text: {missing}"
    # a figure's alt is short (a screen reader reads it whole); the rest is a description it names
    figures = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article .cell_output img'))
        .map(i => { const d = i.getAttribute('aria-describedby');
                    const p = d && document.getElementById(d);
                    return {src: i.src.slice(-20), alt: i.alt, described: d, found: !!p,
                            words: p ? p.textContent.trim().length : 0}; })""")
    long = [f["src"] for f in figures if len(f["alt"]) > nb.ALT_MAX]
    assert not long, f"{name}: figure alts over {nb.ALT_MAX} characters: {long}"
    dangling = [f["src"] for f in figures if f["described"] and not (f["found"] and f["words"])]
    assert not dangling, f"{name}: aria-describedby names no description: {dangling}"
    page.evaluate("""() => Promise.all(Array.from(document.querySelectorAll('.bd-article img'))
        .map(i => { i.loading = 'eager'; return i.decode().catch(() => null); }))""")
    broken = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article img'))
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80))""")
    assert not broken, f"{name}: images that did not load: {broken}"


DEEPER_SUMMARY = "Deeper \u2014 skip on a first reading: "


def _check_deeper(page, name):
    """Each side road (book/_ext/preln_site.py: a run of `deeper` cells) is a closed <details>
    whose <summary> names it, opened by the keyboard; then all are opened, so that the checks that
    follow (images, axe in both modes, reflow) see what is inside."""
    blocks = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article details.preln-deeper'))
        .map(d => ({open: d.open, summary: d.firstElementChild && d.firstElementChild.tagName === 'SUMMARY'
                    ? d.firstElementChild.textContent.trim() : null}))""")
    bad = [b for b in blocks if b["open"] or not (b["summary"] or "").startswith(DEEPER_SUMMARY.strip())
           or len(b["summary"]) <= len(DEEPER_SUMMARY)]
    assert not bad, f"{name}: side roads not closed or without a naming summary: {bad}"
    if blocks:
        summary = page.locator(".bd-article details.preln-deeper > summary").first
        summary.focus()
        page.keyboard.press("Enter")
        assert page.evaluate("() => document.querySelector('.bd-article details.preln-deeper').open"), \
            f"{name}: Enter on a side road's summary does not open it"
    page.evaluate("() => document.querySelectorAll('.bd-article details.preln-deeper').forEach(d => { d.open = true; })")


def _check_search(page, log):
    """A search lists the matching pages without downloading them (no summaries fetched)."""
    page.wait_for_selector("#search-results ul.search li", timeout=20_000)
    hits = page.locator("#search-results ul.search li").count()
    assert hits >= 3, f"searching {SEARCH_TERM!r} found {hits} results"
    sitebrowser.settle(page, network_ms=2_000)
    fetched = [u for u in log["requests"] if urlsplit(u).path.endswith(".html") and "/search.html" not in u]
    assert not fetched, f"the search downloaded whole pages: {fetched}"


def _check_reflow(page, name):
    size = scrolls_sideways(page)
    assert size["width"] <= size["viewport"], \
        f"{name}: at 320 CSS px the page is {size['width']} px wide; sticking out: {size['wide']}"
    unnamed = [r for r in scroll_regions(page) if r["tabindex"] < 0 or not r["label"] or r["role"] != "group"]
    assert not unnamed, f"{name}: boxes that scroll sideways but are not focusable, named groups (not landmarks): {unnamed[:5]}"


@pytest.mark.parametrize("name", PAGES + SPECIAL)
def test_page(open_page, screenshot_dir, name):
    problems = []

    def check(fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except AssertionError as err:
            problems.append(str(err))

    # 1. light mode, 1280 px: a reader's first visit
    page, log = open_page(name)
    sitebrowser.settle(page)
    if name == SEARCH:
        check(_check_search, page, log)
    if name in PAGES:
        check(_check_weight, name, log)       # before anything is scrolled to or loaded eagerly
        check(_check_frames_are_files, page, name, log)
    check(check_math, page, name)
    check(_check_widgets, page, name, log)
    check(_check_deeper, page, name)
    check(_check_images, page, name)
    _shot(page, screenshot_dir, name)
    check(_check_axe, page, name, "light")
    check(check_explorables, page, name)
    # 2. dark mode
    page.emulate_media(color_scheme="dark")
    page.wait_for_function("() => document.documentElement.dataset.theme === 'dark'", timeout=5_000)
    _shot(page, screenshot_dir, name, "-dark", full=False)
    check(_check_axe, page, name, "dark")
    check(check_explorables, page, name, interact=False)   # names, and focus rings on the dark page
    # 3. 320 CSS px (light)
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 320, "height": 640})
    page.wait_for_timeout(400)      # preln-site.js marks the scrolling boxes 200 ms after a resize
    check(_check_reflow, page, name)
    _shot(page, screenshot_dir, name, "-320", full=False)
    check(_check_axe, page, name, "light", contrast=False)
    sitebrowser.settle(page, network_ms=2_000)
    check(assert_clean, log, name)
    assert not problems, f"{name}: {len(problems)} problem(s):\n" + "\n".join(problems)


def test_toc_pages_are_built(site_url):
    missing = [p for p in PAGES if not (ROOT / "_build" / "html" / f"{p}.html").is_file()]
    assert not missing, f"pages in _toc.yml that the build did not produce: {missing}"


# What a formula that swallowed prose looks like: a `$` paired with the wrong one (a `$$` block
# inside a list item's paragraph, or a line inside `$...$` that starts "+ " and so a list item)
# turns the text between formulas into math, which MathJax spells letter by letter.
_MATH = re.compile(r'<span class="math notranslate nohighlight">\\\((.*?)\\\)</span>', re.S)
_PROSE_IN_MATH = re.compile(r"\b(the|and|of|is|to|in|are)\s+[a-z]{3,}\s+[a-z]{3,}")
_TEXT_COMMANDS = re.compile(r"\\(text|mathrm|operatorname|textrm|mbox)\{[^}]*\}")


def test_no_formula_swallows_prose():
    swallowed = {}
    for name in PAGES:
        page = (sitebrowser.SITE / f"{name}.html").read_text(encoding="utf-8")
        bad = [m.group(1)[:60] for m in _MATH.finditer(page)
               if _PROSE_IN_MATH.search(_TEXT_COMMANDS.sub("", m.group(1)))]
        if bad:
            swallowed[name] = bad
    assert not swallowed, f"prose typeset as math (a mismatched $): {swallowed}"
    # the check can fail: it finds the mismatch it was written for
    assert _PROSE_IN_MATH.search(r") and writes them back. Block sizes ")


def test_axe_is_the_audited_version():
    head = AXE_JS.read_text(encoding="utf-8")[:200]
    assert f"axe v{AXE_VERSION}" in head, f"{AXE_JS} is not axe-core {AXE_VERSION}: {head[:40]!r}"


def test_no_page_loads_fontawesome_js():
    """The theme's 1.49 MB Font Awesome script is left out of every page (its icons come from
    the theme's webfonts, cut to the glyphs the pages use)."""
    pages = [p for p in sitebrowser.SITE.rglob("*.html") if "_static" not in p.parts]   # not the theme's macros
    assert len(pages) > len(PAGES)
    loading = [str(p.relative_to(sitebrowser.SITE)) for p in pages
               if re.search(r"<script[^>]*fontawesome\.js", p.read_text(encoding="utf-8"))]
    assert not loading, f"pages that load fontawesome.js: {loading[:5]}"
    fonts = list((sitebrowser.SITE / "_static" / "vendor" / "fontawesome" / "webfonts").glob("*.woff2"))
    assert fonts and all(f.stat().st_size < 20_000 for f in fonts), \
        f"icon fonts not cut to the glyphs used: {[(f.name, f.stat().st_size) for f in fonts]}"


def test_download_links_resolve(site_url):
    """Every download link of the book (the Course page's student notebooks and the PDF edition,
    above all) is served by the site itself: a local URL that answers 200. The links are Sphinx's
    static markup (class "download"), read from the built pages; no script adds any."""
    import json
    import urllib.request
    from urllib.parse import urljoin

    origin = urlsplit(site_url).netloc
    seen = 0
    for name in PAGES:
        page_url = f"{site_url}/{name}.html"
        built = (sitebrowser.SITE / f"{name}.html").read_text(encoding="utf-8")
        hrefs = [urljoin(page_url, h) for h in re.findall(
            r'<a\b[^>]*class="[^"]*\bdownload\b[^"]*"[^>]*href="([^"]+)"', built)
            + re.findall(r'<a\b[^>]*href="([^"]+)"[^>]*class="[^"]*\bdownload\b[^"]*"', built)]
        for href in hrefs:
            seen += 1
            assert urlsplit(href).netloc == origin, f"{name}: download from elsewhere: {href}"
            with urllib.request.urlopen(href, timeout=30) as resp:
                assert resp.status == 200, f"{name}: download link {href} answers {resp.status}"
                body = resp.read()
            if href.endswith(".ipynb"):
                assert "nbformat" in json.loads(body), f"{name}: {href} is not a notebook"
            if href.endswith(".pdf"):
                assert body[:5] == b"%PDF-", f"{name}: {href} is not a PDF"
    expected = len(list((ROOT / "assignments" / "source").glob("*/*.ipynb"))) + 1
    assert seen >= expected, (f"{seen} download links in the book; the Course page alone should have "
                              f"{expected}: a student notebook per assignment and the PDF")
