"""Figures of the INT8 chapter (``book/int8.ipynb``).

The numbers come from :mod:`preln.quant.int8` and :mod:`preln.models.pretrained`; these functions only draw
them (the explorable also quantises its small synthetic activation on the fly, with
:func:`preln.quant.int8.quantize`). Every plot returns a :class:`matplotlib.figure.Figure` built without
pyplot. ``EXPLORABLES`` registers the activation-error explorable for
``preln.chapters.figures.all_explorables``.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from matplotlib.figure import Figure

from preln.quant import int8 as quant
from preln.chapters.viz import PALETTE, control
from preln.chapters.figures.precision import Table

__all__ = ["plot_bits_error", "plot_accumulators", "plot_op_errors", "plot_outlier_channels",
           "plot_sweeps", "plot_weight_bits_decode", "plot_matvec", "plot_weight_only",
           "plot_calibration", "activation_sample", "activation_errors", "plot_activation_error",
           "activation_error_alt", "EXPLORABLES", "OUTLIER_CHANNEL"]

BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, BLACK, YELLOW = PALETTE


def plot_bits_error(bits, errors):
    """Relative error of dequantise(quantise(W)) against the bit width.

    errors: {label: array over ``bits``}; labels with "outlier" are dashed.
    """
    fig = Figure()
    ax = fig.add_subplot()
    colours = {"per tensor": BLUE, "per channel": GREEN}
    for label, err in errors.items():
        c = colours["per tensor" if "tensor" in label else "per channel"]
        ax.plot(bits, err, marker="o", color=c, ls="--" if "outlier" in label else "-", label=label)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("bits (symmetric absmax, q in [-(2$^{b-1}$-1), 2$^{b-1}$-1])")
    ax.set_ylabel("relative error ||W - deq(q(W))|| / ||W||\n(outlier weight excluded)", fontsize=9)
    ax.legend()
    return fig


def plot_accumulators(Ks, int16_wrong, f16_err, f32_err):
    """Dot products of int8 vectors summed one term at a time in three accumulators, against K.

    int16_wrong, f16_err, f32_err: fractions of the dot products that are wrong (int16, float32)
    or off by more than 1 % of a typical result (float16), one per K.
    """
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.add_subplot()
    ax.plot(Ks, 100 * np.asarray(int16_wrong), marker="o", color=VERMILLION,
            label="int16 accumulator: results wrong (%)")
    ax.plot(Ks, 100 * np.asarray(f16_err), marker="s", color=ORANGE,
            label="float16 accumulator: off by > 1 % of a typical result, or inf (%)")
    ax.plot(Ks, 100 * np.asarray(f32_err), marker="^", color=BLUE,
            label="float32 accumulator: results wrong (%)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K, terms per dot product")
    ax.set_ylabel("dot products (%)")
    ax.legend(loc="upper left")
    return fig


def plot_op_errors(ops, errors):
    """Relative error of each intermediate of the quantised block against float64.

    ops: names in forward order; errors: {scheme: [error per op]}.
    """
    fig = Figure(figsize=(6.5, 3.6))
    ax = fig.add_subplot()
    x = np.arange(len(ops))
    for (scheme, err), c, m in zip(errors.items(), [VERMILLION, ORANGE, GREEN, BLUE, PURPLE],
                                   "osD^v"):
        ax.plot(x, err, marker=m, color=c, label=scheme)
    ax.set_xticks(x, ops, rotation=35, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("relative error vs float64")
    ax.legend(ncol=2)
    return fig


def plot_outlier_channels(before, after, channels):
    """max |LN1 output| per feature channel, before and after the injection."""
    fig = Figure(figsize=(6.0, 3.0))
    ax = fig.add_subplot()
    d = np.arange(len(before))
    ax.bar(d - 0.2, before, width=0.4, color=BLUE, label="trained model")
    ax.bar(d + 0.2, after, width=0.4, color=VERMILLION, label="outliers injected (same function)")
    ax.axhline(6.0, color=BLACK, ls=":", lw=1)
    ax.annotate("LLM.int8 threshold 6", (len(before) - 1, 6.0), xytext=(0, 3), ha="right",
                textcoords="offset points", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("feature channel j of LN1's output (layer 0); outliers at " +
                  ", ".join(str(int(c)) for c in channels))
    ax.set_ylabel("max |h$_j$| over tokens")
    ax.legend(loc="upper left")
    return fig


def plot_sweeps(thresholds, ppl_thr, frac_thr, alphas, ppl_alpha, ppl_float, ppl_tensor):
    """LLM.int8's threshold and SmoothQuant's alpha against held-out perplexity (outlier model)."""
    fig = Figure(figsize=(7.0, 3.2))
    ax, bx = fig.subplots(1, 2, sharey=True)
    ax.plot(thresholds, ppl_thr, marker="o", color=GREEN, label="LLM.int8")
    ax.axhline(ppl_float, color=BLACK, ls=":", lw=1, label="float64")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("threshold")
    ax.set_ylabel("held-out perplexity")
    for t, p, f in zip(thresholds, ppl_thr, frac_thr):
        ax.annotate(f"{100 * f:.0f}%", (t, p), xytext=(0, 5), textcoords="offset points",
                    ha="center", fontsize=7)
    ax.legend(loc="upper left")
    bx.plot(alphas, ppl_alpha, marker="s", color=BLUE, label="SmoothQuant, per tensor")
    bx.axhline(ppl_float, color=BLACK, ls=":", lw=1)
    bx.axhline(ppl_tensor, color=VERMILLION, ls="--", lw=1, label="per-tensor W8A8")
    bx.set_xlabel("migration strength alpha")
    bx.legend(loc="upper center")
    return fig


def plot_weight_bits_decode(model, roofs, batches, context, bits=(16, 8, 4), group_size=128):
    """Predicted decode throughput (tokens/s, the roofline's bound) of ``model`` against the batch
    size with its weights stored in 16, 8 and 4 bits, on each of ``roofs`` ({label: Roofline})."""
    from preln.chapters.inference import step_time
    fig = Figure(figsize=(7.2, 3.6))
    axes = fig.subplots(1, len(roofs), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (label, roof) in zip(axes, roofs.items()):
        for b, c, m in zip(bits, [BLUE, ORANGE, GREEN], "os^"):
            g = None if b >= 8 else group_size
            tps = [n / step_time(model, roof, n, 1, context, 2, b, g) for n in batches]
            ax.loglog(batches, tps, marker=m, ms=4, color=c,
                      label=f"{b}-bit weights" + (f", groups of {g}" if g else ""))
        ax.set_xlabel("batch (sequences)")
        ax.set_title(f"{model.name} on {label}, context {context}", fontsize=9)
        ax.minorticks_off()
    for ax in axes:
        ax.set_ylabel("tokens per second (roofline bound)")
    axes[0].legend(loc="upper left")
    return fig


def plot_matvec(rows, bandwidth):
    """Measured time of y = W x per storage format, with the time its bytes need at ``bandwidth``
    (bytes/s, measured): a format below its marker is not memory-bound (its arithmetic binds)."""
    fig = Figure(figsize=(6.8, 3.2))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    ax.barh(y, [1e3 * r.seconds for r in rows], height=0.55, color=BLUE, label="measured (best CPU time)")
    ax.plot([1e3 * r.nbytes / bandwidth for r in rows], y, "D", color=VERMILLION, ms=7,
            label="bytes / measured bandwidth")
    for yy, r in zip(y, rows):
        ax.annotate(f"{r.nbytes / 2**20:.0f} MiB", (1e3 * r.seconds, yy), xytext=(4, -3),
                    textcoords="offset points", fontsize=8)
    ax.set_yticks(y, [r.name for r in rows], fontsize=9)
    ax.set_xlabel("ms per matrix-vector product (one core)")
    ax.set_ylabel("weight storage")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="lower right")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.15)
    return fig


def plot_weight_only(bits, groups, ppl, ppl_float, title=""):
    """Held-out perplexity against bits per weight, one panel per group size, one line per method.

    ppl: {(method, bits, group label): perplexity}; groups: group labels in panel order.
    """
    fig = Figure(figsize=(8.4, 3.2))
    axes = np.atleast_1d(fig.subplots(1, len(groups), sharey=True))
    for ax, g in zip(axes, groups):
        for method, c, m in zip(("rtn", "gptq", "awq"), [VERMILLION, BLUE, GREEN], "os^"):
            ax.plot(bits, [ppl[method, b, g] for b in bits], marker=m, color=c,
                    label={"rtn": "round to nearest", "gptq": "GPTQ", "awq": "AWQ"}[method])
        ax.axhline(ppl_float, color=BLACK, ls=":", lw=1, label="float64")
        ax.set_yscale("log")
        ax.set_xticks(list(bits))
        ax.set_xlabel("bits per weight")
        ax.set_title(f"groups of {g}" if g != "row" else "one scale per row", fontsize=9)
        ax.minorticks_off()
    for ax in axes:
        ax.set_ylabel("held-out perplexity" + (f"\n{title}" if title else ""))
    axes[0].legend(loc="upper right")
    from matplotlib.ticker import LogLocator, ScalarFormatter
    for ax in axes:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
    return fig


def plot_calibration(clips, errors, marks, bits):
    """Mean squared quantisation error of one activation against the clip value c (S = c / qmax),
    with the clips that absmax, percentile and MSE calibration choose marked.

    errors: {label: array over ``clips``}; marks: {method: (clip, error)} for the first label.
    """
    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot()
    for (label, err), c in zip(errors.items(), [BLUE, ORANGE]):
        ax.plot(clips, err, "-", color=c, label=label)
    for (method, (c, e)), colour, m in zip(marks.items(), [VERMILLION, PURPLE, GREEN], "Dso"):
        ax.plot([c], [e], m, color=colour, ms=8, label=method)
    ax.set_yscale("log")
    ax.set_xlabel(f"clip c (the largest value kept), {bits}-bit symmetric grid")
    ax.set_ylabel("mean squared error")
    ax.legend()
    return fig


# ---- the explorable: bits x granularity x outlier scale -> error ----------------------------------
OUTLIER_CHANNEL = 5
_GRANULARITIES = ["per tensor", "per token", "per token + float outliers"]


@lru_cache(maxsize=1)
def activation_sample():
    """A LayerNorm-like activation (64 tokens, 32 features, unit variance), fixed seed."""
    x = np.random.default_rng(11).standard_normal((64, 32))
    x -= x.mean(axis=-1, keepdims=True)
    return x / x.std(axis=-1, keepdims=True)


def activation_errors(bits=8, granularity="per token", outlier=8):
    """Relative error per feature channel of X with channel OUTLIER_CHANNEL scaled by ``outlier``.

    "per token + float outliers" keeps every column with any |x| >= 6 out of the quantisation,
    as LLM.int8's decomposition does. -> (errors (32,), total relative error)
    """
    x = activation_sample().copy()
    x[:, OUTLIER_CHANNEL] *= outlier
    keep = np.zeros(x.shape[1], bool)
    if granularity == "per token + float outliers":
        keep = np.any(np.abs(x) >= 6.0, axis=0)
    xq = np.where(keep, 0.0, x)
    g = "tensor" if granularity == "per tensor" else "token"
    deq = quant.dequantize(quant.quantize(xq, bits, g))
    deq = np.where(keep, x, deq)
    err = np.linalg.norm(deq - x, axis=0) / np.linalg.norm(x, axis=0)
    return err, float(np.linalg.norm(deq - x) / np.linalg.norm(x))


def plot_activation_error(bits=8, granularity="per token", outlier=8):
    err, total = activation_errors(bits, granularity, outlier)
    fig = Figure(figsize=(6.0, 3.2))
    ax = fig.add_subplot()
    j = np.arange(err.size)
    colours = [VERMILLION if k == OUTLIER_CHANNEL else BLUE for k in j]
    # one LineCollection of thick lines is several times faster to draw than 32 bar patches
    ax.vlines(j, 1e-4, np.maximum(err, 1e-4), colors=colours, linewidth=6)
    ax.set_yscale("log")
    ax.set_ylim(1e-4, 2)
    ax.set_xlim(-1, err.size)
    ax.set_xlabel(f"feature channel (red: channel {OUTLIER_CHANNEL}, scaled by {outlier:g})")
    ax.set_ylabel("relative error per channel")
    others = np.median(np.delete(err, OUTLIER_CHANNEL))
    ax.set_title(f"int{bits}, {granularity}: median error of the other channels {others:.2g}",
                 fontsize=10)
    return fig


def activation_error_alt(bits=8, granularity="per token", outlier=8):
    err, total = activation_errors(bits, granularity, outlier)
    others = np.delete(err, OUTLIER_CHANNEL)
    return (f"Bar chart of the relative quantisation error of each of 32 feature channels of a "
            f"unit-variance activation whose channel {OUTLIER_CHANNEL} is scaled by {outlier:g}, "
            f"quantised to int{bits} {granularity}: the other channels' errors have median "
            f"{np.median(others):.2g}, the outlier channel's is {err[OUTLIER_CHANNEL]:.2g}; "
            f"total relative error {total:.2g}.")


EXPLORABLES = {
    "activation_error": (plot_activation_error, {"bits": control("bit width", [4, 8]),
                                                 "granularity": control("scale granularity", _GRANULARITIES),
                                                 "outlier": control("outlier channel scale", [1, 8, 64])}),
}
