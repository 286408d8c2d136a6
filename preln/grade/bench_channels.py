"""The covert channels left between grading sandboxes, measured (issue 36, item 1).

    python -m preln.grade.bench_channels [--bits 512] [--slot-ms 40] [--mem-slot-ms 200]

Runs real sandboxes, each one notebook cell through the grader's own :func:`sandbox.run_job` (bwrap,
the seccomp filter, the cgroup, the view gate), in pairs: a sender that knows a random bit string
(a fixed seed) and a receiver that measures something and prints the raw numbers. The receiver's
numbers are decoded here as the receiver would: the message starts with a known preamble (1, 0,
1, 0, ...), whose two halves give the threshold and which side means 1. For each channel it prints
the bits sent, the raw rate (bits over the seconds the two cells spent signalling, without the
sandboxes' start-up), the bit error rate and the capacity, rate x (1 - H(error rate)) with H the
binary entropy: what an error-correcting code could carry at most. A closed channel's error rate is
0.5 only on average: the last column moves it two standard errors towards 0.5 (sampling noise of
a few hundred bits alone would otherwise show as some capacity).

- page cache, one sandbox after the other: the sender reads one byte of a page for a 1 and leaves
  it for a 0; the receiver times a plain ``pread`` of each (a cached page is read in microseconds,
  one from the disk in tens of them). One page in each run of ``--stride`` pages (beyond the
  kernel's readahead), at random, of the shared files (the environment's, /usr) of which no page
  is cached (nobody has read them lately), evicted here first (``posix_fadvise``, outside any
  sandbox). Once without a cgroup (``PRELN_GRADER_CGROUP=off``, as where the grader is not root),
  once with one (root: the pages a sandbox brought in are evicted when it ends).
- CPU, two sandboxes at the same time (of one view: the only pair the gate lets run together): the
  sender keeps every core busy in a slot for a 1 (a process per core, each in a session, so a
  scheduler autogroup, of its own) and sleeps for a 0; the receiver counts its own loop
  iterations in each slot.
- free memory, two sandboxes at the same time: the sender holds ``--mem-mb`` of touched memory in a
  slot for a 1; the receiver reads MemAvailable in /proc/meminfo near each slot's end.

The machine may be shared: the numbers are what this machine did then (its load average is printed).
"""
import argparse
import contextlib
import json
import math
import mmap
import os
import random
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import numpy as np

from preln.validation import positive_int

from . import autograde
from . import sandbox
from . import views

#: the known start of every message: the receiver's threshold and polarity come from it
PREAMBLE = (1, 0) * 8
PAGE = mmap.PAGESIZE
#: what a cell prints before its JSON line
MARK = "CHANNEL-RESULT "
#: seconds from launching two concurrent sandboxes to their first slot (both kernels must be up:
#: about 2 s each here); doubled once if a sandbox came late
START_S = 6.0
#: standard errors by which the last column moves the error rate towards 0.5
SIGMAS = 2

PAGE_SENDER = '''
import os, time
fds = [os.open(path, os.O_RDONLY) for path in {paths!r}]
t0 = time.perf_counter()
for (i, offset), bit in zip({pages!r}, {bits!r}):
    if bit:
        os.pread(fds[i], 1, offset)
print({mark!r} + str(time.perf_counter() - t0))
'''

PAGE_RECEIVER = '''
import json, os, time
fds = [os.open(path, os.O_RDONLY) for path in {paths!r}]
ns, t0 = [], time.perf_counter()
for i, offset in {pages!r}:
    t = time.perf_counter_ns()
    os.pread(fds[i], 1, offset)
    ns.append(time.perf_counter_ns() - t)
print({mark!r} + json.dumps({{"seconds": time.perf_counter() - t0, "values": ns}}))
'''

#: both concurrent cells wait for the first slot at the same wall-clock time (no time namespace)
WAIT = '''
import json, os, time
start, slot = {start!r}, {slot!r}
late = time.time() - start
if late < 0:
    time.sleep(-late)
'''

CPU_SENDER = WAIT + '''
kids = []
for _ in range(os.cpu_count()):
    pid = os.fork()
    if pid == 0:
        os.setsid()            # a session, so a scheduler autogroup, of its own: a share of the CPU each
        for k, bit in enumerate({bits!r}):
            end = start + (k + 1) * slot
            if bit:
                while time.time() < end:
                    pass
            else:
                time.sleep(max(0.0, end - time.time()))
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print({mark!r} + json.dumps({{"late": late}}))
'''

CPU_RECEIVER = WAIT + '''
counts = []
for k in range({n}):
    end, n = start + (k + 1) * slot, 0
    while time.time() < end:
        n += 1
    counts.append(n)
print({mark!r} + json.dumps({{"late": late, "seconds": {n} * slot, "values": counts}}))
'''

MEM_SENDER = WAIT + '''
import numpy as np
for k, bit in enumerate({bits!r}):
    if bit:
        held = np.ones({mem_bytes}, np.uint8)          # touched: resident, not only reserved
    time.sleep(max(0.0, start + (k + 1) * slot - time.time()))
    held = None
print({mark!r} + json.dumps({{"late": late}}))
'''

MEM_RECEIVER = WAIT + '''
def available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")
values = []
for k in range({n}):
    time.sleep(max(0.0, start + (k + {sample}) * slot - time.time()))
    values.append(available())
    time.sleep(max(0.0, start + (k + 1) * slot - time.time()))
print({mark!r} + json.dumps({{"late": late, "seconds": {n} * slot, "values": values}}))
'''


def entropy(p):
    """Binary entropy in bits."""
    return 0.0 if p <= 0 or p >= 1 else -p * math.log2(p) - (1 - p) * math.log2(1 - p)


def capacity(rate, error_rate):
    """Bits/s a binary symmetric channel of this raw rate and error rate carries at most."""
    return rate * (1 - entropy(error_rate))


def decode(values):
    """Bits from the receiver's numbers (positive): the threshold halfway, on a log scale, between the
    preamble's medians for 1 and for 0 (a page's read time spans microseconds to milliseconds), and
    a 1 on the side of the preamble's 1s. Returns the bits after the preamble."""
    logs = np.log(np.maximum(np.asarray(values, dtype=np.float64), 1.0))
    pre, bits = np.array(PREAMBLE), logs[len(PREAMBLE):]
    one, zero = np.median(logs[:len(PREAMBLE)][pre == 1]), np.median(logs[:len(PREAMBLE)][pre == 0])
    threshold = (one + zero) / 2
    return (bits > threshold if one > zero else bits < threshold).astype(np.int64)


def message(n_bits, seed=0):
    """The preamble and ``n_bits`` random bits."""
    return list(PREAMBLE) + [int(b) for b in np.random.default_rng(seed).integers(0, 2, n_bits)]


class Lab:
    """A scratch folder with the sandbox library and one view (every sandbox here holds the same)."""

    def __init__(self, root):
        self.root = Path(root)
        self.lib = autograde.workspace(self.root / "ws").lib
        self.view = views.build_view(self.root / "view", [])
        os.chmod(self.view, 0o755)

    def run(self, source, settings):
        """Run ``source`` as a notebook's one cell in a sandbox; the JSON (or text) after MARK."""
        job = Path(tempfile.mkdtemp(prefix="job-", dir=self.root))      # two threads at once: no counter
        (job / "calls").mkdir()
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, str(job / "notebook.ipynb"))
        (job / "spec.json").write_text(json.dumps({"cells": [0], "questions": []}))
        doc = sandbox.run_job(job, self.view, self.lib, settings)
        outputs = doc["cells"]["0"]["outputs"]
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        if MARK not in text:
            errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
            raise RuntimeError(f"the cell printed no result ({'; '.join(errors) or text[-300:]})")
        return json.loads(text.split(MARK, 1)[1].splitlines()[0])

    def together(self, sender, receiver, settings):
        """Run two cells in two sandboxes at the same time; their results (sender's, receiver's)."""
        out, errors = {}, []

        def run(name, source):
            try:
                out[name] = self.run(source, settings)
            except Exception as e:                  # noqa: BLE001: reported by the caller's thread
                errors.append(e)
        threads = [threading.Thread(target=run, args=a) for a in (("sender", sender), ("receiver", receiver))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out["sender"], out["receiver"]


@contextlib.contextmanager
def cgroup_env(value):
    """PRELN_GRADER_CGROUP set to ``value`` (None: unset) meanwhile."""
    old = os.environ.get(sandbox.CGROUP_ENV)
    if value is None:
        os.environ.pop(sandbox.CGROUP_ENV, None)
    else:
        os.environ[sandbox.CGROUP_ENV] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(sandbox.CGROUP_ENV, None)
        else:
            os.environ[sandbox.CGROUP_ENV] = old


@contextlib.contextmanager
def private_gate(path):
    """The sandboxes started meanwhile take turns at a gate of their own (``sandbox.VIEW_GATE``): at
    the host's, a grading run elsewhere on the host with a sandbox of another view waiting would
    queue the second of a pair behind it, and the pair would not run together."""
    old, sandbox.VIEW_GATE = sandbox.VIEW_GATE, path
    try:
        yield
    finally:
        sandbox.VIEW_GATE = old


def cgroup_reason():
    """None if the grader gets a cgroup here, else why not."""
    try:
        sandbox.Cgroup("bench-probe", 64, 8).remove()
    except sandbox.CgroupUnavailable as e:
        return str(e)
    return None


#: files smaller than this are not used by the page-cache channel (a file is a few page runs)
MIN_FILE = 8 * 2 ** 20


def shared_files():
    """The regular files of at least MIN_FILE, readable by anyone, that every sandbox sees read-only
    (the Python environment, its base interpreter's, /usr), largest first."""
    roots = sorted({str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve()), "/usr"})
    found = set()
    for root in roots:
        for d, _, files in os.walk(root):
            for f in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(d, f))
                    if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IROTH and st.st_size >= MIN_FILE:
                        found.add((st.st_size, os.path.join(d, f)))
    return [p for _, p in sorted(found, reverse=True)]


def resident(fd, size):
    """One byte per page of the file: bit 0 set where the page is in the page cache (mincore)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
    try:
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
    finally:
        libc.munmap(ctypes.c_void_p(addr), size)
    return vec.raw


def cold_pages(files, n, stride, rng):
    """``(paths, pages)``: ``n`` pages ``(index in paths, offset)`` of ``files``, one at random in the
    first half of each run of ``stride`` pages, evicted here (``posix_fadvise``) and checked to be
    so. Only files none of whose pages is cached (nobody has read them lately, so nobody else is
    likely to while the channel runs), in ``rng``'s order: the disk's own cache (a virtual machine's
    host) may remember pages read lately, by an earlier run of this program too; a random page has
    likely not been read."""
    paths, pages = [], []
    for path in rng.sample(files, len(files)):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                size = os.fstat(fd).st_size
                if any(b & 1 for b in resident(fd, size)):
                    continue
                # in the first half of each run: two pages at least stride / 2 apart (readahead)
                offsets = [w + rng.randrange(stride // 2) * PAGE
                           for w in range(0, size - stride * PAGE, stride * PAGE)][:n - len(pages)]
                for off in offsets:
                    os.posix_fadvise(fd, off, PAGE, os.POSIX_FADV_DONTNEED)
                cached = resident(fd, size)
            finally:
                os.close(fd)
            pages += [(len(paths), off) for off in offsets if not cached[off // PAGE] & 1]
            paths.append(path)
        if len(pages) == n:
            return paths, pages
    raise RuntimeError(f"{len(pages)} uncached pages, one per {stride}, in the shared files; {n} are needed")


def towards_half(errors, n):
    """The error rate ``errors`` of ``n`` bits moved SIGMAS standard errors towards 0.5 (not past it);
    the standard error from (errors + 1) / (n + 2), so that no error in n bits is not read as certainty."""
    p = (errors * n + 1) / (n + 2)
    step = SIGMAS * math.sqrt(p * (1 - p) / n)
    return min(errors + step, 0.5) if errors < 0.5 else max(errors - step, 0.5)


def row(channel, setting, bits, seconds, values):
    """The table's row for a message ``bits`` (preamble included) and the receiver's ``values``."""
    sent = np.array(bits[len(PREAMBLE):])
    errors = float(np.mean(decode(values) != sent))
    rate = len(sent) / seconds
    return {"channel": channel, "setting": setting, "bits": len(sent), "rate": rate, "error": errors,
            "capacity": capacity(rate, errors), "bound": capacity(rate, towards_half(errors, len(sent)))}


def page_cache(lab, files, bits, stride, with_cgroup, settings):
    # the pages from the system's randomness, not the seed: a fixed choice would be the pages the
    # last run read, which the disk's cache may remember (the message itself is the seed's)
    paths, pages = cold_pages(files, len(bits), stride, random.Random())
    fmt = {"paths": paths, "pages": pages, "bits": bits, "mark": MARK}
    with cgroup_env(None if with_cgroup else "off"):
        sent = lab.run(PAGE_SENDER.format(**fmt), settings)
        got = lab.run(PAGE_RECEIVER.format(**fmt), settings)
    setting = ("one after the other, with the cgroup (pages evicted)" if with_cgroup else
               f"one after the other, {sandbox.CGROUP_ENV}=off")
    return row("page cache", setting, bits, sent + got["seconds"], got["values"])


def concurrent(lab, name, sender, receiver, bits, slot, settings, **fmt):
    """Sender and receiver in two sandboxes at once, slots from a common wall-clock start."""
    for lead in (START_S, 2 * START_S):
        common = {"start": time.time() + lead, "slot": slot, "bits": bits, "n": len(bits), "mark": MARK, **fmt}
        sent, got = lab.together(sender.format(**common), receiver.format(**common), settings)
        late = max(sent["late"], got["late"])
        if late <= 0:
            setting = f"two at once (one view), {slot * 1000:.0f} ms slots"
            return row(name, setting, bits, got["seconds"], got["values"])
        print(f"{name}: a sandbox started {late:.1f} s after the first slot ({lead:g} s after launch)", flush=True)
    raise RuntimeError(f"{name}: the two sandboxes did not start within {2 * START_S:g} s")


def table(rows):
    lines = [f"| channel | setting | bits sent | rate (bits/s) | error rate | capacity (bits/s) | "
             f"capacity, error rate {SIGMAS} sigma nearer 0.5 |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['channel']} | {r['setting']} | {r['bits']} | {r['rate']:.4g} | {r['error']:.3f} | "
                     f"{r['capacity']:.4g} | {r['bound']:.4g} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, default=512, help="message bits per page-cache channel")
    ap.add_argument("--slot-bits", type=int, default=128, help="message bits per CPU and memory channel")
    ap.add_argument("--stride", type=int, default=128, help="pages per signalling page (at least 2)")
    ap.add_argument("--slot-ms", type=int, default=40, help="CPU channel's slot")
    ap.add_argument("--mem-slot-ms", type=int, default=200, help="memory channel's slot")
    ap.add_argument("--mem-mb", type=int, default=256, help="memory the sender holds for a 1")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("bits", "slot_bits", "stride", "slot_ms", "mem_slot_ms", "mem_mb"):
        positive_int(getattr(args, name), f"--{name.replace('_', '-')}")
    if args.stride < 2:
        ap.error(f"--stride: expected at least 2 pages; got {args.stride}")
    if sandbox.probe() is not None:
        print(f"no sandbox here: {sandbox.probe()}", file=sys.stderr)
        return 2
    settings = sandbox.Settings(cell_timeout=120)
    page_bits, slot_bits = message(args.bits, args.seed), message(args.slot_bits, args.seed + 1)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} cores", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="preln-bench-channels-") as tmp, private_gate(Path(tmp) / "gate"):
        os.chmod(tmp, 0o755)
        lab = Lab(tmp)
        files = shared_files()
        rows.append(page_cache(lab, files, page_bits, args.stride, False, settings))
        why = cgroup_reason()
        if why is None:
            rows.append(page_cache(lab, files, page_bits, args.stride, True, settings))
        else:
            print(f"page cache with the cgroup: not measured, no cgroup here ({why})", flush=True)
        rows.append(concurrent(lab, "CPU time", CPU_SENDER, CPU_RECEIVER, slot_bits, args.slot_ms / 1000, settings))
        rows.append(concurrent(lab, "free memory (MemAvailable)", MEM_SENDER, MEM_RECEIVER, slot_bits,
                               args.mem_slot_ms / 1000, settings, mem_bytes=args.mem_mb * 2 ** 20, sample=0.9))
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
