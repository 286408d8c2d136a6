"""preln.quant.qmatvec: the dequantise-on-the-fly matrix-vector kernels compute W^ x, and the timing
harness reports every format with the bytes its kernel reads."""
import numpy as np
import pytest

from preln.quant import groups as gq
from preln.quant import qmatvec

#: float32 accumulation of K = 256 products of O(1) values, against float64
F32_TOL = 1e-5


def test_kernels_compute_the_dequantised_product():
    rng = np.random.default_rng(0)
    M, K, g = 24, 256, 32
    w = rng.standard_normal((M, K)).astype(np.float32)
    x = rng.standard_normal(K).astype(np.float32)
    ref = lambda w64: w64 @ x.astype(np.float64)
    y = qmatvec.matvec_f32(w, x)
    assert np.abs(y - ref(w.astype(np.float64))).max() < F32_TOL * np.abs(ref(w)).max()
    s8 = np.abs(w).max(axis=1) / 127
    q8 = np.rint(w / s8[:, None]).astype(np.int8)
    w8 = q8 * s8[:, None].astype(np.float64)
    y8 = qmatvec.matvec_int8(q8, s8, x)
    assert np.abs(y8 - ref(w8)).max() < F32_TOL * np.abs(ref(w8)).max()
    g4 = gq.rtn(w, 4, g)                                          # asymmetric: codes 0..15
    packed = gq.pack_int4(g4.q.astype(np.uint8), g)
    y4 = qmatvec.matvec_int4(packed, g4.scale, g4.zero, x)
    w4 = g4.dequantize()
    assert np.abs(y4 - ref(w4)).max() < F32_TOL * np.abs(ref(w4)).max()
    assert np.abs(y4 - ref(w.astype(np.float64))).max() > 10 * F32_TOL   # it is the 4-bit product


def test_kernels_bad_input():
    with pytest.raises(TypeError, match="q: expected a 2-D int8"):
        qmatvec.matvec_int8(np.zeros((2, 4)), np.ones(2), np.ones(4))
    with pytest.raises(ValueError, match="scale"):
        qmatvec.matvec_int8(np.zeros((2, 4), np.int8), np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="x: expected a vector of K = 4"):
        qmatvec.matvec_int8(np.zeros((2, 4), np.int8), np.ones(2), np.ones(5))
    with pytest.raises(ValueError, match="scale, zero"):
        qmatvec.matvec_int4(np.zeros((2, 4), np.uint8), np.ones((2, 3)), np.ones((2, 3)), np.ones(8))


def test_time_matvecs_reports_every_format():
    rows = qmatvec.time_matvecs(M=64, K=256, group_size=32, repeats=1, flush_bytes=2**16)
    by = {r.name: r for r in rows}
    assert list(by) == ["float32, BLAS sgemv", "float32, numba loop", "int8, per-row scales",
                        "4-bit, groups of 32"]
    assert by["float32, BLAS sgemv"].nbytes == 64 * 256 * 4
    assert by["int8, per-row scales"].nbytes == 64 * 256 + 64 * 4
    assert by["4-bit, groups of 32"].nbytes == 64 * 128 + 2 * 64 * 8 * 4
    assert all(r.seconds > 0 and r.max_rel_err < F32_TOL for r in rows)


#: the tiled layout's dequantised rows against the groups module's float64 W^: float32 round-off
DEQ_RTOL = 1e-6


@pytest.mark.parametrize("M,K,g,bits", [(7, 96, 32, 4), (130, 64, 2, 4), (64, 60, 6, 3), (70, 30, None, 4),
                                        (9, 96, 3, 8), (65, 30, None, 6), (128, 576, 32, 4)])
def test_tiled_kernels_compute_the_dequantised_product(M, K, g, bits):
    """Whole and partial tiles, odd bytes per group (g = 6: three bytes), one group per row, 1..4
    vectors at once: x W^^T to float32 round-off, and the rows dequantised as the groups module does."""
    rng = np.random.default_rng(M * K + bits)
    w = rng.standard_normal((M, K))
    gqr = gq.rtn(w, bits, g)                                       # asymmetric: zero points != 0
    tq = qmatvec.TiledQuant(gqr.q, gqr.scale, gqr.zero, bits, g)
    w_hat = gqr.dequantize()
    assert tq.packed == (bits <= 4) and tq.codes.shape[2] == qmatvec.TILE_ROWS
    np.testing.assert_allclose(tq.dequantize(), w_hat, rtol=DEQ_RTOL, atol=DEQ_RTOL)
    np.testing.assert_array_equal(tq.dequantize_t(), tq.dequantize().T)
    rows = np.array([M - 1, 0, M // 2, -1])
    np.testing.assert_array_equal(tq.dequantize(rows), tq.dequantize()[rows])
    np.testing.assert_allclose(tq.scale, gqr.scale, rtol=DEQ_RTOL)
    np.testing.assert_array_equal(tq.zero, gqr.zero)
    for n in (1, 2, 4):
        x = rng.standard_normal((n, K)).astype(np.float32)
        ref = x.astype(np.float64) @ w_hat.T
        y = tq.matmul(x)
        assert y.shape == (n, M)
        assert np.abs(y - ref).max() < F32_TOL * np.abs(ref).max()
        assert np.abs(y - x @ w.T).max() > 10 * F32_TOL * np.abs(ref).max()   # it is the quantised product


def test_tiled_layout_and_bytes():
    """Byte [t, k, r] holds row 64 t + r: column 2k in its low nibble, 2k + 1 in its high one; the
    scales and one-byte zero points are tiled the same way; nbytes counts the M rows' storage."""
    M, K, g = 70, 8, 4
    q = (np.arange(M * K).reshape(M, K) * 7) % 16
    scale = np.linspace(0.5, 2.0, M * 2).reshape(M, 2)
    zero = np.arange(M * 2).reshape(M, 2) % 16
    tq = qmatvec.TiledQuant(q, scale, zero, 4, g)
    T = qmatvec.TILE_ROWS
    assert tq.codes.shape == (2, K // 2, T) and tq.codes.dtype == np.uint8
    for m, k in [(0, 0), (5, 3), (69, 1), (64, 2)]:
        assert tq.codes[m // T, k, m % T] == q[m, 2 * k] | (q[m, 2 * k + 1] << 4)
        assert tq.zero_tiles[m // T, k % 2, m % T] == zero[m, k % 2]
    assert (tq.codes[1, :, M - T:] == 0).all()                     # the last tile's padding rows
    assert tq.zero_tiles.dtype == np.uint8 and tq.scale_tiles.dtype == np.float32
    assert tq.nbytes == M * K // 2 + M * 2 * (4 + 1)
    t8 = qmatvec.TiledQuant(q * 16, scale, zero, 8, g)
    assert t8.codes.shape == (2, K, T) and t8.codes[1, 7, 5] == 16 * q[69, 7]
    assert t8.nbytes == M * K + M * 2 * 5


def test_tiled_bad_input():
    ok = dict(scale=np.ones((4, 2)), zero=np.zeros((4, 2)), bits=4, group_size=4)
    with pytest.raises(ValueError, match=r"q: expected unsigned 4-bit codes in \[0, 15\]"):
        qmatvec.TiledQuant(np.full((4, 8), 16), **ok)
    with pytest.raises(TypeError, match="q: expected a 2-D integer array"):
        qmatvec.TiledQuant(np.zeros((4, 8)), **ok)
    with pytest.raises(ValueError, match="group_size: expected an even group size"):
        qmatvec.TiledQuant(np.zeros((4, 9), np.int64), np.ones((4, 3)), np.zeros((4, 3)), 4, 3)
    with pytest.raises(ValueError, match=r"zero: expected integer zero points in \[0, 255\]"):
        qmatvec.TiledQuant(np.zeros((4, 8), np.int64), np.ones((4, 2)), np.full((4, 2), 0.5), 4, 4)
    with pytest.raises(ValueError, match="scale, zero"):
        qmatvec.TiledQuant(np.zeros((4, 8), np.int64), np.ones((4, 3)), np.zeros((4, 3)), 4, 4)
    tq = qmatvec.TiledQuant(np.zeros((4, 8), np.int64), **ok)
    with pytest.raises(ValueError, match=r"x: expected \(n, K = 8\) rows"):
        tq.matmul(np.ones(8))
    with pytest.raises(IndexError, match="rows: expected integer row indices"):
        tq.dequantize([4])
