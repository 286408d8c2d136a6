"""Every page of the table of contents in headless Chromium: it loads cleanly and offline,
math is typeset, widgets render, explorables respond, and a screenshot is saved.

Pages come from _toc.yml, so a new chapter is tested as soon as it is listed.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.book_toc import toc_files

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.browser

LOCAL_SCHEMES = {"data", "blob", "about"}
SETTLE_MS = 15_000   # upper bound for MathJax / the widget manager to finish


PAGES = toc_files()


@pytest.fixture
def page_visit(browser, site_url, screenshot_dir):
    """Open a page with every request, response, console message and page error recorded.

    Requests to any origin but the local server are aborted (and reported), so a page that
    depends on the internet fails here instead of hanging.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    origin = urlsplit(site_url).netloc
    log = {"foreign": [], "failed": [], "bad_status": [], "console": [], "page_errors": []}

    def route(r):
        parts = urlsplit(r.request.url)
        if parts.scheme in LOCAL_SCHEMES or (parts.scheme == "http" and parts.netloc == origin):
            r.continue_()
        else:
            log["foreign"].append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.set_default_timeout(60_000)   # long chapters: many formulas and frames
    page.on("console", lambda m: m.type == "error" and log["console"].append(f"{m.text} @ {m.location}"))
    page.on("pageerror", lambda e: log["page_errors"].append(str(e)))
    page.on("requestfailed", lambda r: urlsplit(r.url).netloc == origin
            and log["failed"].append(f"{r.url}: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and log["bad_status"].append(f"{r.status} {r.url}"))

    def visit(name: str):
        page.goto(f"{site_url}/{name}.html", wait_until="load")
        return page, log

    yield visit
    context.close()


def _wait_for_mathjax(page):
    page.wait_for_function(
        "() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)",
        timeout=SETTLE_MS)
    page.evaluate("() => window.MathJax && window.MathJax.startup ? "
                  "window.MathJax.startup.promise.then(() => true) : true")


def _settle(page, timeout=10_000):
    """Wait until the network is quiet; a heavy page may not get there, and that is not an error
    (every request is checked through the event log anyway)."""
    try:
        page.wait_for_load_state("networkidle", timeout=timeout)
    except Exception:
        pass


def _check_math(page, name):
    n_math = page.locator(".math").count()
    if not n_math:
        return
    assert page.evaluate("() => !!(window.MathJax && window.MathJax.version)"), \
        f"{name}: the page has math but MathJax did not load"
    assert page.evaluate("() => window.MathJax.version.startsWith('3')"), f"{name}: MathJax is not v3"
    n_typeset = page.locator(".math mjx-container").count()
    assert n_typeset >= n_math, f"{name}: {n_math} math elements, only {n_typeset} typeset by MathJax"
    raw = page.evaluate(r"""() => Array.from(document.querySelectorAll('.math'))
        .filter(e => !e.querySelector('mjx-container'))
        .map(e => e.textContent.slice(0, 80))""")
    assert not raw, f"{name}: untypeset math left on the page: {raw}"
    body = page.locator(".bd-article").inner_text()
    leftover = [s for s in ("$$", "\\(", "\\[") if s in body]
    assert not leftover, f"{name}: raw TeX delimiters {leftover} left in the text"
    errors = page.locator("mjx-merror").all_inner_texts()
    assert not errors, f"{name}: MathJax errors (undefined macro or missing extension?): {errors}"


def _check_widgets(page, name):
    n_views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    has_state = page.locator('script[type="application/vnd.jupyter.widget-state+json"]').count()
    if not n_views:
        return
    assert has_state, f"{name}: widget views but no widget state (save the notebook's widget state)"
    try:
        page.wait_for_function(
            "n => document.querySelectorAll('.widget-subarea .jupyter-widgets').length >= n",
            arg=n_views, timeout=SETTLE_MS)
    except Exception:
        rendered = page.locator(".widget-subarea .jupyter-widgets").count()
        pytest.fail(f"{name}: {n_views} widget views, {rendered} rendered by the widget manager")
    errors = page.locator(".widget-subarea .widget-error, .jupyter-widgets.widget-error").count()
    assert not errors, f"{name}: {errors} widgets show a rendering error"


def _check_explorables(page, name):
    explorables = page.locator(".preln-explorable")
    for e in range(explorables.count()):
        ex = explorables.nth(e)
        img = ex.locator("img.preln-explorable-frame")
        assert img.count() == 1, f"{name}: explorable #{e} has {img.count()} frame images"
        controls = ex.locator(".preln-explorable-control input, .preln-explorable-control select")
        assert controls.count() >= 1, f"{name}: explorable #{e} has no controls"
        for c in range(controls.count()):
            ctl = controls.nth(c)
            label = ex.locator(f'label[for="{ctl.get_attribute("id")}"]').inner_text()
            output = ex.locator(f'output[for="{ctl.get_attribute("id")}"]')
            before_src, before_alt = img.get_attribute("src"), img.get_attribute("alt")
            before_value = output.inner_text()
            if ctl.evaluate("el => el.tagName") == "SELECT":
                n = ctl.locator("option").count()
                if n < 2:
                    continue
                current = int(ctl.input_value())
                ctl.select_option(index=(current + 1) % n)
            else:
                lo, hi = int(ctl.get_attribute("min")), int(ctl.get_attribute("max"))
                if hi <= lo:
                    continue
                current = int(ctl.input_value())
                ctl.fill(str(hi if current != hi else lo))
            after_src, after_alt = img.get_attribute("src"), img.get_attribute("alt")
            assert after_src != before_src, \
                f"{name}: explorable #{e}: moving control {label!r} did not change the image"
            assert after_alt and after_alt.strip(), f"{name}: explorable #{e}: frame without alt text"
            assert output.inner_text() != before_value or after_alt != before_alt, \
                f"{name}: explorable #{e}: control {label!r} label did not follow the value"
            assert img.evaluate("el => el.decode().then(() => el.naturalWidth > 0)"), \
                f"{name}: explorable #{e}: the new frame did not decode"


def _check_images(page, name):
    missing = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article img'))
        .filter(i => !(i.getAttribute('alt') || '').trim()).map(i => i.src.slice(0, 80))""")
    assert not missing, f"{name}: images without alt text: {missing}"
    broken = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article img'))
        .filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80))""")
    assert not broken, f"{name}: images that did not load: {broken}"


@pytest.mark.parametrize("name", PAGES)
def test_page(page_visit, screenshot_dir, name):
    page, log = page_visit(name)
    _wait_for_mathjax(page)
    _check_math(page, name)
    _check_widgets(page, name)
    _check_images(page, name)
    page.evaluate("() => document.fonts.ready.then(() => true)")
    _settle(page)
    page.screenshot(path=str(screenshot_dir / f"{name.replace('/', '__')}.png"), full_page=True)
    _check_explorables(page, name)
    _settle(page, timeout=3_000)

    assert not log["foreign"], f"{name}: requests to other origins: {log['foreign']}"
    assert not log["failed"], f"{name}: failed requests: {log['failed']}"
    assert not log["bad_status"], f"{name}: HTTP errors: {log['bad_status']}"
    assert not log["page_errors"], f"{name}: JavaScript errors: {log['page_errors']}"
    assert not log["console"], f"{name}: console errors: {log['console']}"


def test_toc_pages_are_built(site_url):
    missing = [p for p in PAGES if not (ROOT / "_build" / "html" / f"{p}.html").is_file()]
    assert not missing, f"pages in _toc.yml that the build did not produce: {missing}"


def test_download_links_resolve(page_visit):
    """Every download link of the book (the Course page's student notebooks, above all) is served
    by the site itself: a local URL that answers 200. (The test above only sees what a page loads.)"""
    for name in PAGES:
        page, _ = page_visit(name)
        hrefs = page.evaluate("""() => Array.from(document.querySelectorAll('a.download'))
            .map(a => a.href)""")
        for href in hrefs:
            assert urlsplit(href).netloc == urlsplit(page.url).netloc, f"{name}: download from elsewhere: {href}"
            resp = page.request.get(href)
            assert resp.status == 200, f"{name}: download link {href} answers {resp.status}"
            if href.endswith(".ipynb"):
                assert "nbformat" in resp.json(), f"{name}: {href} is not a notebook"
