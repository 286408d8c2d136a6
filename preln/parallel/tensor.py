"""The block sharded over P ranks: Megatron tensor parallel (Shoeybi et al. 2019, arXiv 1909.08053)
and sequence parallel (Korthikanti et al. 2022, arXiv 2205.05198): the block's own equations and
sublayers, with each sublayer swapped for its sharded form, :class:`Sharded`.

Tensor parallel: a rank holds H/P heads -- its rows of W_q, W_k, W_v (column parallel: its columns
of the product) and its columns of W_out (row parallel) -- and F/P hidden units -- rows of W_1
(gate, up), columns of W_2 (down). So a rank's sublayer is the family's own sublayer on a block of
H/P heads and F/P hidden units. Each sublayer's input is whole on every rank; its output is a
partial sum, all-reduced once in the forward; the input's gradient is all-reduced once in the
backward. The biases after the sum are added once, after it.

Sequence parallel: between the sublayers -- the norms, the residual adds, the biases after the
sum -- a rank holds S/P positions. A sublayer's input is all-gathered along S and its output
reduce-scattered along S (the all-reduce's two halves); the backward swaps them. The Pre-LN
block's norms sit exactly where the all-gather goes: everything outside Attn and MLP is per
position, so it needs no other rank's data.
"""
import dataclasses

import numpy as np

from preln.nn.base import Sublayer
from preln.nn.block import TransformerBlock
from preln.nn.llama import LlamaBlock
from preln.parallel.comm import ring_bytes
from preln.validation import check_mask

__all__ = ["MODES", "check_parallel", "shard_params", "replicated", "Sharded", "ParallelBlock",
           "predicted_traffic"]

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


class Sharded(Sublayer):
    """A sublayer over the ranks, in Megatron's f / g pair: its input enters whole (sequence
    parallel: all-gathered along S), the family's own sublayer ``inner`` computes this rank's heads
    or hidden units -- its first linears column parallel, its last row parallel, so its output is
    this rank's term of the sum -- the terms are all-reduced (sequence parallel: reduce-scattered
    along S) and the last bias, ``bias`` (None: the family has none), added once after the sum.
    The backward is the same read backwards: the collectives swap."""

    def __init__(self, block, inner, bias=None):
        super().__init__(block)
        self.inner, self.bias = inner, bias
        inner.last_bias = False                                   # added here, after the sum

    def __call__(self, h):  # this rank's (B, S or S / P, D) -> the same positions of sublayer(h)
        b = self.block
        term = self.inner(b.enter(h)).out                         # (B, S, D), this rank's term
        self.cache = self.inner.cache
        out = b.leave(term)
        return out if self.bias is None else out + b.params[self.bias]

    def backward(self, da, cache):
        b = self.block
        if self.bias is not None:
            self.grad(self.bias, da.sum(axis=(0, 1)))             # added once, after the sum
        return b.enter_backward(self.inner.backward(b.leave_backward(da), cache))


class _Shard:
    """A family's block made of one rank's shard: the family's forward and backward, its
    sublayers with attention and MLP :class:`Sharded`; op by op, plain attention, eval."""

    def setup(self, pb, biases):
        self.pb, self.comm, self.sp, self.biases = pb, pb.comm, pb.sp, biases
        self.params, self.grads = pb.params, pb.grads             # the rank's slices, shared

    def enter(self, h):          # (B, S / P, D) -> (B, S, D) in sequence parallel
        return self.comm.all_gather(h, axis=1) if self.sp else h

    def leave(self, term):       # a sum's term -> the sum (sequence parallel: this rank's S / P)
        return self.comm.reduce_scatter(term, axis=1) if self.sp else self.comm.all_reduce(term)

    def enter_backward(self, dh_term):
        return self.comm.reduce_scatter(dh_term, axis=1) if self.sp else self.comm.all_reduce(dh_term)

    def leave_backward(self, da):
        return self.comm.all_gather(da, axis=1) if self.sp else da

    def fuses(self):
        return False

    def tiled(self):
        return False

    def sublayers(self, watch=None, fused=False, key_padding_mask=None, *rest):
        # the mask is the whole sequence's (the attention sees all S positions): the rank's own
        ln1, attn, ln2, mlp = super().sublayers(watch, False, self.pb.kpm, *rest)
        return ln1, Sharded(self, attn, self.biases[0]), ln2, Sharded(self, mlp, self.biases[1])


class _TransformerShard(_Shard, TransformerBlock):
    pass


class _LlamaShard(_Shard, LlamaBlock):
    def rope_tables(self, shape, positions=None, start=0):  # the whole sequence's, the whole block's
        B, S, D = shape
        return self.pb.rope_tables((B, S * self.comm.world if self.sp else S, D), positions, start)


class ParallelBlock:
    """Rank ``comm.rank``'s share of ``block`` (a TransformerBlock or LlamaBlock, float64, eval,
    no dropout). ``forward(x)``: x whole (tensor) or this rank's S/P positions (sequence);
    ``backward(dy)`` in the same layout; ``grads``: this rank's slices, in the block's names.
    ``self.block``: the rank's block -- of ``block``'s class, H/P heads and F/P hidden units, its
    attention and MLP :class:`Sharded` -- whose forward and backward these are."""

    def __init__(self, block, comm, mode="tensor", key_padding_mask=None):
        check_parallel(block, comm.world, mode=mode)
        self.family, self.config, self.comm, self.mode = _family(block), block.config, comm, mode
        self.sp = mode == "sequence"
        self.params = shard_params(block, block.params, comm.world, comm.rank)
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        cfg, P = block.config, comm.world
        self.local_heads = cfg.n_heads // P
        self.local_kv_heads = getattr(cfg, "n_kv_heads", cfg.n_heads) // P
        # the attention reads a mask as True/False: its dtype is checked here, as the block does (an
        # int mask was taken), its shape in forward, where the whole sequence's length is known
        self.kpm = None if key_padding_mask is None else check_mask(
            key_padding_mask, np.shape(key_padding_mask)[:2])
        # the block's own RoPE tables (its dtype, theta and scaling), not a copy that could drift
        self.rope_tables = block.rope_tables if self.family == "llama" else None
        self.replicated = replicated(block)
        # the rank's block: H/P heads (H_kv/P key/value heads) and F/P hidden units of the same width
        if self.family == "llama":
            local = dataclasses.replace(cfg, n_heads=self.local_heads, n_kv_heads=self.local_kv_heads,
                                        d_ff=cfg.d_ff // P)
            self.block, biases = _LlamaShard(local, dtype=block.dtype), (None, None)
        else:
            local = dataclasses.replace(cfg, n_heads=self.local_heads, d_ff=cfg.d_ff // P)
            self.block = _TransformerShard(local, dtype=block.dtype, attention="plain", fused=False)
            biases = ("self_attn.out_proj.bias", "linear2.bias")
        self.block.setup(self, biases)
        self.block.eval()
        self._cache = None

    def forward(self, x):  # (B, S or S / P, D) -> the same
        S = x.shape[1] * (self.comm.world if self.sp else 1)   # the whole sequence
        check_mask(self.kpm, (x.shape[0], S))
        y = self.block.forward(x)
        self._cache = self.block.cache
        return y

    def drop_cache(self):
        """Forget the last forward's cache (here and in the rank's block). Returns self."""
        self._cache = None
        self.block.drop_cache()
        return self

    def backward(self, dy):  # -> dL/dx in x's layout; adds into grads
        if self._cache is None:
            raise RuntimeError("backward: expected a forward first")
        names = self.replicated
        before = {k: self.grads[k].copy() for k in names}
        dx = self.block.backward(dy)
        if self.sp:
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
