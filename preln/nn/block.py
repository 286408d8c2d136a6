"""The Transformer encoder block, Pre-LN or Post-LN, with a hand-written backward.

    Pre-LN  (Xiong et al. 2020, arXiv 2002.04745):  h = x + Attn(LN1(x));   y = h + MLP(LN2(h))
    Post-LN (Vaswani et al. 2017, arXiv 1706.03762): h = LN1(x + Attn(x));   y = LN2(h + MLP(h))

Parameters carry the names and layouts of ``torch.nn.TransformerEncoderLayer(batch_first=True)``,
and given the same weights the block computes the same output and gradients. The backward is the
forward read from the bottom up; each line says which forward line it undoes.

Decoding (causal blocks, eval mode): ``kv = block.kv_cache(B, max_len)`` preallocates the keys and
values of every head, and ``block.decode(x_new, kv)`` runs the block on the next n positions only,
attending to every position before them through the cache -- the KV cache of autoregressive
Transformer decoding (Pope et al. 2022, arXiv 2211.05102, section 2; Kwon et al. 2023, arXiv
2309.06180, section 2.2). Concatenated over any split of a sequence, the outputs are the full causal
forward's: every op but attention works on each position alone, and causal attention at position t
reads only the keys and values of positions <= t, which the cache holds.

Fused kernels (``fused=True``, the default): a float32 or float64 block under the safe policy, with
no tracer and no dropout in the pass, runs each memory-bound chain between two matmuls as one
kernel of :mod:`preln.ops.fused` -- the residual add with the LayerNorm after it (and the bias of
the linear before it), bias + GELU, the softmax (scale, mask, max, exp, sum, divide), and the last
bias with the residual add -- instead of one numpy pass per op. The equations, the parameters and
what the backward reads are the same; the results agree to round-off. ``fused=False``, 16-bit
storage, the naive policy, ``trace`` and ``check_finite`` run every op separately (the tracer
names the op whose output overflows; a fused kernel has no such intermediate to name).

Default initialisation is PyTorch's:
    self_attn.in_proj_weight   Xavier uniform, U(+-sqrt(6 / (E + 3E)))
    self_attn.in_proj_bias     0
    self_attn.out_proj.weight  U(+-1/sqrt(E))   (nn.Linear: Kaiming uniform with a = sqrt 5)
    self_attn.out_proj.bias    0
    linear1.weight, .bias      U(+-1/sqrt(E))
    linear2.weight, .bias      U(+-1/sqrt(F))
    norm1, norm2               weight 1, bias 0
"""
from typing import NamedTuple

import numpy as np

from preln.nn.base import BlockBase, KVStore, block_backward, block_cache_type, block_equations
from preln.validation import check_input, check_mask, positive_int
from preln.nn.config import BlockConfig
from preln.ops import (activation_backward, activation_forward, attention_backward, attention_forward,
                  dropout_backward, dropout_forward, layer_norm_backward, layer_norm_forward,
                  linear_backward, linear_forward, merge_heads, split_heads)
from preln.ops.fused import FUSED_DTYPES, add_layer_norm, bias_gelu, bias_residual, gelu_backward
from preln.ops.fused import layer_norm as fused_layer_norm
from preln.precision import SAFE, Watch

__all__ = ["TransformerBlock", "PreLNTransformerBlock", "KVCache", "param_shapes", "init_params",
           "default_heads", "OpByOp", "Fused", "Reference", "LINEAR_PARAMS"]


def param_shapes(config):
    """The 12 state-dict keys of nn.TransformerEncoderLayer and their shapes (E = D, F = d_ff)."""
    E, F = config.d_model, config.d_ff
    return {
        "self_attn.in_proj_weight": (3 * E, E),   # rows [q; k; v]
        "self_attn.in_proj_bias": (3 * E,),
        "self_attn.out_proj.weight": (E, E),
        "self_attn.out_proj.bias": (E,),
        "linear1.weight": (F, E),
        "linear1.bias": (F,),
        "linear2.weight": (E, F),
        "linear2.bias": (E,),
        "norm1.weight": (E,),
        "norm1.bias": (E,),
        "norm2.weight": (E,),
        "norm2.bias": (E,),
    }


def init_params(config, rng, dtype):
    """PyTorch's default initialisation (see the module docstring), drawn in float64, then cast."""
    E, F = config.d_model, config.d_ff
    u = lambda bound, shape: rng.uniform(-bound, bound, size=shape)
    params = {
        "self_attn.in_proj_weight": u(np.sqrt(6.0 / (E + 3 * E)), (3 * E, E)),
        "self_attn.in_proj_bias": np.zeros(3 * E),
        "self_attn.out_proj.weight": u(1 / np.sqrt(E), (E, E)),
        "self_attn.out_proj.bias": np.zeros(E),
        "linear1.weight": u(1 / np.sqrt(E), (F, E)),
        "linear1.bias": u(1 / np.sqrt(E), (F,)),
        "linear2.weight": u(1 / np.sqrt(F), (E, F)),
        "linear2.bias": u(1 / np.sqrt(F), (E,)),
        "norm1.weight": np.ones(E), "norm1.bias": np.zeros(E),
        "norm2.weight": np.ones(E), "norm2.bias": np.zeros(E),
    }
    return {k: v.astype(dtype) for k, v in params.items()}


class AttnBlockCache(NamedTuple):
    in_proj: tuple    # LinearCache of qkv = h @ W_in.T + b_in
    sdpa: tuple       # AttentionCache
    out_proj: tuple   # LinearCache of a = o @ W_out.T + b_out
    drop_mask: object  # dropout1 mask, (B, S, D) bool or None


class MLPCache(NamedTuple):
    linear1: tuple
    act: tuple
    hidden_mask: object  # dropout mask of the hidden layer, (B, S, F) bool or None
    linear2: tuple
    drop_mask: object    # dropout2 mask, (B, S, D) bool or None


#: (shape, ln1, attn, ln2, mlp, fused): the input's (B, S, D), the LayerNorm caches, an
#: AttnBlockCache, an MLPCache, whether the fused kernels ran
BlockCache = block_cache_type("BlockCache", "ln1", "ln2")


class KVCache(KVStore):
    """The keys and values of one causal attention layer, preallocated for ``max_len`` positions.

    k, v:    (B, H, max_len, d_h) arrays in ``dtype``; positions ``0 .. length - 1`` are filled.
    length:  how many positions have been decoded so far (0 for a fresh cache).
    nbytes:  2 * B * max_len * D * itemsize -- K and V, whatever ``length`` is: the memory is
             reserved up front for max_len positions, as the serving systems that Kwon et al.
             2023 (arXiv 2309.06180, section 3) describe do.

    Made by :meth:`preln.TransformerBlock.kv_cache`; filled by :meth:`preln.TransformerBlock.decode`.
    """

    def __repr__(self):
        return self._repr("n_heads")


# ---- the parts of block_equations ----------------------------------------------------------------
_NORMS = {1: "norm1", 2: "norm2"}
#: the bias of the linear before residual i: a fused kernel adds it together with the residual
_LAST_BIAS = {1: "self_attn.out_proj.bias", 2: "linear2.bias"}


class OpByOp:
    """A TransformerBlock's parts with every op its own numpy call, each output watched (the
    overflow tracer names the op); any dtype, policy and dropout."""

    fused = False

    def __init__(self, block, kpm=None, watch=None, kv=None):
        self.block, self.kpm, self.kv = block, kpm, kv
        self.watch = Watch() if watch is None else watch

    def norm(self, i, x):
        return self.block._norm(_NORMS[i], x, self.watch)

    def attention(self, h):
        return self.block._attention(h, self.kpm, self.watch, self.kv)

    def mlp(self, h):
        return self.block._mlp(h, self.watch)

    def add(self, i, x, a):
        return self.watch(f"residual{i}", x + a, x, a)

    def add_norm(self, i, x, a, j):
        r = self.add(i, x, a)
        h, cache = self.norm(j, r)
        return r, h, cache

    # the backward's parts
    def norm_backward(self, i, dh, cache, dres):
        dx = self.block._norm_backward(_NORMS[i], dh, cache)
        return dx if dres is None else dres + dx

    def attention_backward(self, da, cache):
        return self.block._attention_backward(da, cache, self.fused)

    def mlp_backward(self, dm, cache):
        return self.block._mlp_backward(dm, cache, self.fused)


class Fused(OpByOp):
    """The parts with every memory-bound chain one kernel of :mod:`preln.ops.fused`: the residual
    add with the LayerNorm after it and the bias of the linear before it, bias + GELU, the softmax,
    the last bias with the residual add. Attention and MLP leave their last bias to add / add_norm."""

    fused = True

    def norm(self, i, x):
        p = self.block.params
        return fused_layer_norm(x, p[f"{_NORMS[i]}.weight"], p[f"{_NORMS[i]}.bias"], self.block.config.eps)

    def attention(self, h):                                   # Attn(h) - b_out
        return self.block._attention(h, self.kpm, self.watch, self.kv, fused=True)

    def mlp(self, h):                                         # MLP(h) - b2
        return self.block._mlp_fused(h, keep=self.kv is None)

    def add(self, i, x, a0):                                  # x + a0 + b, one pass
        return bias_residual(x, a0, self.block.params[_LAST_BIAS[i]])

    def add_norm(self, i, x, a0, j):                          # r = x + a0 + b, N_j(r), one pass
        p = self.block.params
        return add_layer_norm(x, a0, p[_LAST_BIAS[i]], p[f"{_NORMS[j]}.weight"],
                              p[f"{_NORMS[j]}.bias"], self.block.config.eps)


class Reference:
    """The eval-mode block on its parameters alone, op by op, with two parts of its own: the linear
    layers, ``linear(name, h (N, in)) -> (N, out)`` for name in in_proj, out_proj, linear1, linear2
    (quantised ones, say; None: h W^T + b), and the attention core, ``attend(q, k, v) -> o``, each
    (..., D) (a paged KV store, say; None: causal or bidirectional attention over the S axis, with
    ``key_padding_mask``). ``record``: a dict that receives the named intermediates (ln1, in_proj,
    attn, out_proj, residual1, ln2, linear1, act, linear2)."""

    def __init__(self, params, config, linear=None, attend=None, record=None, key_padding_mask=None):
        self.p, self.config = params, config
        self.linear = self._linear if linear is None else linear
        self.attend = self._attend if attend is None else attend
        self.rec = {} if record is None else record
        self.kpm = key_padding_mask

    def _linear(self, name, h):
        w, b = LINEAR_PARAMS[name]
        return h @ self.p[w].T + self.p[b]

    def _attend(self, q, k, v):  # (B, S, D) each -> (B, S, D)
        cfg = self.config
        q, k, v = (split_heads(t, cfg.n_heads) for t in (q, k, v))      # (B, H, S, d_h)
        return merge_heads(attention_forward(q, k, v, self.kpm, cfg.causal)[0])

    def lin(self, name, h):  # (..., in) -> (..., out), in h's dtype
        out = np.asarray(self.linear(name, h.reshape(-1, h.shape[-1])), dtype=h.dtype)
        out = out.reshape(*h.shape[:-1], -1)
        self.rec[name] = out
        return out

    def norm(self, i, x):
        p, name = self.p, _NORMS[i]
        out = layer_norm_forward(x, p[f"{name}.weight"], p[f"{name}.bias"], self.config.eps)[0]
        self.rec[f"ln{i}"] = out
        return out, None

    def attention(self, h):
        q, k, v = np.split(self.lin("in_proj", h), 3, axis=-1)           # (..., D) each
        o = self.attend(q, k, v)                                         # (..., D)
        self.rec["attn"] = o
        return self.lin("out_proj", o), None

    def mlp(self, h):
        g = activation_forward(self.lin("linear1", h), self.config.activation)[0]   # (..., F)
        self.rec["act"] = g
        return self.lin("linear2", g), None

    def add(self, i, x, a):
        return x + a

    def add_norm(self, i, x, a, j):
        r = x + a
        if i == 1:
            self.rec["residual1"] = r
        return (r, *self.norm(j, r))


#: the block's four linear layers: name -> (weight, bias) parameter names
LINEAR_PARAMS = {"in_proj": ("self_attn.in_proj_weight", "self_attn.in_proj_bias"),
                 "out_proj": ("self_attn.out_proj.weight", "self_attn.out_proj.bias"),
                 "linear1": ("linear1.weight", "linear1.bias"),
                 "linear2": ("linear2.weight", "linear2.bias")}


class TransformerBlock(BlockBase):
    """One Pre-LN or Post-LN encoder block with PyTorch's ``nn.TransformerEncoderLayer`` parameters
    and semantics (https://pytorch.org/docs/stable/generated/torch.nn.TransformerEncoderLayer.html);
    the hyper-parameters are a :class:`preln.BlockConfig`.

    dtype: float64 | float32 | float16 | bfloat16 -- parameters and activations are stored in it
        (None: float32).
    seed: seeds the ``np.random.Generator`` (``block.rng``) used for initialisation and dropout.
    policy: "safe" | "naive" | a :class:`preln.Policy` -- where 16-bit arithmetic happens.
    check_finite: raise FloatingPointError naming the first op whose output is not finite.
    trace: record that op in ``block.overflow`` (an :class:`preln.Overflow`, or None) without raising.
    attention: "auto" (tiled in eval mode, plain in training mode), "plain" or "tiled" (in
        training: FlashAttention-2's forward and backward, O(S) memory, dropout redrawn per tile).
    fused: True -- the fused kernels where they apply (see the module docstring); False -- every op
        as a separate numpy call.
    """

    config_type, kv_type, default_dtype = BlockConfig, KVCache, np.float32
    shapes_of, init_of = staticmethod(param_shapes), staticmethod(init_params)
    kv_heads = ("n_heads", "H")

    # ---- forward ---------------------------------------------------------------------------------
    def __call__(self, x, key_padding_mask=None):
        return self.forward(x, key_padding_mask)

    def forward(self, x, key_padding_mask=None):
        """x: (B, S, D); key_padding_mask: (B, S) bool, True = padding key -> y: (B, S, D)."""
        self._cache = None                                        # a forward that raises leaves no cache
        x = check_input(x, self.config.d_model, self.dtype)      # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        watch = self._watch()
        with np.errstate(all="ignore"):   # non-finite values are the Watch's to report
            y, cache = self._layers(x, kpm, watch)
        self.overflow = watch.first
        self._cache = cache
        return y

    def _layers(self, x, kpm, watch, kv=None):  # (B, S, D) -> (B, S, D), BlockCache
        """The block's equations over the fused or the op-by-op parts; with ``kv`` the attention
        reads and extends a KV cache."""
        fused = self.fuses()
        parts = (Fused if fused else OpByOp)(self, kpm, watch, kv)
        y, caches = block_equations(x, parts, self.config.norm_first)
        return y, BlockCache(x.shape, *caches, fused=fused)

    def fuses(self):
        """Whether the next forward (or decode) runs the fused kernels: ``fused`` is on, the dtype
        is float32 or float64, the policy is the safe one, no tracer, no dropout in this mode."""
        return (self.fused and self.dtype in FUSED_DTYPES and self.policy == SAFE
                and not (self.trace or self.check_finite) and self._drop_p() == 0)

    def _mlp_fused(self, h, keep):  # (B, S, D) -> (B, S, D) without linear2's bias
        p, cfg, pol = self.params, self.config, self.policy
        if cfg.activation == "gelu":                              # bias + GELU in one pass
            u0, c1 = linear_forward(h, p["linear1.weight"], None, pol)               # (B, S, F)
            g, c_act = bias_gelu(u0, p["linear1.bias"], keep)     # keep u and Phi(u) for a backward
        else:
            u, c1 = linear_forward(h, p["linear1.weight"], p["linear1.bias"], pol)   # (B, S, F)
            g, c_act = activation_forward(u, cfg.activation)
        m0, c2 = linear_forward(g, p["linear2.weight"], None, pol)                   # (B, S, D)
        return m0, MLPCache(c1, c_act, None, c2, None)

    # ---- decoding with a KV cache ----------------------------------------------------------------
    def decode(self, x_new, kv):
        """Run the block on the next n positions of B sequences, given a
        :class:`preln.nn.block.KVCache` of the positions before them; x_new: (B, n, D), n >= 1 ->
        y_new: (B, n, D).

        Appends the n positions' keys and values to ``kv`` (``kv.length`` grows by n). Eval mode
        only, causal blocks only, no padding mask (every sequence of the batch is at the same
        position). Nothing is kept for a backward: ``block.backward`` still differentiates the
        last ``forward``.
        """
        x = self._check_decode(x_new, kv)                         # (B, n, D)
        watch = self._watch()
        with np.errstate(all="ignore"):
            y, _ = self._layers(x, None, watch, kv)
        self.overflow = watch.first
        kv.length += x.shape[1]                                   # only once the step has succeeded
        return y

    def _check_causal(self, name):
        if not self.config.causal:
            raise ValueError(f"{name}: expected a causal block (BlockConfig(causal=True)); this one "
                             "is bidirectional, so every position reads every later one and a cache "
                             "of earlier positions is not enough")

    def _norm(self, name, x, watch):
        p = self.params
        y, cache = layer_norm_forward(x, p[f"{name}.weight"], p[f"{name}.bias"], self.config.eps,
                                      self.policy, watch.scope(name))
        return watch(name, y, x), cache

    def _drop_p(self):
        return self.config.dropout if self.training else 0.0

    def _attention(self, h, kpm, watch, kv=None, fused=False):  # (B, S, D) -> (B, S, D)
        """Attn(h); with ``fused`` the plain path's softmax is the fused kernel and the output
        projection leaves its bias for the caller's fused kernel to add."""
        p, cfg, pol = self.params, self.config, self.policy
        qkv, c_in = linear_forward(h, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"], pol)
        watch("attn.in_proj", qkv, h)                             # (B, S, 3D)
        q, k, v = (split_heads(t, cfg.n_heads) for t in np.split(qkv, 3, axis=-1))  # 3 x (B, H, S, d_h)
        o, c_sdpa = self._sdpa(q, k, v, kpm, cfg.causal, watch, kv, fused, self._drop_p(), self.rng)
        o = merge_heads(o)                                        # (B, S, D)
        b_out = None if fused else p["self_attn.out_proj.bias"]
        a, c_out = linear_forward(o, p["self_attn.out_proj.weight"], b_out, pol)
        watch("attn.out_proj", a, o)
        a, mask = dropout_forward(a, self._drop_p(), self.rng)    # dropout1
        return a, AttnBlockCache(c_in, c_sdpa, c_out, mask)

    def _mlp(self, h, watch):  # (B, S, D) -> (B, S, D)
        p, cfg, pol = self.params, self.config, self.policy
        u, c1 = linear_forward(h, p["linear1.weight"], p["linear1.bias"], pol)   # (B, S, F)
        watch("mlp.linear1", u, h)
        g, c_act = activation_forward(u, cfg.activation)
        watch(f"mlp.{cfg.activation}", g, u)
        g, hidden_mask = dropout_forward(g, self._drop_p(), self.rng)            # dropout
        z, c2 = linear_forward(g, p["linear2.weight"], p["linear2.bias"], pol)   # (B, S, D)
        watch("mlp.linear2", z, g)
        z, mask = dropout_forward(z, self._drop_p(), self.rng)                   # dropout2
        return z, MLPCache(c1, c_act, hidden_mask, c2, mask)

    # ---- backward: the forward read from the bottom up -----------------------------------------
    def backward(self, dy):
        """dy = dL/dy, (B, S, D) -> dL/dx, (B, S, D); adds dL/dparam into ``self.grads``."""
        c, dy = self._backward_input(dy)
        parts = (Fused if c.fused else OpByOp)(self)
        with np.errstate(all="ignore"):
            return block_backward(dy, c, parts, self.config.norm_first)

    def _norm_backward(self, name, dy, cache):
        dx, dgamma, dbeta = layer_norm_backward(dy, cache, self.policy)
        self._accumulate(f"{name}.weight", dgamma)
        self._accumulate(f"{name}.bias", dbeta)
        return dx

    def _attention_backward(self, da, c, fused=False):  # (B, S, D) -> (B, S, D)
        cfg, pol = self.config, self.policy
        da = dropout_backward(da, c.drop_mask, cfg.dropout)                      # dropout1
        do, dw, db = linear_backward(da, c.out_proj, pol)                        # a = o W_out^T + b
        self._accumulate("self_attn.out_proj.weight", dw)
        self._accumulate("self_attn.out_proj.bias", db)
        dqkv = np.empty(do.shape[:-1] + (3 * do.shape[-1],), dtype=do.dtype)     # (B, S, 3D), as qkv
        dq, dk, dv = (split_heads(t, cfg.n_heads) for t in np.split(dqkv, 3, axis=-1))  # 3 views (B, H, S, d_h)
        attention_backward(split_heads(do, cfg.n_heads), c.sdpa, out=(dq, dk, dv),  # o = attn(q, k, v)
                           fused=fused)
        dh, dw, db = linear_backward(dqkv, c.in_proj, pol)                       # qkv = h W_in^T + b
        self._accumulate("self_attn.in_proj_weight", dw)
        self._accumulate("self_attn.in_proj_bias", db)
        return dh

    def _mlp_backward(self, dz, c, fused=False):  # (B, S, D) -> (B, S, D)
        p_drop, pol = self.config.dropout, self.policy
        dz = dropout_backward(dz, c.drop_mask, p_drop)                           # dropout2
        dg, dw, db = linear_backward(dz, c.linear2, pol)                         # z = g W2^T + b2
        self._accumulate("linear2.weight", dw)
        self._accumulate("linear2.bias", db)
        dg = dropout_backward(dg, c.hidden_mask, p_drop)                         # dropout
        if fused and c.act.kind == "gelu":
            du = gelu_backward(dg, c.act)                                        # g = u Phi(u), one pass
        else:
            du = activation_backward(dg, c.act)                                  # g = act(u)
        dh, dw, db = linear_backward(du, c.linear1, pol)                         # u = h W1^T + b1
        self._accumulate("linear1.weight", dw)
        self._accumulate("linear1.bias", db)
        return dh


def default_heads(d_model):
    """The largest of 8, 4, 2 heads that divides d_model with d_h >= 8; else 1."""
    for h in (8, 4, 2):
        if d_model % h == 0 and d_model // h >= 8:
            return h
    return 1


class PreLNTransformerBlock(TransformerBlock):
    """A Pre-LN block from its width alone: ``PreLNTransformerBlock(d_model=16).forward(x)``.

    n_heads defaults to :func:`default_heads`, d_ff to 4 d_model, dtype to float64; other keywords
    go to :class:`BlockConfig` (activation, dropout, eps, causal).
    """

    def __init__(self, d_model=64, n_heads=None, d_ff=None, dtype=np.float64, seed=0, **config):
        d_model = positive_int(d_model, "d_model")
        cfg = BlockConfig(d_model=d_model, n_heads=n_heads or default_heads(d_model),
                          d_ff=d_ff or 4 * d_model, norm_first=True, **config)
        super().__init__(cfg, dtype=dtype, seed=seed)
