"""The hidden checks of the course's graded assignments (``assignments/``, nbgrader).

A question's tests cell ends with a hidden region (``### BEGIN HIDDEN TESTS``) that the grader
runs *outside* the student's kernel, with the full package. It reads like a test::

    from preln.course import check, close, no_credit_for
    from preln import ops as ref

    no_credit_for("preln.ops.layer_norm_forward")          # not importable while it is graded
    rng = np.random.default_rng(1001)
    for shape in [(5, 5), (2, 3, 7)]:
        x = rng.standard_normal(shape)
        g, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
        want = ref.layer_norm_forward(x, g, b)[0]
        check(f"a random {shape} float64 input", layer_norm_forward(x, g, b),
              close(want, rtol=TOL, what="y"))

When the grader runs it, ``layer_norm_forward`` is a stand-in: calling it records the call (its
arguments, copied as data), and :func:`check` records the expectations. The calls are then made
in the student's sandboxed kernel on these inputs, the results come back as data (arrays, numbers,
strings, containers; never objects), and the expectations are evaluated here, in the grader's
process, where the student's code cannot reach them. In the instructor's own kernel (the source
notebook run top to bottom) ``layer_norm_forward`` is the real function and :func:`check` evaluates
at once, raising AssertionError with the message a student would get.

Expectations: :class:`close` (named float tolerances), :class:`equal` (exact: integers, booleans,
strings, and floats where the question says "bit for bit"), :class:`raises`, :class:`satisfies`
(a predicate of the returned value), :class:`unchanged` and :class:`arg_after` (the arguments after
the call; need :func:`call`). Every failure message names the input (``what`` of :func:`check`)
and the property checked, never the expected value. Conventions: assignments/CONVENTIONS.md.

This module imports nothing but the standard library and numpy: the grader's sandbox runs the
recorded calls under :func:`running` from a copy of it (preln/grade/autograde.py, LIB_FILES).
"""
from __future__ import annotations

import contextlib
import copy
import math
import numbers
import sys
import tracemalloc
import warnings

import numpy as np

__all__ = ["check", "call", "call_strict", "call_within", "close", "equal", "raises", "satisfies", "unchanged",
           "arg_after", "returns", "code", "no_credit_for", "grading_view", "requirement", "in_place_of",
           "diagnose", "Outcome", "Call", "Expectation"]

#: the grader installs its collector here while it runs a hidden region (preln/grade/checks.py)
_PLAN = None
#: in the instructor's kernel: the requirement the checks that follow belong to (for the message)
_REQUIREMENT = None


@contextlib.contextmanager
def collecting(collector):
    """While the block runs, the checks and calls of this module go to ``collector`` (the grader's
    plan of a hidden region, preln/grade/checks.py) instead of running; the previous one after."""
    global _PLAN
    previous, _PLAN = _PLAN, collector
    try:
        yield
    finally:
        _PLAN = previous


# ---- what a call produced --------------------------------------------------------------------
class Outcome:
    """What one call of a student's function produced.

    kind: "value" (returned ``value``), "raised" (``exc_type`` and ``message``), "missing" (no such
    function in the notebook), "timeout", "died" (the kernel died during the call), "skipped" (not
    run), "unsupported" (returned an object that is not data: ``message`` names its type).
    ``args_before``/``args_after``: (args, kwargs) before and after the call, when kept.
    Set by the grader for the arguments an :class:`unchanged` judges (handed to the answer
    read-only): ``frozen_after`` ({argument: value} re-read from the grader's own files after the
    run), ``written`` (the arguments the answer tried to write in place) and ``arg_names`` (the
    function's parameter names, for the message).
    """

    def __init__(self, kind, value=None, exc_type=None, message="", args_before=None, args_after=None):
        self.kind, self.value, self.exc_type, self.message = kind, value, exc_type, message
        self.args_before, self.args_after = args_before, args_after
        self.frozen_after, self.written, self.arg_names = None, [], None

    def __repr__(self):
        return f"Outcome({self.kind}, {self.exc_type or ''}{self.message[:40]!r})"

    def problem(self):
        """None if the call returned a value, else a sentence saying what happened instead."""
        if self.kind == "value":
            return None
        return {
            "raised": lambda: f"your function raised {self.exc_type}: {self.message}".rstrip(": "),
            "missing": lambda: f"the notebook defines no function `{self.message}` (do not rename it)",
            "timeout": lambda: f"the call did not return within the time limit ({self.message})",
            "died": lambda: "the kernel died during the call (os._exit, a crash, or the memory cap)",
            "skipped": lambda: f"not run ({self.message})",
            "unsupported": lambda: f"it returned {self.message}, which is not data (arrays, numbers, "
                                   "strings, None, tuples, lists, dicts)",
        }.get(self.kind, lambda: f"no result ({self.kind}: {self.message})")()


class Call:
    """A recorded call of a student's function (grader side). Made by the grader's stand-ins."""

    def __init__(self, fn, args, kwargs, keep_args=False, errstate=None):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.keep_args, self.errstate = keep_args, errstate


def _is_stand_in(fn):
    return getattr(fn, "_preln_answer", False) is True


def call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` as a check's subject, keeping the arguments as they are after the
    call (for :class:`unchanged` and :class:`arg_after`) and a raised exception (for :class:`raises`)."""
    return _call(fn, args, kwargs, errstate=None)


#: call_strict's numpy error state: overflow, invalid results and division by zero raise
STRICT_FP = {"over": "raise", "invalid": "raise", "divide": "raise"}


def call_strict(fn, *args, **kwargs):
    """Like :func:`call`, with numpy's floating-point errors raised (overflow, invalid, divide by
    zero; underflow stays silent): an answer that overflows internally raises FloatingPointError."""
    return _call(fn, args, kwargs, errstate=dict(STRICT_FP))


def call_within(limits, fn, *args, **kwargs):
    """Like :func:`call`, within ``limits``, a dict of counts (not clocks: the same on a busy
    machine as on a quiet one): ``"lines"``, the lines of Python the call may run (numpy's own
    Python code included; a Python loop over the data exceeds it), and ``"bytes"``, the peak of the
    memory it may allocate (tracemalloc, which sees numpy's arrays). Beyond, the call raises
    :class:`LimitExceeded`, whose message says which and by how much."""
    if not isinstance(limits, dict) or not limits or set(limits) - {"lines", "bytes"} or not all(
            isinstance(v, int) and v > 0 for v in limits.values()):
        raise TypeError(f"limits: expected a dict of positive ints under 'lines' and/or 'bytes'; got {limits!r}")
    return _call(fn, args, kwargs, errstate=dict(limits))


class LimitExceeded(Exception):
    """Raised in a call of :func:`call_within` that goes beyond one of its limits."""


@contextlib.contextmanager
def running(options):
    """The state a recorded call runs in: ``options`` (None, or a call's ``errstate``) holds numpy's
    error state (:func:`call_strict`) and the limits of :func:`call_within`. Used here, by the
    grader's in-process runs (preln/grade/checks.py) and in its sandbox (sandbox_lib/grader_capture.py)."""
    options = dict(options or {})
    lines, nbytes = options.pop("lines", None), options.pop("bytes", None)
    with np.errstate(**options) if options else contextlib.nullcontext(), \
            _line_budget(lines), _memory_budget(nbytes):
        yield


@contextlib.contextmanager
def _line_budget(budget):
    if budget is None:
        yield
        return
    count = 0
    message = (f"it ran more than {budget} lines of Python on this input: a loop in Python over the "
               "data (vectorise it with numpy)")

    def trace(frame, event, arg):
        nonlocal count
        count += event == "line"
        if count > budget:
            raise LimitExceeded(message)               # in the answer's frame; the tracer stops
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
        counted = sys.gettrace() is trace              # else the answer turned the count off
    finally:
        sys.settrace(previous)
    if count > budget or not counted:                  # an answer that caught it is over all the same
        raise LimitExceeded(message)


@contextlib.contextmanager
def _memory_budget(budget):
    if budget is None:
        yield
        return
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    if peak > budget:
        raise LimitExceeded(f"its arrays took {peak:,} bytes at their peak on this input, more than "
                            f"the {budget:,} allowed")


def _call(fn, args, kwargs, errstate):
    if _is_stand_in(fn):
        return fn.record(args, kwargs, keep_args=True, errstate=errstate)
    if not callable(fn):
        raise TypeError(f"fn: expected the function to call; got {type(fn).__name__}")
    before = copy.deepcopy((args, kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with running(errstate):
                value = fn(*args, **kwargs)
        except Exception as e:                              # noqa: BLE001: the outcome of the call
            return Outcome("raised", exc_type=type(e).__name__, message=_first_line(e),
                           args_before=before, args_after=(args, kwargs))
    return Outcome("value", value, args_before=before, args_after=(args, kwargs))


def _first_line(e):
    text = str(e).strip().split("\n")[0]
    return text[:200]


# ---- the check -------------------------------------------------------------------------------
def check(what, subject, *expectations):
    """One hidden check: ``subject`` (a call of the student's function) must meet every expectation.

    - what: the input, as the student reads it in a failure message ("a (2, 3) float16 input
      with a fully masked row") — never the expected value.
    - subject: ``answer(...)`` or ``call(answer, ...)``.
    - expectations: :class:`close`, :class:`equal`, :class:`raises`, ... (at least one).
    """
    if not isinstance(what, str) or not what.strip():
        raise TypeError(f"what: expected a description of the input; got {what!r}")
    if not expectations:
        raise TypeError("check: give at least one expectation (close, equal, raises, satisfies, ...)")
    for e in expectations:
        if not isinstance(e, Expectation):
            raise TypeError(f"expectations: expected close(...), equal(...), ...; got {type(e).__name__}")
    if isinstance(subject, Call):
        if _PLAN is None:
            raise RuntimeError("check: a recorded call outside the grader")
        _PLAN.add(what, subject, expectations)
        return
    outcome = subject if isinstance(subject, Outcome) else Outcome("value", subject)
    failures = verify(outcome, expectations)
    if failures:
        told = f"requirement {_REQUIREMENT!r} — " if _REQUIREMENT else ""
        raise AssertionError(f"{told}hidden check on {what}: " + "; ".join(failures))


def verify(outcome, expectations):
    """The failure messages of ``expectations`` on ``outcome`` (empty when every one holds); a
    failure is followed by the words of every :class:`diagnose` that recognises the result."""
    out = []
    for e in expectations:
        if isinstance(e, diagnose):
            continue
        msg = e.verify(outcome)
        if msg:
            out.append(msg)
    if out and outcome.kind == "value":
        out += [w for e in expectations if isinstance(e, diagnose) for w in [e.recognise(outcome)] if w]
    return out


def requirement(name, points, says, core=False):
    """Start a named requirement of the question: the checks after it (up to the next
    ``requirement``) are its group, and the question scores the points of the groups it passes
    (partial credit; the grader's ``--all-or-nothing`` gives a question its points only when
    every group passes).

    - name: the requirement as the prompt names it ("dtype", "fully masked rows").
    - points: what it is worth; a question's requirements add up to its points.
    - says: the requirement in the prompt's words, shown when it fails ("a row whose keys are
      all masked gives a zero output row").
    - core: the requirement checks the values on ordinary inputs. The other groups earn their
      points only if a core group passes, so a hard-coded shape or a constant cannot collect a
      "shape" or "zeros" group by accident. Without any ``core=True``, the first group is the core.
    """
    global _REQUIREMENT
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"name: expected the requirement's name; got {name!r}")
    if not isinstance(says, str) or not says.strip():
        raise TypeError(f"says: expected the requirement in the prompt's words; got {says!r}")
    if not (isinstance(points, numbers.Real) and points > 0):
        raise ValueError(f"points: expected a number > 0; got {points!r}")
    if _PLAN is None:
        _REQUIREMENT = name
        return
    _PLAN.requirement(name, points, says, bool(core))


def in_place_of(name, reference):
    """While this question is graded, the notebook's function ``name`` (an earlier answer this one
    may call) is ``reference``, a function written with :func:`code`: a bug in the earlier answer
    costs its own question only (no cascade). No effect in the instructor's kernel, where ``name``
    is the solution already."""
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"name: expected the earlier answer's function name; got {name!r}")
    if not isinstance(getattr(reference, "_preln_source", None), tuple):
        raise TypeError("reference: expected a function written as code('lambda ...'); "
                        f"got {type(reference).__name__}")
    if _PLAN is not None:
        _PLAN.in_place_of(name, reference)


def code(text, **env):
    """A function written as source text, for an answer that takes a function as input, e.g.
    ``code("lambda v: not np.isfinite(np.exp(v)).all()")``; ``env`` binds extra names (data).
    The grader sends the text into the sandbox, where it is rebuilt with ``np``, ``math`` and
    ``ml_dtypes`` in scope; here it is that function."""
    if not isinstance(text, str) or not text.strip().startswith("lambda"):
        raise TypeError(f"text: expected the source of a lambda; got {text!r}")
    namespace = {"np": np, "math": math, **env}
    try:
        import ml_dtypes
        namespace["ml_dtypes"] = ml_dtypes
    except ImportError:                                      # pragma: no cover (a dependency)
        pass
    fn = eval(text, namespace)                               # noqa: S307: the instructor's own code
    fn._preln_source = (text, dict(env))
    return fn


def no_credit_for(*references):
    """Declare the package's implementations of what the question asks (import paths such as
    ``"preln.ops.softmax"`` or ``"preln.TransformerBlock.backward"``). While the question is graded
    they are not importable in the student's sandbox (their modules are left out of its view of
    the package), and an answer whose code names one of them gets no credit. No effect when the
    source notebook runs in the instructor's kernel."""
    for r in references:
        if not isinstance(r, str) or not r.startswith("preln."):
            raise TypeError(f"references: expected import paths such as 'preln.ops.softmax'; got {r!r}")
    if _PLAN is not None:
        _PLAN.no_credit_for(references)


def grading_view(*modules, without=()):
    """The modules of ``preln`` the student's code may use while this question is graded (e.g.
    ``grading_view("preln.nn.config", "preln.ops", without=["preln.ops.dropout"])``); a package
    brings its submodules. By default a question sees none: ``import preln...`` works, but every
    name in it is a stand-in that raises when used. Questions with the same view share one run of
    the notebook. No effect in the instructor's kernel."""
    for m in (*modules, *without):
        if not isinstance(m, str) or not (m == "preln" or m.startswith("preln.")):
            raise TypeError(f"modules: expected module names such as 'preln.ops'; got {m!r}")
    if _PLAN is not None:
        _PLAN.grading_view(modules, without)


# ---- expectations ----------------------------------------------------------------------------
class Expectation:
    """The base of every expectation of :func:`check` (close, equal, raises, satisfies, returns,
    unchanged, arg_after): ``verify(outcome)`` returns a failure message, or None when it holds."""

    needs_args = False

    def __init__(self, what, part):
        self.what, self.part = what, part

    def verify(self, outcome):                   # -> failure message or None
        problem = outcome.problem()
        if problem:
            return f"{self.what}: {problem}"
        try:
            value = _get_part(outcome.value, self.part)
        except LookupError as e:
            return f"{self.what}: {e}"
        return self.test(value)

    def test(self, value):
        raise NotImplementedError


def _get_part(value, part):
    if part is None:
        return value
    path = part if isinstance(part, tuple) else (part,)
    for key in path:
        if isinstance(key, int) and isinstance(value, (tuple, list)):
            if not -len(value) <= key < len(value):
                raise LookupError(f"the result has no item [{key}] (it has {len(value)} items)")
            value = value[key]
        elif isinstance(value, dict):
            if key not in value:
                raise LookupError(f"the result has no key {key!r}")
            value = value[key]
        else:
            raise LookupError(f"expected a tuple, list or dict holding item [{key!r}]; got {_kind(value)}")
    return value


def _kind(v):
    if isinstance(v, np.ndarray):
        return f"a {v.dtype} array of shape {v.shape}"
    if isinstance(v, (bool, np.bool_)):
        return "a bool"
    if isinstance(v, np.generic):
        return f"a numpy {v.dtype} scalar"
    if isinstance(v, numbers.Integral):
        return "an int"
    if isinstance(v, numbers.Real):
        return "a float"
    if v is None:
        return "None"
    if isinstance(v, dict):
        return f"a dict with {len(v)} keys"
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)} items"
    return f"a {type(v).__name__}"


def _is_number(v):
    return isinstance(v, (numbers.Number, np.number)) and not isinstance(v, (bool, np.bool_))


# close and equal: the result has the structure of ``expected``, compared leaf by leaf; ``e`` is
# the expectation (its flags, and its ``_values`` for the leaves)
def _walk(e, got, want, name):
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{name}: {_kind(got)}, expected a dict"
        if set(got) != set(want):
            missing, extra = sorted(map(str, set(want) - set(got))), sorted(map(str, set(got) - set(want)))
            return (f"{name}: the keys differ" + (f"; missing {', '.join(missing[:6])}" if missing else "")
                    + (f"; unexpected {', '.join(extra[:6])}" if extra else ""))
        for k in want:
            msg = _walk(e, got[k], want[k], f"{name}[{k!r}]")
            if msg:
                return msg
        return None
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return f"{name}: {_kind(got)}, expected a {type(want).__name__} of {len(want)} items"
        if len(got) != len(want):
            return f"{name}: {len(got)} items, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            msg = _walk(e, g, w, f"{name}[{i}]")
            if msg:
                return msg
        return None
    if isinstance(want, np.ndarray):
        return _array(e, got, want, name)
    if want is None:
        return None if got is None else f"{name}: {_kind(got)}, expected None"
    if isinstance(want, (bool, np.bool_)):
        if not isinstance(got, (bool, np.bool_)):
            return f"{name}: {_kind(got)}, expected a bool"
        return None if bool(got) == bool(want) else f"{name}: the wrong truth value"
    if isinstance(want, str):
        if not isinstance(got, str):
            return f"{name}: {_kind(got)}, expected a string"
        return None if got == want else f"{name}: not the expected string"
    if _is_number(want):
        return _scalar(e, got, want, name)
    raise TypeError(f"expected: cannot compare with a {type(want).__name__}")

def _scalar(e, got, want, name):
    if not e.strict_type and isinstance(got, np.ndarray) and got.shape == ():
        got = got[()]
    if not _is_number(got):
        return f"{name}: {_kind(got)}, expected a number"
    if e.exact and isinstance(want, (numbers.Integral, np.integer)) and e.strict_type \
            and not isinstance(got, (numbers.Integral, np.integer)):
        return f"{name}: {_kind(got)}, expected an integer"
    if e.dtype and isinstance(want, np.generic) and e.strict_type:
        gdt = got.dtype if isinstance(got, np.generic) else None
        if gdt != want.dtype:
            return f"{name}: {_kind(got)}, expected a numpy {want.dtype} scalar"
    return e._values(np.asarray(got), np.asarray(want), name)

def _array(e, got, want, name):
    if not isinstance(got, np.ndarray) or type(got) is not np.ndarray:
        if e.strict_type or not (_is_number(got) or isinstance(got, (np.ndarray, list, tuple, bool, np.bool_))):
            return f"{name}: {_kind(got)}, expected an array"
        try:
            got = np.asarray(got)
        except Exception:                               # noqa: BLE001: a ragged list, say
            return f"{name}: {_kind(got)}, expected an array"
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}" + _shape_words(got.shape, want.shape)
    if e.dtype and got.dtype != want.dtype:
        return (f"{name}: dtype {got.dtype}, expected {want.dtype} (the task asks for that dtype: "
                f"compute in it, or cast the result back)")
    if got.dtype.kind not in "biufc" and not _is_ml_dtype(got.dtype):
        return f"{name}: dtype {got.dtype} is not numeric"
    return e._values(got, want, name)


def _shape_words(got, want):
    """What a shape mismatch usually means, in the task's terms."""
    if len(got) > len(want) and tuple(got[len(got) - len(want):]) == tuple(want):
        return "; it should sum (or reduce) over every leading axis"
    if sorted(got) == sorted(want):
        return "; the axes are in the wrong order"
    return ""


def _is_ml_dtype(dt):
    return dt.kind == "V" and dt.names is None and dt.itemsize in (1, 2) and "float" in str(dt)


def _as_float(a):
    """A numeric array as float64 (complex stays complex; bfloat16 / float8 convert exactly)."""
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64)


class close(Expectation):
    """The result equals ``expected`` within a tolerance: ``|got - want| <= atol + rtol |want|``
    entry by entry (NaN where the reference has NaN, inf of the same sign where it has inf).

    - expected: the reference value: an array, a number, or a tuple/list/dict of them.
    - rtol, atol: the tolerances (pass named constants; say in the prompt what they allow).
    - what: what the result is, for the failure message ("y", "the scale").
    - part: compare only this item of the result (an index, a key, or a tuple of them).
    - dtype: arrays (and numpy scalars) must have the reference's dtype (default True).
    - strict_type: an array must be returned as an ndarray, a number as a number (default True);
      False also accepts array-likes (a 0-d array for a number, a list for an array).
    """

    exact = False

    def test(self, value):
        return _walk(self, value, self.expected, self.what)

    def __init__(self, expected, rtol=1e-7, atol=0.0, what="the result", part=None, dtype=True,
                 strict_type=True):
        Expectation.__init__(self, what, part)
        self.expected, self.dtype, self.strict_type = copy.deepcopy(expected), dtype, strict_type
        if not (rtol >= 0 and atol >= 0):
            raise ValueError(f"rtol, atol: expected tolerances >= 0; got {rtol}, {atol}")
        self.rtol, self.atol = rtol, atol

    def _values(self, got, want, name):
        g, w = _as_float(got), _as_float(want)
        with np.errstate(all="ignore"):
            nan_g, nan_w = np.isnan(g), np.isnan(w)
            if np.any(nan_g != nan_w):
                n = int(np.sum(nan_g & ~nan_w))
                return (f"{name}: NaN in {n} entries where the reference is a number" if n
                        else f"{name}: a number where the reference is NaN")
            inf_w = np.isinf(w)
            if np.any(np.isinf(g) != inf_w) or np.any(g[inf_w] != w[inf_w]):
                return f"{name}: inf/-inf entries differ from the reference's"
            ok = ~(nan_w | inf_w)
            diff = np.abs(g[ok] - w[ok])
            bound = self.atol + self.rtol * np.abs(w[ok])
            bad = diff > bound
            # the error against the reference's scale, not entry by entry: an entry that should be
            # 0 would give a relative difference of 1e+307, true and meaningless to a student
            scale = float(np.max(np.abs(w[ok]))) if np.any(ok) else 0.0
            worst = float(np.max(diff[bad])) if np.any(bad) else 0.0
        if np.any(bad):
            return (f"{name}: {int(np.sum(bad))} of {diff.size} values differ from the reference by more "
                    f"than the tolerance (rtol={self.rtol:g}, atol={self.atol:g}); largest error "
                    f"{worst:.2g}, against values of size up to {scale:.2g}"
                    + (" — wrong in the leading digits, not round-off" if worst > 1e-3 * scale else ""))
        return None


class equal(Expectation):
    """The result equals ``expected`` exactly: integers, booleans, strings, and floats only where the
    question says "bit for bit" (then give ``why``: it is shown with a failure). NaN equals NaN.

    Integers must come back as integers (int or a numpy integer), unless ``strict_type=False``.
    """

    exact = True

    def test(self, value):
        return _walk(self, value, self.expected, self.what)

    def __init__(self, expected, what="the result", part=None, why=None, dtype=True, strict_type=True):
        Expectation.__init__(self, what, part)
        self.expected, self.dtype, self.strict_type = copy.deepcopy(expected), dtype, strict_type
        self.why = why

    def _values(self, got, want, name):
        if got.dtype.kind in "fc" or want.dtype.kind in "fc" or _is_ml_dtype(got.dtype):
            g, w = _as_float(got), _as_float(want)
            same = (g == w) | (np.isnan(g) & np.isnan(w))
        else:
            same = got == want
        if np.all(same):
            return None
        n = int(np.size(same) - np.count_nonzero(same))
        where = f"{n} of {np.size(same)} entries differ" if np.size(same) > 1 else "differs"
        why = f" (bit for bit: {self.why})" if self.why else ""
        return f"{name}: not equal to the reference; {where}{why}"


class raises(Expectation):
    """The call raises ``exc_type`` (an exception class, or a tuple of them). Needs the exception
    to reach the check: use ``call(answer, ...)`` or ``answer(...)`` in the grader (both record it)."""

    def __init__(self, exc_type, what="the call"):
        super().__init__(what, None)
        types = exc_type if isinstance(exc_type, tuple) else (exc_type,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
            raise TypeError(f"exc_type: expected an exception class; got {exc_type!r}")
        self.names = {t.__name__ for t in types}
        self.label = " or ".join(sorted(self.names))

    def verify(self, outcome):
        if outcome.kind == "raised":
            if outcome.exc_type in self.names:
                return None
            return f"{self.what}: expected {self.label}; your function raised {outcome.exc_type}"
        if outcome.kind == "value":
            return f"{self.what}: expected {self.label}; your function returned normally"
        return f"{self.what}: {outcome.problem()}"


class satisfies(Expectation):
    """``predicate(value, *args)`` is true of the result (evaluated by the grader).

    - what: the property, for the failure message ("rows sum to 1").
    - args: extra arguments for the predicate (the inputs it needs; bind them here rather than
      through a loop variable captured by a lambda).
    """

    def __init__(self, predicate, what, *args, part=None):
        super().__init__(what, part)
        if not callable(predicate):
            raise TypeError(f"predicate: expected a function; got {type(predicate).__name__}")
        self.predicate, self.args = predicate, copy.deepcopy(args)

    def test(self, value):
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                ok = bool(self.predicate(value, *self.args))
        except Exception as e:                              # noqa: BLE001: a wrong kind of result
            return f"{self.what}: does not hold (it could not be checked on {_kind(value)}: {type(e).__name__})"
        return None if ok else f"{self.what}: does not hold"


class returns(Expectation):
    """The result (or its ``part``) is an instance of ``types`` (e.g. ``float``, ``(int, np.integer)``)."""

    def __init__(self, types, what="the result", part=None):
        super().__init__(what, part)
        self.types = types if isinstance(types, tuple) else (types,)

    def test(self, value):
        if isinstance(value, self.types) and not (bool not in self.types and isinstance(value, bool)):
            return None
        names = " or ".join(t.__name__ for t in self.types)
        return f"{self.what}: {_kind(value)}, expected {names}"


class diagnose(satisfies):
    """Words for a failure that a known mistake explains: when another expectation of the same
    check fails and ``predicate(result, *args)`` holds, ``text`` is added to the feedback (e.g.
    "yours sum to 1 (uniform weights): a finite fill such as -1e9 does this"). Never fails by
    itself; evaluated in the grader."""

    def verify(self, outcome):
        return None

    def recognise(self, outcome):
        """``what`` if the predicate holds of the result, else None."""
        try:
            value = _get_part(outcome.value, self.part)
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                return self.what if bool(self.predicate(value, *self.args)) else None
        except Exception:                                   # noqa: BLE001: another kind of result
            return None


def _arg(args_kwargs, which):
    args, kwargs = args_kwargs
    if isinstance(which, int):
        return args[which]
    return kwargs[which]


def _name(outcome, w):
    names = outcome.arg_names or ()
    if isinstance(w, int):
        return f"`{names[w]}`" if w < len(names) else f"{w}"
    return f"`{w}`"


def _label(outcome, w):
    return f"argument {_name(outcome, w)}"


_ABSENT = object()


class unchanged(Expectation):
    """The call leaves these arguments as they were (positions, or keyword names): the question asks
    for new arrays, not updates in place. Needs :func:`call`. In the grader these arguments reach
    the answer as read-only arrays (mappings of the grader's files): a write in place raises, and
    what is compared is the files' bytes, re-read by the grader after the run."""

    needs_args = True

    def __init__(self, *which, what="the inputs"):
        super().__init__(what, None)
        if not which:
            raise TypeError("unchanged: name the arguments (positions or keywords)")
        self.which = which

    def verify(self, outcome):
        written = [_name(outcome, w) for w in self.which if w in outcome.written]
        if written:
            told = f"argument {written[0]} was" if len(written) == 1 else f"arguments {', '.join(written)} were"
            return f"{self.what}: {told} written in place; the task asks for new arrays"
        if outcome.args_before is None or outcome.args_after is None:
            if outcome.kind not in ("value", "raised"):
                return f"{self.what}: {outcome.problem()}"
            return f"{self.what}: the arguments were not kept (use call(answer, ...))"
        frozen = outcome.frozen_after or {}
        for w in self.which:
            before = _arg(outcome.args_before, w)
            # the grader's re-read files (the arrays), and what the kernel sent back (a container's
            # items replaced, say): either differing fails the check
            try:
                sent = _arg(outcome.args_after, w)
            except (IndexError, KeyError):
                sent = None                                  # a malformed reply: not the argument
            for after in (frozen.get(w, _ABSENT), sent):
                if after is not _ABSENT and not _same(before, after):
                    return f"{self.what}: your function changed {_label(outcome, w)} in place"
        return None


class arg_after(Expectation):
    """An expectation about an argument as it is after the call, e.g. a random generator's next
    draw (``arg_after(2, satisfies(...))``). Needs :func:`call`."""

    needs_args = True

    def __init__(self, which, expectation):
        if not isinstance(expectation, Expectation) or expectation.needs_args:
            raise TypeError("expectation: expected close(...), equal(...) or satisfies(...)")
        super().__init__(expectation.what, None)
        self.which, self.inner = which, expectation

    def verify(self, outcome):
        if outcome.kind not in ("value", "raised"):
            return f"{self.what}: {outcome.problem()}"
        if outcome.args_after is None:
            return f"{self.what}: the arguments were not kept (use call(answer, ...))"
        value = _arg(outcome.args_after, self.which)
        return self.inner.verify(Outcome("value", value))


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:                                       # noqa: BLE001: an odd object
        return a is b
