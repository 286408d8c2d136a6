"""Multi-head scaled dot-product attention (Vaswani et al. 2017), plain and tiled.

    S = (Q / sqrt(d_h)) K^T + mask;   P = softmax(S);   O = dropout(P) V

The plain path keeps P, (B, H, S, S), for the backward. With ``fused=True`` (float32/float64, safe
policy, no dropout, no tracer) its softmax -- scale, mask, max, exp, sum, divide -- is one pass
over the scores (:func:`preln.ops.fused.softmax`), and so is the softmax's backward. The tiled
path (FlashAttention, Dao et al. 2022, arXiv 2205.14135) walks key tiles with the online-softmax
recurrence and never holds more than one (B, H, Tq, Tk) tile of scores; it is what eval mode runs.
In training, :func:`flash_attention_train` keeps O and the log-sum-exp only, and
:func:`flash_attention_backward` (FlashAttention-2, Dao 2023, arXiv 2307.08691) recomputes P tile
by tile from them; dropout masks are redrawn per tile from a seed. :func:`attention_backward`
takes either cache. The tile loop is written once: :func:`tiles` and :func:`tile_pairs` walk the
tiles (skipping those the causal mask hides) and :func:`online_softmax_step` is the recurrence --
the paged KV cache (preln.serve.paged) and the book's I/O counting and figures use the same two.

Grouped-query attention (GQA, Ainslie et al. 2023, arXiv 2305.13245): k and v may have fewer heads
than q, H_kv dividing H (H_kv = 1 is multi-query attention, Shazeer 2019, arXiv 1911.02150; H_kv = H
is the multi-head attention above). Query head h reads key/value head h // G, G = H / H_kv, as
transformers' ``repeat_kv`` lays them out. The G query heads of a group are stacked along the
sequence axis, (B, H, S, d_h) -> (B, H_kv, G S, d_h), so one batched matmul serves the whole group
and K, V are never repeated; in the backward the same stacking makes the matmuls for dK and dV sum
over the group's heads -- the "sum over the heads that shared a key" of the chain rule.
"""
from typing import NamedTuple

import numpy as np

from preln.precision import SAFE, compute_dtype, matmul, no_watch
from preln.ops.fused import softmax as fused_softmax, softmax_backward as fused_softmax_backward
from preln.ops.dropout import dropout_backward, dropout_forward
from preln.ops.softmax import softmax_backward, softmax_forward

#: tile sizes of the tiled path: big enough that numpy's per-call overhead is amortised
Q_TILE = 256
K_TILE = 512


def split_heads(x, n_heads):  # (B, S, D) -> (B, H, S, d_h)
    B, S, D = x.shape
    return x.reshape(B, S, n_heads, D // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x):  # (B, H, S, d_h) -> (B, S, D)
    B, H, S, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, H * dh)


def repeat_kv(x, n_rep):  # (B, H_kv, S, d_h) -> (B, H_kv n_rep, S, d_h)
    """Each key/value head repeated for the n_rep query heads that share it: head h of the result is
    head h // n_rep of x (transformers' ``repeat_kv``). GQA equals multi-head attention on
    ``repeat_kv(k, G), repeat_kv(v, G)`` -- what the attention functions compute without the copy."""
    return np.repeat(x, n_rep, axis=1)


def _grouped(a, n_kv):  # (B, H, M, K) -> (B, H_kv, G M, K), a view when a is contiguous
    B, H, M, K = a.shape
    return a.reshape(B, n_kv, (H // n_kv) * M, K)


def _gmm(a, b, out=None):  # (B, H, M, K), (B, H_kv, K, N) -> (B, H, M, N)
    """a @ b, head h of a with head h // G of b: one matmul per key/value head over its G stacked
    query heads. H_kv = H is the plain batched matmul (and may write into ``out`` directly)."""
    B, H, M, _ = a.shape
    n_kv = b.shape[1]
    if n_kv == H:
        return matmul(a, b) if out is None else np.matmul(a, b, out=out)
    r = matmul(_grouped(a, n_kv), b).reshape(B, H, M, b.shape[-1])
    if out is None:
        return r
    out[...] = r
    return out


def _gmm_t(a, b, n_kv, out=None):  # (B, H, M, K), (B, H, M, N) -> (B, H_kv, K, N)
    """sum over the G heads of each group of a_h^T b_h: the transposed product, whose contraction
    over the stacked (G M) rows adds up the gradients of the heads that shared one key/value head."""
    if n_kv == a.shape[1]:
        return np.matmul(a.swapaxes(-1, -2), b, out=out)
    r = matmul(_grouped(a, n_kv).swapaxes(-1, -2), _grouped(b, n_kv))
    if out is None:
        return r
    out[...] = r
    return out


def check_heads(q, k, v):
    """q (B, H, Sq, d_h), k and v (B, H_kv, Sk, d_h) with H_kv dividing H; else a ValueError."""
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k, {k.shape}; got {v.shape}")
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"k: expected (B, H_kv, Sk, d_h) with q's B and d_h, q being (B, H, Sq, d_h) "
                         f"= {q.shape}; got {k.shape}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"k: expected a number of key/value heads H_kv dividing the H = {q.shape[1]} "
                         f"query heads; got H_kv = {k.shape[1]}")


def mask_bias(key_padding_mask=None, causal=False, q_len=0, k_len=0, q0=0, k0=0):
    """Additive float32 mask for query rows q0:q0+q_len and key columns k0:k0+k_len, or None.

    Broadcastable to (B, 1, q_len, k_len): -inf where a key is padding (key_padding_mask True) or,
    with causal, where the key comes after the query; 0 elsewhere.
    """
    bias = None
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, k0:k0 + k_len]          # (B, 1, 1, Tk)
        bias = np.where(pad, np.float32(-np.inf), np.float32(0))
    if causal:
        i = np.arange(q0, q0 + q_len)[:, None]
        j = np.arange(k0, k0 + k_len)[None, :]
        c = np.where(j > i, np.float32(-np.inf), np.float32(0))       # (Tq, Tk)
        bias = c if bias is None else bias + c                        # (B, 1, Tq, Tk)
    return bias


def tiles(n, size):  # -> (t0, t1) per tile
    """The tiles of range(n): (0, size), (size, 2 size), ..., the last one possibly shorter."""
    for t0 in range(0, n, size):
        yield t0, min(t0 + size, n)


def key_end(i1, Sk, causal, q_offset=0):
    """How many keys the query tile ending at row i1 can see: all Sk, or with ``causal`` the keys
    up to its last query's position q_offset + i1 - 1 (every later key tile is masked: skipped)."""
    return min(Sk, q_offset + i1) if causal else Sk


def tile_pairs(Sq, Sk, q_tile, k_tile, causal=False, q_offset=0):  # -> (i0, i1, j0, j1) per tile
    """Every (query tile, key tile) of the (Sq, Sk) scores that has a visible key, query tile by
    query tile -- the order of the loops in FlashAttention-2."""
    for i0, i1 in tiles(Sq, q_tile):
        for j0, j1 in tiles(key_end(i1, Sk, causal, q_offset), k_tile):
            yield i0, i1, j0, j1


def online_softmax_step(m, l, acc, s, v, matmul=np.matmul, watch=no_watch, subtract_max=True,
                        drop=None):  # -> m', l', acc'
    """Fold one tile of scores s (..., Tq, Tk) and its values v (..., Tk, d) into the running row
    max m and row sum l (..., Tq, 1) and the unnormalised output acc (..., Tq, d):

        m' = max(m, rowmax(s));  P = exp(s - m');  l' = e^(m - m') l + rowsum(P);  acc' = e^(m - m') acc + P v

    After the last tile, O = acc / l. A row that has seen no key yet (m' = -inf) gets P = 0 and
    keeps l = 0. ``subtract_max=False`` (the naive policy) exponentiates the raw scores (m' = 0).
    drop: the tile's dropout multiplier (keep-mask / (1 - p)), applied to P after the row sum, so
    O = dropout(softmax(s)) v. matmul: the P v product (:func:`_gmm` for grouped heads).
    """
    if subtract_max:
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        shift = np.where(np.isfinite(m_new), m_new, 0)              # no visible key yet: exp(-inf) = 0
    else:
        m_new = shift = np.zeros_like(m)
    p = np.subtract(s, shift)
    p = watch("exp", np.exp(p, out=p), s)                           # exp in place: one tile-sized array
    alpha = np.exp(m - shift)                                       # rescales the tiles before; 0 at m = -inf
    l = alpha * l + p.sum(axis=-1, keepdims=True)
    if drop is not None:
        p *= drop
    return m_new, l, alpha * acc + matmul(p, v)


class AttentionCache(NamedTuple):
    q: np.ndarray            # (B, H, S, d_h)
    k: np.ndarray            # (B, H_kv, S, d_h), H_kv = H without grouping
    v: np.ndarray            # (B, H_kv, S, d_h)
    p: np.ndarray            # (B, H, S, S) softmax probabilities, or None (recomputed in backward)
    drop_mask: np.ndarray    # (B, H, S, S) bool, or None without dropout
    dropout_p: float
    key_padding_mask: np.ndarray
    causal: bool
    policy: object


def _scores(q, k, policy, ct):  # (B, H, Sq, d_h), (B, H_kv, Sk, d_h) -> (B, H, Sq, Sk)
    scale = ct.type(1.0 / np.sqrt(q.shape[-1]))
    qc, kt = q.astype(ct, copy=False), k.astype(ct, copy=False).swapaxes(-1, -2)
    if policy.prescale_queries:
        return _gmm(qc * scale, kt)
    return _gmm(qc, kt) * scale                                       # the logits exist unscaled first


def attention_forward(q, k, v, key_padding_mask=None, causal=False, dropout_p=0.0, rng=None,
                      policy=SAFE, watch=no_watch, keep_probs=True, fused=False):
    """Plain attention. q: (B, H, S, d_h), k, v: (B, H_kv, S, d_h) -> (out (B, H, S, d_h), cache).

    key_padding_mask: (B, S) bool, True = padding key. With ``keep_probs=False`` P is not cached
    and the backward recomputes it. ``fused=True``: the fused softmax (see the module docstring;
    the caller checks that it applies), with the scale applied to the scores instead of to q.
    """
    check_heads(q, k, v)
    if fused:
        s = _gmm(q, k.swapaxes(-1, -2))                               # (B, H, S, S), unscaled
        p = fused_softmax(s, 1.0 / np.sqrt(q.shape[-1]), key_padding_mask, causal)
        cache = AttentionCache(q, k, v, p if keep_probs else None, None, 0.0, key_padding_mask,
                               causal, policy)
        return _gmm(p, v), cache                                      # (B, H, S, d_h)
    ct = compute_dtype(q.dtype, policy)
    s = watch("scores", _scores(q, k, policy, ct), q, k)              # (B, H, S, S)
    bias = mask_bias(key_padding_mask, causal, q.shape[2], k.shape[2])
    if bias is not None:
        s += bias.astype(ct, copy=False)                              # s is ours: add in place
    p, _ = softmax_forward(s, -1, policy, watch)                      # (B, H, S, S)
    pd, drop_mask = dropout_forward(p, dropout_p, rng)
    out = watch("weighted_sum", _gmm(pd, v.astype(ct, copy=False)), pd, v)  # (B, H, S, d_h)
    cache = AttentionCache(q, k, v, p.astype(q.dtype, copy=False) if keep_probs else None,
                           drop_mask, dropout_p, key_padding_mask, causal, policy)
    return out.astype(q.dtype, copy=False), cache


def attention_backward(dout, cache, out=None, fused=False):  # (B, H, S, d_h) -> dq, dk, dv
    """dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = tau dS K;  dK = tau dS^T Q.

    dq: (B, H, S, d_h); dk, dv: (B, H_kv, S, d_h) -- with grouped heads, dK and dV of a key/value
    head sum the products over the G query heads that read it.

    out: optional (dq, dk, dv) arrays, shaped as q, k, v, to write the gradients into and return.
    The block passes views of one (B, S, 3D) array laid out as qkv, so the matmuls write straight
    into it and the in-projection's backward needs no concatenate. fused: recompute P and take the
    softmax's backward with the fused kernels (float32/float64, safe policy, no dropout).
    """
    if isinstance(cache, FlashCache):                                 # the tiled training forward's
        return flash_attention_backward(dout, cache, out)
    q, k, v, p, drop_mask, dropout_p, kpm, causal, policy = cache
    ct = compute_dtype(dout.dtype, policy)
    if p is None and fused:                                           # recompute P (eval-mode cache)
        p = fused_softmax(_gmm(q, k.swapaxes(-1, -2)), 1.0 / np.sqrt(q.shape[-1]), kpm, causal)
    elif p is None:
        s = _scores(q, k, policy, ct)
        bias = mask_bias(kpm, causal, q.shape[2], k.shape[2])
        p, _ = softmax_forward(s if bias is None else s + bias.astype(ct), -1, policy)
    dt = dout.dtype
    direct = out is not None and ct == dt                             # matmul can write into out itself
    dq, dk, dv = out if direct else (None, None, None)
    doc = dout.astype(ct, copy=False)
    pc = p.astype(ct, copy=False)
    pd, _ = dropout_forward(pc, dropout_p, None, drop_mask)           # out = dropout(P) V
    n_kv = k.shape[1]
    dv = _gmm_t(pd, doc, n_kv, out=dv)                                # (B, H_kv, S, d_h)
    dpd = _gmm(doc, v.astype(ct, copy=False).swapaxes(-1, -2))        # (B, H, S, S)
    dp = dropout_backward(dpd, drop_mask, dropout_p)
    if fused:
        ds = fused_softmax_backward(dp, pc, out=dp)                  # P = softmax(S), in one pass
    else:
        ds = softmax_backward(dp, pc, -1, policy)                     # P = softmax(S)
    tau = ct.type(1.0 / np.sqrt(q.shape[-1]))
    kc = k.astype(ct, copy=False)
    if n_kv == q.shape[1]:                                            # S = tau Q K^T
        dq = np.matmul(ds, kc, out=dq)                                # written straight into out
    else:
        dq = _gmm(ds, kc, out=dq)
    dq *= tau
    dk = _gmm_t(ds, q.astype(ct, copy=False), n_kv, out=dk)           # (B, H_kv, S, d_h)
    dk *= tau
    grads = tuple(g.astype(dt, copy=False) for g in (dq, dk, dv))
    if out is not None and not direct:                                # 16-bit storage: round, then copy
        for dst, g in zip(out, grads):
            dst[...] = g
    return tuple(out) if out is not None else grads


def flash_attention_forward(q, k, v, key_padding_mask=None, causal=False, policy=SAFE,
                            watch=no_watch, q_tile=Q_TILE, k_tile=K_TILE, q_offset=0):
    """Tiled attention with the online softmax; q (B, H, Sq, d_h), k, v (B, H_kv, Sk, d_h) -> (B, H, Sq, d_h).

    q_offset: the position of the first query among the keys. 0 for self-attention over one
    sequence; ``Sk - Sq`` when decoding with a KV cache, where the Sq new queries are the last Sq
    of Sk positions -- the causal mask then lets query i see keys 0 .. q_offset + i.

    For each query tile, over key tiles j (Dao et al. 2022, Algorithm 1):
        S_j = Q K_j^T;  m' = max(m, rowmax(S_j));  P_j = exp(S_j - m')
        l' = e^(m - m') l + rowsum(P_j);  O' = e^(m - m') O + P_j V_j;  finally O / l.
    Extra memory: one (B, H, q_tile, k_tile) tile plus (m, l, O) for the query tile.
    """
    check_heads(q, k, v)
    ct = compute_dtype(q.dtype, policy)
    B, H, Sq, dh = q.shape
    Sk = k.shape[2]
    out = np.empty(q.shape, dtype=q.dtype)
    for i0, i1 in tiles(Sq, q_tile):
        qi = q[:, :, i0:i1]
        m = np.full((B, H, i1 - i0, 1), -np.inf, dtype=ct)           # running row max
        l = np.zeros((B, H, i1 - i0, 1), dtype=ct)                    # running row sum of exp
        o = np.zeros((B, H, i1 - i0, dh), dtype=ct)                   # running unnormalised output
        for j0, j1 in tiles(key_end(i1, Sk, causal, q_offset), k_tile):
            s = watch("scores", _scores(qi, k[:, :, j0:j1], policy, ct), qi, k)  # (B, H, Tq, Tk)
            bias = mask_bias(key_padding_mask, causal, i1 - i0, j1 - j0, q_offset + i0, j0)
            if bias is not None:
                s += bias.astype(ct, copy=False)
            m, l, o = online_softmax_step(m, l, o, s, v[:, :, j0:j1].astype(ct, copy=False), _gmm,
                                          watch, policy.subtract_max)
        out[:, :, i0:i1] = watch("normalize", o / np.where(l == 0, 1, l), o)  # fully masked: 0
    return out


class FlashCache(NamedTuple):
    """What the tiled training forward keeps: the inputs, O and the log-sum-exp L -- O(S) memory.
    The dropout mask is not kept: tile (i0, j0) is redrawn from ``seed`` (:func:`dropout_tile`)."""
    q: np.ndarray            # (B, H, S, d_h)
    k: np.ndarray            # (B, H_kv, S, d_h)
    v: np.ndarray            # (B, H_kv, S, d_h)
    o: np.ndarray            # (B, H, S, d_h), the output, in the compute dtype
    lse: np.ndarray          # (B, H, S, 1), L = m + log l; +inf where a query sees no key
    seed: int                # the dropout tiles' seed (unused when dropout_p == 0)
    dropout_p: float
    key_padding_mask: np.ndarray
    causal: bool
    policy: object
    q_tile: int
    k_tile: int


def dropout_tile(seed, p, shape, i0, j0):  # -> (B, H, Tq, Tk) keep-mask of the tile at (i0, j0)
    """The dropout keep-mask of the score tile whose first query is i0 and first key j0: a function
    of (seed, i0, j0) only, so the backward redraws exactly the forward's mask, tile by tile,
    instead of storing (B, H, S, S) booleans (FlashAttention keeps the RNG state the same way)."""
    return np.random.default_rng([seed, i0, j0]).random(shape, dtype=np.float32) >= p


def flash_dropout_mask(cache):  # -> (B, H, Sq, Sk) bool, the whole mask, for tests and teaching
    """The full keep-mask a :class:`FlashCache`'s tiles make (causally skipped tiles: all kept)."""
    B, H, Sq, _ = cache.q.shape
    Sk = cache.k.shape[2]
    mask = np.ones((B, H, Sq, Sk), bool)
    for i0, i1, j0, j1 in tile_pairs(Sq, Sk, cache.q_tile, cache.k_tile, cache.causal):
        mask[:, :, i0:i1, j0:j1] = dropout_tile(cache.seed, cache.dropout_p, (B, H, i1 - i0, j1 - j0), i0, j0)
    return mask


def _check_tiling(dropout_p, q_tile, k_tile):
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: expected a probability in [0, 1); got {dropout_p!r}")
    for name, t in (("q_tile", q_tile), ("k_tile", k_tile)):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"{name}: expected a positive int; got {t!r}")


def flash_attention_train(q, k, v, key_padding_mask=None, causal=False, dropout_p=0.0, seed=0,
                          policy=SAFE, q_tile=Q_TILE, k_tile=K_TILE):  # -> (out, FlashCache)
    """Tiled attention for training: O = dropout(P) V with the online softmax (Dao 2023, FlashAttention-2,
    arXiv 2307.08691, Algorithm 1), keeping only O and L = m + log l per query for the backward.

    Dropout multiplies the unnormalised tile exp(S_j - m) by its keep-mask / (1 - p) before the
    product with V_j; the row sum l is of the undropped values, so O = dropout(softmax(S)) V as in
    the plain path. Extra memory: one (B, H, q_tile, k_tile) tile.
    """
    check_heads(q, k, v)
    _check_tiling(dropout_p, q_tile, k_tile)
    ct = compute_dtype(q.dtype, policy)
    B, H, Sq, dh = q.shape
    Sk = k.shape[2]
    out = np.zeros(q.shape, dtype=ct)
    m = np.full((B, H, Sq, 1), -np.inf, dtype=ct)                     # running row max
    l = np.zeros((B, H, Sq, 1), dtype=ct)                              # running row sum of exp
    keep = ct.type(1.0 / (1.0 - dropout_p))
    for i0, i1, j0, j1 in tile_pairs(Sq, Sk, q_tile, k_tile, causal):
        s = _scores(q[:, :, i0:i1], k[:, :, j0:j1], policy, ct)         # (B, H, Tq, Tk)
        bias = mask_bias(key_padding_mask, causal, i1 - i0, j1 - j0, i0, j0)
        if bias is not None:
            s += bias.astype(ct, copy=False)
        drop = dropout_tile(seed, dropout_p, s.shape, i0, j0) * keep if dropout_p > 0 else None
        mi, li, oi = m[:, :, i0:i1], l[:, :, i0:i1], out[:, :, i0:i1]  # views: updated in place
        mi[...], li[...], oi[...] = online_softmax_step(mi, li, oi, s, v[:, :, j0:j1].astype(ct, copy=False),
                                                        _gmm, drop=drop)
    seen = l > 0
    out /= np.where(seen, l, 1)                                        # fully masked rows: 0
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(seen, l, 1)), np.inf)  # L = m + log l; +inf: P = 0
    cache = FlashCache(q, k, v, out, lse, int(seed), float(dropout_p), key_padding_mask, bool(causal),
                       policy, int(q_tile), int(k_tile))
    return out.astype(q.dtype, copy=False), cache


def sdpa(q, k, v, key_padding_mask=None, causal=False, policy=SAFE, watch=no_watch, *, tiled=False,
         training=False, dropout_p=0.0, rng=None, fused=False, kv=None):  # -> (o (B, H, Sq, d_h), cache)
    """The attention core as a block's pass runs it, on q (B, H, Sq, d_h), k, v (B, H_kv, Sk, d_h);
    ``watch`` names its ops (a block passes ``watch.scope("attn")``).

    kv: a decode step -- the KV store is the core: ``kv.attend(q, k, v, policy, watch)`` takes the
        new keys and values and returns what the queries read of every position so far (a
        contiguous :class:`preln.nn.base.KVStore`: tiled over its filled views; the paged pool of
        :mod:`preln.serve.paged`: block by block); nothing is kept for a backward (cache None).
    tiled, training: FlashAttention-2 (:func:`flash_attention_train`: keeps O and the
        log-sum-exp; dropout redrawn per tile from a seed drawn from ``rng``).
    tiled: :func:`flash_attention_forward`, never holding the (B, H, S, S) scores; the backward
        recomputes P.
    else the plain path, :func:`attention_forward` (keeps P; dropout on it; ``fused`` softmax).
    """
    if kv is not None:
        return kv.attend(q, k, v, policy, watch), None
    if tiled and training:                                    # O and L only; P recomputed per tile
        seed = int(rng.integers(2 ** 63)) if dropout_p > 0 else 0     # the dropout tiles' seed
        return flash_attention_train(q, k, v, key_padding_mask, causal, dropout_p, seed, policy)
    if tiled:
        o = flash_attention_forward(q, k, v, key_padding_mask, causal, policy, watch)
        return o, AttentionCache(q, k, v, None, None, 0.0, key_padding_mask, causal, policy)
    return attention_forward(q, k, v, key_padding_mask, causal, dropout_p, rng, policy, watch, fused=fused)


def flash_attention_backward(dout, cache, out=None):  # (B, H, S, d_h) -> dq, dk, dv
    """FlashAttention-2's backward: P recomputed tile by tile from L, never (B, H, S, S).

        D_i = rowsum(dO_i * O_i);  P_ij = exp(tau Q_i K_j^T - L_i);  P~_ij = dropout(P_ij)
        dV_j += P~_ij^T dO_i;  dP~_ij = dO_i V_j^T;  dP_ij = dropout'(dP~_ij)
        dS_ij = P_ij * (dP_ij - D_i);  dQ_i += tau dS_ij K_j;  dK_j += tau dS_ij^T Q_i

    D_i equals rowsum(P * dP) of the plain backward: sum_j P~_ij (dO_i . v_j) = dO_i . O_i, dropout
    included, so the softmax's backward needs no row of P beyond the tile. ``out`` as in
    :func:`attention_backward`.
    """
    q, k, v, o, lse, seed, dropout_p, kpm, causal, policy, q_tile, k_tile = cache
    _check_dout(dout, q.shape)
    ct = compute_dtype(dout.dtype, policy)
    B, H, Sq, dh = q.shape
    Sk, n_kv = k.shape[2], k.shape[1]
    tau = ct.type(1.0 / np.sqrt(dh))
    keep = ct.type(1.0 / (1.0 - dropout_p))
    doc, qc = dout.astype(ct, copy=False), q.astype(ct, copy=False)
    kc, vc = k.astype(ct, copy=False), v.astype(ct, copy=False)
    dq = np.zeros(q.shape, ct)
    dk, dv = np.zeros(k.shape, ct), np.zeros(v.shape, ct)
    d = np.sum(doc * o, axis=-1, keepdims=True)                        # D = rowsum(dO * O)   (B, H, S, 1)
    for i0, i1, j0, j1 in tile_pairs(Sq, Sk, q_tile, k_tile, causal):
        s = _scores(qc[:, :, i0:i1], kc[:, :, j0:j1], policy, ct)       # S_ij   (B, H, Tq, Tk)
        bias = mask_bias(kpm, causal, i1 - i0, j1 - j0, i0, j0)
        if bias is not None:
            s += bias.astype(ct, copy=False)
        p = np.exp(s - lse[:, :, i0:i1])                               # P_ij = exp(S_ij - L_i)
        do_i = doc[:, :, i0:i1]
        dp = _gmm(do_i, vc[:, :, j0:j1].swapaxes(-1, -2))              # dP~ = dO_i V_j^T
        if dropout_p > 0:
            mask = dropout_tile(seed, dropout_p, p.shape, i0, j0) * keep
            dv[:, :, j0:j1] += _gmm_t(p * mask, do_i, n_kv)            # dV_j += P~^T dO_i
            dp *= mask                                                 # dP = dropout'(dP~)
        else:
            dv[:, :, j0:j1] += _gmm_t(p, do_i, n_kv)                   # dV_j += P^T dO_i
        ds = p * (dp - d[:, :, i0:i1])                                 # dS = P * (dP - D_i)
        dq[:, :, i0:i1] += _gmm(ds, kc[:, :, j0:j1])                   # dQ_i += dS K_j  (tau below)
        dk[:, :, j0:j1] += _gmm_t(ds, qc[:, :, i0:i1], n_kv)           # dK_j += dS^T Q_i
    dq *= tau
    dk *= tau
    grads = tuple(g.astype(dout.dtype, copy=False) for g in (dq, dk, dv))
    if out is None:
        return grads
    for dst, g in zip(out, grads):
        dst[...] = g
    return tuple(out)


def _check_dout(dout, shape):
    if getattr(dout, "shape", None) != shape:
        raise ValueError(f"dout: expected shape {shape} (q's); got {getattr(dout, 'shape', type(dout).__name__)}")
