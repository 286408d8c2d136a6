"""Runs in the student's kernel, inside the sandbox: call the answers on the grader's inputs.

The runner executes, after the student's cells, one cell per question:

    import grader_capture; grader_capture.run("q1", globals())

For each recorded call of the question (/job/calls/q1.json) it looks the function up in the
notebook's namespace, calls it on a fresh copy of the inputs (warnings silenced, a time limit per
call), and writes what happened to /work/.grader-out/<call id>.json at once: the returned value as
data (wire.py), or the exception's type and first line, or "timeout". The arguments an
``unchanged`` check judges are not copies: each of their arrays is a read-only mapping of a file
the grader wrote under /job/frozen (a read-only bind mount), so a write in place raises and the
grader, which re-reads those files after the run, compares bytes it holds; when the answer raised
numpy's read-only error, it is called once more on writable copies to name the arguments it
writes (a message, never a pass). Nothing is judged here: the grader compares, outside. Whatever the student's code does to this module, numpy or the kernel
only changes the data sent, which still has to match references that never enter the sandbox.
"""
import json
import mmap
import os
import signal
import time
import warnings

import numpy as np

import wire
from course import running    # preln/course.py, copied beside this file: call_within's limits

JOB = os.environ.get("PRELN_GRADER_JOB", "/job")
#: where the runner puts the question's calls once the student's cells have run
CALLS = os.environ.get("PRELN_GRADER_CALLS", os.path.join(JOB, "calls"))
OUT = os.environ.get("PRELN_GRADER_OUT", "/work/.grader-out")
#: the grader's files of the arguments an ``unchanged`` check judges (root's, read-only, named by
#: tokens only the calls carry): handed to the answer as read-only mappings
FROZEN = os.path.join(JOB, "frozen")


class CallTimeout(BaseException):
    """Raised in the student's function when its time is up."""


def _alarm(signum, frame):
    raise CallTimeout()


def _write(call_id, doc):
    os.makedirs(OUT, exist_ok=True)
    tmp = os.path.join(OUT, f".{call_id}.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, os.path.join(OUT, f"{call_id}.json"))


def _first_line(e):
    try:
        text = str(e)
    except Exception:                                      # noqa: BLE001: a hostile __str__
        text = ""
    return text.strip().split("\n")[0][:200]


def _bundle_result(value):
    try:
        tree, blobs = wire.encode_result(value)
    except wire.WireError as e:
        return None, str(e)
    return wire.dumps(tree, blobs), None


#: numpy's words for a write into an array it cannot write (in place, through out=, or a flag change)
READ_ONLY_WORDS = ("read-only", "readonly", "WRITEABLE")


def _mapped(path, like):
    """The array ``like`` (its dtype and shape) as a read-only mapping of the grader's file: opened
    O_RDONLY on a read-only bind mount and mapped PROT_READ, MAP_SHARED, so numpy cannot set it
    writeable, mprotect cannot make it writable (EACCES) and a write through a pointer faults."""
    if like.nbytes == 0:                                    # mmap cannot map an empty file
        a = np.empty(like.shape, like.dtype)
        a.flags.writeable = False
        return a
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if os.fstat(fd).st_size != like.nbytes:
            raise ValueError(f"the grader's read-only input {os.path.basename(path)} has the wrong size")
        mm = mmap.mmap(fd, like.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=like.dtype).reshape(like.shape)


def _arg_slot(args, kwargs, which):
    if isinstance(which, int):
        return which < len(args)
    return which in kwargs


def _read_only(args, kwargs, frozen):
    """The call's arguments with those an ``unchanged`` check judges replaced by read-only
    mappings of the grader's files (one per array, in map_arrays' order)."""
    args = list(args)
    for item in frozen:
        which, files = item["arg"], iter(item["files"])
        if not _arg_slot(args, kwargs, which):
            continue
        swap = lambda a: _mapped(os.path.join(FROZEN, next(files)), a)   # noqa: E731
        if isinstance(which, int):
            args[which] = wire.map_arrays(args[which], swap)
        else:
            kwargs[which] = wire.map_arrays(kwargs[which], swap)
    return tuple(args), kwargs


def _invoke(fn, args, kwargs, c, limit):
    """(value, None) or (None, the document of what went wrong, the exception or None)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with running(c.get("errstate")):                # numpy's error state, call_within's limits
                return fn(*args, **kwargs), None, None
    except CallTimeout:
        return None, {"kind": "timeout", "message": f"{limit:.0f} s"}, None
    except BaseException as e:                              # noqa: BLE001: the answer's exception
        return None, {"kind": "raised", "exc_type": type(e).__name__, "message": _first_line(e)}, e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _written(fn, tree, blobs, c, limit):
    """Which read-only arguments the answer tried to write: called once more on writable copies,
    the arguments that differ afterwards. Only names them in the feedback; the verdict does not
    depend on it (the write already failed)."""
    args, kwargs = wire.decode(tree, blobs, trusted=False)
    before = wire.decode(tree, blobs, trusted=False)
    _invoke(fn, args, kwargs, c, limit)
    out = []
    for item in c["frozen"]:
        w = item["arg"]
        if not _arg_slot(args, kwargs, w):
            continue
        a, b = (args[w], before[0][w]) if isinstance(w, int) else (kwargs[w], before[1][w])
        try:
            if _bundle_result(a) != _bundle_result(b):
                out.append(w)
        except Exception:                                   # noqa: BLE001: an odd argument
            out.append(w)
    return out


def run(question, namespace, call_timeout=None, budget=None):
    with open(os.path.join(CALLS, f"{question}.json")) as f:
        spec = json.load(f)
    call_timeout = call_timeout or spec.get("call_timeout", 10)
    deadline = time.monotonic() + (budget or spec.get("budget", 50))
    tree, blobs = wire.bundle_parts(spec["inputs"])
    # an earlier answer this question may call is the grader's reference while its calls run
    # (preln.course.in_place_of: no cascade), the student's own again afterwards
    provided = wire.decode(tree[spec["provide"]], blobs, trusted=False) if "provide" in spec else {}
    saved = {n: namespace[n] for n in provided if n in namespace}
    namespace.update(provided)
    try:
        _calls(spec, tree, blobs, namespace, call_timeout, deadline)
    finally:
        for n in provided:
            namespace.pop(n, None)
        namespace.update(saved)


def _calls(spec, tree, blobs, namespace, call_timeout, deadline):
    skip = None
    for c in spec["calls"]:
        cid = c["id"]
        if skip:
            _write(cid, {"kind": "skipped", "message": skip})
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            skip = "the question's time limit was used up by earlier calls"
            _write(cid, {"kind": "skipped", "message": skip})
            continue
        fn = namespace.get(c["fn"])
        if not callable(fn):
            _write(cid, {"kind": "missing", "message": c["fn"]})
            continue
        args, kwargs = wire.decode(tree[c["input"]], blobs, trusted=False)
        if c.get("frozen"):
            try:
                args, kwargs = _read_only(args, kwargs, c["frozen"])
            except (OSError, ValueError) as e:
                _write(cid, {"kind": "skipped", "message": f"the grader's read-only inputs: {_first_line(e)}"})
                continue
        limit = min(call_timeout, left)
        value, doc, exc = _invoke(fn, args, kwargs, c, limit)
        if doc is not None and doc["kind"] == "timeout":
            skip = "an earlier call of this question timed out"
        if doc is None:
            text, err = _bundle_result(value)
            doc = {"kind": "value", "value": text} if text is not None else \
                {"kind": "unsupported", "message": err}
        elif (exc is not None and c.get("frozen") and isinstance(exc, ValueError)
              and any(w in doc["message"] for w in READ_ONLY_WORDS)):
            left = deadline - time.monotonic()
            doc["written"] = _written(fn, tree[c["input"]], blobs, c, min(call_timeout, left)) if left > 0 else []
        if c.get("keep_args"):
            text, err = _bundle_result((args, kwargs))
            doc["args_after"] = text
        _write(cid, doc)
