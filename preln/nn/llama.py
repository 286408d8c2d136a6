"""The modern Pre-norm block: the decoder layer of Llama (Touvron et al. 2023, arXiv 2302.13971 and
2307.09288), with a hand-written backward.

It is the Pre-LN block of :mod:`preln.nn.block` with four changes and no biases:

    h1 = RMSNorm1(x)                                     RMSNorm, Zhang & Sennrich 2019, arXiv 1910.07467
    q, k, v = h1 W_q^T, h1 W_k^T, h1 W_v^T                q: H heads; k, v: H_kv heads (GQA, Ainslie
                                                          et al. 2023, arXiv 2305.13245)
    q, k = RoPE(q, pos), RoPE(k, pos)                    rotary positions, Su et al. 2021, arXiv 2104.09864
    a  = CausalAttn(q, k, v) W_o^T                       query head h reads key/value head h // (H / H_kv)
    x1 = x + a
    h2 = RMSNorm2(x1)
    m  = (SiLU(h2 W_gate^T) * (h2 W_up^T)) W_down^T      SwiGLU, Shazeer 2020, arXiv 2002.05202
    y  = x1 + m

Parameters carry the names and layouts of ``transformers``' ``LlamaDecoderLayer.state_dict()``
(``input_layernorm.weight``, ``self_attn.q_proj.weight``, ...; every weight (out, in) as in
nn.Linear), and given the same weights the block computes the layer's output and gradients
(tests/test_llama_reference.py). The backward is the forward read from the bottom up.

Decoding: ``kv = block.kv_cache(B, max_len)`` preallocates the rotated keys and the values of the
H_kv key/value heads -- 2 B max_len H_kv d_h numbers, H / H_kv times fewer than multi-head
attention would keep -- and ``block.decode(x_new, kv)`` runs the block on the next n positions,
rotating them at positions ``kv.length .. kv.length + n - 1``. Over any split of a sequence into
chunks the outputs are the full causal forward's.

Fused kernels (``fused=True``, the default): a float32 or float64 block under the safe policy with
no tracer runs RMSNorm (with the residual add before it), RoPE (with the head transpose), the
softmax and the SwiGLU gate as one kernel each (:mod:`preln.ops.fused.llama`,
:func:`preln.ops.fused.softmax`); the equations and the caches are the same, the results agree
to round-off. 16-bit storage, the naive policy, ``trace`` and ``check_finite`` run the ops of
:mod:`preln.ops` one by one: RMSNorm's statistic, RoPE's tables and the softmax in float32.

Default initialisation is transformers' for a Llama model: every weight N(0, 0.02^2)
(``initializer_range``), the RMSNorm gains 1.
"""
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Optional

import numpy as np

from preln.nn.base import BlockBase, Branch, KVStore, Norm, Residual, Sublayer, added, block_cache_type
from preln.validation import check_input, check_mask, positive_float, positive_int
from preln.ops.fused import llama as fused_llama
from preln.ops.attention import AttentionCache, attention_backward, merge_heads, sdpa, split_heads
from preln.ops.fused import FUSED_DTYPES
from preln.ops.linear import LinearCache, linear_backward, linear_forward
from preln.ops.rms_norm import rms_norm_backward, rms_norm_forward
from preln.ops.rope import (ROPE_THETA, RopeCache, RopeScaling, check_positions, check_rope_scaling,
                            rope_backward, rope_cos_sin, rope_forward)
from preln.ops.swiglu import SwiGLUCache, swiglu_backward, swiglu_forward
from preln.precision import SAFE, elementwise_dtype

__all__ = ["LlamaConfig", "LlamaBlock", "LlamaKVCache", "RMSNorm", "GroupedQueryAttention", "SwiGLU",
           "llama_param_shapes",
           "llama_ffn_width", "INIT_STD"]

#: transformers' ``LlamaConfig.initializer_range``: the std of every initial weight
INIT_STD = 0.02


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of one Llama block; in brackets the name in transformers' LlamaConfig.

    d_model:    D, the width of the residual stream [hidden_size].
    n_heads:    H query heads of d_h = D / H dimensions; d_h must be even, for RoPE's pairs
                [num_attention_heads].
    n_kv_heads: H_kv key/value heads, dividing H: each serves G = H / H_kv query heads. H_kv = H is
                multi-head attention, 1 multi-query attention, in between grouped-query attention;
                the KV cache shrinks by G [num_key_value_heads].
    d_ff:       F, the width of the SwiGLU hidden layer; ~8 D / 3 gives its three matrices the
                weights of a 4 D two-matrix MLP [intermediate_size].
    rope_theta: the base of RoPE's frequencies, theta^(-2i / d_h) [rope_parameters["rope_theta"]].
    eps:        RMSNorm's epsilon, added to the mean square inside the square root [rms_norm_eps].
    rope_scaling: None, or a long-context remedy for RoPE, a :class:`preln.ops.rope.RopeScaling` or a
                dict of its keys, e.g. {"rope_type": "linear", "factor": 4.0} [rope_parameters].

    The block is causal and has no biases (attention_bias = mlp_bias = False).
    """

    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 176
    rope_theta: float = ROPE_THETA
    eps: float = 1e-6
    rope_scaling: Optional[RopeScaling] = None

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_kv_heads", "d_ff"):
            object.__setattr__(self, name, positive_int(getattr(self, name), name))   # numpy ints -> int
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of d_model={self.d_model}; got {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: expected a divisor of n_heads={self.n_heads} (each key/value "
                             f"head serves n_heads / n_kv_heads query heads); got {self.n_kv_heads}")
        if self.d_head % 2:
            raise ValueError(f"n_heads: expected an even head width d_h = d_model / n_heads for RoPE "
                             f"(it rotates pairs of dimensions); got d_model={self.d_model}, "
                             f"n_heads={self.n_heads}, d_h={self.d_head}")
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
            raise ValueError(f"rope_theta: expected a base > 1 (10000 in Llama 2); got {theta!r}")
        positive_float(self.eps, "eps")
        object.__setattr__(self, "rope_scaling", check_rope_scaling(self.rope_scaling, "rope_scaling"))

    @property
    def d_head(self):
        """d_h = D / H, the width of one head."""
        return self.d_model // self.n_heads

    @property
    def n_groups(self):
        """G = H / H_kv, the query heads that share one key/value head."""
        return self.n_heads // self.n_kv_heads


def llama_ffn_width(d_model, multiplier=1.0, multiple_of=256):
    """F as Meta's Llama model.py sets it: 2/3 of 4 D, times ``ffn_dim_multiplier``, rounded up to a
    multiple of ``multiple_of`` (Llama 2 7B: D = 4096 -> 11008; Llama 3 8B: 1.3, 1024 -> 14336)."""
    d_model = positive_int(d_model, "d_model")
    multiple_of = positive_int(multiple_of, "multiple_of")
    positive_float(multiplier, "multiplier")
    hidden = int(multiplier * int(2 * 4 * d_model / 3))
    return multiple_of * -(-hidden // multiple_of)


def llama_param_shapes(config):
    """The 9 state-dict keys of transformers' LlamaDecoderLayer and their shapes."""
    D, F = config.d_model, config.d_ff
    Wq, Wkv = config.n_heads * config.d_head, config.n_kv_heads * config.d_head
    return {
        "input_layernorm.weight": (D,),
        "self_attn.q_proj.weight": (Wq, D),       # rows: head 0's d_h outputs, then head 1's, ...
        "self_attn.k_proj.weight": (Wkv, D),
        "self_attn.v_proj.weight": (Wkv, D),
        "self_attn.o_proj.weight": (D, Wq),
        "post_attention_layernorm.weight": (D,),
        "mlp.gate_proj.weight": (F, D),
        "mlp.up_proj.weight": (F, D),
        "mlp.down_proj.weight": (D, F),
    }


def init_params(config, rng, dtype):
    """transformers' initialisation (see the module docstring), drawn in float64, then cast."""
    params = {}
    for name, shape in llama_param_shapes(config).items():
        norm = name.endswith("layernorm.weight")
        params[name] = np.ones(shape) if norm else rng.normal(0.0, INIT_STD, size=shape)
    return {k: v.astype(dtype) for k, v in params.items()}


class LlamaAttnCache(NamedTuple):
    q_proj: LinearCache   # q = h1 W_q^T (h1 is shared by the three projections)
    k_proj: LinearCache   # k = h1 W_k^T
    v_proj: LinearCache   # v = h1 W_v^T
    rope: RopeCache       # cos, sin at the positions, (S, d_h) or (B, 1, S, d_h)
    sdpa: AttentionCache  # rotated q (B, H, S, d_h), rotated k and v (B, H_kv, S, d_h), P
    o_proj: LinearCache   # a = o W_o^T


#: (shape, norm1, attn, norm2, mlp, fused): the input's (B, S, D), two RMSNormCaches, a
#: LlamaAttnCache, a SwiGLUCache, whether the fused kernels ran
LlamaBlockCache = block_cache_type("LlamaBlockCache", "norm1", "norm2", __name__)


class LlamaKVCache(KVStore):
    """The rotated keys and the values of one Llama block's H_kv key/value heads.

    k, v:   (B, H_kv, max_len, d_h); positions ``0 .. length - 1`` are filled.
    nbytes: 2 * B * max_len * H_kv * d_h * itemsize -- G = H / H_kv times less than a multi-head
            cache of the same width.

    Made by :meth:`LlamaBlock.kv_cache`, filled by :meth:`LlamaBlock.decode`. Not a
    :class:`preln.nn.block.KVCache`: a TransformerBlock refuses it.
    """

    @property
    def n_kv_heads(self):
        return self.n_heads

    def __repr__(self):
        return self._repr("n_kv_heads")


# ---- the sublayers ------------------------------------------------------------------------------
class RMSNorm(Norm):
    """input_layernorm or post_attention_layernorm: x / sqrt(mean(x^2) + eps) gamma. Fused, after
    a residual sum: the sum and the norm in one kernel."""

    def __call__(self, x):  # (B, S, D) or a Residual -> (B, S, D)
        b = self.block
        gamma, eps = b.params[f"{self.name}.weight"], b.config.eps
        if self.fused and isinstance(x, Residual):          # r = x + a, RMSNorm(r): one pass
            x.sum, y, self.cache = fused_llama.add_rms_norm(x.x, x.branch.out, gamma, eps)
            return y
        x = added(x)
        if self.fused:
            y, self.cache = fused_llama.rms_norm(x, gamma, eps)
            return y
        y, self.cache = rms_norm_forward(x, gamma, eps, self.policy, self.watch.scope(self.name))
        return y

    def backward(self, dy, cache, dskip=None):  # -> dL/dx, plus dskip when x feeds a residual too
        if self.fused:
            dx, dgamma = fused_llama.rms_norm_backward(dy, cache, dskip)    # dskip added in the kernel
        else:
            dx, dgamma = rms_norm_backward(dy, cache, self.policy)
            if dskip is not None:
                dx += dskip
        self.grad(f"{self.name}.weight", dgamma)
        return dx


class _Linears(Sublayer):
    """Attention and the MLP, over the linear layers ``block.linear(name)`` gives them: a
    quantised block swaps them (:class:`preln.quant.weight_only.WeightOnlyLlamaBlock`)."""

    def into_residual(self, out, residual):
        if self.fused:      # the MLP's output is its own: the residual is added into it
            return Branch(out, lambda x, m: np.add(x, m, out=m))
        return self.branch(out, residual)


class GroupedQueryAttention(_Linears):
    """Attn(h): q = h W_q^T (H heads), k, v = h W_k^T, h W_v^T (H_kv heads), RoPE on q and k,
    causal scaled dot-product attention (:func:`preln.ops.sdpa`), a = o W_o^T. Fused: the rotation
    with the head transpose and the plain path's softmax are one kernel each."""

    def __init__(self, block, watch=None, fused=False, key_padding_mask=None, cos_sin=None, kv=None):
        super().__init__(block, watch, fused)
        self.kpm, self.cos_sin, self.kv = key_padding_mask, cos_sin, kv
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (block.linear(f"self_attn.{n}_proj")
                                                              for n in "qkvo")

    def __call__(self, h):  # (B, S, D) -> Attn(h), a Branch of the residual stream
        b, w, cos_sin = self.block, self.watch, self.cos_sin
        H, H_kv = b.config.n_heads, b.config.n_kv_heads
        q, c_q = self.q_proj(h)                                                  # (B, S, H d_h)
        k, c_k = self.k_proj(h)                                                  # (B, S, H_kv d_h)
        v, c_v = self.v_proj(h)                                                  # (B, S, H_kv d_h)
        w("attn.q_proj", q, h)
        w("attn.k_proj", k, h)
        w("attn.v_proj", v, h)
        if self.fused:   # the rotation and the transpose to (B, heads, S, d_h) in one pass each
            q, k = fused_llama.rope(q, H, cos_sin), fused_llama.rope(k, H_kv, cos_sin)
        else:
            q, _ = rope_forward(split_heads(q, H), cos_sin=cos_sin)              # (B, H, S, d_h)
            k, _ = rope_forward(split_heads(k, H_kv), cos_sin=cos_sin)           # (B, H_kv, S, d_h)
        v = split_heads(v, H_kv)                                                 # (B, H_kv, S, d_h)
        o, c_sdpa = sdpa(q, k, v, self.kpm, True, self.policy, w.scope("attn"), tiled=b.tiled(),
                         training=b.training, fused=self.fused, kv=self.kv)     # (B, H, S, d_h)
        o = merge_heads(o)                                                       # (B, S, H d_h)
        a, c_o = self.o_proj(o)                                                  # (B, S, D)
        w("attn.o_proj", a, o)
        self.cache = LlamaAttnCache(c_q, c_k, c_v, RopeCache(*cos_sin), c_sdpa, c_o)
        return self.into_residual(a, "residual1")

    def backward(self, da, c):  # (B, S, D) -> (B, S, D)
        cfg, pol = self.block.config, self.policy
        H, H_kv = cfg.n_heads, cfg.n_kv_heads
        do, dw, _ = linear_backward(da, c.o_proj, pol)                           # a = o W_o^T
        self.grad("self_attn.o_proj.weight", dw)
        q, k, _ = c.sdpa.q, c.sdpa.k, c.sdpa.v
        B, S = do.shape[:2]
        dq, dk = np.empty_like(q), np.empty_like(k)                              # (B, H | H_kv, S, d_h)
        dv_lin = np.empty((B, S, H_kv * k.shape[-1]), do.dtype)                  # as v_proj's output
        dv = split_heads(dv_lin, H_kv)                                           # a view (B, H_kv, S, d_h)
        attention_backward(split_heads(do, H), c.sdpa, out=(dq, dk, dv),        # o = attn(q, k, v)
                           fused=self.fused)
        cos_sin = tuple(c.rope)
        if self.fused:                                                           # q = RoPE(q_lin), one pass
            dq_lin, dk_lin = fused_llama.rope_backward(dq, cos_sin), fused_llama.rope_backward(dk, cos_sin)
        else:
            dq_lin = merge_heads(rope_backward(dq, c.rope))                      # (B, S, H d_h)
            dk_lin = merge_heads(rope_backward(dk, c.rope))                      # (B, S, H_kv d_h)
        dh, dw, _ = linear_backward(dq_lin, c.q_proj, pol)                       # q_lin = h W_q^T
        self.grad("self_attn.q_proj.weight", dw)
        dh_k, dw, _ = linear_backward(dk_lin, c.k_proj, pol)                     # k_lin = h W_k^T
        self.grad("self_attn.k_proj.weight", dw)
        dh += dh_k
        dh_v, dw, _ = linear_backward(dv_lin, c.v_proj, pol)                     # v_lin = h W_v^T
        self.grad("self_attn.v_proj.weight", dw)
        dh += dh_v                                                               # h feeds all three
        return dh


class SwiGLU(_Linears):
    """MLP(h) = (SiLU(h W_gate^T) * (h W_up^T)) W_down^T. Fused: the gate is one kernel;
    ``keep=False`` (decoding) writes it over its input."""

    def __init__(self, block, watch=None, fused=False, keep=True):
        super().__init__(block, watch, fused)
        self.keep = keep
        self.gate_proj, self.up_proj, self.down_proj = (block.linear(f"mlp.{n}_proj")
                                                        for n in ("gate", "up", "down"))

    def __call__(self, h):  # (B, S, D) -> MLP(h), a Branch of the residual stream
        if self.fused:
            a, c_gate = self.gate_proj(h)                                        # (B, S, F)
            b, c_up = self.up_proj(h)                                            # (B, S, F)
            g = fused_llama.silu_mul(a, b, out=None if self.keep else a)         # g = SiLU(a) b, one pass
            m, c_down = self.down_proj(g)                                        # (B, S, D)
            self.cache = SwiGLUCache(c_gate, c_up, a, b, c_down)
        else:
            p = self.block.params
            m, self.cache = swiglu_forward(h, p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"],
                                           p["mlp.down_proj.weight"], self.policy, self.watch.scope("mlp"))
        return self.into_residual(m, "residual2")

    def backward(self, dm, c):  # (B, S, D) -> (B, S, D)
        pol = self.policy
        if self.fused:
            dg, dw_down, _ = linear_backward(dm, c.down, pol)                    # m = g W_down^T
            da, db = fused_llama.silu_mul_backward(dg, c.a, c.b)                 # g = SiLU(a) b
            dh, dw_gate, _ = linear_backward(da, c.gate, pol)                    # a = h W_gate^T
            dh_up, dw_up, _ = linear_backward(db, c.up, pol)                     # b = h W_up^T
            dh += dh_up
        else:
            dh, dw_gate, dw_up, dw_down = swiglu_backward(dm, c, pol)
        self.grad("mlp.gate_proj.weight", dw_gate)
        self.grad("mlp.up_proj.weight", dw_up)
        self.grad("mlp.down_proj.weight", dw_down)
        return dh


class LlamaBlock(BlockBase):
    """One Llama decoder block with transformers' ``LlamaDecoderLayer`` parameters and semantics;
    the hyper-parameters are a :class:`preln.LlamaConfig`.

    dtype: float64 | float32 | float16 | bfloat16 -- parameters and activations are stored in it
        (None: float32).
    seed: seeds the ``np.random.Generator`` (``block.rng``) of the initialisation.
    policy: "safe" | "naive" | a :class:`preln.Policy` -- where 16-bit arithmetic happens.
    check_finite: raise FloatingPointError naming the first op whose output is not finite.
    trace: record that op in ``block.overflow`` without raising.
    attention: "auto" (tiled in eval mode, plain in training mode), "plain" or "tiled".
    fused: True -- the fused kernels where they apply (see the module docstring); False -- every op
        as a separate numpy call.

    ``train()`` / ``eval()``: the block has no dropout (Llama has none); eval mode runs the tiled
    attention (the backward then recomputes P) and is the mode ``decode`` requires.
    """

    config_type, kv_type = LlamaConfig, LlamaKVCache
    shapes_of, init_of = staticmethod(llama_param_shapes), staticmethod(init_params)
    kv_heads = ("n_kv_heads", "H_kv")

    # ---- forward: the block's equations over this pass's sublayers ------------------------------
    def __call__(self, x, key_padding_mask=None, positions=None):
        return self.forward(x, key_padding_mask, positions)

    def forward(self, x, key_padding_mask=None, positions=None):
        """x: (B, S, D) -> y: (B, S, D), causal.

        key_padding_mask: (B, S) bool, True = a padding key no query may read.
        positions: RoPE's positions, (S,) or (B, S) ints >= 0; default 0 .. S - 1 (left-padded
            sequences pass their own, as transformers' ``position_ids``).
        """
        self._cache = None                                        # a forward that raises leaves no cache
        x = check_input(x, self.config.d_model, self.dtype)      # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        kv = self._kv
        cos_sin = self.rope_tables(x.shape, positions, start=0 if kv is None else kv.length)
        watch, fused = self._watch(), self.fuses()
        ln1, attn, ln2, mlp = self.sublayers(watch, fused, kpm, cos_sin, kv)
        with np.errstate(all="ignore"):   # non-finite values are the Watch's to report
            h = x + attn(ln1(x))
            y = h + mlp(ln2(h))
            y = added(y)                                          # the last sum, (B, S, D)
        self.overflow = watch.first
        self._cache = LlamaBlockCache(x.shape, ln1.cache, attn.cache, ln2.cache, mlp.cache, fused=fused)
        return y

    def sublayers(self, watch=None, fused=False, key_padding_mask=None, cos_sin=None, kv=None):
        """(ln1, attn, ln2, mlp) for one pass: the fused kernels or every op its own call, the
        attention reading and extending ``kv`` when decoding."""
        return (RMSNorm(self, "input_layernorm", watch, fused),
                GroupedQueryAttention(self, watch, fused, key_padding_mask, cos_sin, kv),
                RMSNorm(self, "post_attention_layernorm", watch, fused),
                SwiGLU(self, watch, fused, keep=kv is None))

    def linear(self, name):  # -> h (B, S, in) -> (h W^T (B, S, out), LinearCache)
        """The linear layer ``name`` (``self_attn.q_proj``, ..., ``mlp.down_proj``) as a function."""
        return partial(linear_forward, w=self.params[f"{name}.weight"], b=None, policy=self.policy)

    def rope_tables(self, shape, positions=None, start=0):  # -> RoPE's (cos, sin)
        """RoPE's (cos, sin) for x of ``shape`` in the block's dtype, with the config's theta and
        scaling; positions default to start .. start + S - 1. Public: the sharded block reuses it."""
        B, S, _ = shape
        if positions is None:
            positions = np.arange(start, start + S)
        else:
            pos = check_positions(positions)
            if pos.shape not in ((S,), (B, S)):
                raise ValueError(f"positions: expected shape (S,) = ({S},) or (B, S) = ({B}, {S}) "
                                 f"for x of shape {shape}; got {pos.shape}")
            positions = pos
        cfg = self.config
        return rope_cos_sin(positions, cfg.d_head, cfg.rope_theta, elementwise_dtype(self.dtype),
                            cfg.rope_scaling)

    def fuses(self):
        """Whether the next forward (or decode) runs the fused kernels: ``fused`` is on, the dtype
        is float32 or float64, the policy is the safe one, no tracer."""
        return (self.fused and self.dtype in FUSED_DTYPES and self.policy == SAFE
                and not (self.trace or self.check_finite))

    # ---- backward: the forward read from the bottom up -----------------------------------------
    def backward(self, dy):
        """dy = dL/dy, (B, S, D) -> dL/dx, (B, S, D); adds dL/dparam into ``self.grads``."""
        c, dy = self._backward_input(dy)
        ln1, attn, ln2, mlp = self.sublayers(fused=c.fused)
        with np.errstate(all="ignore"):
            dh = ln2.backward(mlp.backward(dy, c.mlp), c.norm2, dy)       # y = h + mlp(ln2(h))
            return ln1.backward(attn.backward(dh, c.attn), c.norm1, dh)   # h = x + attn(ln1(x))
