"""The experiments of the Pre-LN vs Post-LN chapter: Xiong et al. (2020, arXiv 2002.04745).

Theory setting (their section 3.3), built from the package's own blocks:

    Xavier init N(0, 2 / (n_in + n_out)), zero biases, LayerNorm gamma = 1, beta = 0;
    one head with W^Q = W^K = 0, so attention is uniform: Attn(x)_i = (1/n) sum_j x_j W^V
    (the block's out_proj is set to the identity, so W^V is the whole value map);
    a d x d ReLU feed-forward layer (d_ff = d); Gaussian inputs x ~ N(0, I_d);
    loss: cross-entropy of softmax(x_Final W^emb^T) against uniformly random targets.

What is measured here:

- Lemma 2: E||x_l||^2 / d of the residual stream after l Pre-LN layers, against (1 + l/2, 1 + 3l/2),
  and E||x^{post,5}_l||^2 / d (the input of each Post-LN block's second LayerNorm) against 3/2.
- Theorem 1: ||d loss_i/dW^{2,L}||_F of the last layer's second FFN matrix for the loss of one
  position, over depths L: independent of L for Post-LN, O(1/sqrt(L)) for Pre-LN
  (:func:`last_layer_sample_grad_norm`); :func:`fit_exponent` fits the power of L. The gradient
  of the batch-mean loss (:func:`last_layer_grad_norm`) adds a depth effect of its own: deep random
  stacks make the positions alike, so their gradients add up coherently.
- Figure 3(a): ||dL/dW^{1,l}||_F per layer at initialisation.
- Training (section 3.2): :func:`train_lm` trains a :class:`preln.models.lm.TinyLM` with Adam and the
  warm-up schedule, deterministically given its seeds.
"""
import json
import os
from pathlib import Path

import numpy as np

from preln.nn.config import BlockConfig
from preln.models.lm import CharVocab, LMConfig, TinyLM, batches, cross_entropy_backward, cross_entropy_forward
from preln.ops import layer_norm_backward
from preln.models.optim import Adam, fit, warmup_lr
from preln.models.corpus import load_corpus
from preln.resources import data_path
from preln.nn.stack import TransformerStack

__all__ = ["theory_stack", "residual_norms", "lemma2_bounds", "last_layer_grad_norm",
           "last_layer_sample_grad_norm",
           "fit_exponent", "layer_grad_norms", "lm_layer_grad_norms", "train_lm", "early_updates",
           "PAPER_FIG3A", "DATA_DIR"]

DATA_DIR = data_path()   # preln/data/, shipped with the package

# Xiong et al. (2020), Figure 3(a): ||expected gradient of W^1|| per encoder layer at
# initialisation on IWSLT14 De-En (6-6 encoder-decoder, d = 512). Read off the figure: approximate.
PAPER_FIG3A = {
    "pre": [0.22, 0.23, 0.22, 0.18, 0.17, 0.18],
    "post": [0.06, 0.12, 0.27, 0.37, 0.76, 1.3],
}


# ---- the theory setting ----------------------------------------------------------------------
def theory_stack(norm_first, n_layers, d=64, seed=0, dtype=np.float64):
    """A :class:`TransformerStack` in Xiong et al.'s section 3.3 setting (see the module docstring)."""
    cfg = BlockConfig(d_model=d, n_heads=1, d_ff=d, norm_first=norm_first, activation="relu")
    stack = TransformerStack(cfg, n_layers, dtype=dtype, seed=seed, init="xavier", attention="plain")
    for layer in stack.layers:
        w = layer.params["self_attn.in_proj_weight"]          # (3d, d), rows [q; k; v]
        w[: 2 * d] = 0                                          # W^Q = W^K = 0: uniform attention
        layer.params["self_attn.out_proj.weight"][...] = np.eye(d)   # Attn(x) = mean_j x_j W^V
    return stack


def lemma2_bounds(l):
    """Xiong et al. Lemma 2 for Pre-LN: (1 + l/2, 1 + 3l/2) bounds E||x_l||^2 / d."""
    l = np.asarray(l, dtype=float)
    return 1 + l / 2, 1 + 3 * l / 2


def residual_norms(norm_first, n_layers, d=64, n_tokens=16, batch=32, seeds=range(4)):
    """E||.||^2 / d per layer, averaged over tokens, batch and seeds.

    Pre-LN: the residual stream x_0 (the input), x_1, ..., x_L -> array (L + 1,).
    Post-LN: x^{post,5}_l = x^{post,3}_l + FFN(x^{post,3}_l), the input of block l's second
    LayerNorm, for l = 1..L -> array (L,). (The block outputs themselves have norm^2 = d exactly.)
    """
    total = None
    seeds = list(seeds)
    for seed in seeds:
        stack = theory_stack(norm_first, n_layers, d, seed)
        x = np.random.default_rng(10_000 + seed).standard_normal((batch, n_tokens, d))   # (B, n, d)
        _, hidden = stack(x, return_hidden=True)
        if norm_first:
            vals = [np.mean(np.sum(h ** 2, axis=-1)) / d for h in hidden]
        else:   # the second LayerNorm's input, kept in the block's cache for its backward
            vals = [np.mean(np.sum(layer.cache.ln2.x ** 2, axis=-1)) / d for layer in stack.layers]
        total = np.array(vals) if total is None else total + vals
    return total / len(seeds)


def _theory_loss_grads(stack, x, w_emb, targets):
    """Forward, cross-entropy of softmax(x_Final W_emb^T), backward; returns the loss."""
    stack.zero_grad()
    y = stack(x)                                            # (B, n, d)
    logits = y @ w_emb.T                                    # (B, n, V)
    loss, cache = cross_entropy_forward(logits, targets)
    stack.backward(cross_entropy_backward(1.0, cache) @ w_emb)
    return loss


def layer_grad_norms(norm_first, n_layers, name="linear2.weight", d=64, n_tokens=16, batch=32,
                     vocab=64, seeds=range(4)):
    """||dL/dW||_F for parameter ``name`` of every layer, mean over seeds -> (n_layers,).

    Each seed draws a fresh theory-setting stack, input, embedding and random targets.
    """
    seeds = list(seeds)
    out = np.zeros(n_layers)
    for seed in seeds:
        stack = theory_stack(norm_first, n_layers, d, seed)
        rng = np.random.default_rng(20_000 + seed)
        x = rng.standard_normal((batch, n_tokens, d))                       # (B, n, d)
        w_emb = rng.normal(0, np.sqrt(2.0 / (vocab + d)), (vocab, d))       # (V, d), Xavier
        targets = rng.integers(0, vocab, (batch, n_tokens))
        _theory_loss_grads(stack, x, w_emb, targets)
        out += [np.linalg.norm(stack.grads[f"layers.{l}.{name}"]) for l in range(n_layers)]
    return out / len(seeds)


def last_layer_grad_norm(norm_first, depths, **kw):
    """||dL/dW^{2,L}||_F of the last layer, L the *batch-mean* loss, for each depth -> (len,)."""
    return np.array([layer_grad_norms(norm_first, L, "linear2.weight", **kw)[-1] for L in depths])


def last_layer_sample_grad_norm(norm_first, n_layers, d=64, n_tokens=16, batch=32, vocab=64, seeds=range(4)):
    """Theorem 1's quantity: E ||d loss_i / dW^{2,L}||_F for the loss of *one* position i.

    In the last layer, W^{2,L} acts on each token separately and token i's output feeds only
    loss_i, so the per-position gradient is the rank-1 matrix dz_i h_i^T (z = h W2^T, h the ReLU
    output): its norm is ||dz_i|| ||h_i||, with dz_i = d loss_i / dz_i read off a single backward
    through the last LayerNorm (the final one for Pre-LN, the block's second for Post-LN).
    Mean over the B x n positions and the seeds (same draws as :func:`layer_grad_norms`).
    """
    seeds = list(seeds)
    total = 0.0
    for seed in seeds:
        stack = theory_stack(norm_first, n_layers, d, seed)
        rng = np.random.default_rng(20_000 + seed)
        x = rng.standard_normal((batch, n_tokens, d))                       # (B, n, d)
        w_emb = rng.normal(0, np.sqrt(2.0 / (vocab + d)), (vocab, d))       # (V, d)
        targets = rng.integers(0, vocab, (batch, n_tokens))
        logits = stack(x) @ w_emb.T                                         # (B, n, V)
        _, cache = cross_entropy_forward(logits, targets)
        dy = cross_entropy_backward(float(targets.size), cache) @ w_emb     # d(sum_i loss_i)/dy
        last = stack.layers[-1]
        ln = stack.norm_cache if norm_first else last.cache.ln2          # the LayerNorm after z
        dz = layer_norm_backward(dy, ln)[0]                                 # (B, n, d)
        h = last.cache.mlp.linear2.x                                       # (B, n, d_ff)
        total += np.mean(np.linalg.norm(dz, axis=-1) * np.linalg.norm(h, axis=-1))
    return total / len(seeds)


def fit_exponent(depths, values):
    """Least-squares slope of log(values) against log(depths): values ~ c L^slope. -> (slope, c)."""
    slope, intercept = np.polyfit(np.log(depths), np.log(values), 1)
    return float(slope), float(np.exp(intercept))


# ---- the language model ----------------------------------------------------------------------
def _split(ids):
    n = int(0.9 * ids.size)
    return ids[:n], ids[n:]


def lm_layer_grad_norms(norm_first, n_layers=6, d_model=64, n_heads=4, d_ff=256, seq_len=32,
                        batch_size=16, n_batches=8, seed=0, activation="relu"):
    """Figure 3(a) on our LM: ||expected gradient of W^1|| per layer at Xavier initialisation.

    As Xiong et al., gradients are averaged over ``n_batches`` mini-batches of the corpus, then
    the Frobenius norm of the average is taken. -> (n_layers,)
    """
    _, vocab, ids = load_corpus()
    train_ids, _ = _split(ids)
    lm = TinyLM(LMConfig(vocab_size=len(vocab), max_len=seq_len, d_model=d_model, n_heads=n_heads,
                         d_ff=d_ff, n_layers=n_layers, norm_first=norm_first, activation=activation),
                dtype=np.float64, seed=seed)
    it = batches(train_ids, batch_size, seq_len, seed=1000 + seed)
    lm.zero_grad()
    for _ in range(n_batches):                               # grads accumulate over batches
        tokens, targets = next(it)
        logits = lm(tokens)
        _, cache = cross_entropy_forward(logits, targets)
        lm.backward(cross_entropy_backward(1.0 / n_batches, cache))
    return np.array([np.linalg.norm(lm.grads[f"stack.layers.{l}.linear1.weight"])
                     for l in range(n_layers)])


def train_lm(norm_first=True, n_layers=6, lr=1e-3, warmup=0, steps=300, seed=0, d_model=32,
             n_heads=2, d_ff=128, seq_len=32, batch_size=16, activation="relu", clip=None,
             eval_every=25, eval_batches=4, dtype="float64", decay="constant", corpus=None):
    """Train a :class:`TinyLM` on the corpus with Adam (betas 0.9, 0.98) and linear warm-up.

    lr(t) = min(1, t / warmup) lr  (then constant, or inverse-sqrt with decay="inv_sqrt").
    Deterministic given ``seed`` (the model's initialisation and the order of batches).

    Returns a JSON-ready dict: "config" (every argument), "train_loss" (per step; NaN after a
    divergence), "grad_norm" (global, before clipping), "eval_steps" and "eval_loss" (on fixed
    held-out batches), "diverged" (bool).
    """
    config = dict(norm_first=bool(norm_first), n_layers=int(n_layers), lr=float(lr), warmup=int(warmup),
                  steps=int(steps), seed=int(seed), d_model=int(d_model), n_heads=int(n_heads),
                  d_ff=int(d_ff), seq_len=int(seq_len), batch_size=int(batch_size),
                  activation=activation, clip=clip, eval_every=int(eval_every),
                  eval_batches=int(eval_batches), dtype=str(np.dtype(dtype)), decay=decay)
    _, vocab, ids = load_corpus(corpus)
    train_ids, val_ids = _split(ids)
    lm = TinyLM(LMConfig(vocab_size=len(vocab), max_len=seq_len, d_model=d_model, n_heads=n_heads,
                         d_ff=d_ff, n_layers=n_layers, norm_first=norm_first, activation=activation),
                dtype=np.dtype(dtype), seed=seed)
    opt = Adam(lm.params, lr=lr, betas=(0.9, 0.98), eps=1e-8)
    val_it = batches(val_ids, batch_size, seq_len, seed=999)
    val = [next(val_it) for _ in range(eval_batches)]

    def evaluate():
        return float(np.mean([lm.loss(t, y) for t, y in val]))

    log = fit(lm, batches(train_ids, batch_size, seq_len, seed=1000 + seed), opt, steps, lr, warmup,
              decay, clip, evaluate=evaluate, eval_every=eval_every, on_divergence="stop",
              who="xiong.train_lm")
    return {"config": config, **{k: log[k] for k in ("train_loss", "grad_norm", "eval_steps",
                                                      "eval_loss", "diverged")}}


def early_updates(norm_first=True, n_layers=6, lr=1e-2, warmup=0, steps=10, seed=0, d_model=32,
                  n_heads=2, d_ff=128, seq_len=32, batch_size=16, activation="relu",
                  dtype="float64"):
    """The first ``steps`` Adam updates of :func:`train_lm`'s run (same model, batches and
    schedule), measured layer by layer: what the accounts of warm-up predict.

    Per step t and layer l, over the layer's four weight matrices together:
      ratio[t, l]       ||W_t - W_{t-1}||_F / ||W_{t-1}||_F, the update-to-weight ratio
      grad[t, l]        ||dL/dW||_F of the gradient that update used
      sign_like[t, l]   fraction of the weights that moved by more than lr(t)/2: Adam's update
                        of a coordinate is lr(t) m_hat / (sqrt(v_hat) + eps), exactly +-lr(t) at
                        step 1 whatever the gradient's size (Kingma & Ba 2015, section 2.1)
    Per step: lr[t] (the scheduled rate), out_change[t] = ||f_t - f_{t-1}|| / ||f_{t-1}||, the
    relative change of the logits on a fixed held-out batch (the output change of Liu et al.
    2020, arXiv 2004.08249), and loss[t] (the training loss before the update).
    """
    _, vocab, ids = load_corpus()
    train_ids, val_ids = _split(ids)
    lm = TinyLM(LMConfig(vocab_size=len(vocab), max_len=seq_len, d_model=d_model, n_heads=n_heads,
                         d_ff=d_ff, n_layers=n_layers, norm_first=norm_first, activation=activation),
                dtype=np.dtype(dtype), seed=seed)
    opt = Adam(lm.params, lr=lr, betas=(0.9, 0.98), eps=1e-8)
    train_it = batches(train_ids, batch_size, seq_len, seed=1000 + seed)   # as train_lm
    probe, _ = next(batches(val_ids, batch_size, seq_len, seed=999))       # its first eval batch
    names = [[k for k, v in lm.params.items() if k.startswith(f"stack.layers.{l}.") and v.ndim == 2]
             for l in range(n_layers)]
    ratio, grad, sign_like = (np.zeros((steps, n_layers)) for _ in range(3))
    lrs, out_change, losses = np.zeros(steps), np.zeros(steps), np.zeros(steps)
    f_prev = lm(probe)
    for t in range(1, steps + 1):
        tokens, targets = next(train_it)
        loss, grads = lm.loss_and_grads(tokens, targets)
        before = {k: lm.params[k].copy() for layer in names for k in layer}
        lrs[t - 1] = opt.step(grads, lr=warmup_lr(t, lr, warmup))
        losses[t - 1] = loss
        for l, layer in enumerate(names):
            dw = np.concatenate([(lm.params[k] - before[k]).ravel() for k in layer])
            w = np.concatenate([before[k].ravel() for k in layer])
            ratio[t - 1, l] = np.linalg.norm(dw) / np.linalg.norm(w)
            grad[t - 1, l] = np.sqrt(sum(np.sum(grads[k] ** 2) for k in layer))
            sign_like[t - 1, l] = np.mean(np.abs(dw) > 0.5 * lrs[t - 1])
        f = lm(probe)
        out_change[t - 1] = np.linalg.norm(f - f_prev) / np.linalg.norm(f_prev)
        f_prev = f
    return dict(ratio=ratio, grad=grad, sign_like=sign_like, lr=lrs, out_change=out_change,
                loss=losses)
