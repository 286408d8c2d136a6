"""Figures and data helpers for "Derivation II: the block" (``book/derivation_block.ipynb``).

What the chapter computes beyond the package itself, so that the notebook only imports, calls,
checks and plots:

- Jacobians dy/dx of a block on one sequence (:func:`block_jacobian`, one batched forward and
  backward), their summary numbers, and the interactive Pre-LN vs Post-LN heatmaps
  (:func:`plot_jacobians`, over the width D and the input scale);
- the L-block Pre-LN and Post-LN stacks as a diagram (:func:`plot_stack_diagram`) and the plot of
  the final LayerNorm's 1/rms(x_L) scaling of every gradient (:func:`plot_final_norm_scaling`; the
  chapter measures it in view);
- inverted dropout's moments (:func:`dropout_moments`) and the BatchNorm experiments: running
  statistics (:func:`bn_running_trace`), the train/eval gap against batch size
  (:func:`bn_train_eval_gap`), padding (:func:`bn_padding_effect`), and one token's outputs as
  its batch changes (:func:`bn_token_outputs`, interactive in :func:`plot_bn_token`).

Every plot returns a :class:`matplotlib.figure.Figure` built without pyplot. ``EXPLORABLES``
registers the interactive figures for ``preln.chapters.figures.all_explorables``.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from preln.nb import set_alt, short_alt, sig
from preln.nn.block import TransformerBlock
from preln.nn.config import BlockConfig
from preln.ops import BatchNorm1d, batchnorm_forward, dropout_forward, layer_norm_forward
from preln.chapters.viz import COLUMN_IN, PALETTE, control, direct_labels

__all__ = [
    "block_jacobian", "jacobian_stats", "jacobian_pair", "plot_jacobians",
    "jacobians_alt", "plot_stack_diagram", "plot_final_norm_scaling",
    "dropout_moments", "plot_dropout_moments", "bn_running_trace", "bn_train_eval_gap",
    "bn_padding_effect", "plot_batchnorm", "bn_token_outputs", "plot_bn_token", "bn_token_alt",
    "EXPLORABLES",
]

BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, BLACK, YELLOW = PALETTE
DIVERGING = "PuOr_r"   # ColorBrewer diverging map, readable with the common colour-vision deficiencies


# ---- Jacobians of one block ----------------------------------------------------------------------

def block_jacobian(block, x):
    """J[i, j] = d y_i / d x_j of ``block`` at x (1, S, D), flattened over (S, D): (S*D, S*D).

    Row i is the gradient of y_i: the sequence is repeated n = S*D times as a batch, one forward,
    and one backward with dy[i] = the i-th unit vector -- n backward passes in one call. The
    block's parameter gradients are zeroed afterwards.
    """
    if x.ndim != 3 or x.shape[0] != 1:
        raise ValueError(f"x: expected one sequence, shape (1, S, D); got shape {x.shape}")
    n = x.size
    xs = np.repeat(x, n, axis=0)                        # (n, S, D): n copies of the sequence
    block(xs)
    dy = np.eye(n).reshape((n,) + x.shape[1:])          # (n, S, D): copy i gets e_i
    J = block.backward(dy).reshape(n, n)                # row i = dy_i/dx
    block.zero_grad()
    return J


def jacobian_stats(J):
    """{"diag": mean diagonal entry, "dist": ||J - I||_F / sqrt(n), the RMS distance from I}."""
    n = J.shape[0]
    return {"diag": float(np.diag(J).mean()),
            "dist": float(np.linalg.norm(J - np.eye(n)) / np.sqrt(n))}


def jacobian_pair(d_model=8, scale=1.0, seq_len=5, seed=0):
    """Pre-LN and Post-LN blocks with the same weights (H = 2, F = 2D, float64, PyTorch's
    initialisation) and their Jacobians at x = scale * N(0, 1) of shape (1, S, D).

    Returns {"x", "pre", "post" (the blocks), "J_pre", "J_post"}.
    """
    out = {}
    for name, first in (("pre", True), ("post", False)):
        cfg = BlockConfig(d_model=d_model, n_heads=2, d_ff=2 * d_model, norm_first=first)
        out[name] = TransformerBlock(cfg, dtype=np.float64, seed=seed)
    out["x"] = scale * np.random.default_rng(seed + 1).standard_normal((1, seq_len, d_model))
    out["J_pre"] = block_jacobian(out["pre"], out["x"])
    out["J_post"] = block_jacobian(out["post"], out["x"])
    return out


def plot_jacobians(d_model=8, scale=1.0) -> Figure:
    """Heatmaps of dy/dx for Pre-LN and Post-LN on one sequence, on one colour scale."""
    pair = jacobian_pair(d_model, scale)
    J_pre, J_post = pair["J_pre"], pair["J_post"]
    lim = float(max(np.abs(J_pre).max(), np.abs(J_post).max()))
    # at the column's width; the two maps side by side on one colour scale, text at 10 pt
    fig = Figure(figsize=(COLUMN_IN, 3.9))
    axes = fig.subplots(1, 2)
    for ax, J, name in zip(axes, (J_pre, J_post), ("Pre-LN", "Post-LN")):
        im = ax.imshow(J, cmap=DIVERGING, vmin=-lim, vmax=lim)
        ticks = np.arange(0, J.shape[0], d_model)
        ax.set_xticks(ticks - 0.5, [f"t{t // d_model}" for t in ticks], fontsize=10, ha="left")
        ax.set_yticks(ticks - 0.5, [f"t{t // d_model}" for t in ticks], fontsize=10, va="top")
        ax.grid(True, color="0.5", alpha=0.5, lw=0.5)
        ax.set_xlabel("input $x$ (token, feature)", fontsize=10)
        ax.set_ylabel("output $y$ (token, feature)", fontsize=10)
        st = jacobian_stats(J)
        ax.set_title(f"{name}\ndiag {st['diag']:.2f}, ‖J−I‖ {st['dist']:.2f}", fontsize=10)
    fig.colorbar(im, ax=list(axes), label="∂y/∂x", shrink=0.85)
    fig.suptitle(f"$D = {d_model}$, input scale {scale:g}", fontsize=11)
    return fig


def jacobians_alt(d_model=8, scale=1.0) -> str:
    pair = jacobian_pair(d_model, scale)
    pre, post = jacobian_stats(pair["J_pre"]), jacobian_stats(pair["J_post"])
    n = pair["J_pre"].shape[0]
    return (f"Two {n} by {n} heatmaps of the Jacobian dy/dx of one sequence of 5 tokens with "
            f"D = {d_model} features and inputs of scale {scale:g}, on one diverging colour scale. "
            f"Pre-LN (left): a diagonal close to 1, mean {pre['diag']:.2f}, RMS distance from the "
            f"identity {pre['dist']:.2f}, with faint off-diagonal entries from attention and the MLP. "
            f"Post-LN (right): a weaker diagonal, mean {post['diag']:.2f}, distance from the identity "
            f"{post['dist']:.2f}, with negative entries inside each token's {d_model} by {d_model} "
            f"block where the LayerNorm Jacobians project out each token's mean and scale.")


# ---- the L-block stack ----------------------------------------------------------------------------

def _box(ax, x, y, text, color, w=1.5, h=0.55):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                fc="white", ec=color, lw=2))
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(ax, a, b, color=BLACK, lw=1.2, style="-|>"):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=10, color=color, lw=lw,
                                 shrinkA=0, shrinkB=0))


def _plus(ax, x, y, color):
    ax.add_patch(Circle((x, y), 0.17, fc="white", ec=color, lw=2, zorder=3))
    ax.text(x, y, "+", ha="center", va="center", fontsize=10, zorder=4)


def plot_stack_diagram(n_layers=2) -> Figure:
    """Pre-LN (left) and Post-LN (right) stacks of ``n_layers`` blocks, two sub-layers each.

    The residual stream runs up the left of each panel. In Pre-LN it is one unbroken line from x_0
    to the final LayerNorm (the identity path, blue); each sub-layer f (attention or MLP) branches
    off through its own LayerNorm and adds back. In Post-LN a LayerNorm sits on the stream after
    every addition, so every path from y to x_0 crosses 2L LayerNorms (vermillion).
    """
    n_sub = 2 * n_layers
    step = 1.25
    top = n_sub * (step + 0.45) + 1.1             # Post-LN's stream is the taller: an LN per addition
    fig = Figure(figsize=(8.8, 0.62 * top + 0.6))
    axes = fig.subplots(1, 2)
    for ax, pre in zip(axes, (True, False)):
        ax.set_xlim(-1.2, 4.3)
        ax.set_ylim(-0.6, top + 0.2)
        ax.set_aspect("equal")
        ax.axis("off")
        sx = 0.0                                    # the residual stream's x position
        ax.text(sx, -0.45, "x₀", ha="center", va="center", fontsize=11)
        y = 0.0
        stream = BLUE if pre else BLACK
        for i in range(n_sub):
            kind = "Attn" if i % 2 == 0 else "MLP"
            layer = i // 2 + 1
            y_plus = y + step
            if pre:   # branch: stream -> LN -> f -> (+)
                yb = y + 0.45 * step
                _box(ax, 1.4, yb, f"LN", GREEN, w=0.8)
                _box(ax, 2.9, yb, f"{kind} (f)", ORANGE, w=1.4)
                _arrow(ax, (sx, yb), (1.0, yb))
                _arrow(ax, (1.8, yb), (2.2, yb))
                _arrow(ax, (3.6, yb), (3.85, yb), style="-")
                _arrow(ax, (3.85, yb), (3.85, y_plus), style="-")
                _arrow(ax, (3.85, y_plus), (sx + 0.17, y_plus))
                _arrow(ax, (sx, y + (0.0 if i == 0 else 0.17)), (sx, y_plus - 0.17), color=stream, lw=3)
                _plus(ax, sx, y_plus, stream)
                y_next = y_plus
            else:     # (+) on the stream, then LN on the stream
                yb = y + 0.45 * step
                _box(ax, 2.3, yb, f"{kind} (f)", ORANGE, w=1.4)
                _arrow(ax, (sx, yb), (1.6, yb))
                _arrow(ax, (3.0, yb), (3.85, yb), style="-")
                _arrow(ax, (3.85, yb), (3.85, y_plus), style="-")
                _arrow(ax, (3.85, y_plus), (sx + 0.17, y_plus))
                start = y + (0.0 if i == 0 else 0.28)
                _arrow(ax, (sx, start), (sx, y_plus - 0.17), color=stream, lw=2)
                _plus(ax, sx, y_plus, stream)
                _box(ax, sx, y_plus + 0.45, "LN", VERMILLION, w=0.8, h=0.42)
                _arrow(ax, (sx, y_plus + 0.17), (sx, y_plus + 0.24), color=stream, lw=2)
                y_next = y_plus + 0.45
            if i % 2 == 1:
                ax.text(-1.1, (y_next + y - step) / 2 + 0.3, f"block {layer}", rotation=90,
                        ha="center", va="center", fontsize=9, color="0.35")
            y = y_next
        if pre:
            _arrow(ax, (sx, y + 0.17), (sx, y + 0.55), color=stream, lw=3)
            ax.text(sx + 0.35, y + 0.36, "$x_L$", fontsize=9, va="center")
            _box(ax, sx, y + 0.85, "final LN", VERMILLION, w=1.3, h=0.55)
            _arrow(ax, (sx, y + 1.13), (sx, y + 1.45))
            ax.text(sx, y + 1.6, "y", ha="center", va="center", fontsize=11)
            ax.set_title("Pre-LN: one identity path $x_0 \\to x_L$,\nthen the final LayerNorm",
                         fontsize=10)
        else:
            _arrow(ax, (sx, y + 0.21), (sx, y + 0.55))
            ax.text(sx, y + 0.7, "$y = x_L$", ha="center", va="center", fontsize=10)
            ax.set_title(f"Post-LN: a LayerNorm after every addition\n"
                         f"({2 * n_layers} on every path from y to x₀)", fontsize=10)
    blocks = f"{n_layers} block{'s' if n_layers != 1 else ''}"
    alt = (f"Pre-LN and Post-LN stacks of {blocks}: Pre-LN's residual stream is one unbroken "
           f"path to a final LayerNorm; Post-LN's crosses {n_sub} LayerNorms.")
    description = (
        f"Two diagrams side by side, read from bottom to top. Left, Pre-LN: the input x₀ enters a thick "
        f"blue vertical line, the residual stream, which runs without interruption through {n_sub} "
        f"addition nodes ({blocks}, each with an attention and an MLP sub-layer) up to x_L. At "
        f"each node a branch leaves the stream to the right, passes a LayerNorm box and a sub-layer box f, "
        f"and is added back. Above x_L the stream enters one vermillion final LayerNorm box, then the "
        f"output y. Right, Post-LN: the same {n_sub} branches without their own LayerNorm, but after every "
        f"addition node a vermillion LayerNorm box sits on the stream itself, {n_sub} in all, so every "
        f"path from y down to x₀ crosses {n_sub} LayerNorms.")
    return set_alt(fig, short_alt(alt), description)


def plot_final_norm_scaling(data) -> Figure:
    """||dx_0|| and the final LayerNorm's gain against rms(x_L), log-log, with slope -1.

    ``data``: {"scales": the input scales c, "n_layers": L, and arrays over the scales "rms_xL"
    (rms of x_L), "grad_norm" (||dx_0||) and "ln_gain" (the final LayerNorm's largest singular
    value)}, as the chapter's cell measures them.
    """
    fig = Figure(figsize=(5.8, 3.6))
    ax = fig.subplots()
    rms = data["rms_xL"]
    ax.loglog(rms, data["grad_norm"], "o-", color=BLUE, label=f"‖dx₀‖, gradient at the input (L = {data['n_layers']})")
    ax.loglog(rms, data["ln_gain"], "s--", color=VERMILLION, label=r"largest singular value of $J_{\mathrm{LN}_f}$")
    ref = data["grad_norm"][0] * rms[0] / rms
    ax.loglog(rms, ref, ":", color=BLACK, label=r"$\propto 1/\mathrm{rms}(x_L)$")
    ax.set_xlabel(r"rms($x_L$), the scale of the residual stream")
    ax.set_ylabel("gradient norm / gain")
    ax.set_title("Every gradient passes the final LayerNorm", fontsize=11)
    ax.legend()
    slope = {k: f"{np.polyfit(np.log(rms), np.log(data[k]), 1)[0]:.2f}".replace("-", "−")
             for k in ("grad_norm", "ln_gain")}
    alt = (f"Log-log against rms(x_L) after {data['n_layers']} Pre-LN blocks: input gradient norm and final "
           f"LayerNorm gain fall like 1/rms, slopes {slope['grad_norm']} and {slope['ln_gain']}.")
    description = (
        f"Log-log plot against rms(x_L), the scale of the residual stream after {data['n_layers']} Pre-LN "
        f"blocks, over {len(rms)} input scales ({data['scales'].min():g} to {data['scales'].max():g}), which "
        f"give rms(x_L) from {rms.min():.2f} to {rms.max():.3g}. Blue circles: the norm of the gradient at "
        f"the input x₀, from {data['grad_norm'][0]:.2f} to {data['grad_norm'][-1]:.2f}, fitted slope "
        f"{slope['grad_norm']}. Vermillion squares: the largest singular value of the final LayerNorm's "
        f"Jacobian, falling in parallel, fitted slope {slope['ln_gain']}. A dotted black reference line "
        f"of slope −1 (proportional to 1/rms(x_L)) runs through the first blue point.")
    return set_alt(fig, short_alt(alt), description)


# ---- dropout ----------------------------------------------------------------------------------------

def dropout_moments(p, x, n_draws=20000, seed=0):
    """Sample moments of inverted dropout on the vector x over ``n_draws`` independent masks.

    Returns {"kept": fraction of elements kept, "mean_ratio": mean of out / x, "second_ratio":
    mean of out^2 / x^2, "survivor_scale": out / x on kept elements (all equal 1/(1-p))}.
    """
    rng = np.random.default_rng(seed)
    xs = np.broadcast_to(x, (n_draws,) + x.shape)
    out, mask = dropout_forward(xs, p, rng)
    ratio = out / xs
    return {"kept": float(mask.mean()), "mean_ratio": float(ratio.mean()),
            "second_ratio": float((ratio ** 2).mean()),
            "survivor_scale": np.unique(ratio[mask])}


def plot_dropout_moments(ps, moments) -> Figure:
    """Measured E[out]/x and E[out^2]/x^2 against p, with 1 and 1/(1-p)."""
    fig = Figure(figsize=(5.8, 3.5))
    ax = fig.subplots()
    grid = np.linspace(0.0, max(ps), 200)
    ax.plot(grid, np.ones_like(grid), color=BLUE, lw=1, label="1 (expectation kept)")
    ax.plot(grid, 1 / (1 - grid), color=VERMILLION, lw=1, label="1/(1−p)")
    ax.plot(ps, [m["mean_ratio"] for m in moments], "o", color=BLUE, label="measured E[out]/x")
    ax.plot(ps, [m["second_ratio"] for m in moments], "s", color=VERMILLION,
            label="measured E[out²]/x²")
    ax.set_yscale("log")
    ax.minorticks_off()
    top = int(np.ceil(1 / (1 - max(ps))))
    ax.set_yticks(range(1, top + 1), [str(v) for v in range(1, top + 1)])
    ax.set_xlabel("drop probability p")
    ax.set_ylabel("ratio to the input")
    ax.set_title("Inverted dropout: the mean is kept, the energy is not", fontsize=11)
    ax.legend()
    means = [m["mean_ratio"] for m in moments]
    seconds = [m["second_ratio"] for m in moments]
    p_list = ", ".join(f"{p:g}" for p in ps)
    off = max(abs(m - 1) for m in means)     # the sampling noise of the measured means
    alt = (f"Inverted dropout, p from {min(ps):g} to {max(ps):g}: measured E[out]/x stays within {sig(off, 1)} "
           f"of 1, E[out²]/x² follows 1/(1−p) up to {seconds[-1]:.2f}.")
    description = (
        f"Plot against the drop probability p from 0 to {max(ps):g}, log y axis. A flat blue line at 1, with "
        f"blue circles at p = {p_list}: the measured mean of out/x, "
        + ", ".join(f"{m:.3f}" for m in means) + ". A rising vermillion curve 1/(1−p), from 1 to "
        f"{1 / (1 - max(ps)):.3g}, with vermillion squares: the measured mean of out squared over x squared, "
        + ", ".join(f"{m:.2f} against {1 / (1 - p):.3g}" for m, p in zip(seconds, ps)) + ".")
    return set_alt(fig, short_alt(alt), description)


# ---- BatchNorm vs LayerNorm ------------------------------------------------------------------------

POP_MEAN, POP_STD = 2.0, 3.0   # the population the BatchNorm experiments draw their tokens from


def bn_running_trace(n_steps=60, batch=16, channels=4, momentum=0.1, seed=0):
    """Train a :class:`preln.ops.BatchNorm1d` on ``n_steps`` batches from N(POP_MEAN, POP_STD^2).

    Returns {"mean", "var": (n_steps + 1,) running statistics of channel 0 (index 0: the initial
    0 and 1), "batch_mean": (n_steps,) each batch's mean of channel 0, "bn": the module}.
    """
    rng = np.random.default_rng(seed)
    bn = BatchNorm1d(channels, momentum=momentum)
    means, vars_, batch_means = [bn.running_mean[0]], [bn.running_var[0]], []
    for _ in range(n_steps):
        x = POP_MEAN + POP_STD * rng.standard_normal((batch, channels))
        bn(x)
        batch_means.append(x[:, 0].mean())
        means.append(bn.running_mean[0])
        vars_.append(bn.running_var[0])
    return {"mean": np.array(means), "var": np.array(vars_), "batch_mean": np.array(batch_means),
            "bn": bn}


def bn_train_eval_gap(batch_sizes=(2, 4, 8, 16, 32, 64), channels=4, n_batches=200, seed=0):
    """Mean |y_train - y_eval| of BatchNorm on batches of each size, with exact population
    statistics as the running ones (the best eval can do), and the same for LayerNorm.

    Returns {"bn": array over batch sizes, "ln": array (exactly 0: LayerNorm has no modes)}.
    """
    rng = np.random.default_rng(seed)
    C = channels
    g, b = np.ones(C), np.zeros(C)
    rm, rv = np.full(C, POP_MEAN), np.full(C, POP_STD ** 2)
    bn_gap, ln_gap = [], []
    for n in batch_sizes:
        diffs, ln_diffs = [], []
        for _ in range(n_batches):
            x = POP_MEAN + POP_STD * rng.standard_normal((n, C))
            y_train, _ = batchnorm_forward(x, g, b, rm.copy(), rv.copy(), training=True)
            y_eval, _ = batchnorm_forward(x, g, b, rm, rv, training=False)
            diffs.append(np.abs(y_train - y_eval).mean())
            ln = layer_norm_forward(x, g, b)[0]      # the same function in both modes
            ln_diffs.append(np.abs(ln - layer_norm_forward(x, g, b)[0]).mean())
        bn_gap.append(np.mean(diffs))
        ln_gap.append(np.mean(ln_diffs))
    return {"bn": np.array(bn_gap), "ln": np.array(ln_gap)}


def bn_padding_effect(pad_counts=(0, 4, 8, 16, 24), batch=4, seq_len=8, channels=4, seed=0):
    """Tokens (B, S, C) padded with ``k`` zero tokens at the end of the batch's sequences:
    max |BN(real tokens, statistics with the padding) - BN(real tokens alone)| over the real
    tokens, in training mode, for each k; and the same for LayerNorm (per token: exactly 0).
    """
    rng = np.random.default_rng(seed)
    real = POP_MEAN + POP_STD * rng.standard_normal((batch, seq_len, channels))   # (B, S, C)
    C = channels
    g, b = np.ones(C), np.zeros(C)
    alone, _ = batchnorm_forward(real, g, b, np.zeros(C), np.ones(C))
    ln_alone = layer_norm_forward(real, g, b)[0]
    bn_err, ln_err = [], []
    for k in pad_counts:
        padded = np.concatenate([real, np.zeros((batch, k, C))], axis=1)          # (B, S + k, C)
        y, _ = batchnorm_forward(padded, g, b, np.zeros(C), np.ones(C))
        bn_err.append(float(np.abs(y[:, :seq_len] - alone).max()))
        ln_err.append(float(np.abs(layer_norm_forward(padded, g, b)[0][:, :seq_len] - ln_alone).max()))
    frac = np.array(pad_counts, dtype=float) / (seq_len + np.array(pad_counts))
    return {"pad_fraction": frac, "bn": np.array(bn_err), "ln": np.array(ln_err)}


def _exactly_zero(values):
    """LayerNorm's differences in words: "exactly 0", which the experiments show, else their largest."""
    return "exactly 0" if not np.any(values) else f"at most {np.max(np.abs(values)):.2g}"


def plot_batchnorm(trace, gap, batch_sizes, pad) -> Figure:
    """Three panels, one above the other at the column's width, each series labelled where it
    ends: running statistics, the train/eval gap against batch size, padding."""
    fig = Figure(figsize=(COLUMN_IN - 0.2, 8.6))
    ax1, ax2, ax3 = fig.subplots(3, 1)
    steps = np.arange(trace["mean"].size)
    ax1.plot(steps[1:], trace["batch_mean"], ".", color=SKY, label="batch mean")
    ax1.plot(steps, trace["mean"], color=BLUE, label="running mean")
    ax1.plot(steps, np.sqrt(trace["var"]), color=VERMILLION, label="√running var")
    ax1.axhline(POP_MEAN, color=BLUE, ls=":", lw=1)
    ax1.axhline(POP_STD, color=VERMILLION, ls=":", lw=1)
    ax1.set_xlabel("training step (batch)")
    ax1.set_ylabel("channel 0 statistic")
    momentum = trace["bn"].momentum
    ax1.set_title(f"Running statistics (momentum {momentum:g}); dots: batch means", loc="left")
    direct_labels(ax1, ax1.get_lines()[1:3])
    ax2.loglog(batch_sizes, gap["bn"], "o-", color=VERMILLION, label="BatchNorm")
    ax2.plot(batch_sizes, gap["bn"][0] * np.sqrt(batch_sizes[0] / np.asarray(batch_sizes)), ":",
             color=BLACK, lw=1, label="∝ 1/√n")
    ax2.minorticks_off()
    ax2.set_xticks(list(batch_sizes), [str(b) for b in batch_sizes])
    yt = [0.0625, 0.125, 0.25, 0.5, 1.0]
    ax2.set_yticks(yt, [f"{v:g}" for v in yt])
    ax2.set_xlabel("batch size (tokens per channel)")
    ax2.set_ylabel(r"mean $|y_\mathrm{train} - y_\mathrm{eval}|$")
    ax2.set_title("Train/eval gap (LayerNorm: 0)", loc="left")
    direct_labels(ax2)
    ax3.plot(pad["pad_fraction"], pad["bn"], "o-", color=VERMILLION, label="BatchNorm")
    ax3.plot(pad["pad_fraction"], pad["ln"], "s-", color=BLUE, label="LayerNorm (exactly 0)")
    ax3.set_xlabel("fraction of the batch that is padding")
    ax3.set_ylabel("max change of an output")
    ax3.set_title("Zero padding in the statistics: a real token's output moves", loc="left")
    direct_labels(ax3)
    mean, std = trace["mean"][-1], np.sqrt(trace["var"][-1])
    slope = np.polyfit(np.log(batch_sizes), np.log(gap["bn"]), 1)[0] if len(batch_sizes) > 1 else np.nan
    alt = (f"BatchNorm: running mean and std settle at {mean:.2f} and {std:.2f}; the train/eval gap falls with "
           f"batch size, slope {sig(slope)}; padding moves outputs up to {pad['bn'].max():.2f}.")
    description = (
        f"Three panels, one above the other. Top: over {steps[-1]} training steps (momentum {momentum:g}), the running mean of "
        f"channel 0 (blue) moves from {trace['mean'][0]:g} and the square root of the running variance "
        f"(vermillion) from {np.sqrt(trace['var'][0]):g}, ending at {mean:.2f} and {std:.2f}, near the "
        f"population values {POP_MEAN:g} and {POP_STD:g} (dotted lines), with the scattered batch means "
        f"(light blue dots) around them. Middle: log-log plot of the mean absolute difference between "
        f"BatchNorm's training-mode and eval-mode outputs against the batch size from {min(batch_sizes)} to "
        f"{max(batch_sizes)}, falling from {gap['bn'][0]:.2f} to {gap['bn'][-1]:.2f}, fitted slope "
        f"{sig(slope)} (the dotted line falls like 1/√n, slope −0.5); LayerNorm's gap is "
        f"{_exactly_zero(gap['ln'])}. Bottom: the largest "
        f"change of a real token's BatchNorm output when zero padding tokens enter the statistics, from "
        f"{pad['bn'][0]:.2f} to {pad['bn'][-1]:.2f} as the padded fraction of the batch goes from "
        f"{pad['pad_fraction'][0]:.2f} to {pad['pad_fraction'][-1]:.2f}, while LayerNorm's change is {_exactly_zero(pad['ln'])}.")
    return set_alt(fig, short_alt(alt), description)


def bn_token_outputs(batch_size=8, pad_fraction=0.0, channels=8, seed=0):
    """One fixed token (C channels, drawn from the POP_MEAN, POP_STD population) normalised three ways.

    Its batch is the token, the first ``batch_size - 1`` tokens of a fixed pool from the same
    population, and zero padding tokens making up ``pad_fraction`` of the whole batch. Returns
    {"bn_train": (C,) training-mode BatchNorm output of the token with this batch's statistics,
    "bn_eval": (C,) eval-mode output with the population's statistics as running ones,
    "ln": (C,) LayerNorm output of the token, "n_pad": the number of padding tokens}.
    """
    if not 0 <= pad_fraction < 1:
        raise ValueError(f"pad_fraction: expected a number in [0, 1); got {pad_fraction!r}")
    C = channels
    rng = np.random.default_rng(seed)
    token = POP_MEAN + POP_STD * rng.standard_normal(C)                      # (C,)
    pool = POP_MEAN + POP_STD * rng.standard_normal((127, C))                # (127, C) other tokens
    n_pad = int(round(pad_fraction / (1 - pad_fraction) * batch_size))
    x = np.concatenate([token[None], pool[:batch_size - 1], np.zeros((n_pad, C))])   # (N, C)
    g, b = np.ones(C), np.zeros(C)
    rm, rv = np.full(C, POP_MEAN), np.full(C, POP_STD ** 2)
    bn_train = batchnorm_forward(x, g, b, rm.copy(), rv.copy(), training=True)[0][0]
    bn_eval = batchnorm_forward(token[None], g, b, rm, rv, training=False)[0][0]
    ln = layer_norm_forward(token, g, b)[0]
    return {"bn_train": bn_train, "bn_eval": bn_eval, "ln": ln, "n_pad": n_pad}


def plot_bn_token(batch_size=8, pad_fraction=0.0) -> Figure:
    """BatchNorm (training vs eval) and LayerNorm outputs of one token, channel by channel."""
    out = bn_token_outputs(batch_size, pad_fraction)
    C = out["ln"].size
    ch = np.arange(C)
    # two panels stacked at the column's width; the legend below BatchNorm's, never over its bars
    fig = Figure(figsize=(COLUMN_IN, 6.4))
    ax1, ax2 = fig.subplots(2, 1, sharey=True)
    ax1.bar(ch - 0.2, out["bn_train"], 0.4, color=VERMILLION, label="training mode (this batch)")
    ax1.bar(ch + 0.2, out["bn_eval"], 0.4, color=SKY, label="eval mode (running statistics)")
    gap = float(np.abs(out["bn_train"] - out["bn_eval"]).mean())
    ax1.set_title(f"BatchNorm: mean |train − eval| = {gap:.2f}", fontsize=10)
    ax2.bar(ch, out["ln"], 0.6, color=BLUE, label="any batch, any mode")
    ax2.set_title("LayerNorm: the same in every frame", fontsize=10)
    for ax in (ax1, ax2):
        ax.axhline(0, color=BLACK, lw=0.8)
        ax.set_ylabel("normalised output")
        ax.set_xlabel("channel (feature)")
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    ax1.set_ylim(-4.0, 4.0)   # covers every frame of EXPLORABLES (largest |value| about 3.7)
    fig.suptitle(f"One token in a batch of {batch_size} real tokens + {out['n_pad']} padding tokens",
                 fontsize=11)
    return fig


def bn_token_alt(batch_size=8, pad_fraction=0.0) -> str:
    out = bn_token_outputs(batch_size, pad_fraction)
    gap = float(np.abs(out["bn_train"] - out["bn_eval"]).mean())
    return (f"Two bar charts, one above the other, of one token's {out['ln'].size} normalised "
            f"channel values. Above, "
            f"BatchNorm in a batch of {batch_size} real tokens and {out['n_pad']} zero padding "
            f"tokens: training-mode bars (vermillion, this batch's statistics) next to eval-mode bars "
            f"(sky blue, the population's statistics); they differ by {gap:.2f} on average. Below, "
            f"LayerNorm's output for the same token, identical in every frame because it uses only "
            f"the token's own statistics.")


#: The interactive figures of this chapter, name -> (plot, controls).
EXPLORABLES = {
    "jacobians": (plot_jacobians, {"d_model": control("model width D", [8, 16]),
                                   "scale": control("input scale", [0.25, 0.5, 1.0, 2.0, 4.0])}),
    "batchnorm_token": (plot_bn_token, {"batch_size": control("real tokens in the batch", [2, 4, 8, 16, 64]),
                                        "pad_fraction": control("fraction of padding tokens", [0.0, 0.25, 0.5, 0.75])}),
}
