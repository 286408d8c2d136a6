#!/usr/bin/env python3
"""Print the whole book to one PDF with headless Chromium: `make pdf`.

Every page of _toc.yml, in reading order, is opened from the built site (`make book` first) and
printed with the site's print stylesheet (book/_static/preln.css: no navigation, each chapter on
a new page, explorables as their current frame with a caption that states the settings, dropdowns
open, code and tables wrapped). Before a page is printed, MathJax has typeset it and every image,
the lazily loaded explorable frames included, has loaded. Chromium tags each PDF and writes its
outline from the headings; the chapters are then joined with pypdf, which keeps those outlines
(one bookmark per chapter, its sections under it), and numbered 1..N across the book by a second
Chromium print (a page of footers laid over each page; about 7 MB for the whole book). The result
goes to _build/pdf/ and into the site (_build/html/), where the Course page links it.

    python scripts/make_pdf.py [--out _build/pdf/preln-book.pdf]
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
import time
from pathlib import Path

import sitebrowser

ROOT = sitebrowser.ROOT
OUT = ROOT / "_build" / "pdf" / "preln-book.pdf"
IN_SITE = "preln-book.pdf"          # where the Course page's link points (the site's root)
PAPER = {"format": "A4", "margin": {"top": "18mm", "bottom": "18mm", "left": "16mm", "right": "16mm"}}
COLUMN_PX = 673   # A4's 210 mm less the margins, in CSS px (96 per inch): the printed column
HEADER = ('<div style="font-size:8px;width:100%;padding:0 16mm;color:#555;'
          'font-family:sans-serif"><span class="title"></span></div>')

# Before printing, laid out as on paper (print media, the column's width): every image loaded
# (explorable frames are lazy: loading="lazy"), MathJax done, then the site's own beforeprint
# handler (book/_static/preln-site.js: dropdowns open, wide formulas fitted to the column).
PREPARE_JS = """async () => {
  const imgs = Array.from(document.querySelectorAll('img'));
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  window.dispatchEvent(new Event('beforeprint'));
  return imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80));
}"""


def _title(page) -> str:
    """The chapter's title as its page states it (the <h1>, without the permalink '#')."""
    h1 = page.locator(".bd-article h1").first
    text = h1.inner_text() if h1.count() else page.title()
    return text.replace("#", "").strip()


def _numbers(browser, n_pages: int) -> bytes:
    """An N-page PDF of page numbers alone (Chromium's footer), to lay over the book's pages."""
    page = browser.new_page()
    page.set_content("<html><body style='margin:0'>" + "<div style='break-after:page;height:1px'></div>" * n_pages
                     + "</body></html>")
    pdf = page.pdf(**PAPER, display_header_footer=True, header_template="<span></span>",
                   footer_template='<div style="font-size:8px;width:100%;text-align:center;color:#555;'
                                   'font-family:sans-serif"><span class="pageNumber"></span> / '
                                   '<span class="totalPages"></span></div>')
    page.close()
    return pdf


def make_pdf(out: Path = OUT, names: list[str] | None = None, verbose: bool = True,
             publish: bool = True) -> Path:
    """Print ``names`` (default: every page of _toc.yml) into ``out``; with ``publish``, copy it
    into the built site too."""
    from playwright.sync_api import sync_playwright
    from pypdf import PdfReader, PdfWriter

    site = sitebrowser.SITE
    if not (site / "index.html").is_file():
        sys.exit(f"make pdf: {site} is not built: run `make book` first")
    names = names or sitebrowser.pages()
    server, url = sitebrowser.serve(site)
    chapters = []
    try:
        with sync_playwright() as p:
            browser = sitebrowser.launch(p)
            context = browser.new_context(viewport={"width": COLUMN_PX, "height": 1000}, color_scheme="light")
            page = context.new_page()
            page.set_default_timeout(120_000)
            page.emulate_media(media="print")
            for name in names:
                t0 = time.perf_counter()
                page.goto(f"{url}/{name}.html", wait_until="load")
                sitebrowser.settle(page)
                broken = page.evaluate(PREPARE_JS)
                if broken:
                    sys.exit(f"make pdf: {name}: images that did not load: {broken}")
                page.evaluate("() => document.fonts.ready.then(() => true)")
                title = _title(page)
                pdf = page.pdf(**PAPER, print_background=True, display_header_footer=True,
                               header_template=HEADER, footer_template="<span></span>",
                               outline=True, tagged=True)
                chapters.append((name, title, pdf))
                if verbose:
                    n = len(PdfReader(io.BytesIO(pdf)).pages)
                    print(f"make pdf: {name}: {title!r}, {n} pages, {len(pdf) / 1e6:.1f} MB, "
                          f"{time.perf_counter() - t0:.1f} s", flush=True)
            writer = PdfWriter()
            for name, title, pdf in chapters:
                reader = PdfReader(io.BytesIO(pdf))
                # Chromium's outline of the chapter: its <h1> (the chapter), the sections under it
                writer.append(reader, import_outline=True)
            numbers = PdfReader(io.BytesIO(_numbers(browser, len(writer.pages))))
            for page_, number in zip(writer.pages, numbers.pages):
                page_.merge_page(number)
                page_.compress_content_streams()    # merge_page leaves the joined stream unzipped
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    writer.add_metadata({"/Title": "The Pre-LN Transformer block", "/Author": "The preln authors",
                         "/Subject": "The preln book, every chapter in one PDF"})
    writer.page_mode = "/UseOutlines"       # a reader opens the PDF with the bookmarks shown
    writer.compress_identical_objects(remove_duplicates=True, remove_unreferenced=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        writer.write(f)
    if publish:
        shutil.copyfile(out, site / IN_SITE)
    if verbose:
        print(f"make pdf: {len(writer.pages)} pages, {out.stat().st_size / 1e6:.1f} MB -> {out}"
              + (f" and {site / IN_SITE}" if publish else ""))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"the PDF to write (default {OUT.relative_to(ROOT)})")
    make_pdf(ap.parse_args().out)
