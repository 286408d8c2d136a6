"""book/benchmarks.md: every ratio printed in a table equals its columns (issue 34).

A ratio is checked to the precision the page shows: each printed number stands for the interval it
rounds from (22.06 for [22.055, 22.065]), and the ratio's interval must meet the interval of the
quotient of its columns' intervals. A row that mixes two runs (the old "eval forward" row, 192.2 ms
against 157.0 ms printed as 0.82x) fails; a ratio computed from the unrounded times passes.
"""
import math
import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "book" / "benchmarks.md"
#: float round-off on the interval ends (the intervals themselves come from the shown precision)
ROUND_OFF = 1e-12
_NUMBER = re.compile(r"^[-+]?\d+(?:\.(\d+))?")


def list_tables(text):
    """{caption: (header, rows)} of every ```{list-table}``` of a MyST page; cells are strings."""
    tables = {}
    for m in re.finditer(r"```\{list-table\} (.*?)\n(.*?)```", text, re.S):
        rows = []
        for line in m.group(2).splitlines():
            if line.startswith("* - "):
                rows.append([line[4:].strip()])
            elif line.startswith("  - ") and rows:
                rows[-1].append(line[4:].strip())
        tables[m.group(1).strip()] = (rows[0], rows[1:])
    return tables


def table(text, caption_start):
    hits = [v for k, v in list_tables(text).items() if k.startswith(caption_start)]
    assert len(hits) == 1, f"expected one table whose caption starts {caption_start!r}; found {len(hits)}"
    return hits[0]


def shown(cell, exact=False):
    """'22.06' -> [(22.06, 0.005)]: a printed number and the half unit of its last digit (0 for an
    exact count, ``exact=True``). A cell of several runs, '22.06, 22.52', gives one pair per run."""
    values = []
    for part in cell.split(","):
        m = _NUMBER.match(part.strip())
        if m is None:
            raise ValueError(f"cell: expected a number (optionally followed by a unit); got {cell!r}")
        decimals = len(m.group(1) or "")
        values.append((float(m.group(0)), 0.0 if exact else 0.5 * 10.0 ** -decimals))
    return values


def interval(value, half):
    return value - half, value + half


def quotient(a, b):   # two intervals of positive numbers -> the interval of a / b
    return a[0] / b[1], a[1] / b[0]


def product(a, b):
    return a[0] * b[0], a[1] * b[1]


def meets(printed, computed):
    """True when the printed ratio's interval and the computed one overlap."""
    lo, hi = interval(*printed)
    return lo <= computed[1] * (1 + ROUND_OFF) and computed[0] <= hi * (1 + ROUND_OFF)


def runs(cell, n, exact=False):
    """A cell's values, one per run: a single value stands for every run."""
    values = shown(cell, exact)
    if len(values) == 1:
        return values * n
    assert len(values) == n, f"expected {n} runs' values; got {cell!r}"
    return values


def ratio_ok(ratio_cell, num_cell, den_cell, scale=1.0, exact=()):
    """Whether the printed ratio equals scale x numerator / denominator to the shown precision;
    exact: which of "num", "den" are exact counts."""
    num, den, ratio = shown(num_cell), shown(den_cell), shown(ratio_cell)
    n = max(len(num), len(den), len(ratio))
    return all(meets(r, tuple(scale * q for q in quotient(interval(*a), interval(*b))))
               for r, a, b in zip(runs(ratio_cell, n), runs(num_cell, n, "num" in exact),
                                  runs(den_cell, n, "den" in exact)))


def column_ratios(caption_start, checks, text=None):
    """[(row, ratio column)] of every failing ratio; checks: {ratio column: (numerator, denominator)}."""
    header, rows = table(PAGE.read_text() if text is None else text, caption_start)
    col = {name: i for i, name in enumerate(header)}
    bad = []
    for row in rows:
        for r, (a, b) in checks.items():
            if row[col[r]] in ("–", "-") or row[col[a]] in ("–", "-"):
                continue                                   # nothing to compare (no row-blocked version)
            if not ratio_ok(row[col[r]], row[col[a]], row[col[b]]):
                bad.append((row[0], r, row[col[r]], row[col[a]], row[col[b]]))
    return bad


BLOCK = {"numpy / PyTorch": ("numpy ms", "PyTorch ms"), "numpy / matmuls": ("numpy ms", "its matmuls ms")}


def test_the_block_table_ratios_equal_their_columns():
    assert column_ratios("One block, numpy against PyTorch", BLOCK) == []


def test_the_check_rejects_a_row_that_mixes_runs():
    """The row issue 34 found: 192.2 / 157.0 = 1.22, printed as 0.82x."""
    old = """```{list-table} One block, numpy against PyTorch (old)
:header-rows: 1

* - pass
  - numpy ms
  - PyTorch ms
  - numpy / PyTorch
  - its matmuls ms
  - numpy / matmuls
* - eval forward (tiled attention)
  - 192.2
  - 157.0
  - 0.82x
  - 101.4
  - 1.09x
```
"""
    bad = column_ratios("One block", BLOCK, text=old)
    assert [b[1] for b in bad] == ["numpy / PyTorch", "numpy / matmuls"]
    assert not ratio_ok("1.23x", "192.2", "157.0") and ratio_ok("1.22x", "192.2", "157.0")
    assert ratio_ok("43.5x", "68.61", "1.58")         # within the columns' rounding: 43.28 .. 43.56
    assert not ratio_ok("96.9 %", "150", "155", scale=100, exact=("num", "den"))   # 96.77 %


def test_the_speed_targets_quote_the_block_table():
    header, rows = table(PAGE.read_text(), "One block, numpy against PyTorch")
    ratios = {row[0].split(" (")[0]: dict(zip(header, row)) for row in rows}
    _, targets = table(PAGE.read_text(), "Speed targets")
    for target, measured, _ in targets:
        name, ref = re.match(r"(.+?) <= [\d.]+x (PyTorch|its matmuls)", target).groups()
        column = "numpy / PyTorch" if ref == "PyTorch" else "numpy / matmuls"
        assert measured.startswith(ratios[name][column] + " in this run"), (target, measured)


def test_the_fused_kernel_speed_ups_equal_their_columns():
    assert column_ratios("Fused kernels against numpy", {"speed-up": ("numpy op by op ms", "fused ms")}) == []


def test_the_decode_table_ratios_equal_their_columns():
    assert column_ratios("Decode with and without the KV cache",
                         {"without / with": ("without ms/token", "with cache ms/token")}) == []
    header, rows = table(PAGE.read_text(), "Decode with and without the KV cache")
    col = {name: i for i, name in enumerate(header)}
    for row in rows:     # tokens/s = batch tokens per step over the step's time
        assert ratio_ok(row[col["tokens/s with cache"]], row[col["batch"]], row[col["with cache ms/token"]],
                        scale=1000, exact=("num",)), row


def test_the_smollm2_ratios_and_bounds_equal_their_columns():
    text = PAGE.read_text()
    header, rows = table(text, "SmolLM2-135M decode")
    col = {name: i for i, name in enumerate(header)}
    by_model = {row[0]: row for row in rows}
    tok = col["tokens/s (run 1, run 2)"]
    for row in rows:
        for column, ref in (("vs torch eager", "torch eager (transformers)"), ("vs preln float32", "preln float32")):
            assert ratio_ok(row[col[column]], row[tok], by_model[ref][tok]), (row[0], column)
    bw = [float(g) for g in re.search(r"([\d.]+) GB/s in run 1 and ([\d.]+) GB/s in run 2", text).groups()]
    kv = shown(re.search(r"KV cache, ([\d.]+) MB per token", text).group(1))[0]
    for row in rows:     # of bound = tokens/s x (its weights + the KV cache) / that run's bandwidth
        weights = shown(row[col["weights MB"]])[0]
        nbytes = tuple(1e6 * (w + k) for w, k in zip(interval(*weights), interval(*kv)))
        for run, (t, frac) in enumerate(zip(runs(row[tok], 2), runs(row[col["of bound"]], 2))):
            bound = quotient(product(interval(*t), nbytes), interval(bw[run] * 1e9, 0.05e9))
            assert meets(frac, (100 * bound[0], 100 * bound[1])), (row[0], run + 1, frac)


def test_the_grading_tables_equal_their_columns():
    header, rows = table(PAGE.read_text(), "Mutants of the reference solutions")
    col = {name: i for i, name in enumerate(header)}
    for row in rows:
        assert ratio_ok(row[col["score"]], row[col["caught"]], row[col["mutants"]], scale=100,
                        exact=("num", "den")), row
    header, rows = table(PAGE.read_text(), "Grading time per notebook")
    col = {name: i for i, name in enumerate(header)}
    for row in rows:
        assert ratio_ok(row[col["s per notebook"]], row[col["wall"]], row[col["notebooks"]], exact=("den",)), row
        assert ratio_ok(row[col["notebooks per hour"]], row[col["notebooks"]], row[col["wall"]], scale=3600,
                        exact=("num",)), row


@pytest.mark.parametrize("cell, expected", [("22.06", [(22.06, 0.005)]), ("72.7 %, 70.3 %", [(72.7, 0.05), (70.3, 0.05)]),
                                            ("894 s", [(894.0, 0.5)]), ("1.00x", [(1.0, 0.005)])])
def test_shown_reads_the_precision_of_a_cell(cell, expected):
    assert all(math.isclose(a, c) and math.isclose(b, d) for (a, b), (c, d) in zip(shown(cell), expected))
    assert len(shown(cell)) == len(expected)


def test_shown_rejects_a_cell_without_a_number():
    with pytest.raises(ValueError, match="cell: expected a number"):
        shown("PASS")
