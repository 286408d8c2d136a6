"""Helpers for the course edition's assignments (``assignments/source/*``, graded with nbgrader).

The hidden tests of an assignment call :func:`assert_does_not_use` so that an answer which merely
calls ``preln``'s own implementation of the function asked for gets no credit:

    assert_does_not_use(layer_norm_forward, ["layer_norm_forward", "layer_norm_backward"])

It reads the names the answer's compiled code refers to (globals, attributes, imports), the same
for every nested function, closure and helper function defined in the notebook that it calls, and
fails if any of them is a forbidden name that does not resolve to the student's own code. It is a
static check of names: a determined student can hide a call (``getattr`` with a computed string,
``eval``); it exists to withhold credit from the obvious shortcut, not to police cheating.
"""
import dis
import inspect
import types

__all__ = ["names_used", "assert_does_not_use"]


def _code_objects(code):  # code -> every code object nested in it (lambdas, inner defs, comprehensions)
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _is_students(obj, home_module):
    """True for a plain function defined where the answer was (the notebook), not in a library."""
    return isinstance(obj, types.FunctionType) and obj.__module__ == home_module


def names_used(fn):
    """Every ``(name, object)`` that ``fn`` (recursively) refers to; object None for an attribute.

    fn: a Python function (or a callable object whose class defines __call__ in the notebook).
    Follows globals, closure cells and default arguments that are functions defined in the same
    module as ``fn`` (for a notebook: ``__main__``); library objects are recorded, not entered.
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a function; got {type(fn).__name__}")
    if not isinstance(fn, types.FunctionType):
        call = getattr(type(fn), "__call__", None)
        if not isinstance(call, types.FunctionType):
            raise TypeError(f"fn: expected a Python function; got {type(fn).__name__} "
                            "(a builtin or library object has no source to inspect)")
        fn = call
    home = fn.__module__
    found, seen, todo = {}, set(), [fn]          # (name, id(obj)) -> (name, obj)
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        env = dict(f.__globals__)
        if f.__closure__:
            env.update({name: cell.cell_contents for name, cell in
                        zip(f.__code__.co_freevars, f.__closure__) if _cell_filled(cell)})
        for default in (f.__defaults__ or ()) + tuple((f.__kwdefaults__ or {}).values()):
            if _is_students(default, home):
                todo.append(default)
        for code in _code_objects(f.__code__):
            for name, is_lookup in _references(code):
                obj = env.get(name) if is_lookup else None   # an attribute is never the student's
                found.setdefault((name, id(obj)), (name, obj))
                if _is_students(obj, home):
                    todo.append(obj)
                elif isinstance(obj, type) and obj.__module__ == home:   # a class in the notebook
                    todo.extend(v for v in vars(obj).values() if isinstance(v, types.FunctionType))
    return list(found.values())


_LOOKUPS = {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF",
            "LOAD_FROM_DICT_OR_GLOBALS"}


def _references(code):  # code -> (name, True for a global/closure lookup, False for an attribute/import)
    for ins in dis.get_instructions(code):
        if ins.opname in _LOOKUPS:
            yield ins.argval, True
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "IMPORT_NAME",
                            "IMPORT_FROM", "STORE_ATTR"):
            yield ins.argval, False


def _cell_filled(cell):
    try:
        cell.cell_contents
    except ValueError:           # an empty closure cell (a name assigned after the inner def)
        return False
    return True


def assert_does_not_use(fn, forbidden):
    """Fail (AssertionError) if ``fn`` refers to any name in ``forbidden`` that is not its own code.

    fn:        the student's answer (a function defined in the notebook).
    forbidden: names of the library functions that implement what the question asks for, e.g.
               ``["softmax", "softmax_forward"]``. A forbidden name is allowed only when it
               resolves to a function defined in the notebook (the student's own ``softmax``).
               Library objects are also caught under another name (``from preln.ops import
               softmax as sm``), by their ``__name__``.
    """
    if isinstance(forbidden, str):
        raise TypeError("forbidden: expected a list of names; got the string "
                        f"{forbidden!r} (write [{forbidden!r}])")
    forbidden = set(forbidden)
    home = fn.__module__ if isinstance(fn, types.FunctionType) else type(fn).__module__
    bad = []
    for name, obj in names_used(fn):
        if _is_students(obj, home):
            continue
        lib_name = getattr(obj, "__name__", None) if obj is not None else None
        if name in forbidden or (lib_name in forbidden and not inspect.ismodule(obj)):
            where = getattr(obj, "__module__", None) or "an attribute or import"
            bad.append(f"{name} ({where})")
    assert not bad, (f"{getattr(fn, '__name__', fn)} must implement this itself; it uses "
                     + ", ".join(sorted(bad)) + ". No credit for calling the library's version.")
