"""Sphinx extension: show a docstring verbatim when it is not valid reStructuredText.

The package's docstrings are written to be read in a terminal (`help(preln.ops.layer_norm_forward)`):
aligned argument lists, shape diagrams, formulas. Rendered as reST, such text produces docutils
errors ("Unexpected indentation"), which the strict build (`-W`) turns into failures. This hook runs
after napoleon; if the processed docstring does not parse cleanly as reST, it replaces it with the
original docstring as a literal block, so the API page shows exactly what `help()` shows.
Well-formed (numpy-style) docstrings are left to napoleon and render as usual.
"""
from __future__ import annotations

import inspect
import io
import re

from docutils import nodes
from docutils.core import publish_doctree

_ROLE = re.compile(r":[\w.+-]+(?::[\w.+-]+)*:`([^`]*)`")
_IGNORED = ("Unknown directive type", "Unknown interpreted text role", 'No directive entry',
            'No role entry')


def _problems(text: str, env=None) -> list[str]:
    """docutils warnings/errors in `text`, ignoring Sphinx-only roles and directives.

    Parser messages are in the tree; transform messages (undefined |substitution|, unknown
    `target`_) are in document.transform_messages.
    """
    checked = _ROLE.sub(r"``\1``", text)
    doc = publish_doctree(checked, settings_overrides={
        "report_level": 2, "halt_level": 5, "warning_stream": io.StringIO(),
        "file_insertion_enabled": False, "raw_enabled": False, "env": env})
    msgs = []
    for msg in [*doc.findall(nodes.system_message), *doc.transform_messages]:
        body = msg.astext()
        if msg["level"] >= 2 and not any(s in body for s in _IGNORED):
            msgs.append(body)
    return msgs


def process_docstring(app, what, name, obj, options, lines):
    if not lines or not _problems("\n".join(lines), app.env):
        return
    original = None if what in ("data", "attribute") else inspect.getdoc(obj)
    raw = (original.splitlines() if original else list(lines))
    lines[:] = [".. code-block:: text", ""] + ["   " + line if line else "" for line in raw] + [""]


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-docstring", process_docstring, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
