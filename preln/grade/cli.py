"""python -m preln.grade (make grade): autograde a folder of submissions, sandboxed, one CSV per assignment.

    python -m preln.grade SUBMISSIONS [--roster roster.csv] [--out DIR] [--course DIR]
        [--jobs N] [--assignment NAME ...] [--timeout 60] [--call-timeout 10] [--mem-mb 2048]
        [--cpu-s 600] [--total-mem-mb 4096] [--worker-mem-mb 4096] [--notebook-s 1200] [--no-sandbox]
        [--no-feedback] [--keep]

SUBMISSIONS is nbgrader's layout, SUBMISSIONS/<student>/<assignment>/<assignment>.ipynb. The
roster (optional) is a CSV in UTF-8 (with or without a byte-order mark) with a column `student` (or
`id`); a roster student with no submission gets a row with status `missing`. Ids from folders and
the roster are compared in Unicode NFC (one row per student); nbgrader grades each under a safe
name made from it, and the CSV is inert in a spreadsheet (a text cell that starts like a formula
starts with '). For each assignment of the instructor edition (--course: default
the clone's assignments/, or outside a clone the copy in the installed package) it writes
<out>/<assignment>.csv (--out: default _build/grades/ in a clone, ./grades/ elsewhere) with the columns

    student, <one per graded question>, total, possible, manual_possible, status

`total`/`possible` count the autograded questions; the written answers (graded by hand, e.g. in
formgrader) have empty cells and their points are in `manual_possible`. status is `ok`, `missing`,
or `failed: <reason>` (not a notebook, nbgrader metadata gone, or the sandbox produced no result:
it was killed for memory or time, or the notebook killed the grader's process inside it).
nbgrader's HTML feedback per student goes to <out>/feedback/<student>/<assignment>.html.

How (book/running.md, "Grading" and "Threat model"): every notebook is autograded by nbgrader with
the edition's nbgrader_config.py, whose SandboxedExecute runs the student's code in a bubblewrap
sandbox and computes the hidden checks' verdicts in the grader's process (preln/grade/autograde.py).
Students are graded N at a time (``--jobs``, default: the machine's cores), each in a worker process
of its own with its own temporary course directory and gradebook; a worker that dies costs only
its student's rows. Rows are appended to the CSVs as they come (then sorted when the run ends), and
a progress line is printed per notebook. After the run the grader checks that nothing outside the
submissions changed (the repository, assignments/, the other CSVs of --out, the submissions
themselves) and says so if something did (exit status 3). Without a working bwrap it refuses
(exit status 2) and says what to install; --no-sandbox grades anyway and every row's status says so.
"""
import argparse
import csv
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import resource
import shutil
import stat
import sys
import tempfile
import time
import traceback
import unicodedata
import warnings
from pathlib import Path

sys.modules.setdefault("rfc3987_syntax", None)      # jsonschema's IRI checker: seconds of import, unused

import nbformat  # noqa: E402

from . import nbtools  # noqa: E402

NO_SANDBOX = "not sandboxed: --no-sandbox"


#: what a roster may be: UTF-8, with or without the byte-order mark Excel's "CSV UTF-8" writes
ROSTER_ENCODING = "utf-8-sig"
#: byte-order marks of the encodings a roster is not, named for the error
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
               (b"\xff\xfe", "UTF-16 (Excel's \"Unicode Text\")"), (b"\xfe\xff", "UTF-16"))


def student_id(name):
    """A student's id as the grader compares, sorts and reports it: Unicode NFC, so that a folder a Mac
    zip wrote decomposed (NFD) and the roster's composed spelling are one student."""
    return unicodedata.normalize("NFC", name)


def _not_utf8(path):
    with open(path, "rb") as f:
        raw = f.read()
    for bom, name in _OTHER_BOMS:
        if raw.startswith(bom):
            return f"{name} text"
    try:
        raw.decode(ROSTER_ENCODING)
        return "text that is not UTF-8"
    except UnicodeDecodeError as e:
        err = e
    line = raw[:err.start].count(b"\n") + 1
    return (f"byte {raw[err.start]:#04x} on line {line}, which is not UTF-8 (a file in Latin-1 or "
            "Windows-1252, as Excel's plain \"CSV\" writes it, perhaps)")


def read_roster(path):
    """The roster's student ids (NFC), in its order, each once; a CSV with a column `student` or `id`
    in UTF-8, with or without a byte-order mark. Ids that are one after normalisation are warned about."""
    try:
        with open(path, newline="", encoding=ROSTER_ENCODING) as f:
            # column names as a person reads them: "Student", " id " (a spreadsheet's export) match
            rows = [{(k or "").strip().lower(): v or "" for k, v in r.items()} for r in csv.DictReader(f)]
    except UnicodeDecodeError:
        raise SystemExit(f"--roster: expected a CSV in UTF-8 (with or without a byte-order mark: Excel's "
                         f"\"CSV UTF-8\"); got {_not_utf8(path)} in {path}: save it as CSV UTF-8") from None
    if rows and not ({"student", "id"} & set(rows[0])):
        raise SystemExit(f"--roster: expected a CSV with a column `student` or `id`; got columns {list(rows[0])}")
    raw = [(r.get("student") or r.get("id")).strip() for r in rows if (r.get("student") or r.get("id"))]
    ids = {}
    for name in raw:
        ids.setdefault(student_id(name), []).append(name)
    for sid, names in ids.items():
        if len(set(names)) > 1:
            warn(f"the roster spells one student in {len(set(names))} ways that are the same after Unicode "
                 f"normalisation (NFC): {', '.join(ascii(n) for n in sorted(set(names)))}: one row, {sid}")
    return list(ids)


def warn(text):
    print(f"make grade: warning: {text}", file=sys.stderr, flush=True)


def student_folders(submissions, roster):
    """{student id: its folders' names} of everyone to grade: each folder of ``submissions`` (a link
    too: refused later with a row of its own; never followed) and each roster id, merged by
    :func:`student_id`. Two folders that are one id are warned about (their row says which to keep)."""
    folders = {}
    for e in os.scandir(submissions):
        if not e.name.startswith(".") and (e.is_dir(follow_symlinks=False) or e.is_symlink()):
            folders.setdefault(student_id(e.name), []).append(e.name)
    for sid, names in folders.items():
        names.sort()
        if len(names) > 1:
            warn(f"{len(names)} folders are one student after Unicode normalisation (NFC): "
                 f"{', '.join(ascii(n) for n in names)}: one row, {sid}")
        elif names[0] != sid:
            warn(f"the folder {ascii(names[0])} is not in Unicode NFC (a Mac zip writes names decomposed): "
                 f"graded as {sid}")
    for sid in roster:
        folders.setdefault(sid, [])
    return dict(sorted(folders.items()))


def nbgrader_id(student):
    """The id nbgrader grades ``student`` under: letters and digits only. nbgrader globs and formats
    paths with the id (``x[1]`` matched no notebook), so it never sees the real one; the CSV and
    the feedback folder do."""
    return "s" + hashlib.sha256(student.encode()).hexdigest()[:20]


#: a cell a spreadsheet would read as a formula starts with one of these (OWASP, CSV injection)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def inert(text):
    """``text`` as a CSV cell no spreadsheet evaluates: prefixed with ' where it starts like a formula."""
    return "'" + text if text.startswith(FORMULA_START) else text


#: the largest notebook, and the largest cell source, graded (a student's real work is far below)
MAX_NOTEBOOK_MB, MAX_CELL_KB, MAX_SOURCE_KB = 64, 256, 2048
#: the JSON lists and objects, and their nesting, of a notebook the grader parses: a real submission
#: holds about a hundred, 6 deep (the fixture class); every parse and copy of one (nbformat,
#: nbgrader, deepcopy) costs memory per container, 4 GB for 8 million empty lists in 24 MB
MAX_CONTAINERS, MAX_DEPTH = 100_000, 64
#: cells, and metadata (the notebook's and every cell's, as JSON), of a notebook the grader hands to
#: nbformat, nbgrader and the sandbox: a real submission has about 40 cells and a few kB of metadata
#: (JupyterLab's widget state included); checked on a plain JSON parse, before nbformat validates
#: and copies the notebook
MAX_CELLS, MAX_METADATA_KB = 2_000, 4096
#: address space of a grading worker (the grader's own process for one student): a notebook the
#: shape check lets through still cannot take the host's memory
WORKER_MEM_MB = 4096
REFUSED = "refused"


def _kind(mode):
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a folder" if stat.S_ISDIR(mode) else "not a regular file")


def refusal(submissions, student, name):
    """Why the submission's path is not a plain notebook file of the student's own (None if it is).

    Checked with lstat, part by part from the submissions folder down: the student's folder, the
    assignment's folder and the notebook must be a real folder, folder and regular file, none a
    link, and the notebook must have no other hard link (a second name elsewhere: another
    student's file, the instructor's source). Nothing here opens or follows anything."""
    parts = [(submissions / student, "the student's folder", stat.S_ISDIR),
             (submissions / student / name, f"the folder {name}/", stat.S_ISDIR),
             (submissions / student / name / f"{name}.ipynb", f"{name}.ipynb", stat.S_ISREG)]
    for path, what, ok in parts:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None                                   # missing: the caller's `missing` row
        except OSError as e:
            return f"{REFUSED}: {what} cannot be examined ({type(e).__name__})"
        if not ok(st.st_mode):
            return f"{REFUSED}: {what} is {_kind(st.st_mode)}, not a notebook file of the submission's own"
    if st.st_nlink > 1:
        return (f"{REFUSED}: {name}.ipynb has {st.st_nlink} hard links (another name for the same file "
                "elsewhere); submit a copy")
    if st.st_size > MAX_NOTEBOOK_MB * 2 ** 20:
        return f"{REFUSED}: {name}.ipynb is larger than {MAX_NOTEBOOK_MB} MB"
    return None


def read_submission(path):
    """The notebook file's bytes: opened without following a link or blocking (O_NOFOLLOW,
    O_NONBLOCK), and read only if what was opened is the regular file examined."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_size > MAX_NOTEBOOK_MB * 2 ** 20:
            raise OSError(f"{path} changed while it was examined")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_NOTEBOOK_MB * 2 ** 20 + 1)
    finally:
        os.close(fd)


_JSON_STRING = re.compile(rb'"[^"]*"')


def shape_refusal(data):
    """Why the JSON in ``data`` has more lists and objects, or deeper ones, than a notebook the grader
    parses (None if it has not): a scan of the bytes before any parse, linear and in C (escaped
    backslashes and quotes dropped, then every string), with a copy of the bytes as its memory."""
    bare = _JSON_STRING.sub(b"", data.replace(b"\\\\", b"").replace(b'\\"', b""))
    opens = bare.count(b"[") + bare.count(b"{")
    if opens > MAX_CONTAINERS or bare.count(b"]") + bare.count(b"}") > MAX_CONTAINERS:
        return (f"{REFUSED}: the notebook holds more than {MAX_CONTAINERS:,} JSON lists and objects "
                f"({opens:,}; a notebook holds about a hundred)")
    depth = deepest = 0
    for m in re.finditer(rb"[\[\]{}]", bare):                   # at most 2 * MAX_CONTAINERS
        depth += 1 if m.group() in b"[{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return f"{REFUSED}: the notebook's JSON is nested {deepest} deep (more than {MAX_DEPTH})"
    return None


def size_refusal(raw):
    """Why the parsed JSON ``raw`` has more cells or metadata than the grader takes (None if not)."""
    cells = raw.get("cells") if isinstance(raw, dict) else None
    if not isinstance(cells, list):
        return None                                              # not a notebook: nbformat says why
    if len(cells) > MAX_CELLS:
        return f"{REFUSED}: the notebook has {len(cells):,} cells (more than {MAX_CELLS:,})"
    metas = [raw.get("metadata")] + [c.get("metadata") for c in cells if isinstance(c, dict)]
    size = sum(len(json.dumps(m, ensure_ascii=False)) for m in metas if m is not None)
    if size > MAX_METADATA_KB * 1024:
        return (f"{REFUSED}: the notebook's metadata (its own and its cells') is {size // 1024:,} kB "
                f"(more than {MAX_METADATA_KB:,} kB; a notebook holds a few kB)")
    return None


def check_submission(data, source_nb):
    """(notebook, None) if ``data`` is a notebook with every graded cell of the source, else (None, the
    reason it is not)."""
    if len(data) > MAX_NOTEBOOK_MB * 2 ** 20:
        return None, f"{REFUSED}: the notebook is larger than {MAX_NOTEBOOK_MB} MB"
    reason = shape_refusal(data)
    if reason is not None:
        return None, reason
    try:
        text = data.decode("utf-8")
        reason = size_refusal(json.loads(text))
        if reason is not None:
            return None, reason
        nb = nbformat.reads(text, as_version=4)
    except MemoryError:                  # a readable notebook too big for the worker: its own reason
        raise
    except Exception as e:                                       # noqa: BLE001: any unreadable file
        return None, f"not a readable notebook ({type(e).__name__})"
    big = [i for i, c in enumerate(nb.cells) if len(c.get("source", "")) > MAX_CELL_KB * 1024]
    if big:
        return None, f"{REFUSED}: cell {big[0] + 1} is larger than {MAX_CELL_KB} kB of source"
    if sum(len(c.get("source", "")) for c in nb.cells) > MAX_SOURCE_KB * 1024:
        return None, f"{REFUSED}: the notebook's cells hold more than {MAX_SOURCE_KB} kB of source"
    have = {nbtools.grade_id(c) for c in nb.cells if nbtools.nbgrader_meta(c)}
    need = [gid for gid, _, _ in nbtools.graded_cells(source_nb)]
    need += [nbtools.grade_id(c) for c in source_nb.cells if nbtools.nbgrader_meta(c).get("solution")]
    missing = sorted(set(need) - have)
    if missing:
        return None, f"nbgrader metadata missing for {len(missing)} cells ({', '.join(missing[:3])}...)"
    return nb, None


# ---- what may not change ---------------------------------------------------------------------
SKIP_DIRS = {"_build", "__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", "node_modules",
             ".jupyter_cache"}
#: ... and the metadata pip writes beside the checkout when it installs it editable (a Binder-like
#: venv of `make test-learner`, which runs beside the course tests): no sandbox sees the checkout
SKIP_SUFFIXES = (".egg-info",)


def _hash(path):
    """Content hash of a regular file, opened without following a link or blocking on a FIFO."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return "not a regular file"
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest(roots, stat_only=(), exclude=()):
    """{path: fingerprint} of everything under ``roots``, walked with lstat: a regular file's content
    hash, or (size, mtime) under a ``stat_only`` folder (the Python environment: many files,
    mounted read-only in the sandbox); a link's target (never followed); a FIFO's, socket's or
    device's type and inode (never opened)."""
    out = {}
    exclude = {os.path.realpath(p) for p in exclude}
    quick_roots = tuple(os.path.realpath(s) + os.sep for s in stat_only)

    def walk(d, quick):
        try:
            entries = list(os.scandir(d))
        except OSError:
            out[d] = "unreadable"
            return
        for e in entries:
            if e.path in exclude:
                continue
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    out[e.path] = ("link", os.readlink(e.path))
                elif stat.S_ISDIR(st.st_mode):
                    if e.name not in SKIP_DIRS and not e.name.endswith(SKIP_SUFFIXES):
                        walk(e.path, quick or (e.path + os.sep).startswith(quick_roots))
                elif not stat.S_ISREG(st.st_mode):
                    out[e.path] = ("special", stat.S_IFMT(st.st_mode), st.st_ino)
                else:
                    out[e.path] = (st.st_size, st.st_mtime_ns) if quick else _hash(e.path)
            except OSError:
                out[e.path] = "unreadable"

    for root in roots:
        root = os.path.realpath(root)
        if os.path.isdir(root):
            walk(root, (root + os.sep).startswith(quick_roots))
    return out


def watched(submissions, out):
    """What grading must leave as it is: the clone (or, from a wheel, the edition and the installed
    package), the submissions, the output folder."""
    from .views import PACKAGE
    here = [nbtools.ROOT] if nbtools.ROOT else [nbtools.COURSE, PACKAGE]
    return [*here, nbtools.COURSE, submissions, out]


def stat_only():
    return [nbtools.ROOT / ".venv"] if nbtools.ROOT else []


def changes(before, after):
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    return [f"added {p}" for p in added] + [f"removed {p}" for p in removed] + [f"changed {p}" for p in changed]


# ---- one student, in a worker process of its own ----------------------------------------------
def make_api(course_root, args, slot, workspace):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(nbtools.COURSE)).load_config()
    cfg.merge(Config({
        "CourseDirectory": {"root": str(course_root), "db_url": f"sqlite:///{course_root}/gradebook.db"},
        "SandboxedExecute": {"timeout": args.timeout, "call_timeout": args.call_timeout, "mem_mb": args.mem_mb,
                             "cpu_s": args.cpu_s, "total_mem_mb": args.total_mem_mb,
                             "sandbox": not args.no_sandbox, "slot": slot, "workspace": str(workspace),
                             "bwrap": args.bwrap, "all_or_nothing": args.all_or_nothing},
        # the feedback renders a student's markdown through an allow-list sanitiser (feedback.py),
        # whatever the edition's nbgrader_config.py says
        "GenerateFeedback": {"exporter_class": "preln.grade.feedback.FeedbackExporter"},
    }))
    return NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)


def grade_student(conn, student, folder, names, args, template, tmp, slot):
    """Worker: autograde ``student``'s notebooks (in the submissions' ``folder``); send one message
    per notebook to ``conn``."""
    warnings.filterwarnings("ignore")
    # the worker's own memory, under a cap of its own (the soft limit: the sandbox it starts sets its own)
    resource.setrlimit(resource.RLIMIT_AS, (args.worker_mem_mb * 2 ** 20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    from . import autograde, sandbox
    # a sandbox waiting its turn at the host's gate (sandbox.ViewGate): the parent's clock for this
    # notebook stops meanwhile
    sandbox.on_gate = lambda event: conn.send({"gate": event})
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    course = Path(tempfile.mkdtemp(prefix=f"student-{slot}-", dir=tmp))
    shutil.copytree(template / "source", course / "source")
    shutil.copy(template / "gradebook.db", course / "gradebook.db")
    api = make_api(course, args, slot, tmp / "work")
    submissions = Path(args.submissions)
    for name in names:
        conn.send({"start": name})                           # the parent's clock for this notebook starts
        t0 = time.perf_counter()
        msg = {"student": student, "assignment": name}
        try:
            msg.update(grade_one(api, autograde, student, folder, name, submissions, course, args))
        except MemoryError:
            msg.update(status=f"failed: {worker_memory(args)}", scores={})
        except Exception as e:                               # noqa: BLE001: a bug here costs this row
            msg.update(status=f"failed: the grader failed on this notebook ({type(e).__name__}: {str(e)[:150]})",
                       scores={}, trace=traceback.format_exc(limit=-4))
        msg["seconds"] = time.perf_counter() - t0
        conn.send(msg)
    shutil.rmtree(course, ignore_errors=True)


def grade_one(api, autograde, student, folder, name, submissions, course, args):
    source_nb = nbtools.read(course / "source" / name / f"{name}.ipynb")
    path = submissions / folder / name / f"{name}.ipynb"
    reason = refusal(submissions, folder, name)
    if reason is not None:
        return {"status": f"failed: {reason}", "scores": {}}
    try:
        data = read_submission(path)
    except OSError as e:
        return {"status": f"failed: {REFUSED}: {name}.ipynb could not be read as a plain file ({e})", "scores": {}}
    _, reason = check_submission(data, source_nb)
    if reason is not None:
        return {"status": f"failed: {reason}", "scores": {}}
    safe = nbgrader_id(student)
    dest = course / "submitted" / safe / name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{name}.ipynb").write_bytes(data)                # the bytes examined, not the path again
    autograde.LAST.update(failure=None, seconds=None)
    t0 = time.perf_counter()
    result = api.autograde(name, safe, force=True, create=True)
    timing = {"autograde": time.perf_counter() - t0, "sandbox": autograde.LAST.get("seconds")}
    if not result["success"]:
        reason = autograde.LAST.get("failure") or why(result)
        if "MemoryError" in f"{result.get('log')}{result.get('error')}" and not autograde.LAST.get("failure"):
            reason = worker_memory(args)
        return {"status": f"failed: {reason}", "scores": {}, "timing": timing}
    scores = gradebook_scores(api, name, safe)
    if not args.no_feedback:
        t0 = time.perf_counter()
        feedback(api, name, safe, course, Path(args.out) / "feedback" / student)
        timing["feedback"] = time.perf_counter() - t0
    return {"status": "ok", "scores": scores, "timing": timing}


def worker_memory(args):
    return (f"grading this notebook needed more than {args.worker_mem_mb} MB in the grader's own worker "
            "(--worker-mem-mb)")


def gradebook_scores(api, name, student):
    from nbgrader.api import Gradebook
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        sub = gb.find_submission_notebook(name, name, student)
        return {g.name: g.score for g in sub.grades}


def feedback(api, name, safe, course, dest):
    """nbgrader's feedback of the notebook graded as ``safe`` into ``dest``/<name>.html."""
    res = api.generate_feedback(name, safe, force=True)
    html = course / "feedback" / safe / name / f"{name}.html"
    if res["success"] and html.exists():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(html, dest / f"{name}.html")


def why(result):
    """One line saying why nbgrader could not grade a submission (its log holds the traceback)."""
    text = f"{result.get('log') or ''}\n{result.get('error') or ''}"
    if "GradingFailed" in text:
        line = next(ln for ln in text.splitlines()[::-1] if "GradingFailed" in ln)
        return line.split("GradingFailed:", 1)[-1].strip()[:300]
    errors = [ln for ln in text.splitlines() if ln.startswith("[ERROR]") and "Please see" not in ln]
    return last_line(errors[-1] if errors else text)


def last_line(text):
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "unknown"


def fmt(x):
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# ---- the run ---------------------------------------------------------------------------------
class Sheet:
    """One assignment's CSV: rows appended as they come, sorted by student at the end."""

    def __init__(self, out, name):
        source_nb = nbtools.read(nbtools.source_path(name))
        self.cells = nbtools.graded_cells(source_nb)
        self.columns = [nbtools.column_name(source_nb, gid) for gid, _, _ in self.cells]
        self.possible = sum(p for _, p, kind in self.cells if kind == "auto")
        self.manual = sum(p for _, p, kind in self.cells if kind == "manual")
        self.header = ["student", *self.columns, "total", "possible", "manual_possible", "status"]
        self.path = Path(out) / f"{name}.csv"
        with open(self.path, "w", newline="") as f:
            csv.writer(f).writerow(self.header)
        self.rows = []

    def add(self, student, status, scores, sandboxed=True):
        row = {"student": inert(student), "possible": fmt(self.possible), "manual_possible": fmt(self.manual)}
        if status == "ok":
            for col, (gid, _, kind) in zip(self.columns, self.cells):
                row[col] = fmt(scores.get(gid)) if kind == "auto" else ""
            row["total"] = fmt(sum(scores.get(gid) or 0 for gid, _, kind in self.cells if kind == "auto"))
        if not sandboxed and status != "missing":
            status = f"{status} ({NO_SANDBOX})"
        row["status"] = inert(status)
        self.rows.append(row)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.header, restval="").writerow(row)
        return row

    def finish(self):
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, self.header, restval="")
            w.writeheader()
            w.writerows(sorted(self.rows, key=lambda r: r["student"]))
        os.replace(tmp, self.path)


def template_course(tmp, names):
    """source/ and a gradebook with every assignment registered (generate_assignment), once."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    course = tmp / "template"
    shutil.copytree(nbtools.SOURCE, course / "source", ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(nbtools.COURSE)).load_config()
    cfg.merge(Config({"CourseDirectory": {"root": str(course), "db_url": f"sqlite:///{course}/gradebook.db"}}))
    api = NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)
    for name in names:
        res = api.generate_assignment(name, force=True, create=True)
        if not res["success"]:
            raise SystemExit(f"{name}: generate_assignment failed:\n{res.get('log')}\n{res['error']}")
    return course


def hms(s):
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def grade(args):
    warnings.filterwarnings("ignore", module=r"nbgrader(\..*)?$")
    submissions = Path(args.submissions).resolve()
    if not submissions.is_dir():
        raise SystemExit(f"SUBMISSIONS: expected a folder <student>/<assignment>/<assignment>.ipynb; "
                         f"got {submissions} (not a folder)")
    from . import autograde
    from . import checks
    from . import sandbox

    settings = sandbox.Settings(bwrap=args.bwrap)
    if not args.no_sandbox:
        problem = sandbox.probe(settings)
        if problem:
            print(f"make grade: refusing to grade without a sandbox: {problem}", file=sys.stderr)
            return 2
    elif (submissions / ".hostile").exists():
        print(f"make grade: refusing --no-sandbox: {submissions} is marked as attacking the grader "
              "(its .hostile file); grade it sandboxed", file=sys.stderr)
        return 2
    else:
        print(f"make grade: --no-sandbox: student code runs with your rights, unprotected; every row says "
              f"'{NO_SANDBOX}'", file=sys.stderr)
    names = args.assignment or nbtools.assignments()
    unknown = sorted(set(names) - set(nbtools.assignments()))
    if unknown:
        raise SystemExit(f"--assignment: no such assignment {', '.join(unknown)}; have {', '.join(nbtools.assignments())}")
    folders = student_folders(submissions, read_roster(args.roster) if args.roster else [])
    students = list(folders)
    if not args.assignment:
        # only what was handed in: a roster does not make a CSV of `missing` rows for an assignment
        # nobody submitted (--assignment NAME grades, and writes, that one regardless)
        handed_in = [n for n in names if any(os.path.lexists(submissions / f / n)
                                             for fs in folders.values() for f in fs)]
        if len(handed_in) < len(names):
            print(f"make grade: no submissions of {', '.join(n for n in names if n not in handed_in)}: "
                  "no CSV for them")
        names = handed_in
        if not names:
            print(f"make grade: nothing to grade in {submissions} (expected <student>/<assignment>/<assignment>.ipynb)",
                  file=sys.stderr)
            return 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    protected = manifest(watched(submissions, out), stat_only=stat_only(),
                         exclude=[out / f"{n}.csv" for n in names] + [out / "feedback"])
    tmp = Path(tempfile.mkdtemp(prefix="preln-grade-"))
    os.chmod(tmp, 0o755)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    t_start = time.perf_counter()
    try:
        print(f"make grade: preparing {len(names)} assignment(s): hidden checks, views of preln, gradebook")
        (tmp / "work").mkdir()
        os.chmod(tmp / "work", 0o755)
        for name in names:
            plan = checks.plan_for(nbtools.source_path(name))
            autograde.prebuild(plan, tmp / "work")
        template = template_course(tmp, names)
        sheets = {name: Sheet(out, name) for name in names}
        queue = []
        for student, candidates in folders.items():
            todo = {}
            for name in names:
                found = [f for f in candidates if os.path.lexists(submissions / f / name)]
                if len(found) > 1:
                    sheets[name].add(student, f"failed: {len(found)} submissions of one student, in the folders "
                                     f"{', '.join(ascii(f) for f in found)} (the same id after Unicode "
                                     "normalisation): keep one and grade again", {}, sandboxed=not args.no_sandbox)
                    continue
                folder = (found or candidates or [student])[0]
                path = submissions / folder / name / f"{name}.ipynb"
                reason = refusal(submissions, folder, name)
                if reason is not None:
                    sheets[name].add(student, f"failed: {reason}", {}, sandboxed=not args.no_sandbox)
                    continue
                if os.path.lexists(path):
                    todo.setdefault(folder, []).append(name)
                    continue
                folder = path.parent
                others = (sorted(e.name for e in os.scandir(folder) if e.name.endswith(".ipynb"))
                          if os.path.isdir(folder) and not os.path.islink(folder) else [])
                status = f"failed: expected {name}.ipynb, found {', '.join(others)}" if others else "missing"
                sheets[name].add(student, status, {}, sandboxed=not args.no_sandbox)
            queue += [(student, f, todo_f) for f, todo_f in todo.items()]
        total = sum(len(t) for _, _, t in queue)
        jobs = args.jobs
        print(f"make grade: {total} notebook(s) of {len(students)} student(s), {jobs} at a time"
              f"{'' if not args.no_sandbox else ' (NOT sandboxed)'}", flush=True)
        done = run_workers(queue, args, template, tmp, jobs, sheets, total, t_start)
        for sheet in sheets.values():
            sheet.finish()
            print(f"wrote {sheet.path}")
    finally:
        if args.keep:
            print(f"temporary folder kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"make grade: {done} notebook(s) in {hms(time.perf_counter() - t_start)}")
    after = manifest(watched(submissions, out), stat_only=stat_only(),
                     exclude=[out / f"{n}.csv" for n in names] + [out / "feedback"])
    diff = changes(protected, after)
    if diff:
        print("make grade: WARNING: files outside the submissions' sandboxes changed during grading:", file=sys.stderr)
        for line in diff[:50]:
            print(f"  {line}", file=sys.stderr)
        return 3
    print("make grade: checked: nothing outside the graded notebooks' sandboxes changed (repository, "
          "submissions, other CSVs)")
    return 0


def run_workers(queue, args, template, tmp, jobs, sheets, total, t_start):
    """Grade the queue's students ``jobs`` at a time, each in a forked worker; report as rows come."""
    ctx = multiprocessing.get_context("fork")      # the workers inherit the plans and views made here
    free = list(range(jobs))
    running = {}                      # conn -> [process, student, folder, names still to come, slot, (name, started)]
    paused = {}                       # conn -> when its worker began to wait at the sandbox gate
    done = 0
    pending = list(queue)
    while pending or running:
        while pending and free:
            student, folder, names = pending.pop(0)
            slot = free.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, args=(child, student, folder, names, args, template, tmp, slot))
            p.start()
            child.close()
            running[parent] = [p, student, folder, list(names), slot, (names[0], time.monotonic())]
        multiprocessing.connection.wait(list(running) + [r[0].sentinel for r in running.values()], timeout=2)
        for conn in list(running):
            p, student, folder, names, slot, (current, started) = running[conn]
            eof = False
            while not eof and conn.poll():
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    eof = True
                    break
                if not isinstance(msg, dict):
                    continue
                if "start" in msg:
                    current, started = msg["start"], time.monotonic()
                    running[conn][5] = (current, started)
                    continue
                if "gate" in msg:             # waiting at the sandbox gate: not the notebook's time
                    if msg["gate"] == "wait":
                        paused[conn] = time.monotonic()
                    elif conn in paused:
                        started += time.monotonic() - paused.pop(conn)
                        running[conn][5] = (current, started)
                    continue
                names.remove(msg["assignment"])
                done += 1
                report(msg, sheets, done, total, t_start, args)
            if p.is_alive() and not eof and names and conn not in paused \
                    and time.monotonic() - started > args.notebook_s:
                # one notebook's work, in the grader's worker and its sandbox, has outlived its limit:
                # the worker goes (with its sandbox), the row says so, the student's other notebooks
                # get a new worker and the rest of the class is graded
                _kill_tree(p.pid)
                p.join()
                names.remove(current)
                done += 1
                report({"student": student, "assignment": current, "scores": {}, "seconds": args.notebook_s,
                        "status": f"failed: grading this notebook took longer than {args.notebook_s} s (the "
                                  "grader's time limit per notebook, inside and outside the sandbox); its "
                                  "worker was stopped"}, sheets, done, total, t_start, args)
                if names:
                    pending.insert(0, (student, folder, list(names)))
                conn.close()
                del running[conn]
                paused.pop(conn, None)
                free.append(slot)
                continue
            if eof or not p.is_alive():
                p.join()
                for name in names:          # the worker died before grading these
                    done += 1
                    msg = {"student": student, "assignment": name, "scores": {}, "seconds": 0.0,
                           "status": f"failed: the grading worker died (exit status {p.exitcode})"}
                    report(msg, sheets, done, total, t_start, args)
                conn.close()
                del running[conn]
                paused.pop(conn, None)
                free.append(slot)
    return done


def _kill_tree(pid):
    """SIGKILL a worker and everything it started (its sandbox, a --no-sandbox kernel)."""
    import psutil
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    from . import sandbox
    sandbox.remove_stale_cgroups()                  # the killed worker's sandbox cgroup, if it had one


def _worker_main(conn, student, folder, names, args, template, tmp, slot):
    try:
        grade_student(conn, student, folder, names, args, template, tmp, slot)
    finally:
        conn.close()


def report(msg, sheets, done, total, t_start, args):
    sheet = sheets[msg["assignment"]]
    row = sheet.add(msg["student"], msg["status"], msg.get("scores") or {}, sandboxed=not args.no_sandbox)
    elapsed = time.perf_counter() - t_start
    eta = elapsed / done * (total - done) if done else 0
    score = f"{row['total']}/{row['possible']}" if row.get("total", "") != "" else row["status"][:60]
    print(f"[{done:>{len(str(total))}}/{total}] {msg['student']}/{msg['assignment']}  {score}  "
          f"{msg['seconds']:.1f} s  elapsed {hms(elapsed)}  ETA {hms(eta)}", flush=True)
    if args.verbose:
        if msg.get("timing"):
            print("    " + ", ".join(f"{k} {v:.1f} s" for k, v in msg["timing"].items() if v is not None))
        if msg.get("trace"):
            print(msg["trace"], file=sys.stderr)


#: a floor for the memory options: below it neither a kernel with numpy nor the grader's worker starts
MIN_MEM_MB = 256


def at_least(low, unit):
    """An argparse type: an integer of at least ``low`` (argparse names the option in the error)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer number of {unit}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected at least {low} {unit}, got {value}")
        return value
    return parse


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m preln.grade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("submissions")
    ap.add_argument("--roster", default=None, help="CSV with a column `student` (or `id`)")
    ap.add_argument("--out", default=str(nbtools.ROOT / "_build" / "grades" if nbtools.ROOT else Path("grades")),
                    help="where the CSVs and feedback go (default: _build/grades in a clone, ./grades elsewhere)")
    ap.add_argument("--course", default=None,
                    help="the instructor edition: a folder with nbgrader_config.py and source/<name>/<name>.ipynb "
                         f"(default: {nbtools.COURSE})")
    ap.add_argument("--assignment", action="append", default=None, help="grade only this assignment (repeatable)")
    ap.add_argument("--jobs", type=at_least(1, "students"), default=os.cpu_count() or 1, help="students graded at a time (default: cores)")
    ap.add_argument("--timeout", type=at_least(1, "seconds"), default=60, help="seconds per cell and per question's calls (default 60)")
    ap.add_argument("--call-timeout", type=at_least(1, "seconds"), default=10, help="seconds per call of an answer (default 10)")
    ap.add_argument("--mem-mb", type=at_least(MIN_MEM_MB, "MB"), default=2048, help="address space of each process in the sandbox")
    ap.add_argument("--cpu-s", type=at_least(1, "seconds"), default=600, help="CPU seconds of each process in the sandbox")
    ap.add_argument("--total-mem-mb", type=at_least(MIN_MEM_MB, "MB"), default=4096, help="memory of a sandbox's processes together")
    ap.add_argument("--worker-mem-mb", type=at_least(MIN_MEM_MB, "MB"), default=WORKER_MEM_MB,
                    help=f"address space of the grader's worker per student (default {WORKER_MEM_MB})")
    ap.add_argument("--notebook-s", type=at_least(1, "seconds"), default=1200,
                    help="seconds of all the work on one notebook, in the grader and its sandbox (default 1200)")
    ap.add_argument("--no-sandbox", action="store_true", help="grade without bubblewrap (unprotected; rows say so)")
    ap.add_argument("--no-feedback", action="store_true", help="skip the HTML feedback")
    ap.add_argument("--all-or-nothing", action="store_true",
                    help="a question scores its points only if every requirement passes (default: partial credit)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--verbose", action="store_true", help="print timings and the grader's tracebacks")
    ap.add_argument("--bwrap", default="bwrap", help="the bubblewrap executable (default: bwrap on PATH)")
    ap.add_argument("--secret-file", default=None,
                    help="a file whose first line is the course secret: re-seeds every hidden input "
                         "(default: $PRELN_COURSE_SECRET, else the published seeds; see book/running.md)")
    args = ap.parse_args(argv)
    if args.secret_file:
        from . import checks         # lazily, as grade() does: the plans import the whole package
        try:                         # the workers (and nbgrader's preprocessor) read it from here
            os.environ[checks.SECRET_ENV] = checks.read_secret(args.secret_file)
        except ValueError as e:
            ap.error(f"--{e}")
    if args.course:
        try:
            nbtools.use_course(args.course)
        except ValueError as e:
            ap.error(f"--{e}")
    return grade(args)
