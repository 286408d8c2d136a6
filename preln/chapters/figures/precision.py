"""Figures and tables of the Precision chapter (``book/precision.ipynb``).

The numbers come from :mod:`preln.chapters.numerics` and the block; these functions only draw them. Every
plot returns a :class:`matplotlib.figure.Figure` built without pyplot, so a notebook cell shows it
once, as the cell's value. ``EXPLORABLES`` registers the overflow map for
``preln.chapters.figures.all_explorables``.
"""
from __future__ import annotations

import html
import math
import textwrap

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from preln.chapters import numerics
from preln.chapters.viz import (COLUMN_IN, OKABE_ITO, PALETTE, control, direct_labels,
                                series_colour, table_caption, tex_number)
from preln.nb import OUTPUT_COLUMNS, listed, set_alt, short_alt, sig

__all__ = ["Table", "dtype_colour", "plot_number_line", "plot_softmax_overflow", "plot_layernorm_thresholds",
           "plot_overflow_map", "overflow_map_alt", "plot_stream_growth", "plot_loss_scale_window",
           "plot_dynamic_scaling", "EXPLORABLES"]

BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, BLACK, YELLOW = PALETTE
#: colours of numerics.STATUS: finite, silent LayerNorm failure, inf, NaN
# Areas of a map, not thin lines: the published (light) Okabe-Ito sky blue and yellow, which stay
# apart from vermillion and black under deuteranopia and protanopia (the darkened orange would not:
# CIELAB distance 1.3 from vermillion under deuteranopia); the legend's swatches get a black edge,
# which stands out from the white page whatever their fill.
STATUS_COLOURS = [OKABE_ITO[4], OKABE_ITO[7], VERMILLION, BLACK]
#: direct labels stacked in one column stay this far apart (points): a 10 pt line and a little air
STACK_GAP_PT = 13.0




def _sci(x):
    """A format limit in words: whole numbers as they are (65504), others to 2 figures (3.4e38, 6e-8)."""
    if x == int(x) and x < 1e6:
        return str(int(x))
    return f"{x:.2g}".replace("e+", "e").replace("e-0", "e-")




def _under(fraction):
    """The power of ten a fraction (as a percentage) stays under: counts of single entries move with
    the CPU's kernels, so only their decade goes into words ("under 0.1 %")."""
    return f"under {10.0 ** math.ceil(math.log10(100 * fraction)):g} %" if fraction > 0 else "at 0 %"


class Table:
    """A small table shown as HTML in a notebook and as aligned text elsewhere."""

    def __init__(self, columns, rows, caption=None, compact=False):
        self.columns, self.rows, self.caption = list(columns), [list(r) for r in rows], caption
        self.compact = compact

    def _repr_html_(self):
        e = html.escape
        pad = ' style="padding: 0.15em 0.8em; text-align: right"'
        cell = pad
        if self.compact:   # a wide table in a 688 px column: headers wrap between words, a number
            # never breaks (1.175e-38 not at its "-"), narrower padding
            pad = ' style="padding: 0.15em 0.4em; text-align: right; vertical-align: bottom"'
            cell = ' style="padding: 0.15em 0.4em; text-align: right; white-space: nowrap"'
        head = "".join(f'<th scope="col"{pad}>{e(str(c))}</th>' for c in self.columns)
        # each row is named by its first cell (a format, a dtype, a width)
        body = "".join(f'<tr><th scope="row"{cell}>{e(str(r[0]))}</th>'
                       + "".join(f"<td{cell}>{e(str(v))}</td>" for v in r[1:]) + "</tr>" for r in self.rows)
        cap = f"<caption>{e(table_caption(self.caption, self.columns))}</caption>"
        return f'<table class="preln-table">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def __repr__(self):
        cells = [self.columns] + [[str(v) for v in r] for r in self.rows]
        widths = [max(len(str(r[i])) for r in cells) for i in range(len(self.columns))]
        head = [[str(c)] for c in self.columns]
        if sum(widths) + 2 * (len(widths) - 1) > OUTPUT_COLUMNS:
            # wider than the output column: each header wraps between its words, down to the
            # width of its column's values (or of its longest word)
            widths = [max([len(w) for w in str(c).split()]
                          + [len(str(r[i])) for r in self.rows]) for i, c in enumerate(self.columns)]
            wrap = lambda i, w: textwrap.wrap(str(self.columns[i]), w) or [""]  # noqa: E731
            # then the room left goes to the header with the most lines: just wide enough for one
            # line fewer, while the table still fits
            while True:
                i = max(range(len(widths)), key=lambda i: len(wrap(i, widths[i])))
                n, w = len(wrap(i, widths[i])), widths[i]
                while len(wrap(i, w)) == n and n > 1:
                    w += 1
                if n == 1 or sum(widths) + w - widths[i] + 2 * (len(widths) - 1) > OUTPUT_COLUMNS:
                    break
                widths[i] = w
            head = [wrap(i, widths[i]) for i in range(len(widths))]
        depth = max(len(h) for h in head)
        head = [[""] * (depth - len(h)) + h for h in head]      # a header's last line by its values
        cells = [[h[k] for h in head] for k in range(depth)] + [[str(v) for v in r] for r in self.rows]
        lines = ["  ".join(str(v).rjust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
        return "\n".join(([self.caption] if self.caption else []) + lines)


def dtype_colour(name):
    """The book's colour of a number format (viz.DTYPE_COLOURS): float8_e4m3fn and float8_e5m2 are fp8."""
    return series_colour("fp8" if name.startswith("float8") else name)


def plot_number_line(rows):
    """Positive range of each format on a log axis: subnormals (light), normals (solid), eps (tick).

    rows: numerics.format_rows(). Each format in its colour of the whole book (series_colour).
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.0))
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        c = dtype_colour(r["name"])
        lo, mid, hi = (math.log10(r[k]) for k in ("min_subnormal", "min_normal", "max"))
        ax.barh(i, mid - lo, left=lo, height=0.5, color=c, alpha=0.35, hatch="//", edgecolor=c)
        ax.barh(i, hi - mid, left=mid, height=0.5, color=c)
        ax.annotate(f"max {tex_number(r['max'])}", (hi, i), xytext=(4, 0), textcoords="offset points",
                    va="center", color=c, fontsize=10)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows])
    ax.set_xlabel(r"$\log_{10}\,|\mathrm{value}|$ (hatched: subnormal, solid: normal)")
    ax.set_xlim(-47, 48)
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    alt = (f"Ranges of {len(rows)} number formats on a log axis, largest values: "
           + ", ".join(f"{r['name']} {_sci(r['max'])}" for r in rows) + ".")
    description = ("One bar per format on a log10 axis of |value| from 1e-47 to 1e48: a hatched segment "
                   "for the subnormal range, from the smallest subnormal to the smallest normal value, then "
                   "a solid segment for the normal range, up to the largest value, which labels the bar. "
                   + " ".join(f"{r['name']}: subnormals from {_sci(r['min_subnormal'])}, normals from "
                              f"{_sci(r['min_normal'])} to {_sci(r['max'])}." for r in rows))
    return set_alt(fig, short_alt(alt), description)


def plot_softmax_overflow(t, naive, safe, threshold):
    """Largest softmax probability of the row [t, 0] in float16, naive and with max-subtraction.

    t: logits (1-D); naive, safe: the probability of the first entry (NaN where it failed).
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.4))
    ax = fig.add_subplot()
    ok = np.isfinite(naive)
    if not ok.all():            # where the naive softmax gives NaN: a band, named inside it
        ax.axvspan(t[~ok].min(), t.max(), color=VERMILLION, alpha=0.12, lw=0)
        ax.text((t[~ok].min() + t.max()) / 2, 0.6, "naive:\nNaN", ha="center", va="center",
                color=VERMILLION, fontsize=10)
    ax.plot(t, safe, color=BLUE, label="subtract max (safe)")
    ax.plot(t[ok], naive[ok], color=VERMILLION, ls="--", label="no max subtraction (naive)")
    ax.axvline(threshold, color=BLACK, lw=1, ls=":")
    top = round(math.exp(threshold))       # max + ulp/2 of the format: 65520 in float16
    ax.annotate(f"$\\ln {top} = {threshold:.4g}$", (threshold, 0.5), xytext=(-4, 0),
                textcoords="offset points", ha="right", va="center", fontsize=10)
    # the two curves coincide until the overflow: named together, under them, where no data is
    x_words = t.min() + 0.28 * (t.max() - t.min())
    ax.text(x_words, 0.76, "solid: subtract the max (safe)", color=BLUE, fontsize=10)
    ax.text(x_words, 0.69, "dashed: no max subtraction (naive),\nthe same until exp overflows",
            color=VERMILLION, fontsize=10, va="top")
    ax.set_xlabel("logit $t$ of the row $[t, 0]$ (float16)")
    ax.set_ylabel("softmax probability of $t$")
    ax.set_ylim(0.45, 1.02)
    span = f"t from {t.min():.3g} to {t.max():.3g}"
    rise = f"from {sig(safe.min())} to {sig(safe.max())}"
    if ok.all():
        naive_alt = "without, it stays finite"
        naive_words = "Without it (dashed vermillion) every output stays finite."
    else:
        first = t[~ok].min()
        same = np.allclose(naive[ok & (t < first)], safe[ok & (t < first)], atol=1e-3)
        naive_alt = f"without, NaN from t = {first:.4g}" + (" on" if (~ok)[t >= first].all() else "")
        naive_words = (f"Without it (dashed vermillion) the curve {'is the same as the safe one' if same else 'differs'}"
                       f" up to t = {first:.4g}, where exp overflows and the output becomes NaN"
                       + (" for every larger t" if (~ok)[t >= first].all() else "")
                       + ", shaded as a band.")
    alt = (f"Float16 softmax probability of t in the row [t, 0], {span}: with max-subtraction it rises {rise}; "
           f"{naive_alt}.")
    description = (f"Softmax probability of the logit t in the row [t, 0], computed in float16, for {span}. "
                   f"With max-subtraction (solid blue) it rises smoothly {rise}. {naive_words} A dotted "
                   f"vertical line marks ln {top} = {threshold:.4g}.")
    return set_alt(fig, short_alt(alt), description)


def plot_layernorm_thresholds(ds, empirical):
    """rms at which a float16 sum of squares overflows, against the width D: closed form and bisection."""
    fig = Figure()
    ax = fig.add_subplot()
    dd = np.geomspace(min(ds), max(ds), 200)
    ax.plot(dd, np.sqrt(65520.0 / dd), color=BLUE, label="closed form $\\sqrt{65520/D}$")
    ax.scatter(ds, empirical, color=VERMILLION, marker="o", zorder=3,
               label="bisection with the naive LayerNorm")
    ax.fill_between(dd, np.sqrt(65520.0 / dd), 20, color=VERMILLION, alpha=0.08)
    ax.text(600, 16, "variance = inf:\noutput silently 0", fontsize=9, color=VERMILLION)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("model width D")
    ax.set_ylabel("input rms at overflow")
    ax.set_ylim(0, 20)
    # direct labels under the curve, in the white (finite) region, each led to its series: the
    # shaded band above is the region the text there names
    d = np.sort(np.asarray(ds, dtype=float))
    gap = int(np.argmax(np.diff(np.log(d))))
    on_curve = float(np.sqrt(d[gap] * d[gap + 1]))     # between two points: the curve's own label
    ax.annotate("closed form $\\sqrt{65520/D}$", (on_curve, np.sqrt(65520.0 / on_curve)),
                xytext=(d[0] * 1.05, 0.35 * np.sqrt(65520.0 / d[0])), fontsize=9, color=BLUE,
                ha="left", va="center", arrowprops=dict(arrowstyle="-", color=BLUE, lw=0.8, shrinkB=3))
    k = int(np.argsort(np.asarray(ds))[-2])            # the second-widest point
    ax.annotate("bisection, naive LayerNorm", (ds[k], empirical[k]), xytext=(d[-1], 0.35 * empirical[k]),
                fontsize=9, color=VERMILLION, ha="right", va="center",
                arrowprops=dict(arrowstyle="-", color=VERMILLION, lw=0.8, shrinkB=4))
    off = float(np.max(np.abs(np.asarray(empirical) / np.sqrt(65520.0 / np.asarray(ds, dtype=float)) - 1)))
    closed = np.sqrt(65520.0 / np.array([min(ds), max(ds)], dtype=float))
    # the bisection stops at a float16 spacing, about 1e-3 of the value: say "on it" within 1 %
    on = "lie on it" if off < 0.01 else f"lie up to {off:.0%} off it"
    alt = (f"Input rms at which a float16 LayerNorm overflows, D = {min(ds)} to {max(ds)}: √(65520/D) "
           f"falls from {closed[0]:.3g} to {closed[-1]:.3g}; the bisection points {on}.")
    description = (f"Input rms at which a float16 LayerNorm's sum of squares overflows, against the model "
                   f"width D from {min(ds)} to {max(ds)} on a log2 axis. The closed-form curve √(65520/D) "
                   f"falls from {closed[0]:.3g} to {closed[-1]:.3g}, and the points found by bisection with "
                   f"the package's naive LayerNorm {on}: "
                   + ", ".join(f"{e:.3g} at D = {d}" for d, e in zip(ds, empirical))
                   + ". The region above the curve is shaded: there the variance is inf and the output "
                     "silently zero.")
    return set_alt(fig, short_alt(alt), description)


def plot_overflow_map(dtype="float16", policy="naive", depth=1):
    """Where the residual stream of a Pre-LN stack stops being finite: input rms x model width,
    after block ``depth``.

    Reads the stored grids (:func:`preln.chapters.numerics.overflow_map`, which the chapter and the
    tests check against :func:`preln.chapters.numerics.overflow_grid`); the line is the closed form
    sqrt(65520 / D), a diagonal on these log axes.
    """
    grid = numerics.overflow_map(dtype, policy, depth)               # (widths, n_scales)
    scales, widths = np.log2(numerics.GRID_SCALES), np.log2(numerics.GRID_D)
    fig = Figure(figsize=(6.0, 3.6))
    ax = fig.add_subplot()
    cmap = ListedColormap(STATUS_COLOURS)
    norm = BoundaryNorm(np.arange(-0.5, 4.5), cmap.N)
    step = scales[1] - scales[0]
    ax.imshow(grid, origin="lower", aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
              extent=(scales[0] - step / 2, scales[-1] + step / 2, widths[0] - 0.5, widths[-1] + 0.5))
    # d * rms^2 = 65520: log2 rms = (log2 65520 - log2 d) / 2
    y = np.array([widths[0] - 0.5, widths[-1] + 0.5])
    ax.plot(0.5 * (math.log2(65520.0) - y), y, color=BLACK, lw=1.2, ls="--")
    ax.text(0.5 * (math.log2(65520.0) - y[1]) + 0.3, widths[-1] + 0.1, "$\\sqrt{65520/D}$",
            fontsize=9)
    ax.set_yticks(widths, [str(d) for d in numerics.GRID_D])
    ax.set_xlabel("log$_2$ input rms")
    ax.set_ylabel("model width $D$")
    ax.set_title(f"{dtype}, {policy} policy, after block {depth}", fontsize=11)
    ax.grid(False)
    handles = [Patch(facecolor=c, edgecolor=BLACK, lw=0.8, label=lab) for c, lab in zip(STATUS_COLOURS, numerics.STATUS)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return fig


def overflow_map_alt(dtype="float16", policy="naive", depth=1):
    """Alt text for one frame of the overflow map, from the grid it shows."""
    grid = numerics.overflow_map(dtype, policy, depth)
    scales, widths = numerics.GRID_SCALES, numerics.GRID_D
    parts = []
    for k, name in enumerate(numerics.STATUS[1:], start=1):
        first = [int(np.argmax(row == k)) if (row == k).any() else None for row in grid]
        if any(f is not None for f in first):
            parts.append(f"{name} from input rms "
                         + ", ".join(f"{sig(scales[f], 3)} at D = {d}" for d, f in zip(widths, first)
                                     if f is not None))
    return (f"Heat map of input rms (x, log scale 1 to 32768) against model width D = "
            f"{widths[0]} to {widths[-1]} (y) for a {dtype} Pre-LN stack with the {policy} policy, "
            f"after block {depth}: " + ("; ".join(parts) if parts else "finite everywhere")
            + ". The dashed diagonal marks √(65520/D).")


def plot_stream_growth(curves, widths, xavier=None):
    """Per-token mean square of the residual stream against depth, with the float16 thresholds.

    curves: {D: array over depth 0..L of max_token_ss / D} (PyTorch's initialisation);
    widths: the D whose 65520/D is drawn; xavier: optional {D: array} for Xiong et al.'s theory
    setting (Xavier initialisation), drawn dashed.
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.8))
    ax = fig.add_subplot()
    for (d, m), c in zip(curves.items(), [BLUE, GREEN, PURPLE]):
        ax.plot(np.arange(len(m)), m, color=c, label=f"PyTorch init, $D = {d}$")
    # not orange: dashed like the vermillion limits, and the same colour as them under deuteranopia
    for (d, m), c in zip((xavier or {}).items(), [BLACK, SKY]):
        ax.plot(np.arange(len(m)), m, color=c, ls="--", label=f"Xavier init (theory), $D = {d}$")
    for D, ls in zip(widths, ["-", "--", ":"]):
        ax.axhline(65520.0 / D, color=VERMILLION, ls=ls, lw=1.2,
                   label=f"float16 limit for $D = {D}$")
    ax.set_xlabel("depth $l$ (blocks applied)")
    ax.set_ylabel("mean square per token")
    ax.set_title("Residual stream (float32) against float16 LayerNorm's limit $65520/D$",
                 loc="left", fontsize=11)
    # the curves named where they end, the limits at the right edge: one column of names, spaced
    # a line apart (the widths' limits and the curves' ends can lie close together)
    direct_labels(ax, max_series=len(curves) + len(xavier or {}) + len(widths), gap_pt=STACK_GAP_PT)
    limits = {D: 65520.0 / D for D in widths}

    def reading(name, d, m):
        crossed = [f"D = {D} at block {np.nonzero(m >= lim)[0][0]}"
                   for D, lim in limits.items() if (m >= lim).any()]
        missed = [f"D = {D}" for D, lim in limits.items() if not (m >= lim).any()]
        return (f"{name} at D = {d}: from {sig(m[0])} to {sig(m[-1])} over {len(m) - 1} blocks"
                + (", crossing the limit for " + ", ".join(crossed) if crossed else "")
                + (", below the limit for " + ", ".join(missed) if missed else "") + ".")

    def growth(group):               # mean square added per block, over a group's curves
        return np.mean([(m[-1] - m[0]) / (len(m) - 1) for m in group.values()])

    torch = max(curves.values(), key=len)
    alt = (f"Per-token mean square of the residual stream against depth: PyTorch init reaches {sig(torch[-1])} "
           f"in {len(torch) - 1} blocks")
    if xavier:
        fast = next(iter(xavier.values()))
        alt += (f", Xavier init {sig(fast[-1])} in {len(fast) - 1}, {sig(growth(xavier) / growth(curves))} "
                "times faster")
    description = ("Largest per-token mean square of the residual stream against depth, for float32 Pre-LN "
                   "stacks. Solid lines: the package's blocks with PyTorch's initialisation. "
                   + ("Dashed: Xiong et al.'s theory setting with Xavier initialisation. " if xavier else "")
                   + "Horizontal vermillion lines mark the float16 LayerNorm limits 65520/D: "
                   + ", ".join(f"{sig(lim)} for D = {D}" for D, lim in limits.items()) + ". "
                   + " ".join(reading("PyTorch's initialisation", d, m) for d, m in curves.items()) + " "
                   + " ".join(reading("Xavier initialisation", d, m) for d, m in (xavier or {}).items()))
    return set_alt(fig, short_alt(alt + "."), description)


def plot_loss_scale_window(rows, best):
    """Fraction of gradient entries flushed to zero / overflowed against log2(loss scale)."""
    fig = Figure()
    ax = fig.add_subplot()
    k = np.log2([r["scale"] for r in rows])
    ax.plot(k, [100 * r["flushed"] for r in rows], color=BLUE, marker="o",
            label="flushed to 0 (underflow)")
    ax.plot(k, [100 * r["overflowed"] for r in rows], color=VERMILLION, marker="s",
            label="inf or NaN (overflow)")
    ax.axvline(math.log2(best), color=BLACK, ls=":", lw=1)
    ax.annotate("65504 / max|grad|", (math.log2(best), 50), xytext=(-4, 0), ha="right",
                textcoords="offset points", fontsize=9)
    ax.set_xlabel("log$_2$ loss scale")
    ax.set_ylabel("gradient entries lost (%)")
    ax.legend(loc="center left")
    flushed = np.array([r["flushed"] for r in rows])
    over = np.array([r["overflowed"] for r in rows])
    window = k[flushed + over < 0.01]
    window_words = (f"less than 1 % is lost from 2^{window[0]:g} to 2^{window[-1]:g}" if window.size
                    else "at every scale at least 1 % is lost")
    alt = (f"Gradient entries lost against log2 loss scale {k[0]:g} to {k[-1]:g}: {sig(100 * flushed[0])} % "
           f"flush to 0 at 2^{k[0]:g}; {window_words}"
           + (f"; overflow from 2^{k[over > 0][0]:g}." if over.any() else "; no overflow."))
    description = (f"Percentage of gradient entries lost against log2 of the loss scale from {k[0]:g} to "
                   f"{k[-1]:g}: circles, entries flushed to zero (underflow); squares, entries that became "
                   f"inf or NaN (overflow). At a scale of 2^{k[0]:g}, {sig(100 * flushed[0])} % of the entries "
                   f"flush to zero and {sig(100 * over[0])} % overflow; {window_words}. A dotted line marks "
                   f"65504 / max|grad| = 2^{math.log2(best):.3g}.")
    if over.any():
        description += (f" Overflow (inf or NaN) first appears at 2^{k[over > 0][0]:g}"
                        + (f" and reaches 100 % at 2^{k[over >= 1][0]:g}" if (over >= 1).any() else "") + ".")
    return set_alt(fig, short_alt(alt), description)


def plot_dynamic_scaling(run, grad_rms):
    """Dynamic loss scaling over steps: the scale, the headroom 65504 / max|grad|, skipped steps,
    and the entries lost with and without the scaler."""
    fig = Figure(figsize=(COLUMN_IN - 0.2, 5.6))
    ax, bx = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    steps = np.arange(len(run["scale"]))
    ax.plot(steps, np.log2(run["scale"]), color=BLUE, drawstyle="steps-post", label="loss scale")
    ax.plot(steps, np.log2(65504.0 / run["max_abs"]), color=BLACK, ls=":",
            label="overflow above this")
    sk = run["skipped"]
    ax.scatter(steps[sk], np.log2(run["scale"][sk]), marker="x", color=VERMILLION, zorder=3)
    if sk.any():     # the crosses named once, below the last of them, where the staircase is not
        last = steps[sk][-1]
        ax.annotate("overflow: step skipped,\nscale halved", (last, np.log2(run["scale"][last])),
                    xytext=(12, -34), textcoords="offset points", ha="left", va="top",
                    color=VERMILLION, fontsize=10,
                    arrowprops=dict(arrowstyle="-", color=VERMILLION, lw=0.8, shrinkB=4))
    ax.set_ylabel(r"$\log_2$ scale")
    direct_labels(ax)
    # not blue: the lower panel's series are other quantities than the loss scale above
    bx.plot(steps, 100 * run["flushed_unscaled"], color=ORANGE, label="no loss scaling")
    bx.plot(steps, 100 * run["flushed"], color=GREEN, label="dynamic loss scaling")
    bx.set_ylabel("entries lost (%)")
    bx.set_xlabel("step (upstream gradient rms falls from "
                  f"$2^{{{math.log2(grad_rms[0]):.0f}}}$ to $2^{{{math.log2(grad_rms[-1]):.0f}}}$)")
    direct_labels(bx, gap_pt=STACK_GAP_PT)
    log_scale, bound = np.log2(run["scale"]), np.log2(65504.0 / run["max_abs"])
    grown = np.nonzero(np.diff(log_scale) > 0)[0]
    every = f", and otherwise doubles every {np.median(np.diff(grown)):g} steps" if grown.size > 1 else ""
    kept = ~sk
    spikes = np.nonzero(np.diff(grad_rms) > 0)[0] + 1          # rises in a falling gradient
    below = "below" if np.all(log_scale[kept] <= bound[kept]) else "partly above"
    lost = _under(np.nanmax(run["flushed"]))
    alt = (f"Dynamic loss scaling over {len(steps)} steps: {sk.sum()} overflowing step{'s' if sk.sum() != 1 else ''} "
           f"skipped, the scale halved; entries lost stay {lost}, against up to "
           f"{sig(100 * run['flushed_unscaled'].max())} % unscaled.")
    description = (f"Two panels over {len(steps)} steps, while the upstream gradient rms falls from "
                   f"2^{math.log2(grad_rms[0]):.0f} to 2^{math.log2(grad_rms[-1]):.0f}"
                   + (f" (with a spike at step{'s' if spikes.size > 1 else ''} {listed(str(i) for i in spikes)})"
                      if spikes.size else "")
                   + f". Top: log2 of the loss scale, a staircase that starts at {log_scale[0]:g}, is halved at "
                   f"each overflow (crosses "
                   f"mark the skipped steps, " + listed(str(i) for i in steps[sk]) + f"){every}; it stays "
                   f"{below} the dotted overflow bound log2(65504 / max|grad|), which goes from "
                   f"{bound[0]:.0f} to {bound[-1]:.0f}. Bottom: percentage of gradient entries lost: without "
                   f"loss scaling (orange) it goes from {_under(run['flushed_unscaled'][0])} to "
                   f"{sig(100 * run['flushed_unscaled'][-1])} %; with dynamic scaling (green) it stays {lost}.")
    return set_alt(fig, short_alt(alt), description)


EXPLORABLES = {
    "overflow_map": (plot_overflow_map, {"dtype": control("number format", numerics.GRID_DTYPES),
                                         "policy": control("precision policy", numerics.GRID_POLICIES),
                                         "depth": control("blocks applied", numerics.MAP_DEPTHS)}),
}
