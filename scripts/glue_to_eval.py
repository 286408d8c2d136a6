"""Rewrite the chapters' {glue:text} roles as MyST inline expressions, with their stored values (issue 31).

    python scripts/glue_to_eval.py book/*.ipynb            # rewrite in place, report
    python scripts/glue_to_eval.py --dry-run book/*.ipynb  # report only (exit 1 if anything to do)

Each ``{glue:text}`name:fmt``` of a markdown cell becomes ``{eval}`glue.text("name:fmt")``` (preln.nb:
the value glued under ``name``, formatted as myst-nb formatted it). The cell's ``user_expressions``
metadata, which jupyterlab-myst shows without a kernel and the site's build reads
(book/_ext/preln_eval.py), is filled from the glue outputs the notebook already stores, formatted by
myst-nb's own function, so the page shows what it showed before. ``make notebooks`` recomputes
them from a fresh run; ``make test-notebooks`` fails where they differ.

Safe to re-run: a converted role is left as it is, a stored value is never overwritten (only a
missing one is filled in), and a notebook is written only when it changed (read, changed and
written in one go). Reported and left as written: glue roles of other kinds ({glue}, {glue:any},
{glue:md}, {glue:figure}, {glue:math}), references to another notebook (``path::name``), and names
no stored output glues (run ``make notebooks``, then this script again). A role whose name is
glued only by a later cell is converted, and listed: JupyterLab's *Run All* evaluates a markdown
cell when it reaches it, so it shows a KeyError there until that cell is run again.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
from myst_nb.core.variables import format_plain_text

from preln.nb import eval_expressions

GLUE_TEXT = re.compile(r"\{glue:text\}`([^`]+)`")
# every other inline glue role, and the glue directives (``` or ::: fences)
OTHER_GLUE = re.compile(r"\{glue(?::(?!text\})[\w-]+)?\}`[^`]*`|^[ \t]*(?:`{3,}|:{3,})\{glue(?::[\w-]+)?\}.*$",
                        re.MULTILINE)
GLUED_TEXT = re.compile(r'^glue\.text\("([^"\\]+)"\)$')   # the expression this script writes
GLUE_MIME = "application/papermill.record/text/plain"     # where myst-nb's glue stores text/plain


def expression(spec: str) -> str:
    return f'glue.text("{spec}")'


def stored_glue(nb) -> dict:
    """name -> (index of the cell that glues it, the text/plain stored for it); the last one wins."""
    glued = {}
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name and GLUE_MIME in out.get("data", {}):
                glued[name] = (index, out["data"][GLUE_MIME])
    return glued


def convert(nb, label: str) -> tuple[bool, list[str]]:
    """Convert notebook ``nb`` in memory; (changed, report lines)."""
    glued, report, changed, roles, filled = stored_glue(nb), [], False, 0, 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        where = f"{label} cell {index}"
        for m in OTHER_GLUE.finditer(cell.source):
            report.append(f"  NOT CONVERTED {where}: {m.group(0).strip()} (only {{glue:text}} roles are)")

        def rewrite(m):
            nonlocal roles
            spec = m.group(1)
            if "::" in spec or '"' in spec or "\\" in spec:
                report.append(f"  NOT CONVERTED {where}: {m.group(0)} (another notebook's value, or a "
                              "name the expression cannot quote)")
                return m.group(0)
            roles += 1
            return "{eval}`" + expression(spec) + "`"

        source = GLUE_TEXT.sub(rewrite, cell.source)
        if source != cell.source:
            cell.source, changed = source, True
        stored = {u["expression"]: u for u in cell.metadata.get("user_expressions", [])}
        entries = []
        for expr in eval_expressions(cell.source):
            if expr in stored:
                entries.append(stored[expr])
                continue
            m = GLUED_TEXT.match(expr)
            if not m:
                report.append(f"  NO STORED VALUE {where}: {expr} (not a glue.text expression: run make notebooks)")
                continue
            # split as myst-nb's {glue:text} split it ("s" when no format is given)
            name, fmt = m.group(1).rsplit(":", 1) if ":" in m.group(1) else (m.group(1), "s")
            if name not in glued:
                report.append(f"  NO STORED VALUE {where}: {expr} (no stored output glues {name!r}: run make notebooks)")
                continue
            try:
                text = format_plain_text(glued[name][1], fmt)      # exactly what {glue:text} showed
            except Exception as exc:                           # noqa: BLE001 - reported, left unfilled
                report.append(f"  NO STORED VALUE {where}: {expr} (myst-nb could not format it: {exc})")
                continue
            entries.append({"expression": expr,
                            "result": {"status": "ok", "data": {"text/plain": repr(text)}, "metadata": {}}})
            filled += 1
            if glued[name][0] > index:
                report.append(f"  LATER GLUE {where}: {name!r} is glued by cell {glued[name][0]}, after this "
                              "cell (JupyterLab's Run All shows a KeyError here until it is run again)")
        if entries != cell.metadata.get("user_expressions", []) and entries:
            cell.metadata["user_expressions"] = entries
            changed = True
    if roles or filled:
        report.insert(0, f"{label}: {roles} {{glue:text}} roles rewritten, {filled} stored values filled in")
    return changed, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")
    args = ap.parse_args(argv)
    todo = False
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)       # read right before the edit, written at once
        changed, report = convert(nb, str(path))
        print("\n".join(report) if report else f"{path}: nothing to convert")
        if changed and not args.dry_run:
            nbformat.write(nb, path)
        todo |= changed
    return 1 if (args.dry_run and todo) else 0


if __name__ == "__main__":
    sys.exit(main())
