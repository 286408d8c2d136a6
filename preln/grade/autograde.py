"""Sandboxed autograding, plugged into nbgrader: the preprocessor that replaces its ``Execute``.

assignments/nbgrader_config.py puts :class:`SandboxedExecute` first in
``Autograde.autograde_preprocessors``, so stock ``nbgrader autograde`` (formgrader's Autograde
button included) and ``make grade`` take the same path:

1. the assignment's plan (checks.py): the hidden regions of the *source* notebook run here, in
   the grader's process, and record the calls to make and the expectations to meet;
2. the submission, with every hidden region removed, runs in a bubblewrap sandbox (sandbox.py)
   with the question's view of preln (views.py); the calls are made there, and only their
   results come back, as data;
3. the verdicts are computed here; each graded tests cell's outputs are replaced by its verdict —
   nothing for a pass, an error output listing the failed checks for a fail — so nbgrader's own
   SaveAutoGrades scores the cells from verdicts, not from anything the student's kernel printed
   (a warning on stderr no longer zeroes a correct answer). The other cells get the outputs the
   sandbox recorded, reduced to text and PNG (no HTML or script reaches formgrader).

A submission for which the sandbox produces no result raises :class:`GradingFailed` (nbgrader
then reports the notebook as not autograded; make grade writes ``failed: <reason>``).
"""
import atexit
import base64
import copy
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import nbformat
from traitlets import Bool, Integer, Unicode

from . import checks
from . import nbtools
from . import sandbox
from . import views
from .wire import MAX_PNG

#: copied into the sandbox; preln/course.py for the limits of call_within (it needs only numpy)
LIB_FILES = ["sandbox_lib/grader_runner.py", "sandbox_lib/grader_capture.py", "wire.py", "../course.py"]
HERE = Path(__file__).resolve().parent

#: the last failure's reason, for make grade's CSV (same process as the nbgrader API call)
LAST = {"failure": None, "sandboxed": None, "seconds": None, "verdicts": None}


class GradingFailed(Exception):
    pass


class _Workspace:
    """Per-process scratch: the sandbox library, one directory per view, the jobs."""

    def __init__(self, root=None):
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="preln-grader-"))
        self.owned = root is None
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.lib = self.root / "lib"
        if not self.lib.exists():
            self.lib.mkdir()
            for f in LIB_FILES:
                shutil.copy(HERE / f, self.lib / Path(f).name)
        self.views = {}
        self.n = 0
        if self.owned:
            atexit.register(shutil.rmtree, self.root, True)

    def view(self, key):
        if key not in self.views:
            dest = self.root / ("view-" + hashlib.sha1(repr(key).encode()).hexdigest()[:12])
            if not dest.exists():                 # built aside, then renamed: never half a view
                tmp = Path(tempfile.mkdtemp(prefix=".view-", dir=self.root))
                views.build_view(tmp, key[0], key[1])
                os.chmod(tmp, 0o755)
                try:
                    os.rename(tmp, dest)
                except OSError:                   # another process built it first
                    shutil.rmtree(tmp, ignore_errors=True)
            self.views[key] = dest
        return self.views[key]

    def job_dir(self):
        self.n += 1
        d = self.root / f"job-{os.getpid()}-{self.n}"
        d.mkdir()
        (d / "calls").mkdir()
        return d


_WORKSPACE = {}


def workspace(root=None):
    key = str(root)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = _Workspace(root)
    return _WORKSPACE[key]


def prebuild(plan, root=None):
    """Build the views of an assignment's groups now (before forking workers)."""
    ws = workspace(root)
    for key, _ in plan.groups():
        ws.view(key)


def sandbox_notebook(nb, plan):
    """The notebook the sandbox executes: hidden regions removed, outputs cleared."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if nbtools.BEGIN_HIDDEN in cell.get("source", ""):
            cell.source = nbtools.without_hidden(cell.source)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return out


def tests_cells(nb, plan):
    """{question key: index} of the graded tests cells in ``nb`` (found by grade_id)."""
    ids = {f"{k}_tests": k for k in plan.questions}
    out = {}
    for i, cell in enumerate(nb.cells):
        gid = nbtools.grade_id(cell)
        if gid in ids and ids[gid] not in out and cell.cell_type == "code":
            out[ids[gid]] = i
    return out


def grade_notebook(nb, plan, settings, root=None, slot=0):
    """Run ``nb`` (a student's notebook) against ``plan``; return (verdicts, outputs per cell, info)."""
    ws = workspace(root)
    tests = tests_cells(nb, plan)
    run_nb = sandbox_notebook(nb, plan)
    cells = [i for i, c in enumerate(run_nb.cells) if c.cell_type == "code" and i not in tests.values()]
    results, q_status, outputs, info = {}, {}, {}, {"runs": 0, "seconds": 0.0, "sessions": 0}
    frozen = {}
    budget = settings.cell_timeout
    for gi, (key, qkeys) in enumerate(plan.groups()):
        job = ws.job_dir()
        try:
            nbformat.write(run_nb, str(job / "notebook.ipynb"))
            sent = {}
            for q in qkeys:
                sent[q] = plan.questions[q].inputs_document(settings.call_timeout, budget, job / "frozen")
                (job / "calls" / f"{q}.json").write_text(json.dumps(sent[q]))
            (job / "spec.json").write_text(json.dumps({"cells": cells, "questions": qkeys}))
            try:
                doc = sandbox.run_job(job, ws.view(key), ws.lib, settings, slot=slot)
            except sandbox.SandboxFailure as e:
                raise GradingFailed(str(e)) from None
            for q in qkeys:                # "unchanged" is judged from these bytes, read here
                frozen.update(plan.questions[q].read_frozen(sent[q], job / "frozen"))
        finally:
            shutil.rmtree(job, ignore_errors=True)
        info["runs"] += 1
        info["seconds"] += float(doc.get("_seconds", 0))
        info["sessions"] += int(doc.get("sessions", 0)) if isinstance(doc.get("sessions"), int) else 0
        got = doc.get("results") if isinstance(doc.get("results"), dict) else {}
        status = doc.get("questions") if isinstance(doc.get("questions"), dict) else {}
        for q in qkeys:
            q_status[q] = status.get(q) if isinstance(status.get(q), str) else "not_run"
            for call in plan.questions[q].calls:
                results[call["id"]] = got.get(call["id"])
        if gi == 0 and isinstance(doc.get("cells"), dict):
            outputs = doc["cells"]
    student = [c.source for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in tests.values()]
    verdicts = checks.evaluate(plan, results, q_status, student, frozen)
    return verdicts, outputs, info


# ---- what goes back into the notebook --------------------------------------------------------
MAX_TEXT = 20_000
#: what the sandbox's runner sends when its outputs' budget of the notebook is spent (grader_runner.py)
RUNNER_BUDGET_MB = 8


def _clean_text(v):
    if isinstance(v, list):
        v = "".join(x for x in v if isinstance(x, str))
    return v[:MAX_TEXT] if isinstance(v, str) else ""


def _png(png):
    """(the PNG's base64 text, None) if ``png`` is one to show, else (None, why it is not)."""
    if isinstance(png, dict) and isinstance(png.get("dropped"), int) and png["dropped"] <= MAX_PNG:
        return None, (f"the notebook's outputs passed the grader's limit ({RUNNER_BUDGET_MB} MB in all) "
                      "before it")
    size = png["dropped"] if isinstance(png, dict) and isinstance(png.get("dropped"), int) else \
        len(png) if isinstance(png, str) else None
    if size is not None and size > MAX_PNG:
        return None, (f"its PNG is {size * 3 // 4 // 1024} kB, over the grader's limit of "
                      f"{MAX_PNG * 3 // 4 // 1024} kB per figure")
    if isinstance(png, str):
        png = png.replace("\n", "")
        try:
            if base64.b64decode(png, validate=True)[:8] == b"\x89PNG\r\n\x1a\n":
                return png, None
        except ValueError:
            pass
    return None, "it is not a PNG image"


def sanitize_outputs(outputs):
    """The sandbox's outputs of one cell, reduced to what is safe to show (text and PNG images); a
    figure that is not kept is replaced by a line that says so and why."""
    out = []
    if not isinstance(outputs, list):
        return out
    for o in outputs[:50]:
        if not isinstance(o, dict):
            continue
        kind = o.get("output_type")
        if kind == "stream" and o.get("name") in ("stdout", "stderr"):
            out.append(nbformat.v4.new_output("stream", name=o["name"], text=_clean_text(o.get("text"))))
        elif kind == "error":
            tb = o.get("traceback") if isinstance(o.get("traceback"), list) else []
            out.append(nbformat.v4.new_output("error", ename=_clean_text(o.get("ename"))[:200],
                                              evalue=_clean_text(o.get("evalue"))[:2000],
                                              traceback=[_clean_text(t)[:2000] for t in tb[:60]]))
        elif kind in ("execute_result", "display_data"):
            data = o.get("data") if isinstance(o.get("data"), dict) else {}
            clean = {}
            if "text/plain" in data:
                clean["text/plain"] = _clean_text(data["text/plain"])
            dropped = None
            if "image/png" in data:
                png, dropped = _png(data["image/png"])
                if png is not None:
                    clean["image/png"] = png
            if kind == "execute_result" and clean:
                count = o.get("execution_count")
                out.append(nbformat.v4.new_output("execute_result", data=clean,
                                                  execution_count=count if isinstance(count, int) else None))
            elif clean:
                out.append(nbformat.v4.new_output("display_data", data=clean))
            if dropped:
                out.append(nbformat.v4.new_output("stream", name="stdout",
                                                  text=f"[grader] a figure was not kept here: {dropped}\n"))
    return out


def verdict_outputs(verdict, all_or_nothing=False):
    """The tests cell's outputs nbgrader scores (nbgrader.utils.determine_grade): all passed, a
    line on stdout (full points); some points, the feedback on stdout then the points as the cell's
    result (nbgrader's partial credit); none, an error."""
    lines = verdict.lines(all_or_nothing=all_or_nothing)
    if verdict.passed:
        return [nbformat.v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n")]
    score = verdict.score(all_or_nothing)
    if score > 0:
        return [nbformat.v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n"),
                nbformat.v4.new_output("execute_result", data={"text/plain": f"{score:g}"})]
    return [nbformat.v4.new_output("error", ename="HiddenCheckFailed", evalue=lines[0],
                                   traceback=[f"HiddenCheckFailed: {lines[0]}"] + lines[1:])]


def apply(nb, plan, verdicts, outputs, sandboxed=True, all_or_nothing=False):
    """Write verdicts and the sandbox's outputs into ``nb`` (the notebook nbgrader will score)."""
    tests = tests_cells(nb, plan)
    for key, i in tests.items():
        cell = nb.cells[i]
        n = len(plan.questions[key].checks)
        public = nbtools.without_hidden(cell.source)
        cell.source = public.rstrip("\n") + (f"\n# {n} hidden checks: run by the grader, outside the notebook"
                                             + ("" if sandboxed else " (NOT sandboxed)"))
        cell.outputs = verdict_outputs(verdicts[key], all_or_nothing)
        cell.execution_count = None
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i in tests.values():
            continue
        rec = outputs.get(str(i)) if isinstance(outputs, dict) else None
        cell.outputs = sanitize_outputs(rec.get("outputs")) if isinstance(rec, dict) else []
        cell.execution_count = None
        if isinstance(rec, dict) and rec.get("status") in ("timeout", "died"):
            cell.outputs.append(nbformat.v4.new_output(
                "stream", name="stdout",
                text=f"[grader] this cell {'timed out' if rec['status'] == 'timeout' else 'killed the kernel'}; "
                     "it was skipped when the kernel was restarted\n"))
    return nb


# ---- the nbgrader preprocessor -----------------------------------------------------------------
try:
    from nbgrader.preprocessors import NbGraderPreprocessor
except ImportError:                                         # pragma: no cover: nbgrader is optional
    NbGraderPreprocessor = object


class SandboxedExecute(NbGraderPreprocessor):
    """nbgrader's Execute, replaced: the student's code runs in a bubblewrap sandbox and the hidden
    checks' verdicts are computed in the grader's process (see this module's docstring)."""

    sandbox = Bool(True, help="Run student code in a bubblewrap sandbox (False: --no-sandbox)").tag(config=True)
    timeout = Integer(60, help="Seconds per cell, and per question's hidden calls").tag(config=True)
    call_timeout = Integer(10, help="Seconds per call of an answer").tag(config=True)
    mem_mb = Integer(2048, help="Address space of each process in the sandbox (MB)").tag(config=True)
    cpu_s = Integer(600, help="CPU seconds of each process in the sandbox").tag(config=True)
    total_mem_mb = Integer(4096, help="Resident memory of the sandbox's processes together (MB)").tag(config=True)
    nproc = Integer(64, help="Processes and threads in the sandbox").tag(config=True)
    wall_s = Integer(900, help="Longest one sandbox run may take (s)").tag(config=True)
    slot = Integer(0, help="Worker slot (the sandbox's uid is uid_base + slot when run as root)").tag(config=True)
    workspace = Unicode("", help="Scratch directory (views, jobs); default: a temporary one").tag(config=True)
    bwrap = Unicode("bwrap", help="The bubblewrap executable").tag(config=True)
    all_or_nothing = Bool(False, help="A question scores its points only when every requirement group "
                                      "passes (default: the points of the groups it passes)").tag(config=True)
    secret_file = Unicode("", help="A file whose first line is the course secret (re-seeds the hidden inputs; "
                                   "default: $PRELN_COURSE_SECRET, else the published seeds)").tag(config=True)

    def settings(self):
        return sandbox.Settings(cell_timeout=self.timeout, call_timeout=self.call_timeout, mem_mb=self.mem_mb,
                                cpu_s=self.cpu_s, total_mem_mb=self.total_mem_mb, nproc=self.nproc,
                                wall_s=self.wall_s, sandbox=self.sandbox, bwrap=self.bwrap)

    def source_path(self, resources):
        from nbgrader.coursedir import CourseDirectory
        cd = CourseDirectory(config=self.config)
        assignment = resources["nbgrader"]["assignment"]
        notebook = resources["nbgrader"]["notebook"]
        return Path(cd.format_path(cd.source_directory, ".", assignment)) / f"{notebook}.ipynb"

    def preprocess(self, nb, resources):
        LAST.update(failure=None, sandboxed=self.sandbox, seconds=None, verdicts=None)
        path = self.source_path(resources)
        if not path.exists():
            raise GradingFailed(f"the source notebook {path} is missing: the grader needs it for the hidden checks")
        try:
            secret = checks.read_secret(self.secret_file) if self.secret_file else None
        except ValueError as e:
            LAST["failure"] = str(e)
            raise GradingFailed(str(e)) from None
        plan = checks.plan_for(path, secret)
        if self.sandbox:
            problem = _probe(self.settings())
            if problem:
                LAST["failure"] = problem
                raise GradingFailed(problem)
        try:
            verdicts, outputs, info = grade_notebook(nb, plan, self.settings(), self.workspace or None, self.slot)
        except GradingFailed as e:
            LAST["failure"] = str(e)
            raise
        apply(nb, plan, verdicts, outputs, sandboxed=self.sandbox, all_or_nothing=self.all_or_nothing)
        LAST.update(seconds=info["seconds"], verdicts={k: v.passed for k, v in verdicts.items()})
        resources.setdefault("preln_grader", {}).update(sandboxed=self.sandbox, **info)
        return nb, resources


_PROBED = {}


def _probe(settings):
    key = settings.bwrap
    if key not in _PROBED:
        _PROBED[key] = sandbox.probe(settings)
    return _PROBED[key]
