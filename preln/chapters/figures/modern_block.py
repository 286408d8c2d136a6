"""Figures and data helpers for "The modern block" (``book/modern_block.ipynb``) and its second part,
"The modern block in a language model" (``book/modern_block_lm.ipynb``: the experiment below).

What the chapter computes beyond the package itself, so that the notebook only imports, calls,
checks and plots:

- RoPE: the score of one query and one key placed at positions m and n, as a function of m - n
  (:func:`rope_scores`, the explorable :func:`plot_rope_scores` over theta and d_h) and the
  per-pair frequencies (:func:`plot_rope_frequencies`);
- GQA: the KV-cache bytes of a Llama block against n_kv_heads (:func:`kv_cache_bytes`, the
  explorable :func:`plot_kv_bytes` over the model width and the context length);
- the experiment: a small Llama-style LM and the book's Pre-LN GPT-style reference LM at equal
  parameter count, trained by one recipe (:data:`EXPERIMENT`, :func:`experiment_configs`,
  :func:`build_model`, :func:`train_run`); ``scripts/llama_vs_gpt.py`` stores the runs in
  ``preln/data/llama_vs_gpt/`` (:func:`load_runs`, :func:`load_weights`), and the second part plots
  them (:func:`plot_training_curves`) and re-runs a slice.

Every plot returns a :class:`matplotlib.figure.Figure` built without pyplot. ``EXPLORABLES``
registers the interactive figures for ``preln.chapters.figures.all_explorables``.
"""
from __future__ import annotations

import json

import numpy as np
from matplotlib.figure import Figure

from preln.models.llama_lm import LlamaLM, LlamaLMConfig
from preln.models.lm import LMConfig, TinyLM
from preln.ops import rope_forward
from preln.ops.rope import rope_frequencies
from preln.models.pretrained import RECIPE, round_params, split_ids, train_lm
from preln.resources import data_path
from preln.chapters.viz import PALETTE, control, legend_outside, series_colour, series_name
from preln.nb import set_alt, short_alt, sig
from preln.models.corpus import load_corpus

__all__ = [
    "rope_scores", "plot_rope_scores", "rope_scores_alt", "plot_rope_frequencies",
    "kv_cache_bytes", "plot_kv_bytes", "kv_bytes_alt", "EXPERIMENT", "MODELS", "experiment_configs",
    "build_model", "train_run", "round_like_reference", "load_runs", "load_weights", "runs_table",
    "plot_training_curves", "training_curves_alt", "ngram_perplexity", "loss_by_position",
    "plot_loss_by_position",
    "EXPLORABLES",
]

BLUE, VERMILLION, GREEN, ORANGE, SKY, PURPLE, BLACK, YELLOW = PALETTE


# ---- RoPE: the score against the offset -----------------------------------------------------------
def rope_scores(d_head=16, theta=10000.0, n=64, max_offset=64, seed=0):
    """The score <RoPE(q, m), RoPE(k, n')> / sqrt(d_h) of one fixed query and key, with the key at
    position n and the query at m = n + offset for offset = -max_offset .. max_offset (and the
    same pair shifted to n + 1000, to show that only m - n matters).

    Returns {"offset", "score" (key at n), "score_shifted" (key at n + 1000), "score_raw" (no
    rotation: the same at every offset)}."""
    rng = np.random.default_rng(seed)
    q = np.ones((1, 1, 1, d_head)) + 0.3 * rng.standard_normal((1, 1, 1, d_head))   # a query that
    k = q + 0.3 * rng.standard_normal((1, 1, 1, d_head))                             # matches its key
    offsets = np.arange(-max_offset, max_offset + 1)
    out = {"offset": offsets}
    for key, base in (("score", n + max_offset), ("score_shifted", n + max_offset + 1000)):
        qs = np.repeat(q, offsets.size, axis=2)                               # (1, 1, O, d_h)
        q_rot, _ = rope_forward(qs, base + offsets, theta)                    # query at m = n + offset
        k_rot, _ = rope_forward(k, np.array([base]), theta)                   # key at n
        out[key] = (q_rot[0, 0] @ k_rot[0, 0, 0]) / np.sqrt(d_head)
    out["score_raw"] = np.full(offsets.size, float(q.ravel() @ k.ravel()) / np.sqrt(d_head))
    return out


def plot_rope_scores(theta=10000.0, d_head=16) -> Figure:
    r = rope_scores(d_head, theta)
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    ax.plot(r["offset"], r["score_raw"], color=BLACK, ls=":", lw=1.5, label="no rotation")
    ax.plot(r["offset"], r["score"], color=BLUE, label="RoPE, key at position 128")
    ax.plot(r["offset"], r["score_shifted"], color=VERMILLION, ls="--", lw=1.5,
            label="RoPE, key at position 1128")
    ax.set_xlabel("offset t − t′ (query position − key position)")
    ax.set_ylabel(r"score $q\cdot k/\sqrt{d_h}$")
    ax.set_title(rf"$\theta$ = {theta:g}, $d_h$ = {d_head}", fontsize=10)
    legend_outside(ax)
    return fig


def rope_scores_alt(theta=10000.0, d_head=16) -> str:
    r = rope_scores(d_head, theta)
    s = r["score"]
    return (f"Line chart of the attention score of one query and one key against the offset, query position minus key position, "
            f"from -64 to 64, for RoPE base theta {theta:g} and head width {d_head}. Without rotation "
            f"the score is a flat dotted line at {r['score_raw'][0]:.2f}. With RoPE it peaks at "
            f"{s.max():.2f} at offset {int(r['offset'][s.argmax()])} and swings between {s.min():.2f} "
            f"and {s.max():.2f} as the offset grows; the dashed curve for the same pair moved 1000 "
            f"positions later lies on top of it: the score depends only on the offset.")


def plot_rope_frequencies(d_head=64, thetas=(10000.0, 500000.0)) -> Figure:
    """The wavelength 2 pi / w_i of each pair i, on a log scale: the first pairs turn every few
    positions, the last ones over tens of thousands."""
    fig = Figure(figsize=(5.8, 3.2))
    ax = fig.subplots()
    drawn = list(zip(thetas, ("solid", "dashed")))        # one line style each: two bases at most
    waves = {theta: 2 * np.pi / rope_frequencies(d_head, theta) for theta, _ in drawn}
    for (theta, wave), color, ls in zip(waves.items(), (BLUE, VERMILLION), ("-", "--")):
        ax.plot(np.arange(wave.size), wave, color=color, ls=ls, marker="o", ms=3, label=f"θ = {theta:g}")
    ax.set_yscale("log")
    ax.set_xlabel(r"pair $i$ (dimensions $i$ and $i + d_h/2$)")
    ax.set_ylabel(r"wavelength $2\pi/w_i$ (positions)")
    ax.set_title(f"$d_h$ = {d_head}", fontsize=10)
    ax.legend()
    n = d_head // 2
    alt = (f"Wavelength of each of the {n} RoPE pairs, log scale, d_h {d_head}: from {sig(waves[thetas[0]][0])} "
           f"positions at pair 0 to " + " and ".join(f"{_count(waves[t][-1])} (θ {t:g})" for t, _ in drawn) + ".")
    description = (f"Line chart, logarithmic vertical axis, of the wavelength 2π/w_i in positions of each of the {n} "
                   f"dimension pairs of a head {d_head} wide. " + " ".join(
                       f"For θ = {t:g} ({style}) it rises from {sig(waves[t][0])} positions at pair 0 to "
                       f"{_count(waves[t][-1])} at pair {n - 1}." for t, style in drawn)
                   + (" Every base starts at the same wavelength, 2π; a larger base rises more steeply."
                      if len(drawn) > 1 else ""))
    return set_alt(fig, alt, description)




def _count(x):
    """A large count in words, 2 significant figures: 47 thousand, 2.1 million."""
    for scale, word in ((1e9, " billion"), (1e6, " million"), (1e3, " thousand")):
        if x >= scale:
            return sig(x / scale) + word
    return sig(x)


# ---- GQA: KV-cache bytes ---------------------------------------------------------------------------
def kv_cache_bytes(d_model, n_heads, context, batch=1, n_layers=1, itemsize=2):
    """{n_kv_heads: bytes of the KV cache} for every divisor n_kv_heads of n_heads:
    n_layers * 2 * batch * context * n_kv_heads * d_h * itemsize, d_h = d_model / n_heads -- what
    :attr:`preln.LlamaKVCache.nbytes` is for one layer (the chapter checks the two agree)."""
    d_head = d_model // n_heads
    return {n_kv: n_layers * 2 * batch * context * n_kv * d_head * itemsize
            for n_kv in range(1, n_heads + 1) if n_heads % n_kv == 0}


#: the explorable's model: 32 layers, d_h = 128, float16 cache, one sequence (Llama-2-7B's shape
#: at D = 4096)
KV_LAYERS, KV_D_HEAD = 32, 128


def plot_kv_bytes(d_model=4096, context=4096) -> Figure:
    n_heads = d_model // KV_D_HEAD
    b = kv_cache_bytes(d_model, n_heads, context, n_layers=KV_LAYERS)
    fig = Figure(figsize=(6.0, 3.4))
    ax = fig.subplots()
    ks = sorted(b)
    gib = np.array([b[k] for k in ks]) / 2 ** 30
    ax.bar(range(len(ks)), gib, color=[VERMILLION if k == n_heads else BLUE for k in ks])
    for i, g in enumerate(gib):
        ax.text(i, g, f"{g:.2g}", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel(f"KV heads (of H = {n_heads}; {n_heads} = MHA, 1 = MQA)")
    ax.set_ylabel("KV cache (GiB)")
    ax.set_title(f"{KV_LAYERS} layers, D = {d_model}, $d_h$ = {KV_D_HEAD}, {context} positions, float16",
                 fontsize=9)
    return fig


def kv_bytes_alt(d_model=4096, context=4096) -> str:
    n_heads = d_model // KV_D_HEAD
    b = kv_cache_bytes(d_model, n_heads, context, n_layers=KV_LAYERS)
    return (f"Bar chart of the float16 KV cache of a {KV_LAYERS}-layer model with width {d_model} "
            f"({n_heads} query heads of 128 dimensions) for one sequence of {context} positions, one bar "
            f"per number of key/value heads: {b[n_heads] / 2**30:.3g} GiB for multi-head attention "
            f"({n_heads} key/value heads, highlighted) down to {b[1] / 2**30:.3g} GiB for multi-query "
            f"attention (1 head); the bytes fall in proportion to n_kv_heads.")


# ---- the experiment: a Llama-style LM against the reference LM ---------------------------------
#: the comparison: the reference LM's recipe (preln.models.pretrained.RECIPE) for every model and seed,
#: the held-out loss every ``eval_every`` steps on ``eval_windows`` windows of 64, and the
#: longer contexts the RoPE models are evaluated at after training on 64
EXPERIMENT = dict(recipe=dict(RECIPE), seeds=(0, 1, 2, 3, 4), eval_every=25, eval_windows=32,
                  long_contexts=(128, 256))
#: model name -> what it is; "gpt" is preln.models.pretrained's reference LM
MODELS = {
    "gpt": "Pre-LN GPT-style (LayerNorm, GELU MLP, learned positions, biases)",
    "llama": "Llama-style, MHA (RMSNorm, SwiGLU, RoPE, no biases; Hₖᵥ = H = 2)",
    "llama_mqa": "Llama-style, MQA (as llama with Hₖᵥ = 1, a wider SwiGLU)",
}


def _llama_params(cfg):
    """LlamaLM's parameter count from its config (embedding, blocks, final norm, head)."""
    D, dh = cfg.d_model, cfg.d_model // cfg.n_heads
    block = 2 * D + 2 * D * cfg.n_heads * dh + 2 * D * cfg.n_kv_heads * dh + 3 * D * cfg.d_ff
    return 2 * cfg.vocab_size * D + D + cfg.n_layers * block


def experiment_configs(vocab_size):
    """{name: config}: the reference LM's LMConfig, and LlamaLMConfigs of the same D, H and L whose
    SwiGLU width F is the one that brings the parameter count closest to the reference's."""
    r = RECIPE
    gpt = LMConfig(vocab_size=vocab_size, max_len=r["seq_len"], d_model=r["d_model"], n_heads=r["n_heads"],
                   d_ff=r["d_ff"], n_layers=r["n_layers"], norm_first=True, activation=r["activation"])
    target = TinyLM(gpt).num_params()
    out = {"gpt": gpt}
    for name, n_kv in (("llama", r["n_heads"]), ("llama_mqa", 1)):
        base = LlamaLMConfig(vocab_size=vocab_size, d_model=r["d_model"], n_heads=r["n_heads"],
                             n_kv_heads=n_kv, d_ff=1, n_layers=r["n_layers"])
        per_f = _llama_params(base._replace(d_ff=2)) - _llama_params(base)
        f = int(round((target - _llama_params(base)) / per_f)) + 1
        out[name] = base._replace(d_ff=f)
    return out


def build_model(name, vocab_size, seed):
    cfg = experiment_configs(vocab_size)[name]
    family = TinyLM if name == "gpt" else LlamaLM
    return family(cfg, dtype=np.float64, seed=seed)


def round_like_reference(model):
    """What preln.models.pretrained does after training (round_params: a TinyLM's key biases set to
    0, every parameter rounded to float32), then the gradients cleared and eval mode, as stored."""
    round_params(model)
    model.zero_grad()
    return model.eval()


def train_run(name, seed, steps=None):
    """Train one model of the experiment -> (model, log); ``steps`` shortens the recipe (the
    chapter's re-run of a slice). The model comes back rounded as the reference LM's is."""
    _, vocab, ids = load_corpus()
    train_ids, val_ids = split_ids(ids)
    recipe = dict(EXPERIMENT["recipe"])
    if steps is not None:
        recipe["steps"] = int(steps)
    model = build_model(name, len(vocab), seed)
    log = train_lm(model, train_ids, recipe, seed, val_ids, EXPERIMENT["eval_every"],
                   EXPERIMENT["eval_windows"])
    return round_like_reference(model), log


def load_runs():
    """The stored experiment (preln/data/llama_vs_gpt/runs.json, see preln/data/README.md)."""
    return json.loads(data_path("llama_vs_gpt", "runs.json").read_text())


def load_weights(name, vocab_size):
    """The stored float32 weights of seed 0 of ``name`` in a fresh model (eval mode)."""
    model = build_model(name, vocab_size, 0)
    with np.load(data_path("llama_vs_gpt", "weights_seed0.npz")) as z:
        for k, p in model.params.items():
            p[...] = z[f"{name}/{k}"]
    return model.eval()


def runs_table(runs):
    """{name: {"params", "ppl" (per seed), "mean", "std", "long" {context: per seed}}}."""
    out = {}
    for name, entry in runs["models"].items():
        ppl = np.array([r["val_ppl"] for r in entry["runs"]])
        row = {"params": entry["params"], "ppl": ppl, "mean": float(ppl.mean()), "std": float(ppl.std(ddof=1))}
        if "long_ppl" in entry["runs"][0]:
            row["long"] = {int(c): np.array([r["long_ppl"][c] for r in entry["runs"]])
                           for c in entry["runs"][0]["long_ppl"]}
        out[name] = row
    return out


def _smooth(y, k):
    y = np.asarray(y, np.float64)
    if k <= 1:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    return (c[k:] - c[:-k]) / k


LABELS = {"gpt": "GPT-style (Pre-LN)", "llama": "Llama-style", "llama_mqa": "Llama-style, MQA"}
# each model in its colour (viz.MODEL_COLOURS): GPT-style blue (it is the Pre-LN block), Llama-style
# reddish purple, Llama-style MQA green (dashed: it lies on the Llama-style curve)
_STYLES = {"gpt": (series_colour("GPT-style"), "-"), "llama": (series_colour("Llama-style"), "-"),
           "llama_mqa": (series_colour("Llama-style, MQA"), "--")}


def plot_training_curves(window=25) -> Figure:
    """The stored experiment. Left: training loss per step, a ``window``-step running mean, one
    line per seed. Right: held-out perplexity every 25 steps, the mean over seeds (markers) and
    each seed (faint)."""
    runs = load_runs()
    fig = Figure(figsize=(7.6, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    for name, entry in runs["models"].items():
        color, ls = _STYLES[name]
        for i, r in enumerate(entry["runs"]):
            y = _smooth(r["train_loss"], window)
            ax1.plot(np.arange(y.size) + window, y, color=color, ls=ls, lw=1.0, alpha=0.6,
                     label=LABELS[name] if i == 0 else None)
        steps = np.array(entry["runs"][0]["val_steps"])
        ppl = np.exp(np.array([r["val_loss"] for r in entry["runs"]]))          # (seeds, points)
        for row in ppl:
            ax2.plot(steps, row, color=color, ls=ls, lw=0.6, alpha=0.35)
        ax2.plot(steps, ppl.mean(0), color=color, ls=ls, marker="o", ms=3, label=LABELS[name])
    ax1.set_xlabel("step")
    ax1.set_ylabel(f"training loss (nats/char, {window}-step mean)" if window > 1 else
                   "training loss (nats/char)")
    ax1.set_ylim(0.4, 3.4)
    ax2.set_xlabel("step")
    ax2.set_ylabel("held-out perplexity")
    ax2.set_yscale("log")
    ticks = [2, 3, 4, 6, 10, 20, 40]
    ax2.set_yticks(ticks, [str(t) for t in ticks])
    ax2.minorticks_off()
    ax1.legend()
    ax2.legend()
    fig.suptitle("One recipe, equal parameter counts, five seeds each", fontsize=11)
    return fig


def training_curves_alt(window=25) -> str:
    runs = load_runs()
    parts = []
    for name, entry in runs["models"].items():
        steps = np.array(entry["runs"][0]["val_steps"])
        ppl = np.exp(np.array([r["val_loss"] for r in entry["runs"]])).mean(0)
        i150 = int(np.flatnonzero(steps == 150)[0])
        last = np.mean([np.mean(r["train_loss"][-50:]) for r in entry["runs"]])
        parts.append(f"{LABELS[name]}: held-out perplexity {ppl[i150]:.1f} at step 150 and {ppl[-1]:.2f} at "
                     f"step {steps[-1]}, training loss {last:.2f} over the last 50 steps")
    smooth = f"a {window}-step running mean" if window > 1 else "unsmoothed"
    return ("Two line charts over 500 training steps of three character language models of about "
            f"29 thousand parameters, five seeds each. Left, the training loss ({smooth}); right, "
            "the held-out perplexity every 25 steps on a log scale, mean over seeds with each seed "
            "faint. The GPT-style model (blue) sits on a plateau between steps 50 and 200 that "
            "both Llama-style models (reddish purple, and green dashed for MQA) leave earlier; the two "
            "Llama-style curves lie on top of each other. " + "; ".join(parts) + ".")


def ngram_perplexity(train_ids, val_ids, n, vocab_size, alpha=0.01):
    """Held-out perplexity of a character n-gram model (n = 1, 2, 3) counted on ``train_ids`` with
    add-``alpha`` smoothing: the yardsticks "letter frequencies" (n = 1), "one character of
    context" (2) and "two characters" (3) for the language models' curves."""
    if n not in (1, 2, 3):
        raise ValueError(f"n: expected 1, 2 or 3; got {n!r}")
    counts = np.full((vocab_size,) * n, alpha)
    np.add.at(counts, tuple(train_ids[i:train_ids.size - n + 1 + i] for i in range(n)), 1.0)
    p = counts / counts.sum(-1, keepdims=True)
    logp = np.log(p[tuple(val_ids[i:val_ids.size - n + 1 + i] for i in range(n))])
    return float(np.exp(-logp.mean()))


def loss_by_position(model, ids, seq_len, max_windows=None):
    """Held-out cross-entropy at each position 0 .. seq_len - 1 of non-overlapping windows of
    ``ids`` (position t is predicted from t + 1 tokens of context): (seq_len,) nats."""
    n = (ids.size - 1) // seq_len
    n = n if max_windows is None else min(n, max_windows)
    windows = ids[np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)]    # (n, S + 1)
    logits = np.asarray(model(windows[:, :-1]), np.float64)                    # (n, S, V)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, windows[:, 1:, None], -1)[..., 0]         # (n, S)
    return nll.mean(0)


def plot_loss_by_position(curves, trained_len=64) -> Figure:
    """curves: {label: (seq_len,) nats}, drawn as 4-position running means; the trained context
    length is marked."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    k = 4                                                        # a 4-position running mean
    # a model's curve in the model's colour (viz.MODEL_COLOURS); variants of one model (RoPE
    # scalings) in colours no model of the book uses, so no curve borrows another model's colour
    variants = iter([(PALETTE[3], "-"), (PALETTE[4], "--"), (PALETTE[6], "-."), (PALETTE[7], ":")])
    for label, y in curves.items():
        color, ls = (series_colour(label), "-") if series_name(label) else next(variants)
        ax.plot(np.arange(y.size - k + 1) + (k - 1) / 2, _smooth(y, k), color=color, ls=ls, label=label)
    ax.axvline(trained_len - 0.5, color=BLACK, ls=":", lw=1.2)
    ax.text(trained_len + 2, ax.get_ylim()[1] * 0.95, f"trained on {trained_len} positions",
            fontsize=9, va="top")
    ax.set_yscale("log")
    ticks = [0.5, 1, 2, 4, 8]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("position in the window (context = position + 1 characters)")
    ax.set_ylabel("held-out loss (nats/char)")
    legend_outside(ax)
    # the words: each curve's mean loss inside the trained range (from position 8: the first
    # positions have almost no context) and, for longer curves, beyond it and beyond twice it
    L = trained_len

    def means(y):
        return [(a, b, y[a:b].mean()) for a, b in ((8, L), (L, 2 * L), (2 * L, None)) if y.size > a]

    alt = (f"Loss by position (trained on {L}), mean nats to {L - 1}, from {2 * L}: "
           + ", ".join(f"{label} ({', '.join(sig(m, zeros=True) for a, _, m in means(y) if a != L)})"
                       for label, y in curves.items()) + ".")
    last = max(y.size for y in curves.values()) - 1
    description = (
        f"Line chart, logarithmic vertical axis, of the held-out loss in nats per character against the "
        f"position in the window, from 0 to {last}, as 4-position running means, with a dotted line at "
        f"position {L}, the trained context length. " + " ".join(
            f"{label[:1].upper() + label[1:]} (positions 0 to {y.size - 1}): {sig(y[0], zeros=True)} nats at position 0, "
            "with no context; mean " + ", ".join(f"{sig(m, zeros=True)} at positions {a} to {min(b or y.size, y.size) - 1}"
                                                 for a, b, m in means(y))
            + (f"; the running mean stays between {sig(_smooth(y, k)[7:].min(), zeros=True)} and "
               f"{sig(_smooth(y, k)[7:].max(), zeros=True)} from position 8 on." if y.size > 8 + k else ".")
            for label, y in curves.items()))
    return set_alt(fig, short_alt(alt), description)


EXPLORABLES = {
    "training_curves": (plot_training_curves, {"window": control("smoothing window (steps)", [1, 25, 100])}),
    "rope_scores": (plot_rope_scores, {"theta": control("RoPE base theta", [100.0, 1000.0, 10000.0, 500000.0]),
                                       "d_head": control("head width d_head", [8, 16, 64])}),
    "kv_bytes": (plot_kv_bytes, {"d_model": control("model width d_model", [2048, 4096, 8192]),
                                 "context": control("context length (tokens)", [1024, 4096, 32768])}),
}
