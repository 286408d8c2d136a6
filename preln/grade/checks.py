"""The grader's side of the hidden checks: plans (what to call) and verdicts (what came back).

    plan = plan_for(source_path)          # run each question's hidden region, here, once
    plan.groups()                         # questions that share a view of preln (one sandbox run each)
    verdicts = evaluate(plan, results, student_nb)

A *plan* is made by executing the instructor's source notebook's setup cell and each tests cell's
hidden region in this process (the full package), with every answer function replaced by a
stand-in (:class:`Answer`) that records its calls: the inputs are copied as data at once. The
calls go to the student's sandboxed kernel (sandbox.py, sandbox_lib/grader_capture.py), or to an
in-process namespace for the mutation runs (:func:`run_in_process`); either way the results come
back in the same documents, are decoded strictly (wire.py) and judged by the expectations
(preln.course) here. See assignments/CONVENTIONS.md.
"""
import ast
import contextlib
import hashlib
import io
import json
import math
import os
import secrets
import signal
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from . import nbtools
from . import namecheck
from . import views
from . import wire

import preln.course as api


class PlanError(Exception):
    """An assignment's hidden checks could not be prepared (an instructor's error: nothing is graded)."""


class Answer:
    """Stands in for a student's function while a hidden region runs in the grader."""

    _preln_answer = True

    def __init__(self, name, recorder):
        self.__name__ = name
        self._recorder = recorder

    def __call__(self, *args, **kwargs):
        return self.record(args, kwargs, keep_args=False, errstate=None)

    def record(self, args, kwargs, keep_args, errstate):
        """The call, recorded for the student's function to run later (what preln.course's calls do)."""
        return self._recorder.record(self.__name__, args, kwargs, keep_args, errstate)

    def __repr__(self):
        return f"<the student's {self.__name__}>"


class QuestionPlan:
    def __init__(self, key, points, answers, tests_index):
        self.key, self.points, self.answers, self.tests_index = key, points, answers, tests_index
        self.calls = []               # {"id", "fn", "input", "keep_args", "errstate"}
        self.checks = []              # (what, call index, expectations)
        self.references = []
        self.modules, self.without = (), ()
        self.batch = wire.Batch(allow_pickle=True)
        self._before = {}
        self.frozen = {}              # call index -> the arguments an unchanged(...) judges
        self.params = {}              # answer name -> its parameters (the source's), for messages
        self.requirements = []        # {"name", "points", "says", "core", "checks": [check index]}
        self.provided = None          # batch index of {earlier answer: reference} (in_place_of)
        self._provided = {}

    # the collector interface of preln.course (installed by preln.course.collecting)
    def record(self, fn, args, kwargs, keep_args, errstate):
        try:
            index = self.batch.add((tuple(args), dict(kwargs)))
        except wire.WireError as e:
            raise PlanError(f"{self.key}: the inputs of a call of {fn} cannot be sent: {e}") from None
        call = api.Call(fn, args, kwargs, keep_args=keep_args, errstate=errstate)
        call.index = len(self.calls)
        self.calls.append({"id": f"{self.key}.{call.index}", "fn": fn, "input": index,
                           "keep_args": bool(keep_args), "errstate": errstate})
        return call

    def add(self, what, call, expectations):
        if any(e.needs_args for e in expectations) and not self.calls[call.index]["keep_args"]:
            raise PlanError(f"{self.key}: check {what!r}: unchanged/arg_after need call(answer, ...)")
        for e in expectations:
            if isinstance(e, api.unchanged):
                self.frozen.setdefault(call.index, [])
                self.frozen[call.index] += [w for w in e.which if w not in self.frozen[call.index]]
        if self.requirements:
            self.requirements[-1]["checks"].append(len(self.checks))
        self.checks.append((what, call.index, expectations))

    def requirement(self, name, points, says, core):
        if self.checks and not self.requirements:
            raise PlanError(f"{self.key}: requirement {name!r} follows checks that belong to none; "
                            "declare the first requirement before the first check")
        if any(r["name"] == name for r in self.requirements):
            raise PlanError(f"{self.key}: two requirements named {name!r}")
        self.requirements.append({"name": name, "points": points, "says": says, "core": core, "checks": []})

    @property
    def replaced(self):
        """The earlier answers this question's calls see the grader's versions of."""
        return list(self._provided)

    def in_place_of(self, name, reference):
        self._provided[name] = reference
        try:
            self.provided = self.batch.add(dict(self._provided))
        except wire.WireError as e:
            raise PlanError(f"{self.key}: in_place_of({name!r}): {e}") from None

    def finish(self):
        """Check the requirement groups against the question's points (PlanError if they do not fit)."""
        if not self.requirements:
            return
        empty = [r["name"] for r in self.requirements if not r["checks"]]
        if empty:
            raise PlanError(f"{self.key}: requirement(s) without a check: {', '.join(empty)}")
        total = sum(r["points"] for r in self.requirements)
        if not math.isclose(total, self.points):
            raise PlanError(f"{self.key}: the requirements' points add up to {total:g}; the tests cell "
                            f"has {self.points:g}")
        if not any(r["core"] for r in self.requirements):
            self.requirements[0]["core"] = True

    def no_credit_for(self, references):
        self.references += list(references)

    def grading_view(self, modules, without):
        self.modules, self.without = tuple(modules), tuple(without)

    @property
    def view_key(self):
        return (tuple(sorted(self.modules)), tuple(sorted(self.without)))

    def inputs_document(self, call_timeout, budget, frozen_dir=None):
        """The calls' document for the sandbox. With ``frozen_dir``: every array of an argument an
        ``unchanged`` check judges is written there as a file of its raw bytes, named by a random
        token, and the call lists the tokens; the sandbox hands the answer read-only mappings of
        them, and the grader re-reads the files after the run (:func:`read_frozen`)."""
        calls = self.calls
        if frozen_dir is not None and self.frozen:
            calls = []
            for ci, call in enumerate(self.calls):
                call = dict(call)
                if ci in self.frozen:
                    call["frozen"] = [{"arg": w, "files": [self._freeze(a, frozen_dir) for a in arrays]}
                                      for w, arrays in self._frozen_arrays(ci)]
                calls.append(call)
        doc = {"inputs": self.batch.document(), "calls": calls, "call_timeout": call_timeout,
               "budget": budget}
        if self.provided is not None:
            doc["provide"] = self.provided
        return doc

    def _frozen_arrays(self, ci):
        """[(argument, its arrays in map_arrays' order)] of the call's judged arguments."""
        args, kwargs = self.args_before(ci)
        out = []
        for w in self.frozen[ci]:
            if (w < len(args)) if isinstance(w, int) else (w in kwargs):
                arrays = []
                wire.map_arrays(args[w] if isinstance(w, int) else kwargs[w], lambda a: arrays.append(a) or a)
                out.append((w, arrays))
        return out

    @staticmethod
    def _freeze(a, frozen_dir):
        token = secrets.token_hex(16)
        Path(frozen_dir).mkdir(exist_ok=True)
        (Path(frozen_dir) / token).write_bytes(np.ascontiguousarray(a).tobytes())
        return token

    def read_frozen(self, document, frozen_dir):
        """{call id: {argument: its value rebuilt from the files' bytes, as they are after the run}}
        — what ``unchanged`` judges, read here, outside the student's interpreter."""
        out = {}
        for ci, call in enumerate(document["calls"]):
            if not call.get("frozen"):
                continue
            args, kwargs = self.args_before(ci)
            got = {}
            for item in call["frozen"]:
                w, files = item["arg"], iter(item["files"])

                def reread(a):
                    path = Path(frozen_dir) / next(files)
                    data = path.read_bytes() if a.nbytes else b""
                    return np.frombuffer(data, dtype=a.dtype, count=a.size).reshape(a.shape).copy()
                try:
                    got[w] = wire.map_arrays(args[w] if isinstance(w, int) else kwargs[w], reread)
                except (OSError, ValueError):
                    got[w] = wire.Unsupported("a read-only input the grader could not read back")
            out[call["id"]] = got
        return out

    def args_before(self, call_index):
        """The inputs of a call as the grader made them (for unchanged / arg_after)."""
        if call_index not in self._before:
            tree = self.batch.trees[self.calls[call_index]["input"]]
            self._before[call_index] = wire.decode(tree, self.batch.blobs, trusted=False)
        return self._before[call_index]


class Plan:
    def __init__(self, name, source_path, nb):
        self.name, self.source_path, self.nb = name, Path(source_path), nb
        self.questions = {}
        self.answer_names = []

    def groups(self):
        """[(view key, [question keys])], in question order; the first group holds the first question."""
        out = {}
        for key, q in self.questions.items():
            out.setdefault(q.view_key, []).append(key)
        return list(out.items())

    @property
    def n_checks(self):
        return sum(len(q.checks) for q in self.questions.values())


def answer_names(source):
    """Top-level function names defined in an answer cell's source."""
    return list(answer_params(source))


def answer_params(source):
    """{name: [positional parameter names]} of the top-level functions of an answer cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {n.name: [a.arg for a in n.args.posonlyargs + n.args.args]
            for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def hidden_region(source):
    return "\n".join(t for _, t in nbtools.regions(source, nbtools.BEGIN_HIDDEN, nbtools.END_HIDDEN))


def _quiet():
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


#: the instructor's course secret (book/running.md): re-seeds every random hidden input
SECRET_ENV = "PRELN_COURSE_SECRET"


def course_secret():
    """The course secret from the environment, or None (the published seeds)."""
    return os.environ.get(SECRET_ENV) or None


def read_secret(path):
    """A course secret from a file (its first line); ValueError if it is missing or empty."""
    try:
        text = Path(path).read_text().strip().split("\n")[0].strip()
    except OSError as e:
        raise ValueError(f"secret-file: cannot read {path}: {e.strerror}") from None
    if not text:
        raise ValueError(f"secret-file: expected a non-empty first line in {path}; got an empty file")
    return text


@contextlib.contextmanager
def _reseeded(secret):
    """While the hidden regions run: every ``np.random.default_rng(int or ints)`` mixes in the
    secret, so the hidden inputs (and the references, computed from the same generators here)
    differ from the published ones. Only the grader's process is patched; the student's kernel
    receives the inputs (generators included) as data, so honest answers score the same."""
    if not secret:
        yield
        return
    words = np.frombuffer(hashlib.sha256(secret.encode()).digest(), dtype=np.uint32).tolist()
    original = np.random.default_rng

    def default_rng(seed=None):
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
            seed = np.random.SeedSequence([*words, int(seed)])
        elif (isinstance(seed, (list, tuple)) and seed
              and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in seed)):
            seed = np.random.SeedSequence([*words, len(seed), *map(int, seed)])
        return original(seed)

    np.random.default_rng = default_rng
    try:
        yield
    finally:
        np.random.default_rng = original


def build_plan(source_path, secret=None):
    """Execute the source notebook's setup cell and hidden regions here; return the Plan.
    ``secret``: the course secret (re-seeds the hidden inputs; None: the published seeds)."""
    source_path = Path(source_path)
    nb = nbtools.read(source_path)
    plan = Plan(source_path.stem, source_path, nb)
    setup = next((c for c in nb.cells if nbtools.grade_id(c) == "setup"), None)
    if setup is None:
        raise PlanError(f"{source_path}: no setup cell (grade_id 'setup')")
    per_question = {}
    params = {}
    for q in nbtools.questions(nb):
        for i in q.answers:
            params.update(answer_params(nb.cells[i].source))
        names = [n for i in q.answers for n in answer_names(nb.cells[i].source)]
        per_question[q.key] = (q, names)
        plan.answer_names += [n for n in names if n not in plan.answer_names]
    base = {"__name__": "__grader__"}
    cwd = os.getcwd()
    try:
        os.chdir(source_path.parent)
        with _quiet():
            exec(compile(setup.source, f"<{plan.name} setup>", "exec"), base)     # noqa: S102: instructor's
    except Exception as e:                                   # noqa: BLE001
        raise PlanError(f"{plan.name}: the setup cell fails in the grader: {type(e).__name__}: {e}") from e
    finally:
        os.chdir(cwd)
    for key, (q, names) in per_question.items():
        qp = QuestionPlan(key, q.points, names, q.tests)
        qp.params = params
        hidden = hidden_region(nb.cells[q.tests].source)
        ns = dict(base)
        for n in plan.answer_names:
            ns[n] = Answer(n, qp)
        try:
            with api.collecting(qp), _quiet(), _reseeded(secret):
                exec(compile(hidden, f"<{plan.name} {key} hidden checks>", "exec"), ns)   # noqa: S102
        except PlanError:
            raise
        except Exception as e:                               # noqa: BLE001
            tb = traceback.format_exc(limit=-3)
            raise PlanError(f"{plan.name} {key}: the hidden checks fail in the grader: {type(e).__name__}: "
                            f"{e}\n{tb}") from e
        if not qp.checks:
            raise PlanError(f"{plan.name} {key}: the hidden region records no check(...)")
        qp.finish()
        chosen = views.resolve(qp.modules, qp.without)
        leaked = views.leaks(chosen, qp.references)
        if leaked:
            raise PlanError(f"{plan.name} {key}: its grading view holds what no_credit_for withholds: "
                            f"{', '.join(leaked)} (leave their modules out with grading_view(without=...))")
        plan.questions[key] = qp
    return plan


_PLANS = {}


def plan_for(source_path, secret=None):
    """The plan of a source notebook, cached by path, modification time and secret (the grader
    computes the references once per assignment, not once per student). ``secret`` defaults to
    the course secret of the environment (PRELN_COURSE_SECRET)."""
    p = Path(source_path).resolve()
    secret = course_secret() if secret is None else secret
    key = (p, p.stat().st_mtime_ns, hashlib.sha256(secret.encode()).hexdigest() if secret else None)
    if key not in _PLANS:
        _PLANS[key] = build_plan(p, secret)
    return _PLANS[key]


# ---- results -> outcomes -> verdicts ---------------------------------------------------------
_NO_RESULT = {
    "died": ("died", ""),
    "timeout": ("timeout", "the question's time limit"),
    "not_run": ("skipped", "the kernel could not be started again after earlier failures"),
}


def _text(v, limit=300):
    return str(v)[:limit] if isinstance(v, (str, int, float)) else ""


def outcome_from(doc, qp, call_index, q_status, frozen=None):
    """An Outcome from the sandbox's document of one call (untrusted: decoded strictly). ``frozen``:
    the read-only arguments as the grader re-read them from its own files after the run."""
    if not isinstance(doc, dict):
        status = q_status if isinstance(q_status, str) else "not_run"
        if status.startswith("capture_error"):
            return api.Outcome("skipped", message="the grader's capture failed in your kernel: "
                                                  + _text(status.partition(":")[2], 200))
        kind, message = _NO_RESULT.get(status, ("skipped", f"no result ({_text(status, 80)})"))
        return api.Outcome(kind, message=message)
    kind = doc.get("kind")
    if kind == "value":
        try:
            value = wire.decode(*wire.loads(doc.get("value") or ""), trusted=True)
        except wire.WireError as e:
            return api.Outcome("unsupported", message=f"data the grader could not read ({e})")
        if isinstance(value, wire.Unsupported):
            return api.Outcome("unsupported", message=value.type_name)
        out = api.Outcome("value", value)
    elif kind == "raised":
        name = _text(doc.get("exc_type"), 80)
        out = api.Outcome("raised", exc_type=name if name.replace(".", "").replace("_", "").isalnum() else "an exception",
                          message=_text(doc.get("message"), 200))
    elif kind in ("missing", "timeout", "skipped", "unsupported"):
        out = api.Outcome(kind, message=_text(doc.get("message"), 200))
    else:
        out = api.Outcome("unsupported", message="a malformed result")
    call = qp.calls[call_index]
    if call["keep_args"] and out.kind in ("value", "raised"):
        out.args_before = qp.args_before(call_index)
        try:
            after = wire.decode(*wire.loads(doc.get("args_after") or ""), trusted=True)
            if not (isinstance(after, tuple) and len(after) == 2 and isinstance(after[0], tuple)
                    and isinstance(after[1], dict)):
                raise wire.WireError("malformed arguments")
            out.args_after = after
        except wire.WireError:
            out.args_after = None
        out.arg_names = qp.params.get(call["fn"])
        out.frozen_after = frozen
        judged = qp.frozen.get(call_index, [])
        written = doc.get("written")
        # what the sandbox says was written only names arguments in a failure (it cannot pass one)
        out.written = [w for w in written if w in judged] if isinstance(written, list) else []
    return out


class Verdict:
    """A question's verdict: its checks' failures, per requirement group when the question names
    requirements (``groups``: [{"name", "points", "says", "core", "failures", "n_checks"}])."""

    def __init__(self, key, points, failures, n_checks, name_uses=(), n_failed=None, harness_uses=(),
                 groups=()):
        self.key, self.points, self.failures, self.n_checks = key, points, failures, n_checks
        self.name_uses = list(name_uses)
        self.harness_uses = list(harness_uses)
        # a check can fail several of its expectations (one message each): count checks, not messages
        self.n_failed = len(failures) if n_failed is None else n_failed
        self.groups = list(groups)

    @property
    def passed(self):
        return not self.failures and not self.name_uses and not self.harness_uses

    def _core_ok(self):
        return any(g["core"] and not g["failures"] for g in self.groups)

    def score(self, all_or_nothing=False):
        """The points earned: every group passed, all of them; a failed requirement loses its own
        points only, and the other requirements count only when a core requirement passes (a
        cheat cannot collect one by accident). ``all_or_nothing``: the question's points or 0."""
        if self.passed:
            return self.points
        if all_or_nothing or self.name_uses or self.harness_uses or not self.groups:
            return 0
        if not self._core_ok():
            return 0
        return sum(g["points"] for g in self.groups if not g["failures"])

    def lines(self, limit=4, all_or_nothing=False):
        if self.passed:
            return [f"Hidden checks: all {self.n_checks} passed."]
        out = []
        if self.harness_uses:
            out.append("No credit: the code touches the grader's harness: " + ", ".join(self.harness_uses) + ".")
        if self.name_uses:
            out.append("No credit: the answer calls the package's own implementation of what is asked: "
                       + ", ".join(self.name_uses) + ".")
        if self.failures and not self.groups:
            out.append(f"Hidden checks: {self.n_failed} of {self.n_checks} failed.")
            out += [f"- {f}" for f in self.failures[:limit]]
            if len(self.failures) > limit:
                out.append(f"- ... and {len(self.failures) - limit} more")
        elif self.groups:
            out.append(f"Score: {self.score(all_or_nothing):g} of {self.points:g} points"
                       + (" (all or nothing: every requirement must pass)" if all_or_nothing else "")
                       + (": a core requirement failed, so the others do not count"
                          if not self._core_ok() and not all_or_nothing and not self.name_uses
                          and not self.harness_uses else "."))
            for g in self.groups:
                pts = f"{g['points']:g} point{'s' if g['points'] != 1 else ''}"
                if not g["failures"]:
                    out.append(f"- met: {g['name']} ({pts})")
                    continue
                out.append(f"- NOT MET: {g['name']} ({pts}): {g['says']}")
                out.append(f"    {len(g['failures'])} of {g['n_checks']} checks failed; the first, on "
                           + g["failures"][0])
        return out


def evaluate(plan, results, q_status, student_sources=None, frozen=None):
    """{question key: Verdict}. results: {call id: document}; q_status: {question key: status};
    frozen: {call id: read-only arguments as re-read by the grader} (QuestionPlan.read_frozen)."""
    verdicts = {}
    frozen = frozen or {}
    harness = namecheck.harness_uses(student_sources) if student_sources is not None else []
    for key, qp in plan.questions.items():
        failures = []
        outcomes = {}
        n_failed = 0
        per_check = []
        for what, ci, expectations in qp.checks:
            if ci not in outcomes:
                cid = qp.calls[ci]["id"]
                outcomes[ci] = outcome_from(results.get(cid), qp, ci, q_status.get(key), frozen.get(cid))
            msgs = api.verify(outcomes[ci], expectations)
            n_failed += bool(msgs)
            failures += [f"{what}: {msg}" for msg in msgs]
            per_check.append(f"{what}: {'; '.join(msgs)}" if msgs else None)
        groups = [{"name": r["name"], "points": r["points"], "says": r["says"], "core": r["core"],
                   "n_checks": len(r["checks"]),
                   "failures": [per_check[i] for i in r["checks"] if per_check[i]]} for r in qp.requirements]
        uses = []
        if student_sources is not None and qp.references:
            uses = namecheck.forbidden_uses(student_sources, qp.answers, qp.references,
                                            replaced=set(qp.replaced))
        verdicts[key] = Verdict(key, qp.points, failures, len(qp.checks), uses, n_failed, harness, groups)
    return verdicts


# ---- the same calls, in this process (mutation runs; no sandbox: the instructor's own code) ---
class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_in_process(plan, namespace, keys=None, call_timeout=10.0):
    """Call the answers in ``namespace`` on every recorded input of the questions ``keys``; return
    (results, q_status) in the sandbox's format (values round-tripped through wire.py)."""
    results, status = {}, {}
    for key in keys or list(plan.questions):
        qp = plan.questions[key]
        status[key] = "done"
        with _provided(qp, namespace):
            _run_calls(qp, namespace, results, call_timeout)
    return results, status


@contextlib.contextmanager
def _provided(qp, namespace):
    """The question's in_place_of references in ``namespace`` while its calls run (then restored)."""
    if qp.provided is None:
        yield
        return
    refs = wire.decode(qp.batch.trees[qp.provided], qp.batch.blobs, trusted=False)
    saved = {n: namespace[n] for n in refs if n in namespace}
    namespace.update(refs)
    try:
        yield
    finally:
        for n in refs:
            namespace.pop(n, None)
        namespace.update(saved)


def _run_calls(qp, namespace, results, call_timeout):
    """Make the question's calls in ``namespace``; their documents into ``results``."""
    skip = None
    for i, call in enumerate(qp.calls):
        if skip:
            results[call["id"]] = {"kind": "skipped", "message": skip}
            continue
        fn = namespace.get(call["fn"])
        if not callable(fn):
            results[call["id"]] = {"kind": "missing", "message": call["fn"]}
            continue
        args, kwargs = wire.decode(qp.batch.trees[call["input"]], qp.batch.blobs, trusted=False)
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, call_timeout)
        doc = None
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                with api.running(call["errstate"]):          # numpy's error state, a line budget
                    value = fn(*args, **kwargs)
        except _Timeout:
            doc = {"kind": "timeout", "message": f"{call_timeout:g} s"}
            skip = "an earlier call of this question timed out"
        except Exception as e:                           # noqa: BLE001: the answer's exception
            doc = {"kind": "raised", "exc_type": type(e).__name__, "message": str(e)[:200]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        if doc is None:
            try:
                tree, blobs = wire.encode_result(value)
                doc = {"kind": "value", "value": wire.dumps(tree, blobs)}
            except wire.WireError as e:
                doc = {"kind": "unsupported", "message": str(e)}
        if call["keep_args"]:
            try:
                tree, blobs = wire.encode_result((args, kwargs))
                doc["args_after"] = wire.dumps(tree, blobs)
            except wire.WireError:
                doc["args_after"] = None
        results[call["id"]] = doc


def exec_cells(nb, sources, upto=None):
    """Execute a notebook's code cells (except graded tests cells) in a fresh namespace, here:
    the instructor's own notebook, for the mutation runs. ``sources`` overrides cell sources."""
    ns = {"__name__": "__main__"}
    tests = {q.tests for q in nbtools.questions(nb)}
    with _quiet():
        for i, cell in enumerate(nb.cells[:upto]):
            if cell.cell_type != "code" or i in tests:
                continue
            exec(compile(sources.get(i, cell.source), f"<cell {i}>", "exec"), ns)   # noqa: S102
    return ns

