"""The student's view of ``preln`` while a question is graded: only the modules it may use.

    build_view(dest, ["preln.nn.config", "preln.ops"], without=["preln.ops.dropout"])

writes ``dest/preln/``: copies of the chosen modules (a package brings its submodules), and every
package ``__init__.py`` on the way filtered — its imports of modules left out become stand-ins.
``import preln.anything`` still works in the sandbox (so that a setup cell's imports do not fail),
but a name from a module left out is a stand-in object that raises ``RuntimeError: ... not
available while your notebook is graded`` when it is used; its code is not there. The grader
checks (:func:`leaks`) that no module of a question's view defines one of the references the
question declares with ``no_credit_for``.
"""
import ast
import importlib
import importlib.util
import inspect
import shutil
from pathlib import Path

def _package():
    """The preln the grader imports (its references are computed with it): the repository's in a
    clone with `pip install -e .`, the installed one on a hub."""
    spec = importlib.util.find_spec("preln")
    if spec is None or not spec.origin:
        raise RuntimeError("the grader needs the preln package: pip install -e . in the repository")
    return Path(spec.origin).resolve().parent


PACKAGE = _package()

GRADING_VIEW_MODULE = '''"""Stand-ins for the parts of preln that are withheld while a notebook is graded (generated)."""
import importlib.abc
import importlib.machinery
import sys
import types

MESSAGE = ("{} is not available while your notebook is graded: the grader withholds the package's "
           "implementations of what the questions ask (no credit for calling them)")


class Withheld:
    """A name from a module that is not in this view: using it raises."""

    def __init__(self, name):
        object.__setattr__(self, "_withheld_name", name)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(MESSAGE.format(self._withheld_name))

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        raise RuntimeError(MESSAGE.format(f"{self._withheld_name}.{attr}"))

    def __mro_entries__(self, bases):
        raise RuntimeError(MESSAGE.format(self._withheld_name))

    def __repr__(self):
        return f"<withheld while grading: {self._withheld_name}>"


class WithheldModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        raise RuntimeError(MESSAGE.format(self.__name__))

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Withheld(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = WithheldModule(spec.name)
        module.__path__ = []                 # a package: its submodules are stand-ins too
        return module

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("preln."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def install():
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        # right after the path finder: before any finder of an installed copy of preln
        at = next((i + 1 for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
                  len(sys.meta_path))
        sys.meta_path.insert(at, _Finder())


def withheld(name):
    return Withheld(name)


def withheld_module(name):
    module = WithheldModule(name)
    module.__path__ = []
    return module
'''


def all_modules(package=PACKAGE):
    """{dotted name: file} of every module of the package (a package as its __init__.py)."""
    out = {}
    for f in sorted(Path(package).rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        rel = f.relative_to(Path(package).parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def is_package(name, package=PACKAGE):
    return (Path(package).parent / Path(*name.split(".")) / "__init__.py").is_file()


def resolve(modules, without=(), package=PACKAGE):
    """The set of module names a view holds (packages expanded to their submodules)."""
    known = all_modules(package)
    data = set()
    chosen = set()
    for m in modules:
        if m == "preln.data":
            data.add(m)
            continue
        if m not in known:
            raise ValueError(f"grading_view: no module {m!r} in preln")
        chosen |= {n for n in known if n == m or (is_package(m, package) and n.startswith(m + "."))}
    excluded = set()
    for m in without:
        if m not in known:
            raise ValueError(f"grading_view without=: no module {m!r} in preln")
        excluded |= {n for n in known if n == m or n.startswith(m + ".")}
    chosen -= excluded
    todo = list(chosen)                  # what the chosen modules import comes too (not `without`)
    while todo:
        for dep in imports_of(todo.pop(), package):
            if dep not in chosen and dep not in excluded and dep != "preln":
                chosen.add(dep)
                todo.append(dep)
    chosen.discard("preln")            # the top-level package is always the filtered one
    return chosen | data


def imports_of(name, package=PACKAGE):
    """The preln modules that module ``name`` imports (a package's __init__: what it imports from)."""
    known = all_modules(package)
    pkg = name if is_package(name, package) else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(known[name].read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("preln")):
            target = _target(node, pkg)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("preln.")}
    expanded = set()
    for dep in out:
        if dep in known and is_package(dep, package) and dep != name:
            expanded |= imports_of(dep, package) | {dep}
        elif dep in known:
            expanded.add(dep)
    return expanded


def _target(node, package_name):
    """The absolute module an ImportFrom in package ``package_name``'s __init__ imports from."""
    if node.level == 0:
        return node.module
    base = package_name.split(".")
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def filter_init(source, package_name, available):
    """The source of package ``package_name``'s __init__.py with its imports from modules outside
    ``available`` (the view's modules and generated packages) replaced by stand-ins."""
    known = all_modules()
    tree = ast.parse(source)
    lines = source.split("\n")
    out, last = [], 0
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("preln"))):
            continue
        target = _target(node, package_name)
        kept, stand_ins = [], []
        for alias in node.names:
            bound = alias.asname or alias.name
            sub = f"{target}.{alias.name}"
            if sub in known:                                  # a submodule
                (kept.append(alias) if sub in available
                 else stand_ins.append(f"{bound} = _gv.withheld_module({sub!r})"))
            else:                                             # a name defined in the module
                (kept.append(alias) if target in available
                 else stand_ins.append(f"{bound} = _gv.withheld({sub!r})"))
        if stand_ins:
            text = []
            if kept:
                names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
                text.append(f"from {'.' * node.level}{node.module or ''} import {names}")
            out.append("\n".join(lines[last:node.lineno - 1]))
            out.append("\n".join(text + stand_ins))
            last = node.end_lineno
    out.append("\n".join(lines[last:]))
    body = "\n".join(out)
    if package_name == "preln":
        header = ("from . import _grading_view as _gv  # generated: a filtered view of preln (grading)\n"
                  "_gv.install()")
    else:
        header = "from preln import _grading_view as _gv  # generated: a filtered view of preln (grading)"
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
            and isinstance(first.value.value, str):                 # keep the docstring first
        head = lines[:first.end_lineno]
        rest = body.split("\n")[first.end_lineno:]
        return "\n".join(head + [header] + rest)
    return header + "\n" + body


def build_view(dest, modules, without=(), package=PACKAGE):
    """Write the view into ``dest`` (``dest/preln/...``); return ``dest``."""
    dest = Path(dest)
    chosen = resolve(modules, without, package)
    root = dest / "preln"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "_grading_view.py").write_text(GRADING_VIEW_MODULE)
    known = all_modules(package)
    packages = {"preln"} | {n for n in chosen if n in known and is_package(n, package)}
    for n in list(chosen):                       # every package on the way to a chosen module
        parts = n.split(".")
        for i in range(2, len(parts)):
            packages.add(".".join(parts[:i]))
    available = chosen | packages
    for name in sorted(packages):
        src = known[name].read_text()
        path = root.parent / Path(*name.split(".")) / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(filter_init(src, name, available))
    for name in sorted(chosen):
        if name == "preln.data":
            shutil.copytree(Path(package) / "data", root / "data")
            continue
        if name in packages:
            continue
        target = root.parent / Path(*name.split(".")).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(known[name], target)                # copy2: numba's cache keys on the mtime
    return dest


def defining_files(reference):
    """The source files that define ``reference`` ("preln.ops.softmax", "preln.TransformerBlock.backward"),
    found by importing it in the grader's process (the full package)."""
    parts = reference.split(".")
    obj, mod_name = None, None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            mod_name = ".".join(parts[:i])
            rest = parts[i:]
            break
        except ImportError:
            continue
    if obj is None:
        raise ValueError(f"no_credit_for: {reference!r} does not import")
    files = set()
    for attr in rest:
        if not hasattr(obj, attr):
            raise ValueError(f"no_credit_for: {reference!r}: {mod_name} has no {attr!r}")
        obj = getattr(obj, attr)
    target = inspect.unwrap(obj) if callable(obj) else obj
    try:
        files.add(Path(inspect.getsourcefile(target)).resolve())
    except TypeError:                     # a constant: defined in the module that holds it
        module = importlib.import_module(mod_name)
        files.add(Path(module.__file__).resolve())
    return files


def leaks(chosen, references, package=PACKAGE):
    """References (import paths) whose defining source file is in the view ``chosen``."""
    known = all_modules(package)
    in_view = {known[n].resolve() for n in chosen if n in known}
    return sorted(r for r in references if defining_files(r) & in_view)
