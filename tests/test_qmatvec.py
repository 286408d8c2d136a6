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
