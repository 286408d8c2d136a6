"""Run one student notebook in a bubblewrap sandbox, and read back what it produced as data.

    settings = Settings(cell_timeout=60, mem_mb=2048)
    doc = run_job(job_dir, view_dir, lib_dir, settings, slot=0)   # raises SandboxFailure

The sandbox (``bwrap``, Linux namespaces; Debian/Ubuntu package ``bubblewrap``) sees, read-only:
/usr (the system's libraries), the Python environment (this venv and its base interpreter),
the job (the student's notebook, hidden parts removed, and the grader's inputs), the grader's
in-sandbox library and the question's view of preln; read-write only a private /tmp and /work,
both size-capped tmpfs that vanish with it. It has its own PID, network (loopback only), IPC and
UTS namespaces, a new session, and dies with its parent. The repository, assignments/, the
gradebook, the CSVs and other students' files are simply not there.

Inside, grader_runner.py caps every process (address space ``mem_mb``, CPU ``cpu_s``, ``nproc``
processes, file size) — as root the grader runs bwrap privileged and the runner drops to an
unprivileged uid of its own first, since RLIMIT_NPROC does not bind root and counts per uid: a new
one per sandbox (:func:`next_uid`, a counter shared by every grader on the host, under a lock), so
no two sandboxes, concurrent or of one run, share a uid; and the runner then clears that uid's
user keyrings and joins a new session keyring, so nothing a sandbox stores in a keyring reaches
a later one. A seccomp filter (:func:`seccomp_filter`) refuses file locks, the page cache's
explicit probes and eviction, file events and io_uring: state every sandbox shares (a read lock on
the venv's files, a page's residency) carries no bit that way.
Outside, a watchdog kills the whole sandbox when its processes together hold more than
``total_mem_mb`` of memory, or when it runs longer than ``wall_s``. The only thing read back is the
runner's JSON document on the sandbox's standard output (at most ``max_result_mb``).
"""
import contextlib
import dataclasses
import errno
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: "
                "`sudo dnf install bubblewrap`) and allow unprivileged user namespaces (Ubuntu >= 23.10: "
                "`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile for "
                "bwrap); or grade without protection with --no-sandbox (book/running.md)")


@dataclasses.dataclass
class Settings:
    cell_timeout: int = 60          # seconds per cell of the notebook, and per question's calls
    call_timeout: int = 10          # seconds per call of an answer
    mem_mb: int = 2048              # address space of each process in the sandbox
    cpu_s: int = 600                # CPU seconds of each process
    nproc: int = 64                 # processes and threads in the sandbox
    total_mem_mb: int = 4096        # resident memory of all the sandbox's processes together
    tmp_mb: int = 512               # each of /tmp and /work
    wall_s: int = 900               # one sandbox run, at most
    max_sessions: int = 4           # kernels started (restarts after a death or a timeout)
    max_result_mb: int = 64         # what the sandbox may send back
    sandbox: bool = True            # False: --no-sandbox (same runner, no namespaces)
    uid_base: int = 60000           # as root: each sandbox runs as a new uid in [uid_base, uid_base + UID_SPAN)
    bwrap: str = "bwrap"


class SandboxFailure(Exception):
    """The sandbox produced no usable result; the message says why, for the CSV's status."""


def _python_roots():
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.exec_prefix).resolve()}
    exe = Path(sys.executable)
    roots.add(exe.resolve().parent.parent)                 # the interpreter the venv links to
    return sorted(roots)


def _system_binds():
    args = []
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        p = Path(d)
        if p.is_symlink():
            args += ["--symlink", os.readlink(d), d]
        elif p.is_dir():
            args += ["--ro-bind", d, d]
    # /etc 0755 (bwrap would make it 0700, unreadable by the sandbox's uid when the grader is root)
    args += ["--ro-bind", "/usr", "/usr", "--perms", "0755", "--dir", "/etc"]
    for f in ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf"):
        if Path(f).exists():
            args += ["--ro-bind", f, f]
    if Path("/etc/fonts").is_dir():              # matplotlib's font search (fc-list): the system's fonts
        args += ["--ro-bind", "/etc/fonts", "/etc/fonts"]
    return args


def _dirs_for(dest, made):
    """--dir ops (mode 0755) for the ancestors of ``dest`` that bwrap would otherwise create 0700."""
    out = []
    parts = Path(dest).parts
    for i in range(2, len(parts)):
        d = str(Path(*parts[:i]))
        if d not in made and not d.startswith(("/usr", "/proc", "/dev")):
            made.add(d)
            out += ["--perms", "0755", "--dir", d]
    return out


#: matplotlib's backend in the sandbox: the inline one a notebook has (JupyterLab's default), so that
#: a figure shown with plt.show(), or left open at the end of a cell, reaches the feedback
MPL_BACKEND = "module://matplotlib_inline.backend_inline"


def environment(job, out, tmp, view, lib):
    venv_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": f"{tmp}/home", "USER": "student",
        "LOGNAME": "student", "LANG": "C.UTF-8", "PYTHONPATH": f"{view}:{lib}",
        "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1", "NUMBA_CACHE_DIR": f"{tmp}/numba", "MPLBACKEND": MPL_BACKEND,
        "MPLCONFIGDIR": f"{tmp}/mpl", "JUPYTER_PATH": f"{tmp}/jupyter", "JUPYTER_RUNTIME_DIR": f"{tmp}/jupyter/runtime",
        "JUPYTER_CONFIG_DIR": f"{tmp}/jupyter/config", "JUPYTER_DATA_DIR": f"{tmp}/jupyter/data",
        "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": f"{tmp}/ipython", "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "PRELN_GRADER_JOB": job, "PRELN_GRADER_OUT": out, "PRELN_GRADER_TMP": tmp,
    }


#: the student's working directory (and HOME) inside the sandbox: a size-capped tmpfs
WORK = "/home/student"


# ---- what no sandbox may do: relay through state that every sandbox shares (issue 36, item 1) ----
#: seccomp's audit architecture per machine, and the numbers of the system calls the filter judges
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR = {
    "x86_64": {"fcntl": 72, "flock": 73, "madvise": 28, "mincore": 27, "fadvise64": 221, "preadv2": 327,
               "pwritev2": 328, "cachestat": 451, "inotify_init": 253, "inotify_init1": 294,
               "fanotify_init": 300, "io_uring_setup": 425, "process_madvise": 440, "move_pages": 279},
    "aarch64": {"fcntl": 25, "flock": 32, "madvise": 233, "mincore": 232, "fadvise64": 223, "preadv2": 286,
                "pwritev2": 287, "cachestat": 451, "inotify_init1": 26, "fanotify_init": 262,
                "io_uring_setup": 425, "process_madvise": 440, "move_pages": 239},
}
#: refused outright: file locks (flock), page-cache probes and eviction (mincore, cachestat,
#: fadvise, process_madvise, move_pages' page status), file-access events (inotify, fanotify), and
#: io_uring, whose operations (reads with RWF_NOWAIT, fadvise, madvise) no filter would see
REFUSED_CALLS = ("flock", "mincore", "cachestat", "fadvise64", "process_madvise", "move_pages",
                 "inotify_init", "inotify_init1", "fanotify_init", "io_uring_setup")
#: ENOSYS, so that glibc falls back to preadv/pwritev: preadv2's RWF_NOWAIT tells a cached page
NOSYS_CALLS = ("preadv2", "pwritev2")
#: fcntl's lock and lease commands (F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK/SETLK/SETLKW,
#: F_SETLEASE, F_GETLEASE): a read lock on a shared read-only file is a bit another sandbox reads
LOCK_COMMANDS = (5, 6, 7, 36, 37, 38, 1024, 1025)
#: madvise's advice that evicts a file's pages from the page cache (MADV_COLD, MADV_PAGEOUT)
EVICT_ADVICE = (20, 21)
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06           # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000


def seccomp_filter(machine=None):
    """The sandbox's seccomp filter (classic BPF, as bwrap --seccomp reads it), or None on a machine
    whose system call numbers are not listed here. Another architecture's calls (x86_64's x32 and
    i386 entry points) are refused."""
    machine = machine or platform.machine()
    if machine not in _NR:
        return None
    nr = _NR[machine]

    def deny(code):
        return [(_RET, 0, 0, _ERRNO | code)]

    def by_arg(call, offset, values, code):
        """``call`` refused with ``code`` when its argument at ``offset`` is one of ``values``."""
        body = [(_LD, 0, 0, offset)]
        for v in values:
            body += [(_JEQ, 0, 1, v)] + deny(code)
        return [(_JEQ, 0, len(body) + 1, nr[call])] + body + [(_RET, 0, 0, _ALLOW)]

    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, _ARCH[machine])] + deny(errno.ENOSYS) + [(_LD, 0, 0, 0)]
    if machine == "x86_64":                                 # x32's numbers have bit 30 set
        prog += [(_JGE, 0, 1, 0x40000000)] + deny(errno.ENOSYS)
    for name in REFUSED_CALLS + NOSYS_CALLS:
        if name in nr:
            prog += [(_JEQ, 0, 1, nr[name])] + deny(errno.ENOSYS if name in NOSYS_CALLS else errno.EPERM)
    # seccomp_data: nr (0), arch (4), ip (8), args[i] at 16 + 8 i (the low word first)
    prog += by_arg("fcntl", 24, LOCK_COMMANDS, errno.ENOLCK) + by_arg("madvise", 32, EVICT_ADVICE, errno.EPERM)
    prog += [(_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def seccomp_fd():
    """A pipe's read end holding :func:`seccomp_filter` for bwrap --seccomp (None without one)."""
    prog = seccomp_filter()
    if prog is None:
        return None
    r, w = os.pipe()
    os.write(w, prog)                                       # a few hundred bytes: within the pipe's buffer
    os.close(w)
    return r


def bwrap_command(job_dir, view_dir, lib_dir, settings, privileged, seccomp=None):
    size = str(settings.tmp_mb * 2 ** 20)
    made = {"/home"}
    args = [settings.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if privileged:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    # the writable places first, so that no read-only bind below them is hidden by them
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp",
             "--perms", "0755", "--dir", "/home",
             "--perms", "1777", "--size", size, "--tmpfs", WORK]
    args += _system_binds()
    for root in _python_roots():
        if str(root).startswith("/usr/"):
            continue
        args += _dirs_for(root, made) + ["--ro-bind", str(root), str(root)]
    # preln installed from a wheel lies inside the environment bound above, with the whole package
    # (the implementations a view withholds) and preln/grade/edition (the solutions): hide it; the
    # question's view on PYTHONPATH is the only preln there
    from .views import PACKAGE
    if any(PACKAGE == r or r in PACKAGE.parents for r in _python_roots()):
        args += ["--tmpfs", str(PACKAGE)]
    args += ["--perms", "0755", "--dir", "/grader"]
    args += ["--ro-bind", str(view_dir), "/grader/view", "--ro-bind", str(lib_dir), "/grader/lib",
             "--ro-bind", str(job_dir), "/job",
             "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(64 * 2 ** 20), "--tmpfs", "/dev/shm",
             "--chdir", WORK, "--clearenv"]
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    for k, v in environment("/job", f"{WORK}/.grader-out", "/tmp", "/grader/view", "/grader/lib").items():
        args += ["--setenv", k, v]
    args += ["--setenv", "HOME", WORK]
    args += ["--", sys.executable, "-s", "-B", "/grader/lib/grader_runner.py"]
    return args


def probe(settings=None):
    """None if bwrap can build this sandbox here, else the reason (with what to install)."""
    settings = settings or Settings()
    exe = shutil.which(settings.bwrap)
    if exe is None:
        return f"`{settings.bwrap}` is not installed: {INSTALL_HINT}"
    import tempfile
    with tempfile.TemporaryDirectory(prefix="preln-probe-") as tmp:
        for d in ("view", "lib", "job"):
            (Path(tmp) / d).mkdir()
            os.chmod(Path(tmp) / d, 0o755)
        os.chmod(tmp, 0o755)
        fd = seccomp_fd()
        cmd = bwrap_command(Path(tmp) / "job", Path(tmp) / "view", Path(tmp) / "lib", settings,
                            privileged=os.geteuid() == 0, seccomp=fd)
        cmd = cmd[:cmd.index("--") + 1] + [sys.executable, "-c", "import numpy; print('ok')"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, pass_fds=() if fd is None else (fd,))
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap could not start ({e}): {INSTALL_HINT}"
        finally:
            if fd is not None:
                os.close(fd)
    if res.returncode != 0 or res.stdout.strip() != "ok":
        return f"bwrap cannot create the sandbox here ({res.stderr.strip()[:300] or res.returncode}): {INSTALL_HINT}"
    return None


UID_SPAN = 30000
UID_COUNTER = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/tmp")


def next_uid(base, counter=None):
    """A uid no other sandbox on this host has now: the next of a counter (a root-only file, under
    flock) shared by every grader process, so it repeats only after UID_SPAN sandboxes."""
    import fcntl
    path = Path(counter or UID_COUNTER / "preln-grader-uid")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 32).decode(errors="replace").strip()
        n = int(raw) if raw.isdigit() else 0
        while True:
            n = (n + 1) % UID_SPAN
            uid = base + n
            if uid != 65534:                                # not nobody's
                break
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(n).encode())
    finally:
        os.close(fd)
    return uid


# ---- one view at a time: no channel between sandboxes that run together (issue 36, item 1) ----
#: the host's sandbox gate: a JSON state under flock, shared by every grader process of this user on
#: the host (a file of the user's own: another user's could not be opened)
VIEW_GATE = UID_COUNTER / f"preln-grader-views-{os.geteuid()}"
#: how often a sandbox waiting at the gate looks again
GATE_POLL_S = 0.02
#: called with "wait" when a sandbox starts waiting at the gate and "go" when its turn comes (the
#: grading worker tells its parent, whose clock per notebook stops meanwhile)
on_gate = None


def _process_id(pid):
    """(pid, start time) of a live process, or None: a pid alone could be a later process's."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return [pid, int(stat.rsplit(")", 1)[1].split()[19])]


class ViewGate:
    """Sandboxes run together only when they hold the same view of the package.

    Two sandboxes that run at the same time share the host: its page cache (a page one reads is
    fast for the other to read), its CPU (one's load slows the other), its free memory. Each is a
    channel no system-call filter closes. A relay is worth something only from a sandbox whose view
    holds code the other's withholds, so sandboxes of different views take turns: first come,
    first served, and one of the same view as those running joins them only if nobody of another
    view waits before it (then it waits its turn)."""

    def __init__(self, view, path=None):
        self.view, self.path = str(view), Path(path or VIEW_GATE)
        self.me = _process_id(os.getpid())

    def _update(self, change):
        """Apply ``change(state)`` under the host's lock; return what it returns."""
        import fcntl
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                state = json.loads(os.read(fd, 1 << 20) or b"{}")
            except ValueError:
                state = {}
            # entries are [pid, start time, view]: a dead process's (a killed worker's) are dropped
            live = {k: [e for e in state.get(k, []) if _process_id(e[0]) == e[:2]] for k in ("holders", "queue")}
            state = {"view": state.get("view"), **live}
            if not state["holders"]:
                state["view"] = None
            out = change(state)
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(state).encode())
            return out
        finally:
            os.close(fd)

    def _try(self, state):
        mine = [*self.me, self.view]
        if mine not in state["queue"]:
            state["queue"].append(mine)
        ahead = state["queue"][:state["queue"].index(mine)]
        if state["view"] in (None, self.view) and all(e[2] == self.view for e in ahead):
            state["queue"].remove(mine)
            state["holders"].append(mine)
            state["view"] = self.view
            return True
        return False

    def _leave(self, state):
        mine = [*self.me, self.view]
        for key in ("holders", "queue"):
            if mine in state[key]:
                state[key].remove(mine)
        if not state["holders"]:
            state["view"] = None

    def __enter__(self):
        try:
            if not self._update(self._try):
                if on_gate is not None:
                    on_gate("wait")
                while not self._update(self._try):
                    time.sleep(GATE_POLL_S)
                if on_gate is not None:
                    on_gate("go")
        except BaseException:
            self._update(self._leave)
            raise
        return self

    def __exit__(self, *exc):
        self._update(self._leave)


#: set to "off" to use the fallback accounting (PSS watchdog, RLIMIT_AS) even where cgroups work
CGROUP_ENV = "PRELN_GRADER_CGROUP"
#: the grader's own parent cgroup (one child per sandbox below it)
CGROUP_PARENT = "preln-grader"
#: seconds to wait for a killed cgroup to empty before giving up on removing it
CGROUP_DRAIN_S = 10
#: cgroup v2's memory.reclaim: tries, and what may stay charged (kernel objects, not file pages)
RECLAIM_TRIES, RECLAIM_LEFT = 8, 1 << 20


class CgroupUnavailable(Exception):
    """No cgroup can count this sandbox's memory here; the message says why."""


def _mounts():
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, where, fstype, opts = line.split()[:4]
            out.append((where.replace("\\040", " "), fstype, set(opts.split(","))))
    return out


def _own_cgroup(controller):
    """This process's cgroup path in the v1 hierarchy of ``controller`` ('' for v2's)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if (controller == "" and names == "") or controller in names.split(","):
                return path
    return None


class Cgroup:
    """One sandbox's cgroup: memory (memfd, shmem and tmpfs pages included, no swap) and processes
    capped, counted by the kernel. v2 where its memory and pids controllers are there (a child of
    /sys/fs/cgroup/preln-grader), else v1 (a child of the grader's own memory cgroup, so that
    whatever limits the grader has still hold, and of the pids hierarchy's root)."""

    def __init__(self, name, mem_mb, pids):
        if os.environ.get(CGROUP_ENV, "").lower() in ("off", "0", "no"):
            raise CgroupUnavailable(f"{CGROUP_ENV}=off")
        if os.geteuid() != 0:
            raise CgroupUnavailable("the grader is not root")
        self.mem_mb, self.dirs = mem_mb, []
        mounts = _mounts()
        v2 = [m for m, t, _ in mounts if t == "cgroup2"]
        v1 = {c: m for m, t, o in mounts if t == "cgroup" for c in ("memory", "pids") if c in o}
        why = []
        for root in v2:
            have = set(Path(root, "cgroup.controllers").read_text().split())
            if {"memory", "pids"} <= have:
                self.version = 2
                try:
                    self._make_v2(Path(root), name, mem_mb, pids)
                    return
                except OSError as e:
                    self.remove()
                    why.append(f"cgroup v2 at {root}: {e}")
            else:
                why.append(f"cgroup v2 at {root} has no {' and '.join(sorted({'memory', 'pids'} - have))} controller")
        if "memory" in v1:
            self.version = 1
            try:
                self._make_v1(v1, name, mem_mb, pids)
                return
            except OSError as e:
                self.remove()
                why.append(f"cgroup v1: {e}")
        elif not why:
            why.append("no cgroup file system is mounted")
        raise CgroupUnavailable("; ".join(why))

    def _make(self, parent, name):
        parent.mkdir(exist_ok=True)
        d = parent / name
        d.mkdir()
        self.dirs.append(d)
        return d

    def _make_v2(self, root, name, mem_mb, pids):
        # controllers must be enabled on the way down (root, then the grader's parent)
        for d in (root, root / CGROUP_PARENT):
            if d != root:
                d.mkdir(exist_ok=True)
            enabled = set((d / "cgroup.subtree_control").read_text().split())
            if not {"memory", "pids"} <= enabled:
                (d / "cgroup.subtree_control").write_text("+memory +pids")
        d = self._make(root / CGROUP_PARENT, name)
        (d / "memory.max").write_text(str(mem_mb * 2 ** 20))
        (d / "memory.swap.max").write_text("0")
        (d / "pids.max").write_text(str(pids))

    def _make_v1(self, v1, name, mem_mb, pids):
        own = _own_cgroup("memory") or "/"
        d = self._make(Path(v1["memory"] + own.rstrip("/")) / CGROUP_PARENT, name)
        (d / "memory.limit_in_bytes").write_text(str(mem_mb * 2 ** 20))
        if (d / "memory.memsw.limit_in_bytes").exists():           # swap accounting on: no swap either
            (d / "memory.memsw.limit_in_bytes").write_text(str(mem_mb * 2 ** 20))
        if "pids" in v1:
            p = self._make(Path(v1["pids"]) / CGROUP_PARENT, name)
            (p / "pids.max").write_text(str(pids))

    def procs_files(self):
        return [str(d / "cgroup.procs") for d in self.dirs]

    def wrap(self, cmd):
        """``cmd`` started by a shell that first moves itself into the cgroup (so that everything the
        sandbox runs is counted from its first instruction), then execs it; exit 125 if it cannot."""
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *self.procs_files(), "--", *cmd]

    def _read(self, name):
        try:
            return Path(self.dirs[0], name).read_text()
        except (OSError, IndexError):
            return ""

    def oom_kills(self):
        """Processes the kernel killed for the cgroup's memory limit."""
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control")
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                return int(v)
        return 0

    def peak(self):
        raw = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes").strip()
        return int(raw) if raw.isdigit() else 0

    def kill(self):
        """SIGKILL everything still in the cgroup (what escaped bwrap's --die-with-parent included)."""
        for d in self.dirs:
            if (d / "cgroup.kill").exists():
                try:
                    (d / "cgroup.kill").write_text("1")
                    continue
                except OSError:
                    pass
            for pid in self._tasks(d):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def drop_page_cache(self, d):
        """Evict the file pages charged to the (emptied) memory cgroup ``d``: the pages this sandbox
        brought into the page cache. A page of a shared read-only file that a notebook read stays
        cached after it, and a later notebook can time its reads and find it (about 1 µs against
        15 µs from the disk): a bit per page, a relay between sandboxes (issue 36, item 1). Pages
        that were cached before the sandbox are charged elsewhere and stay; what the sandbox brought
        in goes, so the cache is as the sandbox found it. Best effort: a refusal is left as it is."""
        try:
            if self.version == 1:
                (d / "memory.force_empty").write_text("0")       # v1: reclaim all, once the tasks are gone
            else:
                for _ in range(RECLAIM_TRIES):                    # v2 (Linux >= 5.19): EAGAIN until done
                    left = int((d / "memory.current").read_text())
                    if left < RECLAIM_LEFT:
                        break
                    try:
                        (d / "memory.reclaim").write_text(str(left))
                    except BlockingIOError:
                        continue
        except (OSError, ValueError):
            pass

    def _memory_dirs(self):
        return [d for d in self.dirs if (d / ("memory.force_empty" if self.version == 1 else "memory.current")).exists()]

    def remove(self):
        """Kill what is left, wait for the cgroup to empty, evict the file pages it brought in
        (:meth:`drop_page_cache`), remove it. Then the same for what the sandboxes' parent still
        holds: pages a removed sandbox brought in that another process mapped at the time."""
        deadline = time.monotonic() + CGROUP_DRAIN_S
        memory = self._memory_dirs()
        for d in reversed(self.dirs):
            if d in memory:
                while self._tasks(d) and time.monotonic() < deadline:
                    self.kill()
                    time.sleep(0.01)
                self.drop_page_cache(d)
            while d.exists():
                self.kill()
                try:
                    d.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        print(f"preln.grade: could not remove the sandbox's cgroup {d}", file=sys.stderr)
                        break
                    time.sleep(0.05)
        for d in memory:
            if d.parent.name == CGROUP_PARENT:
                self.drop_page_cache(d.parent)             # refused (v1) while another sandbox runs
        self.dirs = []

    @staticmethod
    def _tasks(d):
        try:
            return (d / "cgroup.procs").read_text().split()
        except OSError:
            return []


def remove_stale_cgroups():
    """Remove the sandbox cgroups whose grader process is gone (a worker killed at its time limit
    cannot remove its own): what is left in them is killed first. Returns how many were removed."""
    n = 0
    for where, fstype, opts in _mounts():
        if not fstype.startswith("cgroup"):
            continue
        for d in Path(where).rglob(f"{CGROUP_PARENT}/job-*"):
            owner = d.name.split("-")[1]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                cg = Cgroup.__new__(Cgroup)
                cg.dirs, cg.version = [d], 2 if fstype == "cgroup2" else 1
                cg.remove()
                n += 1
    return n


_WARNED = set()


def sandbox_cgroup(settings, name):
    """The sandbox's :class:`Cgroup`, or None (with a warning, once per reason) where the kernel
    cannot count its memory: then the PSS watchdog and RLIMIT_AS are all there is."""
    try:
        return Cgroup(name, settings.total_mem_mb, settings.nproc)
    except CgroupUnavailable as e:
        reason = str(e)
    if reason not in _WARNED:
        _WARNED.add(reason)
        print(f"preln.grade: warning: no cgroup for the sandbox's memory ({reason}); falling back to the "
              "watchdog over the processes' PSS and RLIMIT_AS, which do not see memfd, shared memory or "
              "tmpfs pages (book/running.md, Threat model)", file=sys.stderr)
    return None


def memory_message(mb):
    return (f"the notebook's processes held more than {mb} MB of memory together: memory limit ({mb} MB) "
            "exceeded (the sandbox's cgroup counts memfd, shared memory and tmpfs too)")


def clear_keyrings(uid):
    """After a sandbox: empty the user, user-session and persistent keyrings of its uid (root, in a
    forked child that becomes the uid), so that no key a notebook stored outlives the run."""
    import ctypes
    import platform
    nr = {"x86_64": 250, "aarch64": 219, "ppc64le": 311, "s390x": 280}.get(platform.machine())
    if nr is None or os.geteuid() != 0:
        return
    pid = os.fork()
    if pid == 0:                                            # the child: no Python cleanup, just exit
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            ok = [libc.syscall(ctypes.c_long(nr), ctypes.c_long(7), ctypes.c_long(ring)) >= 0
                  for ring in (-4, -5)]                     # KEYCTL_CLEAR user, user-session keyring
            # and the uid's persistent keyring (KEYCTL_GET_PERSISTENT, linked into this child's
            # process keyring), which lives on for days after its last process (fixture student kai)
            persistent = libc.syscall(ctypes.c_long(nr), ctypes.c_long(22), ctypes.c_long(-1), ctypes.c_long(-2))
            if persistent > 0:
                ok.append(libc.syscall(ctypes.c_long(nr), ctypes.c_long(7), ctypes.c_long(persistent)) >= 0)
            code = 0 if all(ok) else 2
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def runner_spec(settings, cells, questions, slot, privileged):
    mem = settings.mem_mb * 2 ** 20
    limits = {"RLIMIT_AS": mem, "RLIMIT_CPU": settings.cpu_s, "RLIMIT_NPROC": settings.nproc,
              "RLIMIT_FSIZE": settings.tmp_mb * 2 ** 20, "RLIMIT_CORE": 0, "RLIMIT_NOFILE": 1024}
    if not settings.sandbox:
        limits.pop("RLIMIT_NPROC")          # without a namespace it would count all of our processes
    uid = None
    if privileged and settings.sandbox:
        # a uid of this worker's own (from its pid, unique among the processes alive): the process
        # limit counts per uid, so concurrent sandboxes, of this run or of another, never share it
        uid = next_uid(settings.uid_base)
    
    return {"cells": cells, "questions": questions, "cell_timeout": settings.cell_timeout,
            "max_sessions": settings.max_sessions, "rlimits": limits, "uid": uid, "gid": uid,
            "sandboxed": bool(settings.sandbox)}


class _Reader(threading.Thread):
    def __init__(self, stream, cap):
        super().__init__(daemon=True)
        self.stream, self.cap, self.chunks, self.size, self.overflow = stream, cap, [], 0, False

    def run(self):
        while True:
            chunk = self.stream.read(1 << 16)
            if not chunk:
                return
            if self.size + len(chunk) > self.cap:
                self.overflow = True
                continue                                   # keep draining, keep nothing more
            self.chunks.append(chunk)
            self.size += len(chunk)

    def data(self):
        return b"".join(self.chunks)


def _tree(pid):
    import psutil
    try:
        p = psutil.Process(pid)
        return [p] + p.children(recursive=True)
    except psutil.Error:
        return []


def _rss(procs):
    """Memory the processes hold together: the sum of their proportional set sizes (shared pages
    counted once, in parts — forked children are not charged for the pages they share), or of
    their resident sizes where PSS cannot be read."""
    import psutil
    total = 0
    for p in procs:
        try:
            try:
                total += p.memory_full_info().pss
            except (AttributeError, psutil.AccessDenied):
                total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_job(job_dir, view_dir, lib_dir, settings, slot=0):
    """Run the job; return the runner's result document (untrusted data), or raise SandboxFailure."""
    privileged = os.geteuid() == 0
    job_dir = Path(job_dir)
    spec = json.loads((job_dir / "spec.json").read_text())
    spec.update(runner_spec(settings, spec["cells"], spec["questions"], slot, privileged))
    (job_dir / "spec.json").write_text(json.dumps(spec))
    for p in [job_dir, *job_dir.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    if (job_dir / "frozen").is_dir():
        # the read-only arguments (grader_capture): a folder that cannot be listed, files named by
        # random tokens only the calls carry, read-only (the whole job is a read-only bind mount)
        os.chmod(job_dir / "frozen", 0o711)
        for p in (job_dir / "frozen").iterdir():
            os.chmod(p, 0o444)
    if privileged and settings.sandbox:
        # the hidden calls' inputs: readable by the runner while it is still root, then handed to
        # the capture cells only after the student's cells have run (no cell can print them)
        os.chmod(job_dir / "calls", 0o700)
        for p in (job_dir / "calls").iterdir():
            os.chmod(p, 0o600)
    fd = None
    if settings.sandbox:
        fd = seccomp_fd()
        cmd = bwrap_command(job_dir, view_dir, lib_dir, settings, privileged, seccomp=fd)
        env, cwd, scratch = None, None, None
    else:
        import tempfile
        scratch = Path(tempfile.mkdtemp(prefix="preln-nosandbox-"))
        (scratch / "work").mkdir()
        env = environment(str(job_dir), str(scratch / "work" / ".grader-out"), str(scratch),
                          str(view_dir), str(lib_dir))
        cmd = [sys.executable, "-s", "-B", str(Path(lib_dir) / "grader_runner.py")]
        cwd = str(scratch / "work")
    # the whole run, until its cgroup's pages are evicted, inside the host's gate: no sandbox of
    # another view runs meanwhile
    gate = ViewGate(Path(view_dir).name) if settings.sandbox else contextlib.nullcontext()
    with gate:
        cgroup = None
        if settings.sandbox:
            cgroup = sandbox_cgroup(settings, f"job-{os.getpid()}-{time.monotonic_ns()}")
            if cgroup is not None:
                cmd = cgroup.wrap(cmd)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, cwd=cwd, start_new_session=True, pass_fds=() if fd is None else (fd,))
        finally:
            if fd is not None:
                os.close(fd)
        out = _Reader(proc.stdout, settings.max_result_mb * 2 ** 20)
        err = _Reader(proc.stderr, 1 << 16)
        out.start()
        err.start()
        reason = None
        peak = 0
        try:
            while proc.poll() is None:
                time.sleep(0.1)
                # with a cgroup the kernel caps memory itself; the PSS watchdog is the fallback
                rss = 0 if cgroup is not None else _rss(_tree(proc.pid))
                peak = max(peak, rss)
                if rss > settings.total_mem_mb * 2 ** 20:
                    reason = (f"the notebook's processes held more than {settings.total_mem_mb} MB of memory "
                              "together (the sandbox's memory cap)")
                elif time.monotonic() - t0 > settings.wall_s:
                    reason = f"grading took longer than {settings.wall_s} s (the sandbox's time limit)"
                elif out.overflow:
                    reason = f"the notebook sent more than {settings.max_result_mb} MB of results"
                if reason:
                    _kill(proc)
                    break
            proc.wait()
        finally:
            if proc.poll() is None:
                _kill(proc)
            out.join(5)
            err.join(5)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            if cgroup is not None:
                ooms, peak = cgroup.oom_kills(), max(peak, cgroup.peak())
                cgroup.remove()
            if spec.get("uid") is not None:
                clear_keyrings(spec["uid"])
    if cgroup is not None and proc.returncode == 125 and not out.data():
        raise SandboxFailure("the sandbox could not be placed in its cgroup")
    if cgroup is not None and ooms and not reason:
        # a process of the sandbox was killed at the cap: the run's results are not the notebook's
        reason = memory_message(settings.total_mem_mb)
    if reason:
        raise SandboxFailure(reason)
    data = out.data()
    if not data:
        tail = err.data().decode(errors="replace").strip().splitlines()[-3:]
        hint = f" ({' / '.join(tail)[:300]})" if tail else ""
        raise SandboxFailure("the grading run in the sandbox ended without a result: something in the "
                             f"notebook ended the grader's process there (exit status {proc.returncode}){hint}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise SandboxFailure("the grading run in the sandbox sent back malformed results") from None
    if not isinstance(doc, dict):
        raise SandboxFailure("the grading run in the sandbox sent back malformed results")
    doc["_peak_rss_mb"] = round(peak / 2 ** 20)
    doc["_seconds"] = round(time.monotonic() - t0, 2)
    return doc


def _kill(proc):
    """Kill the sandbox: bwrap (its child dies with it) and, without a sandbox, every descendant."""
    procs = _tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.kill()
        except Exception:                                   # noqa: BLE001: already gone
            pass
