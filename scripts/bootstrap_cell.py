# preln bootstrap: makes `import preln` work wherever this notebook runs (the book's "Running" page).
# In a checkout with `make lab`, or where preln is installed, it does nothing. Else it loads the
# checkout this notebook sits in (Binder, a clone), or pip-installs $PRELN_INSTALL if set, else
# the release below (Colab, a lone notebook). Kept identical in every notebook by
# scripts/sync_bootstrap.py; tests/test_bootstrap.py checks it.
import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys

try:
    import preln
except ModuleNotFoundError as _e:
    if _e.name != "preln":          # a missing dependency of preln is a real error: show it
        raise
# Installed means the package itself: a folder left by `pip uninstall preln` (numba's cache files)
# imports as an empty namespace package, without __file__ or __version__.
if getattr(sys.modules.get("preln"), "__version__", None) is None:
    sys.modules.pop("preln", None)
    _here = pathlib.Path.cwd().resolve()
    _root = next((p for p in (_here, *_here.parents)
                  if (p / "preln" / "__init__.py").is_file() and (p / "pyproject.toml").is_file()), None)
    if _root is not None:
        print(f"preln: using the checkout at {_root}")
        _spec = importlib.util.spec_from_file_location(      # the package by its path: sys.path untouched
            "preln", str(_root / "preln" / "__init__.py"), submodule_search_locations=[str(_root / "preln")])
        sys.modules["preln"] = importlib.util.module_from_spec(_spec)
        try:
            _spec.loader.exec_module(sys.modules["preln"])
        except BaseException:
            del sys.modules["preln"]
            raise
    else:
        _req = os.environ.get("PRELN_INSTALL") or "preln[notebooks] @ git+https://github.com/preln/preln@v0.2.0"
        print(f"preln: not installed here; pip install {_req}")
        _pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", _req], capture_output=True, text=True)
        if _pip.returncode:
            print(_pip.stdout[-1500:] + _pip.stderr[-3000:], file=sys.stderr)   # pip's words, in the notebook
            raise RuntimeError(
                f"preln: pip could not install {_req!r} (offline, or the release is out of reach). Set "
                "PRELN_INSTALL to a pip requirement this machine can install -- a wheel file, the folder of "
                "a clone, an index's package -- e.g. os.environ['PRELN_INSTALL'] = '/path/to/preln.whl', "
                "and run this cell again; or open the notebook inside a clone of the repository.") from None
        importlib.invalidate_caches()
    import preln
    if getattr(preln, "__version__", None) is None:
        raise ImportError(f"preln: `import preln` finds {list(preln.__path__)}, a folder without the "
                          "package (left by `pip uninstall preln`?): delete it and run this cell again")
# (end of the preln bootstrap)
