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
import json
import os
import resource
import signal
import sys
import time

T_START = time.monotonic()
JOB = os.environ.get("PRELN_GRADER_JOB", "/job")
OUT = os.environ.get("PRELN_GRADER_OUT", "/work/.grader-out")
MAX_RESULT_FILE = 80 * 2 ** 20


def drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("grader_runner: could not drop privileges")


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

    def __init__(self, nb, timeout):
        from nbclient import NotebookClient
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
            return "timeout"
        except DeadKernelError:
            return "died"
        except Exception as e:                              # noqa: BLE001: a broken channel, say
            return "died" if "kernel" in str(e).lower() else "error"
        return "error" if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) else "ok"


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
    if spec.get("uid") is not None:
        drop_privileges(spec["uid"], spec["gid"])
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
    cell_timeout, max_sessions = spec["cell_timeout"], spec["max_sessions"]
    status = {}                                    # cell index -> ok / error / timeout / died
    outputs = {}
    q_status = {}
    skip = set()
    t0 = time.monotonic()
    marks = {"imports": t0 - T_START}
    sessions = 0
    finished = False
    notes = []
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
            session = Session(nb, cell_timeout)
            broke = False
            with session.client.setup_kernel():
                marks.setdefault("kernel_started", time.monotonic() - t0)
                for i in cells:
                    if i in skip:
                        continue
                    cell = nb.cells[i]
                    st = session.run(cell, i)
                    if i not in status:                # the first run of a cell is the one reported
                        status[i] = st
                        outputs[i] = cell.get("outputs", [])
                    if st in ("timeout", "died"):
                        skip.add(i)
                        broke = True
                        break
                if broke:
                    continue
                marks.setdefault("cells_done", time.monotonic() - t0)
                for q in questions:
                    if q in q_status:
                        continue
                    capture = nb.cells[capture_at[q]]
                    st = session.run(capture, capture_at[q], timeout=cell_timeout + 15)
                    q_status[q] = {"ok": "done", "error": "capture_error"}.get(st, st)
                    if st == "error":
                        q_status[q] = "capture_error:" + _error_text(capture)
                    if st in ("timeout", "died"):
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
