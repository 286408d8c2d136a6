"""pytest plugin for `make test-notebooks` (loaded with `-p tests.nbval_progress`): one line per
notebook as soon as its last cell has run.

nbval makes every cell of a notebook a test item, and the Makefile sends pytest's report to
`_build/nbval/<kernel>.log`, so the terminal would stay silent for the minutes a kernel's run takes.
With ``--progress-fd=N`` this plugin also writes a line to file descriptor N (the Makefile opens it
on the terminal) when a notebook is done::

    [nbval default] derivation_ops.ipynb: passed, 84 cells in 52 s
    [nbval Prescott] precision.ipynb: FAILED 2 of 61 cells (Cell 14, Cell 15) in 40 s; see _build/nbval/Prescott.log

A notebook that cannot even be collected (not valid JSON, say) gets a line too. Without the option
the plugin does nothing.
"""
import os
import time
from collections import Counter, defaultdict

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("nbval progress")
    group.addoption("--progress-fd", type=int, default=None,
                    help="write one line per finished notebook to this file descriptor")
    group.addoption("--progress-label", default="nbval",
                    help="the line's prefix, e.g. the OpenBLAS kernel (default: nbval)")
    group.addoption("--progress-log", default=None, help="the log file a failure line points to")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    fd = config.getoption("progress_fd")
    if fd is not None:
        config.pluginmanager.register(
            Progress(fd, config.getoption("progress_label"), config.getoption("progress_log")),
            "nbval-progress")




class Progress:
    def __init__(self, fd, label, log):
        os.fstat(fd)           # fails now, with a clear OSError, if the descriptor is not open
        self.fd, self.label, self.log = fd, label, log
        self.total = Counter()                 # notebook -> number of cell items
        self.done = Counter()
        self.failed = defaultdict(list)        # notebook -> names of failed cells
        self.skipped = Counter()
        self.started = {}
        self.reported = set()
        self.path_of = {}                      # item nodeid -> its notebook's path

    def write(self, text):
        os.write(self.fd, f"[{self.label}] {text}\n".encode())

    def notebook(self, nodeid):
        return self.path_of.get(nodeid) or nodeid.split("::", 1)[0]

    def pytest_collectreport(self, report):
        if report.failed:
            where = str(getattr(report, "fspath", "") or report.nodeid)
            self.write(f"{os.path.basename(where)}: could not be collected"
                       + (f"; see {self.log}" if self.log else ""))

    def pytest_collection_finish(self, session):
        for item in session.items:
            self.path_of[item.nodeid] = str(item.path)      # (nodeids drop the path of files outside rootdir)
            self.total[self.path_of[item.nodeid]] += 1

    def pytest_runtest_logstart(self, nodeid, location):
        self.started.setdefault(self.notebook(nodeid), time.monotonic())

    def pytest_runtest_logreport(self, report):
        nb = self.notebook(report.nodeid)
        name = report.nodeid.split("::", 1)[-1]
        if report.failed and name not in self.failed[nb]:
            self.failed[nb].append(name)
        elif report.skipped and report.when in ("setup", "call"):
            self.skipped[nb] += 1

    def pytest_runtest_logfinish(self, nodeid, location):
        nb = self.notebook(nodeid)
        self.done[nb] += 1
        if self.done[nb] == self.total[nb]:
            self.finish(nb)

    def pytest_sessionfinish(self, session):
        for nb in self.total:                  # stopped early (-x, a crash, Ctrl-C)
            if nb not in self.reported:
                self.finish(nb, incomplete=True)

    def finish(self, nb, incomplete=False):
        self.reported.add(nb)
        seconds = time.monotonic() - self.started.get(nb, time.monotonic())
        name = os.path.basename(nb)
        cells = f"{self.total[nb]} cells" + (f" ({self.skipped[nb]} skipped)" if self.skipped[nb] else "")
        if incomplete:
            self.write(f"{name}: NOT FINISHED, {self.done[nb]} of {cells} run")
        elif self.failed[nb]:
            shown = ", ".join(self.failed[nb][:5]) + (", ..." if len(self.failed[nb]) > 5 else "")
            self.write(f"{name}: FAILED {len(self.failed[nb])} of {cells} ({shown}) in {seconds:.0f} s"
                       + (f"; see {self.log}" if self.log else ""))
        else:
            self.write(f"{name}: passed, {cells} in {seconds:.0f} s")
