"""Figures of the Pre-LN vs Post-LN chapter (book/preln_vs_postln.ipynb).

Plain figures take the numbers they plot as arguments; the explorables in ``EXPLORABLES`` take only
their control values and read the stored sweep (preln/data/preln_vs_postln/, written by
scripts/sweep_preln_postln.py), so each frame is a lookup plus a plot.
"""
import functools
import json

import matplotlib.pyplot as plt
import numpy as np

from preln.chapters.viz import PALETTE, control
from preln.chapters.xiong import DATA_DIR, PAPER_FIG3A, lemma2_bounds

SWEEP_DIR = DATA_DIR / "preln_vs_postln"
PRE, POST = PALETTE[0], PALETTE[1]            # blue: Pre-LN, vermillion: Post-LN
STYLE = {(True, True): dict(color=PRE, ls="-"), (True, False): dict(color=PRE, ls="--"),
         (False, True): dict(color=POST, ls="-"), (False, False): dict(color=POST, ls="--")}


def _name(norm_first):
    return "Pre-LN" if norm_first else "Post-LN"


@functools.lru_cache(maxsize=None)
def load_runs():
    """The stored training sweep (runs.json) as a dict."""
    return json.loads((SWEEP_DIR / "runs.json").read_text())


@functools.lru_cache(maxsize=None)
def load_theory():
    """The stored theory-setting measurements (theory.json) as a dict."""
    return json.loads((SWEEP_DIR / "theory.json").read_text())


def find_run(norm_first, n_layers, lr, warmup, seed, runs=None):
    """The stored run with this configuration (KeyError if the sweep does not have it)."""
    runs = load_runs()["runs"] if runs is None else runs
    for r in runs:
        c = r["config"]
        if (c["norm_first"], c["n_layers"], c["warmup"], c["seed"]) == (norm_first, n_layers, warmup, seed) \
                and np.isclose(c["lr"], lr):
            return r
    raise KeyError(f"no stored run with norm_first={norm_first}, n_layers={n_layers}, lr={lr}, "
                   f"warmup={warmup}, seed={seed}")


def seed_finals(norm_first, n_layers, lr, warmup, seeds=(0, 1)):
    """The last held-out loss of each seed's stored run (nats per character; NaN if it diverged)."""
    vals = [find_run(norm_first, n_layers, lr, warmup, s)["eval_loss"][-1] for s in seeds]
    return [np.nan if v is None else float(v) for v in vals]


def final_eval(norm_first, n_layers, lr, warmup, seeds=(0, 1)):
    """Mean over seeds of the last held-out loss of the stored runs (nats per character)."""
    return float(np.mean(seed_finals(norm_first, n_layers, lr, warmup, seeds)))


def theory_per_depth(theory, key, name, depths):
    """Mean over seeds of a stored theory measurement (e.g. key "thm1_sample", name "pre") per depth."""
    return np.array([np.mean(theory[key][name][str(L)]) for L in depths])


def last_over_first(g):
    """Ratio of the last layer's gradient norm to the first's (the shape of Xiong et al.'s Fig. 3a)."""
    return float(g[-1] / g[0])


def _smooth(y, window=10):
    y = np.array([np.nan if v is None else v for v in y], dtype=float)
    if y.size < window:
        return y
    kernel = np.ones(window) / window
    out = np.convolve(y, kernel, mode="valid")
    return np.concatenate([np.full(window - 1, np.nan), out])


# ---- theory ----------------------------------------------------------------------------------
def plot_lemma2(pre, post):
    """pre: E||x_l||^2/d for l = 0..L (Pre-LN); post: E||x^{post,5}_l||^2/d for l = 1..L."""
    fig, ax = plt.subplots()
    l = np.arange(len(pre))
    lo, hi = lemma2_bounds(l)
    ax.fill_between(l, lo, hi, color=PRE, alpha=0.15, label="Lemma 2 bounds (Pre-LN)")
    ax.plot(l, pre, "o-", color=PRE, label="Pre-LN, measured")
    ax.plot(np.arange(1, len(post) + 1), post, "s-", color=POST, label="Post-LN, measured")
    ax.axhline(1.5, color=POST, ls=":", lw=1.5, label="Post-LN, Lemma 2: 3/2")
    ax.set_xlabel("layer l")
    ax.set_ylabel(r"$E\,\|x_l\|^2 / d$ (dimensionless)")
    ax.legend(loc="upper left")
    return fig


def plot_theorem1(depths, pre, post, fits, batch_pre=None, batch_post=None):
    """Last-layer ||dL/dW2||_F against depth, log-log, with the fitted power laws.

    pre, post: one-position gradients; fits: {"pre": (slope, c), "post": (slope, c)};
    batch_pre, batch_post (optional): gradients of the batch-mean loss, drawn as open markers.
    """
    fig, ax = plt.subplots(figsize=(6.2, 3.8))
    L = np.asarray(depths, dtype=float)
    Lf = np.geomspace(L.min(), L.max(), 50)
    for key, vals, color, marker in (("pre", pre, PRE, "o"), ("post", post, POST, "s")):
        slope, c = fits[key]
        ax.plot(L, vals, marker, color=color, label=f"{_name(key == 'pre')}, measured")
        ax.plot(Lf, c * Lf ** slope, "-", color=color, lw=1.5, label=f"fit: $L^{{{slope:.2f}}}$")
    for vals, color, marker, name in ((batch_pre, PRE, "o", "Pre-LN"), (batch_post, POST, "s", "Post-LN")):
        if vals is not None:
            ax.plot(L, vals, marker, mfc="none", color=color, label=f"{name}, batch-mean loss")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(L)
    ax.set_xticklabels([str(int(v)) for v in L])
    ax.minorticks_off()
    ax.set_xlabel("number of layers L")
    ax.set_ylabel(r"$\|\partial \mathcal{L} / \partial W^{2,L}\|_F$ (nats per unit weight)")
    ax.legend(ncol=2, loc="lower left")
    return fig


def plot_fig3a(theory_pre, theory_post, lm_pre, lm_post):
    """Per-layer ||dL/dW1||_F at initialisation: the paper's (approximate), theory setting, our LM."""
    fig, axes = plt.subplots(1, 3, figsize=(9.5, 3.4), sharex=True)
    panels = (("Xiong et al. Fig. 3(a)\n(IWSLT, d=512; approximate)", PAPER_FIG3A["pre"], PAPER_FIG3A["post"]),
              ("theory setting\n(Gaussian inputs, d=64)", theory_pre, theory_post),
              ("our tiny LM at init\n(corpus, d=64)", lm_pre, lm_post))
    for ax, (title, pre, post) in zip(axes, panels):
        layers = np.arange(1, len(pre) + 1)
        ax.plot(layers, pre, "o-", color=PRE, label="Pre-LN")
        ax.plot(layers, post, "s--", color=POST, label="Post-LN")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel(r"$\|\nabla_{W^1}\mathcal{L}\|_F$")
    axes[0].legend()
    return fig


def plot_theory_grid(depth, width):
    """Explorable: per-layer ||dL/dW1|| and ||dL/dW2|| at init, Pre-LN vs Post-LN (stored data)."""
    grid = load_theory()["grid"]
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.4))
    for norm_first in (True, False):
        g = grid[f"{'pre' if norm_first else 'post'}/{depth}/{width}"]
        layers = np.arange(1, depth + 1)
        for ax, key in zip(axes, ("linear1.weight", "linear2.weight")):
            ax.plot(layers, g[key], "o-" if norm_first else "s--", ms=4,
                    color=PRE if norm_first else POST, label=_name(norm_first))
    for ax, w in zip(axes, ("W^1", "W^2")):
        ax.set_xlabel("layer l")
        ax.set_ylabel(rf"$\|\partial \mathcal{{L}}/\partial {w}_l\|_F$")
        ax.set_ylim(bottom=0)
    axes[0].legend()
    fig.suptitle(f"gradient norms at initialisation, L = {depth} layers, width d = {width}", fontsize=11)
    return fig


def alt_theory_grid(depth, width):
    grid = load_theory()["grid"]
    pre = grid[f"pre/{depth}/{width}"]["linear1.weight"]
    post = grid[f"post/{depth}/{width}"]["linear1.weight"]
    return (f"Two panels of gradient norms per layer at initialisation for a {depth}-layer stack of "
            f"width {width} in Xiong et al.'s theory setting. Pre-LN's W1 gradient goes from "
            f"{pre[0]:.2f} at layer 1 to {pre[-1]:.2f} at layer {depth}; Post-LN's from {post[0]:.2f} "
            f"to {post[-1]:.2f}, growing towards the output.")


# ---- training --------------------------------------------------------------------------------
def plot_training(depth, lr, seed=0):
    """Explorable: training loss of the four variants (Pre/Post-LN, with/without warm-up)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for norm_first in (True, False):
        for warm in (True, False):
            r = find_run(norm_first, depth, lr, 100 if warm else 0, seed)
            ax.plot(np.arange(1, len(r["train_loss"]) + 1), _smooth(r["train_loss"]),
                    **STYLE[(norm_first, warm)], lw=1.8,
                    label=f"{_name(norm_first)}, {'warm-up 100' if warm else 'no warm-up'}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/char, 10-step mean)")
    ax.set_ylim(0.8, 3.8)
    ax.set_title(f"L = {depth} layers, peak lr = {lr:g}, seed {seed}", fontsize=11)
    ax.legend(loc="upper right")
    return fig


def alt_training(depth, lr, seed=0):
    parts = []
    for norm_first in (True, False):
        for warm in (True, False):
            r = find_run(norm_first, depth, lr, 100 if warm else 0, seed)
            parts.append(f"{_name(norm_first)} {'with' if warm else 'without'} warm-up ends at "
                         f"{r['eval_loss'][-1]:.2f}")
    return (f"Training-loss curves over 300 steps of four {depth}-layer character models at peak "
            f"learning rate {lr:g}: " + "; ".join(parts) + " nats per character (held-out).")


def plot_early_updates(results):
    """The first Adam steps: update-to-weight ratio (mean over layers) and the fraction of weights
    that moved by more than lr(t)/2, per step, for results[(norm_first, warmup)] of
    :func:`preln.chapters.xiong.early_updates`."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.4), layout="constrained")
    for (norm_first, warmup), r in results.items():
        t = np.arange(1, len(r["lr"]) + 1)
        label = f"{_name(norm_first)}, {'warm-up ' + str(warmup) if warmup else 'no warm-up'}"
        ax1.plot(t, r["ratio"].mean(axis=1), **STYLE[(norm_first, warmup > 0)], marker="o", ms=3,
                 label=label)
        ax2.plot(t, 100 * r["sign_like"].mean(axis=1), **STYLE[(norm_first, warmup > 0)],
                 marker="o", ms=3, label=label)
    ax1.set_yscale("log")
    ax1.set_xlabel("Adam step t")
    ax1.set_ylabel("||W_t - W_(t-1)|| / ||W_(t-1)||\n(mean over layers)")
    ax2.set_xlabel("Adam step t")
    ax2.set_ylabel("% of weights moved by > lr(t)/2")
    ax2.set_ylim(-3, 103)
    ax1.legend(loc="lower left")
    return fig


def plot_final_loss():
    """Held-out loss after 300 steps against peak lr, one panel per depth (stored sweep)."""
    data = load_runs()
    grid = data["grid"]
    depths, lrs = sorted(grid["n_layers"]), grid["lr"]
    fig, axes = plt.subplots(1, len(depths), figsize=(8.5, 3.4), sharey=True)
    for ax, L in zip(np.atleast_1d(axes), depths):
        for norm_first in (True, False):
            for warm in (True, False):
                vals = [final_eval(norm_first, L, lr, 100 if warm else 0, tuple(grid["seed"])) for lr in lrs]
                ax.plot(lrs, vals, "o" if norm_first else "s", **STYLE[(norm_first, warm)],
                        label=f"{_name(norm_first)}, {'warm-up' if warm else 'no warm-up'}")
        ax.set_xscale("log")
        ax.set_xticks(lrs)
        ax.set_xticklabels([f"{v:g}" for v in lrs])
        ax.minorticks_off()
        ax.set_xlabel("peak learning rate")
        ax.set_title(f"L = {L} layers", fontsize=11)
    np.atleast_1d(axes)[0].set_ylabel("held-out loss after 300 steps\n(nats/char, mean of seeds)")
    np.atleast_1d(axes)[0].legend()
    return fig


EXPLORABLES = {
    "training_curves": (plot_training, {"depth": control("blocks in the trained stacks", [2, 6]),
                                        "lr": control("peak learning rate", [1e-3, 3e-3, 1e-2]),
                                        "seed": control("training seed", [0, 1])}),
    "gradients_at_init": (plot_theory_grid, {"depth": control("blocks in the stack at initialisation", [6, 12, 18, 24]),
                                            "width": control("model width d", [16, 32, 64])}),
}
ALTS = {"training_curves": alt_training, "gradients_at_init": alt_theory_grid}
