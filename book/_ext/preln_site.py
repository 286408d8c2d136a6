"""Sphinx extension: keep every page self-contained, light and accessible.

- jupyter-book 1.0.4 with Sphinx 7.4 emits some inline scripts twice (sphinx-thebe's
  `const THEBE_JS_URL = ...` among them), which is a JavaScript error ("Identifier has already been
  declared") on every page: identical scripts are dropped here.
- With `launch_buttons.thebe: false` nothing on the site uses thebe, but sphinx-thebe still adds
  its loader and the unpkg.com URL it would fetch thebe from; those are dropped too, so no page
  names another origin as a script source.
- myst-nb adds require.js, the 3.6 MB widget manager and the notebook's whole widget state to every
  page of a notebook that saved widget state, even where no cell displays a widget: on a page
  without a widget view they are dropped.
- Explorable frames (preln/chapters/viz.py) are stored in the notebook as data URIs, so that a notebook
  works anywhere. On the site each frame becomes a file, _frames/<sha256>.png, named by its
  content (reproducible builds, shared between pages); the page's HTML keeps only their URLs, the
  first frame loads lazily, and the others when a reader moves a control.
- Docstrings are written for `help()` in a terminal and name things briefly (`TransformerStack`,
  `MASKS`, "float32"). On the API page, a Python reference that Sphinx cannot resolve is looked up
  by its last component among the documented objects (linked if exactly one matches), and
  otherwise shown as code instead of failing the nitpicky build (`-n`); `-v` lists them. References
  written in the book's own pages stay strict.
- Accessibility fixes for markup the toolchain writes (each names what it works around): the
  bibliography's deprecated ARIA role, myst-nb's hide-input toggle, and the theme's icon fonts
  cut down to the glyphs the pages use (the theme's Font Awesome script is left out by
  book/_templates/static/webpack-macros.html).
- The site's root `index.html` goes straight to the book's front page, the root document
  (book/intro, drawn by the theme: what the book is, the block, "Start with chapter 1", the
  reading paths), by a script and a meta refresh, with nothing shown on the way; a `404.html` (for
  a web server's "not found") is a small self-contained page in the theme's colours.
- A figure's words are written once, by the code that draws it (preln.nb.set_alt): a notebook's
  figure output holds the PNG the site shows and an HTML copy with its alt and longer description
  (what JupyterLab shows). The site reads them from that copy, matched to the PNG by its bytes'
  SHA-256, which myst-nb names the file by: the image gets the alt, and a description in a
  `<details>` after it that the image names with aria-describedby.
- "Deeper — skip on a first reading": each run of a notebook's `deeper`-tagged cells (a side road,
  opened by a "Deeper: ..." heading) becomes one closed <details class="preln-deeper"> whose
  <summary> names it; its headings stay anchors and page-contents entries. myst-nb marks only code
  cells with their tags, so each markdown cell is marked as it is read (see the section below).
- The header's launch, source and download menus show a word next to their icon (the theme draws
  bare icons), the start of each one's accessible name.
- A student notebook downloads as `<name>_assignment.ipynb`, not under the chapter's own
  `<name>.ipynb` (the chapter page's download button): saved in one folder, neither replaces the
  other. Sphinx names a download after its file, which keeps nbgrader's name
  (assignments/release/<name>/<name>.ipynb); only the served copy is renamed.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import docname_join
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

# Pages generated from docstrings: their cross-references are best effort (see below).
API_PAGES = {"book/api"}
# Explorable frames, relative to the output directory.
FRAMES_DIR = "_frames"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _thebe_enabled(app) -> bool:
    opts = app.config.html_theme_options or {}
    return bool((opts.get("launch_buttons") or {}).get("thebe"))


def clean_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    drop_thebe = not _thebe_enabled(app)
    # myst-nb's nb_ipywidgets_js (require.js, preln-widgets.js, embed-amd.js) and the widget state
    # are only of use where a cell displays a widget.
    no_widgets = WIDGET_VIEW not in context.get("body", "")
    widget_js = {str(k) for k in (getattr(app.config, "nb_ipywidgets_js", None) or {})}
    seen, kept = set(), []
    for js in scripts:
        filename = str(js.filename or "")
        attrs = dict(getattr(js, "attributes", {}) or {})
        if drop_thebe and ("sphinx-thebe" in filename or "THEBE_JS_URL" in attrs.get("body", "")):
            continue
        # (Sphinx stores a local script as "_static/<the name in the config>")
        if no_widgets and (attrs.get("type") == WIDGET_STATE or filename.removeprefix("_static/") in widget_js):
            continue
        key = (filename, tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    context["script_files"] = kept


# ---- explorable frames: out of the HTML, into files --------------------------------------------

_DATA = re.compile(r'(<script type="application/json" class="preln-explorable-data">)(.*?)(</script>)', re.S)
_IMG = re.compile(r'<img class="preln-explorable-frame" ([^>]*?)src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
_DATA_URI = "data:image/png;base64,"


def _frame_file(outdir: Path, b64: str) -> str:
    """Write one frame under _frames/, named by its content; return its path in the site."""
    png = base64.b64decode(b64)
    name = f"{hashlib.sha256(png).hexdigest()[:24]}.png"
    path = outdir / FRAMES_DIR / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
    return f"{FRAMES_DIR}/{name}"


def extract_frames(html: str, outdir: Path, url) -> str:
    """Replace every explorable frame's data URI in ``html`` by the URL of a file (``url(path)``
    maps a site path to a URL relative to the page); the first frame loads lazily."""
    def data(m):
        payload = json.loads(m.group(2))
        for frame in payload["frames"].values():
            if frame[0].startswith(_DATA_URI):
                frame[0] = url(_frame_file(outdir, frame[0][len(_DATA_URI):]))
        # as preln.chapters.viz writes it: compact, and no "</" that would end the <script>
        text = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
        return m.group(1) + text + m.group(3)

    def img(m):
        src = url(_frame_file(outdir, m.group(2)))
        return f'<img class="preln-explorable-frame" loading="lazy" decoding="async" {m.group(1)}src="{src}"'

    return _IMG.sub(img, _DATA.sub(data, html))


# ---- markup fixes ---------------------------------------------------------------------------------

# a printed output's <pre> (myst-nb: stream or text/plain), and the tags inside it
_OUTPUT_PRE = re.compile(r'(<div class="output (?:stream|text_plain)[^"]*)'
                         r'("><div class="highlight"><pre>)(.*?)(</pre>)', re.S)
_TAG = re.compile(r"<[^>]+>")


def wrap_prose_outputs(html: str) -> str:
    """Printed output that reads as prose gets the class preln-wrap, whose long lines the site
    wraps; a printed table (preln.nb.reads_as_table) keeps its columns and fits the column."""
    from preln.nb import reads_as_table

    def mark(m):
        text = _TAG.sub("", m.group(3))
        return m.group(0) if reads_as_table(text) else m.group(1) + " preln-wrap" + m.group(0)[len(m.group(1)):]
    return _OUTPUT_PRE.sub(mark, html)


def fix_markup(html: str) -> str:
    # docutils' HTML5 writer (0.21, for sphinxcontrib-bibtex's bibliography) gives each citation
    # role="doc-biblioentry", deprecated by DPUB-ARIA 1.1 because it cannot be a child of a list
    # (w3c/dpub-aria#22, w3c/html-aria#363), inside <div role="list">: axe reports
    # aria-deprecated-role and aria-required-children. A list item is what the entry is.
    html = html.replace('role="doc-biblioentry"', 'role="listitem"')
    # docutils writes a list-table's stub and header cells without scope (a screen reader guesses)
    html = re.sub(r'<th class="(stub[^"]*)"', r'<th scope="row" class="\1"', html)
    return re.sub(r'<th class="(head[^"]*)"', r'<th scope="col" class="\1"', html)


# ---- figure alt text and descriptions, from the notebook's HTML copy ---------------------------

_HTML_ALT = re.compile(r'<img\b[^>]*\balt="([^"]*)"')
_HTML_DESCRIPTION = re.compile(r'<details class="preln-figure-description">.*?</details>', re.S)
_SITE_IMG = re.compile(r'<img\b[^>]*\bsrc="[^"]*/([0-9a-f]{64})\.png"[^>]*>')
_IMAGE_LINK_END = re.compile(r'\s*</a>')
# a link to a figure's full-size PNG: (<a ... href="<prefix>), prefix, sha, (.png" ...>)
_IMAGE_LINK = re.compile(r'(<a\b[^>]*\bhref="([^"]*/)([0-9a-f]{64})\.png"[^>]*?)(>)')
# a numbered caption right after the figure's image (myst-nb's mystnb.figure): the description
# goes after it, so a reader meets image, caption, then the long description (issue 33)
_CAPTION_AFTER = re.compile(r'\s*<figcaption>.*?</figcaption>', re.S)
# the dark-mode variant in a figure's HTML copy (preln.chapters.viz.figure_bundle)
_HTML_DARK = re.compile(r'<img class="preln-figure-dark"[^>]*\bsrc="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def figure_words(notebook: dict) -> dict:
    """{sha256 of a figure output's PNG: (alt, description <details> or None)}, both as HTML (escaped
    as preln.nb.image_bundle wrote them), for every output with image/png and an HTML <img alt>."""
    words = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            page = "".join(data.get("text/html", ""))
            alt = _HTML_ALT.search(page)
            if "image/png" not in data or not alt:
                continue
            png = base64.b64decode("".join(data["image/png"]))
            description = _HTML_DESCRIPTION.search(page)
            words[hashlib.sha256(png).hexdigest()] = (alt.group(1), description and description.group(0))
    return words


def _over_the_book(app, read) -> dict:
    """``read(notebook)`` of every notebook in the book, merged (a figure may be glued into another
    page); computed once per build."""
    cache = app.__dict__.setdefault("_preln_book_reads", {})
    if read not in cache:
        merged = {}
        for docname in sorted(app.env.found_docs):
            path = Path(app.env.doc2path(docname))
            if path.suffix == ".ipynb":
                merged.update(read(json.loads(path.read_text(encoding="utf-8"))))
        cache[read] = merged
    return cache[read]


def _book_figure_words(app) -> dict:
    """figure_words of every notebook in the book."""
    return _over_the_book(app, figure_words)


def apply_figure_words(html: str, words: dict) -> str:
    """Give each figure <img> of ``html`` (src .../<sha256>.png) its alt from ``words``, and its
    description: a <details> after the image (after its full-size link), named by aria-describedby."""
    out, pos = [], 0
    for m in _SITE_IMG.finditer(html):
        if m.group(1) not in words:
            continue
        alt, description = words[m.group(1)]
        tag = re.sub(r'\balt="[^"]*"', lambda _: f'alt="{alt}"', m.group(0), count=1)
        if ' alt="' not in tag:
            tag = tag.replace("<img", f'<img alt="{alt}"', 1)
        end = m.end()
        if description:
            did = re.search(r'<p id="([^"]+)"', description).group(1)
            tag = tag.replace("<img", f'<img aria-describedby="{did}"', 1)
            link_end = _IMAGE_LINK_END.match(html, end)
            end = link_end.end() if link_end else end
            caption = _CAPTION_AFTER.match(html, end)
            end = caption.end() if caption else end
        out += [html[pos:m.start()], tag, html[m.end():end], description or ""]
        pos = end
    return "".join(out) + html[pos:]


def figure_darks(notebook: dict) -> dict:
    """{sha256 of a figure output's PNG: its dark-mode variant's PNG bytes}, for every output whose
    HTML copy carries one (preln.chapters.viz.figure_bundle)."""
    darks = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            dark = _HTML_DARK.search("".join(data.get("text/html", "")))
            if "image/png" in data and dark:
                png = base64.b64decode("".join(data["image/png"]))
                darks[hashlib.sha256(png).hexdigest()] = base64.b64decode(dark.group(1))
    return darks


def _book_figure_darks(app) -> dict:
    """figure_darks of every notebook in the book."""
    return _over_the_book(app, figure_darks)


def apply_dark_figures(html: str, darks: dict, write) -> str:
    """Each figure <img> of ``html`` with a dark variant gets it beside itself: the light image
    takes the theme's ``only-light`` class, a copy of its tag pointing at ``<sha>-dark.png``
    (written by ``write(name, png)``) ``only-dark`` (pydata-sphinx-theme shows one per mode, and
    draws no filter or white mat under an ``only-dark`` image). Both load lazily, so a browser
    fetches only the one its mode shows. The link around them (to the full-size light PNG) gets
    ``data-preln-dark-href``, the dark PNG, which preln-site.js opens in dark mode."""
    def both(m):
        sha = m.group(1)
        if sha not in darks:
            return m.group(0)
        write(f"{sha}-dark.png", darks[sha])
        light = m.group(0)
        light = (re.sub(r'\bclass="', 'class="only-light ', light, count=1) if ' class="' in light
                 else light.replace("<img", '<img class="only-light"', 1))
        dark = re.sub(r'\bclass="only-light ', 'class="only-dark ', light, count=1)
        dark = dark.replace('class="only-light"', 'class="only-dark"', 1)
        dark = dark.replace(f"{sha}.png", f"{sha}-dark.png")
        # both lazy: a browser fetches an image hidden by display:none unless it is lazy, so
        # each mode loads its own figures only
        lazy = (lambda tag: tag if 'loading="' in tag else tag.replace("<img", '<img loading="lazy"', 1))
        # and sized before they load (the PNG's own width and height: both variants are drawn
        # alike), so the page does not shift under the reader when a lazy image arrives
        png = darks[sha]
        if png[:8] != b"\x89PNG\r\n\x1a\n" or ' height="' in light:
            return lazy(light) + lazy(dark)
        w, h = struct.unpack(">II", png[16:24])                 # the IHDR chunk's first fields
        sized = (lambda tag: tag.replace("<img", f'<img width="{w}" height="{h}"', 1))
        return sized(lazy(light)) + sized(lazy(dark))

    def link(m):
        # the link around the pair opens the full-size light PNG; it names the dark one too, and
        # book/_static/preln-site.js points the link at it while the page is in dark mode (one
        # link, not two: a second would be an empty tab stop in the mode that hides its image)
        if m.group(3) not in darks or "data-preln-dark-href" in m.group(0):
            return m.group(0)
        return f'{m.group(1)} data-preln-dark-href="{m.group(2)}{m.group(3)}-dark.png"{m.group(4)}'
    return _IMAGE_LINK.sub(link, _SITE_IMG.sub(both, html))


def rewrite_body(app, pagename, templatename, context, doctree):
    body = context.get("body")
    if not body or app.builder.format != "html":
        return
    pathto = context["pathto"]
    if "preln-explorable-data" in body:
        body = extract_frames(body, Path(app.outdir), lambda path: pathto(path, 1))
    if "_images/" in body:
        body = apply_figure_words(body, _book_figure_words(app))
        images = Path(app.outdir) / "_images"

        def write(name, png):
            images.mkdir(parents=True, exist_ok=True)
            if not (images / name).exists():
                (images / name).write_bytes(png)
        body = apply_dark_figures(body, _book_figure_darks(app), write)
    context["body"] = wrap_prose_outputs(fix_markup(body))


def visit_hide_cell_input(self, node):
    """myst-nb 1.4's hide-input toggle, without its aria-label.

    myst_nb/sphinx_.py names the <summary> aria-label="Toggle hidden content" while it shows "Show
    code cell source": the visible text is not in the accessible name (WCAG 2.5.3, axe
    label-content-name-mismatch); not reported upstream as far as we found. The summary is named
    by what it shows."""
    from html import escape

    self.body.append(f'<details class="admonition hide {" ".join(node["classes"])}">\n<summary>\n')
    self.body.append(f'<p class="collapsed admonition-title">{escape(node["prompt_show"])}</p>\n')
    self.body.append(f'<p class="expanded admonition-title">{escape(node["prompt_hide"])}</p>\n')
    self.body.append("</summary>\n")


def depart_hide_cell_input(self, node):
    self.body.append("</details>\n")


# ---- icon fonts: only the glyphs the pages use ------------------------------------------------------

_ICON = re.compile(r"\bfa-([a-z0-9-]+)")
_ICON_RULE = re.compile(r'((?:\.fa-[a-z0-9-]+:{1,2}before,?)+)\{content:"\\([0-9a-f]+)"\}')
_THEME_FONTS = ("fa-solid-900", "fa-regular-400", "fa-brands-400")


def subset_icon_fonts(app, exception):
    """Cut the theme's Font Awesome webfonts down to the icons the built pages name.

    The theme's CSS draws each `<i class="fa-solid fa-bars">` from a webfont (156 + 118 + 25 kB
    of woff2 for thousands of icons; pydata/pydata-sphinx-theme#2379). The icons named in the
    built HTML and the theme's scripts are looked up in its CSS, and each font in _static/ is
    replaced by a subset, made from the theme's own copy each build (deterministic: fontTools
    keeps the font's timestamps)."""
    if exception is not None or app.builder.format != "html":
        return
    from fontTools import subset
    import pydata_sphinx_theme

    out = Path(app.outdir)
    static = out / "_static"
    css = (static / "styles" / "pydata-sphinx-theme.css").read_text(encoding="utf-8")
    codepoints = {}
    for names, code in _ICON_RULE.findall(css):
        for name in re.findall(r"\.fa-([a-z0-9-]+)", names):
            codepoints[name] = int(code, 16)
    used = set()
    for page in list(out.rglob("*.html")) + list((static / "scripts").glob("*.js")):
        if page.name == "fontawesome.js":
            continue
        used |= set(_ICON.findall(page.read_text(encoding="utf-8", errors="replace")))
    wanted = sorted({codepoints[n] for n in used if n in codepoints})
    if not wanted:
        return
    theme = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static"
    for font in _THEME_FONTS:
        src = theme / "vendor" / "fontawesome" / "webfonts" / f"{font}.woff2"
        dst = static / "vendor" / "fontawesome" / "webfonts" / f"{font}.woff2"
        if not (src.is_file() and dst.is_file()):
            continue
        opts = subset.Options()
        opts.flavor = "woff2"
        opts.layout_features = ["*"]
        opts.ignore_missing_unicodes = True
        ttf = subset.load_font(str(src), opts)
        sub = subset.Subsetter(opts)
        sub.populate(unicodes=wanted)
        sub.subset(ttf)
        subset.save_font(ttf, str(dst), opts)
    logger.info("preln_site: icon fonts cut to %d glyphs (%s)", len(wanted),
                ", ".join(sorted(n for n in used if n in codepoints)))


def resolve_docstring_refs(app, env, node, contnode):
    if node.get("refdomain") != "py" or node.get("refdoc") not in API_PAGES:
        return None
    target = node.get("reftarget", "").lstrip("~.")
    objects = env.get_domain("py").objects
    matches = [name for name in objects if name == target or name.endswith("." + target)]
    if len(matches) == 1:
        obj = objects[matches[0]]
        return make_refnode(app.builder, node["refdoc"], obj.docname, obj.node_id, contnode, matches[0])
    logger.verbose("api page: docstring reference %r (%s) shown as code", target, node.get("reftype"))
    return contnode


# assignments/release/<name>/<name>.ipynb, as a path relative to the book's source folder
ASSIGNMENT_DOWNLOAD = re.compile(r"^assignments/release/([^/]+)/\1\.ipynb$")


def rename_assignment_downloads(app, doctree):
    """Serve each student notebook as _downloads/<digest>/<name>_assignment.ipynb (after Sphinx's
    collector has registered the download: env.dlfiles maps the file to (pages, served path))."""
    from sphinx import addnodes

    served = {dest: rel for rel, (_, dest) in app.env.dlfiles.items()}
    for node in doctree.findall(addnodes.download_reference):
        rel = served.get(node.get("filename", ""))
        m = ASSIGNMENT_DOWNLOAD.match(rel or "")
        if m:
            docs, dest = app.env.dlfiles[rel]
            new = f"{dest.split('/', 1)[0]}/{m.group(1)}_assignment.ipynb"
            app.env.dlfiles[rel] = (docs, new)
            node["filename"] = new


# ---- the root page and the 404 page ------------------------------------------------------------------

# The two small pages' style: pydata-sphinx-theme 0.17's colours (text >= 4.5:1 and the focus ring
# >= 3:1 in both modes), doubled braces for str.format
_PAGE_STYLE = """  :root {{ color-scheme: light dark; --bg: #fff; --fg: #222832; --link: #0a7d91; --ring: #c132af; }}
  @media (prefers-color-scheme: dark) {{
    :root {{ --bg: #121212; --fg: #ced6dd; --link: #4fb2c3; --ring: #e89217; }}
  }}
  body {{ background: var(--bg); color: var(--fg); font: 1.05rem/1.6 system-ui, sans-serif;
          max-width: 42rem; margin: 0 auto; padding: 2rem 1rem; }}
  a {{ color: var(--link); }}
  a:focus-visible {{ outline: 3px solid var(--ring); outline-offset: 2px; }}
"""

_STANDALONE = """<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="{root}_static/favicon.svg" type="image/svg+xml">
<style>
""" + _PAGE_STYLE + """</style>
</head>
<body>
<main>
{body}
</main>
</body>
</html>
"""


# The site's root, index.html, leads to the book's front page, the root document (book/intro: what
# the book is, the block, "Start with chapter 1", the reading paths), which the theme draws with its
# header and sidebar of parts. It goes there at once, without showing anything first: a script
# replaces the address (keeping a #fragment), and where scripts do not run a meta refresh does
# the same; both are relative, so they work from file:// as well as from a server. The link only
# appears if neither has acted after a second.
_REDIRECT = """<!DOCTYPE html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<title>{title}</title>
<meta http-equiv="refresh" content="0; url={start}">
<link rel="canonical" href="{start}">
<link rel="icon" href="_static/favicon.svg" type="image/svg+xml">
<script>location.replace({start_js} + location.hash);</script>
<style>
""" + _PAGE_STYLE + """  main {{ visibility: hidden; animation: preln-show 0s 1s forwards; }}
  @keyframes preln-show {{ to {{ visibility: visible; }} }}
</style>
</head>
<body>
<main>
<h1>{title}</h1>
<p><a href="{start}">Go to the book's front page</a></p>
</main>
</body>
</html>
"""


def _toc_order(app) -> list[str]:
    """The root document and every document of its toctrees, in reading order."""
    includes = app.env.toctree_includes
    order, stack = [], [app.config.root_doc]
    while stack:
        doc = stack.pop(0)
        if doc in order:
            continue
        order.append(doc)
        stack[0:0] = includes.get(doc, [])
    return order


def write_root_pages(app, exception):
    """index.html (the way to the book's front page, the root document) and 404.html, in the
    output folder."""
    if exception is not None or app.builder.format != "html":
        return
    from html import escape

    out = Path(app.outdir)
    lang = app.config.language or "en"
    # (jupyter-book sets the book's title as html_title; Sphinx's project stays unset)
    title = getattr(app.config, "html_title", None) or app.config.project or "Home"
    docs = [d for d in _toc_order(app) if d in app.env.titles]
    root = app.config.root_doc
    if root != "index":
        start = app.builder.get_target_uri(root)
        (out / "index.html").write_text(_REDIRECT.format(lang=lang, title=escape(title), start=escape(start),
                                                         start_js=json.dumps(start)), encoding="utf-8")
    # A server shows 404.html at whatever path was asked for: its links find the site's root from
    # that path (the part before the first of the site's own folders), else the server's root.
    folders = sorted({d.split("/", 1)[0] + "/" for d in docs if "/" in d} | {"_static/"})
    script = ("<script>(function () { var p = location.pathname, cut = -1;"
              f" {json.dumps(folders)}.forEach(function (f) {{ var i = p.indexOf('/' + f);"
              " if (i >= 0 && (cut < 0 || i < cut)) cut = i; });"
              " var root = cut >= 0 ? p.slice(0, cut + 1) : p.replace(/[^/]*$/, '');"
              " document.querySelectorAll('a[data-site]').forEach(function (a) {"
              " a.href = root + a.getAttribute('data-site'); }); })();</script>")
    start = app.builder.get_target_uri(root)
    missing = (f"<h1>Page not found</h1>\n<p>There is no page at this address in <cite>{escape(title)}</cite>: "
               "it may have moved, or the link may be mistyped.</p>\n"
               f'<p><a data-site="index.html" href="/index.html">The front page of the book</a> · '
               f'<a data-site="{start}" href="/{start}">Start reading</a> · '
               f'<a data-site="search.html" href="/search.html">Search</a></p>\n{script}')
    (out / "404.html").write_text(_STANDALONE.format(lang=lang, title=f"Page not found · {escape(title)}",
                                                     root="/", body=missing), encoding="utf-8")


# ---- "Deeper — skip on a first reading": a run of `deeper` cells, one collapsed <details> ------
# The convention (book/ chapters, tests/test_learner_aids.py): every cell of a side road carries the
# cell tag `deeper`, and its first cell is a markdown cell that starts with a heading "Deeper: ...".
# myst-nb 1.4 gives a code cell's container its tags (classes tag_<name>, and cell_metadata), but
# renders a markdown cell as a pass-through: its paragraphs and headings join the page's sections
# and nothing in the doctree says where the cell began (myst_nb/core/render.py,
# render_nb_cell_markdown). So, when Sphinx reads a notebook that has `deeper` cells, each markdown
# cell gets a MyST line comment as its first line, `% preln-cell <index> deeper|main`, which myst
# renders as a comment node where the cell begins. Once the doctree is resolved (after the page
# ToC was collected from the unwrapped sections: the deeper headings stay in it), each run of
# deeper cells -- from its "Deeper:" section to the first cell that is not deeper -- is wrapped in a
# `deeper` node, written as <details class="preln-deeper"> with a <summary> that names it; what
# docutils nested inside the deeper section after the run ended (the main path resuming with a
# paragraph or a code cell) is moved out after it. The markers are then removed.

DEEPER_TAG = "deeper"
DEEPER_PREFIX = "Deeper: "
DEEPER_SUMMARY = "Deeper \u2014 skip on a first reading: "
_MARK = re.compile(r"^preln-cell (\d+) (deeper|main)$")


class deeper(nodes.General, nodes.Element):
    """A run of `deeper` cells: <details class="preln-deeper"> on the site."""


class deeper_summary(nodes.Part, nodes.TextElement):
    """The <summary> of a `deeper` node: DEEPER_SUMMARY and the heading's words."""


def mark_markdown_cells(text: str) -> str:
    """A notebook's JSON with `% preln-cell <index> deeper|main` as the first line of every
    markdown cell, if any cell is tagged `deeper` (else the text unchanged)."""
    notebook = json.loads(text)
    cells = notebook.get("cells", [])
    if not any(DEEPER_TAG in c.get("metadata", {}).get("tags", []) for c in cells):
        return text
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        source = "".join(cell.get("source", []))
        if not source.strip():
            continue           # myst-nb skips an empty cell; a lone comment would not be empty
        kind = "deeper" if DEEPER_TAG in cell.get("metadata", {}).get("tags", []) else "main"
        cell["source"] = f"% preln-cell {i} {kind}\n" + source
    return json.dumps(notebook)


def _mark_source(app, docname, source):
    if Path(app.env.doc2path(docname)).suffix == ".ipynb":
        source[0] = mark_markdown_cells(source[0])


def _cell_bounds(doctree):
    """[(node, is_deeper)] for every cell's first node, in document order: the markdown cells'
    markers and the code cells' containers."""
    bounds = []
    for node in doctree.findall(lambda n: isinstance(n, (nodes.comment, nodes.container))):
        if isinstance(node, nodes.comment):
            m = _MARK.match(node.astext().strip())
            if m:
                bounds.append((node, m.group(2) == "deeper"))
        elif node.get("nb_element") == "cell_code":
            bounds.append((node, f"tag_{DEEPER_TAG}" in node["classes"]))
    return bounds


def _contains(tree, node) -> bool:
    while node is not None:
        if node is tree:
            return True
        node = node.parent
    return False


def _ancestors(node):
    """node, its parent, its parent's parent, ... up to the document."""
    while node is not None:
        yield node
        node = node.parent


def _summary(title):
    """The run's <summary>: DEEPER_SUMMARY, then the heading's own nodes without "Deeper: "."""
    words = [child.deepcopy() for child in title.children]
    if words and isinstance(words[0], nodes.Text):
        words[0] = nodes.Text(str(words[0]).removeprefix(DEEPER_PREFIX))
    return deeper_summary("", nodes.Text(DEEPER_SUMMARY), *words)


def wrap_deeper_runs(doctree, docname="") -> int:
    """Wrap each run of deeper cells of a marked notebook's doctree in a `deeper` node; return
    how many. A run that does not start with a "Deeper:" heading is left open (with a warning)."""
    bounds = _cell_bounds(doctree)
    runs = []
    for i, (node, is_deeper) in enumerate(bounds):
        if is_deeper and (i == 0 or not bounds[i - 1][1]):
            end = next((n for n, d in bounds[i + 1:] if not d), None)
            runs.append((node, end))
    wrapped = 0
    for start, end in runs:
        section = start.next_node(nodes.section, include_self=False, descend=True, siblings=True, ascend=True)
        title = section.next_node(nodes.title) if section is not None else None
        if not (isinstance(start, nodes.comment) and title is not None and title.astext().startswith(DEEPER_PREFIX)):
            logger.warning("%s: a run of `deeper` cells must start with a markdown cell whose heading "
                           "begins %r; this one is left open", docname, DEEPER_PREFIX, location=start)
            continue
        parent = section.parent
        top = next((a for a in _ancestors(end) if a.parent is parent), None) if end is not None else None
        if top is not None and top is not end:
            # The first cell after the run begins inside the run's last section (docutils put the
            # marker, or the next cell's paragraphs, there): it and all after it in that section
            # move out, after the section, so that the section holds only the run.
            moved, child = [], end
            while child is not top:
                up = child.parent
                i = up.index(child) + (0 if child is end else 1)
                moved += up.children[i:]
                del up.children[i:]
                child = up
            if any(isinstance(n, nodes.section) for n in moved):
                logger.warning("%s: a heading nested in a `deeper` section follows its run: it moves up a "
                               "level (start the main path with a heading of the deeper one's level or higher)",
                               docname, location=end)
            at = parent.index(top) + 1
            parent[at:at] = moved
        elif end is not None and top is None:
            logger.warning("%s: the `deeper` run starting %r goes on past the end of the section that holds "
                           "its heading; only that section's part is collapsed", docname, title.astext(),
                           location=start)
        group = [section]
        k = parent.index(section) + 1
        while k < len(parent) and not (end is not None and _contains(parent[k], end)):
            group.append(parent[k])
            k += 1
        at = parent.index(section)
        del parent[at:at + len(group)]
        parent.insert(at, deeper("", _summary(title), *group, classes=["preln-deeper"]))
        wrapped += 1
    for node, _ in bounds:
        if isinstance(node, nodes.comment) and node.parent is not None:
            node.parent.remove(node)
    return wrapped


def _wrap_deeper(app, doctree, docname):
    if Path(app.env.doc2path(docname)).suffix == ".ipynb":
        wrap_deeper_runs(doctree, docname)


def visit_deeper_html(self, node):
    self.body.append('<details class="preln-deeper">\n')


def depart_deeper_html(self, node):
    self.body.append("</details>\n")


def visit_deeper_summary_html(self, node):
    self.body.append('<summary class="preln-deeper-summary">')


def depart_deeper_summary_html(self, node):
    self.body.append("</summary>\n")


def _pass(self, node):
    pass


def _skip(self, node):
    raise nodes.SkipNode


def setup_deeper(app):
    """The deeper-run mechanism alone (also what tests/test_learner_aids.py builds a tiny book with)."""
    app.connect("source-read", _mark_source)
    app.connect("doctree-resolved", _wrap_deeper)
    other = {fmt: (_pass, None) for fmt in ("latex", "text", "man", "texinfo")}
    app.add_node(deeper, html=(visit_deeper_html, depart_deeper_html), **other)
    app.add_node(deeper_summary, html=(visit_deeper_summary_html, depart_deeper_summary_html),
                 **{fmt: (_skip, None) for fmt in other})


# ---- the header's buttons say what they are (issue 33, navigation) -------------------------------
# sphinx-book-theme 1.3's article header draws its launch, source and download menus as bare icons
# (macros/buttons.html, render_button_group: an <i> and an aria-label), so Binder and Colab hide
# behind a rocket. Each menu button gets a visible word, the start of its accessible name (WCAG
# 2.5.3: what is shown is what is heard); the theme has no option for it.
HEADER_LABELS = {"launch": ("Run online", "Run online: Binder or Colab"),
                 "source": ("Source", None), "download": ("Download", None)}
_HEADER_MENU = re.compile(r'(<div class="dropdown dropdown-(launch|source|download)-buttons">\s*'
                          r'<button class="btn dropdown-toggle"[^>]*?aria-label=")([^"]*)(">\s*'
                          r'<i class="[^"]*"></i>)')


def label_header_buttons(html: str) -> str:
    def label(m):
        text, name = HEADER_LABELS[m.group(2)]
        return (f'{m.group(1)}{name or m.group(3)}{m.group(4)}'
                f'<span class="preln-header-label">{text}</span>')
    return _HEADER_MENU.sub(label, html)


def label_header_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for path in Path(app.outdir).rglob("*.html"):
        html = path.read_text(encoding="utf-8")
        labelled = label_header_buttons(html)
        if labelled != html:
            path.write_text(labelled, encoding="utf-8")


# ---- a link to a chapter names it as the sidebar does: its number and short title (issue 33) ----

def chapter_names(app) -> dict:
    """{docname: "Chapter 6, Why Pre-LN: Pre-LN vs Post-LN"} for every numbered chapter: its number
    (Sphinx's toc_secnumbers) and its title in _toc.yml (else its page title), as the sidebar
    shows them ("6. Why Pre-LN: ..."), worded to read in a sentence."""
    env = app.env
    titles = {}
    for doctree_name in env.toctree_includes:
        for toctree in env.get_doctree(doctree_name).findall(addnodes.toctree):
            titles.update({ref: title for title, ref in toctree["entries"] if title})
    names = {}
    for doc, numbers in env.toc_secnumbers.items():
        number = numbers.get("")
        if number:
            title = titles.get(doc) or env.titles[doc].astext()
            names[doc] = "Chapter " + ".".join(map(str, number)) + ", " + title
    return names


class NumberChapterLinks(SphinxPostTransform):
    """A {doc} link that names no text of its own names the chapter by its number and its short
    title, as the sidebar does, not by the page's longer heading: one name per chapter."""
    default_priority = 5            # before Sphinx's ReferencesResolver (10) writes the title

    def run(self, **kwargs):
        names = None
        for node in self.document.findall(addnodes.pending_xref):
            if node.get("reftype") != "doc" or node.get("refexplicit"):
                continue
            if names is None:
                names = chapter_names(self.app)
            target = docname_join(node.get("refdoc", self.env.docname), node["reftarget"])
            if target in names:
                node["refexplicit"] = True
                node[:] = [nodes.inline(names[target], names[target], classes=["xref", "std", "std-doc"])]


def setup(app):
    from myst_nb.sphinx_ import HideCodeCellNode

    app.connect("html-page-context", rewrite_body, priority=900)
    app.connect("html-page-context", clean_scripts, priority=999)
    app.connect("build-finished", subset_icon_fonts)
    app.connect("build-finished", label_header_pages)
    # after sphinx-external-toc's redirect (priority 500), which it writes only if there is none
    app.connect("build-finished", write_root_pages, priority=900)
    app.connect("doctree-read", rename_assignment_downloads, priority=600)   # after the collector (500)
    # after Sphinx's own resolvers (intersphinx, the builtin resolver) had their go
    app.connect("missing-reference", resolve_docstring_refs, priority=900)
    app.add_post_transform(NumberChapterLinks)
    app.add_node(HideCodeCellNode, override=True, html=(visit_hide_cell_input, depart_hide_cell_input))
    setup_deeper(app)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
