"""The Llama block's fused kernels (preln.ops.fused.llama) equal the numpy ops they replace to
round-off, for float32 and float64, including the edges (SiLU at large |a|, per-sequence RoPE
positions, RMSNorm of a tiny row)."""
import numpy as np
import pytest

from preln.ops import (merge_heads, rms_norm_backward, rms_norm_forward, rope_backward, rope_cos_sin,
                       rope_forward, silu_backward, silu_forward, split_heads)
from preln.ops.fused import llama as fused_llama

#: fused vs numpy, max|a - b| / max(1, max|b|): the same math in another order (float32: exp as a
#: polynomial with ~1 ulp of error, as numpy's)
ROUNDOFF = {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 2e-6}
DTYPES = [np.float64, np.float32]
IDS = ["float64", "float32"]


def err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rms_norm_and_add_rms_norm(dtype, rng):
    x = (3 + 5 * rng.standard_normal((3, 7, 48))).astype(dtype)
    x[0, 0] = 1e-4                                                  # a tiny row: eps matters
    res = rng.standard_normal((3, 7, 48)).astype(dtype)
    gamma = rng.standard_normal(48).astype(dtype)
    tol = ROUNDOFF[np.dtype(dtype)]
    y, c = fused_llama.rms_norm(x, gamma, 1e-6)
    y_ref, c_ref = rms_norm_forward(x, gamma, 1e-6)
    assert y.dtype == dtype and c.rrms.shape == (3, 7, 1) and c.rrms.dtype == dtype
    assert err(y, y_ref) < tol and err(c.rrms, c_ref.rrms) < tol
    r, y2, c2 = fused_llama.add_rms_norm(x, res, gamma, 1e-6)
    y2_ref, _ = rms_norm_forward(x + res, gamma, 1e-6)
    np.testing.assert_array_equal(r, x + res)                      # one addition, as numpy does it
    assert err(y2, y2_ref) < tol and c2.x is r


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rms_norm_backward_with_and_without_the_residual(dtype, rng):
    x = rng.standard_normal((4, 6, 32)).astype(dtype)
    gamma = (1 + 0.3 * rng.standard_normal(32)).astype(dtype)
    dy, dres = (rng.standard_normal((4, 6, 32)).astype(dtype) for _ in range(2))
    _, cache = rms_norm_forward(x, gamma, 1e-6)
    dx_ref, dg_ref = rms_norm_backward(dy, cache)
    dx, dg = fused_llama.rms_norm_backward(dy, cache)
    tol = ROUNDOFF[np.dtype(dtype)]
    assert dx.dtype == dtype and dg.dtype == dtype
    assert err(dx, dx_ref) < tol and err(dg, dg_ref) < tol
    dx2, _ = fused_llama.rms_norm_backward(dy, cache, dres)
    assert err(dx2, dx_ref + dres) < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_silu_mul_and_its_backward(dtype, rng):
    a = (4 * rng.standard_normal((5, 64))).astype(dtype)
    a[0, :4] = [-120.0, 120.0, -1000.0 if dtype == np.float64 else -100.0, 0.0]   # exp under/overflows
    b, dg = rng.standard_normal((5, 64)).astype(dtype), rng.standard_normal((5, 64)).astype(dtype)
    s, c = silu_forward(a)
    tol = ROUNDOFF[np.dtype(dtype)]
    g = fused_llama.silu_mul(a, b)
    assert np.isfinite(g).all() and err(g, s * b) < tol
    da, db = fused_llama.silu_mul_backward(dg, a, b)
    assert err(db, dg * s) < tol and err(da, silu_backward(dg * b, c)) < tol
    a_copy = a.copy()
    fused_llama.silu_mul(a_copy, b, out=a_copy)                    # inference: g over a
    assert err(a_copy, g) == 0


@pytest.mark.parametrize("per_sequence", [False, True], ids=["shared", "per-sequence"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rope_with_the_head_transpose(dtype, per_sequence, rng):
    Bn, Sn, Hn, dh = 2, 5, 3, 8
    x_lin = rng.standard_normal((Bn, Sn, Hn * dh)).astype(dtype)  # as a projection writes it
    pos = np.array([np.arange(Sn) + 4, np.arange(Sn) + 900]) if per_sequence else np.arange(Sn) + 4
    cos_sin = rope_cos_sin(pos, dh, 10000.0, dtype)
    out = fused_llama.rope(x_lin, Hn, cos_sin)
    ref, cache = rope_forward(split_heads(x_lin, Hn), cos_sin=cos_sin)
    tol = ROUNDOFF[np.dtype(dtype)]
    assert out.shape == (Bn, Hn, Sn, dh) and out.flags.c_contiguous and err(out, ref) < tol
    d = rng.standard_normal(out.shape).astype(dtype)
    dx = fused_llama.rope_backward(d, cos_sin)
    assert dx.shape == x_lin.shape and err(dx, merge_heads(rope_backward(d, cache))) < tol
