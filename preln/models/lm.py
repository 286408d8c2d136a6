"""A tiny character-level language model around :class:`preln.nn.stack.TransformerStack`.

    tokens (B, S) int -> h_0 = E_tok[tokens] + E_pos[:S]        (B, S, D)
                      -> h   = Stack(h_0)   (causal; Pre-LN: ends with the final LayerNorm)
                      -> logits = h W_head^T + b_head           (B, S, V)
                      -> loss = mean over tokens of -log softmax(logits)[target]

The LM head is **untied** by default (its own (V, D) weight and a bias); ``tie_weights=True`` reuses
the token embedding as W_head (Press & Wolf 2017) and keeps only the bias. Every backward is
written by hand: the cross-entropy's dlogits = (softmax - onehot) / N, the head's linear backward,
the stack's, and the embeddings' scatter-add.

Generation (:meth:`TinyLM.generate`) runs the prompt through the stack once (the "prefill"), then
one position per new token through :meth:`TinyLM.decode`, which keeps every layer's keys and values
in a KV cache; greedy (temperature 0) or sampled from softmax(logits / temperature). The position
embeddings are learned for positions 0 .. max_len - 1 only, so a prompt plus its continuation may
hold at most max_len tokens: past that there is no embedding to add, and generate and decode say so.

The corpus is synthetic: sentences from a small probabilistic grammar (:func:`grammar_corpus`),
so it is ours to publish and needs no download (see preln/data/README.md).
"""
from typing import NamedTuple

import numpy as np

from preln.nn.base import DEFAULT_ATTENTION, DEFAULT_DTYPE, Module
from preln.nn.config import BlockConfig
from preln.ops import linear_backward, linear_forward
from preln.nn.stack import StackKVCache, TransformerStack
from preln.validation import check_token_ids, nonnegative_float, nonnegative_int

__all__ = ["TinyLM", "LMConfig", "sample_next", "cross_entropy_forward", "cross_entropy_backward",
           "embedding_forward", "embedding_backward", "TokenIO", "LanguageModel", "grammar_corpus", "CharVocab", "batches"]


# ---- cross-entropy ---------------------------------------------------------------------------
class CrossEntropyCache(NamedTuple):
    logp: np.ndarray     # (N, V) log-softmax of the logits
    targets: np.ndarray  # (N,) int
    shape: tuple         # the logits' shape (..., V)


def cross_entropy_forward(logits, targets):  # (..., V), (...) int -> scalar
    """Mean over tokens of -log softmax(logits)[target], with a stable log-softmax.

    log softmax(z)_v = z_v - m - log sum_u exp(z_u - m),  m = max_u z_u  (the largest exponent is 0).
    """
    logits = np.asarray(logits)
    targets = np.asarray(targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets: expected shape {logits.shape[:-1]} (the logits' without V); "
                         f"got {targets.shape}")
    if not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets: expected integer class indices; got dtype {targets.dtype}")
    V = logits.shape[-1]
    if targets.size and (targets.min() < 0 or targets.max() >= V):
        raise ValueError(f"targets: expected indices in [0, {V}); got [{targets.min()}, {targets.max()}]")
    z = logits.reshape(-1, V)                                     # (N, V)
    m = z.max(axis=-1, keepdims=True)                             # (N, 1)
    logp = z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))
    t = targets.reshape(-1)                                       # (N,)
    loss = -logp[np.arange(t.size), t].mean()
    return loss, CrossEntropyCache(logp, t, logits.shape)


def cross_entropy_backward(dloss, cache):  # scalar -> (..., V)
    """dlogits = dloss * (softmax(logits) - onehot(target)) / N."""
    logp, t, shape = cache
    N = t.size
    dz = np.exp(logp)                                             # softmax, (N, V)
    dz[np.arange(N), t] -= 1.0                                    # - onehot
    dz *= dloss / N                                               # loss = mean over N tokens
    return dz.reshape(shape).astype(logp.dtype, copy=False)


# ---- embeddings ------------------------------------------------------------------------------
def embedding_forward(ids, table):  # (...) int, (V, D) -> (..., D)
    """Rows of ``table``; the cache is the ids and the table's shape."""
    return table[ids], (ids, table.shape)


def embedding_backward(dout, cache):  # (..., D) -> (V, D)
    """dtable[v] = sum of dout over every position whose id is v (a scatter-add)."""
    ids, shape = cache
    dtable = np.zeros(shape, dtype=dout.dtype)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, shape[1]))
    return dtable


# ---- the embeddings in and the head out, one for every LM ------------------------------------
class TokenIO(NamedTuple):
    """Where an LM's tokens come in and its logits go out -- the same checks and the same
    arithmetic for TinyLM, LlamaLM, the quantised LMs and the paged server. Holds the parameter
    names, not the arrays: every call reads them from the LM's ``params`` dict as they are.

    h_0 = E_tok[tokens] (+ E_pos[start : start + S] with a position table); logits = h W^T (+ b).
    ``head`` None: the head is the token embedding (tied weights).
    """

    vocab_size: int
    max_len: object = None          # positions the position table holds (None: no table, no limit)
    tok: str = "tok_emb.weight"
    pos: object = "pos_emb.weight"  # None: no position embedding (RoPE models)
    head: object = "head.weight"
    bias: object = "head.bias"

    @classmethod
    def of_tiny_lm(cls, config):
        """TinyLM's: learned positions, an untied head with a bias (or tied, with the bias)."""
        return cls(config.vocab_size, config.max_len, head=None if config.tie_weights else "head.weight")

    def check(self, tokens, name="tokens", start=0):  # -> (B, S) int
        """Token ids in [0, V) -- -1 would silently read the last embedding row -- at positions
        start .. start + S - 1, inside the position table."""
        tokens = check_token_ids(tokens, self.vocab_size, name)
        self.check_positions(start, tokens.shape[1], name)
        return tokens

    def check_positions(self, start, n, name="tokens"):
        if self.max_len is not None and start + n > self.max_len:
            if start == 0:
                raise ValueError(f"{name}: expected at most max_len={self.max_len} positions; got {n}")
            raise ValueError(f"{name}: positions {start} .. {start + n - 1} would pass the model's "
                             f"max_len={self.max_len} (its last position embedding is {self.max_len - 1})")

    def head_weight(self, params):
        return params[self.tok if self.head is None else self.head]

    def embed(self, params, tokens, start=0, name="tokens"):  # (B, S) -> (B, S, D), cache
        tokens = self.check(tokens, name, start)
        h, cache = embedding_forward(tokens, params[self.tok])                       # (B, S, D)
        if self.pos is not None:
            h = h + params[self.pos][start:start + tokens.shape[1]]                   # positions
        return h, cache

    def embed_rows(self, params, ids, positions, name="ids"):  # (N,), (N,) -> (N, D)
        """Rows of several sequences at their own positions (a batch of prefills and decode steps)."""
        ids = check_token_ids(ids, self.vocab_size, name, ndim=1)
        h = params[self.tok][ids]
        if self.pos is not None:
            self.check_positions(0, int(np.max(positions)) + 1, name)
            h = h + params[self.pos][positions]
        return h

    def logits(self, params, h):  # (..., D) -> (..., V), cache
        return linear_forward(h, self.head_weight(params), None if self.bias is None else params[self.bias])


# ---- the model -------------------------------------------------------------------------------
class Generator:
    """``generate`` (and ``chat``) for any LM with ``config.vocab_size``, ``forward``, ``kv_cache``
    and ``decode`` (written once: TinyLM, LlamaLM, the quantised LMs). ``max_positions``: the
    positions the model has embeddings for (None: RoPE, no such limit); ``tokenizer``: what
    ``chat`` renders and reads text with (None: token ids only)."""

    max_positions = None
    tokenizer = None

    def chat(self, messages, n_new=64, temperature=0.0, seed=None):
        """The assistant's reply to ``messages`` (the tokenizer's chat template), as text."""
        if self.tokenizer is None:   # else "'NoneType' object has no attribute 'apply_chat_template'"
            raise ValueError("tokenizer: expected a GGUFTokenizer to render the chat template; got None "
                             "(a model without a tokenizer, e.g. LlamaLM.from_gguf(path, tokenizer=False)): "
                             "load it with its tokenizer, or call generate(ids, n_new) with token ids")
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        out = self.generate(np.array(prompt), n_new, temperature, seed, stop_at=self.tokenizer.eos_token_id)
        return self.tokenizer.decode(out[len(prompt):], skip_special_tokens=True)

    def generate(self, prompt_ids, n_new, temperature=0.0, seed=None, use_cache=True, stop_at=None):
        """Continue ``prompt_ids`` ((S0,) or (B, S0) ints) by ``n_new`` tokens.

        temperature: 0 -> greedy (argmax of the logits); > 0 -> sampled from
        softmax(logits / temperature), drawn from ``np.random.default_rng(seed)`` (deterministic
        given the seed). use_cache: True decodes one position per step with a KV cache; False
        recomputes the forward of the whole sequence every step (the same tokens, for comparison).
        stop_at: a token id (e.g. the tokenizer's EOS) after which a single sequence stops.

        Returns the prompt followed by the new tokens, (S0 + n_new,) or (B, S0 + n_new) int64.
        Runs in eval mode and restores the mode it found.
        """
        ids = np.asarray(prompt_ids)
        one = ids.ndim == 1
        ids = check_token_ids(ids[None] if one else ids, self.config.vocab_size,
                              "prompt_ids").astype(np.int64)                 # (B, S0)
        n_new = nonnegative_int(n_new, "n_new")
        nonnegative_float(temperature, "temperature")       # before the cache is allocated
        B, S0 = ids.shape
        limit = self.max_positions
        if limit is not None and S0 + n_new > limit:
            raise ValueError(f"n_new: the prompt's {S0} tokens plus n_new={n_new} exceed the model's "
                             f"max_len={limit} positions (it has no position embedding "
                             f"past {limit - 1}); shorten the prompt or ask for at most "
                             f"{limit - S0} new tokens")
        rng = np.random.default_rng(seed)
        out = np.empty((B, S0 + n_new), np.int64)
        out[:, :S0] = ids
        was_training = getattr(self, "training", False)
        if hasattr(self, "eval"):
            self.eval()
        try:
            kv = self.kv_cache(B, S0 + n_new) if use_cache and n_new else None
            for t in range(S0, S0 + n_new):
                if kv is None:                                    # no cache: the whole sequence again
                    logits = self.forward(out[:, :t])[:, -1]                    # (B, V)
                else:                                             # prefill once, then one position a step
                    logits = self.decode(out[:, kv.length:t], kv)[:, -1]        # (B, V)
                out[:, t] = sample_next(logits, temperature, rng)
                if stop_at is not None and B == 1 and out[0, t] == stop_at:
                    out = out[:, :t + 1]
                    break
        finally:
            if hasattr(self, "train"):
                self.train(was_training)
        return out[0] if one else out


class LanguageModel(Generator, Module):
    """What every trainable LM shares: the loss and one training step's gradients (with
    ``forward``, ``backward``, ``params`` and ``grads`` of its own)."""

    @property
    def training(self):            # the mode is its blocks': one place to hold it
        return self.children()[0].training

    def _set_mode(self, mode):
        pass

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


class LMConfig(NamedTuple):
    vocab_size: int = 32
    max_len: int = 64
    d_model: int = 32
    n_heads: int = 2
    d_ff: int = 128
    n_layers: int = 2
    norm_first: bool = True        # Pre-LN (True) or Post-LN (False)
    activation: str = "gelu"
    tie_weights: bool = False      # untied head by default
    init: str = "xavier"           # "xavier" (Xiong et al.) or "torch" for the blocks


class TinyLM(LanguageModel):
    """A causal character LM: embeddings, a :class:`TransformerStack`, an LM head.

    Parameters (names): ``tok_emb.weight`` (V, D), ``pos_emb.weight`` (S_max, D),
    ``stack.layers.l.*``, ``stack.norm.*`` (Pre-LN only), ``head.weight`` (V, D; absent if tied),
    ``head.bias`` (V,). Embeddings are N(0, 0.02^2) as in GPT-2; the head is Xavier normal.
    dtype and attention are the stack's (float32 and "auto", as for every block).
    """

    def __init__(self, config=LMConfig(), dtype=DEFAULT_DTYPE, seed=0, attention=DEFAULT_ATTENTION):
        if not isinstance(config, LMConfig):
            raise TypeError(f"config: expected a preln.models.lm.LMConfig; got {type(config).__name__}")
        self.config = config
        self.dtype = np.dtype(dtype)
        block = BlockConfig(d_model=config.d_model, n_heads=config.n_heads, d_ff=config.d_ff,
                            norm_first=config.norm_first, activation=config.activation, causal=True)
        seeds = np.random.SeedSequence(seed).spawn(2)
        self.stack = TransformerStack(block, config.n_layers, dtype=self.dtype, seed=seeds[0],
                                      init=config.init, attention=attention)
        rng = np.random.default_rng(seeds[1])
        V, S, D = config.vocab_size, config.max_len, config.d_model
        self.own = {"tok_emb.weight": rng.normal(0, 0.02, (V, D)),
                    "pos_emb.weight": rng.normal(0, 0.02, (S, D))}
        if not config.tie_weights:
            self.own["head.weight"] = rng.normal(0, np.sqrt(2.0 / (V + D)), (V, D))
        self.own["head.bias"] = np.zeros(V)
        self.own = {k: v.astype(self.dtype) for k, v in self.own.items()}
        self.own_grads = {k: np.zeros_like(v) for k, v in self.own.items()}
        self.io = TokenIO.of_tiny_lm(config)
        self._cache = None

    @property
    def max_positions(self):        # generate's limit: the positions with an embedding
        return self.config.max_len

    @property
    def params(self):
        out = dict(self.own)
        out.update({f"stack.{k}": v for k, v in self.stack.params.items()})
        return out

    @property
    def grads(self):
        out = dict(self.own_grads)
        out.update({f"stack.{k}": v for k, v in self.stack.grads.items()})
        return out

    def children(self):
        return (self.stack,)

    def forward(self, tokens):  # (B, S) int -> logits (B, S, V)
        h0, c_tok = self.io.embed(self.own, tokens)                                 # (B, S, D)
        h = self.stack(h0)                                                          # (B, S, D)
        logits, c_head = self.io.logits(self.own, h)                                # (B, S, V)
        self._cache = (c_tok, c_head, h0.shape[1])
        return logits

    __call__ = forward

    def backward(self, dlogits):  # (B, S, V) -> None; accumulates into grads
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate; call lm(tokens) first")
        c_tok, c_head, S = self._cache
        dh, dw, db = linear_backward(dlogits, c_head)        # logits = h W^T + b
        self.own_grads["head.bias"] += db
        if self.config.tie_weights:
            self.own_grads["tok_emb.weight"] += dw            # W_head is E_tok
        else:
            self.own_grads["head.weight"] += dw
        dh0 = self.stack.backward(dh)                         # h = Stack(h0)
        self.own_grads["pos_emb.weight"][:S] += dh0.sum(axis=0)      # h0 = te + E_pos[:S]
        self.own_grads["tok_emb.weight"] += embedding_backward(dh0, c_tok)  # te = E_tok[tokens]

    # ---- decoding ------------------------------------------------------------------------------
    def kv_cache(self, batch, max_len=None, dtype=None):
        """A :class:`preln.nn.stack.StackKVCache` for ``batch`` sequences of up to ``max_len`` positions
        (default and upper bound: the model's ``config.max_len``, the positions it has embeddings for)."""
        max_len = self.config.max_len if max_len is None else max_len
        too_long = isinstance(max_len, (int, np.integer)) and max_len > self.config.max_len
        if too_long and not isinstance(max_len, bool):
            raise ValueError(f"max_len: expected at most the model's max_len={self.config.max_len} "
                             f"(it has position embeddings for no more); got {max_len}")
        return self.stack.kv_cache(batch, max_len, dtype)

    def decode(self, tokens_new, kv):  # (B, n) int -> logits (B, n, V)
        """The logits of the next n positions given the cache of the ones before (eval mode);
        equal to ``forward`` of the whole sequence at those positions."""
        if not isinstance(kv, StackKVCache):
            raise TypeError(f"kv: expected a preln.nn.stack.StackKVCache from lm.kv_cache(batch); "
                            f"got {type(kv).__name__}")
        h0, _ = self.io.embed(self.own, tokens_new, kv.length, "tokens_new")       # positions t0 .. t0+n-1
        h = self.stack.decode(h0, kv)                                               # (B, n, D)
        return self.io.logits(self.own, h)[0]                                       # (B, n, V)


def sample_next(logits, temperature, rng):  # (B, V) -> (B,) int64
    """Greedy (temperature 0): argmax, the lowest id on a tie. Otherwise one draw per row from
    softmax(logits / temperature), by inverting the CDF with one uniform number per row.
    A negative temperature would sample softmax(-logits), inf the uniform distribution, nan garbage:
    each is refused, naming the argument."""
    if nonnegative_float(temperature, "temperature") == 0:
        return logits.argmax(axis=-1)
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(axis=-1, keepdims=True))                 # (B, V), unnormalised
    cdf = np.cumsum(p, axis=-1)                                   # (B, V)
    u = rng.random(logits.shape[0])[:, None] * cdf[:, -1:]        # (B, 1) uniform on [0, total)
    return np.minimum((cdf <= u).sum(axis=-1), logits.shape[-1] - 1)


# ---- data ------------------------------------------------------------------------------------
_GRAMMAR = {
    "det": ["the", "a", "every", "one", "this", "that"],
    "adj": ["small", "old", "green", "quiet", "bright", "heavy", "round", "cold", "happy", "dark"],
    "noun": ["cat", "dog", "bird", "tree", "river", "stone", "house", "child", "ship", "cloud",
             "king", "horse", "lamp", "book", "wolf"],
    "verb_t": ["sees", "finds", "likes", "follows", "hears", "carries", "holds", "watches", "makes"],
    "verb_i": ["sleeps", "runs", "sings", "waits", "falls", "shines", "turns", "grows"],
    "adv": ["slowly", "today", "again", "quickly", "alone", "there", "often"],
    "prep": ["near", "under", "over", "behind", "with", "beside"],
    "conj": ["and", "but", "while", "because"],
}


def _noun_phrase(rng):
    words = [rng.choice(_GRAMMAR["det"])]
    if rng.random() < 0.5:
        words.append(rng.choice(_GRAMMAR["adj"]))
    words.append(rng.choice(_GRAMMAR["noun"]))
    if rng.random() < 0.2:
        words += [rng.choice(_GRAMMAR["prep"])] + _noun_phrase(rng)[:3]
    return words


def _clause(rng):
    words = _noun_phrase(rng)
    if rng.random() < 0.55:
        words += [rng.choice(_GRAMMAR["verb_t"])] + _noun_phrase(rng)
    else:
        words.append(rng.choice(_GRAMMAR["verb_i"]))
    if rng.random() < 0.3:
        words.append(rng.choice(_GRAMMAR["adv"]))
    return words


def grammar_corpus(n_chars=200_000, seed=0):
    """Sentences of a small probabilistic grammar (lower-case letters, space, '.', '\\n').

    ``the old dog sees a river quickly. one cat sleeps and the bird sings.`` -- the words are
    deterministic given their first letters often enough for a small model to learn spelling,
    and the grammar gives it word order to learn. Deterministic given ``seed``.
    """
    rng = np.random.default_rng(seed)
    out, size = [], 0
    while size < n_chars:
        words = _clause(rng)
        if rng.random() < 0.3:
            words += [rng.choice(_GRAMMAR["conj"])] + _clause(rng)
        sentence = " ".join(words) + (".\n" if rng.random() < 0.2 else ". ")
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n_chars]


class CharVocab:
    """Characters <-> ids; the alphabet is the sorted set of characters of ``text``."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self):
        return len(self.chars)

    def encode(self, text):
        return np.array([self.index[c] for c in text], dtype=np.int64)

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)


def batches(ids, batch_size, seq_len, seed):
    """Endless (tokens, targets) pairs, each (batch_size, seq_len): random windows of ``ids``,
    targets shifted by one. Deterministic given ``seed``."""
    rng = np.random.default_rng(seed)
    ids = np.asarray(ids)
    offsets = np.arange(seq_len + 1)
    while True:
        starts = rng.integers(0, ids.size - seq_len - 1, size=batch_size)
        window = ids[starts[:, None] + offsets]                       # (B, S + 1)
        yield window[:, :-1], window[:, 1:]
