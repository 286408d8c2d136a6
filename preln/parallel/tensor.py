"""The block sharded over P ranks: Megatron tensor parallel (Shoeybi et al. 2019, arXiv 1909.08053)
and sequence parallel (Korthikanti et al. 2022, arXiv 2205.05198), as *parts* of the one set of
block equations (:func:`preln.nn.base.block_equations` and :func:`~preln.nn.base.block_backward`).

Tensor parallel: a rank holds H/P heads -- its rows of W_q, W_k, W_v (columns of the product) and
its columns of W_out -- and F/P hidden units -- rows of W_1 (gate, up), columns of W_2 (down).
Each sublayer's input is whole on every rank; its output is a partial sum, all-reduced once in
the forward; the input's gradient is all-reduced once in the backward.

Sequence parallel: between the sublayers -- the norms, the residual adds, the biases after the
sum -- a rank holds S/P positions. A sublayer's input is all-gathered along S and its output
reduce-scattered along S (the all-reduce's two halves); the backward swaps them. The Pre-LN
block's norms sit exactly where the all-gather goes: everything outside Attn and MLP is per
position, so it needs no other rank's data.
"""
from typing import NamedTuple

import numpy as np

from preln.nn.base import block_backward, block_equations
from preln.nn.block import TransformerBlock
from preln.nn.llama import LlamaBlock
from preln.ops import (activation_backward, activation_forward, attention_backward, attention_forward,
                       layer_norm_backward, layer_norm_forward, linear_backward, linear_forward,
                       merge_heads, rms_norm_backward, rms_norm_forward, rope_backward, rope_forward,
                       split_heads, swiglu_backward, swiglu_forward)
from preln.parallel.comm import ring_bytes
from preln.validation import check_mask

__all__ = ["MODES", "check_parallel", "shard_params", "replicated", "ParallelBlock", "predicted_traffic"]

#: tensor parallel alone, or with sequence parallel
MODES = ("tensor", "sequence")


def _family(block):
    if isinstance(block, LlamaBlock):
        return "llama"
    if isinstance(block, TransformerBlock):
        return "transformer"
    raise TypeError(f"block: expected a preln.TransformerBlock or preln.LlamaBlock; got {type(block).__name__}")


def check_parallel(block, world, seq_len=None, mode="tensor"):
    """Raise a clear error unless ``block`` splits over ``world`` ranks in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}; got {mode!r}")
    if not isinstance(world, (int, np.integer)) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world: expected an int >= 1; got {world!r}")
    cfg = block.config
    heads = cfg.n_kv_heads if _family(block) == "llama" else cfg.n_heads
    name = "n_kv_heads" if _family(block) == "llama" else "n_heads"
    if heads % world:
        raise ValueError(f"{name}: expected a multiple of world={world} (each rank takes whole "
                         f"{'key/value groups' if name == 'n_kv_heads' else 'heads'}); got {heads}")
    if cfg.d_ff % world:
        raise ValueError(f"d_ff: expected a multiple of world={world}; got {cfg.d_ff}")
    if mode == "sequence" and seq_len is not None and seq_len % world:
        raise ValueError(f"x: expected a sequence length divisible by world={world} for sequence "
                         f"parallel; got S={seq_len}")
    if getattr(cfg, "dropout", 0.0):
        raise ValueError(f"dropout: the sharded block runs without dropout; got {cfg.dropout}")


def replicated(block):
    """The parameter names every rank holds whole (norms; biases added after the sum)."""
    if _family(block) == "llama":
        return ("input_layernorm.weight", "post_attention_layernorm.weight")
    return ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
            "self_attn.out_proj.bias", "linear2.bias")


def shard_params(block, arrays, world, rank):
    """Rank ``rank``'s slices of ``arrays`` (the block's parameters, or gradients in their names)."""
    cfg, P, r = block.config, world, rank
    rows = lambda w, n: np.split(w, P, axis=0)[r]        # column parallel: a rank's output units
    cols = lambda w: np.split(w, P, axis=1)[r]           # row parallel: a rank's input units
    out = {k: arrays[k] for k in replicated(block)}
    if _family(block) == "llama":
        for k in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "mlp.gate_proj.weight", "mlp.up_proj.weight"):
            out[k] = rows(arrays[k], P)                  # q heads of a rank's kv groups are contiguous
        for k in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            out[k] = cols(arrays[k])
        return out
    D = cfg.d_model
    w, b = arrays["self_attn.in_proj_weight"], arrays["self_attn.in_proj_bias"]
    out["self_attn.in_proj_weight"] = np.concatenate([rows(w[i * D:(i + 1) * D], P) for i in range(3)])
    out["self_attn.in_proj_bias"] = np.concatenate([rows(b[i * D:(i + 1) * D], P) for i in range(3)])
    out["self_attn.out_proj.weight"] = cols(arrays["self_attn.out_proj.weight"])
    out["linear1.weight"], out["linear1.bias"] = rows(arrays["linear1.weight"], P), rows(arrays["linear1.bias"], P)
    out["linear2.weight"] = cols(arrays["linear2.weight"])
    return out


class _Attn(NamedTuple):
    cache: tuple
    rope: object


class _Parts:
    """One rank's parts of the block equations; ``comm`` carries the collectives."""

    def __init__(self, pb):
        self.pb, self.p, self.cfg, self.comm = pb, pb.params, pb.config, pb.comm
        self.sp = pb.mode == "sequence"

    # a sublayer's entry and exit: the collectives of the two modes, and their backwards
    def enter(self, h):          # (B, S / P, D) -> (B, S, D) in sequence parallel
        return self.comm.all_gather(h, axis=1) if self.sp else h

    def leave(self, partial):    # a sum's term -> the sum (sequence parallel: this rank's S / P)
        return self.comm.reduce_scatter(partial, axis=1) if self.sp else self.comm.all_reduce(partial)

    def enter_backward(self, dh_partial):
        return self.comm.reduce_scatter(dh_partial, axis=1) if self.sp else self.comm.all_reduce(dh_partial)

    def leave_backward(self, da):
        return self.comm.all_gather(da, axis=1) if self.sp else da

    def add(self, i, x, a):
        return x + a

    def add_norm(self, i, x, a, j):
        r = x + a
        h, cache = self.norm(j, r)
        return r, h, cache

    def attention(self, h):
        h = self.enter(h)
        partial, cache = self.attention_local(h)
        return self.leave(partial) + self.bias("attn"), cache

    def mlp(self, h):
        h = self.enter(h)
        partial, cache = self.mlp_local(h)
        return self.leave(partial) + self.bias("mlp"), cache

    def attention_backward(self, da, cache):
        self.bias_grad("attn", da)
        return self.enter_backward(self.attention_local_backward(self.leave_backward(da), cache))

    def mlp_backward(self, dm, cache):
        self.bias_grad("mlp", dm)
        return self.enter_backward(self.mlp_local_backward(self.leave_backward(dm), cache))

    def norm_backward(self, i, dh, cache, dres):
        dx = self.norm_local_backward(i, dh, cache)
        return dx if dres is None else dres + dx

    def acc(self, name, g):
        self.pb.grads[name] = self.pb.grads[name] + g

    def bias(self, sub):
        return 0.0

    def bias_grad(self, sub, d):
        pass


class _TransformerParts(_Parts):
    NORMS = {1: "norm1", 2: "norm2"}
    BIASES = {"attn": "self_attn.out_proj.bias", "mlp": "linear2.bias"}

    def norm(self, i, x):
        n = self.NORMS[i]
        return layer_norm_forward(x, self.p[f"{n}.weight"], self.p[f"{n}.bias"], self.cfg.eps)

    def norm_local_backward(self, i, dh, cache):
        dx, dg, db = layer_norm_backward(dh, cache)
        self.acc(f"{self.NORMS[i]}.weight", dg)
        self.acc(f"{self.NORMS[i]}.bias", db)
        return dx

    def bias(self, sub):         # added once, after the sum
        return self.p[self.BIASES[sub]]

    def bias_grad(self, sub, d):
        self.acc(self.BIASES[sub], d.sum(axis=(0, 1)))

    def attention_local(self, h):  # (B, S, D) -> this rank's heads' term of Attn(h) - b_out
        p, H = self.p, self.pb.local_heads
        qkv, c_in = linear_forward(h, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"])  # (B, S, 3 D / P)
        q, k, v = (split_heads(t, H) for t in np.split(qkv, 3, axis=-1))       # 3 x (B, H / P, S, d_h)
        o, c_sdpa = attention_forward(q, k, v, self.pb.kpm, self.cfg.causal)
        a, c_out = linear_forward(merge_heads(o), p["self_attn.out_proj.weight"], None)  # (B, S, D)
        return a, (c_in, c_sdpa, c_out)

    def attention_local_backward(self, da, cache):
        c_in, c_sdpa, c_out = cache
        do, dw, _ = linear_backward(da, c_out)
        self.acc("self_attn.out_proj.weight", dw)
        dq, dk, dv = attention_backward(split_heads(do, self.pb.local_heads), c_sdpa)
        dqkv = np.concatenate([merge_heads(t) for t in (dq, dk, dv)], axis=-1)  # (B, S, 3 D / P)
        dh, dw, db = linear_backward(dqkv, c_in)
        self.acc("self_attn.in_proj_weight", dw)
        self.acc("self_attn.in_proj_bias", db)
        return dh

    def mlp_local(self, h):  # (B, S, D) -> this rank's hidden units' term of MLP(h) - b2
        p = self.p
        u, c1 = linear_forward(h, p["linear1.weight"], p["linear1.bias"])        # (B, S, F / P)
        g, c_act = activation_forward(u, self.cfg.activation)
        z, c2 = linear_forward(g, p["linear2.weight"], None)                     # (B, S, D)
        return z, (c1, c_act, c2)

    def mlp_local_backward(self, dz, cache):
        c1, c_act, c2 = cache
        dg, dw, _ = linear_backward(dz, c2)
        self.acc("linear2.weight", dw)
        dh, dw, db = linear_backward(activation_backward(dg, c_act), c1)
        self.acc("linear1.weight", dw)
        self.acc("linear1.bias", db)
        return dh


class _LlamaParts(_Parts):
    NORMS = {1: "input_layernorm", 2: "post_attention_layernorm"}

    def norm(self, i, x):
        return rms_norm_forward(x, self.p[f"{self.NORMS[i]}.weight"], self.cfg.eps)

    def norm_local_backward(self, i, dh, cache):
        dx, dg = rms_norm_backward(dh, cache)
        self.acc(f"{self.NORMS[i]}.weight", dg)
        return dx

    def attention_local(self, h):  # (B, S, D) -> this rank's key/value groups' term of Attn(h)
        p, H, H_kv = self.p, self.pb.local_heads, self.pb.local_kv_heads
        cos_sin = self.pb.rope_tables(h.shape)       # the block's own: its theta and scaling
        q, c_q = linear_forward(h, p["self_attn.q_proj.weight"], None)           # (B, S, H/P d_h)
        k, c_k = linear_forward(h, p["self_attn.k_proj.weight"], None)           # (B, S, H_kv/P d_h)
        v, c_v = linear_forward(h, p["self_attn.v_proj.weight"], None)
        q, rq = rope_forward(split_heads(q, H), cos_sin=cos_sin)
        k, rk = rope_forward(split_heads(k, H_kv), cos_sin=cos_sin)
        o, c_sdpa = attention_forward(q, k, split_heads(v, H_kv), self.pb.kpm, True)
        a, c_o = linear_forward(merge_heads(o), p["self_attn.o_proj.weight"], None)   # (B, S, D)
        return a, (c_q, c_k, c_v, rq, rk, c_sdpa, c_o)

    def attention_local_backward(self, da, cache):
        c_q, c_k, c_v, rq, rk, c_sdpa, c_o = cache
        do, dw, _ = linear_backward(da, c_o)
        self.acc("self_attn.o_proj.weight", dw)
        dq, dk, dv = attention_backward(split_heads(do, self.pb.local_heads), c_sdpa)
        dh = 0.0
        for name, d, c in (("q", merge_heads(rope_backward(dq, rq)), c_q),
                           ("k", merge_heads(rope_backward(dk, rk)), c_k), ("v", merge_heads(dv), c_v)):
            dh_t, dw, _ = linear_backward(d, c)                                  # h feeds all three
            self.acc(f"self_attn.{name}_proj.weight", dw)
            dh = dh + dh_t
        return dh

    def mlp_local(self, h):
        p = self.p
        return swiglu_forward(h, p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"], p["mlp.down_proj.weight"])

    def mlp_local_backward(self, dm, cache):
        dh, dw_gate, dw_up, dw_down = swiglu_backward(dm, cache)
        for name, g in (("gate", dw_gate), ("up", dw_up), ("down", dw_down)):
            self.acc(f"mlp.{name}_proj.weight", g)
        return dh


class ParallelBlock:
    """Rank ``comm.rank``'s share of ``block`` (a TransformerBlock or LlamaBlock, float64, eval,
    no dropout). ``forward(x)``: x whole (tensor) or this rank's S/P positions (sequence);
    ``backward(dy)`` in the same layout; ``grads``: this rank's slices, in the block's names."""

    def __init__(self, block, comm, mode="tensor", key_padding_mask=None):
        check_parallel(block, comm.world, mode=mode)
        self.family, self.config, self.comm, self.mode = _family(block), block.config, comm, mode
        self.params = shard_params(block, block.params, comm.world, comm.rank)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.local_heads = block.config.n_heads // comm.world
        self.local_kv_heads = getattr(block.config, "n_kv_heads", block.config.n_heads) // comm.world
        # the attention reads a mask as True/False: its dtype is checked here, as the block does (an
        # int mask was taken), its shape in forward, where the whole sequence's length is known
        self.kpm = None if key_padding_mask is None else check_mask(
            key_padding_mask, np.shape(key_padding_mask)[:2])
        # the block's own RoPE tables (its dtype, theta and scaling), not a copy that could drift
        self.rope_tables = block.rope_tables if self.family == "llama" else None
        self.replicated = replicated(block)
        self._cache = None

    def _parts(self):
        return (_LlamaParts if self.family == "llama" else _TransformerParts)(self)

    def forward(self, x):  # (B, S or S / P, D) -> the same
        S = x.shape[1] * (self.comm.world if self.mode == "sequence" else 1)   # the whole sequence
        check_mask(self.kpm, (x.shape[0], S))
        y, caches = block_equations(x, self._parts(), getattr(self.config, "norm_first", True))
        self._cache = (x.shape,) + tuple(caches)
        return y

    def backward(self, dy):  # -> dL/dx in x's layout; adds into grads
        if self._cache is None:
            raise RuntimeError("backward: expected a forward first")
        names = self.replicated
        before = {k: self.grads[k].copy() for k in names}
        dx = block_backward(dy, self._cache, self._parts(), getattr(self.config, "norm_first", True))
        if self.mode == "sequence":
            # the replicated parameters saw only this rank's positions: one all-reduce sums their
            # gradients' increments (2 D + 2 D values for a TransformerBlock's norms and biases)
            flat = self.comm.all_reduce(np.concatenate([(self.grads[k] - before[k]).ravel() for k in names]))
            sizes = np.cumsum([before[k].size for k in names])[:-1]
            for k, inc in zip(names, np.split(flat, sizes)):
                self.grads[k] = before[k] + inc.reshape(before[k].shape)
        return dx


def predicted_traffic(block, batch, seq_len, world, mode="tensor", itemsize=8):
    """{collective: (calls, bytes one rank sends)} of one forward and backward of the sharded
    block, by the ring formula: each sublayer's (B, S, D) sum crosses the ring once forward and
    once backward -- as an all-reduce (tensor) or a reduce-scatter + all-gather (sequence)."""
    n = batch * seq_len * block.config.d_model * itemsize        # bytes of one (B, S, D) activation
    if mode == "tensor":
        return {"all_reduce": (4, 4 * ring_bytes("all_reduce", n, world))}
    n_rep = sum(block.params[k].size for k in replicated(block))
    n_rep = -(-n_rep // world) * world * itemsize                # padded to P equal chunks
    return {"all_reduce": (1, ring_bytes("all_reduce", n_rep, world)),
            "reduce_scatter": (4, 4 * ring_bytes("reduce_scatter", n, world)),
            "all_gather": (4, 4 * ring_bytes("all_gather", n, world))}
