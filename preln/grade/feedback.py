"""The feedback page: nbgrader's HTML, with everything a student wrote reduced to inert HTML.

nbgrader renders the feedback (and formgrader its views) with nbconvert's ``HTMLExporter``, whose
markdown filter passes raw HTML through: a written answer could run a ``<script>``, an
``<img onerror>``, an ``<iframe>``, or restyle the page with ``<style>`` to hide its failed checks
under a fake "all passed" banner. :class:`FeedbackExporter` renders each markdown cell as nbconvert
does, then keeps only what :data:`TAGS` and :func:`allowed` allow (bleach, an allow-list
sanitiser): no script, event handler, frame, form, style or class of the page's own, links only to
http(s) and mail, images only as PNG/JPEG/GIF data (a pasted attachment). What is not allowed is
shown as text, so the instructor still sees what was written. The outputs of code cells are
already reduced to text and PNG by the grader (autograde.sanitize_outputs), and the template's
score banner and the tests cells' verdicts are the grader's own: nothing left in a student's
markdown can restyle, cover or script them.

make grade uses it (cli.make_api); assignments/nbgrader_config.py sets it for stock nbgrader's
generate_feedback too. formgrader renders the autograded notebook with its own template and a plain
``HTMLExporter``, whose class no setting replaces; its markdown cells pass through the
``strip_files_prefix`` filter after ``markdown2html``, and an exporter's filters are configurable:
nbgrader_config.py puts :func:`strip_files_prefix` (nbconvert's, then :func:`clean`) in its place, so
formgrader's pages show a student's markdown as inert as the feedback does.
"""
import html
import re

import bleach
from nbconvert.exporters import HTMLExporter
from nbconvert.filters import strip_files_prefix as nbconvert_strip_files_prefix

#: the tags markdown produces (and a written answer needs): text, lists, tables, code, links, images
TAGS = frozenset({"a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em",
                  "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre",
                  "s", "span", "strong", "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"})
#: links a student may write; images come only as data (a pasted attachment), see allowed()
PROTOCOLS = frozenset({"http", "https", "mailto", "data"})
IMAGE_DATA = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*\Z")
#: pygments' token classes (``<span class="kn">``) and its code block: a code block keeps its
#: colours, and no class of the page's own (a bootstrap panel that looks like the grader's) is allowed
TOKEN_CLASS = re.compile(r"[a-z]{1,3}[0-9]?\Z")


def allowed(tag, name, value):
    """Whether attribute ``name="value"`` of ``tag`` stays (bleach's attribute filter)."""
    if tag == "a":
        return name in ("href", "title") and not value.lower().lstrip().startswith("data:")
    if tag == "img":
        return name in ("alt", "title") or (name == "src" and bool(IMAGE_DATA.match(value)))
    if name == "class":
        return ((tag == "span" and all(TOKEN_CLASS.match(c) for c in value.split()))
                or (tag == "div" and value == "highlight"))
    return (tag in ("td", "th") and name == "align") or (tag == "ol" and name == "start")


def clean(html):
    """``html`` (a student's rendered markdown) with only allowed tags and attributes; anything
    else is escaped, so it shows as the text it was."""
    return bleach.clean(html, tags=TAGS, attributes=allowed, protocols=PROTOCOLS, strip=False,
                        strip_comments=True)


def strip_files_prefix(text):
    """nbconvert's ``strip_files_prefix`` filter, then :func:`clean`: what formgrader's template
    applies to every rendered markdown cell (assignments/nbgrader_config.py)."""
    return clean(nbconvert_strip_files_prefix(text))


#: characters of one markdown cell rendered as markdown, and of all the notebook's: mistune's time
#: grows faster than the text on nested brackets (100,000 characters took 90 s), so the feedback
#: renders a bounded copy — a written answer is a few hundred words — and says what it left out
MAX_MARKDOWN_CELL, MAX_MARKDOWN_NOTEBOOK = 10_000, 50_000


def cut_note(n):
    return f"\n\n[... {n} more characters not shown in the feedback; the notebook holds them all]"


class FeedbackExporter(HTMLExporter):
    """nbconvert's HTML exporter whose markdown is sanitised by :func:`clean`, each cell rendered
    from its first MAX_MARKDOWN_CELL characters, and, once MAX_MARKDOWN_NOTEBOOK characters of the
    notebook are rendered, the rest shown as plain text (linear)."""

    def from_notebook_node(self, nb, resources=None, **kw):
        self._rendered = 0                      # the notebook's budget of markdown, per export
        return super().from_notebook_node(nb, resources, **kw)

    def markdown2html(self, context, source):   # jinja passes the context, as to nbconvert's (below)
        more = max(0, len(source) - MAX_MARKDOWN_CELL)
        source = source[:MAX_MARKDOWN_CELL]
        self._rendered = getattr(self, "_rendered", 0) + len(source)
        if self._rendered > MAX_MARKDOWN_NOTEBOOK:
            return f"<pre>{html.escape(source + (cut_note(more) if more else ''))}</pre>"
        out = clean(super().markdown2html(context, source))
        return out + (f"<p>{html.escape(cut_note(more).strip())}</p>" if more else "")

    # nbconvert's markdown2html is jinja2's @pass_context: the same mark (its attribute) on this one,
    # so the cell's attachments still reach it, without importing jinja2 here
    markdown2html.jinja_pass_arg = HTMLExporter.markdown2html.jinja_pass_arg
