"""pytest plugin for `make test-notebooks` (loaded with `-p tests.nbval_history`): cells run as
Jupyter runs them, and the markdown cells' stored expression values are checked (see the end).

nbval 0.11 sends each cell to the kernel with ``store_history=False``. IPython decides whether a
trailing ``;`` silences a cell's value by looking at the *last stored* input, so under nbval
``ax.set_xlabel("x");`` still prints ``Text(0.5, 0, 'x')`` while Jupyter and ``make notebooks``
print nothing: a spurious "outputs differ". Executing with ``store_history=True``, as Jupyter
does, makes nbval see the outputs the notebook stored.
"""
from nbval.kernel import RunningKernel


def _execute_cell_input(self, cell_input, allow_stdin=None):
    return self.kc.execute(cell_input, store_history=True, allow_stdin=allow_stdin,
                           stop_on_error=False)


RunningKernel.execute_cell_input = _execute_cell_input


# ---- the prose's numbers (issue 31) -----------------------------------------------------------
# A markdown cell stores the values of its {eval} roles in its metadata (user_expressions), which
# JupyterLab shows and the site prints. After a notebook's last cell, one more test item evaluates
# them all in the same kernel (as scripts/execute_notebooks.py does for `make notebooks`) and fails
# where a stored value is missing, an error, or differs from what the run computes (a value a
# `# NBVAL_IGNORE_OUTPUT` cell measured -- a timing -- need only exist: nbval ignores that cell too).
import pytest  # noqa: E402
from nbval.plugin import IPyNbFile  # noqa: E402

from preln.nb import eval_expressions, evaluate_in_kernel, measured_expressions, stale_expressions  # noqa: E402

EXPRESSIONS_ITEM = "markdown expressions"
EVAL_TIMEOUT_S = 60   # evaluating every glue.text(...) of a chapter takes well under a second


class StoredExpressions(pytest.Item):
    def runtest(self):
        kernel = self.parent.kernel
        if kernel is None or not kernel.is_alive():
            raise AssertionError("the notebook's kernel is not running: its cells failed")
        nb = self.parent.nb
        stale = stale_expressions(nb, lambda exprs: evaluate_in_kernel(kernel.kc, exprs, EVAL_TIMEOUT_S),
                                  measured=measured_expressions(nb))
        if stale:
            raise AssertionError(f"{len(stale)} stored markdown expression values differ from this run "
                                 "(`make notebooks` stores fresh ones):\n" + "\n".join(
                                     f"  cell {i}: {expr}: stored {old}, computed {new}" for i, expr, old, new in stale))

    def repr_failure(self, excinfo):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, 0, f"{self.path.name}::{EXPRESSIONS_ITEM}"


_collect_cells = IPyNbFile.collect


def _collect(self):
    yield from _collect_cells(self)
    if any(c.cell_type == "markdown" and eval_expressions(c.source) for c in self.nb.cells):
        yield StoredExpressions.from_parent(self, name=EXPRESSIONS_ITEM)


IPyNbFile.collect = _collect
