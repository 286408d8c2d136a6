"""Figures of the chapter "A real model" (book/real_model.ipynb).

The notebook measures (perplexities of SmolLM2-135M, quantised or not) and checks; this module
draws what it measured. Every plot returns a :class:`matplotlib.figure.Figure` built without
pyplot (so a notebook cell shows it once, when it is the cell's value) and carries its alt text.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from preln.chapters.viz import COLUMN_IN, log_ticks, series_colour, series_name
from preln.nb import set_alt, short_alt

__all__ = ["EXPLORABLES", "plot_bytes_vs_perplexity"]


# one row per model, its dot in its method's colour (preln.chapters.viz.METHOD_COLOURS) and shape
_MARKERS = {"float": "D", "RTN": "o", "GPTQ": "s", "AWQ": "^"}
MAX_POINTS = 10


def _method(label):
    """The method a model's label names (float for the unquantised file)."""
    name = series_name(label)
    return name if name in _MARKERS else "float"


def plot_bytes_vs_perplexity(points, ppl_float):
    """A dot plot: one row per model (its label and the MB of weights a decoded token reads),
    perplexity on a log axis, each dot in its method's colour and labelled with its value, and a
    dashed line at the float32 model's perplexity ``ppl_float``.

    points: [(label, weight bytes, perplexity), ...] (1 to 10), drawn top to bottom in that
    order. The words take the point with the most bytes for the float model and name the lowest
    perplexity among the points at the fewest bytes.
    """
    if not 1 <= len(points) <= MAX_POINTS:
        raise ValueError(f"plot_bytes_vs_perplexity: points must hold 1 to {MAX_POINTS} models, "
                         f"got {len(points)}")
    fig = Figure(figsize=(COLUMN_IN - 0.2, 1.3 + 0.36 * len(points)))
    ax = fig.subplots()
    rows = range(len(points))[::-1]
    for method, marker in _MARKERS.items():       # one series per method, its rows' dots
        mine = [(p, y) for y, (label, _, p) in zip(rows, points) if _method(label) == method]
        if mine:
            ax.plot(*zip(*mine), marker, color=series_colour(method), ms=8, ls="none",
                    label=method)
    for y, (label, nbytes, p) in zip(rows, points):
        ax.annotate(f"{p:.1f}", (p, y), xytext=(7, 0), textcoords="offset points",
                    va="center", fontsize=10, color="0.15")
    ax.axvline(ppl_float, color="0.35", ls="--", lw=1, zorder=0)
    ax.annotate(f"float32: {ppl_float:.1f}", (ppl_float, 1), xycoords=("data", "axes fraction"),
                xytext=(4, 3), textcoords="offset points", ha="left", va="bottom",
                fontsize=10, color="0.25")
    ax.set_xscale("log")
    lo = min(min(p for *_, p in points), ppl_float)
    hi = max(max(p for *_, p in points), ppl_float)
    ax.set_xlim(lo / 1.08, hi * 1.25)        # room for the value beside the rightmost dot
    log_ticks(ax, "x")
    ax.set_ylim(-0.6, len(points) - 0.4)
    ax.set_yticks(list(rows), [f"{label} · {nbytes / 1e6:.0f} MB" for label, nbytes, _ in points])
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("perplexity on the licence text (lower is better)")
    # the rows' header, over their labels: what the MB are (the caption names the model)
    ax.annotate("model \u00b7 weights read per token", (0, 1), xycoords="axes fraction",
                xytext=(-8, 3), textcoords="offset points", ha="right", va="bottom",
                fontsize=10, fontweight="bold")
    # the words: the float model (the most bytes) on its line, then the models at the fewest bytes
    # (the quantised ones: codes packed alike read the same bytes) and the best of them
    mb = {label: nbytes / 1e6 for label, nbytes, _ in points}
    ppl = {label: p for label, _, p in points}
    big, least = max(mb, key=mb.get), min(mb.values())
    small = sorted((label for label in mb if mb[label] == least and label != big), key=ppl.get)
    alt = f"Dot plot of perplexity per model, log axis: float32 {ppl_float:.1f} at {mb[big]:.0f} MB"
    if small:
        alt += (f"; {len(small)} models at {least:.0f} MB: {ppl[small[0]]:.1f} to {ppl[small[-1]]:.1f}, "
                f"lowest {small[0]}")

    def against_line(label):
        ratio = ppl[label] / ppl_float
        return "on the dashed line" if abs(ratio - 1) < 0.005 else f"{ratio:.2f} times the dashed line"

    description = (
        "A dot plot, one row per model, named with the megabytes of weights a decoded token reads; "
        "each dot is the model's perplexity on the licence text, on a log axis, in its method's "
        f"colour (float black, RTN blue, GPTQ vermillion, AWQ green), with a dashed line at the "
        f"float32 perplexity, {ppl_float:.1f}. "
        + " ".join(f"{label[:1].upper() + label[1:]}: {mb[label]:.1f} MB, perplexity {ppl[label]:.1f}, "
                   f"{against_line(label)}." for label in mb))
    if small:
        description += (f" The {len(small)} models at {least:.1f} MB read {mb[big] / least:.1f} times fewer bytes "
                        f"than {big}; the lowest of them is {small[0]}, at {ppl[small[0]]:.1f}, the highest "
                        f"{small[-1]}, at {ppl[small[-1]]:.1f}.")
    return set_alt(fig, short_alt(alt + "."), description)


EXPLORABLES = {}
