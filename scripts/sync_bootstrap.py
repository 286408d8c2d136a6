"""Write the canonical bootstrap (scripts/bootstrap_cell.py) into every notebook, or check it is there.

    python scripts/sync_bootstrap.py           # rewrite the notebooks that differ
    python scripts/sync_bootstrap.py --check   # exit 1, listing them, if any notebook differs

The release the bootstrap installs by default, ``preln[notebooks] @ git+<url>@v<version>``, derives
from _config.yml's ``repository.url`` and preln/__init__.py's ``__version__``: this script first
rewrites that line of scripts/bootstrap_cell.py when either has changed (a fork, a new release), then
the notebooks; with --check it only reports.

Chapters (book/*.ipynb): the first code cell is the bootstrap alone, tagged ``remove-cell`` (the site
does not show it; Jupyter, Colab and Binder run it). Assignments (assignments/source/*/*.ipynb): the
locked setup cell starts with it, followed by the imports; `make assignments` then regenerates the
released student notebooks from the sources (nbgrader checksums their locked cells).
Only cell sources change; outputs are left as they are (the bootstrap prints nothing where preln
is importable, which is where stored outputs are made).
"""
import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP_FILE = ROOT / "scripts" / "bootstrap_cell.py"
BOOTSTRAP = BOOTSTRAP_FILE.read_text().rstrip("\n")
# the line of the bootstrap that names the default requirement
DEFAULT_RE = re.compile(r'(os\.environ\.get\("PRELN_INSTALL"\) or )"([^"]*)"')
MARKER = BOOTSTRAP.splitlines()[0]          # "# preln bootstrap: ..."
# its last line: where an assignment's setup cell goes on with its own imports, whatever the length
# of the bootstrap that is there (an older one may be shorter or longer than BOOTSTRAP)
END = "# (end of the preln bootstrap)"
TAG = "remove-cell"


def release_requirement():
    """``preln[notebooks] @ git+<_config.yml repository.url>@v<preln.__version__>``."""
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    version = re.search(r'^__version__ = "([^"]+)"', (ROOT / "preln" / "__init__.py").read_text(), re.M)
    return f"preln[notebooks] @ git+{url}@v{version.group(1)}"


def check_end(text):
    """The bootstrap must end with END (:func:`_strip_old` finds the end of an old one by it)."""
    if text.rstrip("\n").split("\n")[-1] != END:
        raise SystemExit(f"{BOOTSTRAP_FILE}: its last line must be {END!r}")


def bootstrap_with_release(text):
    """The bootstrap's text with its default requirement set to :func:`release_requirement`."""
    if len(DEFAULT_RE.findall(text)) != 1:
        raise SystemExit(f"{BOOTSTRAP_FILE}: expected one `os.environ.get(\"PRELN_INSTALL\") or \"...\"`")
    return DEFAULT_RE.sub(lambda m: f'{m.group(1)}"{release_requirement()}"', text)


def chapters():
    return sorted((ROOT / "book").glob("*.ipynb"))


def assignment_notebooks():
    return sorted((ROOT / "assignments" / "source").glob("*/*.ipynb"))


def _strip_old(source):
    """The setup cell's source without its bootstrap (any version of it, or the older preamble)."""
    lines = source.split("\n")
    if source.startswith(MARKER):
        if END in lines:
            return "\n".join(lines[lines.index(END) + 1:]).lstrip("\n")
        # a bootstrap from before END: its last statement ended with `    import preln` and a blank line
        i = source.find("\n    import preln\n\n")
        if i < 0:
            raise SystemExit(f"a setup cell starts with the bootstrap but neither ends it with {END!r} nor "
                             "with `    import preln` and a blank line: fix it by hand")
        return source[i + len("\n    import preln\n\n"):].lstrip("\n")
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
    global BOOTSTRAP
    check_end(BOOTSTRAP)
    current = bootstrap_with_release(BOOTSTRAP)
    if current != BOOTSTRAP:
        if args.check:
            print(f"{BOOTSTRAP_FILE.relative_to(ROOT)}: the default requirement is not {release_requirement()!r}")
            print("run: python scripts/sync_bootstrap.py")
            return 1
        BOOTSTRAP_FILE.write_text(current + "\n")
        print(f"{BOOTSTRAP_FILE.relative_to(ROOT)}: default requirement now {release_requirement()!r}")
        BOOTSTRAP = current
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
