"""The built site in headless Chromium: shared by `make pdf` (scripts/make_pdf.py), the page-weight
table (scripts/page_weight.py) and the browser tests (tests/browser).

- `serve(directory)`: the site on a local HTTP server (a free port on 127.0.0.1).
- `launch(playwright)`: the system Chromium, never a downloaded one (PRELN_CHROMIUM overrides
  /usr/bin/chromium).
- `settle(page)`: wait for MathJax to typeset, every formula's spoken name, the fonts, and a
  quiet network.
- `pages()`: the book's pages in reading order, from _toc.yml.
"""
from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "_build" / "html"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
SETTLE_MS = 15_000   # upper bound for MathJax to finish a long chapter
# upper bound for every formula to get its speech (book/_static/preln-site.js names them a batch
# at a time after typesetting; the longest chapter takes a few seconds, the joined PDF more)
SPEECH_MS = 60_000


def find_chromium() -> str | None:
    candidates = [os.environ.get("PRELN_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"), shutil.which("google-chrome")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def launch(playwright):
    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found (Debian: apt-get install chromium; or set PRELN_CHROMIUM)")
    return playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".woff": "font/woff", ".woff2": "font/woff2",
                      ".svg": "image/svg+xml", ".json": "application/json", ".pdf": "application/pdf"}

    def log_message(self, *args):   # keep test and script output readable
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a browser that stops a download it no longer needs (a prefetch, a closed page) is not
        # an error worth a traceback
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def serve(directory: Path = SITE):
    """Serve ``directory`` on 127.0.0.1 (a free port) from a daemon thread: (server, base URL).
    Call ``server.shutdown()`` when done."""
    server = _Server(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def settle(page, network_ms: int = 5_000, speech_ms: int = SPEECH_MS) -> None:
    """Wait for MathJax to finish typesetting, then for every formula's speech (its accessible
    name: preln-site.js sets ``<html data-preln-speech="done">``), the fonts, then a quiet network
    (a heavy page may not get there, and that is not an error: callers check requests themselves).
    Speech that fails, or is not done within ``speech_ms``, raises RuntimeError."""
    page.wait_for_function(
        "() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)",
        timeout=SETTLE_MS)
    page.evaluate("() => window.MathJax && window.MathJax.startup ? "
                  "window.MathJax.startup.promise.then(() => true) : true")
    # (a page without MathJax has no formulas and preln-site.js sets nothing)
    speech_js = ("() => !(window.MathJax && window.MathJax.startup) || "
                 "['done', 'none', 'failed'].includes(document.documentElement.dataset.prelnSpeech)")
    try:
        page.wait_for_function(speech_js, timeout=speech_ms)
    except Exception as err:
        raise RuntimeError(f"settle: the formulas of {page.url} have no speech after {speech_ms} ms "
                           f"(data-preln-speech={page.evaluate(_SPEECH_STATE)!r}; preln-site.js "
                           "names them after MathJax typesets)") from err
    state = page.evaluate(_SPEECH_STATE)
    if state == "failed":
        raise RuntimeError(f"settle: formula speech failed on {page.url} (data-preln-speech='failed': "
                           "see the console's 'preln: formula speech unavailable')")
    page.evaluate("() => document.fonts.ready.then(() => true)")
    try:
        page.wait_for_load_state("networkidle", timeout=network_ms)
    except Exception:
        pass


_SPEECH_STATE = "() => document.documentElement.dataset.prelnSpeech || null"


def pages() -> list[str]:
    """The book's pages in reading order (``book/intro``, ...), from _toc.yml (tests/book_toc.py,
    loaded by its path: tests/ is not a package on sys.path)."""
    spec = importlib.util.spec_from_file_location("book_toc", ROOT / "tests" / "book_toc.py")
    book_toc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(book_toc)
    return book_toc.toc_files()


# ---- page weight ----------------------------------------------------------------------------------

HTML_LIMIT = 400_000          # bytes of a chapter's HTML (issue 16)
FIRST_LOAD_LIMIT = 4_000_000  # bytes a chapter's first load transfers: theme, MathJax, fonts included
# Held to the first-load target only: the API reference is one page of ~300 documented objects
# (about 900 kB of HTML, most of it signatures); a page per section of book/api.md would bring each
# under 400 kB.
REFERENCE_PAGES = {"book/api"}
KINDS = {".html": "html", ".js": "scripts", ".css": "styles", ".woff": "fonts", ".woff2": "fonts",
         ".ttf": "fonts", ".png": "images", ".svg": "images", ".jpg": "images", ".gif": "images"}


def local_file(url: str, site: Path = SITE) -> Path | None:
    """The file of the built site a local URL names (None for data: URIs and other origins)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname not in ("127.0.0.1", "localhost"):
        return None
    path = site / unquote(parts.path).lstrip("/")
    if path.is_dir():
        path = path / "index.html"
    return path if path.is_file() else None


def weigh(urls) -> dict:
    """Bytes of what a list of requested URLs transferred (the files' sizes: the local server does
    not compress), by kind: html, scripts, styles, fonts, images, frames (explorable frames), other."""
    out = dict.fromkeys(["html", "scripts", "styles", "fonts", "images", "frames", "other"], 0)
    for path in {p for p in map(local_file, urls) if p is not None}:
        kind = "frames" if "_frames" in path.parts else KINDS.get(path.suffix, "other")
        out[kind] += path.stat().st_size
    out["total"] = sum(out.values())
    return out
