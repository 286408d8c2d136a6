"""Multi-head scaled dot-product attention (Vaswani et al. 2017), plain and tiled.

    S = (Q / sqrt(d_h)) K^T + mask;   P = softmax(S);   O = dropout(P) V

The plain path keeps P, (B, H, S, S), for the backward. With ``fused=True`` (float32/float64, safe
policy, no dropout, no tracer) its softmax -- scale, mask, max, exp, sum, divide -- is one pass
over the scores (:func:`preln.ops.fused.softmax`), and so is the softmax's backward. The tiled
path (FlashAttention, Dao et al. 2022, arXiv 2205.14135) walks key tiles with the online-softmax
recurrence and never holds more than one (B, H, Tq, Tk) tile of scores; it is what eval mode runs.
"""
from typing import NamedTuple

import numpy as np

from ..precision import SAFE, compute_dtype, matmul, no_watch
from . import fused as _fused
from .dropout import dropout_backward, dropout_forward
from .softmax import softmax_backward, softmax_forward

#: tile sizes of the tiled path: big enough that numpy's per-call overhead is amortised
Q_TILE = 256
K_TILE = 512


def split_heads(x, n_heads):  # (B, S, D) -> (B, H, S, d_h)
    B, S, D = x.shape
    return x.reshape(B, S, n_heads, D // n_heads).transpose(0, 2, 1, 3)


def merge_heads(x):  # (B, H, S, d_h) -> (B, S, D)
    B, H, S, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, H * dh)


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


class AttentionCache(NamedTuple):
    q: np.ndarray            # (B, H, S, d_h)
    k: np.ndarray            # (B, H, S, d_h)
    v: np.ndarray            # (B, H, S, d_h)
    p: np.ndarray            # (B, H, S, S) softmax probabilities, or None (recomputed in backward)
    drop_mask: np.ndarray    # (B, H, S, S) bool, or None without dropout
    dropout_p: float
    key_padding_mask: np.ndarray
    causal: bool
    policy: object


def _scores(q, k, policy, ct):  # (B, H, Sq, d_h), (B, H, Sk, d_h) -> (B, H, Sq, Sk)
    scale = ct.type(1.0 / np.sqrt(q.shape[-1]))
    qc, kt = q.astype(ct, copy=False), k.astype(ct, copy=False).swapaxes(-1, -2)
    if policy.prescale_queries:
        return matmul(qc * scale, kt)
    return matmul(qc, kt) * scale                                     # the logits exist unscaled first


def attention_forward(q, k, v, key_padding_mask=None, causal=False, dropout_p=0.0, rng=None,
                      policy=SAFE, watch=no_watch, keep_probs=True, fused=False):
    """Plain attention. q, k, v: (B, H, S, d_h) -> (out (B, H, S, d_h), cache).

    key_padding_mask: (B, S) bool, True = padding key. With ``keep_probs=False`` P is not cached
    and the backward recomputes it. ``fused=True``: the fused softmax (see the module docstring;
    the caller checks that it applies), with the scale applied to the scores instead of to q.
    """
    if fused:
        s = q @ k.swapaxes(-1, -2)                                    # (B, H, S, S), unscaled
        p = _fused.softmax(s, 1.0 / np.sqrt(q.shape[-1]), key_padding_mask, causal)
        cache = AttentionCache(q, k, v, p if keep_probs else None, None, 0.0, key_padding_mask,
                               causal, policy)
        return p @ v, cache                                           # (B, H, S, d_h)
    ct = compute_dtype(q.dtype, policy)
    s = watch("scores", _scores(q, k, policy, ct), q, k)              # (B, H, S, S)
    bias = mask_bias(key_padding_mask, causal, q.shape[2], k.shape[2])
    if bias is not None:
        s += bias.astype(ct, copy=False)                              # s is ours: add in place
    p, _ = softmax_forward(s, -1, policy, watch)                      # (B, H, S, S)
    pd, drop_mask = dropout_forward(p, dropout_p, rng)
    out = watch("weighted_sum", matmul(pd, v.astype(ct, copy=False)), pd, v)  # (B, H, S, d_h)
    cache = AttentionCache(q, k, v, p.astype(q.dtype, copy=False) if keep_probs else None,
                           drop_mask, dropout_p, key_padding_mask, causal, policy)
    return out.astype(q.dtype, copy=False), cache


def attention_backward(dout, cache, out=None, fused=False):  # (B, H, S, d_h) -> 3 x (B, H, S, d_h)
    """dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = tau dS K;  dK = tau dS^T Q.

    out: optional (dq, dk, dv) arrays, (B, H, S, d_h) each, to write the gradients into and return.
    The block passes views of one (B, S, 3D) array laid out as qkv, so the matmuls write straight
    into it and the in-projection's backward needs no concatenate. fused: recompute P and take the
    softmax's backward with the fused kernels (float32/float64, safe policy, no dropout).
    """
    q, k, v, p, drop_mask, dropout_p, kpm, causal, policy = cache
    ct = compute_dtype(dout.dtype, policy)
    if p is None and fused:                                           # recompute P (eval-mode cache)
        p = _fused.softmax(q @ k.swapaxes(-1, -2), 1.0 / np.sqrt(q.shape[-1]), kpm, causal)
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
    dv = np.matmul(pd.swapaxes(-1, -2), doc, out=dv)                  # (B, H, S, d_h)
    dpd = matmul(doc, v.astype(ct, copy=False).swapaxes(-1, -2))      # (B, H, S, S)
    dp = dropout_backward(dpd, drop_mask, dropout_p)
    if fused:
        ds = _fused.softmax_backward(dp, pc, out=dp)                  # P = softmax(S), in one pass
    else:
        ds = softmax_backward(dp, pc, -1, policy)                     # P = softmax(S)
    tau = ct.type(1.0 / np.sqrt(q.shape[-1]))
    dq = np.matmul(ds, k.astype(ct, copy=False), out=dq)              # S = tau Q K^T
    dq *= tau
    dk = np.matmul(ds.swapaxes(-1, -2), q.astype(ct, copy=False), out=dk)
    dk *= tau
    grads = tuple(g.astype(dt, copy=False) for g in (dq, dk, dv))
    if out is not None and not direct:                                # 16-bit storage: round, then copy
        for dst, g in zip(out, grads):
            dst[...] = g
    return tuple(out) if out is not None else grads


def flash_attention_forward(q, k, v, key_padding_mask=None, causal=False, policy=SAFE,
                            watch=no_watch, q_tile=Q_TILE, k_tile=K_TILE, q_offset=0):
    """Tiled attention with the online softmax; q (B, H, Sq, d_h), k, v (B, H, Sk, d_h) -> (B, H, Sq, d_h).

    q_offset: the position of the first query among the keys. 0 for self-attention over one
    sequence; ``Sk - Sq`` when decoding with a KV cache, where the Sq new queries are the last Sq
    of Sk positions -- the causal mask then lets query i see keys 0 .. q_offset + i.

    For each query tile, over key tiles j (Dao et al. 2022, Algorithm 1):
        S_j = Q K_j^T;  m' = max(m, rowmax(S_j));  P_j = exp(S_j - m')
        l' = e^(m - m') l + rowsum(P_j);  O' = e^(m - m') O + P_j V_j;  finally O / l.
    Extra memory: one (B, H, q_tile, k_tile) tile plus (m, l, O) for the query tile.
    """
    ct = compute_dtype(q.dtype, policy)
    B, H, Sq, dh = q.shape
    Sk = k.shape[2]
    out = np.empty(q.shape, dtype=q.dtype)
    for i0 in range(0, Sq, q_tile):
        i1 = min(i0 + q_tile, Sq)
        qi = q[:, :, i0:i1]
        m = np.full((B, H, i1 - i0, 1), -np.inf, dtype=ct)           # running row max
        l = np.zeros((B, H, i1 - i0, 1), dtype=ct)                    # running row sum of exp
        o = np.zeros((B, H, i1 - i0, dh), dtype=ct)                   # running unnormalised output
        k_end = min(Sk, q_offset + i1) if causal else Sk              # causal: later keys are all masked
        for j0 in range(0, k_end, k_tile):
            j1 = min(j0 + k_tile, k_end)
            s = watch("scores", _scores(qi, k[:, :, j0:j1], policy, ct), qi, k)  # (B, H, Tq, Tk)
            bias = mask_bias(key_padding_mask, causal, i1 - i0, j1 - j0, q_offset + i0, j0)
            if bias is not None:
                s += bias.astype(ct, copy=False)
            if policy.subtract_max:
                m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (B, H, Tq, 1)
                shift = np.where(np.isfinite(m_new), m_new, 0)        # no visible key yet: exp(-inf) = 0
            else:
                m_new = shift = np.zeros_like(m)                      # naive: exp of the raw logits
            p = np.subtract(s, shift)                                 # (B, H, Tq, Tk)
            p = watch("exp", np.exp(p, out=p), s)                     # exp in place: one tile-sized array
            alpha = np.exp(m - shift)                                 # rescales the tiles before; 0 at m = -inf
            l = alpha * l + p.sum(axis=-1, keepdims=True, dtype=ct)
            o = alpha * o + matmul(p, v[:, :, j0:j1].astype(ct, copy=False))
            m = m_new
        out[:, :, i0:i1] = watch("normalize", o / np.where(l == 0, 1, l), o)  # fully masked: 0
    return out
