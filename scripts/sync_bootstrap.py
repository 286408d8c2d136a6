"""Write the canonical bootstrap (scripts/bootstrap_cell.py) into every notebook, or check it is there.

    python scripts/sync_bootstrap.py           # rewrite the notebooks that differ
    python scripts/sync_bootstrap.py --check   # exit 1, listing them, if any notebook differs

Chapters (book/*.ipynb): the first code cell is the bootstrap alone, tagged ``remove-cell`` (the site
does not show it; Jupyter, Colab and Binder run it). Assignments (assignments/source/*/*.ipynb): the
locked setup cell starts with it, followed by the imports; `make assignments` then regenerates the
released student notebooks from the sources (nbgrader checksums their locked cells).
Only cell sources change; outputs are left as they are (the bootstrap prints nothing where preln
is importable, which is where stored outputs are made).
"""
import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP = (ROOT / "scripts" / "bootstrap_cell.py").read_text().rstrip("\n")
MARKER = BOOTSTRAP.splitlines()[0]          # "# preln bootstrap: ..."
TAG = "remove-cell"


def chapters():
    return sorted((ROOT / "book").glob("*.ipynb"))


def assignment_notebooks():
    return sorted((ROOT / "assignments" / "source").glob("*/*.ipynb"))


def _strip_old(source):
    """The setup cell's source without its bootstrap (the current one, or the older preamble)."""
    lines = source.split("\n")
    if source.startswith(MARKER):
        n = len(BOOTSTRAP.split("\n"))
        return "\n".join(lines[n:]).lstrip("\n")
    # the preamble before this script existed: imports, then a try/except ModuleNotFoundError
    # block ending at the first blank line after it
    if "except ModuleNotFoundError" in source:
        i = next(k for k, ln in enumerate(lines) if ln.startswith("try:"))
        j = next(k for k in range(i, len(lines)) if lines[k].strip() == "")
        return "\n".join(lines[j:]).lstrip("\n")
    return source


def sync_chapter(nb):
    code = [c for c in nb.cells if c.cell_type == "code"]
    if code and code[0].source.startswith(MARKER):
        cell = code[0]
    else:
        cell = nbformat.v4.new_code_cell("")
        cell["id"] = "preln-bootstrap"      # a fixed id: re-running this script gives the same file
        nb.cells.insert(nb.cells.index(code[0]) if code else 0, cell)
    changed = cell.source != BOOTSTRAP or TAG not in cell.metadata.get("tags", [])
    cell.source = BOOTSTRAP
    cell.metadata["tags"] = sorted(set(cell.metadata.get("tags", [])) | {TAG})
    return changed


def sync_assignment(nb):
    setup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    new = BOOTSTRAP + "\n\n" + _strip_old(setup.source)
    changed = new != setup.source
    setup.source = new
    return changed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report notebooks that differ")
    args = ap.parse_args(argv)
    stale = []
    for path, fix in [(p, sync_chapter) for p in chapters()] + [(p, sync_assignment) for p in assignment_notebooks()]:
        nb = nbformat.read(str(path), as_version=4)
        if fix(nb):
            stale.append(path.relative_to(ROOT))
            if not args.check:
                nbformat.write(nb, str(path))
    if args.check and stale:
        print("bootstrap out of date in:", *stale, sep="\n  ")
        print("run: python scripts/sync_bootstrap.py")
        return 1
    print(f"{'stale' if args.check else 'rewrote'}: {len(stale)} notebook(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
