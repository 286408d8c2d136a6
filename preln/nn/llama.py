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
from typing import NamedTuple, Optional

import numpy as np

from preln.nn.base import BlockBase, KVStore, block_backward, block_cache_type, block_equations
from preln.validation import check_input, check_mask, positive_float, positive_int
from preln.ops.fused import llama as fused_llama
from preln.ops.attention import AttentionCache, attention_backward, merge_heads, split_heads
from preln.ops.fused import FUSED_DTYPES
from preln.ops.linear import LinearCache, linear_backward, linear_forward
from preln.ops.rms_norm import rms_norm_backward, rms_norm_forward
from preln.ops.rope import (ROPE_THETA, RopeCache, RopeScaling, check_positions, check_rope_scaling,
                            rope_backward, rope_cos_sin, rope_forward)
from preln.ops.swiglu import SwiGLUCache, swiglu_backward, swiglu_forward
from preln.precision import SAFE, Watch, elementwise_dtype

__all__ = ["LlamaConfig", "LlamaBlock", "LlamaKVCache", "LlamaOpByOp", "LlamaFused", "llama_param_shapes",
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
LlamaBlockCache = block_cache_type("LlamaBlockCache", "norm1", "norm2")


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


# ---- the parts of block_equations ----------------------------------------------------------------
_NORMS = {1: "input_layernorm", 2: "post_attention_layernorm"}


class LlamaOpByOp:
    """A LlamaBlock's parts with every op its own numpy call, each output watched."""

    fused = False

    def __init__(self, block, kpm=None, cos_sin=None, watch=None, kv=None):
        self.block, self.kpm, self.cos_sin, self.kv = block, kpm, cos_sin, kv
        self.watch = Watch() if watch is None else watch

    def norm(self, i, x):
        b = self.block
        return rms_norm_forward(x, b.params[f"{_NORMS[i]}.weight"], b.config.eps, b.policy,
                                self.watch.scope(_NORMS[i]))

    def attention(self, h):
        return self.block._attention(h, self.kpm, self.cos_sin, self.watch, self.kv, fused=self.fused)

    def mlp(self, h):
        p = self.block.params
        return swiglu_forward(h, p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"],
                              p["mlp.down_proj.weight"], self.block.policy, self.watch.scope("mlp"))

    def add(self, i, x, a):
        return self.watch(f"residual{i}", x + a, x, a)

    def add_norm(self, i, x, a, j):
        r = self.add(i, x, a)
        return (r, *self.norm(j, r))

    # the backward's parts
    def norm_backward(self, i, dh, cache, dres):
        dx, dgamma = rms_norm_backward(dh, cache, self.block.policy)
        dx += dres                                                # x feeds the residual too
        self.block._accumulate(f"{_NORMS[i]}.weight", dgamma)
        return dx

    def attention_backward(self, da, cache):
        return self.block._attention_backward(da, cache, self.fused)

    def mlp_backward(self, dm, cache):
        dh, dw_gate, dw_up, dw_down = swiglu_backward(dm, cache, self.block.policy)
        return self.block._accumulate_mlp(dh, dw_gate, dw_up, dw_down)


class LlamaFused(LlamaOpByOp):
    """The parts with RMSNorm (with the residual add before it), RoPE (with the head transpose),
    the softmax and the SwiGLU gate one kernel each (:mod:`preln.ops.fused.llama`)."""

    fused = True

    def norm(self, i, x):
        b = self.block
        return fused_llama.rms_norm(x, b.params[f"{_NORMS[i]}.weight"], b.config.eps)

    def mlp(self, h):
        return self.block._mlp_fused(h, keep=self.kv is None)

    def add(self, i, x, m):
        return np.add(x, m, out=m)                                # m is the MLP's own output

    def add_norm(self, i, x, a, j):
        b = self.block
        return fused_llama.add_rms_norm(x, a, b.params[f"{_NORMS[j]}.weight"], b.config.eps)

    def norm_backward(self, i, dh, cache, dres):
        dx, dgamma = fused_llama.rms_norm_backward(dh, cache, dres)   # the residual's, added
        self.block._accumulate(f"{_NORMS[i]}.weight", dgamma)
        return dx

    def mlp_backward(self, dm, c):
        pol = self.block.policy
        dg, dw_down, _ = linear_backward(dm, c.down, pol)                    # m = g W_down^T
        da, db = fused_llama.silu_mul_backward(dg, c.a, c.b)                 # g = SiLU(a) b
        dh, dw_gate, _ = linear_backward(da, c.gate, pol)                    # a = h W_gate^T
        dh_up, dw_up, _ = linear_backward(db, c.up, pol)                     # b = h W_up^T
        dh += dh_up
        return self.block._accumulate_mlp(dh, dw_gate, dw_up, dw_down)


class LlamaBlock(BlockBase):
    """One Llama decoder block with transformers' ``LlamaDecoderLayer`` parameters and semantics;
    the hyper-parameters are a :class:`preln.LlamaConfig`.

    dtype: float64 | float32 | float16 | bfloat16 -- parameters and activations are stored in it
        (None: float64).
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

    config_type, kv_type, default_dtype = LlamaConfig, LlamaKVCache, np.float64
    shapes_of, init_of = staticmethod(llama_param_shapes), staticmethod(init_params)
    kv_heads = ("n_kv_heads", "H_kv")

    # ---- forward ---------------------------------------------------------------------------------
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
        cos_sin = self.rope_tables(x.shape, positions)
        watch = self._watch()
        with np.errstate(all="ignore"):   # non-finite values are the Watch's to report
            y, cache = self._layers(x, kpm, cos_sin, watch)
        self.overflow = watch.first
        self._cache = cache
        return y

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

    def _layers(self, x, kpm, cos_sin, watch, kv=None):  # (B, S, D) -> (B, S, D), LlamaBlockCache
        """The block's equations over the fused or the op-by-op parts; with ``kv`` the attention
        reads and extends a KV cache."""
        fused = self.fuses()
        parts = (LlamaFused if fused else LlamaOpByOp)(self, kpm, cos_sin, watch, kv)
        y, caches = block_equations(x, parts)
        return y, LlamaBlockCache(x.shape, *caches, fused=fused)

    def fuses(self):
        """Whether the next forward (or decode) runs the fused kernels: ``fused`` is on, the dtype
        is float32 or float64, the policy is the safe one, no tracer."""
        return (self.fused and self.dtype in FUSED_DTYPES and self.policy == SAFE
                and not (self.trace or self.check_finite))

    def _attention(self, h, kpm, cos_sin, watch, kv=None, fused=False):  # (B, S, D) -> (B, S, D)
        p, cfg, pol = self.params, self.config, self.policy
        H, H_kv = cfg.n_heads, cfg.n_kv_heads
        q, c_q = linear_forward(h, p["self_attn.q_proj.weight"], None, pol)     # (B, S, H d_h)
        k, c_k = linear_forward(h, p["self_attn.k_proj.weight"], None, pol)     # (B, S, H_kv d_h)
        v, c_v = linear_forward(h, p["self_attn.v_proj.weight"], None, pol)     # (B, S, H_kv d_h)
        watch("attn.q_proj", q, h)
        watch("attn.k_proj", k, h)
        watch("attn.v_proj", v, h)
        if fused:   # the rotation and the transpose to (B, heads, S, d_h) in one pass each
            q, k = fused_llama.rope(q, H, cos_sin), fused_llama.rope(k, H_kv, cos_sin)
        else:
            q, _ = rope_forward(split_heads(q, H), cos_sin=cos_sin)              # (B, H, S, d_h)
            k, _ = rope_forward(split_heads(k, H_kv), cos_sin=cos_sin)           # (B, H_kv, S, d_h)
        v = split_heads(v, H_kv)                                                 # (B, H_kv, S, d_h)
        o, c_sdpa = self._sdpa(q, k, v, kpm, True, watch, kv, fused)           # (B, H, S, d_h)
        o = merge_heads(o)                                                       # (B, S, H d_h)
        a, c_o = linear_forward(o, p["self_attn.o_proj.weight"], None, pol)      # (B, S, D)
        watch("attn.o_proj", a, o)
        return a, LlamaAttnCache(c_q, c_k, c_v, RopeCache(*cos_sin), c_sdpa, c_o)

    def _mlp_fused(self, h, keep):  # (B, S, D) -> (B, S, D)
        p, pol = self.params, self.policy
        a, c_gate = linear_forward(h, p["mlp.gate_proj.weight"], None, pol)     # (B, S, F)
        b, c_up = linear_forward(h, p["mlp.up_proj.weight"], None, pol)         # (B, S, F)
        g = fused_llama.silu_mul(a, b, out=None if keep else a)                 # g = SiLU(a) b, one pass
        m, c_down = linear_forward(g, p["mlp.down_proj.weight"], None, pol)     # (B, S, D)
        return m, SwiGLUCache(c_gate, c_up, a, b, c_down)

    # ---- decoding with a KV cache ----------------------------------------------------------------
    def decode(self, x_new, kv):
        """Run the block on the next n positions of B sequences given a :class:`LlamaKVCache` of the
        positions before them; x_new: (B, n, D), n >= 1 -> y_new: (B, n, D).

        The new positions are rotated at ``kv.length .. kv.length + n - 1`` and their keys and values
        appended (``kv.length`` grows by n). Eval mode only, no padding mask. Nothing is kept for a
        backward: ``block.backward`` still differentiates the last ``forward``.
        """
        x = self._check_decode(x_new, kv)                         # (B, n, D)
        cos_sin = self.rope_tables(x.shape, None, start=kv.length)
        watch = self._watch()
        with np.errstate(all="ignore"):
            y, _ = self._layers(x, None, cos_sin, watch, kv)
        self.overflow = watch.first
        kv.length += x.shape[1]                                   # only once the step has succeeded
        return y

    # ---- backward: the forward read from the bottom up -----------------------------------------
    def backward(self, dy):
        """dy = dL/dy, (B, S, D) -> dL/dx, (B, S, D); adds dL/dparam into ``self.grads``."""
        c, dy = self._backward_input(dy)
        parts = (LlamaFused if c.fused else LlamaOpByOp)(self)
        with np.errstate(all="ignore"):
            return block_backward(dy, c, parts)

    def _accumulate_mlp(self, dh, dw_gate, dw_up, dw_down):
        self._accumulate("mlp.gate_proj.weight", dw_gate)
        self._accumulate("mlp.up_proj.weight", dw_up)
        self._accumulate("mlp.down_proj.weight", dw_down)
        return dh

    def _attention_backward(self, da, c, fused):  # (B, S, D) -> (B, S, D)
        cfg, pol = self.config, self.policy
        H, H_kv = cfg.n_heads, cfg.n_kv_heads
        do, dw, _ = linear_backward(da, c.o_proj, pol)                           # a = o W_o^T
        self._accumulate("self_attn.o_proj.weight", dw)
        q, k, _ = c.sdpa.q, c.sdpa.k, c.sdpa.v
        B, S = do.shape[:2]
        dq, dk = np.empty_like(q), np.empty_like(k)                              # (B, H | H_kv, S, d_h)
        dv_lin = np.empty((B, S, H_kv * cfg.d_head), do.dtype)                   # as v_proj's output
        dv = split_heads(dv_lin, H_kv)                                           # a view (B, H_kv, S, d_h)
        attention_backward(split_heads(do, H), c.sdpa, out=(dq, dk, dv), fused=fused)  # o = attn(q, k, v)
        cos_sin = tuple(c.rope)
        if fused:                                                                # q = RoPE(q_lin), one pass
            dq_lin, dk_lin = fused_llama.rope_backward(dq, cos_sin), fused_llama.rope_backward(dk, cos_sin)
        else:
            dq_lin = merge_heads(rope_backward(dq, c.rope))                      # (B, S, H d_h)
            dk_lin = merge_heads(rope_backward(dk, c.rope))                      # (B, S, H_kv d_h)
        dh, dw, _ = linear_backward(dq_lin, c.q_proj, pol)                       # q_lin = h W_q^T
        self._accumulate("self_attn.q_proj.weight", dw)
        dh_k, dw, _ = linear_backward(dk_lin, c.k_proj, pol)                     # k_lin = h W_k^T
        self._accumulate("self_attn.k_proj.weight", dw)
        dh += dh_k
        dh_v, dw, _ = linear_backward(dv_lin, c.v_proj, pol)                     # v_lin = h W_v^T
        self._accumulate("self_attn.v_proj.weight", dw)
        dh += dh_v                                                               # h feeds all three
        return dh

