"""Matrix-vector products from quantised storage: the inner loop of a decode step, measured.

    from preln.quant import qmatvec
    rows = qmatvec.time_matvecs(M=8192, K=8192, group_size=128)   # [MatvecTiming], one per format

A decode step multiplies every weight matrix by a few vectors: y = W x with W (M, K). Each weight
is used once per vector, so the product is memory-bound, and its time is about the bytes of W
over the memory bandwidth. Storing W in fewer bits reads fewer bytes: int8 reads 1/4 of float32's,
4-bit codes 1/8 (plus a scale and zero point per group). Whether the time falls as far depends on
whether the processor can turn the codes back into numbers as fast as memory delivers them.

The kernels (numba, one thread, like one BLAS thread) dequantise on the fly -- no float copy of W
is ever made -- and accumulate in float32:

``matvec_f32``   y_m = sum_k W_mk x_k (the same loop on float32 weights, beside BLAS's sgemv)
``matvec_int8``  y_m = S_m sum_k q_mk x_k  (per-row scales; q int8)
``matvec_uint8`` y_m = sum_j S_mj (sum_{k in group j} q_mk x_k - Z_mj sum_{k in group j} x_k)
                 (one code in [0, 255] per byte, a scale and zero point per group: the 5..8-bit
                 group grid of :mod:`preln.quant.groups`; G = 1 is per-row)
``matvec_int4``  y_m = sum_j S_mj (sum_{k in group j} q_mk x_k - Z_mj sum_{k in group j} x_k)
                 (4-bit codes packed two per byte by :func:`preln.quant.groups.pack_int4`; the zero
                 point comes out of the inner loop through the group sums of x, computed once)

The 4-bit kernel takes the high nibble as ``b & 0xF0`` scaled by 1/16 after the sum: a shift
(``b >> 4``) makes numba widen the byte to 64 bits, which AVX2 cannot convert to float in one
vector instruction, and the loop runs several times slower.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
from numba import njit

from preln.blas import blas_threads

__all__ = ["matvec_f32", "matvec_int8", "matvec_uint8", "matvec_int4", "MatvecTiming", "time_matvecs"]

_JIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract", "nsz"})


@njit(**_JIT)
def _f32(w, x, y):  # (M, K) float32, (K,) -> (M,)
    M, K = w.shape
    for m in range(M):
        acc = np.float32(0)
        for k in range(K):
            acc += w[m, k] * x[k]
        y[m] = acc
    return y


@njit(**_JIT)
def _int8(q, scale, x, y):  # (M, K) int8, (M,), (K,) -> (M,)
    M, K = q.shape
    for m in range(M):
        acc = np.float32(0)
        for k in range(K):
            acc += np.float32(q[m, k]) * x[k]
        y[m] = acc * scale[m]
    return y


@njit(**_JIT)
def _group_sums(xg):  # (G, g) -> (G,) float32: the sum of x over each group
    G, g = xg.shape
    out = np.zeros(G, np.float32)
    for j in range(G):
        t = np.float32(0)
        for k in range(g):
            t += xg[j, k]
        out[j] = t
    return out


@njit(**_JIT)
def _uint8(q, scale, zero, x, y):  # (M, K) uint8, (M, G), (M, G), (K,) -> (M,)
    M, K = q.shape
    G = scale.shape[1]
    g = K // G
    xg = x.reshape(G, g)
    xsum = _group_sums(xg)
    qg = q.reshape(M, G, g)
    for m in range(M):
        acc = np.float32(0)
        for j in range(G):
            t = np.float32(0)
            row, a = qg[m, j], xg[j]
            for k in range(g):
                t += np.float32(row[k]) * a[k]
            acc += scale[m, j] * (t - zero[m, j] * xsum[j])
        y[m] = acc
    return y


@njit(**_JIT)
def _int4(packed, scale, zero, x, y):  # (M, K/2) uint8, (M, G), (M, G), (K,) -> (M,)
    M, half = packed.shape
    G = scale.shape[1]
    h = half // G                               # bytes per group: g / 2
    xg = x.reshape(G, 2, h)                     # group j: xg[j, 0] low halves, xg[j, 1] high halves
    xsum = np.zeros(G, np.float32)
    for j in range(G):
        t = np.float32(0)
        for k in range(h):
            t += xg[j, 0, k] + xg[j, 1, k]
        xsum[j] = t
    pg = packed.reshape(M, G, h)
    for m in range(M):
        acc = np.float32(0)
        for j in range(G):
            lo = np.float32(0)
            hi = np.float32(0)
            row, a, b = pg[m, j], xg[j, 0], xg[j, 1]
            for k in range(h):
                v = row[k]
                lo += np.float32(v & np.uint8(15)) * a[k]
                hi += np.float32(v & np.uint8(240)) * b[k]     # 16 x the high nibble
            acc += scale[m, j] * (lo + np.float32(0.0625) * hi - zero[m, j] * xsum[j])
        y[m] = acc
    return y


def _vector(x, K):
    x = np.ascontiguousarray(x, np.float32)
    if x.shape != (K,):
        raise ValueError(f"x: expected a vector of K = {K} values; got shape {x.shape}")
    return x


def matvec_f32(w, x):  # (M, K) float32, (K,) -> (M,) float32
    """y = W x by a plain float32 loop (compare with BLAS's ``w @ x``)."""
    w = np.ascontiguousarray(w, np.float32)
    return _f32(w, _vector(x, w.shape[1]), np.empty(w.shape[0], np.float32))


def matvec_int8(q, scale, x):  # (M, K) int8, (M,) -> (M,) float32
    """y = diag(S) (q x): int8 weights with one scale per row, dequantised as they are read."""
    q = np.ascontiguousarray(q)
    if q.dtype != np.int8 or q.ndim != 2:
        raise TypeError(f"q: expected a 2-D int8 array; got dtype {q.dtype}, shape {q.shape}")
    scale = np.ascontiguousarray(scale, np.float32).reshape(-1)
    if scale.shape != (q.shape[0],):
        raise ValueError(f"scale: expected {q.shape[0]} row scales; got shape {scale.shape}")
    return _int8(q, scale, _vector(x, q.shape[1]), np.empty(q.shape[0], np.float32))


def _group_params(scale, zero, M, width, name):  # -> (M, G) float32 scale and zero, G dividing width
    scale = np.ascontiguousarray(scale, np.float32)
    zero = np.ascontiguousarray(zero, np.float32)
    if scale.ndim != 2 or scale.shape[0] != M or zero.shape != scale.shape or width % scale.shape[1]:
        raise ValueError(f"scale, zero: expected (M, G) = ({M}, G) each with G dividing the "
                         f"{width} {name} of a row; got {scale.shape} and {zero.shape}")
    return scale, zero


def matvec_uint8(q, scale, zero, x):  # (M, K) uint8, (M, G), (M, G) -> (M,) float32
    """y = W^ x with W^ = S (q - Z) in G groups per row, one uint8 code per weight."""
    q = np.ascontiguousarray(q)
    if q.dtype != np.uint8 or q.ndim != 2:
        raise TypeError(f"q: expected a 2-D uint8 array of codes; got dtype {q.dtype}, shape {q.shape}")
    scale, zero = _group_params(scale, zero, q.shape[0], q.shape[1], "columns")
    return _uint8(q, scale, zero, _vector(x, q.shape[1]), np.empty(q.shape[0], np.float32))


def matvec_int4(packed, scale, zero, x):  # (M, K/2) uint8, (M, G), (M, G) -> (M,) float32
    """y = W^ x with W^ = S (q - Z) in G groups per row, from codes packed by pack_int4."""
    packed = np.ascontiguousarray(packed)
    if packed.dtype != np.uint8 or packed.ndim != 2:
        raise TypeError(f"packed: expected a 2-D uint8 array (pack_int4); got dtype {packed.dtype}, "
                        f"shape {packed.shape}")
    M, half = packed.shape
    scale, zero = _group_params(scale, zero, M, half, "bytes")
    return _int4(packed, scale, zero, _vector(x, 2 * half), np.empty(M, np.float32))


class MatvecTiming(NamedTuple):
    """One format of y = W x: bytes of W read (codes, and the float32 scales and zero points
    the kernel reads) and the best CPU seconds."""

    name: str
    nbytes: int            # the weight's storage (codes, scales, zero points)
    seconds: float
    max_rel_err: float     # | y - W^ x | / max |W^ x|, against float64 on the dequantised weights

    @property
    def bandwidth(self):
        return self.nbytes / self.seconds


def time_matvecs(M=8192, K=8192, group_size=128, repeats=7, seed=0, clock=time.process_time,
                 flush_bytes=64 * 2**20):
    """Time y = W x for W (M, K) in float32 (BLAS sgemv and the numba loop), int8 (per-row
    scales) and 4-bit (groups of ``group_size``) -> [MatvecTiming].

    The rounds interleave the formats, each call after an untimed copy of 2 x ``flush_bytes``
    that evicts the last-level cache (so every call reads W from main memory), and keep the best
    of ``repeats``. One BLAS thread. Choose M K several times the last-level cache.
    """
    from preln.quant.groups import group_size_of, pack_int4
    group_size = group_size_of(K, group_size)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((M, K)).astype(np.float32)                 # (M, K)
    x = rng.standard_normal(K).astype(np.float32)                      # (K,)
    amax = np.abs(w).max(axis=1)
    s8 = (amax / 127).astype(np.float32)                               # (M,)
    q8 = np.rint(w / s8[:, None]).astype(np.int8)
    q4 = rng.integers(0, 16, (M, K)).astype(np.uint8)                  # 4-bit codes
    s4 = rng.uniform(0.01, 0.1, (M, K // group_size)).astype(np.float32)   # (M, G) scales
    z4 = rng.integers(0, 16, s4.shape).astype(np.float32)              # (M, G) zero points
    p4 = pack_int4(q4, group_size)
    ref8 = (q8.astype(np.float64) * s8[:, None].astype(np.float64)) @ x.astype(np.float64)
    w4 = (s4.repeat(group_size, axis=1).astype(np.float64)
          * (q4.astype(np.float64) - z4.repeat(group_size, axis=1)))
    ref4 = w4 @ x.astype(np.float64)
    ref32 = w.astype(np.float64) @ x.astype(np.float64)
    del w4
    run = {"float32, BLAS sgemv": lambda: w @ x,
           "float32, numba loop": lambda: matvec_f32(w, x),
           "int8, per-row scales": lambda: matvec_int8(q8, s8, x),
           f"4-bit, groups of {group_size}": lambda: matvec_int4(p4, s4, z4, x)}
    ref = dict(zip(run, (ref32, ref32, ref8, ref4)))
    nbytes = dict(zip(run, (w.nbytes, w.nbytes, q8.nbytes + s8.nbytes,    # what each kernel reads
                            p4.nbytes + s4.nbytes + z4.nbytes)))
    flush_src = np.ones(flush_bytes // 4, np.float32)
    flush_dst = np.empty_like(flush_src)
    best = dict.fromkeys(run, math.inf)
    with blas_threads(1):
        for fn in run.values():
            fn()                                                       # warm-up, numba compiles
        for _ in range(repeats):
            for name, fn in run.items():
                np.copyto(flush_dst, flush_src)
                t0 = clock()
                fn()
                best[name] = min(best[name], clock() - t0)
        errs = {name: float(np.abs(np.asarray(fn(), np.float64) - ref[name]).max()
                            / np.abs(ref[name]).max()) for name, fn in run.items()}
    return [MatvecTiming(name, int(nbytes[name]), best[name], errs[name]) for name in run]
