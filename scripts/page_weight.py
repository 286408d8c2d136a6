#!/usr/bin/env python3
"""How heavy each page of the built site is: a table (markdown) for the README.

For every page of _toc.yml, plus the index and the search page: the size of its HTML, and what its
first load transfers in headless Chromium (a fresh browser, 1280 x 900, light mode, until MathJax
has typeset and the network is quiet): the HTML, the theme's and MathJax's scripts and styles, the
fonts, the images and the explorable frames the page shows first. The last column is what moving
every control of every explorable would fetch on top (the page's remaining frames). Targets: HTML
<= 400 kB and first load <= 4 MB per chapter (tests/browser checks both). The local server does
not compress, so the sizes are the files' sizes; a web server's gzip would cut the text further.

    python scripts/page_weight.py        # after `make book`
"""
from __future__ import annotations

import json
import re
import sys

import sitebrowser

PAGES_EXTRA = ["genindex", "search"]


def kb(n: int) -> str:
    return f"{n / 1e3:,.0f} kB" if n < 1e6 else f"{n / 1e6:,.2f} MB"


def all_frames(html: str) -> set[str]:
    """The frame files (URLs relative to the page) an explorable page can fetch."""
    found = set()
    for payload in re.findall(r'<script type="application/json" class="preln-explorable-data">(.*?)</script>', html, re.S):
        found |= {f[0] for f in json.loads(payload)["frames"].values()}
    return found


def measure(names=None):
    from playwright.sync_api import sync_playwright

    names = names or sitebrowser.pages() + PAGES_EXTRA
    server, url = sitebrowser.serve()
    rows = []
    try:
        with sync_playwright() as p:
            browser = sitebrowser.launch(p)
            for name in names:
                context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
                page = context.new_page()
                urls = []
                page.on("requestfinished", lambda r: urls.append(r.url))
                page.goto(f"{url}/{name}.html", wait_until="load")
                sitebrowser.settle(page)
                first = sitebrowser.weigh(urls)
                html_file = sitebrowser.SITE / f"{name}.html"
                base = page.url.rsplit("/", 1)[0] + "/"
                later = sitebrowser.weigh(base + f for f in all_frames(html_file.read_text(encoding="utf-8")))
                rows.append({"page": name, "html": html_file.stat().st_size, "first": first,
                             "frames_total": later["frames"], "frames_first": first["frames"]})
                context.close()
            browser.close()
    finally:
        server.shutdown()
    return rows


def main():
    if not (sitebrowser.SITE / "index.html").is_file():
        sys.exit("page_weight: the site is not built: run `make book` first")
    rows = measure()
    chapters = set(sitebrowser.pages())
    print("| page | HTML | first load | of which scripts | styles | fonts | images + frames | "
          "all frames (on interaction) | targets |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    misses = 0
    for r in rows:
        f = r["first"]
        html_ok, first_ok = r["html"] <= sitebrowser.HTML_LIMIT, f["total"] <= sitebrowser.FIRST_LOAD_LIMIT
        if r["page"] in sitebrowser.REFERENCE_PAGES:        # held to the first-load target only
            verdict = ("PASS" if first_ok else "MISS") + ("" if html_ok else " (first load; reference page)")
        elif r["page"] in chapters:
            verdict = "PASS" if html_ok and first_ok else "MISS"
        else:
            verdict = "-"
        misses += verdict.startswith("MISS")
        print(f"| {r['page']} | {kb(r['html'])} | {kb(f['total'])} | {kb(f['scripts'])} | {kb(f['styles'])} | "
              f"{kb(f['fonts'])} | {kb(f['images'] + f['frames'])} | {kb(r['frames_total'])} | {verdict} |")
    print(f"\nTargets per chapter: HTML <= {kb(sitebrowser.HTML_LIMIT)}, first load <= "
          f"{kb(sitebrowser.FIRST_LOAD_LIMIT)} ({', '.join(sorted(sitebrowser.REFERENCE_PAGES))}: first load "
          f"only, see scripts/sitebrowser.py); {misses} miss.")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
