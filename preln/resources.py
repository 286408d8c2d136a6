"""Where the package's data files live: ``preln/data/``, shipped inside the wheel.

The corpus, the stored Pre-LN vs Post-LN sweeps and the precision chapter's overflow grids are
package data (``pyproject.toml`` declares them), so ``pip install preln`` — editable or not, from a
clone, from git, on Colab or Binder — carries every file the package reads. Everything that reads or
(re)writes one of them goes through :func:`data_path`; ``preln/data/README.md`` says how each file
was made.
"""
from importlib import resources
from pathlib import Path

__all__ = ["data_path"]


def data_path(*parts):
    """Path of a file (or folder) under ``preln/data/``, e.g. ``data_path("corpus.txt")``.

    parts: path components below ``preln/data`` (strings). The file need not exist yet (the scripts
    that regenerate data write to this path). Raises FileNotFoundError, naming the package location,
    when the installed package has no data folder (a build that left the package data out).
    """
    for p in parts:
        if not isinstance(p, str) or not p or p.startswith(("/", "\\")) or ".." in Path(p).parts:
            raise ValueError(f"parts: expected relative path components below preln/data; got {p!r}")
    root = resources.files("preln") / "data"
    # the package is installed as files (a wheel, an editable install or a clone), never as a zip:
    # a real directory, so the Traversable is a pathlib.Path
    root = Path(str(root))
    if not root.is_dir():
        raise FileNotFoundError(f"preln's data folder {root} is missing: this installation of preln "
                                "was built without its package data (pyproject.toml declares it)")
    return root.joinpath(*parts)
