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
from functools import partial
from typing import NamedTuple

import numpy as np

from preln.nn.base import (DEFAULT_DTYPE, BlockBase, Branch, KVStore, Norm, Residual, Sublayer, added,
                             block_cache_type)
from preln.validation import check_input, check_mask, positive_int
from preln.nn.config import BlockConfig
from preln.ops import (activation_backward, activation_forward, attention_backward, dropout_backward,
                       dropout_forward, layer_norm_backward, layer_norm_forward, linear_backward,
                       linear_forward, merge_heads, sdpa, split_heads)
from preln.ops.fused import FUSED_DTYPES, add_layer_norm, bias_gelu, bias_residual, gelu_backward
from preln.ops.fused import layer_norm as fused_layer_norm
from preln.precision import SAFE

__all__ = ["TransformerBlock", "PreLNTransformerBlock", "KVCache", "param_shapes", "init_params",
           "default_heads", "LayerNorm", "MultiheadAttention", "MLP", "LINEAR_PARAMS"]


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
BlockCache = block_cache_type("BlockCache", "ln1", "ln2", __name__)


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


#: the block's four linear layers: name -> (weight, bias) parameter names
LINEAR_PARAMS = {"in_proj": ("self_attn.in_proj_weight", "self_attn.in_proj_bias"),
                 "out_proj": ("self_attn.out_proj.weight", "self_attn.out_proj.bias"),
                 "linear1": ("linear1.weight", "linear1.bias"),
                 "linear2": ("linear2.weight", "linear2.bias")}


# ---- the sublayers ------------------------------------------------------------------------------
class LayerNorm(Norm):
    """norm1 or norm2: LN(x) = (x - mean) / sqrt(var + eps) gamma + beta over D. Fused, after a
    residual sum: the sum, the bias its sublayer left out and the LayerNorm in one kernel."""

    def __call__(self, x):  # (B, S, D) or a Residual -> (B, S, D)
        b = self.block
        gamma, beta, eps = b.params[f"{self.name}.weight"], b.params[f"{self.name}.bias"], b.config.eps
        if self.fused and isinstance(x, Residual):          # r = x + (a0 + bias), LN(r): one pass
            x.sum, y, self.cache = add_layer_norm(x.x, x.branch.out, x.branch.bias, gamma, beta, eps)
            return y
        x = added(x)
        if self.fused:
            y, self.cache = fused_layer_norm(x, gamma, beta, eps)
            return y
        y, self.cache = layer_norm_forward(x, gamma, beta, eps, self.policy, self.watch.scope(self.name))
        return self.watch(self.name, y, x)

    def backward(self, dy, cache, dskip=None):  # -> dL/dx, plus dskip when x feeds a residual too
        dx, dgamma, dbeta = layer_norm_backward(dy, cache, self.policy)
        self.grad(f"{self.name}.weight", dgamma)
        self.grad(f"{self.name}.bias", dbeta)
        return dx if dskip is None else dskip + dx


class _Branch(Sublayer):
    """What attention and the MLP share: the block's dropout in training, and their last bias --
    added by their last linear, or by the fused residual kernel after them (``fused``), or, with
    ``last_bias`` False, by someone else (a tensor-parallel shard adds it once, after the sum)."""

    last_bias = True

    def __init__(self, block, watch=None, fused=False):
        super().__init__(block, watch, fused)
        self.p_drop = block.config.dropout if block.training else 0.0

    def into_residual(self, out, residual, last):  # last: the last linear, out_proj or linear2
        if not self.fused:
            return self.branch(out, residual)
        bias = self.block.params[LINEAR_PARAMS[last][1]]
        return Branch(out, partial(bias_residual, b=bias), bias)      # x + (a0 + b), one pass

    def last_backward(self, da, drop_mask, cache, last):  # -> dL/d(the last linear's input)
        """The backward of the sublayer's end: its dropout and its last linear."""
        da = dropout_backward(da, drop_mask, self.block.config.dropout)
        dx, dw, db = linear_backward(da, cache, self.policy)          # out = x W^T + b
        w, b = LINEAR_PARAMS[last]
        self.grad(w, dw)
        if self.last_bias:
            self.grad(b, db)
        return dx


class MultiheadAttention(_Branch):
    """Attn(h) of nn.MultiheadAttention: qkv = h W_in^T + b_in, H heads of scaled dot-product
    attention (:func:`preln.ops.sdpa`), a = o W_out^T + b_out, dropout1. Fused: the plain path's
    softmax is one kernel and b_out is left to the residual's kernel."""

    def __init__(self, block, watch=None, fused=False, key_padding_mask=None, kv=None):
        super().__init__(block, watch, fused)
        self.kpm, self.kv = key_padding_mask, kv

    def __call__(self, h):  # (B, S, D) -> Attn(h), a Branch of the residual stream
        b, w, cfg = self.block, self.watch, self.block.config
        qkv, c_in = b.linear("in_proj")(h)
        w("attn.in_proj", qkv, h)                                                # (B, S, 3D)
        q, k, v = (split_heads(t, cfg.n_heads) for t in np.split(qkv, 3, axis=-1))  # 3 x (B, H, S, d_h)
        o, c_sdpa = sdpa(q, k, v, self.kpm, cfg.causal, self.policy, w.scope("attn"), tiled=b.tiled(),
                         training=b.training, dropout_p=self.p_drop, rng=b.rng, fused=self.fused, kv=self.kv)
        o = merge_heads(o)                                                       # (B, S, D)
        a, c_out = b.linear("out_proj", bias=self.last_bias and not self.fused)(o)
        w("attn.out_proj", a, o)
        a, mask = dropout_forward(a, self.p_drop, b.rng)                         # dropout1
        self.cache = AttnBlockCache(c_in, c_sdpa, c_out, mask)
        return self.into_residual(a, "residual1", "out_proj")

    def backward(self, da, c):  # (B, S, D) -> (B, S, D)
        H, pol = self.block.config.n_heads, self.policy
        do = self.last_backward(da, c.drop_mask, c.out_proj, "out_proj")        # a = dropout1(o W_out^T + b)
        dqkv = np.empty(do.shape[:-1] + (3 * do.shape[-1],), dtype=do.dtype)     # (B, S, 3D), as qkv
        dq, dk, dv = (split_heads(t, H) for t in np.split(dqkv, 3, axis=-1))    # 3 views (B, H, S, d_h)
        attention_backward(split_heads(do, H), c.sdpa, out=(dq, dk, dv),        # o = attn(q, k, v)
                           fused=self.fused)
        dh, dw, db = linear_backward(dqkv, c.in_proj, pol)                       # qkv = h W_in^T + b
        self.grad("self_attn.in_proj_weight", dw)
        self.grad("self_attn.in_proj_bias", db)
        return dh


class MLP(_Branch):
    """MLP(h) = dropout2(linear2(dropout(act(linear1(h))))). Fused: bias + GELU in one kernel and
    linear2's bias left to the residual's kernel; ``keep=False`` (decoding) keeps nothing."""

    def __init__(self, block, watch=None, fused=False, keep=True):
        super().__init__(block, watch, fused)
        self.keep = keep

    def __call__(self, h):  # (B, S, D) -> MLP(h), a Branch of the residual stream
        b, w, cfg = self.block, self.watch, self.block.config
        if self.fused and cfg.activation == "gelu":                              # bias + GELU in one pass
            u0, c1 = b.linear("linear1", bias=False)(h)                          # (B, S, F)
            g, c_act = bias_gelu(u0, b.params["linear1.bias"], self.keep)               # keeps u, Phi(u) to train
        else:
            u, c1 = b.linear("linear1")(h)                                       # (B, S, F)
            w("mlp.linear1", u, h)
            g, c_act = activation_forward(u, cfg.activation)
            w(f"mlp.{cfg.activation}", g, u)
        g, hidden_mask = dropout_forward(g, self.p_drop, b.rng)                  # dropout
        z, c2 = b.linear("linear2", bias=self.last_bias and not self.fused)(g)   # (B, S, D)
        w("mlp.linear2", z, g)
        z, mask = dropout_forward(z, self.p_drop, b.rng)                         # dropout2
        self.cache = MLPCache(c1, c_act, hidden_mask, c2, mask)
        return self.into_residual(z, "residual2", "linear2")

    def backward(self, dz, c):  # (B, S, D) -> (B, S, D)
        p_drop, pol = self.block.config.dropout, self.policy
        dg = self.last_backward(dz, c.drop_mask, c.linear2, "linear2")          # z = dropout2(g W2^T + b2)
        dg = dropout_backward(dg, c.hidden_mask, p_drop)                         # dropout
        if self.fused and c.act.kind == "gelu":
            du = gelu_backward(dg, c.act)                                        # g = u Phi(u), one pass
        else:
            du = activation_backward(dg, c.act)                                  # g = act(u)
        dh, dw, db = linear_backward(du, c.linear1, pol)                         # u = h W1^T + b1
        self.grad("linear1.weight", dw)
        self.grad("linear1.bias", db)
        return dh


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

    config_type, kv_type = BlockConfig, KVCache
    shapes_of, init_of = staticmethod(param_shapes), staticmethod(init_params)
    kv_heads = ("n_heads", "H")

    # ---- forward: the block's equations over this pass's sublayers ------------------------------
    def __call__(self, x, key_padding_mask=None):
        return self.forward(x, key_padding_mask)

    def forward(self, x, key_padding_mask=None):
        """x: (B, S, D); key_padding_mask: (B, S) bool, True = padding key -> y: (B, S, D)."""
        self._cache = None                                        # a forward that raises leaves no cache
        x = check_input(x, self.config.d_model, self.dtype)      # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        watch, fused = self._watch(), self.fuses()
        ln1, attn, ln2, mlp = self.sublayers(watch, fused, kpm, self._kv)
        with np.errstate(all="ignore"):   # non-finite values are the Watch's to report
            if self.config.norm_first:                            # Pre-LN
                h = x + attn(ln1(x))
                y = h + mlp(ln2(h))
            else:                                                 # Post-LN
                h = ln1(x + attn(x))
                y = ln2(h + mlp(h))
            y = added(y)                                          # Pre-LN's last sum, (B, S, D)
        self.overflow = watch.first
        self._cache = BlockCache(x.shape, ln1.cache, attn.cache, ln2.cache, mlp.cache, fused=fused)
        return y

    def sublayers(self, watch=None, fused=False, key_padding_mask=None, kv=None):
        """(ln1, attn, ln2, mlp) for one pass: the fused kernels or every op its own call, the
        attention reading and extending ``kv`` when decoding."""
        return (LayerNorm(self, "norm1", watch, fused),
                MultiheadAttention(self, watch, fused, key_padding_mask, kv),
                LayerNorm(self, "norm2", watch, fused),
                MLP(self, watch, fused, keep=kv is None))

    def linear(self, name, bias=True):  # -> h (B, S, in) -> (h W^T + b (B, S, out), LinearCache)
        """The linear layer ``name`` (in_proj, out_proj, linear1, linear2) as a function; ``bias``
        False leaves its bias to the kernel after it (fused) or to the sum of the shards."""
        w, b = LINEAR_PARAMS[name]
        return partial(linear_forward, w=self.params[w], b=self.params[b] if bias else None, policy=self.policy)

    def fuses(self):
        """Whether the next forward (or decode) runs the fused kernels: ``fused`` is on, the dtype
        is float32 or float64, the policy is the safe one, no tracer, no dropout in this mode."""
        return (self.fused and self.dtype in FUSED_DTYPES and self.policy == SAFE
                and not (self.trace or self.check_finite) and not (self.training and self.config.dropout))

    def _check_causal(self, name):
        if not self.config.causal:
            raise ValueError(f"{name}: expected a causal block (BlockConfig(causal=True)); this one "
                             "is bidirectional, so every position reads every later one and a cache "
                             "of earlier positions is not enough")

    # ---- backward: the forward read from the bottom up -----------------------------------------
    def backward(self, dy):
        """dy = dL/dy, (B, S, D) -> dL/dx, (B, S, D); adds dL/dparam into ``self.grads``."""
        c, dy = self._backward_input(dy)
        ln1, attn, ln2, mlp = self.sublayers(fused=c.fused)
        with np.errstate(all="ignore"):
            if self.config.norm_first:                            # Pre-LN
                dh = ln2.backward(mlp.backward(dy, c.mlp), c.ln2, dy)      # y = h + mlp(ln2(h))
                return ln1.backward(attn.backward(dh, c.attn), c.ln1, dh)  # h = x + attn(ln1(x))
            dr = ln2.backward(dy, c.ln2)                          # y = ln2(r), r = h + mlp(h)
            dh = dr + mlp.backward(dr, c.mlp)
            dr = ln1.backward(dh, c.ln1)                          # h = ln1(r), r = x + attn(x)
            return dr + attn.backward(dr, c.attn)


def default_heads(d_model):
    """The largest of 8, 4, 2 heads that divides d_model with d_h >= 8; else 1."""
    for h in (8, 4, 2):
        if d_model % h == 0 and d_model // h >= 8:
            return h
    return 1


class PreLNTransformerBlock(TransformerBlock):
    """A Pre-LN block from its width alone: ``PreLNTransformerBlock(d_model=16).forward(x)``.

    n_heads defaults to :func:`default_heads`, d_ff to 4 d_model, dtype to float32 (every block's
    default); other keywords go to :class:`BlockConfig` (activation, dropout, eps, causal).
    """

    def __init__(self, d_model=64, n_heads=None, d_ff=None, dtype=DEFAULT_DTYPE, seed=0, **config):
        d_model = positive_int(d_model, "d_model")
        cfg = BlockConfig(d_model=d_model, n_heads=n_heads or default_heads(d_model),
                          d_ff=d_ff or 4 * d_model, norm_first=True, **config)
        super().__init__(cfg, dtype=dtype, seed=seed)
