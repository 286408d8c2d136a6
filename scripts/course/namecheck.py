"""The second line of "no credit for calling preln": the names an answer's source code uses.

The first line is structural: while a question is graded, the package's implementation of what
it asks is not in the student's view of preln at all (views.py), so no import trick can reach it.
This check reads the student's source (text, parsed here; nothing is executed) and withholds
credit from an answer that names a reference the question declares with ``no_credit_for`` — by
attribute (``preln.ops.softmax``), import (``from preln.ops import softmax as sm``), a global
bound to one, or a string (``getattr(m, "soft" + "max")``, constant-folded) — in the answer or in
any function, class or global of the notebook it refers to. A forbidden name that is the student's
own function (their ``softmax``) is fine.
"""
import ast
import functools

MAX_SOURCE = 2_000_000


@functools.lru_cache(maxsize=1)
def _manager():
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager()


def _python(source):
    """The cell's source with IPython syntax (magics, !commands) turned into Python."""
    try:
        return _manager().transform_cell(source)
    except Exception:                                       # noqa: BLE001: leave it as it is
        return source


@functools.lru_cache(maxsize=4096)
def _parse(source):
    try:
        return ast.parse(_python(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _fold(node):
    """The value of a string expression made of constants and +, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left), _fold(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
            else:
                return None
        return "".join(parts)
    return None


class _Module:
    def __init__(self, sources):
        self.defs, self.bindings = {}, {}
        for src in sources:
            if not isinstance(src, str) or len(src) > MAX_SOURCE:
                continue
            tree = _parse(src)
            if tree is None:
                continue
            for node in tree.body:
                self._top(node)

    def _top(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.defs[node.name] = node
            self.bindings.pop(node.name, None)
            return
        names = set()
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.For, ast.With, ast.If, ast.Try, ast.While)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self._top(child)
            return
        for n in names:
            self.defs.pop(n, None)
            self.bindings.setdefault(n, []).append(node)


def _local_names(fn):
    out = set()
    args = fn.args
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            out.add(a.arg)
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not fn:
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def forbidden_uses(sources, answers, references):
    """The forbidden names the answers' code uses, as "name (how)" strings (empty: none).

    sources:    the student's code cells (text).
    answers:    the question's function names.
    references: import paths declared with no_credit_for ("preln.ops.softmax",
                "preln.TransformerBlock.backward": its class, TransformerBlock, is what is checked).
    """
    forbidden = set()
    for r in references:
        parts = r.split(".")
        # the object right below the module path: "preln.ops.softmax" -> softmax,
        # "preln.TransformerBlock.backward" -> TransformerBlock
        name = next((p for p in parts[1:] if p[:1].isupper()), parts[-1])
        forbidden.add(name)
    module = _Module(sources)
    found = set()
    seen = set()
    todo = [module.defs[a] for a in answers if a in module.defs]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        local = _local_names(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in local:
                if sub.id in module.defs:
                    todo.append(module.defs[sub.id])
                    continue
                for b in module.bindings.get(sub.id, []):
                    todo.append(b)
                if sub.id in forbidden:
                    found.add(f"{sub.id} (a global that is not the notebook's own function)")
            elif isinstance(sub, ast.Attribute) and sub.attr in forbidden:
                found.add(f"{sub.attr} (an attribute)")
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for a in sub.names:
                    if a.name.split(".")[-1] in forbidden:
                        found.add(f"{a.name.split('.')[-1]} (imported)")
            elif isinstance(sub, (ast.Constant, ast.BinOp, ast.JoinedStr)):
                value = _fold(sub)
                if value in forbidden:
                    found.add(f"{value} (by its name as a string)")
    return sorted(found)
