"""Tests of preln.chapters.numerics: format limits and overflow thresholds against their closed forms (IEEE
754 binary16, the float8 e4m3fn table of Micikevicius et al. 2022), the empirical searches against
the closed forms, and the residual-stream and loss-scaling experiments of the precision chapter."""
import math

import ml_dtypes
import numpy as np
import pytest

import preln
from preln.chapters import numerics
from preln.ops import layer_norm_forward

#: sqrt(65520 / d) to 2 decimals: rms at which a naive float16 LayerNorm's sum of squares overflows
CLOSED_FORM_LN_RMS = {512: 11.31, 768: 9.24, 1024: 8.00, 4096: 4.00, 12288: 2.31}
#: relative agreement of the bisection with the closed form (float16 rounding of the input)
BISECTION_RTOL = 1e-3


@pytest.mark.parametrize("name", list(numerics.FORMATS))
def test_format_limits_match_finfo(name):
    e, m, kind = numerics.FORMATS[name]
    lim = numerics.format_limits(e, m, kind)
    fi = ml_dtypes.finfo(numerics.DTYPES[name])
    assert lim["max"] == float(fi.max)
    assert lim["min_normal"] == float(fi.smallest_normal)
    assert lim["min_subnormal"] == float(fi.smallest_subnormal)
    assert lim["eps"] == float(fi.eps)
    assert lim["bits"] == numerics.DTYPES[name].itemsize * 8


def test_published_format_limits():
    lim = {r["name"]: r for r in numerics.format_rows()}
    assert lim["float16"]["max"] == 65504
    assert lim["float16"]["min_normal"] == 2.0 ** -14 and lim["float16"]["min_subnormal"] == 2.0 ** -24
    assert lim["float16"]["eps"] == 2.0 ** -10
    assert lim["bfloat16"]["eps"] == 2.0 ** -7
    assert lim["bfloat16"]["max"] == pytest.approx(3.39e38, rel=1e-3)
    assert lim["float8_e4m3fn"]["max"] == 448
    assert lim["float8_e4m3fn"]["min_normal"] == 2.0 ** -6
    assert lim["float8_e4m3fn"]["min_subnormal"] == 2.0 ** -9
    assert lim["float8_e4m3fn"]["eps"] == 2.0 ** -3


def test_format_limits_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        numerics.format_limits(5, 10, "ibm")


def test_float16_rounding_at_the_edge():
    with np.errstate(over="ignore"):
        assert float(np.float16(65519)) == 65504
        assert math.isinf(float(np.float16(65520)))
    assert numerics.overflow_bound(np.float16) == 65520


def test_fp8_e4m3fn_overflow_gives_nan():
    v = np.array([448.0, 464.0, 465.0, 1e6]).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert v[0] == 448 and v[1] == 448            # 464 ties to 448, whose last mantissa bit is even
    assert np.isnan(v[2]) and np.isnan(v[3])      # past the midpoint: NaN, never inf
    assert not np.isinf(v).any()
    assert numerics.overflow_bound(ml_dtypes.float8_e4m3fn) == 464


def test_bfloat16_sum_accumulates_in_bfloat16():
    assert float(np.ones(1000, ml_dtypes.bfloat16).sum()) == 256


def test_exp_and_square_thresholds_closed_form():
    assert numerics.exp_threshold("float16") == pytest.approx(math.log(65520))
    assert round(numerics.exp_threshold("float16"), 2) == 11.09
    assert round(numerics.exp_threshold("float32"), 2) == 88.72
    assert round(numerics.exp_threshold("bfloat16"), 2) == 88.72
    assert round(numerics.square_threshold("float16"), 2) == 255.97


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_empirical_thresholds_are_the_next_representable_value(name):
    m = numerics.FORMATS[name][1]
    dt = numerics.DTYPES[name]
    for closed, emp, f in [(numerics.exp_threshold(name), numerics.exp_threshold_empirical(name), np.exp),
                           (numerics.square_threshold(name), numerics.square_threshold_empirical(name),
                            lambda v: v * v)]:
        assert 0 <= emp - closed < 2.0 ** (math.floor(math.log2(emp)) - m)
        with np.errstate(all="ignore"):
            assert not np.isfinite(f(np.array([emp], dt)).astype(np.float64)).all()
    assert numerics.exp_threshold_empirical("float16") == 11.09375


def test_layernorm_rms_threshold_closed_form():
    for d, expected in CLOSED_FORM_LN_RMS.items():
        assert round(numerics.layernorm_rms_threshold(d), 2) == expected
    assert numerics.layernorm_rms_threshold(65520) == 1.0


@pytest.mark.parametrize("d", [512, 768, 1024, 4096, 12288])
def test_layernorm_bisection_agrees_with_closed_form(d):
    ok, bad = numerics.layernorm_rms_threshold_empirical(d)
    closed = numerics.layernorm_rms_threshold(d)
    assert ok < bad
    assert abs(bad - closed) / closed < BISECTION_RTOL
    assert abs(ok - closed) / closed < BISECTION_RTOL


def test_naive_layernorm_overflow_is_silent():
    d = 512
    x = (14.0 * np.random.default_rng(0).standard_normal((2, d))).astype(np.float16)
    watch = preln.Watch(enabled=True)
    with np.errstate(all="ignore"):
        y, cache = layer_norm_forward(x, np.ones(d, np.float16), np.zeros(d, np.float16),
                                      policy=preln.NAIVE, watch=watch)
    assert watch.first is not None and watch.first.op == "variance"
    assert np.isfinite(y).all() and np.all(y == 0) and np.all(cache.rstd == 0)
    y_safe, _ = layer_norm_forward(x, np.ones(d, np.float16), np.zeros(d, np.float16))
    assert np.isfinite(y_safe).all() and np.sqrt(np.mean(y_safe.astype(float) ** 2)) == pytest.approx(1, abs=1e-2)


def test_residual_stream_float16_naive_overflows_where_float32_predicts():
    d = 16
    ss0 = numerics.residual_stream(d, 1.0, 0, "float32", "safe", tokens=4)["max_token_ss"][0, 0]
    scale = math.sqrt((65520 - 5) / ss0)            # the largest token just below the threshold
    run32 = numerics.residual_stream(d, scale, 12, "float32", "safe", tokens=4)
    crossed = np.nonzero(run32["max_token_ss"][0] >= 65520)[0]
    run16 = numerics.residual_stream(d, scale, 12, "float16", "naive", tokens=4)
    assert crossed.size                              # the float32 stream crosses 65520 ...
    # ... and the float16 tracer fires within a block of it (norm2 sees the stream mid-block)
    assert run16["first"] is not None and abs(run16["first"][0] - crossed[0]) <= 2
    assert run16["first"][1].op.endswith("variance")
    assert numerics.residual_stream(d, scale, 12, "float16", "safe", tokens=4)["first"] is None


def test_residual_stream_statuses():
    run = numerics.residual_stream(16, [1.0, 100.0, 2.0 ** 15], 2, "float16", "naive", tokens=2, batch=3)
    assert run["status"].shape == (3, 3)
    assert np.all(run["status"][0] == 0)            # rms 1: finite
    assert np.all(run["status"][1, 1:] == 1)         # rms 100 > sqrt(65520/16): LayerNorm silently 0
    assert np.all(run["status"][2, 1:] >= 2)         # the input itself is not representable


def test_bfloat16_stream_never_overflows():
    run = numerics.residual_stream(16, [1.0, 2.0 ** 15], 2, "bfloat16", "naive", tokens=2, batch=2)
    assert np.all(run["status"] == 0) and run["first"] is None


def test_precision_error_ordering():
    rows = {(r["dtype"], r["policy"]): r for r in numerics.precision_error(d=16, tokens=8)}
    for r in rows.values():
        assert r["forward"] < r["eps"] and r["backward"] < r["eps"]
    assert rows["bfloat16", "safe"]["forward"] > rows["float16", "safe"]["forward"]
    assert rows["float16", "safe"]["forward"] > rows["float32", "safe"]["forward"]


def test_loss_scaling_recovers_flushed_gradients():
    no_scale, scaled, huge = numerics.gradient_underflow([1.0, 2.0 ** 16, 2.0 ** 60], grad_rms=2.0 ** -22,
                                                         d=16, tokens=8)
    assert no_scale["flushed"] > 0.01 and no_scale["overflowed"] == 0
    assert scaled["flushed"] < no_scale["flushed"] / 10 and scaled["overflowed"] == 0
    assert scaled["error"] < no_scale["error"]
    assert huge["overflowed"] > 0


def test_dynamic_loss_scaling_backs_off_and_grows():
    grad_rms = np.full(16, 2.0 ** -20)
    run = numerics.dynamic_loss_scaling(grad_rms, init_scale=2.0 ** 36, growth_interval=3, d=16, tokens=8)
    assert run["skipped"][0]                                  # 2^36 overflows: skip and halve
    assert run["scale"][1] == 2.0 ** 35
    ok = ~run["skipped"]
    assert ok.any() and np.all(run["scale"][ok] * run["max_abs"][ok] <= 65504)
    i = int(np.argmax(ok))                                    # first finite step
    assert i + 3 < len(run["scale"]) and not run["skipped"][i:i + 3].any()
    assert run["scale"][i + 3] == 2 * run["scale"][i]         # doubled after 3 finite steps


# ---- the overflow map's blocks: weights drawn once per (d, seed), the same blocks -----------------

def _fresh_block(d, dtype_name, policy, seed):
    """What numerics._block stands for: a block initialised from scratch in the dtype."""
    return preln.TransformerBlock(numerics.stack_config(d), dtype=numerics.DTYPES[dtype_name],
                                  seed=seed, policy=policy, trace=True).eval()


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("policy", ["naive", "safe"])
def test_cached_block_is_the_freshly_initialised_block(dtype_name, policy):
    for d, seed in ((16, 3), (32, 1)):
        cached, fresh = numerics._block(d, dtype_name, policy, seed), _fresh_block(d, dtype_name, policy, seed)
        assert cached.dtype == fresh.dtype and cached.policy == fresh.policy
        assert not cached.training and cached.trace
        assert cached.rng.bit_generator.state == fresh.rng.bit_generator.state
        assert cached.params.keys() == fresh.params.keys()
        for k, v in fresh.params.items():
            assert cached.params[k].dtype == v.dtype
            assert np.array_equal(cached.params[k].view(np.uint8), v.view(np.uint8)), k
        x = np.random.default_rng(0).standard_normal((2, 3, d)) * 40
        with np.errstate(all="ignore"):
            y_cached, y_fresh = cached(x), fresh(x)
        assert np.array_equal(y_cached.view(np.uint8), y_fresh.view(np.uint8))
        assert cached.overflow == fresh.overflow


def test_cached_block_weights_are_shared_and_read_only():
    a, b = numerics._block(16, "float16", "naive", 5), numerics._block(16, "float16", "safe", 5)
    assert a is not b and a.policy != b.policy
    assert all(a.params[k] is b.params[k] and not a.params[k].flags.writeable for k in a.params)


def test_overflow_grid_is_the_grid_of_fresh_blocks(monkeypatch):
    args = dict(d=16, depth=3, scales=(1.0, 64.0, 2.0 ** 15), tokens=2)
    for dtype_name, policy in (("float16", "naive"), ("float16", "safe"), ("bfloat16", "naive")):
        cached = numerics.overflow_grid(dtype_name, policy, **args)
        with monkeypatch.context() as m:
            m.setattr(numerics, "_block", _fresh_block)
            run = numerics.residual_stream(args["d"], list(args["scales"]), args["depth"], dtype_name,
                                           policy, tokens=2, batch=3)
        assert np.array_equal(cached, run["status"][:, 1:].T)


def test_blas_threads_sets_and_restores_the_thread_count():
    from preln.blas import blas_threads, openblas_thread_functions
    functions = openblas_thread_functions()
    if not functions:
        pytest.skip("numpy's OpenBLAS was not found")
    get = functions[0][0]
    before = get()
    with blas_threads(1) as n:
        assert n >= 1 and get() == 1
    assert get() == before


def test_gradient_underflow_splits_activation_and_parameter_gradients():
    row, = numerics.gradient_underflow([1.0], grad_rms=2.0 ** -22, d=16, tokens=8)
    assert row["flushed_dx"] == row["per_tensor"]["dx"]
    # the overall fraction is a weighted mean of the two parts, so it lies between them
    lo, hi = sorted((row["flushed_dx"], row["flushed_params"]))
    assert lo <= row["flushed"] <= hi
    assert row["flushed_params"] > 0


def test_theory_stream_grows_faster_than_pytorch_init():
    """The depth-to-overflow prediction depends on the initialisation: Xavier (Xiong et al.'s
    setting) grows the stream by about d per block, PyTorch's default init by a fraction of it."""
    depth = 12
    xav = numerics.theory_stream(32, depth, tokens=8)
    torch_init = numerics.residual_stream(32, 1.0, depth, "float32", "safe", tokens=8)
    assert xav["ms"].shape == xav["max_token_ss"].shape == (depth + 1,)
    # the same input: x0 is N(0, 1) of the same seed in both
    assert np.isclose(xav["max_token_ss"][0], torch_init["max_token_ss"][0, 0], rtol=1e-6)
    slope_x = np.polyfit(np.arange(depth + 1), xav["ms"], 1)[0]
    slope_t = np.polyfit(np.arange(depth + 1), torch_init["ms"][0], 1)[0]
    assert 0.5 < slope_x < 2.0 and slope_t < 0.3 * slope_x


def test_stored_overflow_grids_are_the_computed_ones():
    """The overflow map draws preln/data/precision/overflow_grids.json: it must equal a fresh run."""
    for (dtype, policy, d), grid in numerics.precompute_overflow_grids().items():
        stored = numerics.stored_overflow_grid(dtype, policy, d)
        assert stored.shape == (numerics.GRID_DEPTH, len(numerics.GRID_SCALES))
        assert np.array_equal(stored, grid), (dtype, policy, d)
    with pytest.raises(KeyError, match="no stored grid"):
        numerics.stored_overflow_grid("float16", "naive", 48)
