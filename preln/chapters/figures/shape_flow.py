"""Figures and tables of the shape-flow chapter (book/shape_flow.ipynb).

Everything here draws what :mod:`preln.chapters.shapes` computes; the notebook imports and calls.

    EXPLORABLES = {"ops": (plot_ops, {"S": ..., "D": ..., "H": ...}),
                   "flops_split": (plot_flops_split, {"D": ..., "ratio": ...})}
"""
from __future__ import annotations

import html

import numpy as np

from preln.nn.config import BlockConfig
from preln.chapters.shapes import closed_form_flops, format_bytes, format_count, shape_flow
from preln.chapters.viz import (COLUMN_IN, PALETTE, control, direct_labels, figure_legend, legend_outside,
                               log_ticks)
from preln.nb import set_alt, short_alt

__all__ = ["EXPLORABLES", "plot_ops", "ops_alt", "plot_flops_split", "flops_split_alt",
           "shape_table_html", "backward_table_html", "kept_per_token_html", "live_shape_table",
           "plot_flops_vs_size", "plot_timings", "plot_peak_memory"]

#: the explorable over the op-by-op costs: B = 1, F = 4 D
OPS_CONTROLS = {"S": control("sequence length S", [128, 1024, 8192]),
                "D": control("model width D", [64, 256, 1024]),
                "H": control("number of heads H", [1, 4, 16])}
OPS_B = 1
#: fixed axis limits, so that moving a control moves the bars, not the axes
_FLOPS_LIM = (1e3, 1e12)
_BYTES_LIM = (1e3, 1e10)

#: the explorable over the FLOP split against S
SPLIT_CONTROLS = {"D": control("width D of the projections", [64, 256, 1024]),
                  "ratio": control("MLP ratio F/D", [2, 4, 8])}
SPLIT_S = np.unique(np.logspace(4, 16, 49, base=2).round().astype(int))   # 16 .. 65536


def _figure(figsize, *grid, **kwargs):
    """A Figure and its axes, made without pyplot: nothing is registered with a backend, so a
    notebook shows the figure once, as the cell's value, and re-running stores the same output."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kwargs)


def _shape(shape):
    return "(" + ", ".join(str(n) for n in shape) + ")"


def _ops_config(D, H):
    return BlockConfig(d_model=D, n_heads=H, d_ff=4 * D)


# ---- the op-by-op explorable -----------------------------------------------------------------

def plot_ops(S=512, D=64, H=4, B=OPS_B, training=True):
    """Horizontal bars per op: FLOPs (left) and bytes written / kept for the backward (right)."""
    flow = shape_flow(_ops_config(D, H), B, S, training=training)
    rows = flow.rows
    y = np.arange(len(rows))[::-1]
    labels = [f"{r.name}  " + (f"{len(r.outputs)} × " if len(r.outputs) > 1 else "") + _shape(r.output)
              for r in rows]
    fig, (ax_f, ax_b) = _figure((7.6, 5.4), 1, 2, sharey=True)

    # bars as thick horizontal lines: one LineCollection per series draws ~10x faster than patches
    flops = np.array([r.flops for r in rows], dtype=float)
    is_mm = np.array([r.matmul_flops > 0 for r in rows])
    for sel, colour, label in ((is_mm, PALETTE[0], "matmul"), (~is_mm & (flops > 0), PALETTE[1],
                                                                 "elementwise")):
        ax_f.hlines(y[sel], _FLOPS_LIM[0], flops[sel], colors=colour, lw=11, label=label)
    ax_f.set_xscale("log")
    ax_f.set_xlim(*_FLOPS_LIM)
    ax_f.set_ylim(-0.7, len(rows) - 0.3)
    ax_f.set_yticks(y, labels, fontsize=9)
    ax_f.set_xticks([1e3, 1e5, 1e7, 1e9, 1e11])
    ax_f.set_xlabel("FLOPs (multiply-add = 2)")

    out = np.array([r.out_bytes for r in rows], dtype=float)
    kept = np.array([r.kept_bytes for r in rows], dtype=float)
    for values, dy, colour, label in ((out, 0.2, PALETTE[2], "output written"),
                                      (kept, -0.2, PALETTE[5], "kept for backward")):
        sel = values > 0
        ax_b.hlines(y[sel] + dy, _BYTES_LIM[0], values[sel], colors=colour, lw=5.5, label=label)
    ax_b.set_xscale("log")
    ax_b.set_xlim(*_BYTES_LIM)
    ax_b.set_xticks([1e3, 1e5, 1e7, 1e9])
    ax_b.set_xlabel("bytes (float32)")
    for ax in (ax_f, ax_b):
        ax.grid(axis="y", visible=False)
        ax.minorticks_off()
    # one legend for both panels, in one row under them: four entries, beside the data, not over
    # it (two legends under the panels ran into each other)
    fig.legend(*_handles(ax_f, ax_b), loc="outside lower center", ncol=4, handlelength=1.2,
               columnspacing=1.2)
    t = flow.totals
    fig.suptitle(f"$B = {B}$, $S = {S}$, $D = {D}$, $H = {H}$, $F = {4 * D}$:  "
                 f"{format_count(t['flops'])}FLOP, keeps {format_bytes(t['kept_bytes'])}", fontsize=10)
    return fig


def _handles(*axes):
    """The legend handles and labels of several axes, in order."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    return handles, labels


def ops_alt(S, D, H, B=OPS_B):
    """Alt text of one frame of :func:`plot_ops`, with the numbers it shows."""
    flow = shape_flow(_ops_config(D, H), B, S)
    big_f = max(flow.rows, key=lambda r: r.flops)
    big_k = max(flow.rows, key=lambda r: r.kept_bytes)
    t = flow.totals
    return (f"Bar charts of the {len(flow.rows)} ops of one Pre-LN block forward for B = {B}, "
            f"S = {S}, D = {D}, H = {H}, F = {4 * D}, on logarithmic axes. Left: FLOPs per op, "
            f"{format_count(t['flops'])}FLOP in total; the costliest op is {big_f.name} with "
            f"{format_count(big_f.flops)}FLOP. Right: bytes each op writes and keeps for the "
            f"backward, {format_bytes(t['kept_bytes'])} kept in total; the largest is "
            f"{big_k.name}, keeping {format_bytes(big_k.kept_bytes)}.")


def ops_summary(S, D, H, B=OPS_B):
    """What the live region says of a frame of :func:`plot_ops`: the totals, and the costliest op."""
    flow = shape_flow(_ops_config(D, H), B, S)
    big_f = max(flow.rows, key=lambda r: r.flops)
    t = flow.totals
    return (f"{format_count(t['flops'])}FLOP in total, {format_bytes(t['kept_bytes'])} kept for the "
            f"backward; costliest op {big_f.name}, {format_count(big_f.flops)}FLOP.")


ops_alt.summary = ops_summary     # preln.chapters.viz.explorable announces it


# ---- FLOP split against S ---------------------------------------------------------------------

def _split(S, D, F, B=1):
    S = np.asarray(S, dtype=float)
    proj = 2 * B * S * (4 * D * D + 2 * D * F)    # in_proj, out_proj, linear1, linear2
    attn = 4 * B * S * S * D                      # q k^T and p v
    return proj, attn


def plot_flops_split(D=64, ratio=4):
    """Matmul FLOPs per token against S: projections (flat) vs attention (grows with S)."""
    F = ratio * D
    proj, attn = _split(SPLIT_S, D, F)
    fig, ax = _figure((5.8, 3.6))
    ax.loglog(SPLIT_S, proj / SPLIT_S, label="projections $2(4D^2 + 2DF)$", color=PALETTE[0])
    ax.loglog(SPLIT_S, attn / SPLIT_S, label="attention $4SD$", color=PALETTE[1])
    ax.loglog(SPLIT_S, (proj + attn) / SPLIT_S, label="total", color=PALETTE[6], ls="--", lw=1.5)
    s_star = 2 * D + F
    ax.axvline(s_star, color=PALETTE[2], lw=1.2, ls=":")
    ax.annotate(f"$S^* = 2D + F = {s_star}$", (s_star, 2e3), xytext=(5, 0),
                textcoords="offset points", fontsize=10, color=PALETTE[2])
    ax.set_xlim(SPLIT_S[0], SPLIT_S[-1])
    ax.set_ylim(1e3, 1e9)
    ax.set_xlabel("sequence length $S$ (tokens)")
    ax.set_ylabel("matmul FLOPs per token")
    ax.set_title(f"$D = {D}$, $F = {ratio}D = {F}$")
    direct_labels(ax)
    ax.minorticks_off()          # a dozen decades of minor ticks would triple the drawing time
    return fig


def flops_split_summary(D, ratio=4):
    """The live region's words for a frame of :func:`plot_flops_split`: the crossover."""
    F = ratio * D
    return (f"projections {format_count(2 * (4 * D * D + 2 * D * F))}FLOP per token; attention "
            f"overtakes them at S* = {2 * D + F}.")


def flops_split_alt(D, ratio=4):
    F = ratio * D
    return (f"Log-log plot of matmul FLOPs per token against sequence length for D = {D} and "
            f"F = {F}. The projection cost is flat at {format_count(2 * (4 * D * D + 2 * D * F))}"
            f"FLOP per token; the attention cost 4SD grows linearly with S and crosses it at "
            f"S* = 2D + F = {2 * D + F}, after which attention dominates the total.")


EXPLORABLES = {
    "ops": (plot_ops, OPS_CONTROLS),
    "flops_split": (plot_flops_split, SPLIT_CONTROLS),
}


# ---- tables ----------------------------------------------------------------------------------

_TD = "padding:0.15em 0.5em;vertical-align:top;white-space:nowrap"
_TDR = _TD + ";text-align:right"
_TH = _TD + ";text-align:left;font-weight:normal"   # a row header: named, not restyled
_TDW = "padding:0.15em 0.5em;vertical-align:top"     # a cell that wraps (between shapes)


def _nowrap(text):
    return f"<span style='white-space:nowrap'>{text}</span>"


def _typeset(text):
    """An equation or array name of shapes.OpRow in the book's notation, as the shape-flow diagram
    writes it (Wᵢₙᵀ, √dₕ, h₁), and Φ(u) for Phi(u): no ASCII math in a table."""
    from preln.chapters.diagrams import pretty
    return pretty(str(text).replace("Phi(u)", "Φ(u)"))


def shape_table_html(flow):
    """An HTML table of a :class:`preln.chapters.shapes.ShapeFlow`: one row per op, then the totals.

    Inline styles only (no stylesheet needed): small type, one line per tensor, and a horizontal
    scroll bar on narrow screens rather than shapes broken across lines.
    """
    e = html.escape

    def th(text, right=False):
        return f"<th scope='col' style='{_TDR if right else _TD}'>{text}</th>"

    def rh(text):          # the row's name: its op (a screen reader says it with every cell)
        return f"<th scope='row' style='{_TH}'>{text}</th>"

    def td(text, right=False):
        return f"<td style='{_TDR if right else _TD}'>{text}</td>"

    # what an op reads is in its equation (the names) and in the rows above (the shapes); the
    # list of kept tensors wraps between tensors: the table fits a 688 px column
    head = "<tr>" + "".join([th("op: computes"), th("writes"), th("FLOPs", True),
                             th("written", True), th("kept", True), th("kept for backward")]) + "</tr>"
    body = []
    for r in flow.rows:
        out_dt = "" if r.out_dtype == flow.dtype else f" {r.out_dtype.name}"
        writes = "<br>".join(f"{e(_typeset(n))} {_shape(s)}{out_dt}" for n, s in r.outputs)
        if r.out_bytes == 0 and r.outputs:
            writes += " <em>(views)</em>" if len(r.outputs) > 1 else " <em>(view)</em>"
        kept = "<br>".join(f"{e(_typeset(n))} {_nowrap(_shape(s))}" + ("" if np.dtype(d) == flow.dtype
                                                     else f" {np.dtype(d).name}")
                           for n, s, d in r.kept) or "&mdash;"
        body.append("<tr>" + "".join([
            rh(f"<code>{e(r.name)}</code><br>{e(_typeset(r.equation))}"), td(writes),
            td(format_count(r.flops), True), td(format_bytes(r.out_bytes), True),
            td(format_bytes(r.kept_bytes), True), f"<td style='{_TDW}'>{kept}</td>"]) + "</tr>")
    t = flow.totals
    body.append("<tr style='border-top:2px solid currentColor'>" + "".join([
        rh("<strong>total</strong>"), td(""),
        td(f"<strong>{format_count(t['flops'])}</strong>", True),
        td(f"<strong>{format_bytes(t['out_bytes'])}</strong>", True),
        td(f"<strong>{format_bytes(t['kept_bytes'])}</strong>", True),
        f"<td style='{_TDW}'>matmuls {format_count(t['matmul_flops'])}FLOP "
        f"= closed form {format_count(t['closed_form_flops'])}FLOP</td>"]) + "</tr>")
    cfg = flow.config
    caption = (f"B = {flow.B}, S = {flow.S}, D = {cfg.d_model}, H = {cfg.n_heads}, "
               f"F = {cfg.d_ff}; {'training' if flow.training else 'eval'} mode "
               f"({flow.path} attention); every tensor {flow.dtype.name} unless noted")
    return (f"<div style='overflow-x:auto'><table class='preln-shape-table' "
            f"style='font-size:0.75em;border-collapse:collapse'><caption>{e(caption)}</caption>"
            f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table></div>")


def _simple_table(head, rows, caption, right=()):
    e = html.escape
    style = lambda j: _TDR if j in right else _TD  # noqa: E731
    # the first column names its row: a row header, which a screen reader says with every cell
    body = "".join(f"<tr><th scope='row' style='{_TH}'>{e(str(r[0]))}</th>"
                   + "".join(f"<td style='{style(j)}'>{e(str(v))}</td>" for j, v in enumerate(r) if j) + "</tr>"
                   for r in rows)
    head = "".join(f"<th scope='col' style='{style(j)}'>{e(str(v))}</th>" for j, v in enumerate(head))
    return (f"<div style='overflow-x:auto'><table style='font-size:0.75em;border-collapse:collapse'>"
            f"<caption>{e(caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def backward_table_html(flow):
    """Forward against backward FLOPs, op by op, with the totals (matmuls and all)."""
    rows = [[r.name, format_count(r.flops), format_count(r.backward_flops),
             f"{r.backward_flops / r.flops:.2f}" if r.flops else "-"] for r in flow.rows]
    t = flow.totals
    rows.append(["total", format_count(t["flops"]), format_count(t["backward_flops"]),
                 f"{t['backward_flops'] / t['flops']:.2f}"])
    rows.append(["of which matmuls", format_count(t["matmul_flops"]),
                 format_count(t["backward_matmul_flops"]),
                 f"{t['backward_matmul_flops'] / t['matmul_flops']:.2f}"])
    cfg = flow.config
    caption = (f"FLOPs per op, forward and backward: B = {flow.B}, S = {flow.S}, D = {cfg.d_model}, "
               f"H = {cfg.n_heads}, F = {cfg.d_ff}, {flow.path} attention")
    return _simple_table(["op", "forward", "backward", "backward / forward"], rows, caption,
                         right=(1, 2, 3))


def kept_per_token_html(kept, dtype_name="float32"):
    """The list of :func:`preln.chapters.shapes.kept_bytes_per_token`: op, array, bytes per token; total."""
    rows = [[op, _typeset(name), b] for op, name, b in kept]
    rows.append(["total", "c", sum(b for _, _, b in kept)])
    return _simple_table(["kept by", "array", "bytes per token"], rows,
                         f"What the backward keeps per token besides p ({dtype_name} block)",
                         right=(2,))


def live_shape_table(B=2, S=128, D=64, H=4, F=256):
    """An ipywidgets panel over B, S, D, H, F and the mode that redraws the table (needs a kernel)."""
    import ipywidgets as widgets
    from IPython.display import HTML, display

    def show(B, S, D, H, F, training):
        try:
            cfg = BlockConfig(d_model=D, n_heads=H, d_ff=F)
            flow = shape_flow(cfg, B, S, training=training)
        except (ValueError, TypeError) as err:
            display(HTML(f"<p><strong>Invalid setting:</strong> {html.escape(str(err))}</p>"))
            return
        display(HTML(shape_table_html(flow)))

    box = dict(min=1, continuous_update=False)
    return widgets.interactive(
        show,
        B=widgets.BoundedIntText(value=B, max=4096, description="B", **box),
        S=widgets.BoundedIntText(value=S, max=1 << 20, description="S", **box),
        D=widgets.BoundedIntText(value=D, max=1 << 16, description="D", **box),
        H=widgets.BoundedIntText(value=H, max=1024, description="H", **box),
        F=widgets.BoundedIntText(value=F, max=1 << 18, description="F", **box),
        training=widgets.Checkbox(value=True, description="training mode"),
    )


# ---- section 2: complexity -------------------------------------------------------------------

def _size_ticks(ax, sizes):
    """Label a log x axis at the measured sizes only (no crowded minor labels)."""
    ax.minorticks_off()
    ax.set_xticks(list(sizes), [str(int(v)) for v in sizes])


def plot_flops_vs_size(sizes_S, flops_S, fit_S, sizes_D, flops_D, fit_D, S_fixed, D_fixed):
    """Counted FLOPs against S (fixed D) and against D (fixed S), with the fitted power laws."""
    fig, (ax_s, ax_d) = _figure((COLUMN_IN - 0.2, 4.4), 1, 2)
    for ax, x, y, fit, label, fixed in ((ax_s, sizes_S, flops_S, fit_S, "S", f"$D = {D_fixed}$"),
                                        (ax_d, sizes_D, flops_D, fit_D, "D", f"$S = {S_fixed}$")):
        ax.loglog(x, y, "o", color=PALETTE[0], label="sum of the op table's rows")
        _fit_line(ax, x, fit, label, fit.exponent)
        _size_axes(ax, x, label, "forward FLOPs", f"growing ${label}$, {fixed}, $B = 1$")
    figure_legend(fig, (ax_s, ax_d))
    alt = (f"Counted forward FLOPs, log-log, with fitted power laws: slope {fit_S.exponent:.2f} against S "
           f"(D = {D_fixed}), {fit_D.exponent:.2f} against D (S = {S_fixed}).")
    return set_alt(fig, short_alt(alt))


def _fit_line(ax, x, fit, label, exponent):
    """The fitted power law ``fit`` (a function of x), its ``exponent`` written above-left of
    the line's middle, where no point lies; the legend names the line once for both panels."""
    ax.loglog(x, fit(x), "-", color=PALETTE[1], lw=1.5, label="power-law fit")
    mid = float(np.sqrt(x[0] * x[-1]))
    ax.annotate(f"$\\propto {label}^{{{exponent:.2f}}}$", (mid, float(fit(mid))), xytext=(-6, 6),
                textcoords="offset points", ha="right", va="bottom", color=PALETTE[1])


def _size_axes(ax, x, label, ylabel, title):
    """The ticks, labels and title of a log-log plot against S or D."""
    _size_ticks(ax, x)
    ax.set_xlabel(f"{'sequence length' if label == 'S' else 'model width'} ${label}$")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    log_ticks(ax, "y")                     # at least three labelled ticks


def plot_timings(sizes_S, times_S, fit_S, sizes_D, times_D, fit_D, S_fixed, D_fixed, fit_mask_S=None,
                 fit_mask_D=None, B_S=1, B_D=1):
    """Measured forward times against S and D, log-log, with the fitted slopes."""
    fig, (ax_s, ax_d) = _figure((COLUMN_IN - 0.2, 4.4), 1, 2)
    for ax, x, t, fit, mask, label, fixed in (
            (ax_s, sizes_S, times_S, fit_S, fit_mask_S, "S", f"$D = {D_fixed}$, $B = {B_S}$"),
            (ax_d, sizes_D, times_D, fit_D, fit_mask_D, "D", f"$S = {S_fixed}$, $B = {B_D}$")):
        x, t = np.asarray(x), np.asarray(t)
        mask = np.ones(len(x), bool) if mask is None else np.asarray(mask)
        ax.loglog(x[mask], 1e3 * t[mask], "o", color=PALETTE[0], label="measured (fitted)")
        if (~mask).any():
            ax.loglog(x[~mask], 1e3 * t[~mask], "o", mfc="none", color=PALETTE[0],
                      label="measured (not fitted)")
        _fit_line(ax, x[mask], lambda v, fit=fit: 1e3 * fit(v), label, fit.exponent)
        _size_axes(ax, x, label, "forward CPU time (ms)", f"growing ${label}$, {fixed}")
    figure_legend(fig, (ax_s, ax_d), ncol=3)
    alt = (f"Measured forward CPU time, log-log, with fitted power laws: slope {fit_S.exponent:.2f} against S "
           f"(D = {D_fixed}), {fit_D.exponent:.2f} against D (S = {S_fixed}).")
    description = (f"Against S: {1e3 * min(times_S):.3g} to {1e3 * max(times_S):.3g} ms. "
                   f"Against D: {1e3 * min(times_D):.3g} to {1e3 * max(times_D):.3g} ms.")
    return set_alt(fig, short_alt(alt), description)


# ---- section 3: memory -----------------------------------------------------------------------

def plot_peak_memory(S_plain, peak_plain, S_tiled, peak_tiled, S_formula, p_bytes_formula,
                     S_cross=None):
    """Measured peak bytes of the plain and tiled paths against S, with B H S^2 x 4 bytes."""
    MiB = 2.0 ** 20
    fig, ax = _figure((6.0, 4.6))
    ax.loglog(S_formula, np.asarray(p_bytes_formula) / MiB, "--", color=PALETTE[6], lw=1.2,
              label="one $(B, H, S, S)$ tensor, 4 bytes an entry")
    ax.loglog(S_plain, np.asarray(peak_plain) / MiB, "o-", color=PALETTE[1],
              label="plain path (training), measured")
    ax.loglog(S_tiled, np.asarray(peak_tiled) / MiB, "s-", color=PALETTE[0],
              label="tiled path (eval), measured")
    if S_cross is not None:
        ax.axvline(S_cross, color=PALETTE[2], lw=1.2, ls=":")
        ax.annotate(f"$P$ outweighs the\nrest of the cache\nat $S = {S_cross}$", (S_cross, 0.3),
                    xytext=(4, 0), textcoords="offset points", fontsize=9, color=PALETTE[2])
    _size_ticks(ax, S_tiled)
    ax.set_xlabel("sequence length $S$ (tokens)")
    ax.set_ylabel("peak memory of one forward (MiB)")
    legend_outside(ax, ncol=1)
    alt = (f"Peak memory of one forward against S, log-log: the plain path reaches {max(peak_plain) / MiB:.3g} MiB "
           f"at S = {max(S_plain)}, the tiled path {max(peak_tiled) / MiB:.3g} MiB at S = {max(S_tiled)}.")
    return set_alt(fig, short_alt(alt))


flops_split_alt.summary = flops_split_summary
