"""Figures of the chapter "A real model" (book/real_model.ipynb).

The notebook measures (perplexities of SmolLM2-135M, quantised or not) and checks; this module
draws what it measured. Every plot returns a :class:`matplotlib.figure.Figure` built without
pyplot (so a notebook cell shows it once, when it is the cell's value) and carries its alt text.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from preln.chapters.viz import PALETTE
from preln.nb import set_alt, short_alt

__all__ = ["EXPLORABLES", "plot_bytes_vs_perplexity"]


# one (marker, colour) per model: the quantised models all read the same bytes, so their markers
# sit in one column and only marker shape and colour (and the legend's order) tell them apart
_MARKERS = ["s", "o", "D", "^", "v", "P", "X", "*", "<", ">"]


def plot_bytes_vs_perplexity(points, ppl_float):
    """Perplexity against the MB of weights a decoded token reads, log-log, one marker per model,
    with a dashed line at the float32 model's perplexity ``ppl_float``.

    points: [(label, weight bytes, perplexity), ...] (at most 10); the legend gives each
    perplexity. The words take the point with the most bytes for the float model and name the
    lowest perplexity among the points at the fewest bytes.
    """
    if not 1 <= len(points) <= len(_MARKERS):
        raise ValueError(f"plot_bytes_vs_perplexity: points must hold 1 to {len(_MARKERS)} models, got {len(points)}")
    fig = Figure(figsize=(9.6, 4.2))
    ax = fig.subplots()
    for i, (label, nbytes, p) in enumerate(points):
        ax.plot([nbytes / 1e6], [p], _MARKERS[i], color=PALETTE[i % len(PALETTE)], ms=8, ls="none",
                label=f"{label}: {p:.1f}")
    ax.axhline(ppl_float, color="0.6", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):          # the range spans about a decade: 20, 30, not 2×10^1
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("MB of weights read per decoded token")
    ax.set_ylabel("perplexity on the licence text")
    ax.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    ax.set_title("SmolLM2-135M: perplexity against the bytes a decoded token reads")
    # the words: the float model (the most bytes) on its line, then the models at the fewest bytes
    # (the quantised ones: codes packed alike read the same bytes) and the best of them
    mb = {label: nbytes / 1e6 for label, nbytes, _ in points}
    ppl = {label: p for label, _, p in points}
    big, least = max(mb, key=mb.get), min(mb.values())
    small = sorted((label for label in mb if mb[label] == least and label != big), key=ppl.get)
    alt = f"Perplexity against MB of weights read per token, log-log: float32 {ppl_float:.1f} at {mb[big]:.0f} MB"
    if small:
        alt += (f"; {len(small)} models at {least:.0f} MB: {ppl[small[0]]:.1f} to {ppl[small[-1]]:.1f}, "
                f"lowest {small[0]}")

    def against_line(label):
        ratio = ppl[label] / ppl_float
        return "on the dashed line" if abs(ratio - 1) < 0.005 else f"{ratio:.2f} times the dashed line"

    description = (
        "A log-log scatter of perplexity on the licence text against the megabytes of weights a decoded "
        f"token reads, one marker per model, with a dashed line at the float32 perplexity, {ppl_float:.1f}; "
        "the legend gives each model's perplexity. "
        + " ".join(f"{label[:1].upper() + label[1:]}: {mb[label]:.1f} MB, perplexity {ppl[label]:.1f}, "
                   f"{against_line(label)}." for label in mb))
    if small:
        description += (f" The {len(small)} models at {least:.1f} MB read {mb[big] / least:.1f} times fewer bytes "
                        f"than {big}; the lowest of them is {small[0]}, at {ppl[small[0]]:.1f}, the highest "
                        f"{small[-1]}, at {ppl[small[-1]]:.1f}.")
    return set_alt(fig, short_alt(alt + "."), description)


EXPLORABLES = {}
