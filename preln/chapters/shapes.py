"""Shape, FLOP and byte accounting of one Transformer block, op by op, in forward order.

    from preln import BlockConfig
    from preln.chapters.shapes import shape_flow

    flow = shape_flow(BlockConfig(d_model=64, n_heads=4, d_ff=256), B=2, S=128)
    flow.rows[0]          # OpRow(name="norm1", inputs=(("x", (2, 128, 64)),), outputs=(("h1", ...),), ...)
    flow.totals["flops"]  # the whole forward

Each :class:`OpRow` says which tensors an op reads and writes (named after the forward variables
of :mod:`preln.nn.block`), how many FLOPs it does, how many bytes its output occupies and what the
backward keeps from it. ``tests/test_shapes.py`` runs the real :class:`preln.TransformerBlock` and
checks every output shape against the block's cache and the kept bytes against
``block.cache_nbytes()``.

Conventions
-----------
FLOPs
    A multiply-add is 2 FLOPs, so ``(m, k) @ (k, n)`` costs ``2 m k n`` (``matmul_flops``).
    Elementwise work (``flops - matmul_flops``) counts one FLOP per arithmetic operation per
    element, and one per call of exp, erf or tanh -- a convention for comparing ops, not what
    any hardware charges:

    .. list-table:: Forward FLOPs of the elementwise work, per op
       :header-rows: 1
       :stub-columns: 1

       * - op
         - forward FLOPs
       * - LayerNorm
         - 7 per element (mean, subtract, square, sum, rstd, gamma, beta) + 5 per row (two divisions
           by D, + eps, sqrt, reciprocal)
       * - bias of a Linear
         - 1 per output element
       * - scale by 1/sqrt(d_h)
         - 1 per element of q (the safe policy scales q, not the scores)
       * - mask
         - 1 per score (adding the -inf bias), only with a mask
       * - softmax
         - 5 per score (max, subtract, exp, sum, divide)
       * - dropout
         - 2 per element (mask, rescale), training with p > 0 only
       * - GELU (erf)
         - 5 per element; gelu_tanh 9; ReLU 1
       * - residual add
         - 1 per element
       * - split/merge heads
         - 0 (a view; merge copies but does no arithmetic)

    Each row also counts its **backward** (``backward_matmul_flops``, ``backward_flops``), read
    off the package's ``*_backward`` functions line by line (:mod:`preln.ops`, the block's
    ``backward``):

    .. list-table:: Backward FLOPs, per op
       :header-rows: 1
       :stub-columns: 1

       * - op
         - backward FLOPs
       * - Linear
         - two matmuls (dx = dout W, dW = dout^T x), each as large as the forward one; db: 1 per
           output element; += into grads: 1 per parameter
       * - LayerNorm
         - 13 per element (recompute xhat 2, dgamma 2, dbeta 1, g 1, mean(g) 1, mean(g xhat) 2,
           subtract 2, scale by rstd 1) + 2 per row (two divisions by D) + 1 per parameter (+=
           grads)
       * - scores s = q k^T tau
         - two matmuls (dq = ds k, dk = ds^T q) + 1 per element of dq and of dk (times tau)
       * - softmax
         - 4 per score (p dp, row sum, subtract, times p)
       * - dropout
         - 2 per element (mask, rescale); on p: 4 (the backward re-applies the mask to p for dV)
       * - weighted sum o = p v
         - two matmuls (dv = p^T do, dp = do v^T)
       * - GELU (erf)
         - 7 per element (u^2, scale, exp, times u, times 1/sqrt(2 pi), + Phi(u), times dout);
           gelu_tanh 19; ReLU 2
       * - residual add
         - 1 per element (the branch's gradient joins the identity path)
       * - tiled attention
         - recomputes p (the full q k^T, its scaling, mask and the 5-FLOP softmax), then as the
           plain path: four matmuls, softmax 4 per score, tau on dq and dk

    So the backward's matmuls are exactly twice the forward's on the plain path (every product
    has two operands, and the block returns dL/dx, so both gradients are needed), plus one
    2 B S^2 D recomputation on the tiled path: :func:`closed_form_backward_flops`.

    The forward matmuls alone follow a closed form (:func:`closed_form_flops`)::

        in_proj  2 BS D (3D)   QK^T 2 BH S S d_h = 2 B S^2 D   PV 2 B S^2 D
        out_proj 2 BS D D      linear1 2 BS D F                 linear2 2 BS F D
        total    2 B S (4 D^2 + 2 D F) + 4 B S^2 D

Bytes
    ``out_bytes``: memory the op's outputs allocate (element count times the item size of the
    dtype they are produced in; views allocate nothing). ``kept``: the arrays the backward keeps,
    attributed to the op that reads them -- a Linear keeps its input, LayerNorm its input and the
    (mean, rstd) statistics, GELU its input, the plain attention its probabilities P, dropout its
    bool mask. ``totals["kept_bytes"]`` equals ``block.cache_nbytes()`` after a forward (the
    block's input x counts: LN1 keeps a reference to it).

Attention paths
    Training mode runs the plain path, which materialises the (B, H, S, S) scores and keeps P;
    eval mode runs the tiled path (FlashAttention, Dao et al. 2022, arXiv 2205.14135) in
    (B, H, Q_TILE, K_TILE) tiles and keeps only q, k, v: its row ``attn.tiled`` stands for scores,
    softmax and weighted sum together.

The module also holds the measurements the chapters make of blocks, on
:mod:`preln.measure`'s protocol (the best CPU time of interleaved repeats; tracemalloc's peak):
:func:`time_forward` and :func:`time_backward`, :func:`peak_forward_bytes`, and :func:`fit_exponent`, the log-log least-squares fit of ``y = c x^k``.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from preln.blas import blas_threads
from preln.measure import Timing, peak_bytes, time_interleaved
from preln.nn.block import TransformerBlock
from preln.nn.config import BlockConfig
from preln.ops.attention import K_TILE, Q_TILE, tile_pairs
from preln.precision import compute_dtype, elementwise_dtype, resolve_dtype, resolve_policy
from preln.validation import positive_int

__all__ = ["OpRow", "ShapeFlow", "shape_flow", "observed_shapes", "closed_form_flops",
           "closed_form_backward_flops", "kept_bytes_per_token", "time_backward",
           "fit_exponent", "PowerLaw", "time_forward", "blas_threads",
           "peak_forward_bytes", "ACTIVATION_FLOPS", "format_bytes", "format_count"]

#: elementwise FLOPs per element of each activation (the conventions above)
ACTIVATION_FLOPS = {"gelu": 5, "gelu_tanh": 9, "relu": 1}
LAYERNORM_FLOPS_PER_ELEMENT = 7
LAYERNORM_FLOPS_PER_ROW = 5
SOFTMAX_FLOPS = 5
DROPOUT_FLOPS = 2
#: backward conventions (module docstring), per element unless said otherwise
ACTIVATION_BACKWARD_FLOPS = {"gelu": 7, "gelu_tanh": 19, "relu": 2}
LAYERNORM_BACKWARD_FLOPS_PER_ELEMENT = 13
LAYERNORM_BACKWARD_FLOPS_PER_ROW = 2
SOFTMAX_BACKWARD_FLOPS = 4

Shape = tuple


class OpRow(NamedTuple):
    """One op of the forward, in order. Shapes are tuples of ints; dtypes are ``np.dtype``."""

    name: str                 # as the overflow tracer names it: "norm1", "attn.in_proj", ...
    equation: str             # what it computes, with the forward variable names
    inputs: tuple             # ((name, shape), ...) activations and weights it reads
    outputs: tuple            # ((name, shape), ...) what it writes (q, k, v: three outputs)
    out_dtype: np.dtype       # dtype the outputs are produced in
    matmul_flops: int         # 2 m k n per matmul
    flops: int                # matmul + elementwise (module docstring)
    out_bytes: int            # memory the outputs allocate; 0 for views
    kept: tuple               # ((name, shape, dtype), ...) what the backward keeps from this op
    kept_bytes: int
    backward_matmul_flops: int = 0   # the matmuls of this op's backward
    backward_flops: int = 0          # matmul + elementwise of its backward (module docstring)

    @property
    def output(self) -> Shape:
        """The shape of the (first) output."""
        return self.outputs[0][1]


class ShapeFlow(NamedTuple):
    rows: list                # [OpRow, ...] in forward order
    totals: dict              # flops, matmul_flops, out_bytes, kept_bytes, param_bytes, ...
    config: BlockConfig
    B: int
    S: int
    dtype: np.dtype
    training: bool
    path: str                 # "plain" or "tiled"

    def row(self, name):
        """The row called ``name`` (KeyError if there is none)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"name: no op {name!r}; ops are {[r.name for r in self.rows]}")


def _numel(shape):
    return int(np.prod(shape, dtype=np.int64))


def _nbytes(shape, dtype):
    return _numel(shape) * np.dtype(dtype).itemsize


def closed_form_flops(config, B, S):
    """FLOPs of the forward matmuls: 2 B S (4 D^2 + 2 D F) + 4 B S^2 D (multiply-add = 2)."""
    D, F = config.d_model, config.d_ff
    return 2 * B * S * (4 * D * D + 2 * D * F) + 4 * B * S * S * D


def closed_form_backward_flops(config, B, S, tiled=False):
    """FLOPs of the backward matmuls: twice the forward's (dx and dW of every product), plus the
    2 B S^2 D recomputation of q k^T on the tiled path (which never kept p)."""
    D = config.d_model
    return 2 * closed_form_flops(config, B, S) + (2 * B * S * S * D if tiled else 0)


def _tiled_key_columns(S, causal, q_tile=Q_TILE, k_tile=K_TILE):
    """Sum over query rows of the key columns the tiled path visits; and the number of key tiles
    visited summed over query rows (for the per-row rescaling work)."""
    cols = row_tiles = 0
    for i0, i1, j0, j1 in tile_pairs(S, S, q_tile, k_tile, causal):
        cols += (i1 - i0) * (j1 - j0)
        row_tiles += i1 - i0
    return cols, row_tiles


def shape_flow(config, B, S, dtype=np.float32, training=True, attention="auto", policy="safe",
               key_padding_mask=False):
    """Account for every op of one forward of ``TransformerBlock(config, dtype)`` on x: (B, S, D).

    Parameters
    ----------
    config : BlockConfig
    B, S : int
        Batch size and sequence length.
    dtype : storage dtype of the block (float64, float32, float16, bfloat16)
    training : bool
        Training mode: dropout (if ``config.dropout > 0``) and, with ``attention="auto"``, the
        plain attention path; eval mode: no dropout and the tiled path.
    attention : "auto" | "plain" | "tiled"
        As :class:`preln.TransformerBlock`.
    policy : "safe" | "naive" | Policy
        Decides the compute dtype (float32 for 16-bit storage under "safe").
    key_padding_mask : bool
        Whether a (B, S) mask is passed (it adds the mask to the scores and is kept).

    Returns
    -------
    ShapeFlow
        ``rows`` in forward order and ``totals``.
    """
    if not isinstance(config, BlockConfig):
        raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
    B, S = positive_int(B, "B"), positive_int(S, "S")
    if attention not in ("auto", "plain", "tiled"):
        raise ValueError(f"attention: expected 'auto', 'plain' or 'tiled'; got {attention!r}")
    dt = resolve_dtype(dtype)
    pol = resolve_policy(policy)
    ct = compute_dtype(dt, pol)                       # matmuls, softmax
    st = ct                                           # LayerNorm statistics
    ew = elementwise_dtype(dt)                        # exp, erf: float32 or wider
    D, H, F, dh = config.d_model, config.n_heads, config.d_ff, config.d_head
    p_drop = config.dropout if training else 0.0
    tiled = attention == "tiled" or (attention == "auto" and not training)
    masked = bool(key_padding_mask) or config.causal
    bool_ = np.dtype(bool)

    rows = []

    def add(name, equation, inputs, outputs, out_dtype, matmul=0, elementwise=0, kept=(),
            view=False, bwd_matmul=0, bwd_elementwise=0):
        kept = tuple((n, tuple(s), np.dtype(d)) for n, s, d in kept)
        rows.append(OpRow(
            name=name, equation=equation,
            inputs=tuple((n, tuple(s)) for n, s in inputs),
            outputs=tuple((n, tuple(s)) for n, s in outputs),
            out_dtype=np.dtype(out_dtype), matmul_flops=int(matmul),
            flops=int(matmul + elementwise),
            out_bytes=0 if view else sum(_nbytes(s, out_dtype) for _, s in outputs),
            kept=kept, kept_bytes=sum(_nbytes(s, d) for _, s, d in kept),
            backward_matmul_flops=int(bwd_matmul), backward_flops=int(bwd_matmul + bwd_elementwise)))

    bsd, bsf, bs1 = (B, S, D), (B, S, F), (B, S, 1)
    bhsd, bhss = (B, H, S, dh), (B, H, S, S)

    def norm(name, x, y):
        add(name, f"{y} = LN({x})", [(x, bsd), ("gamma, beta", (D,))], [(y, bsd)], dt,
            elementwise=LAYERNORM_FLOPS_PER_ELEMENT * B * S * D + LAYERNORM_FLOPS_PER_ROW * B * S,
            kept=[(x, bsd, dt), ("mean", bs1, st), ("rstd", bs1, st)],
            bwd_elementwise=LAYERNORM_BACKWARD_FLOPS_PER_ELEMENT * B * S * D
            + LAYERNORM_BACKWARD_FLOPS_PER_ROW * B * S + 2 * D)

    def dropout(name, x, shape):
        if p_drop > 0:
            add(name, f"{x} = dropout({x})", [(x, shape)], [(x, shape)], dt,
                elementwise=DROPOUT_FLOPS * _numel(shape), kept=[(f"mask of {name}", shape, bool_)],
                bwd_elementwise=DROPOUT_FLOPS * _numel(shape))

    def attention_rows(h):
        add("attn.in_proj", f"qkv = {h} W_in^T + b_in", [(h, bsd), ("W_in", (3 * D, D))],
            [("qkv", (B, S, 3 * D))], dt, matmul=2 * B * S * D * 3 * D, elementwise=B * S * 3 * D,
            kept=[(h, bsd, dt)], bwd_matmul=2 * 2 * B * S * D * 3 * D,
            bwd_elementwise=B * S * 3 * D + 3 * D * D + 3 * D)
        add("attn.split_heads", "q, k, v = split(qkv)", [("qkv", (B, S, 3 * D))],
            [("q", bhsd), ("k", bhsd), ("v", bhsd)], dt, view=True,
            kept=[("qkv (q, k, v are views)", (B, S, 3 * D), dt)]
            + ([("key_padding_mask", (B, S), bool_)] if key_padding_mask else []))
        scale = B * H * S * dh if pol.prescale_queries else B * H * S * S   # plain path
        if tiled:
            cols, row_tiles = _tiled_key_columns(S, config.causal)   # per (batch, head)
            per_score = 4 + (1 if masked else 0)         # max, subtract, exp, sum (+ mask)
            per_row_tile = 4 + 2 * dh                    # new max, alpha, l update; alpha * o + P V
            scale = row_tiles * dh if pol.prescale_queries else cols   # q tile scaled per key tile
            add("attn.tiled", "o = softmax(q k^T / sqrt(d_h)) v, in tiles",
                [("q", bhsd), ("k", bhsd), ("v", bhsd)], [("o", bhsd)], dt,
                # training: FlashAttention-2 keeps O and the log-sum-exp L for its backward
                # (the dropout mask is redrawn per tile, not kept); eval keeps nothing more
                kept=[("o", bhsd, ct), ("lse", (B, H, S, 1), ct)] if training else (),
                matmul=2 * 2 * B * H * cols * dh,
                elementwise=B * H * (per_score * cols + per_row_tile * row_tiles + scale + S * dh),
                # the backward recomputes p over all S x S scores (no tile is skipped), then
                # dv = p^T do, dp = do v^T, dq = ds k, dk = ds^T q
                bwd_matmul=(1 + 4) * 2 * B * H * S * S * dh,
                bwd_elementwise=B * H * ((S * dh if pol.prescale_queries else S * S)
                                         + (S * S if masked else 0) + SOFTMAX_FLOPS * S * S
                                         + SOFTMAX_BACKWARD_FLOPS * S * S + 2 * S * dh))
        else:
            add("attn.scores", "s = q k^T / sqrt(d_h)" + (" + mask" if masked else ""),
                [("q", bhsd), ("k", bhsd)], [("s", bhss)], ct, matmul=2 * B * H * S * S * dh,
                elementwise=scale + (B * H * S * S if masked else 0),
                bwd_matmul=2 * 2 * B * H * S * S * dh, bwd_elementwise=2 * B * H * S * dh)
            add("attn.softmax", "p = softmax(s)", [("s", bhss)], [("p", bhss)], ct,
                elementwise=SOFTMAX_FLOPS * B * H * S * S, kept=[("p", bhss, dt)],
                bwd_elementwise=SOFTMAX_BACKWARD_FLOPS * B * H * S * S)
            if p_drop > 0:
                add("attn.dropout", "p = dropout(p)", [("p", bhss)], [("p", bhss)], ct,
                    elementwise=DROPOUT_FLOPS * B * H * S * S,
                    kept=[("mask of attn.dropout", bhss, bool_)],
                    bwd_elementwise=2 * DROPOUT_FLOPS * B * H * S * S)
            add("attn.weighted_sum", "o = p v", [("p", bhss), ("v", bhsd)], [("o", bhsd)], dt,
                matmul=2 * B * H * S * S * dh, bwd_matmul=2 * 2 * B * H * S * S * dh)
        add("attn.merge_heads", "o = merge(o)", [("o", bhsd)], [("o", bsd)], dt)
        add("attn.out_proj", "a = o W_out^T + b_out", [("o", bsd), ("W_out", (D, D))], [("a", bsd)],
            dt, matmul=2 * B * S * D * D, elementwise=B * S * D, kept=[("o", bsd, dt)],
            bwd_matmul=2 * 2 * B * S * D * D, bwd_elementwise=B * S * D + D * D + D)
        dropout("dropout1", "a", bsd)

    def mlp_rows(h):
        add("mlp.linear1", f"u = {h} W_1^T + b_1", [(h, bsd), ("W_1", (F, D))], [("u", bsf)], dt,
            matmul=2 * B * S * D * F, elementwise=B * S * F, kept=[(h, bsd, dt)],
            bwd_matmul=2 * 2 * B * S * D * F, bwd_elementwise=B * S * F + F * D + F)
        add(f"mlp.{config.activation}", f"g = {config.activation}(u)", [("u", bsf)], [("g", bsf)], dt,
            elementwise=ACTIVATION_FLOPS[config.activation] * B * S * F,
            kept=[("u", bsf, dt)] + ([("Phi(u)", bsf, ew)] if config.activation == "gelu" else []),
            bwd_elementwise=ACTIVATION_BACKWARD_FLOPS[config.activation] * B * S * F)
        dropout("mlp.dropout", "g", bsf)
        add("mlp.linear2", "z = g W_2^T + b_2", [("g", bsf), ("W_2", (D, F))], [("z", bsd)], dt,
            matmul=2 * B * S * F * D, elementwise=B * S * D, kept=[("g", bsf, dt)],
            bwd_matmul=2 * 2 * B * S * F * D, bwd_elementwise=B * S * D + D * F + D)
        dropout("dropout2", "z", bsd)

    def residual(name, a, b, out):
        add(name, f"{out} = {a} + {b}", [(a, bsd), (b, bsd)], [(out, bsd)], dt,
            elementwise=B * S * D, bwd_elementwise=B * S * D)

    if config.norm_first:                     # Pre-LN: x1 = x + Attn(LN1(x)); y = x1 + MLP(LN2(x1))
        norm("norm1", "x", "h1")
        attention_rows("h1")
        residual("residual1", "x", "a", "x1")
        norm("norm2", "x1", "h2")
        mlp_rows("h2")
        residual("residual2", "x1", "z", "y")
    else:                                     # Post-LN: x1 = LN1(x + Attn(x)); y = LN2(x1 + MLP(x1))
        attention_rows("x")
        residual("residual1", "x", "a", "r1")
        norm("norm1", "r1", "x1")
        mlp_rows("x1")
        residual("residual2", "x1", "z", "r2")
        norm("norm2", "r2", "y")

    n_params = sum(_numel(s) for s in _param_shapes(config))
    totals = {
        "flops": sum(r.flops for r in rows),
        "matmul_flops": sum(r.matmul_flops for r in rows),
        "out_bytes": sum(r.out_bytes for r in rows),
        "kept_bytes": sum(r.kept_bytes for r in rows),
        "params": n_params,
        "param_bytes": n_params * dt.itemsize,
        "closed_form_flops": closed_form_flops(config, B, S),
        "backward_flops": sum(r.backward_flops for r in rows),
        "backward_matmul_flops": sum(r.backward_matmul_flops for r in rows),
        "closed_form_backward_flops": closed_form_backward_flops(config, B, S, tiled),
    }
    return ShapeFlow(rows, totals, config, B, S, dt, bool(training), "tiled" if tiled else "plain")


def kept_bytes_per_token(config, dtype=np.float32, policy="safe"):
    """[(op, array, bytes per token), ...]: what the backward keeps besides p, the part of the cache that is
    linear in S. Read off the kept arrays of the tiled path at B = S = 1 (which keeps no
    (S, S) array), so it is the same list :func:`shape_flow` adds up; for the plain path add
    ``B H S^2 itemsize`` for p (and the dropout masks in training).

    For a Pre-LN block with exact GELU the values add up to
    ``(8 D + 3 F) itemsize`` (x, h1, qkv = 3D, o, x1, h2; u, Phi(u), g) plus the two LayerNorms'
    mean and rstd, four values in the statistics dtype (float32 or wider): Phi(u) is kept in
    the elementwise dtype, float32 for 16-bit storage.
    """
    flow = shape_flow(config, 1, 1, dtype=dtype, training=False, attention="tiled", policy=policy)
    return [(r.name, name, _nbytes(shape, dt)) for r in flow.rows for name, shape, dt in r.kept]


def _param_shapes(config):
    from preln.nn.block import param_shapes
    return list(param_shapes(config).values())


def observed_shapes(block, y):
    """{op name: output shape} read off a block after ``y = block(x)``, from its forward cache.

    The cache holds each op's *input* (what the backward needs), so an op's output is found as
    the input of the op after it: LN1's output is what in_proj kept, and so on. Ops whose output
    nothing keeps are found through the residual sums (``a = x1 - x``) or ``y``.
    """
    c = block.cache
    if c is None:
        raise RuntimeError("block: no forward cache; call y = block(x) first")
    from preln.ops.attention import merge_heads

    sd, mlp = c.attn.sdpa, c.mlp
    q = sd.q
    B, H, S, dh = q.shape
    seen = {
        "attn.in_proj": np.concatenate([merge_heads(sd.q), merge_heads(sd.k),
                                        merge_heads(sd.v)], axis=-1).shape,
        "attn.split_heads": q.shape,
        "attn.merge_heads": c.attn.out_proj.x.shape,
        "mlp.linear1": mlp.act.x.shape,
        f"mlp.{block.config.activation}": mlp.linear2.x.shape,
    }
    if sd.p is not None:                                  # plain path: P kept
        seen["attn.scores"] = seen["attn.softmax"] = sd.p.shape
        seen["attn.weighted_sum"] = (B, H, S, dh)         # merge_heads' input
        if sd.drop_mask is not None:
            seen["attn.dropout"] = sd.drop_mask.shape
    else:
        seen["attn.tiled"] = (B, H, S, dh)
    for name, mask in (("dropout1", c.attn.drop_mask), ("mlp.dropout", mlp.hidden_mask),
                       ("dropout2", mlp.drop_mask)):
        if mask is not None:
            seen[name] = mask.shape
    if block.config.norm_first:
        x, x1 = c.ln1.x, c.ln2.x                          # the block input and x + a
        seen.update({"norm1": c.attn.in_proj.x.shape, "attn.out_proj": (x1 - x).shape,
                     "residual1": x1.shape, "norm2": mlp.linear1.x.shape,
                     "mlp.linear2": (y - x1).shape, "residual2": y.shape})
    else:
        x, r1, x1 = c.attn.in_proj.x, c.ln1.x, mlp.linear1.x
        seen.update({"attn.out_proj": (r1 - x).shape, "residual1": r1.shape,
                     "norm1": x1.shape, "mlp.linear2": (c.ln2.x - x1).shape,
                     "residual2": c.ln2.x.shape, "norm2": y.shape})
    return seen


# ---- measurement -----------------------------------------------------------------------------

class PowerLaw(NamedTuple):
    """y = coefficient * x ** exponent, fitted by least squares on (log x, log y)."""

    exponent: float
    coefficient: float

    def __call__(self, x):
        return self.coefficient * np.asarray(x, dtype=float) ** self.exponent


def fit_exponent(x, y):
    """Fit ``y = c x^k`` by least squares on log y = log c + k log x; return PowerLaw(k, c).

    x, y: sequences of positive numbers, at least two distinct x.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"x, y: expected two 1-D sequences of the same length >= 2; "
                         f"got shapes {x.shape} and {y.shape}")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("x, y: a log-log fit needs positive values")
    if len(np.unique(x)) < 2:
        raise ValueError("x: needs at least two distinct values")
    k, log_c = np.polyfit(np.log(x), np.log(y), 1)
    return PowerLaw(float(k), float(np.exp(log_c)))


def _block_and_input(config, B, S, dtype, training, attention, seed, fused=True):
    block = TransformerBlock(config, dtype=dtype, seed=seed, attention=attention,
                             fused=fused).train(training)
    x = np.random.default_rng(seed).standard_normal((B, S, config.d_model)).astype(block.dtype)
    return block, x


def time_forward(cases, dtype=np.float32, training=True, attention="auto", repeats=5, warmup=1,
                 threads=1, clock=time.process_time, seed=0):
    """Time ``block(x)`` for each case ``(config, B, S)``; returns a :class:`Timing`.

    Made to give stable ratios on a busy machine:

    - the cases are interleaved (every round times each case once), so a slow spell slows all
      sizes alike instead of one;
    - the clock is the process's CPU time (``time.process_time``), which does not count the time
      other programs hold the core; pass ``clock=time.perf_counter`` for wall time;
    - BLAS runs ``threads`` threads (:func:`blas_threads`);
    - the best of ``repeats`` runs is the estimate: interference only ever adds time.

    (:func:`time_interleaved` over the cases' forwards.)
    """
    pairs = [_block_and_input(cfg, B, S, dtype, training, attention, seed) for cfg, B, S in cases]
    timed = time_interleaved({i: (lambda b=block, x=x: b(x)) for i, (block, x) in enumerate(pairs)},
                             repeats, warmup, threads, clock)
    samples = np.stack([timed[i].samples for i in range(len(pairs))], axis=1)   # (repeats, cases)
    return Timing(samples.min(axis=0), np.median(samples, axis=0), samples)


def time_backward(cases, dtype=np.float32, repeats=5, warmup=1, threads=1, clock=time.process_time,
                  seed=0, fused=True):
    """Time ``block(x)`` and ``block.backward(dy)`` of each training-mode case ``(config, B, S)``;
    returns ``(forward, backward)``, two :class:`Timing`. Interleaved, CPU clock, best of
    ``repeats``, as :func:`time_forward`; each backward follows its own forward (untimed part of
    the pair is the other pass). ``fused``: True runs the blocks' fused kernels, False op by op,
    and a sequence gives one flag per case — so that the two ways are timed interleaved, round
    by round, when a chapter compares them.
    """
    flags = [fused] * len(cases) if isinstance(fused, (bool, np.bool_)) else list(fused)
    if len(flags) != len(cases) or not all(isinstance(f, (bool, np.bool_)) for f in flags):
        raise ValueError(f"fused: expected a bool or one bool per case ({len(cases)}); got {fused!r}")
    pairs = [_block_and_input(cfg, B, S, dtype, True, "auto", seed, f)
             for (cfg, B, S), f in zip(cases, flags)]
    dys = [np.random.default_rng(seed + 1).standard_normal(x.shape).astype(x.dtype) for _, x in pairs]
    fwd = np.zeros((repeats, len(pairs)))
    bwd = np.zeros((repeats, len(pairs)))
    with blas_threads(threads):
        for (block, x), dy in zip(pairs, dys):
            for _ in range(warmup):
                block(x)
                block.backward(dy)
        for r in range(repeats):
            for i, ((block, x), dy) in enumerate(zip(pairs, dys)):
                block.zero_grad()
                t0 = clock()
                block(x)
                t1 = clock()
                block.backward(dy)
                t2 = clock()
                fwd[r, i], bwd[r, i] = t1 - t0, t2 - t1
    return (Timing(fwd.min(axis=0), np.median(fwd, axis=0), fwd),
            Timing(bwd.min(axis=0), np.median(bwd, axis=0), bwd))


def peak_forward_bytes(config, B, S, dtype=np.float32, training=True, attention="auto", seed=0,
                       threads=1):
    """Peak bytes allocated during one forward (tracemalloc), beyond the parameters and x.

    Counts the cache the forward builds for the backward and every temporary alive at the peak,
    in a second forward: allocations that happen once per process are left to a warm-up run.
    numpy reports its array buffers to tracemalloc, so this is the activation memory of the op
    sequence, not the process's resident size. BLAS runs ``threads`` threads, as in
    :func:`time_forward` (the memory does not depend on it; the run time on a busy machine does).
    """
    block, x = _block_and_input(config, B, S, dtype, training, attention, seed)
    with blas_threads(threads):
        return peak_bytes(lambda: block(x), warmup=1)   # one-off allocations in the warm-up


# ---- formatting ------------------------------------------------------------------------------

def _scaled(n, base, units):
    """n in the largest of ``units`` (each ``base`` times the one before) it reaches; whole numbers
    in the first unit, 3 significant digits in the others; the last unit takes everything above."""
    n = float(n)
    for unit in units[:-1]:
        if abs(n) < base:
            return f"{n:.0f}{unit}" if unit == units[0] else f"{n:.3g}{unit}"
        n /= base
    return f"{n:.3g}{units[-1]}"


def format_bytes(n):
    """1536 -> '1.5 KiB' (binary prefixes, 3 significant digits)."""
    return _scaled(n, 1024, (" B", " KiB", " MiB", " GiB", " TiB"))


def format_count(n):
    """12_345_678 -> '12.3 M' (decimal prefixes, 3 significant digits)."""
    return _scaled(n, 1000, ("", " k", " M", " G", " T"))
