"""16-bit storage: the safe policy keeps the block finite and accurate, the naive one fails where the
formats' limits say it must, and the tracer names where.

Error metrics (y16 is the 16-bit block's output cast to float64, y64 the float64 block's output on
the same input and weights):
    global:      max|y16 - y64| / max|y64|
    per element: max over elements of |y16 - y64| / max(|y64|, rms(y64))
The per-element measure is relative for every element at least as large as the typical one and
absolute (in units of rms(y64)) for the rest, so entries that happen to be near zero do not make
it infinite.
"""
import numpy as np
import pytest

from preln import NAIVE, SAFE, BlockConfig, Overflow, TransformerBlock, Watch
from preln.ops import layer_norm_forward, softmax_forward
from preln.precision import BFLOAT16, compute_dtype, resolve_policy

#: float16 safe policy at rms 100, d_model 256: within 1% (unit round-off 2^-11 = 4.9e-4)
FP16_RTOL = 0.01
#: bfloat16 keeps 8 bits of precision (unit round-off 2^-8 = 3.9e-3): about 5 units
BF16_RTOL = 0.02
#: float32 vs float64 on the same weights (unit round-off 2^-24 = 6e-8, times accumulation)
FP32_RTOL = 1e-5

CFG = BlockConfig(d_model=256, n_heads=4, d_ff=1024)


def global_error(y, ref):
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def per_element_error(y, ref):
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    rms = np.sqrt(np.mean(ref ** 2))
    return float((np.abs(y - ref) / np.maximum(np.abs(ref), rms)).max())


@pytest.fixture(scope="module")
def rms100():
    """x with rms 100 at d_model 256, rounded to float16 so every dtype sees the same input;
    and the float64 block's weights and output on it."""
    x = (100 * np.random.default_rng(0).standard_normal((2, 16, 256))).astype(np.float16)
    ref = TransformerBlock(CFG, dtype=np.float64, seed=1)
    return x, ref.state_dict(), ref(x.astype(np.float64))


def _block(dtype, sd, **kw):
    b = TransformerBlock(CFG, dtype=dtype, seed=1, **kw)
    b.load_state_dict(sd)
    return b


@pytest.mark.parametrize("dtype, tol", [(np.float16, FP16_RTOL), (BFLOAT16, BF16_RTOL)],
                         ids=["float16", "bfloat16"])
def test_16bit_safe_preln_stays_finite_and_accurate(dtype, tol, rms100):
    x, sd, y64 = rms100
    b = _block(dtype, sd, trace=True)
    y = b(x)
    assert y.dtype == dtype
    assert b.overflow is None and np.isfinite(y.astype(np.float64)).all()
    assert global_error(y, y64) < tol                   # measured: fp16 6.0e-4, bf16 3.2e-3
    assert per_element_error(y, y64) < tol              # measured: fp16 9.1e-4, bf16 7.9e-3
    dx = b.backward(np.ones_like(y))
    assert np.isfinite(dx.astype(np.float64)).all()


def test_float32_equals_float64_to_float32_tolerance(rng):
    cfg = BlockConfig(d_model=64, n_heads=4, d_ff=256, causal=True)
    b64 = TransformerBlock(cfg, dtype=np.float64, seed=2)
    b32 = TransformerBlock(cfg, dtype=np.float32, seed=3)
    b32.load_state_dict(b64.state_dict())
    x = rng.standard_normal((2, 10, 64))
    w = rng.standard_normal((2, 10, 64))
    kpm = np.zeros((2, 10), bool)
    kpm[1, 7:] = True
    y64, y32 = b64(x, kpm), b32(x.astype(np.float32), kpm)
    assert y32.dtype == np.float32
    assert global_error(y32, y64) < FP32_RTOL
    assert global_error(b32.backward(w.astype(np.float32)), b64.backward(w)) < FP32_RTOL
    for k in b64.grads:
        assert global_error(b32.grads[k], b64.grads[k]) < FP32_RTOL, k


def test_naive_float16_trace_names_norm1_variance(rms100):
    x, sd, y64 = rms100
    b = _block(np.float16, sd, policy="naive", trace=True)
    y = b(x)                                         # no exception: trace only records
    ov = b.overflow
    assert isinstance(ov, Overflow)
    assert ov.op == "norm1.variance"                 # 256 * 100^2 = 2.6e6 > 65504
    assert ov.shape == (2, 16, 1) and ov.dtype == "float16"
    assert ov.max_abs_input == float(np.abs(x.astype(np.float64)).max())    # the input's largest |x|
    assert "norm1.variance" in str(ov) and "float16" in str(ov)
    # The failure is silent: the variance is inf, rstd = 1/sqrt(inf) = 0, and both LayerNorms
    # output exactly zero (beta) -- finite, no NaN, just wrong.
    np.testing.assert_array_equal(b.cache.ln1.rstd, 0)     # rstd = 1/sqrt(inf + eps)
    h1 = b.cache.attn.in_proj.x                     # LN1(x), the attention's input
    h2 = b.cache.mlp.linear1.x                      # LN2(x1), the MLP's input
    assert not np.isnan(y.astype(np.float64)).any()
    np.testing.assert_array_equal(h1, 0)
    np.testing.assert_array_equal(h2, 0)
    safe = _block(np.float16, sd)
    safe(x)
    assert np.abs(safe.cache.attn.in_proj.x.astype(np.float64)).max() > 1   # the safe LN is not 0


def test_no_trace_no_overflow_record(rms100):
    x, sd, _ = rms100
    b = _block(np.float16, sd, policy="naive")
    b(x)
    assert b.overflow is None


@pytest.mark.parametrize("rms, overflows", [(11.0, False), (11.5, True)])
def test_naive_float16_layer_norm_overflow_threshold(rms, overflows):
    """The float16 sum of squares overflows once d * rms^2 >= 65520: rms 11.31 at d=512."""
    d = 512
    x = (rms * np.where(np.arange(d) % 2, 1.0, -1.0)).astype(np.float16)[None]   # mean 0, var rms^2
    ones, zeros = np.ones(d, np.float16), np.zeros(d, np.float16)
    watch = Watch(enabled=True)
    with np.errstate(over="ignore"):                         # the overflow is what we test
        y, cache = layer_norm_forward(x, ones, zeros, 1e-5, NAIVE, watch)
    assert (cache.rstd == 0).all() == overflows
    if overflows:
        assert watch.first.op == "variance"
        np.testing.assert_array_equal(y, 0)                  # silent: zeros, not NaN
    else:
        assert watch.first is None
    y_safe, _ = layer_norm_forward(x, ones, zeros, 1e-5, SAFE)
    np.testing.assert_allclose(y_safe.astype(np.float64), x / rms, rtol=1e-3)


def test_naive_float16_softmax_exp_overflows_above_ln_65520():
    """exp overflows float16 for x >= ln 65520 = 11.09: the naive softmax (no max subtraction)
    gives NaN, the safe one a distribution."""
    x = np.array([[11.2, 0.0, -1.0]], np.float16)
    watch = Watch(enabled=True)
    with np.errstate(over="ignore", invalid="ignore"):       # inf / inf = NaN is what we test
        p, _ = softmax_forward(x, -1, NAIVE, watch)
    assert watch.first.op == "exp" and watch.first.max_abs_input == pytest.approx(11.2, rel=1e-3)
    assert np.isnan(p.astype(np.float64)).any()
    fine, _ = softmax_forward(np.array([[11.0, 0.0, -1.0]], np.float16), -1, NAIVE)
    assert np.isfinite(fine.astype(np.float64)).all()
    p_safe, _ = softmax_forward(x, -1, SAFE)
    assert np.isfinite(p_safe.astype(np.float64)).all()
    assert float(p_safe.astype(np.float64).sum()) == pytest.approx(1.0, abs=1e-3)


def test_bfloat16_layer_norm_needs_float32_statistics():
    """ml_dtypes' bfloat16 sum accumulates in bfloat16 (ones(1000).sum() = 256): the naive mean of
    1024 values near 1 is wrong; the safe policy's float32 statistics are right."""
    assert float(np.ones(1000, BFLOAT16).sum()) == 256.0
    d = 1024
    x = (1 + 0.1 * np.random.default_rng(0).standard_normal((1, d))).astype(BFLOAT16)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5)
    ones, zeros = np.ones(d, BFLOAT16), np.zeros(d, BFLOAT16)
    y_safe, _ = layer_norm_forward(x, ones, zeros, 1e-5, SAFE)
    y_naive, _ = layer_norm_forward(x, ones, zeros, 1e-5, NAIVE)
    assert per_element_error(y_safe, ref) < BF16_RTOL
    assert per_element_error(y_naive, ref) > 0.5


def test_watch_reports_the_largest_finite_input():
    watch = Watch(enabled=True)
    out = np.array([1.0, np.inf])
    assert watch("op", out, np.array([1.0, -5.0, np.inf]), np.array([2.0])) is out
    assert watch.first == Overflow("op", (2,), "float64", 5.0)
    watch("later", np.array([np.nan]), np.array([9.0]))
    assert watch.first.op == "op"                           # the first one is kept
    assert Watch()("op", out) is out and Watch().first is None   # disabled: checks nothing


def test_compute_dtype_of_each_policy():
    assert compute_dtype(np.float16, SAFE) == np.float32
    assert compute_dtype(BFLOAT16, SAFE) == np.float32
    assert compute_dtype(np.float16, NAIVE) == np.float16
    assert compute_dtype(np.float64, SAFE) == np.float64
    assert resolve_policy("naive") is NAIVE and resolve_policy(SAFE) is SAFE
