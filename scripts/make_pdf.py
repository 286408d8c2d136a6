#!/usr/bin/env python3
"""Print the whole book to one tagged PDF with headless Chromium: `make pdf`.

The chapters of _toc.yml, in reading order, are joined into ONE HTML document (each chapter's
article in a <section>, its ids prefixed with the chapter so they stay unique and links between
chapters become links inside the PDF) on the site's own page shell (its CSS and scripts), and that
document is printed once with the site's print stylesheet (book/_static/preln.css: no navigation,
explorables as their current frame with a caption that states the settings, dropdowns open, code
and tables wrapped). One print, so Chromium writes one structure tree (headings, tables, figures
with their alt text, formulas as /Formula elements named by their speech: the PDF is tagged,
`tagged=True`) and one outline. Joining per-chapter PDFs with pypdf would drop every chapter's
/StructTreeRoot.

Before printing, MathJax has typeset the document and every image, the lazily loaded explorable
frames included, has loaded. Each chapter starts a page and has its own running header (a named
CSS page per chapter with an @page margin box); page numbers are @page margin boxes too. After
printing, pypdf (cloning the document, so the structure tree is kept) sets the title, author,
language (/Lang en), DisplayDocTitle, and replaces the bookmarks' titles with the headings' plain
text (formulas as linear text, without MathJax's duplicate assistive copy). The result goes to
_build/pdf/ and into the site (_build/html/), where the Course page links it.

    python scripts/make_pdf.py [--out _build/pdf/preln-book.pdf]
"""
from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

import sitebrowser

ROOT = sitebrowser.ROOT
OUT = ROOT / "_build" / "pdf" / "preln-book.pdf"
IN_SITE = "preln-book.pdf"          # where the Course page's link points (the site's root)
BOOK_PAGE = "book/__preln_book__"   # the joined document's URL (served from memory, never written)
PAPER = {"format": "A4", "margin": {"top": "18mm", "bottom": "18mm", "left": "16mm", "right": "16mm"}}
COLUMN_PX = 673   # A4's 210 mm less the margins, in CSS px (96 per inch): the printed column
AUTHOR = "The preln authors"
LANG = "en"
# Ids the pages' own scripts look up (the explorables'): unique across the book already, kept.
KEEP_ID = re.compile(r"^preln-explorable-")
IDREF_ATTRS = ("aria-labelledby", "aria-describedby", "aria-controls", "aria-owns", "for", "headers")
MARGIN_BOX = "font-family: sans-serif; font-size: 8px; color: #555;"
# every formula of the book named (spoken) before printing: the joined document has ~all of them
SPEECH_MS = 300_000

# Before printing, laid out as on paper (print media, the column's width): every image loaded
# (explorable frames are lazy: loading="lazy"), MathJax done, then the site's own beforeprint
# handler (book/_static/preln-site.js: dropdowns open, wide formulas fitted to the column).
PREPARE_JS = """async () => {
  // paper shows the light figures: a dark twin (only-dark) would still be tagged as a Figure
  document.querySelectorAll('img.only-dark').forEach(i => i.remove());
  const imgs = Array.from(document.querySelectorAll('img'));
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  window.dispatchEvent(new Event('beforeprint'));
  return imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80));
}"""

# Formulas as /Formula elements with their speech as /Alt. Chromium tags an element with role
# "img" as a Figure with its accessible name as /Alt, but only if some text painted inside it is
# real text: MathJax's CHTML glyphs are CSS content, which Chromium maps to no element (the
# formula's Figure is then dropped). So each named formula becomes role="img" and gets its speech
# as painted but invisible text (1 px, nearly transparent, at the formula's middle: a numbered
# display formula's box starts left of the page; a text extractor reads the formula as spoken). After printing, the Figures whose /Alt is a formula's speech are renamed /Formula.
# Returns the speeches, and the alt texts of the document's images (kept as Figures).
FORMULAS_JS = """() => {
  const speech = [];
  document.querySelectorAll('mjx-container[aria-label]').forEach(m => {
    const label = m.getAttribute('aria-label').trim();
    if (!label) return;
    m.setAttribute('role', 'img');
    const t = document.createElement('span');
    t.className = 'preln-pdf-speech';
    t.textContent = label;
    m.appendChild(t);
    speech.push(label);
  });
  const images = Array.from(document.querySelectorAll('img[alt]')).map(i => i.alt.trim());
  return [speech, images];
}"""
SPEECH_CSS = (".preln-pdf-speech { position: absolute; left: 50%; top: 0; width: 1px; height: 1px; "
              "overflow: hidden; white-space: nowrap; font-size: 1px; line-height: 1px; color: rgba(0, 0, 0, 0.02); }")


def _formulas(writer, speech: set[str], images: set[str]) -> Counter:
    """Rename the structure tree's Figures whose /Alt is a formula's speech (and no image's alt)
    to /Formula; returns how many of each speech."""
    from pypdf.generic import ArrayObject, DictionaryObject, NameObject

    formulas = speech - images
    count, stack = Counter(), [writer._root_object["/StructTreeRoot"].get("/K")]
    while stack:
        node = stack.pop()
        node = node.get_object() if node is not None and hasattr(node, "get_object") else node
        if isinstance(node, ArrayObject):
            stack.extend(node)
        elif isinstance(node, DictionaryObject) and "/S" in node:
            alt = str(node.get("/Alt", "")).strip()
            if node["/S"] == "/Figure" and alt in formulas:
                node[NameObject("/S")] = NameObject("/Formula")
                count[alt] += 1
            stack.append(node.get("/K"))
    return count


# The plain text of every heading Chromium puts in the outline (the printed ones, in document
# order): without the permalink, and a formula as linear text read from MathJax's assistive
# MathML (its CHTML glyphs are CSS content, and taking both doubles or drops the formula).
HEADINGS_JS = """() => {
  const SUP = {'0':'⁰','1':'¹','2':'²','3':'³','4':'⁴','5':'⁵','6':'⁶','7':'⁷','8':'⁸','9':'⁹',
               '+':'⁺','-':'⁻','−':'⁻','n':'ⁿ','i':'ⁱ','T':'ᵀ'};
  const SUB = {'0':'₀','1':'₁','2':'₂','3':'₃','4':'₄','5':'₅','6':'₆','7':'₇','8':'₈','9':'₉',
               'a':'ₐ','e':'ₑ','h':'ₕ','i':'ᵢ','j':'ⱼ','k':'ₖ','l':'ₗ','m':'ₘ','n':'ₙ','o':'ₒ','p':'ₚ',
               'r':'ᵣ','s':'ₛ','t':'ₜ','u':'ᵤ','v':'ᵥ','x':'ₓ','+':'₊','-':'₋','−':'₋'};
  const small = (s, map, mark) => [...s].every(c => c in map) ? [...s].map(c => map[c]).join('') : mark + s;
  const group = s => /[-+−·×\/ ]/.test(s) ? '(' + s + ')' : s;   // 1/√dₕ, (a+b)/2
  function mml(n) {
    if (n.nodeType === 3) return n.textContent.trim();
    const k = [...n.children], t = n.localName;
    if (t === 'mfrac') return group(mml(k[0])) + '/' + group(mml(k[1]));
    if (t === 'msqrt') return '√' + group(k.map(mml).join(''));
    if (t === 'mroot') return '√' + group(mml(k[0]));
    if (t === 'msup') return mml(k[0]) + small(mml(k[1]), SUP, '^');
    if (t === 'msub') return mml(k[0]) + small(mml(k[1]), SUB, '_');
    if (t === 'msubsup') return mml(k[0]) + small(mml(k[1]), SUB, '_') + small(mml(k[2]), SUP, '^');
    if (t === 'mtext' || t === 'mi' || t === 'mn' || t === 'mo') return n.textContent.trim();
    return [...n.childNodes].map(mml).join('');
  }
  function text(n) {
    if (n.nodeType === 3) return n.textContent;
    if (n.nodeType !== 1 || n.matches('.headerlink, mjx-assistive-mml')) return '';
    if (n.localName === 'mjx-container') {
      const m = n.querySelector('mjx-assistive-mml math');
      return m ? mml(m) : '';
    }
    return [...n.childNodes].map(text).join('');
  }
  return [...document.querySelectorAll('h1, h2, h3, h4, h5, h6')]
    .filter(h => h.getClientRects().length > 0)
    .map(h => text(h).replace(/\\s+/g, ' ').trim());
}"""


def _article(page_html: str, name: str) -> tuple[int, int]:
    """Where the inner HTML of a built page's <article class="bd-article"> starts and ends."""
    start = page_html.find('<article class="bd-article">')
    end = page_html.rfind("</article>")
    if start < 0 or end < start:
        sys.exit(f"make pdf: {name}.html has no <article class=\"bd-article\">: is the site built by `make book`?")
    return start + len('<article class="bd-article">'), end


def _anchor(name: str, ident: str = "") -> str:
    """The id, in the joined document, of ``ident`` on page ``name`` (the chapter itself if empty)."""
    base = name.replace("/", "-")
    return f"{base}--{ident}" if ident else base


def _chapter(name: str, names: set[str]) -> str:
    """A chapter's article for the joined document: its ids prefixed with the chapter (two chapters
    have an "exercises" section), references to them following, links to another chapter of the
    book made links inside the document, links to pages that are not in it (source, index)
    dropped: on paper they would point at the local server `make pdf` ran."""
    text = (sitebrowser.SITE / f"{name}.html").read_text(encoding="utf-8")
    a, b = _article(text, name)
    body = text[a:b]
    folder = name.rsplit("/", 1)[0]

    def new_id(ident: str) -> str:
        return ident if KEEP_ID.match(ident) else _anchor(name, ident)

    body = re.sub(r'(\sid=")([^"]+)(")', lambda m: m[1] + new_id(m[2]) + m[3], body)
    body = re.sub(r'(\s(?:%s)=")([^"]+)(")' % "|".join(IDREF_ATTRS),
                  lambda m: m[1] + " ".join(new_id(i) for i in m[2].split()) + m[3], body)

    def link(m: re.Match) -> str:
        href = html.unescape(m[2])
        if href.startswith("#"):
            return f'{m[1]}#{new_id(href[1:])}{m[3]}'
        if re.match(r"^[a-z][a-z0-9+.-]*:", href):     # http:, https:, mailto:: kept
            return m[0]
        path, _, frag = href.partition("#")
        target = f"{folder}/{path[:-5]}" if path.endswith(".html") else None
        if target in names:
            return f'{m[1]}#{_anchor(target, frag)}{m[3]}'
        return m[1].replace('href="', 'data-preln-href="') + m[2] + m[3]
    body = re.sub(r'(\shref=")([^"]*)(")', link, body)
    return f'<section class="preln-pdf-chapter" id="{_anchor(name)}" data-chapter="{name}">{body}</section>'


def _chapter_title(name: str) -> str:
    text = (sitebrowser.SITE / f"{name}.html").read_text(encoding="utf-8")
    a, b = _article(text, name)
    m = re.search(r"<h1[^>]*>(.*?)</h1>", text[a:b], re.S)
    title = html.unescape(re.sub(r"<[^>]+>", "", m[1])).replace("#", "") if m else name
    return " ".join(title.split())


def _css_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _page_css(names: list[str], book: str) -> str:
    """Each chapter on its own named page (so it starts a page) with its running header,
    "<chapter> — <book>", and page numbers "n / N": @page margin boxes, one print for the book."""
    rules = [f"@page {{ size: A4; margin: {PAPER['margin']['top']} {PAPER['margin']['right']} "
             f"{PAPER['margin']['bottom']} {PAPER['margin']['left']}; "
             f"@bottom-center {{ content: counter(page) \" / \" counter(pages); {MARGIN_BOX} }} }}"]
    for i, name in enumerate(names):
        header = _css_string(f"{_chapter_title(name)} — {book}")
        rules.append(f"section.preln-pdf-chapter:nth-of-type({i + 1}) {{ page: preln-chapter-{i}; }}")
        rules.append(f"@page preln-chapter-{i} {{ @top-left {{ content: {header}; {MARGIN_BOX} }} }}")
    # (not before the first: that would print an empty first page; the page's wrappers before
    # the first chapter are on its named page too, for the same reason)
    rules.append("body { page: preln-chapter-0; }")
    rules.append("section.preln-pdf-chapter ~ section.preln-pdf-chapter { break-before: page; }")
    rules.append(SPEECH_CSS)
    return "<style>@media print {\n" + "\n".join(rules) + "\n}</style>"


def book_html(names: list[str], book: str) -> str:
    """One HTML document of the chapters ``names`` on a chapter's page shell (the site's head: CSS,
    MathJax and the site's scripts; every chapter's head is the same but for its title)."""
    shell_name = next((n for n in names if "tex-chtml" in (sitebrowser.SITE / f"{n}.html").read_text(encoding="utf-8")),
                      names[0])
    shell = (sitebrowser.SITE / f"{shell_name}.html").read_text(encoding="utf-8")
    a, b = _article(shell, shell_name)
    chapters = "\n".join(_chapter(n, set(names)) for n in names)
    doc = shell[:a] + chapters + shell[b:]
    doc = re.sub(r"<title>.*?</title>", f"<title>{html.escape(book)}</title>", doc, count=1, flags=re.S)
    return doc.replace("</head>", _page_css(names, book) + "\n</head>", 1)


def _outline_titles(writer, titles: list[str]) -> int:
    """Replace the outline's titles, in document order, with ``titles``; returns the count."""
    from pypdf.generic import NameObject, TextStringObject

    root = writer._root_object.get("/Outlines")
    items = []

    def walk(node):
        while node is not None:
            node = node.get_object()
            items.append(node)
            walk(node.get("/First"))
            node = node.get("/Next")
    if root is not None:
        walk(root.get_object().get("/First"))
    if len(items) != len(titles):
        sys.exit(f"make pdf: Chromium's outline has {len(items)} entries, the document {len(titles)} printed headings")
    for item, title in zip(items, titles):
        item[NameObject("/Title")] = TextStringObject(title)
    return len(items)


def make_pdf(out: Path = OUT, names: list[str] | None = None, verbose: bool = True,
             publish: bool = True) -> Path:
    """Print ``names`` (default: every page of _toc.yml) into ``out`` as one tagged PDF; with
    ``publish``, copy it into the built site too."""
    import io

    from playwright.sync_api import sync_playwright
    from pypdf import PdfWriter
    from pypdf.generic import NameObject, TextStringObject

    site = sitebrowser.SITE
    if not (site / "index.html").is_file():
        sys.exit(f"make pdf: {site} is not built: run `make book` first")
    names = names or sitebrowser.pages()
    book = yaml.safe_load((ROOT / "_config.yml").read_text())["title"]
    document = book_html(names, book)
    server, url = sitebrowser.serve(site)
    t0 = time.perf_counter()
    try:
        with sync_playwright() as p:
            browser = sitebrowser.launch(p)
            context = browser.new_context(viewport={"width": COLUMN_PX, "height": 1000}, color_scheme="light")
            page = context.new_page()
            page.set_default_timeout(600_000)
            page.route(f"{url}/{BOOK_PAGE}.html",
                       lambda route: route.fulfill(status=200, content_type="text/html; charset=utf-8", body=document))
            page.emulate_media(media="print")
            page.goto(f"{url}/{BOOK_PAGE}.html", wait_until="load")
            sitebrowser.settle(page, speech_ms=SPEECH_MS)
            page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise.then(() => true) : true")
            broken = page.evaluate(PREPARE_JS)
            if broken:
                sys.exit(f"make pdf: images that did not load: {broken}")
            page.evaluate("() => document.fonts.ready.then(() => true)")
            titles = page.evaluate(HEADINGS_JS)
            speech, images = page.evaluate(FORMULAS_JS)   # after the headings' text is read
            if verbose:
                print(f"make pdf: {len(names)} chapters laid out, {len(titles)} headings, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            pdf = page.pdf(print_background=True, prefer_css_page_size=True, outline=True, tagged=True)
            if verbose:
                print(f"make pdf: Chromium printed {len(pdf) / 1e6:.1f} MB, {time.perf_counter() - t0:.0f} s", flush=True)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    # An incremental update: Chromium's file as it is (its /StructTreeRoot, /MarkInfo, outline, and
    # its object streams: rewritten by pypdf, the ~90 000 objects of the structure tree take
    # 20 MB instead of 8), the title, language, viewer preferences and bookmarks' titles appended.
    # append() or merge_page would drop the structure tree.
    writer = PdfWriter(io.BytesIO(pdf), incremental=True)
    n_bookmarks = _outline_titles(writer, titles)
    tagged = _formulas(writer, set(speech), set(images))
    n_formulas = sum(tagged.values())
    untagged = Counter(speech) - tagged
    if untagged:
        sys.exit(f"make pdf: {len(speech)} formulas, {n_formulas} tagged as /Formula with their speech; "
                 f"not: {sorted(untagged)[:5]}")
    writer.add_metadata({"/Title": book, "/Author": AUTHOR, "/Subject": "The preln book, every chapter in one PDF"})
    writer._root_object[NameObject("/Lang")] = TextStringObject(LANG)
    writer.create_viewer_preferences()
    writer.viewer_preferences.display_doctitle = True     # a reader's title bar shows the title
    writer.page_mode = "/UseOutlines"       # a reader opens the PDF with the bookmarks shown
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        writer.write(f)
    if publish:
        shutil.copyfile(out, site / IN_SITE)
    if verbose:
        print(f"make pdf: {len(writer.pages)} pages, {n_bookmarks} bookmarks, {n_formulas} formulas, "
              f"{out.stat().st_size / 1e6:.1f} MB, "
              f"{time.perf_counter() - t0:.0f} s -> {out}" + (f" and {site / IN_SITE}" if publish else ""))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"the PDF to write (default {OUT.relative_to(ROOT)})")
    make_pdf(ap.parse_args().out)
