"""Attention's traffic between slow and fast memory, counted element by element.

    out, io = tiled_attention_io(q, k, v, C=4096)        # FlashAttention, slow-memory accesses counted
    io.accesses == attention_accesses(N, d, C=4096)      # the closed form

:func:`standard_attention_io` and :func:`tiled_attention_io` compute attention for one head while
counting every element moved between *slow* memory (HBM, or main memory) and a *fast* memory of C
elements (SRAM, or cache; the paper's M, renamed because the book's M is the attention mask),
following Dao et al. 2022 (FlashAttention, arXiv 2205.14135) with the paper's N (sequence length)
and d (head width): Algorithm 0 (standard: the scores Z and P are written to and read back from
slow memory) and Algorithm 1 (tiled, block sizes ``B_c = ceil(C / 4d)``, ``B_r = min(B_c, d)``,
online softmax, outer loop over key blocks: "fa1"), and the loop order of FlashAttention-2 (Dao
2023, arXiv 2307.08691: outer loop over query blocks, an unnormalised accumulator, "fa2").
Theorem 2: standard attention needs Theta(Nd + N^2) accesses, FlashAttention Theta(N^2 d^2 / C).
:func:`attention_access_terms` and :func:`attention_accesses` are the closed forms, term by term
and summed, that the instrumented functions are tested against.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from preln.ops.attention import online_softmax_step, tiles
from preln.validation import positive_int

__all__ = ["IOCount", "standard_attention_io", "tiled_attention_io", "ORDERS", "attention_accesses",
           "attention_access_terms", "flash_block_sizes", "reference_attention"]

class IOCount(NamedTuple):
    """Elements moved between slow and fast memory by one attention call (one head)."""

    reads: int
    writes: int
    peak_fast: int        # the most elements held in fast memory at once
    by_array: dict = None  # {(array name, "read" | "write"): elements}: the terms of the count

    @property
    def accesses(self):
        return self.reads + self.writes


class _Slow:
    """Slow memory: every load and store is counted in elements, in total and per named array."""

    def __init__(self):
        self.reads = self.writes = 0
        self.by_array = {}

    def _tally(self, name, kind, n):
        self.by_array[name, kind] = self.by_array.get((name, kind), 0) + n

    def load(self, name, array):
        self.reads += array.size
        self._tally(name, "read", array.size)
        return np.array(array)           # a copy: the fast-memory working copy

    def store(self, name, dst, index, value):
        value = np.asarray(value)
        self.writes += value.size
        self._tally(name, "write", value.size)
        dst[index] = value


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, np.ndarray) or t.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D (N, d) array (one head); got "
                             f"{type(t).__name__} of shape {getattr(t, 'shape', None)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v: expected equal shapes (N, d); got {q.shape}, {k.shape}, {v.shape}")


def reference_attention(q, k, v):  # (N, d) x 3 -> (N, d)
    """softmax(q k^T / sqrt(d)) v, in one piece: the value both instrumented versions must give."""
    z = (q @ k.T) / np.sqrt(q.shape[1])
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def standard_attention_io(q, k, v):  # (N, d) x 3 -> (N, d), IOCount
    """Dao et al. 2022, Algorithm 0, with slow-memory traffic counted.

    1. load Q, K; Z = Q K^T / sqrt(d); write Z.   2. read Z; P = softmax(Z); write P.
    3. load P, V; O = P V; write O.   Each step streams its operands once (the theorem's model: the
    products' own blocking is assumed perfect), so reads + writes = 4 N d + 4 N^2. No mask and no
    dropout: each would be one more pass over an (N, N) array, 2 N^2 accesses.
    """
    _check_qkv(q, k, v)
    N, d = q.shape
    mem = _Slow()
    Z_hbm, P_hbm, O_hbm = np.empty((N, N)), np.empty((N, N)), np.empty((N, d))
    mem.store("Z", Z_hbm, ..., (mem.load("Q", q) @ mem.load("K", k).T) / np.sqrt(d))
    z = mem.load("Z", Z_hbm)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    mem.store("P", P_hbm, ..., p / p.sum(axis=1, keepdims=True))
    mem.store("O", O_hbm, ..., mem.load("P", P_hbm) @ mem.load("V", v))
    return O_hbm, IOCount(mem.reads, mem.writes, 2 * N * N, mem.by_array)


def flash_block_sizes(C, d):
    """FlashAttention's block sizes for a fast memory of C elements (the paper's M) and head dim d:
    B_c = ceil(C / 4d) key rows, B_r = min(B_c, d) query rows (Dao et al. 2022, Algorithm 1)."""
    C, d = positive_int(C, "C"), positive_int(d, "d")
    if C < d:
        raise ValueError(f"C: expected at least d = {d} elements of fast memory; got {C}")
    b_c = -(-C // (4 * d))
    return b_c, min(b_c, d)


#: the two loop orders of tiled attention (see tiled_attention_io)
ORDERS = ("fa1", "fa2")


def tiled_attention_io(q, k, v, C, order="fa1"):  # (N, d) x 3, int -> (N, d), IOCount
    """Tiled attention with slow-memory traffic counted; C: fast-memory size in elements.

    order="fa1": Dao et al. 2022, Algorithm 1 (FlashAttention). The *outer* loop runs over key
    blocks, so the output cannot stay in fast memory: O, l, m start in slow memory (O = 0, l = 0,
    m = -inf: N d + 2 N writes) and, for each key block j (B_c rows of K and V, loaded once) and
    each query block i (B_r rows), are read, updated and written back, normalised every time:
    Z = Q_i K_j^T / sqrt(d); m~ = rowmax(Z); P~ = exp(Z - m~); l~ = rowsum(P~);
    m' = max(m_i, m~); l' = e^(m_i - m') l_i + e^(m~ - m') l~;
    O_i = (l_i e^(m_i - m') O_i + e^(m~ - m') P~ V_j) / l'.

    order="fa2": the loop order of FlashAttention-2 (Dao 2023, arXiv 2307.08691, Algorithm 1) and of
    derivation_ops' online softmax. The *outer* loop runs over query blocks: Q_i is loaded once, an
    unnormalised accumulator A = sum_j e^(Z - m) V_j and its l, m stay in fast memory while every
    key block streams past, and O_i = A / l is written once, with the log-sum-exp m + log l that
    the backward needs (N values). The block sizes swap roles, since now the query block stays:
    B_r = ceil(C / 4d) query rows, B_c = min(B_r, d) key rows.
    """
    _check_qkv(q, k, v)
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}; got {order!r}")
    N, d = q.shape
    tau = 1 / np.sqrt(d)
    mem = _Slow()
    O_hbm = np.empty((N, d))
    peak = 0
    if order == "fa1":
        b_c, b_r = flash_block_sizes(C, d)
        l_hbm, m_hbm = np.empty(N), np.empty(N)
        mem.store("O", O_hbm, ..., np.zeros((N, d)))
        mem.store("l", l_hbm, ..., np.zeros(N))
        mem.store("m", m_hbm, ..., np.full(N, -np.inf))
        for j0, j1 in tiles(N, b_c):
            kj, vj = mem.load("K", k[j0:j1]), mem.load("V", v[j0:j1])
            for i0, i1 in tiles(N, b_r):
                rows = slice(i0, i1)
                qi, oi = mem.load("Q", q[rows]), mem.load("O", O_hbm[rows])
                li, mi = mem.load("l", l_hbm[rows]), mem.load("m", m_hbm[rows])
                z = tau * (qi @ kj.T)                                  # (B_r, B_c), in fast memory
                m_t = z.max(axis=1)
                p_t = np.exp(z - m_t[:, None])
                l_t = p_t.sum(axis=1)
                m_new = np.maximum(mi, m_t)
                l_new = np.exp(mi - m_new) * li + np.exp(m_t - m_new) * l_t
                o_new = ((li * np.exp(mi - m_new))[:, None] * oi
                         + np.exp(m_t - m_new)[:, None] * (p_t @ vj)) / l_new[:, None]
                peak = max(peak, kj.size + vj.size + qi.size + oi.size + z.size + 4 * len(li))
                mem.store("O", O_hbm, rows, o_new)                    # normalised, every key block
                mem.store("l", l_hbm, rows, l_new)
                mem.store("m", m_hbm, rows, m_new)
        return O_hbm, IOCount(mem.reads, mem.writes, peak, mem.by_array)
    b_r, b_c = flash_block_sizes(C, d)                                # the roles swap
    L_hbm = np.empty(N)
    for i0, i1 in tiles(N, b_r):
        qi = mem.load("Q", q[i0:i1])                                  # once
        acc = np.zeros((len(qi), d))                                  # unnormalised, in fast memory
        li, mi = np.zeros((len(qi), 1)), np.full((len(qi), 1), -np.inf)
        for j0, j1 in tiles(N, b_c):
            kj, vj = mem.load("K", k[j0:j1]), mem.load("V", v[j0:j1])
            z = tau * (qi @ kj.T)                                      # (B_r, B_c)
            mi, li, acc = online_softmax_step(mi, li, acc, z, vj)     # the rescale of what came before
            peak = max(peak, qi.size + acc.size + kj.size + vj.size + z.size + 2 * len(li))
        mem.store("O", O_hbm, slice(i0, i1), acc / li)               # normalised once
        mem.store("L", L_hbm, slice(i0, i1), (mi + np.log(li))[:, 0])  # log-sum-exp, for a backward
    return O_hbm, IOCount(mem.reads, mem.writes, peak, mem.by_array)


def attention_access_terms(N, d, C=None, kind="fa1"):
    """The closed-form slow-memory accesses (elements) of one head, term by term:
    {(array, "read" | "write"): count}, as the instrumented functions tally them.

    standard (Algorithm 0): Q, K read once (N d each); Z written, read (N^2 each); P written, read
    (N^2 each); V read, O written (N d each): 4 N d + 4 N^2 in all.
    fa1 (Algorithm 1), T_c = ceil(N / B_c) key blocks: K, V read once (N d each); per key block, all
    of Q, O, l, m read and O, l, m written: Q read T_c N d; O read T_c N d, written (1 + T_c) N d
    (the first write is the initialisation); l and m read T_c N, written (1 + T_c) N each.
    fa2, T_r = ceil(N / B_r) query blocks: Q read once (N d); per query block, all of K and V
    read: T_r N d each; O written once (N d); the log-sum-exp L written once (N).
    """
    N, d = positive_int(N, "N"), positive_int(d, "d")
    if kind == "standard":
        return {("Q", "read"): N * d, ("K", "read"): N * d, ("Z", "write"): N * N,
                ("Z", "read"): N * N, ("P", "write"): N * N, ("P", "read"): N * N,
                ("V", "read"): N * d, ("O", "write"): N * d}
    if kind not in ORDERS:
        raise ValueError(f"kind: expected 'standard', 'fa1' or 'fa2'; got {kind!r}")
    if C is None:
        raise ValueError("C: a tiled count needs the fast-memory size C (elements); got None")
    first, _ = flash_block_sizes(C, d)                # B_c for fa1, B_r for fa2
    T = -(-N // first)
    if kind == "fa1":
        return {("K", "read"): N * d, ("V", "read"): N * d, ("Q", "read"): T * N * d,
                ("O", "read"): T * N * d, ("O", "write"): (1 + T) * N * d,
                ("l", "read"): T * N, ("l", "write"): (1 + T) * N,
                ("m", "read"): T * N, ("m", "write"): (1 + T) * N}
    return {("Q", "read"): N * d, ("K", "read"): T * N * d, ("V", "read"): T * N * d,
            ("O", "write"): N * d, ("L", "write"): N}


def attention_accesses(N, d, C=None, kind="fa1"):
    """Closed-form slow-memory accesses (elements) of one head: the sum of
    :func:`attention_access_terms`.

    standard: 4 N d + 4 N^2.
    fa1: 3 N d + 2 N + T_c (3 N d + 4 N), T_c = ceil(N / B_c).
    fa2: 2 N d + N + 2 T_r N d, T_r = ceil(N / B_r). kind="tiled" is "fa1".
    """
    kind = "fa1" if kind == "tiled" else kind
    return sum(attention_access_terms(N, d, C, kind).values())
