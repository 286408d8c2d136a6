"""`make notebooks`: execute each notebook in place, then store its markdown cells' expression values.

    python scripts/execute_notebooks.py [--timeout 600] [--kernel python3] book/a.ipynb ...

What ``jupyter nbconvert --to notebook --execute --inplace`` did (nbclient runs every cell in the
notebook's folder, fails on a cell's error), and then, in the same kernel once the last cell has run,
evaluates every ``{eval}`...``` role of the markdown cells as a Jupyter user expression (what
jupyterlab-myst sends when a markdown cell runs) and stores the results in the cell's
``user_expressions`` metadata: JupyterLab shows them without a kernel, the site's build reads them
(book/_ext/preln_eval.py). An expression that fails is an error, as a failing cell is; the notebook is
then left unwritten. After the last cell, not cell by cell: a chapter may quote a number that a later
cell glues (an exercise's answers), as myst-nb's glue allowed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from preln.nb import evaluate_in_kernel, store_expressions


def execute(path: Path, timeout: int, kernel: str) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(path.parent)}})
    # NotebookClient.execute's steps (nbclient 0.11), with the expressions evaluated before the
    # kernel stops
    client.reset_execution_trackers()
    with client.setup_kernel():
        info = client.wait_for_reply(client.kc.kernel_info())
        nb.metadata["language_info"] = info["content"]["language_info"]
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        client.set_widgets_metadata()
        failed = store_expressions(nb, lambda exprs: evaluate_in_kernel(client.kc, exprs, timeout))
    if failed:
        raise SystemExit(f"{path}: {len(failed)} markdown expressions failed (notebook not written):\n"
                         + "\n".join(f"  cell {i}: {e}: {err}" for i, e, err in failed))
    nbformat.write(nb, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (nbconvert's setting)")
    ap.add_argument("--kernel", default="python3")
    args = ap.parse_args(argv)
    for path in args.notebooks:
        print(f"[execute_notebooks] {path}", flush=True)
        execute(path, args.timeout, args.kernel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
