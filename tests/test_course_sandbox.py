"""The course edition, slow part 4 (`make test-course`): the bubblewrap sandbox a submission runs in.

One notebook of probes runs in the sandbox as a student's would (preln/grade/sandbox.py, the
runner and the kernel inside it): what it can see, write, reach and start. Then `make grade`
without a working bwrap refuses and says what to install, and --no-sandbox grades with every row
saying so (and refuses a class marked as hostile)."""
import csv
import ctypes
import json
import mmap
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
from preln.grade import autograde  # noqa: E402
from preln.grade import nbtools  # noqa: E402
from preln.grade import sandbox  # noqa: E402
from preln.grade import views  # noqa: E402

pytest.importorskip("nbgrader", reason="the course edition needs requirements-course.txt (make test-course)")

PROBES = f'''
import json, os, resource, socket, sys, time
def forks():                      # a fork bomb, bounded: children that stay
    n = 0
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    return n
found = {{}}
def probe(name, f):
    try:
        found[name] = f()
    except BaseException as e:
        found[name] = "error: " + type(e).__name__
probe("uid", os.getuid)
probe("repo_visible", lambda: os.path.exists({str(ROOT / "assignments" / "source")!r}))
probe("scripts_visible", lambda: os.path.exists({str(ROOT / "preln" / "grade" / "cli.py")!r}))
probe("venv_visible", lambda: os.path.exists(sys.prefix))
probe("write_venv", lambda: open(os.path.join(sys.prefix, "planted.py"), "w").write("x"))
probe("write_usr", lambda: open("/usr/planted", "w").write("x"))
probe("write_job", lambda: open("/job/planted", "w").write("x"))
probe("write_home", lambda: open("planted.txt", "w").write("x"))
probe("network", lambda: socket.create_connection(("1.1.1.1", 80), timeout=3) and "connected")
probe("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
probe("nproc", lambda: resource.getrlimit(resource.RLIMIT_NPROC)[0])
probe("as_mb", lambda: resource.getrlimit(resource.RLIMIT_AS)[0] // 2 ** 20)
probe("kill_init", lambda: os.kill(1, 9) or "killed")
probe("preln_file", lambda: __import__("preln").__file__)
probe("read_calls", lambda: os.listdir("/job/calls"))
probe("alloc_3gb", lambda: len(bytearray(3 * 2 ** 30)))
probe("forks", forks)
print("PROBES" + json.dumps(found))
'''


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sandbox")
    job = tmp / "job"
    (job / "calls").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(PROBES), nbformat.v4.new_code_cell("print('after the probes')")]
    nbformat.write(nb, str(job / "notebook.ipynb"))
    (job / "spec.json").write_text(json.dumps({"cells": [0, 1], "questions": []}))
    view = views.build_view(tmp / "view", [])
    ws = autograde.workspace(tmp / "ws")
    doc = sandbox.run_job(job, view, ws.lib, sandbox.Settings(cell_timeout=60, nproc=64))
    text = "".join(o.get("text", "") for o in doc["cells"]["0"]["outputs"] if o.get("output_type") == "stream")
    assert "PROBES" in text, doc["cells"]
    return json.loads(text.split("PROBES", 1)[1].strip().splitlines()[0]), doc, job


def test_bwrap_works_here():
    assert sandbox.probe() is None, sandbox.probe()


def test_the_repository_is_not_there(probed):
    found, _, _ = probed
    assert found["repo_visible"] is False and found["scripts_visible"] is False
    assert found["venv_visible"] is True                      # the Python environment is, read-only
    assert found["preln_file"].startswith("/grader/view/")    # the question's view, not the package


def test_the_hidden_calls_are_not_readable_by_the_notebook(probed):
    """As root, /job/calls is the runner's (read before it drops to the sandbox's uid): a student's
    cell cannot list or print the hidden inputs into its feedback (issue 22)."""
    found, _, _ = probed
    if os.geteuid() == 0:
        assert found["read_calls"] == "error: PermissionError", found["read_calls"]


def test_only_its_own_tmpfs_is_writable(probed):
    found, _, job = probed
    for key in ("write_venv", "write_usr", "write_job"):
        assert str(found[key]).startswith("error: "), (key, found[key])
    assert found["write_home"] == 1
    assert not (job / "planted").exists() and not (Path(sys.prefix) / "planted.py").exists()


def test_no_network_own_pids_no_root(probed):
    found, _, _ = probed
    assert str(found["network"]).startswith("error: ")
    assert max(found["pids"]) < 100 and 1 in found["pids"]    # its own PID namespace
    assert found["uid"] != 0 and str(found["kill_init"]).startswith("error: ")
    assert found["nproc"] == 64 and found["as_mb"] == 2048
    assert found["alloc_3gb"] == "error: MemoryError"         # beyond the address-space cap


def test_processes_are_bounded(probed):
    found, doc, _ = probed
    assert isinstance(found["forks"], str) and found["forks"].startswith("error: ")   # fork bomb: EAGAIN
    assert doc["cells"]["1"]["status"] == "ok"                # the notebook went on


def _class(tmp, students):
    subs = tmp / "class"
    for s in students:
        shutil.copytree(ROOT / "tests" / "fixtures" / "course" / "submissions" / s / "derivation_ops",
                        subs / s / "derivation_ops")
    return subs


def test_grade_refuses_without_bwrap(tmp_path):
    subs = _class(tmp_path, ["alice"])
    res = subprocess.run([sys.executable, "-m", "preln.grade", str(subs), "--out",
                          str(tmp_path / "out"), "--bwrap", "/nonexistent/bwrap"], capture_output=True, text=True)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "bubblewrap" in res.stderr and "--no-sandbox" in res.stderr
    assert not (tmp_path / "out" / "derivation_ops.csv").exists()


def test_no_sandbox_says_so_and_refuses_a_hostile_class(tmp_path):
    subs = _class(tmp_path, ["alice"])
    roster = tmp_path / "roster.csv"
    roster.write_text("student\nalice\nbob\n")
    res = subprocess.run([sys.executable, "-m", "preln.grade", str(subs), "--out", str(tmp_path / "out"),
                          "--roster", str(roster), "--no-sandbox", "--no-feedback", "--jobs", "1"],
                         capture_output=True, text=True)
    # 3: a file outside changed meanwhile (this shared tree may be edited while it runs; the check
    # itself is tested by test_course_grading.py), not this run's subject
    assert res.returncode in (0, 3), res.stdout[-2000:] + res.stderr[-2000:]
    with open(tmp_path / "out" / "derivation_ops.csv", newline="") as f:
        got = {r["student"]: r for r in csv.DictReader(f)}
    full = f"{nbtools.points(nbtools.read(nbtools.source_path('derivation_ops')))[0]:g}"
    assert got["alice"]["total"] == full and got["alice"]["status"] == "ok (not sandboxed: --no-sandbox)"
    assert got["bob"]["status"] == "missing"
    # the roster makes no CSV of `missing` rows for the assignments nobody handed in
    assert sorted(p.name for p in (tmp_path / "out").glob("*.csv")) == ["derivation_ops.csv"]
    (subs / ".hostile").write_text("attacks the grader\n")
    res = subprocess.run([sys.executable, "-m", "preln.grade", str(subs), "--out",
                          str(tmp_path / "out2"), "--no-sandbox"], capture_output=True, text=True)
    assert res.returncode == 2 and "sandboxed" in res.stderr


def test_the_nbgrader_config_plugs_in_the_sandbox():
    from traitlets.config.loader import PyFileConfigLoader
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(nbtools.COURSE)).load_config()
    pre = cfg.Autograde.autograde_preprocessors
    assert pre[0].__name__ == "SandboxedExecute" and "Execute" not in [p.__name__ for p in pre[1:]]
    assert "SaveAutoGrades" in [p.__name__ for p in pre]


def test_stock_nbgrader_autograde_gets_the_same_protection(tmp_path):
    """`nbgrader autograde` run in a course directory laid out like assignments/, elsewhere (the
    configuration imports the installed preln.grade): its SandboxedExecute grades the honest notebook,
    zeroes the cheats and gives a one-requirement mistake its partial credit, exactly as make grade does."""
    course = tmp_path / "assignments"
    shutil.copytree(nbtools.COURSE / "source" / "derivation_ops", course / "source" / "derivation_ops")
    shutil.copy(nbtools.COURSE / "nbgrader_config.py", course / "nbgrader_config.py")
    students = ("alice", "oscar", "nina", "lena")
    for student in students:
        dest = course / "submitted" / student / "derivation_ops"
        dest.mkdir(parents=True)
        shutil.copy(ROOT / "tests" / "fixtures" / "course" / "submissions" / student / "derivation_ops" /
                    "derivation_ops.ipynb", dest)
    env = {**__import__("os").environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    for cmd in (["generate_assignment", "derivation_ops", "--create", "--force"], ["autograde", "derivation_ops", "--create"]):
        res = subprocess.run([sys.executable, "-m", "nbgrader", *cmd], cwd=course, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        totals = {s: gb.find_submission("derivation_ops", s).score for s in students}
    # partial credit reaches nbgrader's gradebook too: lena's q1 loses its dtype point only (issue 32)
    full = nbtools.points(nbtools.read(nbtools.source_path("derivation_ops")))[0]
    assert totals == {"alice": full, "oscar": 0, "nina": 0, "lena": full - 1}, totals
    text = (course / "autograded" / "oscar" / "derivation_ops" / "derivation_ops.ipynb").read_text()
    assert "not available while your notebook is graded" in text and "HiddenCheckFailed" in text


KEYCTL = '''
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]     # add_key, keyctl
def add(payload):          # add_key("user", "relay", payload, KEY_SPEC_USER_KEYRING)
    return libc.syscall(NR[0], b"user", b"relay", payload, len(payload), -4)
def search():              # keyctl(KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, "user", "relay", 0)
    return libc.syscall(NR[1], 10, -4, b"user", b"relay", 0)
'''


def _run_cell(tmp, source, name, modules=()):
    job = tmp / name
    (job / "calls").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, str(job / "notebook.ipynb"))
    (job / "spec.json").write_text(json.dumps({"cells": [0], "questions": []}))
    view = views.build_view(tmp / f"view-{name}", list(modules))
    ws = autograde.workspace(tmp / "ws")
    doc = sandbox.run_job(job, view, ws.lib, sandbox.Settings(cell_timeout=60))
    return "".join(o.get("text", "") for o in doc["cells"]["0"]["outputs"] if o.get("output_type") == "stream")


def test_no_relay_through_the_keyring_between_sandboxes(tmp_path):
    """A notebook stores a key in its user keyring; the next sandbox (a new uid, keyrings cleared,
    a new session keyring) does not find it (issue 22: the relay between a student's notebooks)."""
    stored = _run_cell(tmp_path, KEYCTL + "print('ADDED', add(b'the package source'), search())", "first")
    added, seen = (int(x) for x in stored.split("ADDED", 1)[1].split()[:2])
    assert added > 0 and seen == added, stored        # the keyring works inside one sandbox
    found = _run_cell(tmp_path, KEYCTL + "print('FOUND', search())", "second")
    assert "FOUND -1" in found, found                 # ENOKEY (or keyctl refused): nothing carried over


def test_uids_are_new_per_sandbox(tmp_path):
    counter = tmp_path / "uid-counter"
    uids = [sandbox.next_uid(60000, counter) for _ in range(5)]
    assert len(set(uids)) == 5 and all(60000 <= u < 60000 + sandbox.UID_SPAN for u in uids)


#: the memfd attack, kept light: a small whole-sandbox cap and twice as much held in memfd files
#: (pages no process maps: RLIMIT_AS and a PSS sum do not see them; a cgroup does)
MEMFD_CAP_MB, MEMFD_HELD_MB = 512, 1024
MEMFD = f'''
import os
fds = []
for _ in range({MEMFD_HELD_MB // 64}):
    fds.append(os.memfd_create("hold"))
    os.write(fds[-1], b"x" * 2 ** 26)
print("HELD", len(fds) * 64)
'''


def _memfd_job(tmp):
    job = tmp / "memfd"
    (job / "calls").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(MEMFD)]
    nbformat.write(nb, str(job / "notebook.ipynb"))
    (job / "spec.json").write_text(json.dumps({"cells": [0], "questions": []}))
    view = views.build_view(tmp / "view-memfd", [])
    ws = autograde.workspace(tmp / "ws")
    return job, view, ws.lib, sandbox.Settings(cell_timeout=60, total_mem_mb=MEMFD_CAP_MB)


def _cgroups_left():
    return [d for m, t, _ in sandbox._mounts() if t.startswith("cgroup")
            for d in Path(m).rglob(f"{sandbox.CGROUP_PARENT}/job-*")]


def test_memory_in_memfd_files_is_counted_by_the_cgroup(tmp_path):
    """1 GB held in memfd files under a 512 MB cap: the kernel kills it at the cap, the row says so,
    and the sandbox's cgroup is gone afterwards (issue 22: memory the watchdog never sees)."""
    try:
        sandbox.Cgroup("probe", 64, 8).remove()
    except sandbox.CgroupUnavailable as e:
        pytest.fail(f"no cgroup here ({e}): the fallback is tested below; this host should have one")
    with pytest.raises(sandbox.SandboxFailure, match=rf"memory limit \({MEMFD_CAP_MB} MB\) exceeded"):
        sandbox.run_job(*_memfd_job(tmp_path))
    assert _cgroups_left() == []


def test_without_a_cgroup_the_fallback_warns_and_says_why(tmp_path, monkeypatch, capsys):
    """PRELN_GRADER_CGROUP=off (as where cgroups are missing): the PSS watchdog grades, with a warning
    naming why and what it cannot see; the memfd holder then gets through, which is the documented gap."""
    monkeypatch.setenv(sandbox.CGROUP_ENV, "off")
    monkeypatch.setattr(sandbox, "_WARNED", set())
    doc = sandbox.run_job(*_memfd_job(tmp_path))
    err = capsys.readouterr().err
    assert f"no cgroup for the sandbox's memory ({sandbox.CGROUP_ENV}=off)" in err and "memfd" in err, err
    assert "HELD 1024" in doc["cells"]["0"]["outputs"][0]["text"]
    with pytest.raises(sandbox.CgroupUnavailable, match="off"):
        sandbox.Cgroup("probe", 64, 8)


def test_a_cgroup_caps_processes_and_is_removed(tmp_path):
    cg = sandbox.Cgroup("probe-pids", 256, 5)
    try:
        res = subprocess.run(cg.wrap(["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 2 & done; wait"]),
                             capture_output=True, text=True, timeout=60)
        assert "fork" in res.stderr.lower() or "resource" in res.stderr.lower(), res.stderr
    finally:
        cg.remove()
    assert all(not d.exists() for d in cg.dirs) and _cgroups_left() == []


def _uids(counter, n, out):
    out.put([sandbox.next_uid(60000, counter) for _ in range(n)])


def test_uids_are_unique_across_concurrent_workers(tmp_path):
    """Four processes draw uids from one counter at once: no uid is handed out twice (the flock)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    workers = [ctx.Process(target=_uids, args=(tmp_path / "uid-counter", 50, out)) for _ in range(4)]
    for w in workers:
        w.start()
    got = [u for _ in workers for u in out.get(timeout=120)]
    for w in workers:
        w.join(30)
    assert len(got) == 200 and len(set(got)) == 200, sorted(got)


def test_no_key_outlives_the_run(tmp_path):
    """After a sandbox ends, its uid's user keyring is empty: checked as that uid from outside."""
    if os.geteuid() != 0:
        pytest.fail("this test needs the privileged path (root), as make test-course runs it")
    stored = _run_cell(tmp_path, KEYCTL + "import os\nprint('ADDED', add(b'the package source'), os.getuid())", "keep")
    added, uid = (int(x) for x in stored.split("ADDED", 1)[1].split()[:2])
    assert added > 0, stored
    # imports first (as root: the environment need not be readable by the uid), then become it
    probe = KEYCTL + f"import os\nos.setgroups([]); os.setgid({uid}); os.setuid({uid})\nprint(search())"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "-1", res.stdout + res.stderr


def test_a_killed_workers_cgroup_is_removed():
    """A worker killed at its time limit leaves its sandbox's cgroup: the grader removes it."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()

    def worker():
        cg = sandbox.Cgroup(f"job-{os.getpid()}-1", 128, 8)
        subprocess.Popen(cg.wrap(["sleep", "60"]))
        ready.set()
        time.sleep(60)
    w = ctx.Process(target=worker)
    w.start()
    assert ready.wait(30)
    assert _cgroups_left() != []
    from preln.grade import cli
    cli._kill_tree(w.pid)
    w.join(10)
    assert _cgroups_left() == []


# ---- issue 22, item 4: "unchanged" is judged from the grader's own files ------------------------
MAP_PROBE = r'''
import ctypes, errno, mmap, os, sys
import numpy as np
sys.path.insert(0, {lib!r})
import grader_capture
like = np.arange(1024, dtype=np.float64)
a = grader_capture._mapped({path!r}, like)
out = {{"equal": bool(np.array_equal(a, like)), "writeable": bool(a.flags.writeable)}}
try:
    a.setflags(write=True)
    out["setflags"] = "allowed"
except ValueError as e:
    out["setflags"] = str(e)
try:
    a += 1
    out["in_place"] = "allowed"
except ValueError as e:
    out["in_place"] = str(e)
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
page = a.ctypes.data & ~(mmap.PAGESIZE - 1)
rc = libc.mprotect(page, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE)
out["mprotect"] = errno.errorcode.get(ctypes.get_errno(), "?") if rc else "allowed"
print(out, flush=True)
ctypes.memset(a.ctypes.data, 0, 8)                # a write through a pointer: the process faults
print("WROTE", flush=True)
'''


def test_a_read_only_input_cannot_be_made_writable(tmp_path):
    """The harness maps a judged argument PROT_READ, MAP_SHARED from an O_RDONLY file: numpy will
    not set it writeable, an in-place operation raises, mprotect to write fails with EACCES, and a
    write through ctypes kills the process (SIGSEGV) without changing the file."""
    import numpy as np
    data = np.arange(1024, dtype=np.float64)
    path = tmp_path / "frozen-array"
    path.write_bytes(data.tobytes())
    os.chmod(path, 0o444)
    lib = autograde.workspace(tmp_path / "ws").lib
    res = subprocess.run([sys.executable, "-c", MAP_PROBE.format(lib=str(lib), path=str(path))],
                         capture_output=True, text=True, timeout=60)
    found = eval(res.stdout.splitlines()[0])                    # noqa: S307: the probe's own dict
    assert found["equal"] and not found["writeable"], found
    assert "WRITEABLE" in found["setflags"] and "read-only" in found["in_place"], found
    assert found["mprotect"] == "EACCES", found
    assert res.returncode == -signal.SIGSEGV and "WROTE" not in res.stdout, (res.returncode, res.stdout)
    assert path.read_bytes() == data.tobytes()


def _graded(nb, name, settings=None):
    from preln.grade import checks
    plan = checks.plan_for(nbtools.source_path(name))
    settings = settings or sandbox.Settings(cell_timeout=60)
    verdicts, outputs, _ = autograde.grade_notebook(nb, plan, settings)
    return verdicts, outputs


def test_an_in_place_adam_is_told_which_arguments_it_wrote():
    """preln_vs_postln q2 without the harness patch (fixture student bea has one): theta, m and v
    reach the "new arrays" checks read-only, its first in-place write raises, the check names the arguments it
    tried to write; a cell cannot list the folder of the read-only files; q3's honest answer, which
    returns a new dict, passes its `unchanged` checks on read-only arrays."""
    from preln.grade import make_fixtures as mf
    name = "preln_vs_postln"
    release, source = nbtools.read(nbtools.release_path(name)), nbtools.read(nbtools.source_path(name))
    nb = mf.add_cell(mf.filled(release, source, {"q2_adam": mf.IN_PLACE_ADAM}), '''
import os
try:
    print("FROZEN", os.listdir("/job/frozen"))
except OSError as e:
    print("FROZEN", type(e).__name__)''')
    verdicts, outputs = _graded(nb, name)
    lines = "\n".join(verdicts["q2"].lines(limit=50))
    assert "arguments `theta`, `m`, `v` were written in place; the task asks for new arrays" in lines, lines
    # partial credit (issue 32): writing in place costs the "new arrays" requirement, nothing else
    assert lines.startswith("Score: 4 of 5 points.") and "- NOT MET: new arrays (1 point)" in lines, lines
    assert not verdicts["q2"].harness_uses           # no patch here: the read-only inputs did it
    assert all(verdicts[q].passed for q in ("q1", "q3", "q4", "q5")), {q: v.lines() for q, v in verdicts.items()}
    printed = json.dumps(outputs)
    if os.geteuid() == 0:
        assert "FROZEN PermissionError" in printed, printed[:2000]


def test_code_that_names_the_harness_gets_no_credit():
    from preln.grade import namecheck
    uses = namecheck.harness_uses
    assert uses(["import grader_capture\ngrader_capture._bundle_result = len"]) == ["grader_capture (a name)"]
    assert uses(["m = sys.modules['grader_' + 'cap' + f'ture']"]) == ["grader_capture (in a string)"]
    assert uses(["p = open('/grader/lib/grader_runner.py')"]) == ["/grader/lib (in a string)", "grader_runner (in a string)"]
    assert uses(["g = globals()['_grader_capture']"]) == ["grader_capture (in a string)"]
    # a name split across a long concatenation is still found, in linear time
    long = "x = " + " + ".join(["'ab'"] * 400) + " + 'grader_' + 'capture'\n"
    assert uses([long]) == ["grader_capture (in a string)"]
    # a comment, another name, magics: nothing
    assert uses(["# grader_capture is the grader's\nimport wire_less as w\n%time x = 1\n", None]) == []


def test_the_relay_through_a_persistent_keyring_finds_nothing(tmp_path):
    """Fixture student kai's two cells: the first (a view holding preln.ops) stores softmax.py in its
    user, user-session, session and persistent keyrings, readable by anyone; the second, in the next
    sandbox, searches them and /proc/keys. The persistent keyring outlives its processes by days:
    the grader clears it as well (issue 22, the relay between a student's notebooks)."""
    from preln.grade import make_fixtures as mf
    stored = _run_cell(tmp_path, mf.RELAY_STORE, "store", modules=["preln.ops"])
    assert "RELAY stored 4 keys" in stored, stored              # every keyring took the key
    found = _run_cell(tmp_path, mf.RELAY_FETCH, "fetch")
    assert "RELAY nothing" in found, found


# ---- issue 36, item 1: no relay through locks or the page cache's explicit probes -------------
CHANNELS = r'''
import ctypes, errno, fcntl, mmap, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
shared = os.path.join(sys.prefix, "pyvenv.cfg")          # a read-only file every sandbox sees
fd = os.open(shared, os.O_RDONLY)
def attempt(name, fn):
    try:
        fn()
        print("CHANNEL", name, "ok")
    except OSError as e:
        print("CHANNEL", name, errno.errorcode.get(e.errno, e.errno))
def check(r):
    if r < 0:
        raise OSError(ctypes.get_errno(), "")
lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 1, 0)
attempt("F_SETLK", lambda: fcntl.fcntl(fd, fcntl.F_SETLK, lock))
attempt("F_GETLK", lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock))
attempt("F_OFD_SETLK", lambda: fcntl.fcntl(fd, 37, lock))
attempt("flock", lambda: fcntl.flock(fd, fcntl.LOCK_SH))
attempt("fadvise", lambda: os.posix_fadvise(fd, 0, 4096, os.POSIX_FADV_DONTNEED))
attempt("RWF_NOWAIT", lambda: os.preadv(fd, [bytearray(8)], 0, os.RWF_NOWAIT))
page = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
vec = ctypes.create_string_buffer(1)
attempt("mincore", lambda: check(libc.mincore(ctypes.c_void_p(page), 4096, vec)))
attempt("MADV_PAGEOUT", lambda: check(libc.madvise(ctypes.c_void_p(page), 4096, 21)))
attempt("inotify", lambda: check(libc.inotify_init1(0)))
attempt("io_uring", lambda: check(libc.syscall(425, 4, ctypes.create_string_buffer(120))))
attempt("pread", lambda: os.pread(fd, 8, 0))                                   # what code needs still works
attempt("preadv", lambda: os.preadv(fd, [bytearray(8)], 0))
attempt("MADV_DONTNEED", lambda: check(libc.madvise(ctypes.c_void_p(page), 4096, mmap.MADV_DONTNEED)))
'''
#: what each attempt of CHANNELS gets in the sandbox (io_uring_setup is 425 on x86_64 and aarch64)
REFUSED = {"F_SETLK": "ENOLCK", "F_GETLK": "ENOLCK", "F_OFD_SETLK": "ENOLCK", "flock": "EPERM",
           "fadvise": "EPERM", "RWF_NOWAIT": "ENOTSUP", "mincore": "EPERM", "MADV_PAGEOUT": "EPERM",
           "inotify": "EPERM", "io_uring": "EPERM", "pread": "ok", "preadv": "ok", "MADV_DONTNEED": "ok"}


def test_no_lock_or_page_cache_probe_reaches_a_shared_file(tmp_path):
    """Byte-range, OFD and flock locks (the lock relay between concurrent sandboxes), the page cache's
    explicit probes and eviction (the fadvise / RWF_NOWAIT relay between a student's notebooks),
    file events and io_uring are refused by the sandbox's seccomp filter; plain reads and mappings
    work (issue 36, item 1)."""
    if sandbox.seccomp_filter() is None:
        pytest.fail(f"no seccomp filter for {platform.machine()}: the channels are open here")
    out = _run_cell(tmp_path, CHANNELS, "channels")
    got = dict(line.split()[1:3] for line in out.splitlines() if line.startswith("CHANNEL"))
    assert got == REFUSED, got


# ---- issue 36, item 1: no bit left in the page cache for the next sandbox --------------------------
PAGE = mmap.PAGESIZE
#: pages the writer reads, far apart (each read also brings in its readahead window)
WRITER_PAGES, WRITER_STRIDE = 64, 256


def _resident_pages(path):
    """Pages of ``path`` in the page cache (mincore over a mapping, as util-linux's fincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
        libc.munmap(ctypes.c_void_p(addr), size)
        return sum(b & 1 for b in vec.raw)
    finally:
        os.close(fd)


@pytest.fixture
def evicted_shared_file():
    """A file in the Python environment (which every sandbox sees read-only) that nobody else
    reads, written, flushed and evicted from the page cache here (as root): none of it cached."""
    path = Path(sys.prefix) / f"preln-page-cache-probe-{os.getpid()}.bin"
    path.write_bytes(os.urandom(WRITER_PAGES * WRITER_STRIDE * PAGE))
    try:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        assert _resident_pages(path) == 0, path
        yield path
    finally:
        path.unlink()


def test_no_bit_is_left_in_the_page_cache_for_the_next_sandbox(tmp_path, evicted_shared_file):
    """A notebook reads pages of a large shared file that nobody had cached (the writer of a
    page-cache relay: a read sets a bit a later notebook can time); when its sandbox is gone, none
    of those pages is cached: its cgroup's file pages are evicted before the cgroup is removed."""
    try:
        sandbox.Cgroup("probe", 64, 8).remove()
    except sandbox.CgroupUnavailable as e:
        pytest.fail(f"no cgroup here ({e}): without one the page cache keeps what a sandbox read")
    path = evicted_shared_file
    writer = (f"import os\nfd = os.open({str(path)!r}, os.O_RDONLY)\n"
              f"print('READ', sum(len(os.pread(fd, 1, i * {WRITER_STRIDE * PAGE})) "
              f"for i in range({WRITER_PAGES})))")
    out = _run_cell(tmp_path, writer, "writer")
    assert f"READ {WRITER_PAGES}" in out, out                           # the reads happened
    assert _resident_pages(path) == 0, f"{_resident_pages(path)} pages of {path} still cached"


# --- issue 36, item 1: sandboxes of different views never run at the same time ------------------
#: seconds each sandbox stand-in holds the gate in the test below, and when each asks for it
GATE_HOLD_S, GATE_ASKS = 0.4, (("A", 0.0), ("A", 0.05), ("B", 0.1), ("A", 0.2))


def _hold_gate(view, path, delay, results):
    time.sleep(delay)
    with sandbox.ViewGate(view, path):
        t0 = time.monotonic()
        time.sleep(GATE_HOLD_S)
        results.put((view, t0, time.monotonic()))


def test_the_gate_lets_only_sandboxes_of_one_view_run_together(tmp_path):
    """Two sandboxes of the same view run together; one of another view waits until they are done,
    and a later one of the first view waits behind it (first come, first served: nobody starves)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_hold_gate, args=(v, tmp_path / "gate", d, results)) for v, d in GATE_ASKS]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    runs = sorted((results.get(timeout=5) for _ in procs), key=lambda r: r[1])
    assert [v for v, _, _ in runs] == ["A", "A", "B", "A"], runs
    (a1, s1, e1), (a2, s2, e2), (b, sb, eb), (a3, s3, e3) = runs
    assert s2 < e1, "two sandboxes of one view did not run together"
    assert sb >= max(e1, e2) and s3 >= eb, f"sandboxes of different views overlapped: {runs}"
    assert json.loads((tmp_path / "gate").read_text()) == {"view": None, "holders": [], "queue": []}


def _gate_state(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_a_dead_holder_does_not_keep_the_gate(tmp_path):
    """A grading worker killed while its sandbox held the gate (its notebook over the time limit)
    leaves an entry of a dead process: the next one ignores it."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    holder = ctx.Process(target=lambda: (sandbox.ViewGate("A", tmp_path / "gate").__enter__(), time.sleep(60)))
    holder.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _gate_state(tmp_path / "gate").get("holders"):
        time.sleep(0.02)
    assert _gate_state(tmp_path / "gate")["holders"], "the holder never took the gate"
    holder.kill()
    holder.join()
    t0 = time.monotonic()
    with sandbox.ViewGate("B", tmp_path / "gate"):
        assert time.monotonic() - t0 < 1.0


# --- issue 36, item 1: the channels that remain, measured (python -m preln.grade.bench_channels) ---
#: the benchmark's tiny mode: a few bits per channel, short slots, a small allocation
CHANNELS_TINY = ["--bits", "16", "--slot-bits", "16", "--slot-ms", "20", "--mem-slot-ms", "60", "--mem-mb", "32"]


def test_the_channel_benchmark_prints_a_row_per_channel():
    """The benchmark's table, in a tiny mode: one row per channel (page cache without and with the
    cgroup, CPU time, free memory), each with its bits, rate, error rate and capacities as numbers.
    What the numbers are is the machine's (no timing is asserted)."""
    res = subprocess.run([sys.executable, "-m", "preln.grade.bench_channels", *CHANNELS_TINY],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in res.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| channel")]
    assert [(r[0], "with the cgroup" in r[1]) for r in rows] == [
        ("page cache", False), ("page cache", True), ("CPU time", False), ("free memory (MemAvailable)", False)], rows
    for channel, _, bits, rate, error, cap, bound in rows:
        rate, error, cap, bound = float(rate), float(error), float(cap), float(bound)
        assert bits == "16" and rate > 0 and 0 <= error <= 1 and 0 <= bound <= cap <= rate, (channel, rate, error, cap)


def test_the_channel_decoder_reads_a_clean_signal_and_nothing_from_noise():
    """The benchmark's decoder: read times of cached (1) and uncached (0) pages give the message
    back; numbers that do not depend on the bits give no capacity once the error rate's sampling
    noise is allowed for (a fixed seed)."""
    import numpy as np
    from preln.grade import bench_channels as bc
    bits = bc.message(256)
    clean = [2_000 if b else 50_000 for b in bits]
    assert bc.decode(clean).tolist() == bits[len(bc.PREAMBLE):]
    assert bc.row("page cache", "clean", bits, 1.0, clean)["capacity"] == 256
    noise = np.random.default_rng(0).lognormal(10, 0.3, len(bits))
    got = bc.row("page cache", "noise", bits, 1.0, noise)
    assert 0.4 < got["error"] < 0.6 and got["bound"] == 0, got
