"""Fixtures for the browser tests: the built site on a local server, and headless Chromium.

The tests need `_build/html` (`make book`) and a Chromium binary (Debian: `apt-get install
chromium`; or set PRELN_CHROMIUM=/path/to/chrome). Without either they skip with a reason — except
in CI (CI=true), where a missing browser or site is a failure. Playwright never downloads a browser
here: it drives the system Chromium through `executable_path` (scripts/sitebrowser.py).

`open_page(name, mode=..., width=...)` opens a page of the site in a fresh browser context (light or
dark colour scheme, a viewport width) with every request outside the local server aborted and
every request, failure, console error and page error recorded.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.browser.browser_checks import sitebrowser

ROOT = Path(__file__).resolve().parents[2]

SITE = sitebrowser.SITE
SCREENSHOTS = ROOT / "_build" / "screenshots"
IN_CI = os.environ.get("CI", "").lower() == "true"
LOCAL_SCHEMES = {"data", "blob", "about"}


def _missing(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the browser tests must run in CI)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def site_url():
    """Serve _build/html on 127.0.0.1 (a free port) for the whole session."""
    if not (SITE / "index.html").is_file():
        _missing(f"{SITE} is not built: run `make book` (or `make test-site`)")
    server, url = sitebrowser.serve(SITE)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser():
    if sitebrowser.find_chromium() is None:
        _missing("no Chromium found (apt-get install chromium, or set PRELN_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright Python package is not installed")
    with sync_playwright() as p:
        b = sitebrowser.launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def screenshot_dir():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def open_page(browser, site_url):
    """open_page(path, mode="light"|"dark", width=1280) -> (page, log).

    ``path`` is a page name from _toc.yml (``book/intro``), or a path with an extension or query
    (``search.html?q=softmax``). The colour scheme is emulated (prefers-color-scheme), which the
    theme (default_mode: auto) turns into html[data-theme]. Requests to any origin but the local
    server are aborted (and reported), so a page that depends on the internet fails here instead
    of hanging.
    """
    contexts = []
    origin = urlsplit(site_url).netloc

    def _open(path: str, mode: str = "light", width: int = 1280, height: int = 900):
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=mode,
                                      service_workers="block")
        contexts.append(context)
        log = {"foreign": [], "failed": [], "bad_status": [], "console": [], "page_errors": [],
               "requests": []}

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
        page.on("request", lambda r: log["requests"].append(r.url))
        page.on("requestfailed", lambda r: urlsplit(r.url).netloc == origin
                and log["failed"].append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and log["bad_status"].append(f"{r.status} {r.url}"))
        target = path if ("." in path.rsplit("/", 1)[-1] or "?" in path) else f"{path}.html"
        page.goto(f"{site_url}/{target}", wait_until="load")
        return page, log

    yield _open
    for context in contexts:
        context.close()

