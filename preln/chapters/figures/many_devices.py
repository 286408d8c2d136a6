"""Figures of the chapter "The block on many devices" (book/many_devices.ipynb).

Everything is drawn from :mod:`preln.chapters.parallel`'s formulas and the datasheet values it
holds, so the frames are the same on every machine:

    EXPLORABLES = {"memory": (plot_memory, {"model": ..., "stage": ...})}
"""
from __future__ import annotations

import numpy as np

from preln.chapters import parallel as par
from preln.chapters.viz import COLUMN_IN, PALETTE, control, direct_labels, legend_outside, log_ticks
from preln.nb import set_alt, short_alt

__all__ = ["EXPLORABLES", "MEMORY_MODELS", "WORLDS", "GPU_MEMORY", "memory_per_device", "plot_memory", "memory_alt",
           "plot_tp_times", "plot_schedule"]

#: data-parallel degrees on the memory figure's axis
WORLDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: an H100 SXM's memory (80 GB, its datasheet), the line a device must stay under
GPU_MEMORY = 80e9
#: the explorable's models: one that fits on a device at stage 0, one that needs ZeRO, one that needs stage 3
MEMORY_MODELS = ("GPT-2 XL", "Llama 2 7B", "Llama 2 70B")
MEMORY_CONTROLS = {"model": control("published model", list(MEMORY_MODELS)),
                   "stage": control("ZeRO stage", list(par.ZERO_STAGES))}
_PARTS = (("params", "16-bit weights"), ("grads", "16-bit gradients"),
          ("optimizer", "fp32 weights + Adam moments"), ("activations", "activations (checkpointed)"))


def _figure(figsize, *grid, **kwargs):
    """A Figure made without pyplot, so a notebook shows it once (see figures.shape_flow)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def memory_per_device(model, stage, worlds=WORLDS):
    """[DeviceMemory per P]: mixed-precision Adam at ZeRO ``stage``, one sequence of the model's
    full context per device, activations checkpointed (each block's input kept)."""
    n = par.param_count(par.MODELS[model])
    act = par.checkpointed_activation_bytes(par.MODELS[model], par.MODELS[model].max_context)
    return [par.zero_memory(n, P, stage, activations=act) for P in worlds]


def _fits(mems, worlds=WORLDS):
    return next((P for P, m in zip(worlds, mems) if m.total <= GPU_MEMORY), None)


def plot_memory(model="Llama 2 7B", stage=0):
    """Stacked bars on a linear axis (segment heights proportional to bytes): bytes per device
    against the data-parallel degree P, with the 80 GB line. The axis is the model's, the same at
    every stage (up to its stage-0 bar), so moving the stage shows what each one takes away."""
    mems = memory_per_device(model, stage)
    fig, ax = _figure((COLUMN_IN * 0.92, 4.4))
    x = np.arange(len(WORLDS))
    bottom = np.zeros(len(WORLDS))
    # blue, vermillion, green, purple: apart under deuteranopia and protanopia; the activations,
    # which no stage shards, also hatched
    for (field, label), colour, hatch in zip(_PARTS, [PALETTE[i] for i in (0, 1, 2, 5)], ("", "", "", "//")):
        h = np.array([getattr(m, field) for m in mems]) / 1e9
        ax.bar(x, h, bottom=bottom, color=colour, label=label, width=0.75, hatch=hatch)
        bottom += h
    top = max(memory_per_device(model, 0)[0].total, GPU_MEMORY) / 1e9
    ax.set_ylim(0, 1.05 * top)
    ax.axhline(GPU_MEMORY / 1e9, color=PALETTE[6], ls="--", lw=1.2)
    ax.annotate("80 GB (H100)", (len(WORLDS) - 0.5, GPU_MEMORY / 1e9), xytext=(0, 2),
                textcoords="offset points", ha="right", va="bottom",
                fontsize=10, bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.set_xticks(x, [str(P) for P in WORLDS])
    ax.set_xlabel("data-parallel ranks $P$")
    ax.set_ylabel("memory per device (GB)")
    ax.set_title(f"{model}, ZeRO stage {stage}")
    legend_outside(ax, where="below")
    return fig


def _gb(nbytes):
    gb = nbytes / 1e9
    return f"{gb:.3g}" if gb < 1000 else f"{gb:,.0f}"


def memory_alt(model, stage):
    mems = memory_per_device(model, stage)
    fits = _fits(mems)
    where = (f"it fits in 80 GB from P = {fits} on" if fits else "it never fits in 80 GB, whatever P")
    return (f"Stacked bars of memory per device, on a linear scale, against the data-parallel degree P "
            f"from 1 to 1024, for {model} at ZeRO stage {stage}: {_gb(mems[0].total)} GB at P = 1 "
            f"and {_gb(mems[-1].total)} GB at P = 1024; {where}. Stage 0 keeps every bar as tall as "
            "the first; each stage shards one more part, and what is left is what no stage shards "
            "(the activations, and the unsharded parts).")


def _memory_summary(model, stage):
    fits = _fits(memory_per_device(model, stage))
    return f"{model}, stage {stage}: " + (f"fits from P = {fits}." if fits else "never fits in 80 GB.")


memory_alt.summary = _memory_summary


def plot_tp_times(model, tokens, degrees=(1, 2, 4, 8, 16, 32, 64)):
    """One layer's training-step compute time per rank against the tensor-parallel degree, and the
    communication time of its all-reduces over each link."""
    m = par.MODELS[model]
    fig, ax = _figure((COLUMN_IN - 0.2, 3.8))
    comp = [par.tp_layer_times(m, tokens, P, par.LINKS["NVLink 4"])[0] * 1e3 for P in degrees]
    comms = {name: [par.tp_layer_times(m, tokens, P, link)[1] * 1e3 for P in degrees[1:]]
             for name, link in par.LINKS.items()}
    ax.loglog(degrees, comp, "-o", color=PALETTE[6], lw=2, label="compute per rank")
    # the links by name, in the order of their speed; the dashes say "communication"
    for (name, comm), colour, marker in zip(comms.items(), PALETTE, "s^D"):
        ax.loglog(degrees[1:], comm, "--" + marker, color=colour,
                  label=f"all-reduces, {name.replace(' x', ' ×')}")
    ax.set_xticks(degrees, [str(P) for P in degrees])
    ax.minorticks_off()
    ax.set_xlabel("tensor-parallel degree $P$")
    ax.set_ylabel("time per layer and step (ms)")
    ax.set_title(f"One {model} layer, {tokens} tokens, forward + backward on H100s (16-bit)",
                 loc="left", fontsize=11)
    log_ticks(ax, "y")
    # a line apart, clear of the last markers: the slow links' ends lie close together
    direct_labels(ax, pad_pt=7.0, gap_pt=15.0)
    # the words: where each link's all-reduces first take at least the compute time
    first = {name: next((P for P, c, t in zip(degrees[1:], comm, comp[1:]) if c >= t), None)
             for name, comm in comms.items()}
    passing = ", ".join(f"{P} ({name})" for name, P in first.items() if P)
    never = " or ".join(name for name, P in first.items() if P is None)
    where = ([f"at P = {passing}"] if passing else []) + ([f"never over {never}"] if never else [])
    alt = (f"{model} layer time, tensor-parallel: compute {comp[0] * degrees[0]:.3g} ms over P; all-reduces pass it "
           + ", ".join(where) + ".")

    def crossing(name):
        P = first[name]
        if P is None:
            return f"below compute at every P up to {degrees[-1]}"
        if P == degrees[1]:
            return f"above compute from P = {P} on"
        return f"below compute up to P = {degrees[degrees.index(P) - 1]} and above it from P = {P}"

    description = (
        f"Log-log plot of one {model} layer's training-step time per device (forward and backward, "
        f"{tokens} tokens) against the tensor-parallel degree P from {degrees[0]} to {degrees[-1]}. Compute "
        f"(H100, dense BF16) falls as 1/P, from {comp[0]:.3g} ms at P = {degrees[0]} to {comp[-1]:.3g} ms "
        f"at P = {degrees[-1]}. The all-reduces' time rises with P: " + "; ".join(
            f"over {name} from {comms[name][0]:.3g} ms at P = {degrees[1]} ({comms[name][0] / comp[1]:.2g} times the "
            f"compute) to {comms[name][-1]:.3g} ms at "
            f"P = {degrees[-1]}, {crossing(name)}" for name in comms) + ".")
    return set_alt(fig, short_alt(alt), description)


def plot_schedule(p, m):
    """The forward of a GPipe schedule: stage against time step, each cell the micro-batch."""
    from matplotlib.patches import Rectangle

    grid = par.gpipe_schedule(p, m)
    fig, ax = _figure((6.2, 0.5 + 0.45 * p))
    for s in range(p):
        for t in range(grid.shape[1]):
            i = grid[s, t]
            ax.add_patch(Rectangle((t, p - 1 - s), 0.95, 0.9,
                                   color=PALETTE[i % 2] if i >= 0 else "#DDDDDD"))
            if i >= 0:
                ax.text(t + 0.47, p - 1 - s + 0.45, str(i + 1), ha="center", va="center", color="white",
                        fontsize=9)
    ax.set_xlim(0, grid.shape[1])
    ax.set_ylim(0, p)
    # stages from 0 (the chapter's stage s, holding p - s micro-batches in 1F1B), micro-batches
    # and time steps from 1, as the pipeline diagram: micro-batch i reaches stage s at step i + s
    ax.set_yticks(np.arange(p) + 0.45, [f"stage {p - 1 - s}" for s in range(p)])
    ax.set_xticks(np.arange(grid.shape[1]) + 0.47, [str(t + 1) for t in range(grid.shape[1])])
    ax.set_xlabel("time step")
    ax.set_ylabel("pipeline stage")
    ax.set_title(f"${p = }$ stages, ${m = }$ micro-batches: grey is the bubble, "
                 f"{100 * par.bubble_fraction(p, m):.0f} %", fontsize=10)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.grid(False)
    steps, idle = grid.shape[1], int((grid[0] < 0).sum())
    pct = f"{100 * par.bubble_fraction(p, m):.0f} %"
    alt = (f"GPipe forward schedule, {p} stages by {steps} time steps: each of {m} micro-batches moves down "
           f"one stage per step; grey bubble {idle} of {steps} steps, {pct}.")
    description = (
        f"The forward pass of a GPipe schedule with {p} stages and {m} micro-batches, drawn as a grid of "
        f"pipeline stage (stage 0 at the top) against time step 1 to {steps}; each cell is coloured and "
        f"numbered with the micro-batch the stage works on (1 to {m}), grey where it idles. Micro-batch 1 "
        "starts on stage 0 at step 1 and each micro-batch moves down one stage per step, so the coloured cells form "
        f"a parallelogram of {m} cells per row"
        + (f", with grey idle cells in the top-right and bottom-left corners: {idle} of every {steps} steps, "
           f"{pct}, are the bubble." if idle else ", with no idle cell."))
    return set_alt(fig, short_alt(alt), description)


EXPLORABLES = {"memory": (plot_memory, MEMORY_CONTROLS)}
