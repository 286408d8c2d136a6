"""Runs inside the sandbox: execute the student's notebook, then capture the answers' results.

    python /grader/lib/grader_runner.py        (job in /job: spec.json, notebook.ipynb, calls/)

nbclient and the kernel both run here, in the sandbox's own network namespace (ZMQ over its
private loopback); the grader outside only reads the one JSON document this prints on its
standard output when it is done (and treats it as untrusted data). Steps:

1. drop to the sandbox's uid when started as root (the grader runs bwrap privileged then), and
   cap this process and everything it starts (address space, CPU time, processes, file size);
2. start an ipykernel and execute the student's code cells in order, except the graded tests
   cells (their verdicts are computed by the grader) — each cell under a time limit;
3. per question, one capture cell (grader_capture.run) that calls the answers on the grader's
   inputs and writes the results to /work/.grader-out/;
4. when a cell times out or the kernel dies (os._exit, a crash, the memory cap), record it, start a
   fresh kernel, run the cells again without that one, and go on with the next question;
5. print {"cells": outputs per cell, "questions": status and results per question}.
"""
import copy
import json
import os
import resource
import signal
import sys
import time

from wire import MAX_PNG                       # the grader's own limit per figure (wire.py: both sides)

T_START = time.monotonic()
JOB = os.environ.get("PRELN_GRADER_JOB", "/job")
OUT = os.environ.get("PRELN_GRADER_OUT", "/work/.grader-out")
MAX_RESULT_FILE = 80 * 2 ** 20
#: what a cell's outputs keep, per text field and in all, and the notebook's outputs in all: a long
#: debugging print is cut (and says so), it does not fail the notebook. A figure is never cut (a cut
#: PNG is no image): kept whole up to MAX_PNG while the notebook's budget lasts, else replaced by
#: {"dropped": its size} for the grader to say so in the feedback
MAX_TEXT, MAX_CELL_OUTPUT, MAX_OUTPUTS = 64 * 1024, 256 * 1024, 8 * 2 ** 20
#: seconds an interrupted kernel has to answer again before it is restarted
RECOVER_S = 10


def drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("grader_runner: could not drop privileges")


#: keyctl(2): the syscall's number per machine, and the operations used
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "ppc64le": 311, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 1, 7, 22
KEY_SPEC_PROCESS_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -2, -4, -5


def fresh_keyrings():
    """Clear this uid's user and persistent keyrings (what an earlier sandbox with the uid may have left there) and
    join a new anonymous session keyring; a list of what could not be done (no keyctl: nothing to
    reach either)."""
    import ctypes
    import platform
    nr = _SYS_KEYCTL.get(platform.machine())
    if nr is None:
        return [f"keyctl: unknown on {platform.machine()}"]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    notes = []
    # the uid's persistent keyring outlives its processes by days: cleared too
    persistent = libc.syscall(ctypes.c_long(nr), ctypes.c_long(KEYCTL_GET_PERSISTENT), ctypes.c_long(-1),
                              ctypes.c_long(KEY_SPEC_PROCESS_KEYRING))
    todo = [(KEYCTL_CLEAR, KEY_SPEC_USER_KEYRING), (KEYCTL_CLEAR, KEY_SPEC_USER_SESSION_KEYRING),
            (KEYCTL_JOIN_SESSION_KEYRING, None)]
    if persistent > 0:
        todo.insert(0, (KEYCTL_CLEAR, persistent))
    for args in todo:
        if libc.syscall(ctypes.c_long(nr), ctypes.c_long(args[0]),
                        ctypes.c_long(args[1]) if args[1] is not None else ctypes.c_void_p(None)) < 0:
            notes.append(f"keyctl {args}: errno {ctypes.get_errno()}")
    return notes


def hand_over(calls, dest):
    os.makedirs(dest, mode=0o700, exist_ok=True)
    for name, data in calls.items():
        with open(os.path.join(dest, name), "wb") as f:
            f.write(data)


def set_limits(limits):
    for name, value in limits.items():
        res = getattr(resource, name)
        resource.setrlimit(res, (value, value))


def write_kernelspec(python, extra_env):
    kdir = os.path.join(os.environ["JUPYTER_PATH"], "kernels", "grader")
    os.makedirs(kdir, exist_ok=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--HistoryManager.hist_file=:memory:", "--HistoryManager.enabled=False"],
            "display_name": "grader", "language": "python", "env": extra_env}
    with open(os.path.join(kdir, "kernel.json"), "w") as f:
        json.dump(spec, f)


class Session:
    """One kernel: execute cells until it dies or a cell times out."""

    def __init__(self, nb, timeout, probe_index):
        from nbclient import NotebookClient
        self.probe_index = probe_index             # a `pass` cell at the end: is the kernel back?
        self.client = NotebookClient(nb, kernel_name="grader", timeout=timeout, allow_errors=True,
                                     interrupt_on_timeout=False, record_timing=False,
                                     shutdown_kernel="immediate", startup_timeout=120,
                                     iopub_timeout=10, raise_on_iopub_timeout=False,
                                     resources={"metadata": {"path": os.getcwd()}})

    def run(self, cell, index, timeout=None):
        """'ok', 'error', 'timeout' or 'died'."""
        from nbclient.exceptions import CellTimeoutError, DeadKernelError
        if timeout is not None:
            self.client.timeout = timeout
        try:
            self.client.execute_cell(cell, index)
        except CellTimeoutError:
            # interrupt the cell (KeyboardInterrupt in the kernel) and keep the kernel, its state and
            # the rest of the notebook: a slow experiment costs its cell, not a kernel session
            return "timeout" if self.recover(timeout) else "timeout_stuck"
        except DeadKernelError:
            return "died"
        except Exception as e:                              # noqa: BLE001: a broken channel, say
            return "died" if "kernel" in str(e).lower() else "error"
        return "error" if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) else "ok"

    def recover(self, timeout):
        from nbclient.util import run_sync
        try:
            run_sync(self.client.km.interrupt_kernel)()
            self.client.timeout = RECOVER_S
            probe = self.client.nb.cells[self.probe_index]
            self.client.execute_cell(probe, self.probe_index)
            return True
        except Exception:                                   # noqa: BLE001: it did not come back
            return False
        finally:
            if timeout is not None:
                self.client.timeout = timeout


def truncate(outputs, budget):
    """The outputs with every text field cut to MAX_TEXT, the cell's to MAX_CELL_OUTPUT and the
    notebook's to what is left of ``budget`` (a one-item list), each cut saying how much it left out;
    each PNG whole (charged to the notebook's budget only) or, past MAX_PNG or the budget, dropped."""
    allowance = min(MAX_CELL_OUTPUT, budget[0])
    left = [allowance]

    def image(png):
        if not isinstance(png, str):
            return png
        if len(png) > MAX_PNG or len(png) > budget[0] - (allowance - left[0]):
            return {"dropped": len(png)}
        budget[0] -= len(png)
        return png

    def cut(text):
        keep = max(0, min(MAX_TEXT, left[0]))
        if len(text) <= keep:
            left[0] -= len(text)
            return text
        left[0] -= keep
        return text[:keep] + f"\n[... {len(text) - keep} more characters not kept by the grader]\n"

    out = []
    for o in outputs:
        o = dict(o)
        for key in ("text", "evalue"):
            if isinstance(o.get(key), str):
                o[key] = cut(o[key])
        if isinstance(o.get("traceback"), list):
            o["traceback"] = [cut(str(line)) for line in o["traceback"][:200]]
        if isinstance(o.get("data"), dict):
            o["data"] = {k: image(v) if k == "image/png" else cut(v) if isinstance(v, str) else v
                         for k, v in o["data"].items()}
        out.append(o)
    budget[0] -= allowance - left[0]
    return out


def main():
    # jsonschema (imported by nbformat) would import rfc3987_syntax, which builds a grammar at import
    # time (seconds of CPU per run); nothing here validates IRIs
    sys.modules.setdefault("rfc3987_syntax", None)
    with open(os.path.join(JOB, "spec.json")) as f:
        spec = json.load(f)
    result_fd = os.dup(1)                          # the result channel: nothing else writes to it
    log = os.open(os.path.join(os.environ.get("PRELN_GRADER_TMP", "/tmp"), "grader-runner.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)                                # the kernel inherits 1 and 2: the log, not the channel
    os.dup2(log, 2)
    calls = None
    if spec.get("uid") is not None:
        # root still: read the calls (root-only files) now; they reach the kernel's reach only when
        # the capture cells run, after every student cell (whose outputs feedback shows)
        calls = {}
        for name in os.listdir(os.path.join(JOB, "calls")):
            with open(os.path.join(JOB, "calls", name), "rb") as f:
                calls[name] = f.read()
        drop_privileges(spec["uid"], spec["gid"])
        os.environ["PRELN_GRADER_CALLS"] = os.path.join(os.environ.get("PRELN_GRADER_TMP", "/tmp"), "calls")
    key_notes = fresh_keyrings() if spec.get("sandboxed") else []
    set_limits(spec["rlimits"])
    os.makedirs(OUT, exist_ok=True)
    write_kernelspec(sys.executable, {})

    import nbformat
    nb = nbformat.read(os.path.join(JOB, "notebook.ipynb"), as_version=4)
    cells = spec["cells"]                          # indices of the cells to execute, in order
    questions = spec["questions"]                  # question keys to capture, in order
    capture_at = {}
    for q in questions:                            # the capture cells go at the end of the notebook
        capture_at[q] = len(nb.cells)
        nb.cells.append(nbformat.v4.new_code_cell(
            f"import grader_capture as _grader_capture\n_grader_capture.run({q!r}, globals())"))
    probe_index = len(nb.cells)
    nb.cells.append(nbformat.v4.new_code_cell("pass"))
    budget = [MAX_OUTPUTS]
    cell_timeout, max_sessions = spec["cell_timeout"], spec["max_sessions"]
    status = {}                                    # cell index -> ok / error / timeout / died
    outputs = {}
    q_status = {}
    skip = set()
    t0 = time.monotonic()
    marks = {"imports": t0 - T_START}
    sessions = 0
    finished = False
    notes = list(key_notes)
    while sessions < max_sessions and not finished:
        sessions += 1
        if sessions > 1 and spec.get("sandboxed"):
            # what the last kernel left running (a fork bomb's children, say) goes first: in the
            # sandbox's own PID namespace, kill(-1) reaches every process but init and this one
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.2)
        try:
            session = Session(nb, cell_timeout, probe_index)
            broke = False
            with session.client.setup_kernel():
                marks.setdefault("kernel_started", time.monotonic() - t0)
                for i in cells:
                    if i in skip:
                        continue
                    cell = nb.cells[i]
                    st = session.run(cell, i)
                    cell.outputs = truncate(cell.get("outputs", []), budget) if i not in status else []
                    if i not in status:                # the first run of a cell is the one reported
                        status[i] = "timeout" if st == "timeout_stuck" else st
                        # a copy: nbclient rewrites an output in place when a later update_display_data
                        # names its display_id (a handle the answer could update with the hidden
                        # inputs while the calls run)
                        outputs[i] = copy.deepcopy(cell.outputs)
                    if st == "timeout":
                        skip.add(i)                    # interrupted, the kernel went on: not run again
                    if st in ("timeout_stuck", "died"):
                        skip.add(i)
                        broke = True
                        break
                if broke:
                    continue
                marks.setdefault("cells_done", time.monotonic() - t0)
                if calls is not None:
                    hand_over(calls, os.environ["PRELN_GRADER_CALLS"])
                    calls = None
                for q in questions:
                    if q in q_status:
                        continue
                    capture = nb.cells[capture_at[q]]
                    st = session.run(capture, capture_at[q], timeout=cell_timeout + 15)
                    q_status[q] = {"ok": "done", "error": "capture_error", "timeout_stuck": "timeout"}.get(st, st)
                    if st == "error":
                        q_status[q] = "capture_error:" + _error_text(capture)
                    if st in ("timeout_stuck", "died"):
                        broke = True
                        break
                finished = not broke
        except Exception as e:                      # noqa: BLE001: the kernel did not start, say
            notes.append(f"session {sessions}: {type(e).__name__}: {str(e)[:200]}")
    for q in questions:
        q_status.setdefault(q, "not_run")
    results = {}
    total = 0
    for name in sorted(os.listdir(OUT)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(OUT, name)
        size = os.path.getsize(path)
        total += size
        if size > MAX_RESULT_FILE or total > 4 * MAX_RESULT_FILE:
            continue
        with open(path) as f:
            try:
                results[name[:-5]] = json.load(f)
            except ValueError:
                results[name[:-5]] = {"kind": "corrupt"}
    marks["end"] = time.monotonic() - t0
    doc = {"version": 1, "marks": {k: round(v, 3) for k, v in marks.items()}, "cells": {str(i): {"status": status[i], "outputs": outputs.get(i, [])} for i in status},
           "questions": q_status, "results": results, "sessions": sessions, "notes": notes,
           "seconds": round(time.monotonic() - t0, 3)}
    data = json.dumps(doc).encode()
    with os.fdopen(result_fd, "wb") as f:
        f.write(data)
    os._exit(0)          # no interpreter teardown (ZMQ contexts, threads): the result is out


def _error_text(cell):
    for o in cell.get("outputs", []):
        if o.get("output_type") == "error":
            return f"{o.get('ename')}: {str(o.get('evalue'))[:200]}"
    return "unknown"


if __name__ == "__main__":
    main()
