"""Figures, tables and data helpers for the derivation chapters.

``book/derivation_ops.ipynb``, ``book/derivation_ops_attention.ipynb`` and
``book/derivation_ops_mlp.ipynb`` (Derivation I: the ops, in three parts) derive every op's backward
and check it; their figures, explorables and data helpers are here. The helpers for the whole block (the forward
split into named intermediates, the losses that check its gradients, :class:`Table`) are shared
with ``book/derivation_block.ipynb`` (Derivation II), which imports them from this module. The
explorables keep the prefix ``derivation.`` that ``preln.chapters.figures.CHAPTERS`` gives this module.

- data helpers: the block's forward split into named intermediates (:func:`forward_steps`), the
  scalar losses whose finite differences check each gradient (:func:`intermediate_loss`,
  :func:`param_loss`), logit statistics for the
  1/sqrt(d_h) argument, the GELU difference on a fine grid, masked attention probabilities, the
  online-softmax recurrence of tiled attention with its state after every tile
  (:func:`online_softmax_trace`, after Dao et al. 2022, arXiv 2205.14135), and the output scale
  of a LayerNorm for either placement of eps (:func:`layer_norm_output_std`);
- plots: every function returns a :class:`matplotlib.figure.Figure` built without pyplot (so a
  notebook cell shows it exactly once, when it is the cell's value);
- :class:`Table`: an HTML / plain-text table (pandas is not a dependency).

``EXPLORABLES`` registers the interactive figures for ``preln.chapters.figures.all_explorables``.
"""
from __future__ import annotations

import html
from typing import Callable

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from preln.nb import set_alt, short_alt, sig
from preln.ops import (activation_forward, attention_forward, layer_norm_forward, linear_forward,
                   merge_heads, softmax, split_heads)
from preln.ops.attention import key_end, online_softmax_step, tiles
from preln.chapters.viz import COLUMN_IN, PALETTE, control, legend_outside, table_caption, tex_number

__all__ = [
    "FORWARD_STEPS", "MASKS", "Table", "forward_steps", "intermediate_loss", "param_loss",
    "qk_logit_stats", "softmax_saturation", "gelu_difference", "masked_attention",
    "plot_step_sweep", "plot_qk_variance", "plot_qk_scaling", "plot_attention_masks", "plot_gelu",
    "LN_GRAPH_NODES", "LN_GRAPH_EDGES", "plot_layernorm_graph", "online_softmax_trace",
    "tiling_example", "plot_online_softmax", "online_softmax_alt", "layer_norm_output_std",
    "plot_eps_placement", "EXPLORABLES",
]

BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, BLACK, YELLOW = PALETTE




# ---- the Pre-LN forward, split into named intermediates ----------------------------------------

#: The names of the intermediates of :func:`forward_steps`, in forward order.
FORWARD_STEPS = ("x", "h1", "qkv", "q", "k", "v", "o", "om", "a", "x1", "h2", "u", "g", "z", "y")


def forward_steps(x, params, config, key_padding_mask=None, override=None):
    """The Pre-LN block's forward as named intermediates, each computed by a ``preln.ops`` call.

    x: (B, S, D); params: the block's state dict; config: a :class:`preln.BlockConfig` with
    ``norm_first=True`` and ``dropout=0``. ``override`` maps an intermediate's name to a value
    that replaces it as soon as it is computed, so that everything downstream is recomputed from
    it -- the function whose finite differences give dL/d(that intermediate).

    Returns a dict: each name of :data:`FORWARD_STEPS` -> array, and ``"caches"`` -> dict of the
    caches the ``*_backward`` functions need (ln1, in_proj, attn, out_proj, ln2, linear1, act,
    linear2).
    """
    if not config.norm_first or config.dropout:
        raise ValueError("config: forward_steps follows the Pre-LN block without dropout "
                         f"(norm_first=True, dropout=0); got {config}")
    override = override or {}
    p, H = params, config.n_heads
    t, c = {}, {}

    def keep(name, value):
        t[name] = override.get(name, value)
        return t[name]

    x = keep("x", x)                                                              # (B, S, D)
    h1, c["ln1"] = layer_norm_forward(x, p["norm1.weight"], p["norm1.bias"], config.eps)
    h1 = keep("h1", h1)                                                           # h1 = LN1(x)
    qkv, c["in_proj"] = linear_forward(h1, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"])
    qkv = keep("qkv", qkv)                                                        # (B, S, 3D)
    q, k, v = (keep(n, split_heads(s, H))                                         # 3 x (B, H, S, d_h)
               for n, s in zip("qkv", np.split(qkv, 3, axis=-1)))
    o, c["attn"] = attention_forward(q, k, v, key_padding_mask, config.causal)
    o = keep("o", o)                                                              # (B, H, S, d_h)
    om = keep("om", merge_heads(o))                                               # (B, S, D)
    a, c["out_proj"] = linear_forward(om, p["self_attn.out_proj.weight"], p["self_attn.out_proj.bias"])
    a = keep("a", a)                                                              # a = Attn(h1)
    x1 = keep("x1", x + a)                                                        # residual 1
    h2, c["ln2"] = layer_norm_forward(x1, p["norm2.weight"], p["norm2.bias"], config.eps)
    h2 = keep("h2", h2)                                                           # h2 = LN2(x1)
    u, c["linear1"] = linear_forward(h2, p["linear1.weight"], p["linear1.bias"])
    u = keep("u", u)                                                              # (B, S, F)
    g, c["act"] = activation_forward(u, config.activation)
    g = keep("g", g)                                                              # g = GELU(u)
    z, c["linear2"] = linear_forward(g, p["linear2.weight"], p["linear2.bias"])
    z = keep("z", z)                                                              # z = MLP(h2), (B, S, D)
    keep("y", x1 + z)                                                             # residual 2
    t["caches"] = c
    return t


def intermediate_loss(x, params, config, w, name, key_padding_mask=None) -> Callable:
    """The scalar L(value) = sum(y * w) with intermediate ``name`` replaced by ``value``.

    Its finite-difference gradient is dL/d(name), what the step-by-step backward must produce.
    """
    if name not in FORWARD_STEPS:
        raise ValueError(f"name: expected one of {FORWARD_STEPS}; got {name!r}")

    def loss(value):
        y = forward_steps(x, params, config, key_padding_mask, override={name: value})["y"]
        return float(np.sum(y * w))
    return loss


def param_loss(x, params, config, w, name, key_padding_mask=None) -> Callable:
    """The scalar L(value) = sum(y * w) with parameter ``name`` (a state-dict key) set to ``value``."""
    if name not in params:
        raise KeyError(f"name: expected a state-dict key, one of {list(params)}; got {name!r}")

    def loss(value):
        y = forward_steps(x, {**params, name: value}, config, key_padding_mask)["y"]
        return float(np.sum(y * w))
    return loss


# ---- finite differences: the step ----------------------------------------------------------------

def plot_step_sweep(steps, errors, chosen=1e-6) -> Figure:
    """Log-log plot of the gradient-check error against the finite-difference step."""
    steps, errors = np.asarray(steps), np.asarray(errors)
    fig = Figure(figsize=(6.0, 4.4))
    ax = fig.subplots()
    ax.loglog(steps, errors, "o-", color=BLUE, label="LayerNorm backward vs central difference")
    u = np.finfo(np.float64).eps / 2
    ax.loglog(steps, steps ** 2, "--", color=ORANGE, label=r"truncation $\propto \delta^2$")
    ax.loglog(steps, u / steps, ":", color=VERMILLION, label=r"round-off $\propto u/\delta$")
    ax.axvline(chosen, color=BLACK, lw=1, alpha=0.6)
    ax.annotate(f"δ = {tex_number(chosen)}", (chosen, errors.max()), xytext=(4, -4),
                textcoords="offset points", va="top", fontsize=9)
    ax.set_ylim(max(errors.min() / 10, 1e-18), 10)
    ax.set_xlabel("finite-difference step δ")
    ax.set_ylabel("relative error")
    ax.set_title("Gradient check: error vs step")
    legend_outside(ax, ncol=1)
    i, big = int(np.argmin(errors)), int(np.argmax(steps))
    # the lowest error is round-off level: name the step where it is, not its digits; the error at
    # the largest step is truncation, stable to its digits
    shape = (f"a V-shaped valley, lowest at δ = {sig(steps[i])}" if 0 < i < len(steps) - 1 else
             f"no valley inside the range: lowest at its end, δ = {sig(steps[i])}")
    alt = (f"Log-log plot of the LayerNorm gradient-check error against the step δ from {sig(steps[0])} "
           f"to {sig(steps[-1])}: {shape}.")
    description = (f"Blue circles: the relative error between the LayerNorm backward and central differences "
                   f"for each finite-difference step δ, from {sig(steps[0])} to {sig(steps[-1])}, both axes "
                   f"logarithmic. At δ = {sig(steps[big])} the error is {sig(errors[big])}. Two reference lines: "
                   f"truncation error proportional to δ squared (dashed orange), which dominates for large "
                   f"steps, and round-off error proportional to u/δ (dotted vermillion, u = {sig(u)} the "
                   f"unit round-off of float64), which dominates for tiny steps. The error shows {shape}; a "
                   f"vertical line marks the chosen step, δ = {sig(chosen)}.")
    return set_alt(fig, short_alt(alt), description)


# ---- why 1/sqrt(d_h) -------------------------------------------------------------------------

def qk_logit_stats(d_h, n_samples=4096, seed=0):
    """Sample q, k with i.i.d. N(0, 1) entries in d_h dimensions; return the logits and their variance.

    Returns a dict: ``logits`` (n_samples,) = q . k, ``scaled`` = logits / sqrt(d_h),
    ``var`` and ``var_scaled`` their sample variances (expected: d_h and 1).
    """
    rng = np.random.default_rng([seed, d_h])
    q = rng.standard_normal((n_samples, d_h))
    k = rng.standard_normal((n_samples, d_h))
    logits = np.einsum("nd,nd->n", q, k)                     # (n_samples,)
    scaled = logits / np.sqrt(d_h)
    return {"logits": logits, "scaled": scaled, "var": float(logits.var()),
            "var_scaled": float(scaled.var())}


def softmax_saturation(d_h, n_keys=16, n_queries=256, seed=0):
    """Attention rows of random unit-variance q, k with and without the 1/sqrt(d_h) scale.

    Each of ``n_queries`` queries attends over ``n_keys`` keys (``preln.ops.softmax``). Returns a
    dict with, for ``unscaled`` and ``scaled``: ``p`` (n_queries, n_keys) probabilities,
    ``entropy`` (mean row entropy, nats; at most ln n_keys) and ``max_p`` (mean largest probability).
    """
    rng = np.random.default_rng([seed, d_h, 1])
    q = rng.standard_normal((n_queries, d_h))
    k = rng.standard_normal((n_keys, d_h))
    logits = q @ k.T                                          # (n_queries, n_keys)
    out = {}
    for name, s in (("unscaled", logits), ("scaled", logits / np.sqrt(d_h))):
        p = softmax(s, axis=-1)
        ent = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)    # 0 log 0 = 0
        out[name] = {"p": p, "entropy": float(ent.mean()), "max_p": float(p.max(-1).mean())}
    return out


def plot_qk_variance(d_hs, n_keys=16) -> Figure:
    """Two panels over d_h: Var(q . k) unscaled and scaled; mean softmax entropy, both ways."""
    d_hs = list(d_hs)
    stats = [qk_logit_stats(d) for d in d_hs]
    sat = [softmax_saturation(d, n_keys=n_keys) for d in d_hs]
    fig = Figure(figsize=(7.6, 4.4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.loglog(d_hs, [s["var"] for s in stats], "o-", color=VERMILLION, label=r"$q\cdot k$")
    ax1.loglog(d_hs, [s["var_scaled"] for s in stats], "s-", color=BLUE,
               label=r"$q\cdot k/\sqrt{d_h}$")
    ax1.loglog(d_hs, d_hs, "--", color=BLACK, lw=1, label=r"$d_h$ (theory)")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel(r"head width $d_h$")
    ax1.set_ylabel("variance of the logit")
    ax1.set_title("Logit variance")
    legend_outside(ax1, ncol=1)
    ax2.semilogx(d_hs, [s["unscaled"]["entropy"] for s in sat], "o-", color=VERMILLION, label="unscaled")
    ax2.semilogx(d_hs, [s["scaled"]["entropy"] for s in sat], "s-", color=BLUE, label=r"scaled by $1/\sqrt{d_h}$")
    ax2.axhline(np.log(n_keys), color=BLACK, lw=1, ls="--", label=f"uniform, ln {n_keys}")
    ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, np.log(n_keys) * 1.1)
    ax2.set_xlabel(r"head width $d_h$")
    ax2.set_ylabel("mean row entropy (nats)")
    ax2.set_title(f"Softmax over {n_keys} keys")
    legend_outside(ax2, ncol=1)
    var, var_s = [s["var"] for s in stats], [s["var_scaled"] for s in stats]
    ent_u, ent_s = [s["unscaled"]["entropy"] for s in sat], [s["scaled"]["entropy"] for s in sat]
    widths = f"d_h from {d_hs[0]} to {d_hs[-1]}"
    alt = (f"Over {widths}, the variance of q·k grows like d_h ({var[0]:.3g} to {var[-1]:.3g}), scaled it "
           f"stays near 1; unscaled softmax entropy falls to {ent_u[-1]:.2g} nats.")
    description = (f"Two panels over the head width {widths}, on a log axis. Left, log-log: the sample "
                   f"variance of the logit q·k of random unit-variance q and k, from {var[0]:.3g} to "
                   f"{var[-1]:.3g}, follows the dashed line variance = d_h, while the variance of the "
                   f"scaled logits q·k/√d_h stays between {min(var_s):.2f} and {max(var_s):.2f}. Right: "
                   f"the mean entropy of a softmax row over {n_keys} keys. With the scale it stays between "
                   f"{min(ent_s):.2f} and {max(ent_s):.2f} nats (the uniform row's maximum, ln {n_keys} = "
                   f"{np.log(n_keys):.2f}, is dashed); without it, it falls from {ent_u[0]:.2f} to "
                   f"{ent_u[-1]:.2f} nats as d_h grows: the softmax saturates.")
    return set_alt(fig, short_alt(alt), description)


# Sample sizes of the explorable's frames, small enough that a frame takes well under 100 ms.
FRAME_SAMPLES, FRAME_QUERIES = 1024, 256


def plot_qk_scaling(d_h) -> Figure:
    """One head width: the logit histograms and one attention row, with and without the scale."""
    st = qk_logit_stats(d_h, n_samples=FRAME_SAMPLES)
    sat = softmax_saturation(d_h, n_queries=FRAME_QUERIES)
    fig = Figure(figsize=(7.6, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    bins = np.linspace(-40, 40, 81)
    for vals, color, ls, label in ((st["logits"], VERMILLION, "-", f"$q\\cdot k$, var {st['var']:.1f}"),
                                   (st["scaled"], BLUE, "--", f"$q\\cdot k/\\sqrt{{d_h}}$, var {st['var_scaled']:.2f}")):
        counts, _ = np.histogram(np.clip(vals, -40, 40), bins=bins)
        centers = 0.5 * (bins[1:] + bins[:-1])
        ax1.fill_between(centers, counts, step="mid", color=color, alpha=0.5, lw=0)
        # the legend shows the outline, at full colour (3:1 on white) and with its own line style
        ax1.plot(centers, counts, drawstyle="steps-mid", color=color, lw=1.2, ls=ls, label=label)
    ax1.set_xlabel("logit")
    ax1.set_ylabel(f"count (of {FRAME_SAMPLES} pairs)")
    ax1.set_title(f"Logits, $d_h$ = {d_h}")
    legend_outside(ax1, ncol=1)
    n = sat["scaled"]["p"].shape[1]
    j = np.arange(n)
    row = 0
    pu = np.sort(sat["unscaled"]["p"][row])[::-1]
    ps = np.sort(sat["scaled"]["p"][row])[::-1]
    # stems (a LineCollection) rather than bars: 32 patches would cost more than the 100 ms budget
    ax2.vlines(j - 0.15, 0, pu, color=VERMILLION, lw=4)
    ax2.vlines(j + 0.15, 0, ps, color=BLUE, lw=4)
    ax2.plot(j - 0.15, pu, "o", color=VERMILLION, ms=4,
             label=f"unscaled (mean entropy {sat['unscaled']['entropy']:.2f})")
    ax2.plot(j + 0.15, ps, "s", color=BLUE, ms=4,
             label=f"scaled (mean entropy {sat['scaled']['entropy']:.2f})")
    ax2.set_ylim(0, 1.05)
    ax2.set_xticks(j[::3], [str(r + 1) for r in j[::3]])
    ax2.set_xlabel("key rank (1 = most probable)")
    ax2.set_ylabel("attention probability")
    ax2.set_title(f"One query over {n} keys")
    ax2.legend(loc="upper right")
    return fig


def qk_scaling_alt(d_h) -> str:
    """Alt text of :func:`plot_qk_scaling` for one head width, with the measured numbers."""
    st = qk_logit_stats(d_h, n_samples=FRAME_SAMPLES)
    sat = softmax_saturation(d_h, n_queries=FRAME_QUERIES)
    return (f"Head width d_h = {d_h}. Left: histograms of {FRAME_SAMPLES} attention logits q dot k, whose variance "
            f"is {st['var']:.1f} (about d_h), and of the scaled logits, variance {st['var_scaled']:.2f} "
            f"(about 1). Right: one query's attention probabilities over 16 keys, sorted; unscaled the "
            f"largest probability is {np.max(sat['unscaled']['p'][0]):.2f}, scaled it is "
            f"{np.max(sat['scaled']['p'][0]):.2f}. Mean row entropy {sat['unscaled']['entropy']:.2f} "
            f"nats unscaled vs {sat['scaled']['entropy']:.2f} scaled (uniform: 2.77).")


# ---- masks ----------------------------------------------------------------------------------

#: The sequence length of the mask figure.
MASK_S = 6
#: The mask settings of the mask figure, name -> (causal, key-padding row of length MASK_S).
MASKS = {
    "none": (False, None),
    "causal": (True, None),
    "key padding (last 2 keys)": (False, [False, False, False, False, True, True]),
    "causal + left padding (first 2 keys)": (True, [True, True, False, False, False, False]),
}


def masked_attention(mask, seed=0, d_h=4):
    """Attention probabilities of one head (B = H = 1, S = MASK_S) under a setting of :data:`MASKS`.

    Returns ``(p, allowed)``: p (S, S) from ``preln.ops.attention_forward``; ``allowed`` (S, S) bool,
    True where query i may attend to key j.
    """
    causal, pad = MASKS[mask]
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((3, 1, 1, MASK_S, d_h))            # each (1, 1, S, d_h)
    kpm = None if pad is None else np.array([pad])                   # (1, S)
    _, cache = attention_forward(q, k, v, kpm, causal)
    allowed = np.ones((MASK_S, MASK_S), dtype=bool)
    if causal:
        allowed &= np.tri(MASK_S, dtype=bool)
    if pad is not None:
        allowed &= ~np.array(pad)[None, :]
    return cache.p[0, 0], allowed


def plot_attention_masks(mask) -> Figure:
    """Heatmap of the attention probabilities under one mask; masked entries marked with a cross."""
    p, allowed = masked_attention(mask)
    fig = Figure(figsize=(4.6, 4.2))
    ax = fig.subplots()
    ax.imshow(p, vmin=0, vmax=1, cmap="cividis")   # every entry is printed: no colour bar needed
    for i in range(MASK_S):
        for j in range(MASK_S):
            if allowed[i, j]:
                ax.text(j, i, f"{p[i, j]:.2f}", ha="center", va="center", fontsize=9,
                        color="black" if p[i, j] > 0.55 else "white")
            else:
                ax.text(j, i, "×", ha="center", va="center", fontsize=12, color=SKY)
    ax.set_xticks(range(MASK_S))
    ax.set_yticks(range(MASK_S))
    ax.grid(False)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(f"Attention probabilities\nmask: {mask}", fontsize=10)
    return fig


def attention_masks_alt(mask) -> str:
    """Alt text of :func:`plot_attention_masks`."""
    p, allowed = masked_attention(mask)
    zero_rows = [i for i in range(MASK_S) if not allowed[i].any()]
    text = (f"A {MASK_S} by {MASK_S} heatmap of attention probabilities, queries as rows and keys as "
            f"columns, with the mask '{mask}'. Masked entries carry a cross and are exactly 0; ")
    if zero_rows:
        text += (f"query rows {', '.join(map(str, zero_rows))} see no key at all and are all zeros; "
                 "every other row sums to 1.")
    else:
        text += "every row sums to 1."
    return text


# ---- GELU -----------------------------------------------------------------------------------

def gelu_difference(lo=-8.0, hi=8.0, n=1_600_001):
    """gelu_tanh(x) - gelu(x) on a uniform grid (step (hi - lo)/(n - 1), 1e-5 by default).

    Returns a dict: ``x``, ``diff``, ``max_abs`` (the largest absolute difference) and ``x_at_max``
    (the absolute value of x where it occurs; the difference is an even function, so it occurs at
    both +x_at_max and -x_at_max).
    """
    from preln.ops import gelu, gelu_tanh
    x = np.linspace(lo, hi, n)
    diff = gelu_tanh(x) - gelu(x)
    i = int(np.argmax(np.abs(diff)))
    return {"x": x, "diff": diff, "max_abs": float(abs(diff[i])), "x_at_max": float(abs(x[i]))}


def plot_gelu(lo=-5.0, hi=5.0) -> Figure:
    """Above: exact and tanh GELU (and ReLU for reference). Below: their difference."""
    from preln.ops import gelu, gelu_tanh, relu
    x = np.linspace(lo, hi, 2001)
    d = gelu_difference(lo, hi, 200_001)
    # two panels stacked at the column's width (curves above, their difference below)
    fig = Figure(figsize=(COLUMN_IN - 0.2, 6.4))
    ax1, ax2 = fig.subplots(2, 1)
    ax1.plot(x, relu(x), color=BLACK, lw=1, ls=":", label="ReLU")
    ax1.plot(x, gelu(x), color=BLUE, label=r"GELU, $x\,\Phi(x)$")
    ax1.plot(x, gelu_tanh(x), color=ORANGE, ls="--", label="GELU, tanh form")
    ax1.set_xlabel("input $x$")
    ax1.set_ylabel("activation")
    ax1.set_title("GELU, exact and tanh")
    ax1.legend()
    ax2.plot(d["x"], d["diff"], color=VERMILLION)
    for s in (-1, 1):
        ax2.axvline(s * d["x_at_max"], color=BLACK, lw=1, alpha=0.5)
    ax2.set_xlabel("input $x$")
    ax2.set_ylabel("tanh form − exact")
    ax2.set_title(f"Difference, max |·| = {tex_number(d['max_abs'])} at $x = \\pm${d['x_at_max']:.2f}",
                  fontsize=11)
    ax2.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    g = gelu(x)
    at = f"x = ±{d['x_at_max']:.2f}" if d["x_at_max"] else "x = 0"
    alt = (f"Exact GELU and its tanh form over ReLU, x from {sig(lo)} to {sig(hi)}: the curves overlap; "
           f"they differ by at most {sig(d['max_abs'])}, at {at}.")
    description = (f"Above: the exact GELU, x Φ(x), and its tanh approximation, drawn over ReLU (dotted) "
                   f"for x from {sig(lo)} to {sig(hi)}. The two GELU curves cannot be told apart: close "
                   f"to 0 for negative x, close to x for positive x, with a lowest value of "
                   f"{sig(g.min())} at x = {sig(x[np.argmin(g)])} on this range. Below: their difference, "
                   f"tanh form minus exact, a curve symmetric about x = 0 whose largest magnitude, "
                   f"{sig(d['max_abs'])}, is at {at} (vertical lines).")
    return set_alt(fig, short_alt(alt), description)


# ---- LayerNorm backward as a computational graph ---------------------------------------------

#: Nodes of the LayerNorm graph: name -> (x, y position, label).
LN_GRAPH_NODES = {
    "x": (0.0, 1.0, r"$x$"),
    "mu": (1.5, 2.0, r"$\mu=\overline{x}$"),
    "xm": (3.0, 1.0, r"$x-\mu$"),
    "var": (4.6, 2.0, r"$\sigma^2=\overline{(x-\mu)^2}$"),
    "r": (7.4, 2.0, r"$r=(\sigma^2+\epsilon)^{-1/2}$"),
    "xhat": (8.2, 1.0, r"$\hat x=(x-\mu)\,r$"),
    "y": (10.6, 1.0, r"$y=\gamma\hat x+\beta$"),
}
#: Edges of the LayerNorm graph: (from, to, the local derivative the backward multiplies by).
LN_GRAPH_EDGES = (
    ("x", "mu", r"$1/D$"),
    ("x", "xm", r"$I$"),
    ("mu", "xm", r"$-1$"),
    ("xm", "var", r"$2(x-\mu)/D$"),
    ("var", "r", r"$-r^3/2$"),
    ("xm", "xhat", r"$r$"),
    ("r", "xhat", r"$x-\mu$"),
    ("xhat", "y", r"$\gamma$"),
)


def plot_layernorm_graph() -> Figure:
    """The LayerNorm forward as a graph (nodes left to right), each edge labelled with its local
    derivative; the backward walks the edges right to left, and x receives three contributions."""
    fig = Figure(figsize=(7.4, 3.6))
    ax = fig.subplots()
    pos = {k: (x, y) for k, (x, y, _) in LN_GRAPH_NODES.items()}
    # half widths of the node boxes in data units, so arrows start and end at the box edges
    half_w = {"x": 0.2, "mu": 0.45, "xm": 0.45, "var": 0.8, "r": 0.9, "xhat": 0.75, "y": 0.7}
    half_h = 0.22

    def edge_point(node, towards):
        (x0, y0), (x1, y1) = pos[node], towards
        dx, dy = x1 - x0, y1 - y0
        t = min(half_w[node] / abs(dx) if dx else np.inf, half_h / abs(dy) if dy else np.inf)
        return x0 + t * dx, y0 + t * dy

    for a, b, label in LN_GRAPH_EDGES:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        start, end = edge_point(a, pos[b]), edge_point(b, pos[a])
        ax.annotate("", xy=end, xytext=start,
                    arrowprops=dict(arrowstyle="-|>", color=BLUE, lw=1.6, shrinkA=2, shrinkB=2))
        ax.annotate("", xy=(start[0], start[1] - 0.14), xytext=(end[0], end[1] - 0.14),
                    arrowprops=dict(arrowstyle="-|>", color=VERMILLION, lw=1.0, ls="--",
                                    shrinkA=2, shrinkB=2))
        # on the figure's face, so an arrow passing under a label does not cross its text
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, ha="center", va="bottom", fontsize=9,
                color=BLACK, bbox=dict(fc="white", ec="none", pad=1))
    for name, (x, y, label) in LN_GRAPH_NODES.items():
        ax.text(x, y, label, ha="center", va="center", fontsize=10,
                bbox=dict(boxstyle="round,pad=0.35", fc="white", ec=BLACK, lw=1))
    ax.text(11.5, 0.35, r"$d\beta=\sum dy,\ d\gamma=\sum dy\,\hat x$", ha="right", fontsize=9)
    ax.text(-0.6, 0.35, r"$dx$: sum over every path back from $y$", ha="left", fontsize=9,
            color=VERMILLION)
    ax.plot([], [], color=BLUE, lw=1.6, label="forward")
    ax.plot([], [], color=VERMILLION, lw=1.0, ls="--", label="backward (times the edge label)")
    ax.legend(loc="upper left")
    ax.set_xlim(-0.7, 11.6)
    ax.set_ylim(0.1, 2.7)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for spine in ax.spines.values():     # a diagram, not a plot: no frame through its text
        spine.set_visible(False)
    ax.set_xlabel("forward: left to right; backward: right to left")
    ax.set_ylabel("row statistics (top)\nper-feature values (bottom)", fontsize=9)
    ax.set_title("LayerNorm of one row as a computational graph")
    alt = ("LayerNorm of one row as a graph, x → mean → x − mean → variance → r → x-hat → y; the "
           "backward runs each edge back, times its local derivative.")
    description = (
        "A computational graph read left to right, row statistics on top and per-feature values below. "
        "The input x feeds the mean mu (edge label 1/D) and the difference x − mu (edge label I, the "
        "identity); mu feeds x − mu (edge label −1). x − mu feeds the variance sigma squared (edge label "
        "2(x − mu)/D) and the normalised x-hat (edge label r). The variance feeds r = (sigma squared + "
        "eps) to the power −1/2 (edge label −r cubed / 2), and r feeds x-hat (edge label x − mu). x-hat "
        "feeds y = gamma x-hat + beta (edge label gamma). Under each solid forward arrow a dashed arrow "
        "points the other way: the backward pass, which multiplies the gradient by the edge's label. "
        "Notes: d-beta is the sum of dy, d-gamma the sum of dy times x-hat, and dx is the sum over every "
        "path back from y.")
    return set_alt(fig, alt, description)


# ---- the online softmax, tile by tile -------------------------------------------------------

#: Sizes of the tiling figure: S queries and keys, query tiles of TQ rows, key tiles of TK columns.
TILE_S, TILE_TQ, TILE_TK, TILE_DH = 8, 4, 2, 4


def online_softmax_trace(q, k, v, q_tile, k_tile, causal=False):
    """The online-softmax recurrence of tiled attention, one head, with its state after every tile.

    q, k, v: (S, d_h) float64. For each query tile and each key tile it reads, the state kept per
    query row is the running max m, the running sum l of exp(z - m) and the unnormalised output o::

        z = tau q_i k_j^T (masked);  m' = max(m, rowmax z);  p = exp(z - m')
        l' = exp(m - m') l + rowsum p;  o' = exp(m - m') o + p v_j

    Returns ``(out, trace)``: out (S, d_h) = o / l at the end; trace a list of dicts with ``rows``
    and ``cols`` (the query and key slices of the tile read) and copies of ``m``, ``l`` (Tq,) and
    ``o`` (Tq, d_h) after it.
    """
    S, dh = q.shape
    tau = 1.0 / np.sqrt(dh)
    out = np.empty_like(q)
    trace = []
    for i0, i1 in tiles(S, q_tile):
        rows = slice(i0, i1)
        m, l = np.full((i1 - i0, 1), -np.inf), np.zeros((i1 - i0, 1))
        o = np.zeros((i1 - i0, dh))
        for j0, j1 in tiles(key_end(i1, S, causal), k_tile):   # causal: tiles right of the diagonal hold no visible key
            cols = slice(j0, j1)
            z = tau * q[rows] @ k[cols].T                            # (Tq, Tk)
            if causal:
                z = np.where(np.arange(j0, j1)[None, :] > np.arange(i0, i1)[:, None], -np.inf, z)
            m, l, o = online_softmax_step(m, l, o, z, v[cols])
            trace.append({"rows": rows, "cols": cols, "m": m[:, 0].copy(), "l": l[:, 0].copy(), "o": o.copy()})
        out[rows] = o / np.where(l == 0, 1.0, l)
    return out, trace


def tiling_example(seed=0, causal=True):
    """q, k, v (TILE_S, TILE_DH) and the trace of :func:`online_softmax_trace` for the figure."""
    rng = np.random.default_rng([seed, 7])
    q, k, v = rng.standard_normal((3, TILE_S, TILE_DH))
    out, trace = online_softmax_trace(q, k, v, TILE_TQ, TILE_TK, causal)
    return q, k, v, out, trace


def plot_online_softmax(step) -> Figure:
    """Tiled causal attention after ``step`` tiles have been read (1 .. number of tiles).

    Left: the S x S score matrix cut into tiles; tiles read so far are filled (sky blue), the
    current one is outlined, tiles right of the causal diagonal (grey) are never read; crosses
    mark the masked scores. Right: for the current query tile, the running max m and sum l of
    each row next to their final values, and what is kept per row.
    """
    q, k, _, _, trace = tiling_example()
    if not 1 <= step <= len(trace):
        raise ValueError(f"step: expected 1 .. {len(trace)}; got {step}")
    fig = Figure(figsize=(7.6, 3.9))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.25]})
    read = trace[:step]
    cur = trace[step - 1]
    # one image for all tiles (0 not read yet, 1 read, 2 never read: right of the causal diagonal);
    # one imshow and two line collections draw faster than a patch per tile
    state = np.zeros((TILE_S, TILE_S))
    for i0 in range(0, TILE_S, TILE_TQ):
        for j0 in range(0, TILE_S, TILE_TK):
            if j0 >= i0 + TILE_TQ:
                state[i0:i0 + TILE_TQ, j0:j0 + TILE_TK] = 2
    for t in read:
        state[t["rows"], t["cols"]] = 1
    ax1.imshow(state, cmap=ListedColormap(["white", SKY, "0.8"]), vmin=0, vmax=2)
    ax1.hlines(np.arange(0, TILE_S + 1, TILE_TQ) - 0.5, -0.5, TILE_S - 0.5, color=BLACK, lw=1)
    ax1.vlines(np.arange(0, TILE_S + 1, TILE_TK) - 0.5, -0.5, TILE_S - 0.5, color=BLACK, lw=1)
    ax1.add_patch(Rectangle((cur["cols"].start - 0.5, cur["rows"].start - 0.5), TILE_TK, TILE_TQ,
                            fill=False, ec=VERMILLION, lw=3))
    ii, jj = np.meshgrid(np.arange(TILE_S), np.arange(TILE_S), indexing="ij")
    ax1.plot(jj[jj > ii], ii[jj > ii], "x", color=BLACK, ms=4, alpha=0.5)
    ax1.set_xlim(-0.5, TILE_S - 0.5)
    ax1.set_ylim(TILE_S - 0.5, -0.5)
    ax1.set_aspect("equal")
    ax1.set_xticks(range(0, TILE_S, TILE_TK))       # a tick per tile: ticks are the costly artists
    ax1.set_yticks(range(0, TILE_S, TILE_TQ))
    ax1.grid(False)
    ax1.set_xlabel("key position j")
    ax1.set_ylabel("query position i")
    ax1.set_title(f"Tiles read: {step} of {len(trace)}", fontsize=10)
    rows = np.arange(cur["rows"].start, cur["rows"].stop)
    z_full = (q[rows] @ k.T) / np.sqrt(TILE_DH)                      # (Tq, S), all keys at once
    z_full = np.where(np.arange(TILE_S)[None, :] > rows[:, None], -np.inf, z_full)
    m_final = z_full.max(axis=1)
    l_final = np.exp(z_full - m_final[:, None]).sum(axis=1)
    ax2.plot(rows, m_final, "_", color=BLACK, ms=22, mew=2, label="final max m")
    ax2.plot(rows, cur["m"], "o", color=VERMILLION, label="running max m")
    ax2.plot(rows, l_final, "_", color=GREEN, ms=22, mew=2, label="final sum l")
    ax2.plot(rows, cur["l"] * np.exp(cur["m"] - m_final), "s", color=BLUE,
             label=r"running sum l, rescaled to final m")
    ax2.set_xticks(rows)
    ax2.set_xlabel("query row i of the current tile")
    ax2.set_ylabel("max logit m, sum l")
    ax2.set_title(f"Kept per row: m, l and {TILE_DH} output numbers;\nkeys {cur['cols'].start}-"
                  f"{cur['cols'].stop - 1} of rows {rows[0]}-{rows[-1]} just read", fontsize=10)
    ax2.legend(loc="upper left")
    lo = min(np.min(cur["m"]), np.min(m_final), 0.0)
    ax2.set_ylim(lo - 0.5, max(np.max(l_final), np.max(m_final)) * 1.6 + 0.5)
    return fig


def online_softmax_alt(step) -> str:
    """Alt text of :func:`plot_online_softmax`."""
    _, _, _, _, trace = tiling_example()
    cur = trace[step - 1]
    rows, cols = cur["rows"], cur["cols"]
    n_read = sum(1 for t in trace[:step] if t["rows"] == rows)
    n_row_tiles = sum(1 for t in trace if t["rows"] == rows)
    return (f"Left: an {TILE_S} by {TILE_S} grid of attention scores cut into tiles of {TILE_TQ} "
            f"queries by {TILE_TK} keys; with the causal mask the tiles right of the diagonal are "
            f"grey and never read, and crosses mark masked scores. {step} of {len(trace)} tiles have been read; the current one "
            f"covers queries {rows.start} to {rows.stop - 1} and keys {cols.start} to {cols.stop - 1}, "
            f"key tile {n_read} of the {n_row_tiles} for these queries. Right: for each of these "
            f"query rows, the running maximum logit and running sum of exponentials kept so far, "
            f"next to their final values, which they reach after the last key tile.")


# ---- eps: where it goes ------------------------------------------------------------------------

def layer_norm_output_std(sigma, d, eps, placement):
    """Standard deviation (biased, over the row) of the normalised output of a row with biased
    standard deviation ``sigma`` and width ``d`` (the normalisation is affine in the row, so this
    is exact for any row shape):

    - ``"inside"``  (PyTorch): (x - mean) / sqrt(var + eps), var biased  -> sigma / sqrt(sigma^2 + eps)
    - ``"outside"`` (Annotated Transformer): (x - mean) / (std + eps), std unbiased
                                             -> sigma / (sigma sqrt(d / (d - 1)) + eps)
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    if placement == "inside":
        return sigma / np.sqrt(sigma ** 2 + eps)
    if placement == "outside":
        return sigma / (sigma * np.sqrt(d / (d - 1)) + eps)
    raise ValueError(f"placement: expected 'inside' or 'outside'; got {placement!r}")


def plot_eps_placement(d, eps_inside=1e-5, eps_outside=1e-6) -> Figure:
    """Output std of a normalised row against the input row's std, eps inside vs outside the root."""
    sigmas = np.logspace(-8, 1, 400)
    fig = Figure(figsize=(6.4, 4.6))
    ax = fig.subplots()
    ax.semilogx(sigmas, layer_norm_output_std(sigmas, d, eps_inside, "inside"), color=BLUE,
                label=rf"PyTorch: $\varepsilon$ = {tex_number(eps_inside)} inside the root, biased var")
    ax.semilogx(sigmas, layer_norm_output_std(sigmas, d, eps_outside, "outside"), color=ORANGE,
                ls="--", label=rf"Annotated Transformer: std + {tex_number(eps_outside)}, unbiased std")
    ax.axvline(np.sqrt(eps_inside), color=BLUE, lw=1, alpha=0.5)
    ax.axvline(eps_outside, color=ORANGE, lw=1, alpha=0.5)
    ax.axhline(np.sqrt((d - 1) / d), color=BLACK, lw=1, ls=":",
               label=rf"$\sqrt{{(D-1)/D}}$ = {np.sqrt((d - 1) / d):.3f}, D = {d}")
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("std of the input row")
    ax.set_ylabel("std of the output row")
    ax.set_title(rf"Where $\varepsilon$ goes, D = {d}")
    legend_outside(ax, ncol=1)
    bessel = np.sqrt((d - 1) / d)
    # where each curve crosses one half (layer_norm_output_std = 1/2, solved for sigma)
    half_in, half_out = np.sqrt(eps_inside / 3), eps_outside / (2 - 1 / bessel)
    alt = (f"Output std against input row std, D = {d}: eps inside the root (PyTorch) levels off at 1, "
           f"std + eps (Annotated Transformer) at {bessel:.3f} = √({d - 1}/{d}).")
    description = (f"The standard deviation of a normalised row (0 to 1.1) against that of the input row, "
                   f"on a log axis from 1e-8 to 10, for rows of D = {d}. The PyTorch curve, eps = "
                   f"{sig(eps_inside)} inside the square root of the biased variance, is near 0 for tiny "
                   f"inputs, rises through one half at an input std of {sig(half_in)} (vertical line at "
                   f"√eps = {sig(np.sqrt(eps_inside))}) and levels off at 1. The Annotated Transformer "
                   f"curve, eps = {sig(eps_outside)} added to the unbiased standard deviation, rises "
                   f"through one half at {sig(half_out)} (vertical line at eps) and levels off at "
                   f"{bessel:.3f}, the Bessel factor √({d - 1}/{d}), marked by a dotted line.")
    return set_alt(fig, short_alt(alt), description)


# ---- a table without pandas --------------------------------------------------------------------

class Table:
    """A small table that shows as HTML in a notebook and as aligned text elsewhere.

    rows: list of tuples; floats are formatted with ``float_format``, other values with ``str``.
    """

    def __init__(self, columns, rows, caption=None, float_format="{:.1e}"):
        self.columns = [str(c) for c in columns]
        self.rows = [tuple(r) for r in rows]
        for r in self.rows:
            if len(r) != len(self.columns):
                raise ValueError(f"rows: expected {len(self.columns)} values per row; got {r!r}")
        self.caption, self.float_format = caption, float_format

    def _cell(self, v):
        if isinstance(v, (float, np.floating)):
            return self.float_format.format(float(v))
        return str(v)

    def __repr__(self):
        cells = [self.columns] + [[self._cell(v) for v in r] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        fmt = lambda row: "  ".join(s.ljust(w) for s, w in zip(row, widths)).rstrip()
        lines = ([self.caption] if self.caption else []) + [fmt(cells[0]),
                                                             "  ".join("-" * w for w in widths)]
        return "\n".join(lines + [fmt(r) for r in cells[1:]])

    def _repr_html_(self):
        e = html.escape
        # named by its caption (a screen reader's table list), and each row by its first cell
        out = ['<table class="preln-table">', f"<caption>{e(table_caption(self.caption, self.columns))}</caption>"]
        out.append("<thead><tr>" + "".join(f'<th scope="col">{e(c)}</th>' for c in self.columns) + "</tr></thead><tbody>")
        for r in self.rows:
            # nowrap: "8.7e-10" must not break at its hyphen in a narrow column
            cells = [e(self._cell(v)) for v in r]
            out.append(f'<tr><th scope="row" style="white-space:nowrap;text-align:left">{cells[0]}</th>'
                       + "".join(f'<td style="white-space:nowrap">{c}</td>' for c in cells[1:]) + "</tr>")
        out.append("</tbody></table>")
        return "".join(out)


#: The interactive figures of this chapter, name -> (plot, controls).
EXPLORABLES = {
    "qk_scaling": (plot_qk_scaling, {"d_h": control("head width d_h", [4, 8, 16, 32, 64, 128])}),
    "attention_masks": (plot_attention_masks, {"mask": control("attention mask", list(MASKS))}),
    "online_softmax": (plot_online_softmax, {"step": control("tiles read so far", list(range(1, 7)))}),
}
