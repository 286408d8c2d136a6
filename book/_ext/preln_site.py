"""Sphinx extension: keep every page's <script> list clean and self-contained.

- jupyter-book 1.0.4 with Sphinx 7.4 emits some inline scripts twice (sphinx-thebe's
  `const THEBE_JS_URL = ...` among them), which is a JavaScript error ("Identifier has already been
  declared") on every page: identical scripts are dropped here.
- Docstrings are written for `help()` in a terminal and name things briefly (`TransformerStack`,
  `MASKS`, "float32"). On the API page, a Python reference that Sphinx cannot resolve is looked up
  by its last component among the documented objects (linked if exactly one matches), and
  otherwise shown as code instead of failing the nitpicky build (`-n`); `-v` lists them. References
  written in the book's own pages stay strict.
- With `launch_buttons.thebe: false` nothing on the site uses thebe, but sphinx-thebe still adds
  its loader and the unpkg.com URL it would fetch thebe from; those are dropped too, so no page
  names another origin as a script source.
"""
from __future__ import annotations

from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

# Pages generated from docstrings: their cross-references are best effort (see below).
API_PAGES = {"book/api"}


def _thebe_enabled(app) -> bool:
    opts = app.config.html_theme_options or {}
    return bool((opts.get("launch_buttons") or {}).get("thebe"))


def clean_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    drop_thebe = not _thebe_enabled(app)
    seen, kept = set(), []
    for js in scripts:
        filename = str(js.filename or "")
        attrs = dict(getattr(js, "attributes", {}) or {})
        if drop_thebe and ("sphinx-thebe" in filename or "THEBE_JS_URL" in attrs.get("body", "")):
            continue
        key = (filename, tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    context["script_files"] = kept


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


def setup(app):
    app.connect("html-page-context", clean_scripts, priority=999)
    # after Sphinx's own resolvers (intersphinx, the builtin resolver) had their go
    app.connect("missing-reference", resolve_docstring_refs, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
