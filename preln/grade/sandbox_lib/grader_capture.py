"""Runs in the student's kernel, inside the sandbox: call the answers on the grader's inputs.

The runner executes, after the student's cells, one cell per question:

    import grader_capture; grader_capture.run("q1", globals())

For each recorded call of the question (/job/calls/q1.json) it looks the function up in the
notebook's namespace, calls it on a fresh copy of the inputs (warnings silenced, a time limit per
call), and writes what happened to /work/.grader-out/<call id>.json at once: the returned value as
data (wire.py), or the exception's type and first line, or "timeout". Nothing is judged here: the
grader compares, outside. Whatever the student's code does to this module, numpy or the kernel
only changes the data sent, which still has to match references that never enter the sandbox.
"""
import json
import os
import signal
import time
import warnings

import numpy as np

import wire

JOB = os.environ.get("PRELN_GRADER_JOB", "/job")
#: where the runner puts the question's calls once the student's cells have run
CALLS = os.environ.get("PRELN_GRADER_CALLS", os.path.join(JOB, "calls"))
OUT = os.environ.get("PRELN_GRADER_OUT", "/work/.grader-out")


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


def run(question, namespace, call_timeout=None, budget=None):
    with open(os.path.join(CALLS, f"{question}.json")) as f:
        spec = json.load(f)
    call_timeout = call_timeout or spec.get("call_timeout", 10)
    deadline = time.monotonic() + (budget or spec.get("budget", 50))
    tree, blobs = wire.bundle_parts(spec["inputs"])
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
        limit = min(call_timeout, left)
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
        doc = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if c.get("errstate"):
                    with np.errstate(**c["errstate"]):
                        value = fn(*args, **kwargs)
                else:
                    value = fn(*args, **kwargs)
        except CallTimeout:
            doc = {"kind": "timeout", "message": f"{limit:.0f} s"}
            skip = "an earlier call of this question timed out"
        except BaseException as e:                          # noqa: BLE001: the answer's exception
            doc = {"kind": "raised", "exc_type": type(e).__name__, "message": _first_line(e)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        if doc is None:
            text, err = _bundle_result(value)
            doc = {"kind": "value", "value": text} if text is not None else \
                {"kind": "unsupported", "message": err}
        if c.get("keep_args"):
            text, err = _bundle_result((args, kwargs))
            doc["args_after"] = text
        _write(cid, doc)
