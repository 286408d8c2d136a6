"""A tiny Llama-style character language model: :class:`preln.models.lm.TinyLM` with the modern block.

    tokens (B, S) int -> h_0 = E_tok[tokens]               (B, S, D); no position embedding:
                      -> h_l = LlamaBlock_l(h_{l-1})      RoPE rotates q and k in every block
                      -> h   = RMSNorm_f(h_L)             the final norm of a Pre-norm stack
                      -> logits = h W_head^T              (B, S, V); no bias, as Llama's lm_head

Parameter names are those of transformers' ``LlamaForCausalLM.state_dict()``:
``model.embed_tokens.weight`` (V, D), ``model.layers.l.<LlamaBlock name>``, ``model.norm.weight``
(D,), ``lm_head.weight`` (V, D). Every backward is written by hand: the cross-entropy's, the head's,
the final RMSNorm's, each block's, and the embedding's scatter-add.

Initialisation (``init``): "xavier" (default) draws every block weight from N(0, 2 / (n_in + n_out)),
the embedding from N(0, 0.02^2) and the head Xavier normal -- TinyLM's scheme (Xiong et al. 2020),
so that the chapter's comparison with the reference LM changes the block and nothing else;
"llama" is transformers' N(0, 0.02^2) everywhere.

:func:`train_lm` is the training loop of :mod:`preln.models.pretrained` (Adam with betas 0.9, 0.98, linear
warm-up, global-norm clipping, the same batches for the same seed) for either model, with the
held-out loss measured along the way.
"""
import time
from typing import NamedTuple

import numpy as np

from preln.models.lm import cross_entropy_backward, cross_entropy_forward, embedding_backward, embedding_forward
from preln.nn.llama import LlamaBlock, LlamaConfig
from preln.ops import linear_backward, linear_forward, rms_norm_backward, rms_norm_forward
from preln.models.optim import Adam, clip_grad_norm, warmup_lr
from preln.nn.stack import StackKVCache

__all__ = ["LlamaLMConfig", "LlamaLM", "train_lm", "held_out_loss"]


class LlamaLMConfig(NamedTuple):
    vocab_size: int = 32
    d_model: int = 32
    n_heads: int = 2
    n_kv_heads: int = 2
    d_ff: int = 96
    n_layers: int = 2
    rope_theta: float = 10000.0
    eps: float = 1e-6
    init: str = "xavier"          # "xavier" (TinyLM's scheme) or "llama" (N(0, 0.02^2))

    def block_config(self):
        return LlamaConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                           d_ff=self.d_ff, rope_theta=self.rope_theta, eps=self.eps)


class LlamaLM:
    """A causal character LM: an embedding, L :class:`preln.LlamaBlock` s, RMSNorm, a head."""

    def __init__(self, config=LlamaLMConfig(), dtype=np.float64, seed=0):
        if not isinstance(config, LlamaLMConfig):
            raise TypeError(f"config: expected a preln.models.llama_lm.LlamaLMConfig; got {type(config).__name__}")
        if config.init not in ("xavier", "llama"):
            raise ValueError(f"init: expected 'xavier' or 'llama'; got {config.init!r}")
        if isinstance(config.n_layers, bool) or not isinstance(config.n_layers, int) or config.n_layers < 1:
            raise ValueError(f"n_layers: expected a positive int; got {config.n_layers!r}")
        self.config = config
        self.dtype = np.dtype(dtype)
        block_cfg = config.block_config()
        seeds = np.random.SeedSequence(seed).spawn(config.n_layers + 1)
        self.layers = [LlamaBlock(block_cfg, dtype=self.dtype, seed=s) for s in seeds[:-1]]
        rng = np.random.default_rng(seeds[-1])
        if config.init == "xavier":
            for layer in self.layers:
                layer.load_state_dict({k: (v if k.endswith("layernorm.weight") else
                                           layer.rng.normal(0.0, np.sqrt(2.0 / sum(v.shape)), v.shape))
                                       for k, v in layer.state_dict().items()})
        V, D = config.vocab_size, config.d_model
        head_std = np.sqrt(2.0 / (V + D)) if config.init == "xavier" else 0.02
        self.own = {"model.embed_tokens.weight": rng.normal(0, 0.02, (V, D)),
                    "model.norm.weight": np.ones(D),
                    "lm_head.weight": rng.normal(0, head_std, (V, D))}
        self.own = {k: v.astype(self.dtype) for k, v in self.own.items()}
        self.own_grads = {k: np.zeros_like(v) for k, v in self.own.items()}
        self._cache = None

    # ---- parameters ----------------------------------------------------------------------------
    @property
    def params(self):
        """name -> the live parameter array (an optimiser updates them in place)."""
        out = {"model.embed_tokens.weight": self.own["model.embed_tokens.weight"]}
        for i, layer in enumerate(self.layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in layer.params.items()})
        out["model.norm.weight"] = self.own["model.norm.weight"]
        out["lm_head.weight"] = self.own["lm_head.weight"]
        return out

    @property
    def grads(self):
        out = {"model.embed_tokens.weight": self.own_grads["model.embed_tokens.weight"]}
        for i, layer in enumerate(self.layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in layer.grads.items()})
        out["model.norm.weight"] = self.own_grads["model.norm.weight"]
        out["lm_head.weight"] = self.own_grads["lm_head.weight"]
        return out

    def num_params(self):
        return int(sum(v.size for v in self.params.values()))

    def state_dict(self):
        return {k: v.copy() for k, v in self.params.items()}

    def zero_grad(self):
        for layer in self.layers:
            layer.zero_grad()
        for g in self.own_grads.values():
            g[...] = 0

    def train(self, mode=True):
        for layer in self.layers:
            layer.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @property
    def training(self):
        return self.layers[0].training

    # ---- forward and backward ------------------------------------------------------------------
    def forward(self, tokens):  # (B, S) int -> logits (B, S, V)
        tokens = self._check_tokens(tokens, "tokens")
        h, c_emb = embedding_forward(tokens, self.own["model.embed_tokens.weight"])   # (B, S, D)
        for layer in self.layers:
            h = layer(h)                                                            # (B, S, D)
        h, c_norm = rms_norm_forward(h, self.own["model.norm.weight"], self.config.eps)
        logits, c_head = linear_forward(h, self.own["lm_head.weight"], None)         # (B, S, V)
        self._cache = (c_emb, c_norm, c_head)
        return logits

    __call__ = forward

    def backward(self, dlogits):  # (B, S, V) -> None; accumulates into grads
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate; call lm(tokens) first")
        c_emb, c_norm, c_head = self._cache
        dh, dw, _ = linear_backward(dlogits, c_head)                  # logits = h W_head^T
        self.own_grads["lm_head.weight"] += dw
        dh, dgamma = rms_norm_backward(dh, c_norm)                    # h = RMSNorm_f(h_L)
        self.own_grads["model.norm.weight"] += dgamma
        for layer in reversed(self.layers):
            dh = layer.backward(dh)                                   # h_l = Block_l(h_{l-1})
        self.own_grads["model.embed_tokens.weight"] += embedding_backward(dh, c_emb)   # h_0 = E[tokens]

    def loss(self, tokens, targets):
        """Mean cross-entropy (nats per token) of predicting ``targets`` (B, S) from ``tokens``."""
        return float(cross_entropy_forward(self.forward(tokens), targets)[0])

    def loss_and_grads(self, tokens, targets):
        """Forward, loss, backward: returns (loss, grads) with grads freshly zeroed then filled."""
        self.zero_grad()
        logits = self.forward(tokens)                                 # (B, S, V)
        loss, c_ce = cross_entropy_forward(logits, targets)
        self.backward(cross_entropy_backward(1.0, c_ce))
        return float(loss), self.grads

    # ---- decoding ------------------------------------------------------------------------------
    def kv_cache(self, batch, max_len, dtype=None):
        """One :class:`preln.LlamaKVCache` per layer, in a :class:`preln.nn.stack.StackKVCache`."""
        return StackKVCache(layer.kv_cache(batch, max_len, dtype) for layer in self.layers)

    def decode(self, tokens_new, kv):  # (B, n) int -> logits (B, n, V)
        """The logits of the next n positions given the cache of the ones before (eval mode);
        equal to ``forward`` of the whole sequence at those positions. RoPE has no table to run
        out of: the cache's max_len is the only limit on the length."""
        tokens_new = self._check_tokens(tokens_new, "tokens_new")
        if not isinstance(kv, StackKVCache) or len(kv.layers) != len(self.layers):
            raise TypeError(f"kv: expected the StackKVCache of lm.kv_cache(batch, max_len); got "
                            f"{type(kv).__name__}")
        h, _ = embedding_forward(tokens_new, self.own["model.embed_tokens.weight"])   # (B, n, D)
        for layer, layer_kv in zip(self.layers, kv.layers):
            h = layer.decode(h, layer_kv)
        h, _ = rms_norm_forward(h, self.own["model.norm.weight"], self.config.eps)
        return linear_forward(h, self.own["lm_head.weight"], None)[0]                 # (B, n, V)

    def _check_tokens(self, tokens, name):
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or 0 in tokens.shape:
            raise ValueError(f"{name}: expected a non-empty (B, S) integer array; got shape "
                             f"{tokens.shape}, dtype {tokens.dtype}")
        V = self.config.vocab_size
        if tokens.min() < 0 or tokens.max() >= V:
            raise ValueError(f"{name}: expected token ids in [0, {V}); got [{tokens.min()}, {tokens.max()}]")
        return tokens


# ---- training ------------------------------------------------------------------------------------
def held_out_loss(model, ids, seq_len, n_windows):
    """Mean cross-entropy over the first ``n_windows`` non-overlapping windows of ``ids``
    (the windows of :func:`preln.models.pretrained.perplexity`), in eval mode; the mode is restored."""
    n = min(n_windows, (ids.size - 1) // seq_len)
    windows = ids[np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)]   # (n, S + 1)
    was_training = model.training if hasattr(model, "training") else model.stack.training
    model.eval()
    try:
        return float(cross_entropy_forward(model(windows[:, :-1]), windows[:, 1:])[0])
    finally:
        model.train(was_training)


def train_lm(model, train_ids, recipe, seed, val_ids=None, eval_every=0, eval_windows=32):
    """The reference LM's training loop (:mod:`preln.models.pretrained`) for any model with ``params``,
    ``loss_and_grads``, ``train`` and ``eval``: ``recipe["steps"]`` Adam steps (betas 0.9, 0.98,
    eps 1e-8) at ``warmup_lr(t, lr, warmup)`` with global-norm clipping at ``clip``, on the
    batches ``preln.models.lm.batches(train_ids, batch_size, seq_len, seed=1000 + seed)``.

    Returns {"train_loss": per step, "val_steps", "val_loss": the held-out loss every
    ``eval_every`` steps (and at step 0) over ``eval_windows`` windows, "seconds", "cpu_seconds"}.
    """
    from preln.models.lm import batches
    r = recipe
    opt = Adam(model.params, lr=r["lr"], betas=(0.9, 0.98), eps=1e-8)
    it = batches(train_ids, r["batch_size"], r["seq_len"], seed=1000 + seed)
    log = {"train_loss": [], "val_steps": [], "val_loss": []}

    def evaluate(step):
        if val_ids is not None and eval_every:
            log["val_steps"].append(step)
            log["val_loss"].append(held_out_loss(model, val_ids, r["seq_len"], eval_windows))

    model.train()
    evaluate(0)
    start, cpu = time.perf_counter(), time.process_time()
    for t in range(1, r["steps"] + 1):
        tokens, targets = next(it)                                    # (B, S) each
        loss, grads = model.loss_and_grads(tokens, targets)
        if not np.isfinite(loss):
            raise FloatingPointError(f"train_lm: training diverged at step {t} (loss {loss})")
        clip_grad_norm(grads, r["clip"])
        opt.step(grads, lr=warmup_lr(t, r["lr"], r["warmup"]))
        log["train_loss"].append(loss)
        if eval_every and t % eval_every == 0:
            evaluate(t)
    log["seconds"] = time.perf_counter() - start
    log["cpu_seconds"] = time.process_time() - cpu
    model.eval()
    return log
