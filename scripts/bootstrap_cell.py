# preln bootstrap: makes `import preln` work wherever this notebook runs (the book's "Running" page).
# In a checkout with `make lab`, or where preln is installed, it does nothing. Else it uses the
# checkout this notebook sits in (Binder, a clone), or pip-installs $PRELN_INSTALL if set, else
# the release below (Colab, a lone notebook). Kept identical in every notebook by
# scripts/sync_bootstrap.py; tests/test_bootstrap.py checks it.
import importlib
import os
import pathlib
import subprocess
import sys

try:
    import preln
except ModuleNotFoundError as _e:
    if _e.name != "preln":          # a missing dependency of preln is a real error: show it
        raise
    _here = pathlib.Path.cwd().resolve()
    _root = next((p for p in (_here, *_here.parents)
                  if (p / "preln" / "__init__.py").is_file() and (p / "pyproject.toml").is_file()), None)
    if _root is not None:
        print(f"preln: using the checkout at {_root}")
        sys.path.insert(0, str(_root))
    else:
        _req = os.environ.get("PRELN_INSTALL") or "preln[notebooks] @ git+https://github.com/preln/preln@v0.2.0"
        print(f"preln: not installed here; pip install {_req}")
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", _req])
        importlib.invalidate_caches()
    import preln
