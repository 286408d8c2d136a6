"""Figures of the Pre-LN vs Post-LN chapter (book/preln_vs_postln.ipynb).

Plain figures take the numbers they plot as arguments; the explorables in ``EXPLORABLES`` take only
their control values and read the stored sweep (preln/data/preln_vs_postln/, written by
scripts/sweep_preln_postln.py), so each frame is a lookup plus a plot.
"""
import functools
import json

import matplotlib.pyplot as plt
import numpy as np

from preln.chapters.viz import COLUMN_IN, control, direct_labels, legend_outside, series_colour
from preln.chapters.xiong import DATA_DIR, PAPER_FIG3A, fit_exponent, lemma2_bounds
from preln.nb import fixed, listed, set_alt, short_alt, sig

SWEEP_DIR = DATA_DIR / "preln_vs_postln"
PRE, POST = series_colour("Pre-LN"), series_colour("Post-LN")   # blue, vermillion
STYLE = {(True, True): dict(color=PRE, ls="-"), (True, False): dict(color=PRE, ls="--"),
         (False, True): dict(color=POST, ls="-"), (False, False): dict(color=POST, ls="--")}


def _name(norm_first):
    return "Pre-LN" if norm_first else "Post-LN"


def _variant(norm_first, warmup):
    return f"{_name(norm_first)} {'with' if warmup else 'without'} warm-up"




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
    ax.set_xlabel("layer $l$")
    ax.set_ylabel(r"$E\,\|x_l\|^2 / d$")
    ax.legend(loc="upper left")
    # a Monte-Carlo estimate: "inside the band" allows 5 % sampling error, as the chapter's check does
    inside = np.all((pre >= 0.95 * lo) & (pre <= 1.05 * hi))
    band = "inside Lemma 2's band" if inside else "partly outside Lemma 2's band"
    near = np.allclose(post, 1.5, rtol=0.15)
    post_words = (f"stays near 3/2 ({sig(np.min(post))} to {sig(np.max(post))})" if near
                  else f"goes from {sig(post[0])} to {sig(post[-1])}")
    alt = (f"E‖x_l‖²/d against layer 0 to {len(pre) - 1}: Pre-LN {'rises' if pre[-1] > pre[0] else 'falls'} "
           f"from {sig(pre[0])} to {sig(pre[-1])}, {band}; Post-LN {post_words}.")
    description = (f"Expected squared norm of the residual stream divided by d, against the layer index l from 0 to "
                   f"{len(pre) - 1}. The Pre-LN points (blue circles) go from {sig(pre[0])} to {sig(pre[-1])}, "
                   f"{sig(np.polyfit(l, pre, 1)[0])} per layer on a straight-line fit, {band} between 1 + l/2 and "
                   f"1 + 3l/2 (shaded; points within 5 % of it count as inside). The Post-LN points (vermillion "
                   f"squares, layers 1 to {len(post)}) lie between {sig(np.min(post))} and {sig(np.max(post))}, "
                   f"mean {sig(np.mean(post))}, against the dotted line at Lemma 2's 3/2.")
    return set_alt(fig, short_alt(alt), description)


def _exponent(k):
    """A fitted exponent as the figure says it: two decimals with the Unicode minus, and a slope
    that rounds to zero as 0 (never "−0.00")."""
    words = fixed(k)
    return "0" if float(words.replace("−", "-")) == 0 else words


def _power_law(k):
    """The fitted law's label, typeset: $\\propto L^{-0.57}$, or "flat, $\\propto L^0$"."""
    e = _exponent(k)
    return "flat, $\\propto L^{0}$" if e == "0" else f"$\\propto L^{{{e.replace('−', '-')}}}$"


def plot_theorem1(depths, pre, post, fits, batch_pre=None, batch_post=None):
    """Last-layer ||dL/dW2||_F against depth, log-log, with the fitted power laws.

    pre, post: one-position gradients; fits: {"pre": (slope, c), "post": (slope, c)};
    batch_pre, batch_post (optional): gradients of the batch-mean loss, drawn as open markers.
    """
    fig, ax = plt.subplots(figsize=(6.2, 4.6))
    L = np.asarray(depths, dtype=float)
    Lf = np.geomspace(L.min(), L.max(), 50)
    for key, vals, color, marker in (("pre", pre, PRE, "o"), ("post", post, POST, "s")):
        slope, c = fits[key]
        ax.plot(L, vals, marker, color=color, label=f"{_name(key == 'pre')}, one position")
        ax.plot(Lf, c * Lf ** slope, "-", color=color, lw=1.5,
                label=f"{_name(key == 'pre')} fit: {_power_law(slope)}")
    for vals, color, marker, name in ((batch_pre, PRE, "o", "Pre-LN"), (batch_post, POST, "s", "Post-LN")):
        if vals is not None:
            ax.plot(L, vals, marker, mfc="none", color=color, label=f"{name}, batch-mean loss")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(L)
    ax.set_xticklabels([str(int(v)) for v in L])
    ax.minorticks_off()
    ax.set_xlabel("number of layers $L$")
    ax.set_ylabel(r"$\|\partial \mathcal{L} / \partial W_2^{(L)}\|_F$ (nats per unit weight)")
    legend_outside(ax)

    def trend(vals, k):
        verb = "stays level" if abs(k) < 0.1 else "falls" if k < 0 else "grows"
        return f"{verb} as L^{_exponent(k)} ({sig(vals[0])} to {sig(vals[-1])})"

    span = f"L = {int(L.min())} to {int(L.max())}"
    alt = (f"Last-layer W2 gradient norm against depth {span}: Pre-LN {trend(pre, fits['pre'][0])}; "
           f"Post-LN {trend(post, fits['post'][0])}.")
    description = (f"Log-log plot of the last layer's W2 gradient norm ‖∂L/∂W2‖_F against the number of layers "
                   f"{span}, with fitted power laws (lines). For the loss of one position (filled markers), Pre-LN "
                   f"{trend(pre, fits['pre'][0])}, and Post-LN {trend(post, fits['post'][0])}; Theorem 1's "
                   "exponents are −0.5 and 0.")
    # the batch-mean gradients against the one-position ones: their exponent and the sample's
    batch = [(name, vals, fit_exponent(L, vals)[0], fits[key][0])
             for name, vals, key in (("Pre-LN", batch_pre, "pre"), ("Post-LN", batch_post, "post")) if vals is not None]
    if batch:
        description += " Open markers, the gradient of the batch-mean loss: " + "; ".join(
            f"{name} from {sig(vals[0])} to {sig(vals[-1])}, exponent {_exponent(k)}, "
            f"{'above' if k > k_one else 'below'} the one-position {_exponent(k_one)}"
            for name, vals, k, k_one in batch) + "."
    return set_alt(fig, short_alt(alt), description)


def plot_fig3a(theory_pre, theory_post, lm_pre, lm_post):
    """Per-layer ||dL/dW1||_F at initialisation: the paper's (approximate), theory setting, our LM."""
    # three panels stacked at the column's width, one x axis: the layer
    fig, axes = plt.subplots(3, 1, figsize=(COLUMN_IN - 0.2, 8.2),
                             layout="constrained")
    panels = (("Xiong et al. Fig. 3(a): IWSLT, $d = 512$ (approximate)", PAPER_FIG3A["pre"], PAPER_FIG3A["post"]),
              ("theory setting: Gaussian inputs, $d = 64$", theory_pre, theory_post),
              ("our tiny LM at initialisation: corpus, $d = 64$", lm_pre, lm_post))
    for ax, (title, pre, post) in zip(axes, panels):
        layers = np.arange(1, len(pre) + 1)
        ax.plot(layers, pre, "o-", color=PRE, label="Pre-LN")
        ax.plot(layers, post, "s--", color=POST, label="Post-LN")
        ax.set_title(title, fontsize=11)
        ax.set_ylim(bottom=0)
        ax.set_xlim(0.7, len(pre) + 1.4)      # room for the direct labels
        ax.set_xlabel("layer")
        direct_labels(ax)
    axes[1].set_ylabel(r"$\|\nabla_{W^1}\mathcal{L}\|_F$")
    names = ("Xiong et al.'s Figure 3(a), read off the paper (IWSLT, d = 512; approximate)",
             "the theory setting (Gaussian inputs, d = 64)",
             "our tiny language model at initialisation (corpus, d = 64)")
    ratios = [(last_over_first(pre), last_over_first(post)) for _, pre, post in panels]
    alt = (f"W1 gradient norm per layer at init, paper / theory / our LM: last layer over first "
           f"{', '.join(sig(r[1]) for r in ratios)} for Post-LN; {', '.join(sig(r[0]) for r in ratios)} for Pre-LN.")
    description = (f"Three panels, one above another, of the W1 gradient norm ‖∇W1 L‖_F per layer at initialisation, layers 1 to "
                   f"{len(theory_pre)}. " + " ".join(
                       f"{where[0].upper() + where[1:]}: Pre-LN from {sig(pre[0])} at layer 1 to {sig(pre[-1])} "
                       f"at layer {len(pre)} ({sig(r_pre)} times), Post-LN from {sig(post[0])} to {sig(post[-1])} "
                       f"({sig(r_post)} times)."
                       for where, (_, pre, post), (r_pre, r_post) in zip(names, panels, ratios)))
    return set_alt(fig, short_alt(alt), description)


def plot_theory_grid(depth, width):
    """Explorable: per-layer ||dL/dW1|| and ||dL/dW2|| at init, Pre-LN vs Post-LN (stored data)."""
    grid = load_theory()["grid"]
    # two panels stacked at the column's width (W1 above W2), one x axis: the layer
    fig, axes = plt.subplots(2, 1, figsize=(COLUMN_IN, 6.4))
    for norm_first in (True, False):
        g = grid[f"{'pre' if norm_first else 'post'}/{depth}/{width}"]
        layers = np.arange(1, depth + 1)
        for ax, key in zip(axes, ("linear1.weight", "linear2.weight")):
            ax.plot(layers, g[key], "o-" if norm_first else "s--", ms=4,
                    color=PRE if norm_first else POST, label=_name(norm_first))
    for ax, w in zip(axes, ("W^1", "W^2")):
        ax.set_ylabel(rf"$\|\partial \mathcal{{L}}/\partial {w}_l\|_F$")
        ax.set_ylim(bottom=0)
        ax.set_xlim(0.5, depth + 0.25 * depth + 1)     # room for the direct labels
        ax.set_xlabel("layer $l$")
        direct_labels(ax)
    fig.suptitle(f"gradient norms at initialisation, $L = {depth}$ layers, width $d = {width}$", fontsize=11)
    return fig


def alt_theory_grid(depth, width):
    grid = load_theory()["grid"]
    pre = grid[f"pre/{depth}/{width}"]["linear1.weight"]
    post = grid[f"post/{depth}/{width}"]["linear1.weight"]
    return (f"Two panels, one above the other, of gradient norms per layer at initialisation for a {depth}-layer stack of "
            f"width {width} in Xiong et al.'s theory setting. Pre-LN's W1 gradient goes from "
            f"{pre[0]:.2f} at layer 1 to {pre[-1]:.2f} at layer {depth}; Post-LN's from {post[0]:.2f} "
            f"to {post[-1]:.2f}, growing towards the output.")


# ---- training --------------------------------------------------------------------------------
def plot_training(depth, lr, seed=0):
    """Explorable: training loss of the four variants (Pre/Post-LN, with/without warm-up)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for norm_first in (True, False):
        for warm in (True, False):
            r = find_run(norm_first, depth, lr, 100 if warm else 0, seed)
            ax.plot(np.arange(1, len(r["train_loss"]) + 1), _smooth(r["train_loss"]),
                    **STYLE[(norm_first, warm)], lw=1.8,
                    label=f"{_name(norm_first)}, {'warm-up 100' if warm else 'no warm-up'}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/char, 10-step mean)")
    ax.set_ylim(0.8, 3.8)
    ax.set_title(f"$L = {depth}$ layers, peak lr {lr:g}, seed {seed}", fontsize=11)
    legend_outside(ax)
    ends = {}                        # variant -> (run, its plotted curve)
    for norm_first in (True, False):
        for warm in (True, False):
            r = find_run(norm_first, depth, lr, 100 if warm else 0, seed)
            ends[_variant(norm_first, warm)] = (r, _smooth(r["train_loss"]))
    steps = len(next(iter(ends.values()))[1])
    high, low = (f(ends, key=lambda k: ends[k][1][-1]) for f in (max, min))
    alt = (f"Training loss of four {depth}-layer models, peak lr {lr:g}, {steps} steps: {high} ends highest, at "
           f"{sig(ends[high][1][-1])}; {low} lowest, at {sig(ends[low][1][-1])}.")
    third = steps // 3
    description = (f"Training loss (nats per character, 10-step mean) over {steps} steps of four {depth}-layer "
                   f"character models at peak learning rate {lr:g}, seed {seed}; blue: Pre-LN, vermillion: "
                   "Post-LN, solid: with 100 warm-up steps, dashed: without. " + " ".join(
                       f"{name}: {sig(curve[third - 1])} at step {third}, {sig(curve[-1])} at step {steps} "
                       f"(held-out {r['eval_loss'][-1]:.2f})." for name, (r, curve) in ends.items()))
    return set_alt(fig, short_alt(alt), description)


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
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(COLUMN_IN - 0.2, 4.2), layout="constrained")
    for (norm_first, warmup), r in results.items():
        t = np.arange(1, len(r["lr"]) + 1)
        label = f"{_name(norm_first)}, {'warm-up ' + str(warmup) if warmup else 'no warm-up'}"
        ax1.plot(t, r["ratio"].mean(axis=1), **STYLE[(norm_first, warmup > 0)], marker="o", ms=3,
                 label=label)
        ax2.plot(t, 100 * r["sign_like"].mean(axis=1), **STYLE[(norm_first, warmup > 0)],
                 marker="o", ms=3, label=label)
    ax1.set_yscale("log")
    ax1.set_xlabel("Adam step $t$")
    ax1.set_ylabel("$\\|W_t - W_{t-1}\\| / \\|W_{t-1}\\|$\n(mean over layers)")
    ax2.set_xlabel("Adam step $t$")
    ax2.set_ylabel("% of weights moved by > $\\eta_t/2$")
    ax2.set_ylim(-3, 103)
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2)
    steps = len(next(iter(results.values()))["lr"])
    first = {}                       # warm-up -> the update-to-weight ratio at step 1 (%), per stack
    for (norm_first, warmup), r in results.items():
        first.setdefault(warmup, []).append(100 * r["ratio"][0].mean())
    # Adam's first step is about lr per weight whatever the gradient: the same for both stacks
    alike = all(max(v) < 1.05 * min(v) for v in first.values()) and all(len(v) > 1 for v in first.values())
    alt = (f"First {steps} Adam steps: the update-to-weight ratio starts at " + " and ".join(
        f"{sig(np.mean(v))} % {'with ' + str(wu) + ' warm-up steps' if wu else 'without warm-up'}"
        for wu, v in sorted(first.items())) + (", for Pre-LN and Post-LN alike." if alike else "."))
    marks = sorted({1, max(1, steps // 2), steps})

    def reading(key, curve):
        return f"{_variant(*key)}{' ' + str(key[1]) if key[1] else ''}: " + ", ".join(
            f"{sig(curve[t - 1])} % at step {t}" for t in marks)

    description = (f"Two panels over the first {steps} Adam steps. Left, on a log axis, the update-to-weight ratio "
                   "‖W_t − W_(t−1)‖ / ‖W_(t−1)‖ averaged over layers: " + "; ".join(
                       reading(key, 100 * r["ratio"].mean(axis=1)) for key, r in results.items())
                   + ". Right, the percentage of weights that moved by more than half the step's learning rate: "
                   + "; ".join(reading(key, 100 * r["sign_like"].mean(axis=1)) for key, r in results.items()) + ".")
    return set_alt(fig, short_alt(alt), description)


def plot_final_loss():
    """Held-out loss after 300 steps against peak lr, one panel per depth (stored sweep)."""
    data = load_runs()
    grid = data["grid"]
    depths, lrs = sorted(grid["n_layers"]), grid["lr"]
    # at the column's width: the variants named where they end in the last panel, the deepest
    # stack's, where they lie apart (the same line styles in every panel)
    fig, axes = plt.subplots(1, len(depths), figsize=(COLUMN_IN - 0.2, 3.6), sharey=True,
                             layout="constrained")
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
        ax.set_title(f"$L = {L}$ layers", fontsize=11)
    np.atleast_1d(axes)[0].set_ylabel("held-out loss after 300 steps\n(nats/char, mean of seeds)")
    direct_labels(np.atleast_1d(axes)[-1], gap_pt=13.0)
    seeds, steps = tuple(grid["seed"]), data["fixed"]["steps"]
    final = {(L, nf, warm): [final_eval(nf, L, lr, 100 if warm else 0, seeds) for lr in lrs]
             for L in depths for nf in (True, False) for warm in (True, False)}
    # the hardest setting, the deepest stack at the largest lr, is where the variants part
    hard = {key[1:]: v[int(np.argmax(lrs))] for key, v in final.items() if key[0] == max(depths)}
    alt = (f"Held-out loss after {steps} steps against peak lr: at {max(depths)} layers and lr {max(lrs):g} Post-LN "
           f"ends at {hard[False, False]:.2f} without warm-up, {hard[False, True]:.2f} with; Pre-LN at "
           f"{hard[True, False]:.2f} and {hard[True, True]:.2f}.")
    at_low = [v[int(np.argmin(lrs))] for v in final.values()]
    description = (f"{len(depths)} panels, " + listed(f"{L} layers" for L in depths) + ", of the held-out loss "
                   f"after {steps} steps (nats per character, mean of {len(seeds)} seeds) against peak learning "
                   "rate, for Pre-LN (blue circles) and Post-LN (vermillion squares), with warm-up (solid) and "
                   f"without (dashed). At {min(lrs):g} all lie between {min(at_low):.2f} and {max(at_low):.2f}. "
                   + " ".join(f"At {L} layers, for lr " + ", ".join(f"{lr:g}" for lr in lrs) + ": " + "; ".join(
                       f"{_variant(nf, warm)} " + ", ".join(f"{v:.2f}" for v in final[L, nf, warm])
                       for nf in (True, False) for warm in (True, False)) + "." for L in depths))
    return set_alt(fig, short_alt(alt), description)


EXPLORABLES = {
    "training_curves": (plot_training, {"depth": control("blocks in the trained stacks", [2, 6]),
                                        "lr": control("peak learning rate", [1e-3, 3e-3, 1e-2]),
                                        "seed": control("training seed", [0, 1])}),
    "gradients_at_init": (plot_theory_grid, {"depth": control("blocks in the stack at initialisation", [6, 12, 18, 24]),
                                            "width": control("model width d", [16, 32, 64])}),
}
ALTS = {"training_curves": alt_training, "gradients_at_init": alt_theory_grid}
