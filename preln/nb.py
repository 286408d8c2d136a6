"""What the chapters' notebooks use to hand numbers to their prose, with or without the book's toolchain.

The book's prose quotes computed numbers with myst-nb's ``{glue:text}`` role: a notebook cell calls
``glue("name", value)`` and the built page shows ``value`` where the text says ``name``. A learner who
runs a chapter on Colab, Binder or after a plain ``pip install preln`` has no myst-nb (it is part of
the book's build stack, not of the package), and the chapters must still run there. So every chapter
imports :func:`glue` from here: with myst-nb installed it *is* ``myst_nb.glue`` (the stored outputs,
and so the site, are unchanged); without it, it shows the value in the notebook, so the reader of
the raw notebook sees the number the prose refers to.
"""
try:
    from myst_nb import glue as _myst_glue
except ImportError:          # a learner's environment: no book toolchain
    _myst_glue = None

__all__ = ["glue", "HAVE_MYST_NB"]

#: True when myst-nb is importable (the book's build environment and `make test`).
HAVE_MYST_NB = _myst_glue is not None


def glue(name, variable, display=True):
    """Glue ``variable`` under ``name`` for the book's ``{glue:...}`` roles (myst-nb's ``glue``).

    name:     the key the prose uses (a string).
    variable: any value; it is stored the way Jupyter would display it.
    display:  also show the value in the notebook (myst-nb's meaning). Without myst-nb the value is
              always shown, as ``name = value``, since nothing else would render it.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty string (the key the prose uses); got {name!r}")
    if _myst_glue is not None:
        return _myst_glue(name, variable, display=display)
    print(f"{name} = {variable!r}" if isinstance(variable, str) else f"{name} = {variable}")
    return None
