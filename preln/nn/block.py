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

from preln.validation import check_float_array, check_input, check_mask, check_same_shape
from preln.nn.config import BlockConfig
from preln.ops import (activation_backward, activation_forward, attention_backward, attention_forward,
                  dropout_backward, dropout_forward, flash_attention_forward, layer_norm_backward,
                  layer_norm_forward, linear_backward, linear_forward, merge_heads, split_heads)
from preln.ops.attention import AttentionCache
from preln.ops.fused import FUSED_DTYPES, add_layer_norm, bias_gelu, bias_residual, gelu_backward
from preln.ops.fused import layer_norm as fused_layer_norm
from preln.precision import SAFE, Watch, resolve_dtype, resolve_policy

__all__ = ["TransformerBlock", "PreLNTransformerBlock", "KVCache", "param_shapes", "init_params",
           "default_heads"]


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


class BlockCache(NamedTuple):
    shape: tuple  # (B, S, D) of the input
    ln1: tuple
    attn: AttnBlockCache
    ln2: tuple
    mlp: MLPCache
    fused: bool = False  # the forward ran the fused kernels: the backward takes the fused ones too


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int; got {value!r}")
    return int(value)


class KVCache:
    """The keys and values of one causal attention layer, preallocated for ``max_len`` positions.

    k, v:    (B, H, max_len, d_h) arrays in ``dtype``; positions ``0 .. length - 1`` are filled.
    length:  how many positions have been decoded so far (0 for a fresh cache).
    nbytes:  2 * B * max_len * D * itemsize -- K and V, whatever ``length`` is: the memory is
             reserved up front for max_len positions, as the serving systems that Kwon et al.
             2023 (arXiv 2309.06180, section 3) describe do.

    Made by :meth:`preln.TransformerBlock.kv_cache`; filled by :meth:`preln.TransformerBlock.decode`.
    """

    def __init__(self, batch, max_len, n_heads, d_head, dtype):
        self.batch = _positive_int(batch, "batch")
        self.max_len = _positive_int(max_len, "max_len")
        self.n_heads, self.d_head = int(n_heads), int(d_head)
        self.dtype = resolve_dtype(dtype)
        shape = (self.batch, self.n_heads, self.max_len, self.d_head)   # (B, H, max_len, d_h)
        self.k = np.zeros(shape, self.dtype)
        self.v = np.zeros(shape, self.dtype)
        self.length = 0

    @property
    def d_model(self):
        return self.n_heads * self.d_head

    @property
    def nbytes(self):
        """Bytes of K and V: 2 * B * max_len * D * itemsize."""
        return self.k.nbytes + self.v.nbytes

    @property
    def keys(self):     # (B, H, length, d_h), a view
        return self.k[:, :, :self.length]

    @property
    def values(self):   # (B, H, length, d_h), a view
        return self.v[:, :, :self.length]

    def reset(self):
        """Forget every position (the memory stays allocated)."""
        self.length = 0
        return self

    def __repr__(self):
        return (f"KVCache(batch={self.batch}, max_len={self.max_len}, n_heads={self.n_heads}, "
                f"d_head={self.d_head}, dtype={self.dtype}, length={self.length}, nbytes={self.nbytes})")


class TransformerBlock:
    """One Pre-LN or Post-LN encoder block with PyTorch's ``nn.TransformerEncoderLayer`` parameters
    and semantics (https://pytorch.org/docs/stable/generated/torch.nn.TransformerEncoderLayer.html);
    the hyper-parameters are a :class:`preln.BlockConfig`.

    dtype: float64 | float32 | float16 | bfloat16 -- parameters and activations are stored in it.
    seed: seeds the ``np.random.Generator`` (``block.rng``) used for initialisation and dropout.
    policy: "safe" | "naive" | a :class:`preln.Policy` -- where 16-bit arithmetic happens.
    check_finite: raise FloatingPointError naming the first op whose output is not finite.
    trace: record that op in ``block.overflow`` (an :class:`preln.Overflow`, or None) without raising.
    attention: "auto" (tiled in eval mode, plain in training mode), "plain" or "tiled".
    fused: True -- the fused kernels where they apply (see the module docstring); False -- every op
        as a separate numpy call.
    """

    def __init__(self, config, dtype=np.float32, seed=0, policy="safe", check_finite=False,
                 trace=False, attention="auto", fused=True):
        if not isinstance(config, BlockConfig):
            raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
        if attention not in ("auto", "plain", "tiled"):
            raise ValueError(f"attention: expected 'auto', 'plain' or 'tiled'; got {attention!r}")
        self.config = config
        self.dtype = resolve_dtype(dtype)
        self.policy = resolve_policy(policy)
        self.check_finite = bool(check_finite)
        self.trace = bool(trace)
        self.attention = attention
        if not isinstance(fused, bool):
            raise TypeError(f"fused: expected True or False; got {fused!r}")
        self.fused = fused
        self.rng = np.random.default_rng(seed)
        self.params = init_params(config, self.rng, self.dtype)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.training = True          # as a fresh torch.nn.Module
        self.overflow = None          # set by forward when trace or check_finite is on
        self._cache = None

    # ---- mode, gradients, state ----------------------------------------------------------------
    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for g in self.grads.values():
            g[...] = 0

    def state_dict(self):
        """A copy of the 12 parameters, keyed and shaped as nn.TransformerEncoderLayer's."""
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state_dict):
        """Load parameters (numpy arrays or torch tensors); strict: every key, no extra, exact shapes."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict: expected a dict of arrays; got {type(state_dict).__name__}")
        shapes = param_shapes(self.config)
        missing = [k for k in shapes if k not in state_dict]
        extra = [k for k in state_dict if k not in shapes]
        if missing:
            raise KeyError(f"state_dict: missing key {missing[0]!r} (missing: {missing}); "
                           f"expected the keys {list(shapes)}")
        if extra:
            raise KeyError(f"state_dict: unexpected key {extra[0]!r} (extra: {extra}); "
                           f"expected the keys {list(shapes)}")
        new = {}
        for k, shape in shapes.items():
            a = check_float_array(state_dict[k], f"state_dict[{k!r}]")
            if a.shape != shape:
                raise ValueError(f"state_dict[{k!r}]: expected shape {shape}; got {a.shape}")
            new[k] = a.astype(self.dtype, copy=True)
        self.params = new
        self.grads = {k: np.zeros_like(v) for k, v in new.items()}

    @property
    def cache(self):
        """What the last forward kept for the backward: a :class:`BlockCache` of NamedTuples named
        after the forward's variables (``cache.ln2.x`` is the input of norm2, ``cache.attn.sdpa.p``
        the attention probabilities), or None. For reading: the backward uses it as it is."""
        return self._cache

    def cache_nbytes(self):
        """Bytes the last forward keeps for the backward (activations only, parameters excluded)."""
        if self._cache is None:
            return 0
        param_ids = {id(p) for p in self.params.values()}
        seen, total = set(), 0
        stack = [self._cache]
        while stack:
            item = stack.pop()
            if isinstance(item, tuple):
                stack.extend(item)
            elif isinstance(item, np.ndarray):
                while item.base is not None and isinstance(item.base, np.ndarray):
                    item = item.base   # views (q, k, v of qkv) share their base's memory
                if id(item) not in seen and id(item) not in param_ids:
                    seen.add(id(item))
                    total += item.nbytes
        return total

    # ---- forward ---------------------------------------------------------------------------------
    def __call__(self, x, key_padding_mask=None):
        return self.forward(x, key_padding_mask)

    def forward(self, x, key_padding_mask=None):
        """x: (B, S, D); key_padding_mask: (B, S) bool, True = padding key -> y: (B, S, D)."""
        self._cache = None                                        # a forward that raises leaves no cache
        x = check_input(x, self.config.d_model, self.dtype)      # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        watch = Watch(enabled=self.trace, raise_error=self.check_finite)
        with np.errstate(all="ignore"):   # non-finite values are the Watch's to report
            y, cache = self._layers_fused(x, kpm) if self.fuses() else self._layers(x, kpm, watch)
        self.overflow = watch.first
        self._cache = cache
        return y

    def _layers(self, x, kpm, watch, kv=None):  # (B, S, D) -> (B, S, D), BlockCache
        """The block's equations; with ``kv`` the attention reads and extends a KV cache."""
        if self.config.norm_first:                                # Pre-LN
            h1, ln1 = self._norm("norm1", x, watch)               # h1 = LN1(x)
            a, attn = self._attention(h1, kpm, watch, kv)         # a  = Attn(h1)
            x1 = watch("residual1", x + a, x, a)                  # x1 = x + a
            h2, ln2 = self._norm("norm2", x1, watch)              # h2 = LN2(x1)
            m, mlp = self._mlp(h2, watch)                         # m  = MLP(h2)
            y = watch("residual2", x1 + m, x1, m)                 # y  = x1 + m
        else:                                                     # Post-LN
            a, attn = self._attention(x, kpm, watch, kv)          # a  = Attn(x)
            r1 = watch("residual1", x + a, x, a)                  # r1 = x + a
            x1, ln1 = self._norm("norm1", r1, watch)              # x1 = LN1(r1)
            m, mlp = self._mlp(x1, watch)                         # m  = MLP(x1)
            r2 = watch("residual2", x1 + m, x1, m)                # r2 = x1 + m
            y, ln2 = self._norm("norm2", r2, watch)               # y  = LN2(r2)
        return y, BlockCache(x.shape, ln1, attn, ln2, mlp)

    def fuses(self):
        """Whether the next forward (or decode) runs the fused kernels: ``fused`` is on, the dtype
        is float32 or float64, the policy is the safe one, no tracer, no dropout in this mode."""
        return (self.fused and self.dtype in FUSED_DTYPES and self.policy == SAFE
                and not (self.trace or self.check_finite) and self._drop_p() == 0)

    def _layers_fused(self, x, kpm, kv=None):  # (B, S, D) -> (B, S, D), BlockCache
        """The equations of ``_layers``, with every memory-bound chain one fused kernel. The
        attention's and the MLP's last linears leave their bias out (a0, m0): the kernel after
        them adds it, with the residual."""
        p, eps = self.params, self.config.eps
        if self.config.norm_first:                                # Pre-LN
            h1, ln1 = fused_layer_norm(x, p["norm1.weight"], p["norm1.bias"], eps)   # h1 = LN1(x)
            a0, attn = self._attention(h1, kpm, Watch(), kv, fused=True)            # a0 = Attn(h1) - b_out
            x1, h2, ln2 = add_layer_norm(x, a0, p["self_attn.out_proj.bias"],       # x1 = x + a
                                         p["norm2.weight"], p["norm2.bias"], eps)   # h2 = LN2(x1)
            m0, mlp = self._mlp_fused(h2, keep=kv is None)                          # m0 = MLP(h2) - b2
            y = bias_residual(x1, m0, p["linear2.bias"])                            # y  = x1 + m
        else:                                                     # Post-LN
            a0, attn = self._attention(x, kpm, Watch(), kv, fused=True)             # a0 = Attn(x) - b_out
            _, x1, ln1 = add_layer_norm(x, a0, p["self_attn.out_proj.bias"],        # x1 = LN1(x + a)
                                        p["norm1.weight"], p["norm1.bias"], eps)
            m0, mlp = self._mlp_fused(x1, keep=kv is None)                          # m0 = MLP(x1) - b2
            _, y, ln2 = add_layer_norm(x1, m0, p["linear2.bias"],                   # y = LN2(x1 + m)
                                       p["norm2.weight"], p["norm2.bias"], eps)
        return y, BlockCache(x.shape, ln1, attn, ln2, mlp, fused=True)

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
    def kv_cache(self, batch, max_len, dtype=None):
        """A fresh :class:`preln.nn.block.KVCache` for ``batch`` sequences of up to ``max_len`` positions.

        dtype: the cache's storage dtype; None means the block's. Another dtype (a float16 cache for
        a float32 block, say) halves the memory and rounds every key and value once.
        """
        self._check_causal("kv_cache")
        dtype = self.dtype if dtype is None else resolve_dtype(dtype)
        return KVCache(batch, max_len, self.config.n_heads, self.config.d_head, dtype)

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
        watch = Watch(enabled=self.trace, raise_error=self.check_finite)
        with np.errstate(all="ignore"):
            y, _ = self._layers_fused(x, None, kv) if self.fuses() else self._layers(x, None, watch, kv)
        self.overflow = watch.first
        kv.length += x.shape[1]                                   # only once the step has succeeded
        return y

    def _check_decode(self, x_new, kv):  # -> x_new as (B, n, D) in the block's dtype
        self._check_causal("decode")
        if self.training:
            raise RuntimeError("decode: the block is in training mode; decoding is inference -- "
                               "call block.eval() first (dropout would differ from call to call)")
        if not isinstance(kv, KVCache):
            raise TypeError(f"kv: expected a preln.nn.block.KVCache from block.kv_cache(batch, max_len); "
                            f"got {type(kv).__name__}")
        cfg = self.config
        if (kv.n_heads, kv.d_head) != (cfg.n_heads, cfg.d_head):
            raise ValueError(f"kv: expected a cache of H = {cfg.n_heads} heads of d_h = {cfg.d_head} "
                             f"(D = {cfg.d_model}); got H = {kv.n_heads}, d_h = {kv.d_head} "
                             f"(D = {kv.d_model})")
        x = check_input(x_new, cfg.d_model, self.dtype, "x_new")   # (B, n, D)
        B, n, _ = x.shape
        if B != kv.batch:
            raise ValueError(f"x_new: expected batch B = {kv.batch} (the cache's); got shape {x.shape}")
        if kv.length + n > kv.max_len:
            raise ValueError(f"kv: the cache is full: it holds {kv.length} of max_len = {kv.max_len} "
                             f"positions and x_new brings {n} more; make a cache with a larger max_len")
        return x

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
        tiled = self.attention == "tiled" or (self.attention == "auto" and not self.training)
        if kv is not None:   # decode: the n new keys and values join the cache; the queries read it all
            t0, t1 = kv.length, kv.length + q.shape[2]
            kv.k[:, :, t0:t1] = k                                 # (B, H, n, d_h) into (B, H, max_len, d_h)
            kv.v[:, :, t0:t1] = v
            o = flash_attention_forward(q, kv.k[:, :, :t1], kv.v[:, :, :t1], None, True, pol,
                                        watch.scope("attn"), q_offset=t0)   # (B, H, n, d_h)
            c_sdpa = None
        elif tiled:   # never holds the (B, H, S, S) scores; the backward recomputes P
            o = flash_attention_forward(q, k, v, kpm, cfg.causal, pol, watch.scope("attn"))
            c_sdpa = AttentionCache(q, k, v, None, None, 0.0, kpm, cfg.causal, pol)
        else:
            o, c_sdpa = attention_forward(q, k, v, kpm, cfg.causal, self._drop_p(), self.rng, pol,
                                          watch.scope("attn"), fused=fused)
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
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate; call block(x) first "
                               "(a forward that raised leaves nothing to differentiate)")
        c = self._cache
        dy = check_same_shape(dy, c.shape, "dy").astype(self.dtype, copy=False)
        with np.errstate(all="ignore"):
            if self.config.norm_first:                            # Pre-LN
                dx1 = dy + self._norm_backward("norm2",           # y = x1 + MLP(LN2(x1))
                                               self._mlp_backward(dy, c.mlp, c.fused), c.ln2)
                dx = dx1 + self._norm_backward("norm1",           # x1 = x + Attn(LN1(x))
                                               self._attention_backward(dx1, c.attn, c.fused), c.ln1)
            else:                                                 # Post-LN
                dr2 = self._norm_backward("norm2", dy, c.ln2)     # y = LN2(r2)
                dx1 = dr2 + self._mlp_backward(dr2, c.mlp, c.fused)        # r2 = x1 + MLP(x1)
                dr1 = self._norm_backward("norm1", dx1, c.ln1)    # x1 = LN1(r1)
                dx = dr1 + self._attention_backward(dr1, c.attn, c.fused)  # r1 = x + Attn(x)
        return dx

    def _accumulate(self, name, grad):
        self.grads[name] += grad   # gradients add up over backward calls, as in PyTorch

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
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"d_model: expected a positive int; got {d_model!r}")
        cfg = BlockConfig(d_model=d_model, n_heads=n_heads or default_heads(d_model),
                          d_ff=d_ff or 4 * d_model, norm_first=True, **config)
        super().__init__(cfg, dtype=dtype, seed=seed)
