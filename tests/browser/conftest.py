"""Fixtures for the browser tests: the built site on a local server, and headless Chromium.

The tests need `_build/html` (`make book`) and a Chromium binary (Debian: `apt-get install
chromium`; or set PRELN_CHROMIUM=/path/to/chrome). Without either they skip with a reason — except
in CI (CI=true), where a missing browser or site is a failure. Playwright never downloads a browser
here: it drives the system Chromium through `executable_path`.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
IN_CI = os.environ.get("CI", "").lower() == "true"

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def _missing(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the browser tests must run in CI)", pytrace=False)
    pytest.skip(reason)


def find_chromium() -> str | None:
    candidates = [os.environ.get("PRELN_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"), shutil.which("google-chrome")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".woff": "font/woff", ".woff2": "font/woff2",
                      ".svg": "image/svg+xml", ".json": "application/json"}

    def log_message(self, *args):   # keep pytest output readable
        pass


@pytest.fixture(scope="session")
def site_url():
    """Serve _build/html on 127.0.0.1 (a free port) for the whole session."""
    if not (SITE / "index.html").is_file():
        _missing(f"{SITE} is not built: run `make book` (or `make test-site`)")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser():
    chromium = find_chromium()
    if chromium is None:
        _missing("no Chromium found (apt-get install chromium, or set PRELN_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright Python package is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def screenshot_dir():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
