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
from matplotlib.ticker import FuncFormatter, LogLocator

from preln.quant import int8 as quant
from preln.chapters.viz import (COLUMN_IN, PALETTE, control, direct_labels, legend_outside, log_ticks,
                                series_colour, series_name)
from preln.chapters.figures.precision import Table
from preln.nb import set_alt, short_alt, span

__all__ = ["plot_bits_error", "plot_accumulators", "plot_op_errors", "plot_outlier_channels",
           "plot_sweeps", "plot_weight_bits_decode", "plot_matvec", "plot_weight_only",
           "plot_calibration", "activation_sample", "activation_errors", "plot_activation_error",
           "activation_error_alt", "EXPLORABLES", "OUTLIER_CHANNEL"]

BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, BLACK, YELLOW = PALETTE


def plot_bits_error(bits, errors):
    """Relative error of dequantise(quantise(W)) against the bit width.

    errors: {label: array over ``bits``}; labels with "outlier" are dashed. Each line is named at
    its right end (up to four).
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.6))
    ax = fig.add_subplot()
    colours = {"per tensor": BLUE, "per channel": GREEN}
    for label, err in errors.items():
        c = colours["per tensor" if "tensor" in label else "per channel"]
        ax.plot(bits, err, marker="o", color=c, ls="--" if "outlier" in label else "-", label=label)
    ax.set_yscale("log", base=2)
    ax.set_xticks([int(b) for b in bits if b % 2 == 0])
    ax.set_xlabel(r"bits per weight $b$ (symmetric absmax: $|q| \leq 2^{b-1}-1$)")
    ax.set_ylabel(r"relative error $\|W-\hat{W}\|\,/\,\|W\|$" "\n(outlier weight excluded)")
    direct_labels(ax, pad_pt=6)
    bits = np.asarray(bits)
    step = np.median(np.concatenate([np.asarray(e[:-1]) / np.asarray(e[1:]) for e in errors.values()]))
    at = list(bits).index(8) if 8 in bits else len(bits) - 1       # the width the chapter is about
    # each outlier line against the line of the same granularity without it ("per tensor, one outlier")
    blowup = {base: errors[label][at] / errors[base][at] for label in errors if "outlier" in label
              for base in [label.split(",")[0]] if base in errors}
    outlier = " and ".join(f"{r:.2g}× {base}" for base, r in blowup.items())
    alt = (f"Quantised weight's relative error against bits, {bits.min()} to {bits.max()}: {step:.1f}× less per bit"
           + (f"; at {bits[at]} bits one outlier makes it {outlier}" if blowup else "") + ".")
    below = ""
    if {"per tensor", "per channel"} <= set(errors):
        n = int(np.sum(np.asarray(errors["per channel"]) <= np.asarray(errors["per tensor"])))
        below = (" The per-channel line lies below the per-tensor one at "
                 + ("every width." if n == len(bits) else f"{n} of the {len(bits)} widths."))
    description = (f"Log-scale plot of the relative error of a weight matrix after symmetric absmax quantisation "
                   f"against the bit width from {bits.min()} to {bits.max()}, one line each for: "
                   f"{'; '.join(errors)} (the lines with an outlier dashed; the outlier weight itself is left out "
                   f"of the error). From one bit to the next the error falls by a median factor of {step:.1f}, "
                   f"about half per extra bit.{below}"
                   + (f" At {bits[at]} bits one outlier multiplies the " + " and the ".join(
                       f"{base.replace(' ', '-')} error by {r:.2g}" for base, r in blowup.items()) + "."
                      if blowup else ""))
    return set_alt(fig, short_alt(alt), description)


def plot_accumulators(Ks, int16_wrong, f16_err, f32_err):
    """Dot products of int8 vectors summed one term at a time in three accumulators, against K.

    int16_wrong, f16_err, f32_err: fractions of the dot products that are wrong (int16, float32)
    or off by more than 1 % of a typical result (float16), one per K.
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.8))
    ax = fig.add_subplot()
    ax.plot(Ks, 100 * np.asarray(int16_wrong), marker="o", color=PALETTE[5],
            label="int16: wrong")
    ax.plot(Ks, 100 * np.asarray(f16_err), marker="s", color=series_colour("float16"),
            label="float16: off by > 1 % or inf")
    ax.plot(Ks, 100 * np.asarray(f32_err), marker="^", color=series_colour("float32"),
            label="float32: wrong")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("$K$, terms per dot product")
    ax.set_ylabel("dot products (%)")
    direct_labels(ax, pad_pt=6)
    Ks, i16, f16, f32 = (np.asarray(a) for a in (Ks, int16_wrong, f16_err, f32_err))
    most = Ks[i16 > 0.5]
    f32_words = "float32 is exact at every K" if not f32.any() else f"float32 is wrong on up to {100 * f32.max():.2g} %"
    alt = (f"Share of int8 dot products wrong per accumulator against K, {Ks[0]} to {Ks[-1]}: at the largest K "
           f"int16 {100 * i16[-1]:.0f} %, float16 {100 * f16[-1]:.0f} %; {f32_words}.")
    description = (f"Percentage of the dot products of int8 vectors, summed one term at a time, that an accumulator "
                   f"gets wrong, against K, the number of terms per dot product, from {Ks[0]} to {Ks[-1]} (log scale). "
                   f"An int16 accumulator wraps around: it is wrong on {100 * i16[0]:.2g} % at K = {Ks[0]}, "
                   + (f"on most of them from K = {most[0]} on, " if most.size else "")
                   + f"and on {100 * i16[-1]:.2g} % at K = {Ks[-1]}. A float16 accumulator rounds at every step; "
                   f"it is off by more than 1 % of a typical result (or overflows to infinity) on "
                   f"{100 * f16[0]:.2g} % at K = {Ks[0]} and {100 * f16[-1]:.2g} % at K = {Ks[-1]}. "
                   f"{f32_words[0].upper() + f32_words[1:]}.")
    return set_alt(fig, short_alt(alt), description)


#: what the reader reads for an intermediate of quant.block_forward (its record key)
OP_WORDS = {"ln1": "LayerNorm 1", "in_proj": "Q, K, V projection", "attn": "attention",
            "out_proj": "output projection", "residual1": "first residual", "ln2": "LayerNorm 2",
            "linear1": "MLP up", "act": "GELU", "linear2": "MLP down", "y": "block output"}
#: what the reader reads for a scheme of preln.quant.int8.SCHEMES
SCHEME_WORDS = {"w8a8-tensor": "per-tensor W8A8", "w8a8": "per-token W8A8", "w8a16": "W8A16",
                "llm.int8": "LLM.int8", "smoothquant": "SmoothQuant", "fp8-e4m3": "FP8 E4M3"}
#: W8A8 with plain absmax scales has no colour of its own among the book's methods
#: (preln.chapters.viz.METHOD_COLOURS): these two, used for it wherever this chapter draws it
W8A8_COLOURS = {"per-tensor W8A8": SKY, "per-token W8A8": YELLOW}


def _scheme_colour(words, k=0):
    """A scheme's colour: the book's for a named method or dtype (LLM.int8, SmoothQuant, fp8),
    W8A8_COLOURS for plain W8A8, else the ``k``-th colour of the palette."""
    if words in W8A8_COLOURS:
        return W8A8_COLOURS[words]
    return series_colour(words) if series_name(words) else PALETTE[k % len(PALETTE)]


def plot_op_errors(ops, errors):
    """Relative error of each intermediate of the quantised block against float64.

    ops: record keys of quant.block_forward in forward order (shown as OP_WORDS); errors:
    {scheme: [error per op]} (schemes of quant.SCHEMES, shown as SCHEME_WORDS; up to four).
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.9))
    ax = fig.add_subplot()
    x = np.arange(len(ops))
    for k, ((scheme, err), m) in enumerate(zip(errors.items(), "osD^v")):
        words = SCHEME_WORDS.get(scheme, scheme)
        ax.plot(x, err, marker=m, color=_scheme_colour(words, k), label=words)
    ax.set_xticks(x, [OP_WORDS.get(op, op) for op in ops], rotation=35, ha="right")
    ax.set_yscale("log")
    log_ticks(ax, "y")
    if min(ax.get_ylim()) < 1e-4:      # past 10⁻⁴ log_ticks turns to powers: all as powers
        _powers_of_ten(ax, "y")
    ax.set_ylabel("relative error against float64")
    direct_labels(ax, pad_pt=6)
    err = np.array(list(errors.values()), dtype=float)            # (schemes, ops)
    names = [SCHEME_WORDS.get(s, s) for s in errors]
    words = [OP_WORDS.get(op, op) for op in ops]
    # where each scheme's error jumps most from one op to the next: where quantisation enters
    jumps = {words[1 + int(np.argmax(e[1:] / e[:-1]))] for e in err} if len(ops) > 1 else set()
    high, low = names[int(np.argmax(err[:, -1]))], names[int(np.argmin(err[:, -1]))]
    start = ("below 10\u207b\u2075 (round-off)" if err[:, 0].max() < 1e-5
             else f"up to {err[:, 0].max():.2g}")
    alt = (f"Relative error per op of the quantised block, {len(names)} schemes: "
           + (f"it jumps at the {jumps.pop()}; " if len(jumps) == 1 else "")
           + f"at the output {high} highest, {low} lowest.")
    description = (f"Log-scale line plot of the relative error against float64 of each intermediate of the quantised "
                   f"block, in forward order from {words[0]} to {words[-1]} (" + ", ".join(words[1:-1])
                   + f" between), for the schemes {'; '.join(names)}. "
                   f"At {words[0]} every scheme's error is {start}. Each scheme's largest jump from one op to the next "
                   f"is at the " + "; ".join(f"{words[1 + int(np.argmax(e[1:] / e[:-1]))]} ({n})"
                                             for n, e in zip(names, err))
                   + f". At the {words[-1]} the errors are "
                   + "; ".join(f"{e[-1]:.2g} ({n})" for n, e in zip(names, err)) + ".")
    return set_alt(fig, short_alt(alt), description)


def plot_outlier_channels(before, after, channels):
    """max |LN1 output| per feature channel, before and after the injection."""
    fig = Figure(figsize=(6.0, 3.6))
    ax = fig.add_subplot()
    d = np.arange(len(before))
    ax.bar(d - 0.2, before, width=0.4, color=BLUE, label="trained model")
    ax.bar(d + 0.2, after, width=0.4, color=VERMILLION, label="outliers injected (same function)")
    ax.axhline(6.0, color=BLACK, ls=":", lw=1)
    edges = [-1, *sorted(int(c) for c in channels), len(before)]    # the widest run of ordinary
    gap = max(zip(edges, edges[1:]), key=lambda e: e[1] - e[0])       # channels holds the label
    ax.annotate("LLM.int8 threshold 6", (gap[0] + 1.0, 6.0), xytext=(0, 3), ha="left",
                textcoords="offset points", fontsize=9)
    ax.set_yscale("log")
    log_ticks(ax, "y")
    ax.set_xlabel("feature channel $j$ of LayerNorm 1's output (layer 0); outliers at " +
                  ", ".join(str(int(c)) for c in channels))
    ax.set_ylabel("max |h$_j$| over tokens")
    legend_outside(ax)
    channels = [int(c) for c in channels]
    before, after = np.asarray(before), np.asarray(after)
    rest = np.delete(after, channels)
    names = ", ".join(map(str, channels))
    alt = (f"Largest LayerNorm 1 output per channel: after injection, channels {names} reach "
           f"{span(after[channels])}; the others stay at most {rest.max():.2g}.")
    unchanged = np.allclose(rest, np.delete(before, channels))
    description = (f"Bar chart, log scale, of the largest absolute LayerNorm 1 output over the tokens in each of "
                   f"{len(before)} feature channels of layer 0, for the trained model and for the model with "
                   f"outliers injected (the same function). In the trained model every channel's largest value is "
                   f"at most {before.max():.2g}. After the injection channels {names} reach "
                   f"{span(after[channels])}, against the dotted LLM.int8 "
                   f"threshold of 6, while the other channels are "
                   + ("unchanged." if unchanged else f"at most {rest.max():.2g}."))
    return set_alt(fig, short_alt(alt), description)


def plot_sweeps(thresholds, ppl_thr, frac_thr, alphas, ppl_alpha, ppl_float, ppl_tensor):
    """LLM.int8's threshold and SmoothQuant's alpha against held-out perplexity (outlier model).

    The threshold points are labelled with the share of input columns kept in float16 where that
    share changes (a run of equal shares is labelled once), in two rows above the line.
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.9))
    ax, bx = fig.subplots(1, 2, sharey=True)
    ax.plot(thresholds, ppl_thr, marker="o", color=series_colour("LLM.int8"), label="LLM.int8")
    ax.set_xscale("log", base=2)
    ticks = [t for t in (0.5, 2, 6, 16, 64, 256) if min(thresholds) <= t <= max(thresholds)]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("LLM.int8 threshold")
    ax.set_ylabel("held-out perplexity")
    shares = [f"{100 * f:.0f} %" for f in frac_thr]
    shown = [k for k, s in enumerate(shares) if k == 0 or s != shares[k - 1]]
    for n, k in enumerate(shown):            # two rows above the line, so neighbours never touch
        ax.annotate(shares[k], (thresholds[k], ppl_thr[k]), xytext=(0, 20 if n % 2 else 6),
                    textcoords="offset points", ha="center", va="bottom", fontsize=9,
                    color=series_colour("LLM.int8"))
    ax.annotate("% = input columns in float16", (0.02, 0.97), xycoords="axes fraction",
                ha="left", va="top", fontsize=9)
    bx.plot(alphas, ppl_alpha, marker="s", color=series_colour("SmoothQuant"),
            label="SmoothQuant, per tensor")
    bx.axhline(ppl_tensor, color=W8A8_COLOURS["per-tensor W8A8"], ls="--", lw=1.5)
    bx.annotate(f"per-tensor W8A8: {ppl_tensor:.2f}", (0.5, ppl_tensor), xycoords=("axes fraction", "data"),
                xytext=(0, -4), textcoords="offset points", ha="center", va="top", fontsize=9,
                color=W8A8_COLOURS["per-tensor W8A8"])
    bx.annotate("SmoothQuant, per tensor", (alphas[len(alphas) // 2], ppl_alpha[len(alphas) // 2]),
                xytext=(0, 9), textcoords="offset points", ha="center", va="bottom", fontsize=9,
                color=series_colour("SmoothQuant"))
    bx.set_xlabel(r"SmoothQuant migration strength $\alpha$")
    for a in (ax, bx):
        a.axhline(ppl_float, color=BLACK, ls=":", lw=1)
    lo, hi = ax.get_ylim()                   # room under the dotted line for its label
    ax.set_ylim(min(lo, ppl_float - 0.08 * (hi - lo)), hi)
    ax.annotate(f"float64: {ppl_float:.2f}", (0.98, ppl_float), xycoords=("axes fraction", "data"),
                xytext=(0, -4), textcoords="offset points", ha="right", va="top", fontsize=9)
    ppl_thr, frac_thr, ppl_alpha = (np.asarray(a, dtype=float) for a in (ppl_thr, frac_thr, ppl_alpha))
    near = ppl_thr < 1.01 * ppl_float                            # within 1 % of the float model
    first_far = int(np.argmin(near)) if not near.all() else len(near)
    near_words = (f"within 1 % of float up to threshold {thresholds[first_far - 1]:g}" if near[:first_far].any()
                  and not near[first_far:].any() else f"within 1 % of float at {near.sum()} of {near.size} thresholds")
    alt = (f"Held-out perplexity: LLM.int8 {near_words}; SmoothQuant at most {ppl_alpha.max():.3g} at any alpha; "
           f"per-tensor W8A8 {ppl_tensor:.3g}.")
    description = (f"Two panels of held-out perplexity, on one scale, with the float64 perplexity {ppl_float:.3g} "
                   f"dotted. Left: LLM.int8 against its threshold from {thresholds[0]:g} to {thresholds[-1]:g} "
                   f"(log scale), labelled where it changes with the percentage of input columns kept in float16 "
                   f"({100 * frac_thr[0]:.0f} % at the lowest threshold, {100 * frac_thr[-1]:.0f} % at the highest); "
                   f"the perplexity is {near_words} and {ppl_thr[-1]:.3g} at the highest threshold. Right: "
                   f"SmoothQuant with per-tensor scales against its migration strength alpha from {alphas[0]:g} to "
                   f"{alphas[-1]:g}: perplexity {span(ppl_alpha)}, against {ppl_tensor:.3g} for per-tensor W8A8 "
                   f"(the dashed line at the top).")
    return set_alt(fig, short_alt(alt), description)


def bits_colour(bits):
    """The book's colour of weights stored in ``bits`` bits (viz.DTYPE_COLOURS): 16-bit weights in
    float16's, 8-bit in int8's, 4-bit in int4's."""
    return series_colour({16: "float16", 8: "int8", 4: "int4"}[int(bits)])


def _powers_of_ten(ax, which="y"):
    """Every label of a log axis as a power of ten, $10^{k}$ ($10^{0}$ for 1): one style on an
    axis that spans from 1 down past 10⁻⁴ (log_ticks writes 0.001 but 10⁻⁵)."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"$10^{{{round(np.log10(v))}}}$"
                                           if v > 0 else ""))
    return ax


def plot_weight_bits_decode(model, roofs, batches, context, bits=(16, 8, 4), group_size=128):
    """Predicted decode throughput (tokens/s, the roofline's bound) of ``model`` against the batch
    size with its weights stored in 16, 8 and 4 bits, on each of ``roofs`` ({label: Roofline})."""
    from preln.chapters.inference import step_time
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.6))
    axes = fig.subplots(1, len(roofs), sharey=True)
    axes = np.atleast_1d(axes)
    tps = {}                                                     # (roof label, bits) -> tokens/s per batch
    names = {}
    for ax, (label, roof) in zip(axes, roofs.items()):
        for b, m in zip(bits, "os^"):
            c = bits_colour(b)
            g = None if b >= 8 else group_size
            tps[label, b] = np.array([n / step_time(model, roof, n, 1, context, 2, b, g) for n in batches])
            names[b] = f"{b}-bit" + (f", g{g}" if g else "")
            ax.loglog(batches, tps[label, b], marker=m, ms=4, color=c, label=names[b])
        ax.set_xlabel("batch (sequences)")
        ax.set_title(f"{label}", fontsize=11)
        ax.minorticks_off()
        ax.set_xticks([n for n in (1, 10, 100, 1000) if batches[0] <= n <= batches[-1]])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[0].set_ylabel("tokens per second\n(roofline bound)")
    log_ticks(axes[0], "y")                      # (shared by both panels) its numbers, and
    axes[0].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))   # 1-2-5 per decade
    # each line named left of its first point, where no line runs (room made on the x axis)
    first = axes[0]
    first.set_xlim(batches[0] / 10 ** 1.1, batches[-1] * 1.6)
    for ln in first.get_lines():
        first.annotate(ln.get_label(), (ln.get_xdata()[0], ln.get_ydata()[0]), xytext=(-6, 0),
                       textcoords="offset points", ha="right", va="center", color=ln.get_color(),
                       fontsize=10)
    fig.suptitle(f"{model.name}, context {context}", fontsize=11)

    def gain(label, b, i):                       # throughput of b-bit weights over the widest, at batches[i]
        return tps[label, b][i] / tps[label, bits[0]][i]

    def gains(label, i, unit):
        return " and ".join(f"{b}-bit {gain(label, b, i):.3g}{unit}" for b in bits[1:])

    def at_largest(label):                       # where reading the weights stops binding, the lines meet
        if all(abs(gain(label, b, -1) - 1) < 0.01 for b in bits[1:]):
            return f"at batch {batches[-1]} the lines meet"
        return f"at batch {batches[-1]} {gains(label, -1, ' times')} the {bits[0]}-bit throughput"

    first = next(iter(roofs))
    alt = (f"Roofline bound on {model.name}'s decode throughput against batch, {batches[0]} to {batches[-1]}: at batch "
           f"{batches[0]}, {gains(first, 0, '×')} the {bits[0]}-bit rate.")
    rising = all(np.all(np.diff(t) > 0) for t in tps.values())
    description = (f"{len(roofs)} log-log panel{'s' if len(roofs) > 1 else ''}, {model.name} on "
                   + " and on ".join(roofs) + f" at a context of "
                   f"{context} tokens: the roofline's bound on decode throughput in tokens per second against the "
                   f"batch size from {batches[0]} to {batches[-1]}, for weights stored in "
                   + ", ".join(map(str, bits[:-1])) + f" and {bits[-1]} bits"
                   + (f" (below 8 bits in groups of {group_size})" if min(bits) < 8 else "") + ". "
                   + ("Every line rises with the batch. " if rising else "") + " ".join(
                       f"On the {label} the {bits[0]}-bit bound at batch {batches[0]} is {tps[label, bits[0]][0]:.3g} "
                       f"tokens/s, and with fewer bits: {gains(label, 0, ' times')} that; {at_largest(label)}."
                       for label in roofs)
                   + " Where the lines meet, the step is no longer limited by reading the weights.")
    return set_alt(fig, short_alt(alt), description)


def plot_matvec(rows, bandwidth):
    """Measured time of y = W x per storage format, with the time its bytes need at ``bandwidth``
    (bytes/s, measured): a format below its marker is not memory-bound (its arithmetic binds)."""
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.4))
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    ax.barh(y, [1e3 * r.seconds for r in rows], height=0.55, color=BLUE, label="measured (best CPU time)")
    ax.plot([1e3 * r.nbytes / bandwidth for r in rows], y, "D", color=VERMILLION, ms=7,
            label="bytes / measured bandwidth")
    for yy, r in zip(y, rows):
        ax.annotate(f"{r.nbytes / 2**20:.0f} MiB", (1e3 * max(r.seconds, r.nbytes / bandwidth), yy),
                    xytext=(8, 0), textcoords="offset points", va="center", fontsize=10)
    ax.set_yticks(y, [r.name for r in rows], fontsize=10)
    ax.set_xlabel("ms per matrix-vector product (one core)")
    ax.set_ylabel("weight storage")
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", length=0)
    ax.set_xlim(0, ax.get_xlim()[1] * 1.15)
    ax.set_ylim(-0.5, len(rows) - 0.5 + 1.0)          # room above the bars for the key
    # the key, in the room above the first bar (no legend box): the bar, then the diamond
    ax.annotate("bars: measured time (best CPU time)", (0, 1), xycoords="axes fraction",
                xytext=(4, -2), textcoords="offset points", ha="left", va="top", fontsize=10,
                color=BLUE)
    ax.annotate(f"\u25c6 the time its bytes take at {bandwidth / 1e9:.2g} GB/s", (0, 1),
                xycoords="axes fraction", xytext=(4, -17), textcoords="offset points", ha="left",
                va="top", fontsize=10, color=VERMILLION)
    # measured times: the notebook's cell ignores its output under nbval; 2 figures are what repeats carry
    ref = rows[0]
    over = [r.seconds / (r.nbytes / bandwidth) for r in rows]    # measured time over the bytes' time
    smaller = [r for r in rows if r.nbytes < ref.nbytes]
    ref_name = ref.name.replace(", ", " (", 1) + ")" if ", " in ref.name else ref.name   # "float32 (BLAS sgemv)"
    alt = (f"Measured matrix-vector time per weight storage: " + ", ".join(
        f"{r.name.split(',')[0]} {ref.seconds / r.seconds:.2g}×" for r in smaller)
           + f" as fast as {ref_name}, against the " + " and ".join(f"{ref.nbytes / r.nbytes:.2g}×" for r in smaller)
           + " their bytes allow.")
    description = (f"Horizontal bars of the measured time (best CPU time, one core) of one matrix-vector product for "
                   f"each weight storage; diamonds mark the time its bytes would take at a bandwidth of "
                   f"{bandwidth / 1e9:.2g} GB/s. A bar longer than its diamond means the format's arithmetic, not "
                   f"memory, limits it. " + " ".join(
                       f"{r.name}: {r.nbytes / 2**20:.3g} MiB, {1e3 * r.seconds:.2g} ms, {o:.2g} times its bytes' time"
                       + (f", {ref.seconds / r.seconds:.2g} times as fast as {ref_name}." if r is not ref else ".")
                       for r, o in zip(rows, over)))
    return set_alt(fig, short_alt(alt), description)


def plot_weight_only(bits, groups, ppl, ppl_float, title=""):
    """Held-out perplexity against bits per weight, one panel per group size, one line per method.

    ppl: {(method, bits, group label): perplexity}; groups: group labels in panel order.
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.8))
    axes = np.atleast_1d(fig.subplots(1, len(groups), sharey=True))
    for ax, g in zip(axes, groups):
        for method, c, m in zip(("rtn", "gptq", "awq"), [series_colour(k) for k in ("RTN", "GPTQ", "AWQ")],
                                "os^"):
            ax.plot(bits, [ppl[method, b, g] for b in bits], marker=m, color=c,
                    label={"rtn": "round to nearest", "gptq": "GPTQ", "awq": "AWQ"}[method])
        ax.axhline(ppl_float, color=BLACK, ls=":", lw=1, label="float64")
        ax.set_yscale("log")
        ax.set_xticks(list(bits))
        ax.set_xlabel("bits per weight")
        ax.set_title(f"groups of {g}" if g != "row" else "one scale per row", fontsize=10)
        ax.minorticks_off()
    for ax in axes:
        ax.set_ylabel("held-out perplexity" + (f"\n{title}" if title else ""))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    from matplotlib.ticker import LogLocator, ScalarFormatter
    for ax in axes:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
    names = {"rtn": "round to nearest", "gptq": "GPTQ", "awq": "AWQ"}
    settings = [(b, g) for b in bits for g in groups]

    def wins(method):                            # settings where ``method`` beats round to nearest
        return sum(ppl[method, b, g] < ppl["rtn", b, g] for b, g in settings)

    def panel(g):
        return f"groups of {g}" if g != "row" else "one scale per row"

    def falls(m, g):                             # fewer bits never help
        return all(ppl[m, a, g] >= ppl[m, b, g] for a, b in zip(bits, bits[1:]))

    top = max(ppl[m, bits[-1], g] for m in names for g in groups) / ppl_float - 1    # the most bits' worst
    alt = (f"Perplexity against bits per weight, {bits[0]} to {bits[-1]}, {len(groups)} group sizes: GPTQ beats round "
           f"to nearest in {wins('gptq')} of {len(settings)}, AWQ in {wins('awq')}; {bits[-1]} bits within "
           f"{100 * top:.2g} % of float.")
    description = (f"{len(groups)} panels of held-out perplexity (log scale) against bits per weight ("
                   + ", ".join(map(str, bits)) + ") for weight-only quantisation in "
                   + ", ".join(panel(g) for g in groups) + ", each with round to nearest, GPTQ and AWQ; "
                   f"the float64 model's perplexity {ppl_float:.3g} is dotted. " + " ".join(
                       f"{panel(g)[0].upper() + panel(g)[1:]}: " + "; ".join(
                           f"{names[m]} " + ", ".join(f"{ppl[m, b, g]:.3g}" for b in bits) for m in names) + "."
                       for g in groups)
                   + (" Every line falls with more bits." if all(falls(m, g) for m in names for g in groups) else "")
                   + f" At {bits[-1]} bits every setting is within {100 * top:.2g} % of the float64 perplexity."
                   + f" GPTQ lies below round to nearest in {wins('gptq')} of the {len(settings)} settings, AWQ in "
                   f"{wins('awq')}. The ratio of GPTQ's perplexity to round to nearest's is, on average over the "
                   f"groups, " + ", ".join(
                       f"{np.mean([ppl['gptq', b, g] / ppl['rtn', b, g] for g in groups]):.2g} at {b} bits"
                       for b in bits) + ".")
    return set_alt(fig, short_alt(alt), description)


def plot_calibration(clips, errors, marks, bits):
    """Mean squared quantisation error of one activation against the clip value c (S = c / qmax),
    with the clips that absmax, percentile and MSE calibration choose marked.

    errors: {label: array over ``clips``}; marks: {method: (clip, error)} on one of the curves (its
    label says which, as in "mse (4-bit)").
    """
    fig = Figure(figsize=(COLUMN_IN - 0.2, 3.6))
    ax = fig.add_subplot()
    for label, err in errors.items():       # "8-bit" in int8's colour, "4-bit" in int4's
        ax.plot(clips, err, "-", color=bits_colour(label.split("-")[0]), label=label)
    ax.set_yscale("log")
    ax.set_xlabel(f"clip $c$ (the largest value kept), {bits}-bit symmetric grid")
    ax.set_ylabel("mean squared error")
    direct_labels(ax, pad_pt=12)            # clear of a mark at the curve's end (absmax's clip)
    # each calibration's clip, marked on its curve and named by a short leader line: in order of
    # the clip, below, above, below the curve, so that neighbouring marks' names never stack
    styles = dict(zip(marks, zip([VERMILLION, PURPLE, GREEN], "Dso")))
    for k, method in enumerate(sorted(marks, key=lambda m: marks[m][0])):
        (c, e), (colour, m) = marks[method], styles[method]
        ax.plot([c], [e], m, color=colour, ms=8, label="_" + method)
        right = c >= 0.6 * np.max(clips)
        above = k % 2 == 1
        ax.annotate(method, (c, e), xytext=(-6 if right else 6, 16 if above else -18),
                    textcoords="offset points", ha="right" if right else "left",
                    va="bottom" if above else "top", fontsize=10, color=colour,
                    arrowprops=dict(arrowstyle="-", color=colour, lw=0.8, shrinkA=0, shrinkB=5))
    clips = np.asarray(clips, dtype=float)
    top = clips.max()

    def share(c):                                # a clip as a percentage of the largest one plotted
        return f"{100 * c / top:.3g} %"          # 3 figures: a clip on a grid of 200 is exact, not 50.5 -> "50"

    best = {label: clips[int(np.argmin(err))] for label, err in errors.items()}
    pick = min(marks, key=lambda m: marks[m][1])                 # the calibration with the lowest error
    alt = (f"Quantisation error against the clip value: lowest at " + " and ".join(
        f"{share(c)} ({label})" for label, c in best.items())
           + f" of the largest clip; {pick} clips at {share(marks[pick][0])}.")
    description = (f"Log-scale plot of the mean squared error of quantising one activation on the {bits}-bit symmetric "
                   f"grid against the clip value c (the largest value kept), for clips up to {top:.3g}, one curve each "
                   f"for {' and '.join(errors)}. " + " ".join(
                       f"The {label} curve is lowest at c = {c:.3g}, {share(c)} of the largest clip."
                       for label, c in best.items())
                   + " Markers show the clips calibration chooses: " + "; ".join(
                       f"{method} at c = {c:.3g} ({share(c)} of the largest), error {e:.2g}"
                       for method, (c, e) in marks.items()) + ".")
    return set_alt(fig, short_alt(alt), description)


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
