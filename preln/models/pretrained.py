"""The book's trained tiny language model: one recipe, trained on demand, memoised in-process.

    lm, vocab, val_ids = reference_lm()                    # Pre-LN, causal, float64, eval mode
    lm, vocab, val_ids = reference_lm(norm_first=False)    # the Post-LN variant, same recipe
    ppl = perplexity(lm, val_ids)                          # exp(mean cross-entropy) on held-out text
    log = reference_lm_log()                               # the training curve and the recipe

The model is a :class:`preln.models.lm.TinyLM` (2 layers, D = 32, H = 2, F = 128, exact GELU, untied
head, Xavier initialisation as in Xiong et al. 2020, arXiv 2002.04745) trained on the first 90 %
of ``preln/data/corpus.txt`` (the synthetic grammar corpus, see preln/data/README.md) for :data:`RECIPE`'s
``steps`` Adam steps (Kingma & Ba 2015, arXiv 1412.6980; betas 0.9, 0.98) with a linear warm-up
and global-norm clipping. ``val_ids`` are the last 10 % of the corpus, never trained on.

Deterministic: the initialisation and the order of batches depend only on ``seed``. After training
(:func:`round_params`) the parameters are rounded to float32 (and stored in float64) and the key bias, whose gradient is
exactly zero, is set to 0: training sums differ by round-off between BLAS kernels, and rounding
removes that difference, so the stored outputs of the chapters
that use this model are the same on every CPU (tests/test_pretrained.py checks the recipe).

Each call returns a fresh copy (callers may modify it, e.g. inject outliers); the training itself
runs once per process and recipe (about 15 s on one BLAS thread).
"""
import copy

import numpy as np

from preln.validation import nonnegative_int, positive_int

from preln.models.lm import LMConfig, TinyLM, batches, cross_entropy_forward
from preln.models.optim import Adam, fit
from preln.models.corpus import load_corpus

__all__ = ["RECIPE", "reference_lm", "reference_lm_log", "train_lm", "mean_nll", "perplexity",
           "held_out_loss", "split_ids", "round_params"]

# The training recipe: small enough to train in seconds on one core, long enough that the model
# has learnt the corpus's words (held-out perplexity near 2 characters, from 26 at initialisation).
RECIPE = dict(n_layers=2, d_model=32, n_heads=2, d_ff=128, seq_len=64, batch_size=16,
              steps=500, lr=3e-3, warmup=50, clip=1.0, activation="gelu")

_MEMO = {}   # (norm_first, seed) -> (lm, vocab, val_ids, log)


def split_ids(ids):
    """The chapters' split of the corpus: the first 90 % to train on, the last 10 % held out."""
    n = int(0.9 * len(ids))
    return ids[:n], ids[n:]


def _train(norm_first, seed):
    r = RECIPE
    _, vocab, ids = load_corpus()
    train_ids, val_ids = split_ids(ids)
    cfg = LMConfig(vocab_size=len(vocab), max_len=r["seq_len"], d_model=r["d_model"],
                   n_heads=r["n_heads"], d_ff=r["d_ff"], n_layers=r["n_layers"],
                   norm_first=norm_first, activation=r["activation"])
    lm = TinyLM(cfg, dtype=np.float64, seed=seed)
    log = train_lm(lm, train_ids, r, seed)
    round_params(lm)
    lm.zero_grad()
    lm.eval()
    log = {"recipe": dict(r, norm_first=norm_first, seed=seed), "train_loss": log["train_loss"],
           "seconds": log["seconds"]}
    return lm, vocab, val_ids, log


def round_params(lm):
    """What the recipe does to a model after training, in place (returns ``lm``): a TinyLM's key
    biases set to 0, then every parameter rounded to float32 (stored in the model's dtype), so
    that a model trained on any BLAS kernel ends with the same parameters."""
    if isinstance(lm, TinyLM):
        D = lm.config.d_model
        for layer in lm.stack.layers:
            # The key bias b_k has a zero gradient (it adds q_i . b_k to every score of row i, which
            # softmax ignores), so training leaves it at round-off noise (~1e-12) that differs
            # between BLAS kernels: it is exactly 0 in the model, as in the exact arithmetic.
            layer.params["self_attn.in_proj_bias"][D:2 * D] = 0.0
    for p in lm.params.values():                             # round-off of the BLAS kernel removed
        p[...] = p.astype(np.float32)
    return lm


def _get(norm_first, seed):
    if not isinstance(norm_first, (bool, np.bool_)):
        raise TypeError(f"norm_first: expected True (Pre-LN) or False (Post-LN); got {norm_first!r}")
    key = (bool(norm_first), nonnegative_int(seed, "seed"))
    if key not in _MEMO:
        _MEMO[key] = _train(*key)
    return _MEMO[key]


def reference_lm(norm_first=True, seed=0):
    """The trained tiny LM -> (lm, vocab, val_ids).

    lm:      a :class:`preln.models.lm.TinyLM` in eval mode, float64 (parameters exactly representable in
             float32), causal, ``lm.config.max_len`` = 64 positions; a fresh copy on every call.
    vocab:   the :class:`preln.models.lm.CharVocab` of the corpus (``vocab.encode`` / ``vocab.decode``).
    val_ids: (N,) int64 ids of the held-out last 10 % of the corpus.
    """
    lm, vocab, val_ids, _ = _get(norm_first, seed)
    return copy.deepcopy(lm), vocab, val_ids.copy()


def reference_lm_log(norm_first=True, seed=0):
    """How :func:`reference_lm` was trained: {"recipe", "train_loss" (per step), "seconds"}."""
    return copy.deepcopy(_get(norm_first, seed)[3])


def _windows(ids, seq_len, max_windows=None):
    """(n, seq_len + 1) non-overlapping windows of ``ids`` (stride seq_len), at most max_windows."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids: expected a 1-D integer array; got shape {ids.shape}, dtype {ids.dtype}")
    seq_len = positive_int(seq_len, "seq_len")
    n = (ids.size - 1) // seq_len
    if max_windows is not None:
        n = min(n, positive_int(max_windows, "max_windows"))
    if n < 1:
        raise ValueError(f"ids: expected at least seq_len + 1 = {seq_len + 1} ids; got {ids.size}")
    return ids[np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)]      # (n, S + 1)


def mean_nll(model, ids, seq_len=64, max_windows=None, batch_size=64):
    """Mean next-token cross-entropy (nats) over non-overlapping windows of ``ids``.

    model: anything that maps (B, S) int tokens to (B, S, V) logits (a TinyLM, a quantised one).
    ids:   (N,) int token ids; windows of seq_len + 1 ids with stride seq_len, so every id after
           the first of a window is predicted once from up to seq_len - 1 ids of context.
    max_windows: use only the first so many windows (None: all that fit).
    """
    windows = _windows(ids, seq_len, max_windows)
    total = 0.0
    for i in range(0, len(windows), batch_size):
        w = windows[i:i + batch_size]
        logits = np.asarray(model(w[:, :-1]), dtype=np.float64)       # (b, S, V)
        loss, _ = cross_entropy_forward(logits, w[:, 1:])
        total += float(loss) * w.shape[0]
    return total / len(windows)


def perplexity(model, ids, seq_len=64, max_windows=None, batch_size=64):
    """exp(:func:`mean_nll`): the book's perplexity of ``model`` on ``ids`` (same arguments)."""
    return float(np.exp(mean_nll(model, ids, seq_len, max_windows, batch_size)))


def held_out_loss(model, ids, seq_len, n_windows):
    """:func:`mean_nll` over the first ``n_windows`` windows, in eval mode (the mode is restored)."""
    was_training = model.training if hasattr(model, "training") else model.stack.training
    model.eval()
    try:
        return mean_nll(model, ids, seq_len, n_windows)
    finally:
        model.train(was_training)


def train_lm(model, train_ids, recipe, seed, val_ids=None, eval_every=0, eval_windows=32):
    """The reference LM's recipe for any model with ``params``, ``loss_and_grads``, ``train`` and
    ``eval`` (a TinyLM, a LlamaLM): :func:`preln.models.optim.fit` for ``recipe["steps"]`` Adam
    steps (betas 0.9, 0.98, eps 1e-8) at the warm-up rate, clipped at ``recipe["clip"]``, on the
    batches ``batches(train_ids, batch_size, seq_len, seed=1000 + seed)``, with the held-out loss
    every ``eval_every`` steps (0: never) over ``eval_windows`` windows of ``val_ids``.

    Returns :func:`~preln.models.optim.fit`'s log ("val_steps"/"val_loss" are its eval lists).
    """
    r = recipe
    opt = Adam(model.params, lr=r["lr"], betas=(0.9, 0.98), eps=1e-8)
    evaluate = None
    if val_ids is not None and eval_every:
        def evaluate():
            return held_out_loss(model, val_ids, r["seq_len"], eval_windows)
    model.train()
    log = fit(model, batches(train_ids, r["batch_size"], r["seq_len"], seed=1000 + seed), opt,
              r["steps"], r["lr"], r["warmup"], clip=r["clip"], evaluate=evaluate,
              eval_every=eval_every, who="train_lm")
    log["val_steps"], log["val_loss"] = log["eval_steps"], log["eval_loss"]
    model.eval()
    return log
