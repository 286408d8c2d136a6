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

The decode layout, :class:`TiledQuant` (what :class:`preln.quant.weight_only.QuantLinear` multiplies by): the kernels
above walk one row at a time, and with groups of 32 a row's group is 16 bytes -- too short for a
vector loop, so the compiler falls back to scalar code and a horizontal sum per group. A
``TiledQuant`` stores the rows in tiles of :data:`TILE_ROWS`: byte ``codes[t, k, r]`` belongs to row
``t TILE_ROWS + r``, so the innermost loop runs over 64 rows at one input column, one vector lane per
row (four AVX-512 registers), with no horizontal sum at all::

    t_r    = sum_{k in group j} q_rk x_k       for the 64 rows r of the tile at once
    y_r   += S_rj (t_r - Z_rj sum_{k in j} x_k)

The loops over the tile have a compile-time trip count, so they unroll to straight vector code.
A byte's two 4-bit codes are its columns 2k (low nibble) and 2k + 1 (high); they are split in
float arithmetic, exactly (for v in [0, 255]: hi = floor(v / 16), lo = v - 16 hi), which keeps the
lanes 32-bit: a byte is widened and converted to float once, 16 to a vector. The zero points are
integers in [0, 255] (:func:`preln.quant.groups.group_grid`) and take one byte each; the scales
stay float32, so the product is the dequantised weight's to float32 round-off.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
from numba import njit

from preln.blas import blas_threads

__all__ = ["matvec_f32", "matvec_int8", "matvec_uint8", "matvec_int4", "TILE_ROWS", "TiledQuant", "MatvecTiming",
           "time_matvecs"]

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


#: rows per tile of :class:`TiledQuant`: the innermost loop's trip count, a compile-time constant so
#: that it unrolls into whole vectors (64 float32 = 4 AVX-512 or 8 AVX2 registers)
TILE_ROWS = 64


@njit(**_JIT)
def _group_sums_rows(x, G):  # (n, K) -> (n, G) float32: the sum of each row of x over each group
    n, K = x.shape
    g = K // G
    out = np.empty((n, G), np.float32)
    for i in range(n):
        for j in range(G):
            t = np.float32(0)
            for k in range(j * g, (j + 1) * g):
                t += x[i, k]
            out[i, j] = t
    return out


@njit(inline="always", **_JIT)    # inlined in numba's IR: a call would keep acc and t out of registers
def _close_group(acc, t, s, z, xs, j):  # acc (n, TILE) += S_j (t - Z_j sum_{k in j} x), per row of the tile
    for i in range(acc.shape[0]):
        xj = xs[i, j]
        for r in range(TILE_ROWS):
            acc[i, r] += s[j, r] * (t[i, r] - np.float32(z[j, r]) * xj)


@njit(inline="always", **_JIT)
def _store_tile(y, acc, tile):  # y[:, the tile's rows] = acc
    for i in range(acc.shape[0]):
        for r in range(TILE_ROWS):
            y[i, tile * TILE_ROWS + r] = acc[i, r]


@njit(**_JIT)
def _tiled_int4(codes, scale, zero, x, y):  # (T, K/2, TILE) u8, (T, G, TILE) f32, (T, G, TILE) u8, (n, K) -> y (n, T TILE)
    T, half = codes.shape[0], codes.shape[1]
    n, G = x.shape[0], scale.shape[1]
    h = half // G                                   # bytes per group: g / 2
    xs = _group_sums_rows(x, G)
    t = np.empty((n, TILE_ROWS), np.float32)       # sum_k q x of the current group, per row
    acc = np.empty((n, TILE_ROWS), np.float32)
    c16 = np.float32(16)
    inv16 = np.float32(0.0625)
    for tile in range(T):
        c, s, z = codes[tile], scale[tile], zero[tile]
        acc[:] = 0
        for j in range(G):
            t[:] = 0
            k0 = j * h
            for kb in range(k0, k0 + h - 1, 2):     # two bytes (four columns) per pass over t
                for i in range(n):
                    a0, b0, a1, b1 = x[i, 2 * kb], x[i, 2 * kb + 1], x[i, 2 * kb + 2], x[i, 2 * kb + 3]
                    for r in range(TILE_ROWS):
                        f0 = np.float32(c[kb, r])
                        f1 = np.float32(c[kb + 1, r])
                        h0 = np.floor(f0 * inv16)   # the high nibble, exactly
                        h1 = np.floor(f1 * inv16)
                        t[i, r] += (f0 - c16 * h0) * a0 + h0 * b0 + (f1 - c16 * h1) * a1 + h1 * b1
            if h % 2:                               # an odd number of bytes: the last one alone
                kb = k0 + h - 1
                for i in range(n):
                    a0, b0 = x[i, 2 * kb], x[i, 2 * kb + 1]
                    for r in range(TILE_ROWS):
                        f0 = np.float32(c[kb, r])
                        h0 = np.floor(f0 * inv16)
                        t[i, r] += (f0 - c16 * h0) * a0 + h0 * b0
            _close_group(acc, t, s, z, xs, j)
        _store_tile(y, acc, tile)
    return y


@njit(**_JIT)
def _tiled_uint8(codes, scale, zero, x, y):  # (T, K, TILE) u8, (T, G, TILE) f32, (T, G, TILE) u8, (n, K) -> y (n, T TILE)
    T, K = codes.shape[0], codes.shape[1]
    n, G = x.shape[0], scale.shape[1]
    g = K // G
    xs = _group_sums_rows(x, G)
    t = np.empty((n, TILE_ROWS), np.float32)
    acc = np.empty((n, TILE_ROWS), np.float32)
    for tile in range(T):
        c, s, z = codes[tile], scale[tile], zero[tile]
        acc[:] = 0
        for j in range(G):
            t[:] = 0
            k0 = j * g
            for k in range(k0, k0 + g - 1, 2):
                for i in range(n):
                    a0, a1 = x[i, k], x[i, k + 1]
                    for r in range(TILE_ROWS):
                        t[i, r] += np.float32(c[k, r]) * a0 + np.float32(c[k + 1, r]) * a1
            if g % 2:
                k = k0 + g - 1
                for i in range(n):
                    a0 = x[i, k]
                    for r in range(TILE_ROWS):
                        t[i, r] += np.float32(c[k, r]) * a0
            _close_group(acc, t, s, z, xs, j)
        _store_tile(y, acc, tile)
    return y


@njit(**_JIT)
def _code(codes, tile, k, r, packed):  # -> the code of column k of row r of the tile, as float32
    if not packed:
        return np.float32(codes[tile, k, r])
    v = np.float32(codes[tile, k // 2, r])
    hi = np.floor(v * np.float32(0.0625))
    return hi if k % 2 else v - np.float32(16) * hi


@njit(**_JIT)
def _tiled_rows(codes, scale, zero, packed, rows, out):  # -> out (len(rows), K) float32: rows of W^
    G, K = scale.shape[1], out.shape[1]
    g = K // G
    for n in range(rows.shape[0]):
        tile, r = rows[n] // TILE_ROWS, rows[n] % TILE_ROWS
        for j in range(G):
            s, z = scale[tile, j, r], np.float32(zero[tile, j, r])
            for k in range(j * g, (j + 1) * g):
                out[n, k] = s * (_code(codes, tile, k, r, packed) - z)
    return out


@njit(**_JIT)
def _tiled_transposed(codes, scale, zero, packed, out):  # -> out (K, T TILE) float32: W^^T, padded
    T, G, K = codes.shape[0], scale.shape[1], out.shape[0]
    g = K // G
    for tile in range(T):
        s, z = scale[tile], zero[tile]
        for k in range(K):
            j = k // g
            dst = out[k, tile * TILE_ROWS:(tile + 1) * TILE_ROWS]
            if packed:
                c = codes[tile, k // 2]
                for r in range(TILE_ROWS):
                    v = np.float32(c[r])
                    hi = np.floor(v * np.float32(0.0625))
                    q = hi if k % 2 else v - np.float32(16) * hi
                    dst[r] = s[j, r] * (q - np.float32(z[j, r]))
            else:
                c = codes[tile, k]
                for r in range(TILE_ROWS):
                    dst[r] = s[j, r] * (np.float32(c[r]) - np.float32(z[j, r]))
    return out


def _tiles(a, dtype):  # (M, n) -> (T, n, TILE_ROWS), the rows padded with zeros to whole tiles
    M, n = a.shape
    T = -(-M // TILE_ROWS)
    out = np.zeros((T * TILE_ROWS, n), dtype)
    out[:M] = a
    return np.ascontiguousarray(out.reshape(T, TILE_ROWS, n).transpose(0, 2, 1))


def _untile(a, M):  # (T, n, TILE_ROWS) -> (M, n)
    T, n, _ = a.shape
    return a.transpose(0, 2, 1).reshape(T * TILE_ROWS, n)[:M]


class TiledQuant:
    """W^ = S (q - Z) (M, K) in groups of ``group_size`` columns, stored in row tiles for the decode
    kernels (see the module docstring): codes two per byte (``bits`` <= 4) or one (5..8 bits),
    float32 scales, uint8 zero points.

        tq = TiledQuant(q, scale, zero, bits, group_size)   # q (M, K) ints in [0, 2^bits - 1]
        y = tq.matmul(x)                                    # (n, K) -> (n, M) float32
        w = tq.dequantize(rows)                             # (len(rows) | M, K) float32
    """

    def __init__(self, q, scale, zero, bits, group_size):
        q = np.asarray(q)
        if q.ndim != 2 or q.dtype.kind not in "iu":
            raise TypeError(f"q: expected a 2-D integer array of codes (M, K); got dtype {q.dtype}, shape {q.shape}")
        M, K = q.shape
        self.packed = int(bits) <= 4
        top = 15 if self.packed else 255
        if q.size and (q.min() < 0 or q.max() > top):
            raise ValueError(f"q: expected unsigned {bits}-bit codes in [0, {top}]; got [{q.min()}, {q.max()}]")
        scale, zero = _group_params(scale, zero, M, K, "columns")
        G = scale.shape[1]
        if self.packed and (K // G) % 2:
            raise ValueError(f"group_size: expected an even group size to pack two codes per byte; got {K // G}")
        if zero.size and (zero.min() < 0 or zero.max() > 255 or (zero != np.rint(zero)).any()):
            raise ValueError("zero: expected integer zero points in [0, 255] (one byte each)")
        self.shape, self.bits, self.group_size = (M, K), int(bits), K // G
        q = q.astype(np.uint8)
        if self.packed:                             # columns 2k and 2k + 1 -> the low and high nibble
            q = q[:, 0::2] | (q[:, 1::2] << 4)
        self.codes = _tiles(q, np.uint8)            # (T, K/2 | K, TILE_ROWS)
        self.scale_tiles = _tiles(scale, np.float32)    # (T, G, TILE_ROWS)
        self.zero_tiles = _tiles(zero, np.uint8)        # (T, G, TILE_ROWS)

    @property
    def nbytes(self):
        """Bytes of W^'s storage: codes, float32 scales, one-byte zero points, for the M rows (the
        zero rows that pad the last tile are the layout's, not the weight's: none when 64 | M)."""
        M, K = self.shape
        n_groups = M * (K // self.group_size)
        return int(M * self.codes.shape[1] + 5 * n_groups)

    @property
    def scale(self):  # (M, G) float32
        return _untile(self.scale_tiles, self.shape[0])

    @property
    def zero(self):  # (M, G) float32
        return _untile(self.zero_tiles, self.shape[0]).astype(np.float32)

    def matmul(self, x):  # (n, K) -> (n, M) float32
        """y = x W^^T, the codes dequantised as they are read; one pass over W for all n rows."""
        x = np.ascontiguousarray(x, np.float32)
        M, K = self.shape
        if x.ndim != 2 or x.shape[1] != K:
            raise ValueError(f"x: expected (n, K = {K}) rows; got shape {x.shape}")
        y = np.empty((x.shape[0], self.codes.shape[0] * TILE_ROWS), np.float32)
        kernel = _tiled_int4 if self.packed else _tiled_uint8
        kernel(self.codes, self.scale_tiles, self.zero_tiles, x, y)
        return y if y.shape[1] == M else y[:, :M]

    def dequantize(self, rows=None):  # -> (len(rows) | M, K) float32 W^
        """The dequantised rows ``rows`` (ints in [-M, M)), or all of W^ (a transposed view of
        :meth:`dequantize_t`)."""
        M, K = self.shape
        if rows is None:
            return self.dequantize_t().T
        rows = np.asarray(rows).reshape(-1)
        if rows.dtype.kind not in "iu" or (rows.size and (rows.min() < -M or rows.max() >= M)):
            raise IndexError(f"rows: expected integer row indices in [-{M}, {M}); got {rows.dtype} "
                             f"in [{rows.min() if rows.size else ''}, {rows.max() if rows.size else ''}]")
        rows = rows.astype(np.int64) % max(M, 1)
        out = np.empty((rows.size, K), np.float32)
        return _tiled_rows(self.codes, self.scale_tiles, self.zero_tiles, self.packed, rows, out)

    def dequantize_t(self):  # -> (K, M) float32 W^^T, C-contiguous: what x @ W^^T multiplies
        """W^ transposed, dequantised tile by tile (for inputs of many rows: BLAS on float32)."""
        M, K = self.shape
        out = np.empty((K, self.codes.shape[0] * TILE_ROWS), np.float32)
        _tiled_transposed(self.codes, self.scale_tiles, self.zero_tiles, self.packed, out)
        return out if out.shape[1] == M else out[:, :M]


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
