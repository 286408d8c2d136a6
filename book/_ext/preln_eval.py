"""Sphinx extension: MyST inline expressions, ``{eval}`glue.text("name:.1f")```, from their stored values.

The chapters' prose quotes computed numbers as MyST inline expressions (issue 31): jupyterlab-myst
shows the value each markdown cell stores in its ``user_expressions`` metadata, which
``make notebooks`` fills in (scripts/execute_notebooks.py) and ``make test-notebooks`` checks. myst-nb
1.4's own ``{eval}`` role asks a running kernel (myst_nb/ext/eval: "This document does not have a
running kernel" with ``execute_notebooks: "off"``), so this role replaces it and reads the same stored
values: the page shows the text JupyterLab shows, as the inline text myst-nb's ``{glue:text}``
wrote (``<span class="pasted-text">``). A role without a stored value, or whose stored value is an
error, is a warning, so the strict build (-W) fails on it.

A stored result is the text/plain of the expression's value: for the str ``glue.text`` returns, its
repr (``'63.4'``), read back with ``ast.literal_eval`` (jupyterlab-myst strips the quotes).
"""
from __future__ import annotations

import ast

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxRole

logger = logging.getLogger(__name__)


def stored_results(notebook) -> dict:
    """expression -> the results stored for it by the notebook's markdown cells (one per cell)."""
    found: dict = {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for entry in cell.get("metadata", {}).get("user_expressions", []):
                found.setdefault(entry.get("expression"), []).append(entry.get("result") or {})
    return found


def shown_text(result: dict) -> str:
    """The text a stored ``ok`` result shows (ValueError for anything else)."""
    if result.get("status") != "ok":
        raise ValueError(f"the stored result is an error: {result.get('ename')}: {result.get('evalue')}")
    text = result.get("data", {}).get("text/plain")
    if text is None:
        raise ValueError("the stored result has no text/plain")
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        return text
    return value if isinstance(value, str) else str(value)


class StoredEvalRole(SphinxRole):
    def run(self):
        renderer = self.inliner.document.get("nb_renderer")
        try:
            if renderer is None:
                raise ValueError("{eval} roles are for notebooks' markdown cells")
            results = stored_results(renderer.renderer.nb_client.notebook).get(self.text)
            if not results:
                raise ValueError("no stored value: run `make notebooks`")
            texts = {shown_text(r) for r in results}
            if len(texts) > 1:
                raise ValueError(f"markdown cells store different values for it ({sorted(texts)}): run "
                                 "`make notebooks`")
        except ValueError as exc:
            logger.warning(f"{{eval}}`{self.text}`: {exc}", location=self.get_location(),
                           type="preln", subtype="eval")
            return [nodes.problematic(self.rawtext, self.rawtext)], []
        text = texts.pop()
        node = nodes.inline(text, text, classes=["pasted-text"])
        self.set_source_info(node)
        return [node], []


def setup(app):
    # after myst_nb (jupyter-book lists local extensions last): replaces its kernel-bound role
    app.add_role("eval", StoredEvalRole(), override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
