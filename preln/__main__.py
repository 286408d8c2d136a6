"""``python -m preln``: the version, which module serves which chapter, and how to open the book and
run its notebooks.

    python -m preln          # all of it
    python -m preln --map    # the module -> chapter map alone
    python -m preln --version   # the version alone (the release tag is v<version>)

The map is the package docstring's (``help(preln)`` starts with it); the repository URL is the one
the package was built with (``pyproject.toml``'s project URLs, which a test keeps equal to
``_config.yml``'s ``repository.url``).
"""
import argparse
import platform
import re
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import preln

MAP_HEADING = "Which module serves which chapter"


def chapter_map():
    """The map in the package docstring as [(module, [chapters], description), ...], in order."""
    doc = preln.__doc__
    start = doc.index(MAP_HEADING)
    block = textwrap.dedent(doc[doc.index("::\n", start) + 3:])
    rows = []
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):            # "preln.x   chapter, chapter"
            module, chapters = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            rows.append([module, [c.strip() for c in chapters.split(",")], ""])
        else:                                   # its description, indented
            rows[-1][2] = (rows[-1][2] + " " + line.strip()).strip()
    return [tuple(r) for r in rows]


def map_text():
    """The map as the package docstring shows it."""
    doc = preln.__doc__
    start = doc.index(MAP_HEADING)
    heading = doc[start:doc.index("::\n", start)] + ":"
    body = textwrap.dedent(doc[doc.index("::\n", start) + 3:]).strip("\n")
    return (heading + "\n\n" + textwrap.indent(body, "  ")).replace("``", "")


def repository_url():
    """The repository this installation names in its metadata ("Repository" project URL), or,
    running from a checkout that is not installed, the one in its _config.yml; None if neither."""
    try:
        meta = metadata.metadata("preln")
        if meta["Version"] == preln.__version__:
            for entry in meta.get_all("Project-URL") or []:
                label, _, url = entry.partition(",")
                if label.strip().lower() == "repository":
                    return url.strip().rstrip("/")
    except metadata.PackageNotFoundError:
        pass
    config = Path(preln.__file__).resolve().parent.parent / "_config.yml"
    if config.is_file():
        m = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", config.read_text(), re.M)
        if m:
            return m.group(1).rstrip("/")
    return None


def _blas_line():
    from preln.blas import blas_libraries

    libs = blas_libraries()
    if not libs:
        return "BLAS: not one threadpoolctl can control (preln.blas.blas_threads does nothing here)"
    def owner(path):           # numpy's and scipy's wheels each bundle their own OpenBLAS
        return next((f"{pkg}'s " for pkg in ("numpy", "scipy") if f"{pkg}." in Path(path).parent.name), "")

    return "BLAS: " + "; ".join(
        f"{owner(lib['filepath'])}{lib['internal_api']} {lib['version']}"
        + (f" ({lib['architecture']} kernels)" if lib.get("architecture") else "")
        + f", {lib['num_threads']} thread{'s' if lib['num_threads'] != 1 else ''}" for lib in libs)


def report():
    """Everything ``python -m preln`` prints, as a string."""
    import numpy

    url = repository_url()
    repo = url or "<the repository's URL>"
    tag = f"v{preln.__version__}"
    where = Path(preln.__file__).resolve().parent
    lines = [
        f"preln {preln.__version__}: {preln.__doc__.splitlines()[0].split(': ', 1)[1]}",
        f"  installed at {where}",
        f"  Python {platform.python_version()}, numpy {numpy.__version__}; {_blas_line()}",
        "",
        map_text(),
        "",
        "Open the book",
        f"  The repository: {repo}",
        f"  Build the site: git clone {repo} && cd {repo.rstrip('/').rsplit('/', 1)[-1]} && make book",
        "  then open _build/html/index.html (it works offline: the site loads nothing from other servers).",
        "",
        "Run the notebooks (each chapter page also offers its .ipynb for download)",
        "  In a clone:  make lab  (JupyterLab on book/, preln importable, MyST admonitions rendered).",
        "  On Binder or Colab: the launch buttons at the top of every chapter page; the notebook's",
        "    first cell installs preln where it is missing.",
        f"  Anywhere else: pip install \"preln[notebooks] @ git+{repo}@{tag}\"",
        "    then `jupyter notebook` (the extra brings it, with a Python kernel) and open a downloaded",
        "    chapter; its first cell finds this installation.",
        "    preln[lab] adds JupyterLab with jupyterlab-myst.",
    ]
    return "\n".join(lines)


def help_description():
    """The module docstring's first paragraph, on one line: what ``--help`` says the command does."""
    return " ".join(__doc__.split("\n\n", 1)[0].split()).replace("``", "")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m preln", description=help_description())
    ap.add_argument("--map", action="store_true", help="print only the module -> chapter map")
    ap.add_argument("--version", action="store_true", help="print only the version (the release tag is v<version>)")
    args = ap.parse_args(argv)
    print(preln.__version__ if args.version else map_text() if args.map else report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
