"""The second line of "no credit for calling preln": the names an answer's source code uses.

The first line is structural: while a question is graded, the package's implementation of what
it asks is not in the student's view of preln at all (views.py), so no import trick can reach it.
This check reads the student's source (text, parsed here; nothing is executed) and withholds
credit from an answer that names a reference the question declares with ``no_credit_for`` — by
attribute (``preln.ops.softmax``), import (``from preln.ops import softmax as sm``), a global
bound to one, or a string (``getattr(m, "soft" + "max")``, constant-folded) — in the answer or in
any function, class or global of the notebook it refers to. A forbidden name that is the student's
own (their ``softmax`` function, a ``rotate_half = lambda ...``), or an attribute of a module that
is not preln's (``scipy.special.softmax``, ``np.exp``) is fine: only preln's functions are flagged.
Linear in the cell's size: a cell is tokenised once (IPython syntax, magics and ``!commands``,
becomes ``pass`` line by line; the body of ``%%time``, ``%%capture`` or ``%%writefile`` is read as
the code it runs) and parsed once.
"""
import ast
import functools
import tokenize

MAX_SOURCE = 2_000_000

_SKIP = {tokenize.INDENT, tokenize.DEDENT, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER}
_ESCAPES = {"%", "%%", "!", "!!", "?", "??"}


#: cell magics whose body is Python that IPython runs — in the notebook's namespace (``%%time``,
#: ``%%capture``: an answer defined there is the student's own), or when the file is imported
#: (``%%writefile``): their body is read as the code it is. Any other cell magic's body is not Python
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "writefile"}


def _cell_magic(line):
    """The name of the cell magic ``line`` starts (``%%time -v`` -> "time"), or None."""
    line = line.lstrip()
    return (line[2:].split() or [""])[0] if line.startswith("%%") else None


def _python(source):
    """The cell's source with IPython syntax made Python: the body of a cell magic of
    PYTHON_CELL_MAGICS is read as code (its magic line blank), any other cell magic's cell is empty
    (its body is a string to IPython), each logical line that is a line magic, a shell escape or a
    help request becomes ``pass``, ``x = %magic`` / ``x = !cmd`` becomes ``x = None``. One
    tokenisation (IPython's tolerant tokeniser, grouped by logical line), not IPython's
    transform_cell, which re-tokenises the cell once per magic."""
    try:
        ast.parse(source)
        return source
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    lines = source.splitlines(True)
    start = 0
    while start < len(lines) and _cell_magic(lines[start]) is not None:    # %%capture over %%time ...
        if _cell_magic(lines[start]) not in PYTHON_CELL_MAGICS:
            return ""
        start += 1
    if start:
        body = "".join(lines[start:])
        return "\n" * start + _python(body)
    if not lines:
        return ""
    from IPython.core.inputtransformer2 import make_tokens_by_line
    out = list(lines)
    try:
        logical = make_tokens_by_line(lines)
    except Exception:                                       # noqa: BLE001: leave it as it is
        return source
    for toks in logical:
        toks = [t for t in toks if t.type not in _SKIP and t.string.strip()]
        if not toks:
            continue
        row, last = toks[0].start[0] - 1, toks[-1].end[0] - 1
        if not 0 <= row <= last < len(lines):
            continue
        indent = lines[row][:len(lines[row]) - len(lines[row].lstrip())]
        if toks[0].string in _ESCAPES or toks[-1].string in ("?", "??"):
            new = f"{indent}pass\n"
        elif len(toks) > 2 and toks[1].string == "=" and toks[2].string in _ESCAPES and toks[0].type == tokenize.NAME:
            new = f"{indent}{toks[0].string} = None\n"
        else:
            continue
        out[row] = new
        for r in range(row + 1, last + 1):
            out[r] = "\n"
    return "".join(out)


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


def _imported_from(node, name):
    """The modules an import statement binds ``name`` from ('preln.ops' for ``from preln.ops import
    softmax as name``), or None if the statement does not bind it."""
    if isinstance(node, ast.Import):
        mods = [a.name for a in node.names if (a.asname or a.name.split(".")[0]) == name]
    elif isinstance(node, ast.ImportFrom):
        base = "." * node.level + (node.module or "")
        mods = [f"{base}.{a.name}" for a in node.names if (a.asname or a.name) == name]
    else:
        return None
    return mods or None


def _is_preln(module):
    return module.startswith(".") or module.split(".")[0] == "preln"


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


def forbidden_uses(sources, answers, references, replaced=()):
    """The forbidden names the answers' code uses, as "name (how)" strings (empty: none).

    sources:    the student's code cells (text).
    answers:    the question's function names.
    references: import paths declared with no_credit_for ("preln.ops.softmax",
                "preln.TransformerBlock.backward": its class, TransformerBlock, is what is checked).
    replaced:   earlier answers the grader replaces by its own while the question is graded
                (preln.course.in_place_of): their code does not run then, so it is not read.
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

    def other_module(name, node):
        """True if ``name`` is bound, in ``node`` or at the notebook's top level, only by imports of
        modules that are not preln (numpy, scipy.special, ...): its attributes are not preln's."""
        binds = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and _imported_from(n, name)] + module.bindings.get(name, [])
        mods = [_imported_from(b, name) for b in binds]
        return bool(mods) and all(m is not None and not any(_is_preln(x) for x in m) for m in mods)

    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        local = _local_names(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id not in local:
                if sub.id in module.defs:
                    if sub.id not in replaced:
                        todo.append(module.defs[sub.id])
                    continue
                for b in module.bindings.get(sub.id, []):
                    todo.append(b)
                if sub.id in forbidden and sub.id not in module.bindings:
                    # bound nowhere in the notebook: from a star import, or preln's by another way
                    found.add(f"{sub.id} (a name the notebook does not define)")
            elif isinstance(sub, ast.Attribute) and sub.attr in forbidden:
                root = sub.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if not (isinstance(root, ast.Name) and other_module(root.id, node)):
                    found.add(f"{sub.attr} (an attribute)")
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for a in sub.names:
                    mod = ("." * sub.level + (sub.module or "") + "." + a.name) if isinstance(sub, ast.ImportFrom) else a.name
                    if a.name.split(".")[-1] in forbidden and _is_preln(mod):
                        found.add(f"{a.name.split('.')[-1]} (imported)")
            elif isinstance(sub, (ast.Constant, ast.BinOp, ast.JoinedStr)):
                value = _fold(sub)
                if value in forbidden:
                    found.add(f"{value} (by its name as a string)")
    return sorted(found)


# ---- the grader's harness ----------------------------------------------------------------------
#: what names the grader's in-sandbox harness: its modules, their files and their folder
HARNESS = ("grader_capture", "grader_runner", "/grader/lib")
#: a folded string keeps this many characters at each end (more than the longest of HARNESS), so a
#: name split across a long concatenation is still seen, in time linear in the source
_KEEP = 32


def _squeeze(text):
    return text if len(text) <= 2 * _KEEP else text[:_KEEP] + "\0" + text[-_KEEP:]


def harness_uses(sources):
    """How the student's code names the grader's harness, as "what (how)" strings (empty: it does
    not): a name or attribute containing one of HARNESS (``grader_capture``, the capture cell's
    ``_grader_capture``), an import of it, or a string holding one (``sys.modules["grader_" +
    "capture"]``, its file's path), constant-folded. One parse and one pass per cell."""
    found = set()
    for src in sources or ():
        if not isinstance(src, str) or len(src) > MAX_SOURCE:
            continue
        tree = _parse(src)
        if tree is None:
            continue
        folded = {}
        for node in reversed(list(ast.walk(tree))):          # children before their parents
            text = None
            if isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.alias):
                names = [node.name, node.asname or ""]
            else:
                names = []
            for n in names:
                if any(h in n for h in HARNESS):
                    found.add(f"{n} (a name)")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                left, right = folded.get(id(node.left)), folded.get(id(node.right))
                if left is not None and right is not None:
                    text = left + right
            elif isinstance(node, ast.JoinedStr):
                parts = [folded.get(id(v)) for v in node.values]
                text = "".join(parts) if all(p is not None for p in parts) else None
            if text is not None:
                found |= {f"{h} (in a string)" for h in HARNESS if h in text}
                folded[id(node)] = _squeeze(text)
    return sorted(found)
