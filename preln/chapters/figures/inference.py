"""Figures of the inference chapter (book/inference.ipynb).

Everything here draws what :mod:`preln.chapters.inference` computes or measures; the notebook imports and
calls. The explorable is computed from the roofline model and published datasheet values only, so
its frames are the same on every machine:

    EXPLORABLES = {"decode_roofline": (plot_decode_roofline, {"batch": ..., "context": ..., "gpu": ...})}
"""
from __future__ import annotations

import numpy as np

from preln.nn.config import BlockConfig
from preln.chapters.inference import PUBLISHED, compute_bound_batch, decode_cost, kv_cache_bytes, step_ops
from preln.chapters.viz import COLUMN_IN, PALETTE, control, legend_outside, log_ticks
from preln.nb import fixed, set_alt, short_alt, span

__all__ = ["EXPLORABLES", "plot_roofline", "plot_published", "plot_fusion_bytes",
           "plot_predicted_vs_measured", "plot_attention_io", "plot_attention_terms",
           "plot_decode_times", "plot_decode_batch", "plot_decode_ops", "plot_paged_memory",
           "plot_decode_roofline", "decode_roofline_alt", "OPT13B", "OPT13B_LAYERS",
           "traffic_table_html", "bound_table_html"]

#: OPT-13B's blocks (Zhang et al. 2022, arXiv 2205.01068, Table 1): 40 layers, d_model 5120,
#: 40 heads, d_ff = 4 d_model; the explorable decodes with it in 16-bit (2 bytes per value)
OPT13B = BlockConfig(d_model=5120, n_heads=40, d_ff=20480, causal=True)
OPT13B_LAYERS = 40
DECODE_CONTROLS = {"batch": control("batch size (sequences)", [1, 8, 64, 256]),
                   "context": control("context length (tokens)", [512, 4096, 32768]),
                   "gpu": control("GPU model", ["A100 SXM 80GB", "H100 SXM", "H200 SXM"])}
_I_LIM = (0.05, 3000.0)
#: a stacked segment at least this share of the longest bar is labelled with its array's name
DIRECT_LABEL_MIN = 0.09
#: smaller segments of at least this share are named after their bar instead (smaller ones are
#: under a pixel wide)
DIRECT_NOTE_MIN = 0.01
#: ops of the roofline plot closer than this (decades of intensity) share one number label
ROOFLINE_LABEL_GAP = 0.2


def _figure(figsize, *grid, **kwargs):
    """A Figure made without pyplot, so a notebook shows it once (see figures.shape_flow)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def _roof(ax, roof, colour, label, lim=_I_LIM, ls="-"):
    i = np.logspace(np.log10(lim[0]), np.log10(lim[1]), 200)
    ax.loglog(i, roof.attainable(i), ls=ls, color=colour, lw=1.8, label=label)
    ax.axvline(roof.ridge, color=colour, lw=0.8, ls=":")


def plot_roofline(roof, unfused, fused=None, times=None):
    """This machine's roofline with every op of the block placed at its arithmetic intensity.

    unfused, fused: lists of :class:`preln.chapters.inference.OpTraffic`; times: {op name: seconds} for the
    unfused ops (measured), drawn as the FLOP/s each op reached.
    """
    fig, ax = _figure((COLUMN_IN - 0.2, 5.6))
    lim = (0.02, 300.0)
    _roof(ax, roof, PALETTE[6], f"roofline: {roof.peak_flops / 1e9:.0f} GFLOP/s, "
          f"{roof.bandwidth / 1e9:.1f} GB/s", lim)
    for ops, marker, colour, label in ((unfused, "o", PALETTE[0], "unfused op (roofline bound)"),
                                       (fused or [], "^", PALETTE[2], "fused schedule (bound)")):
        pts = [(o.intensity, roof.attainable(o.intensity)) for o in ops if o.flops > 0]
        if pts:
            x, y = zip(*pts)
            ax.loglog(x, y, marker, color=colour, ms=7, label=label, mfc="none" if marker == "o" else colour)
    if times:
        x = [o.intensity for o in unfused if o.flops > 0 and o.name in times]
        y = [o.flops / times[o.name] for o in unfused if o.flops > 0 and o.name in times]
        ax.loglog(x, y, "x", color=PALETTE[1], ms=8, mew=2, label="unfused op, measured")
    key = [f"{n} {o.name.replace('attn.', '').replace('mlp.', '')}" + ("" if o.flops else " (no FLOPs)")
           for n, o in enumerate(unfused, 1)]
    # ops closer than ROOFLINE_LABEL_GAP decades share one label ("2, 7, 10": never "710"); left of
    # the ridge a label sits up and to the left of its ops (above the rising roof), right of it
    # above them, neighbours at two heights
    clusters = []
    for n, o in sorted(((n, o) for n, o in enumerate(unfused, 1) if o.flops > 0),
                       key=lambda p: p[1].intensity):
        if clusters and np.log10(o.intensity / clusters[-1][-1][1]) < ROOFLINE_LABEL_GAP:
            clusters[-1].append((n, o.intensity))
        else:
            clusters.append([(n, o.intensity)])
    flat = 0
    for cluster in clusters:
        x = float(np.exp(np.mean([np.log(i) for _, i in cluster])))
        text = ", ".join(str(n) for n in sorted(n for n, _ in cluster))
        if x < roof.ridge:
            ax.annotate(text, (x, roof.attainable(x)), xytext=(-6, 4), textcoords="offset points",
                        ha="right", va="bottom", fontsize=9, color=PALETTE[0])
        else:
            ax.annotate(text, (x, roof.attainable(x)), xytext=(0, 8 + 12 * (flat % 2)),
                        textcoords="offset points", ha="center", va="bottom", fontsize=9,
                        color=PALETTE[0])
            flat += 1
    # the numbers' key beside the axes, not over the data
    ax.text(1.03, 1.0, "\n".join(key), transform=ax.transAxes, fontsize=9, va="top",
            color=PALETTE[0], linespacing=1.2)
    ax.set_ylim(None, roof.peak_flops * 4)
    ax.set_xlim(*lim)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of main-memory traffic)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"this machine, one BLAS thread; ridge at {roof.ridge:.1f} FLOP/B", fontsize=10)
    legend_outside(ax, ncol=1)
    ax.minorticks_off()
    real = [o for o in unfused if o.flops > 0]
    below = sum(o.intensity < roof.ridge for o in real)
    alt = (f"Roofline of this machine, {roof.peak_flops / 1e9:.0f} GFLOP/s and {roof.bandwidth / 1e9:.1f} GB/s "
           f"(ridge {roof.ridge:.1f} FLOP/B): {below} of the block's {len(real)} ops lie left of the ridge.")
    description = "Arithmetic intensity of each op: " + "; ".join(
        f"{o.name} {o.intensity:.3g} FLOP/B" + (f", measured at {o.flops / times[o.name] / roof.attainable(o.intensity):.0%}"
                                                 f" of its bound" if times and o.name in times else "")
        for o in real) + "."
    return set_alt(fig, short_alt(alt), description)


def plot_published(gpus, ops16, machine=None):
    """Published GPU rooflines (dense BF16, datasheet bandwidth), with the block's ops in 16-bit."""
    fig, ax = _figure((COLUMN_IN - 0.2, 4.2))
    # a line style each: vermillion and orange are one colour under deuteranopia
    for colour, ls, (name, roof) in zip(PALETTE[:4], ["-", "--", "-.", (0, (1, 1.2))], gpus.items()):
        _roof(ax, roof, colour, f"{name}: ridge {roof.ridge:.0f} FLOP/B", ls=ls)
    if machine is not None:
        _roof(ax, machine, PALETTE[6], f"this machine: ridge {machine.ridge:.1f} FLOP/B", ls="--")
    top = max(r.peak_flops for r in gpus.values())
    for o in ops16:
        if o.flops > 0:
            ax.plot([o.intensity], [top * 1.6], "v", color=PALETTE[5] if not o.matmul else PALETTE[0], ms=6)
    ax.plot([], [], "v", color=PALETTE[0], label="matmul op (16-bit)")
    ax.plot([], [], "v", color=PALETTE[5], label="elementwise op (16-bit)")
    ax.set_xlim(*_I_LIM)
    ax.set_ylim(1e9, top * 3)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title("published peaks (labelled as published); triangles: the block's ops", fontsize=10)
    legend_outside(ax, ncol=1)
    ax.minorticks_off()
    ridges = [r.ridge for r in gpus.values()]
    xs = [o.intensity for o in ops16 if o.flops > 0]
    alt = (f"Published rooflines of {len(gpus)} GPUs, ridges {min(ridges):.0f} to {max(ridges):.0f} FLOP/B; "
           + (f"the block's 16-bit ops at {min(xs):.2g} to {max(xs):.3g} FLOP/B." if xs else "no ops marked."))
    description = " ".join(f"{name}: {r.peak_flops / 1e12:.0f} TFLOP/s, {r.bandwidth / 1e12:.2f} TB/s, "
                           f"ridge {r.ridge:.0f} FLOP/B." for name, r in gpus.items())
    return set_alt(fig, short_alt(alt), description)


def plot_fusion_bytes(chains):
    """Main-memory traffic of the memory-bound chains: unfused passes against one fused pass.

    chains: [(label, unfused bytes, fused bytes), ...].
    """
    labels = [c[0] for c in chains]
    ub = np.array([c[1] for c in chains], dtype=float) / 2**20
    fb = np.array([c[2] for c in chains], dtype=float) / 2**20
    fig, ax = _figure((6.4, 3.2))
    y = np.arange(len(chains))[::-1]
    ax.barh(y + 0.2, ub, height=0.38, color=PALETTE[0], label="unfused (one pass per numpy op)")
    ax.barh(y - 0.2, fb, height=0.38, color=PALETTE[2], label="fused (one pass)")
    for yy, a, b in zip(y, ub, fb):
        ax.annotate(f"{a / b:.1f}×", (a, yy + 0.2), xytext=(3, -3), textcoords="offset points",
                    fontsize=9)
    ax.set_yticks(y, labels, fontsize=9)
    ax.set_xlim(0, ub.max() * 1.15)
    ax.set_xlabel("main-memory traffic (MiB)")
    ax.grid(axis="y", visible=False)
    legend_outside(ax, ncol=1)
    cut = ub / fb
    alt = (f"Main-memory traffic of {len(chains)} memory-bound chains, unfused against fused: fusing cuts it "
           f"{cut.min():.1f} to {cut.max():.1f} times.")
    description = " ".join(f"{lab}: {a:.3g} MiB unfused, {b:.3g} MiB fused." for lab, a, b in zip(labels, ub, fb))
    return set_alt(fig, short_alt(alt), description)


def plot_predicted_vs_measured(ops, times, roof):
    """Per op: the roofline's lower bound on its time against its measured time (ms)."""
    names = [o.name for o in ops if o.name in times]
    pred = np.array([float(roof.time(o.flops, o.nbytes)) for o in ops if o.name in times]) * 1e3
    meas = np.array([times[n] for n in names]) * 1e3
    # a dot plot on a log axis (bars on a log axis have no meaningful length): one row per op,
    # its bound and its measured time joined by a line, whose length is the ratio
    fig, ax = _figure((COLUMN_IN - 0.2, 1.4 + 0.3 * len(names)))
    y = np.arange(len(names))[::-1]
    ax.hlines(y, pred, meas, color="0.6", lw=1.5)
    ax.plot(pred, y, "o", mfc="none", mew=1.6, ms=7, color=PALETTE[0], label="roofline bound")
    ax.plot(meas, y, "o", ms=7, color=PALETTE[1], label="measured")
    ax.set_xscale("log")
    ax.set_yticks(y, [n.replace("attn.", "").replace("mlp.", "") for n in names])
    ax.set_xlabel("time of the op (ms, log scale)")
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", length=0)
    legend_outside(ax)
    ratio = meas / pred
    alt = (f"Roofline bound and measured time of {len(names)} ops (log scale): measured {ratio.min():.1f} to "
           f"{ratio.max():.0f} times the bound.")
    description = " ".join(f"{n}: bound {p:.3g} ms, measured {m:.3g} ms." for n, p, m in zip(names, pred, meas))
    return set_alt(fig, short_alt(alt), description)


def plot_attention_io(panels):
    """Counted slow-memory accesses of standard and tiled attention in three sweeps.

    panels: [(xlabel, xs, standard counts, tiled counts, fit_standard, fit_tiled, title), ...]
    """
    # one panel above the other at the column's width: three side by side shrank their text
    fig, axes = _figure((COLUMN_IN - 0.2, 2.7 * len(panels)), len(panels), 1)
    axes = np.atleast_1d(axes)
    for ax, (xlabel, xs, std, til, f_std, f_til, title) in zip(axes, panels):
        k_std, k_til = (round(f.exponent, 2) + 0.0 for f in (f_std, f_til))   # no "-0.00"
        ax.loglog(xs, std, "o", color=PALETTE[1], label=f"standard, slope {fixed(k_std)}")
        ax.loglog(xs, f_std(xs), "-", color=PALETTE[1], lw=1)
        ax.loglog(xs, til, "s", color=PALETTE[0], label=f"tiled, slope {fixed(k_til)}")
        ax.loglog(xs, f_til(xs), "-", color=PALETTE[0], lw=1)
        ax.minorticks_off()
        ax.set_xticks(list(xs), [str(int(v)) for v in xs], fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_title(title, loc="left", fontsize=10)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
        log_ticks(ax, "y")                 # at least three labelled ticks, whatever the span
    axes[0].set_ylabel("slow-memory accesses (elements)")
    def k(fit):                       # two decimals, as the legend; a Unicode minus, no "−0.00"
        return fixed(fit.exponent)

    def plain(text):                  # the words of a mathtext label (figure_bundle typesets d_h)
        return text.replace("$", "")

    slopes = "; ".join(f"{plain(p[0]).split(' (')[0].split()[-1]} {k(p[4])} and {k(p[5])}"
                       for p in panels)
    alt = f"Slow-memory accesses of standard and tiled attention, log-log; slopes (standard, tiled) against {slopes}."
    description = " ".join(f"Against {plain(p[0])} ({plain(p[6])}): standard slope {k(p[4])}, tiled slope "
                           f"{k(p[5])}." for p in panels)
    return set_alt(fig, short_alt(alt), description)


def plot_decode_times(contexts, with_cache, without_cache, fit_with, fit_without):
    """Time per generated token against context length, with and without the KV cache."""
    fig, ax = _figure((5.8, 3.6))
    ms = 1e3
    ax.loglog(contexts, np.asarray(without_cache) * ms, "o", color=PALETTE[1],
              label=f"no cache (full forward), slope {fit_without.exponent:.2f}")
    ax.loglog(contexts, fit_without(contexts) * ms, "-", color=PALETTE[1], lw=1)
    ax.loglog(contexts, np.asarray(with_cache) * ms, "s", color=PALETTE[0],
              label=f"KV cache (one position), slope {fit_with.exponent:.2f}")
    ax.loglog(contexts, fit_with(contexts) * ms, "-", color=PALETTE[0], lw=1)
    ax.minorticks_off()
    ax.set_xticks(list(contexts), [str(int(c)) for c in contexts])
    ax.set_xlabel("context length (tokens before the new one)")
    ax.set_ylabel("ms per generated token")
    legend_outside(ax, ncol=1)
    alt = (f"Time per generated token against context length, log-log: slope {fit_with.exponent:.2f} with the "
           f"KV cache, {fit_without.exponent:.2f} without.")
    description = " ".join(f"Context {int(c)}: {w * ms:.3g} ms with the cache, {wo * ms:.3g} ms without."
                           for c, w, wo in zip(contexts, with_cache, without_cache))
    return set_alt(fig, short_alt(alt), description)


def plot_decode_batch(batches, measured, predicted, ridge_batch):
    """Decoding throughput (tokens/s) against batch size: measured and the roofline's bound."""
    fig, ax = _figure((5.8, 3.6))
    ax.loglog(batches, predicted, "-", color=PALETTE[6], lw=1.5, label="roofline bound")
    ax.loglog(batches, measured, "o", color=PALETTE[1], label="measured")
    ax.axvline(ridge_batch, color=PALETTE[2], ls=":", lw=1.2)
    ax.annotate("ridge", (ridge_batch, min(measured)), xytext=(4, 0), textcoords="offset points",
                fontsize=9, color=PALETTE[2])
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ax.minorticks_off()
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xticks(list(batches), [str(b) for b in batches])
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("generated tokens per second")
    legend_outside(ax, ncol=1)
    alt = (f"Decoding throughput against batch size, log-log: measured {min(measured):,.0f} to "
           f"{max(measured):,.0f} tokens/s, under the roofline bound; ridge at batch {ridge_batch:.0f}.")
    description = " ".join(f"Batch {b}: measured {m:,.0f}, bound {p:,.0f} tokens/s."
                           for b, m, p in zip(batches, measured, predicted))
    set_alt(fig, short_alt(alt), description)
    return fig


def plot_attention_terms(terms):
    """Slow-memory accesses of one head, term by term, for several algorithms (stacked bars).

    terms: {algorithm label: {(array, "read" | "write"): elements}} (attention_access_terms).
    Nine arrays are more than colour can tell apart (two Okabe-Ito hues merge under deuteranopia),
    so every segment is named in words: on the bar where it is wide enough, else after the bar.
    """
    from matplotlib.patches import Patch

    fig, ax = _figure((COLUMN_IN - 0.2, 3.6))
    arrays = ["Q", "K", "V", "Z", "P", "O", "l", "m", "L"]
    colours = dict(zip(arrays, [PALETTE[0], PALETTE[2], PALETTE[6], PALETTE[1], PALETTE[3],
                                PALETTE[5], PALETTE[4], PALETTE[7], PALETTE[4]]))
    total = max(sum(t.values()) for t in terms.values()) / 1e6
    y = np.arange(len(terms))[::-1]
    shown = []            # arrays with a segment wide enough to see: the legend's entries
    for yy, (label, t) in zip(y, terms.items()):
        left, small = 0.0, []
        for a in arrays:
            for kind, hatch in (("read", ""), ("write", "//")):
                n = t.get((a, kind), 0) / 1e6
                if not n:
                    continue
                ax.barh(yy, n, left=left, height=0.6, color=colours[a], hatch=hatch, edgecolor="white", lw=0.5)
                name = f"{a} {'w' if kind == 'write' else 'r'}"
                if n >= DIRECT_LABEL_MIN * total:
                    ax.text(left + n / 2, yy, name, ha="center", va="center", fontsize=10, color="black",
                            # on a white chip: black text is at least 4.5:1 whatever the segment's colour
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.9})
                elif n >= DIRECT_NOTE_MIN * total:
                    small.append(f"{name} {n:.1f}")
                if n >= DIRECT_NOTE_MIN * total and a not in shown:
                    shown.append(a)
                left += n
        # the total, then the segments too narrow to name on the bar
        ax.annotate(f"{left:.1f} M" + (f" ({', '.join(small)})" if small else ""), (left, yy),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=10)
    ax.set_yticks(y, list(terms), fontsize=10)
    ax.set_xlabel("slow-memory accesses (millions of elements; hatched: writes)")
    ax.set_ylabel("algorithm")
    ax.grid(axis="y", visible=False)
    handles = [Patch(facecolor=colours[a], edgecolor="white", label=a) for a in arrays if a in shown]
    handles.append(Patch(facecolor="white", edgecolor=PALETTE[6], hatch="//", label="write"))
    ax.legend(handles=handles, ncol=len(handles), loc="upper center", bbox_to_anchor=(0.5, -0.22),
              title="array (r: read, w: write)", handlelength=1.4, columnspacing=1.0)
    ax.set_xlim(0, total * 1.2)
    # the words a reader of the notebook hears (preln.nb): the totals, then each bar's largest terms
    totals = {label: sum(t.values()) / 1e6 for label, t in terms.items()}
    alt = short_alt("Slow-memory accesses of one head, stacked by array: "
                    + "; ".join(f"{label} {n:.1f} M" for label, n in totals.items()) + ".")
    largest = {label: sorted(t.items(), key=lambda kv: -kv[1])[:3] for label, t in terms.items()}
    description = " ".join(
        f"{label}: {totals[label]:.1f} million accesses, the largest "
        + ", ".join(f"{kind}s of {a} {n / 1e6:.1f} M" for (a, kind), n in top) + "."
        for label, top in largest.items())
    return set_alt(fig, alt, description)


#: the ops of a decode step drawn by plot_decode_ops: the weight matmuls and attention
_DECODE_OPS = {"qkv_proj": "q, k, v projection", "out_proj": "out projection",
               "mlp": "MLP matrices", "attention": "attention (reads the KV cache)"}


def plot_decode_ops(models, machines, context, batches=None):
    """Per-op roofline of a decode step: each op's arithmetic intensity in 16-bit against the batch
    size, one panel per model, with the ridge points of ``machines`` ({label: (Roofline, itemsize)};
    a machine computing in ``itemsize`` bytes has intensities 2 / itemsize times the 16-bit ones, so
    its line is drawn at ridge * itemsize / 2): an op is compute-bound on a machine where its curve
    is above that machine's line."""
    batches = np.unique(np.round(np.logspace(0, 12, 60, base=2)).astype(int)) if batches is None \
        else np.asarray(batches)
    fig, axes = _figure((COLUMN_IN - 0.2, 1.0 + 3.0 * len(models)), len(models), 1, sharex=True)
    axes = np.atleast_1d(axes)
    styles = {"qkv_proj": (PALETTE[0], "-"), "out_proj": (PALETTE[2], "--"),
              "mlp": (PALETTE[4], "-."), "attention": (PALETTE[1], "-")}
    attention = {}                                # each model's attention intensities: the words
    for ax, model in zip(axes, models):
        for op, label in _DECODE_OPS.items():
            name = _step_op(model, op)
            ys = [{o.name: o for o in step_ops(model, int(b), 1, context, itemsize=2)}[name].intensity
                  for b in batches]
            if op == "attention":
                attention[model.name] = ys
            colour, ls = styles[op]
            ax.loglog(batches, ys, ls, color=colour, lw=1.8, label=label)
        for label, (roof, size) in machines.items():
            line = roof.ridge * size / 2          # a machine computing in `size` bytes: its ridge
            ax.axhline(line, color=PALETTE[6], lw=0.8, ls=":")        # on the 16-bit axis
            ax.annotate(f"{label} ridge" + (f" × {size // 2}" if size != 2 else ""),
                        (batches[-1], line), xytext=(-2, 2), textcoords="offset points",
                        fontsize=9, ha="right")
        ax.set_xlabel("batch (sequences decoded together)")
        kind = "multi-head" if model.group == 1 else f"grouped-query, {model.n_kv_heads} KV heads"
        ax.set_title(f"{model.name} ({kind}), context {context}", loc="left", fontsize=10)
        ax.minorticks_off()
    for ax in axes:
        ax.set_ylabel("FLOPs per byte (16-bit)")
    legend_outside(axes[-1])
    # the smallest batch at which each weight matmul reaches each machine's ridge, if it is plotted
    top = int(batches[-1])
    cross = {label: [compute_bound_batch(model, roof, _step_op(model, op), context, itemsize=size,
                                         max_batch=top)
                     for model in models for op in _DECODE_OPS if op != "attention"]
             for label, (roof, size) in machines.items()}
    lowest = min((r.ridge * size / 2 for r, size in machines.values()), default=float("inf"))
    below = all(max(ys) < lowest for ys in attention.values())

    flat = ", ".join(f"{span(ys)} ({name})" for name, ys in attention.items())
    reached = {label: [b for b in bs if b is not None] for label, bs in cross.items()}
    every = [b for bs in reached.values() for b in bs]
    alt = (f"Decode-op FLOP/B against batch (context {context}): weight matmuls "
           + (f"pass the ridges at batch {span(every)}" if every else f"pass no ridge up to batch {top}")
           + f"; attention stays at {' and '.join(span(ys) for ys in attention.values())}"
           + (", below all." if below else "."))
    n = len(models)
    description = (
        f"{n} log-log panel{'s' if n > 1 else ''}, " + ", ".join(
            f"{m.name} with " + ("multi-head attention" if m.group == 1 else
                                 f"grouped-query attention ({m.n_kv_heads} KV heads)") for m in models)
        + f", {'each ' if n > 1 else ''}plotting the arithmetic intensity in 16-bit of a decode step's ops "
        f"against the batch size from {int(batches[0])} to {top} at a context of {context} tokens, with a "
        "dotted line at each machine's ridge. The weight matmuls (q, k, v projection, out projection, MLP "
        "matrices) rise with the batch, in proportion while it is small: " + "; ".join(
            (f"they reach the ridge line of {label} at batch {span(bs)}" if bs else
             f"they stay below the ridge line of {label} up to batch {top}") for label, bs in reached.items())
        + f". Attention is a flat line at {flat} FLOPs per byte, "
        + ("below every ridge at any batch." if below else "whatever the batch."))
    return set_alt(fig, short_alt(alt), description)


def _step_op(model, op):
    """The step_ops name of a _DECODE_OPS entry: the MLP's second matrix (down in a gated MLP)."""
    return ("down" if model.gated else "linear2") if op == "mlp" else op


def plot_paged_memory(paged, reserved, block_size, max_len, bytes_per_position):
    """KV-cache memory over scheduler steps: the tokens stored, what the paged cache holds (whole
    blocks), and what reserving max_len per running sequence would hold; below, how many
    sequences run per step under the paged cache and under the reservation (same pool)."""
    # each panel its own step range (the paged run finishes first), and one colour per run: the
    # paged run blue, the max_len-reserving run vermillion; the top panel is the paged run alone,
    # with what its own batch would hold reserving max_len in black
    fig, (ax, bx) = _figure((COLUMN_IN - 0.2, 7.0), 2, 1)
    kib = bytes_per_position / 2**10
    steps = np.array([r.step for r in paged.steps])
    stored = np.array([r.tokens_stored for r in paged.steps]) * kib
    held = np.array([r.blocks_used * block_size for r in paged.steps]) * kib
    whole = np.array([r.reserved_tokens for r in paged.steps]) * kib
    ax.plot(steps, whole, "--", color=PALETTE[6], lw=1.4,
            label=f"had each sequence reserved max_len = {max_len}")
    ax.plot(steps, held, "-", color=PALETTE[0], lw=1.6, label=f"paged: blocks of {block_size} held")
    ax.fill_between(steps, 0, stored, color=PALETTE[0], alpha=0.2, lw=0)
    # the pale area is named by its edge, drawn at full colour (3:1 on white; the fill is pale)
    ax.plot(steps, stored, ":", color=PALETTE[0], lw=1.6, label="paged: positions stored")
    ax.set_xlim(steps.min(), steps.max())
    ax.set_ylim(0, None)
    ax.set_ylabel("KV cache (KiB)")
    ax.set_xlabel("scheduler step (paged run)")
    ax.set_title("the paged run: its keys and values, held two ways", loc="left", fontsize=10)
    legend_outside(ax, ncol=1)
    r_steps = np.array([r.step for r in reserved.steps])
    bx.step(steps, [len(r.running) for r in paged.steps], where="mid", color=PALETTE[0],
            label="paged cache")
    bx.step(r_steps, [len(r.running) for r in reserved.steps], where="mid", color=PALETTE[1],
            ls="--", label="max_len reserved, same memory")
    bx.set_xlim(0, max(steps.max(), r_steps.max()))
    bx.set_xlabel("scheduler step")
    bx.set_ylabel("sequences running")
    bx.set_title("two runs of the same requests", loc="left", fontsize=10)
    legend_outside(bx)
    use, use_whole = stored.sum() / held.sum(), stored.sum() / whole.sum()
    runs = {}                                     # per run: (steps, mean and peak batch)
    for name, run in (("paged", paged), ("reserved", reserved)):
        busy = [len(r.running) for r in run.steps if r.running]
        runs[name] = (len(run.steps), np.mean(busy) if busy else 0.0, max(busy, default=0))
    alt = (f"KV cache per step: paged blocks of {block_size} are {use:.0%} filled, reserved {max_len} each, "
           f"{use_whole:.0%}; paged runs up to {runs['paged'][2]} sequences, done in {runs['paged'][0]} steps "
           f"against {runs['reserved'][0]}.")
    description = (
        "Two panels over the scheduler steps of the same request stream. Top: KV-cache memory in KiB: the "
        f"positions actually stored (a filled area with a dotted edge, at most {stored.max():.0f} KiB), the "
        f"paged cache's blocks of {block_size} (a line just above it, at most {held.max():.0f} KiB; over the "
        f"run {use:.0%} of what it holds is stored positions) and what reserving {max_len} positions per "
        f"running sequence would hold (at most {whole.max():.0f} KiB, {whole.sum() / held.sum():.1f} times the "
        "paged cache over the run). Bottom: the number of sequences running per step. " + " ".join(
            f"{what}: {mean:.1f} on average and up to {peak}, finished after {n} steps." for what, (n, mean, peak)
            in zip(("With the paged cache", "With max_len reserved per sequence in the same memory"), runs.values())))
    return set_alt(fig, short_alt(alt), description)


# ---- the explorable: decode on a published GPU ------------------------------------------------

def _decode_point(batch, context, gpu):
    roof = PUBLISHED[gpu]
    cost = decode_cost(OPT13B, OPT13B_LAYERS, batch, context, itemsize=2)
    t = float(roof.time(cost.flops, cost.nbytes))
    kv = kv_cache_bytes(OPT13B_LAYERS, batch, context, OPT13B.d_model, 2)
    return roof, cost, t, kv


#: the memory bar's scale (GB) and the one card it marks
MEMORY_SCALE_GB, CARD_GB = 400.0, 80.0


def plot_decode_roofline(batch=8, context=4096, gpu="H100 SXM"):
    """Where one OPT-13B decoding step sits on a published GPU's roofline; tokens/s and memory.

    Two axes: a memory bar over the roofline (weights + KV cache against one 80 GB card) and the
    roofline itself, log scales set once: the callback of a kernel-free explorable must stay well
    under 100 ms. Every text is at least 10 pt (12.5 CSS px in a frame).
    """
    roof, cost, t, kv = _decode_point(batch, context, gpu)
    fig, (mx, ax) = _figure((6.8, 5.0), 2, 1, height_ratios=(1, 7))
    fig.suptitle(f"context {context}: at most {batch / t:,.0f} tokens/s, {t * 1e3:.1f} ms per step",
                 fontsize=11)
    # memory: weights then KV cache, 0 .. MEMORY_SCALE_GB, the 80 GB of one card dashed
    w, k = cost.weight_bytes / 1e9, kv / 1e9
    mx.barh([0], [min(w, MEMORY_SCALE_GB)], color=PALETTE[0], height=0.8)
    mx.barh([0], [max(0.0, min(k, MEMORY_SCALE_GB - w))], left=[min(w, MEMORY_SCALE_GB)],
            color=PALETTE[3], height=0.8)
    mx.axvline(CARD_GB, color=PALETTE[6], lw=1.2, ls="--")
    mx.set_xlim(0, MEMORY_SCALE_GB)
    mx.set_ylim(-0.5, 0.5)
    mx.set_yticks([])
    mx.set_xticks([0, CARD_GB, 200, 300, MEMORY_SCALE_GB],
                  ["0", f"{CARD_GB:.0f}: one card", "200", "300", f"{MEMORY_SCALE_GB:.0f} GB"])
    mx.grid(False)
    mx.spines["left"].set_visible(False)
    mx.set_title(f"memory: weights {w:,.1f} GB + KV cache {k:,.1f} GB"
                 f"{', off the scale' if w + k > MEMORY_SCALE_GB else ''}", fontsize=10, loc="left")
    ax.set_xscale("log")
    ax.set_yscale("log")
    i = np.array([_I_LIM[0], roof.ridge, _I_LIM[1]])
    ax.plot(i, roof.attainable(i), "-", color=PALETTE[6], lw=1.8, label=f"{gpu} (published)")
    ax.axvline(roof.ridge, color=PALETTE[6], lw=0.8, ls=":")
    others = [decode_cost(OPT13B, OPT13B_LAYERS, b, context, itemsize=2).intensity
              for b in DECODE_CONTROLS["batch"]]
    ax.plot(others, roof.attainable(others), "o", color=PALETTE[4], ms=4,
            label="other batch sizes")
    ax.plot([cost.intensity], [roof.attainable(cost.intensity)], "o", color=PALETTE[1], ms=10,
            label=f"decode, batch {batch}")
    ax.set_xlim(*_I_LIM)
    ax.set_ylim(1e11, 2e15)
    ax.set_xlabel("FLOPs per byte")
    ax.set_ylabel("FLOP/s")
    legend_outside(ax)
    ax.minorticks_off()
    return fig


def decode_roofline_alt(batch, context, gpu):
    roof, cost, t, kv = _decode_point(batch, context, gpu)
    bound = "memory-bound" if cost.intensity < roof.ridge else "compute-bound"
    return (f"Roofline of the {gpu} from its published peak and bandwidth, with one decoding step "
            f"of OPT-13B's 40 blocks in 16-bit at batch {batch} and context {context}: arithmetic "
            f"intensity {cost.intensity:.1f} FLOPs per byte against a ridge at {roof.ridge:.0f}, so "
            f"the step is {bound}, at most {batch / t:,.0f} tokens per second. A bar above it "
            f"shows memory: {cost.weight_bytes / 1e9:.1f} GB of weights and {kv / 1e9:.1f} GB of KV "
            f"cache, against a dashed mark at 80 GB.")


EXPLORABLES = {"decode_roofline": (plot_decode_roofline, DECODE_CONTROLS)}


# ---- tables -----------------------------------------------------------------------------------

_TD = "padding:0.15em 0.5em;white-space:nowrap"
_TDR = _TD + ";text-align:right"
_TH = _TD + ";text-align:left;font-weight:normal"   # a row header: named, not restyled
_THW = "padding:0.15em 0.5em;vertical-align:bottom;text-align:left"   # a column header that may wrap


def traffic_table_html(unfused, fused, caption):
    """An HTML table: per op FLOPs, unfused and fused traffic, and arithmetic intensity."""
    import html

    def mib(n):
        return f"{n / 2**20:.1f}"

    fused_by = {o.name: o for o in fused}
    rows = []
    for o in unfused:
        f = fused_by.get(o.name)
        rows.append("<tr>" + "".join([
            f"<th scope='row' style='{_TH}'><code>{html.escape(o.name)}</code></th>",
            f"<td style='{_TDR}'>{o.flops / 1e6:,.1f}</td>",
            f"<td style='{_TDR}'>{mib(o.nbytes)}</td>",
            f"<td style='{_TDR}'>{o.intensity:.3g}</td>",
            f"<td style='{_TDR}'>{mib(f.nbytes) if f else 'fused'}</td>"]) + "</tr>")
    for o in fused:
        if o.name not in {u.name for u in unfused}:
            rows.append("<tr>" + "".join([
                f"<th scope='row' style='{_TH}'><em>fused:</em> <code>{html.escape(o.name)}</code></th>",
                f"<td style='{_TDR}'>{o.flops / 1e6:,.1f}</td>", f"<td style='{_TDR}'></td>",
                f"<td style='{_TDR}'>{o.intensity:.3g}</td>",
                f"<td style='{_TDR}'>{mib(o.nbytes)}</td>"]) + "</tr>")
    tu, tf = sum(o.nbytes for o in unfused), sum(o.nbytes for o in fused)
    fl = sum(o.flops for o in unfused)
    rows.append(f"<tr style='border-top:2px solid currentColor'><th scope='row' style='{_TH}'><strong>total"
                f"</strong></th><td style='{_TDR}'>{fl / 1e6:,.1f}</td><td style='{_TDR}'>{mib(tu)}"
                f"</td><td style='{_TDR}'>{fl / tu:.3g}</td><td style='{_TDR}'>{mib(tf)}</td></tr>")
    head = "".join(f"<th scope='col' style='{_TDR if i else _TD}'>{h}</th>" for i, h in enumerate(
        ["op", "MFLOP", "unfused MiB", "FLOP/B (unfused)", "fused MiB"]))
    return (f"<div style='overflow-x:auto'><table style='font-size:0.8em;border-collapse:collapse'>"
            f"<caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def bound_table_html(ops, machines, caption):
    """An HTML table: each op's intensity and, per machine, whether it is memory- or compute-bound.

    ops: {itemsize: [OpTraffic]}, machines: {label: (Roofline, itemsize)}.
    """
    import html

    names = [o.name for o in next(iter(ops.values())) if o.flops > 0]
    by = {size: {o.name: o for o in lst} for size, lst in ops.items()}
    # short headers that wrap (the ridge on a line of its own): the table fits a 688 px column
    head = ["op"] + [f"FLOP/B<br>{8 * size}-bit" for size in ops] + [
        f"{html.escape(label)}<br><span style='white-space:nowrap'>ridge {roof.ridge:.0f}</span>" for label, (roof, _) in machines.items()]
    rows = []
    for n in names:
        cells = [f"<th scope='row' style='{_TH}'><code>{html.escape(n)}</code></th>"]
        cells += [f"<td style='{_TDR}'>{by[size][n].intensity:.3g}</td>" for size in ops]
        for roof, size in machines.values():
            compute = by[size][n].intensity >= roof.ridge
            cells.append(f"<td style='{_TD}'>{'<strong>compute</strong>' if compute else 'memory'}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    th = "".join(f"<th scope='col' style='{_THW}'>{h}</th>" for h in head)
    return (f"<div style='overflow-x:auto'><table style='font-size:0.8em;border-collapse:collapse'>"
            f"<caption>{html.escape(caption)}</caption><thead><tr>{th}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")
