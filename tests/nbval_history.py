"""pytest plugin for `make test-notebooks` (loaded with `-p tests.nbval_history`).

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
