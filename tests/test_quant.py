"""preln.quant.int8: exact integer products, quantisation error bounds, schemes equal to their
definitions, the outlier injector preserves the function, bad input gets clear errors."""
import numpy as np
import pytest

from preln import BlockConfig, TransformerBlock, TransformerStack

from preln.quant import int8 as quant
from preln.models.lm import LMConfig, TinyLM

#: float64 block_forward vs TransformerBlock: the same ops in the same order, round-off only
FLOAT64_TOL = 1e-12
#: Quantisation error tolerances. Each test below measures ||y_q - y|| / ||y|| on fixed seeds; the
#: *_ERR values are those measurements (rounded up to two digits, numpy 2.4 / OpenBLAS 0.3.31), and a
#: test allows QUANT_MARGIN times its value: room for another BLAS kernel's round-off flipping a
#: few int8 codes, not for a scheme that got worse.
QUANT_MARGIN = 1.5
#: a random-init block (D = 16) per scheme, the worst of Pre-LN and Post-LN (llm.int8 at LLM_INT8_THRESHOLD)
BLOCK_ERR = {"w8a16": 1.7e-3, "w8a8-tensor": 4.0e-3, "w8a8": 2.9e-3, "llm.int8": 2.6e-3,
             "smoothquant": 2.7e-3, "fp8-e4m3": 1.4e-2}
#: w8a8-tensor with static scales, the worst of the absmax, percentile and MSE calibrations
CALIBRATION_ERR = 3.2e-3
#: w8a8 on a float32 block with a padding mask
FLOAT32_SOURCE_ERR = 2.6e-3
#: three blocks and a final LayerNorm
STACK_ERR = {"w8a8": 6.6e-3, "smoothquant": 6.0e-3}
#: TinyLM logits (llm.int8 at LLM_INT8_THRESHOLD)
LM_ERR = {"llm.int8": 2.0e-2, "w8a8-tensor": 3.4e-2}
#: LLM.int8's outlier threshold in the tests: a LayerNorm output of a random-init block at D = 16 is
#: at most sqrt(D - 1) ~ 3.9 in magnitude, so the default 6.0 would leave every column on the int8 path
#: (LLM.int8 = w8a8 exactly); at 2.0 some columns of every layer after a LayerNorm take the float16 path.
LLM_INT8_THRESHOLD = 2.0
#: float32 arithmetic inside the schemes vs a float64 re-derivation of their definitions
FLOAT32_TOL = 1e-5


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def make_block(norm_first=True, dtype=np.float64, seed=0, causal=False):
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32, norm_first=norm_first, causal=causal)
    return TransformerBlock(cfg, dtype=dtype, seed=seed).eval()


# ---- integer matmul and accumulators -------------------------------------------------------------
@pytest.mark.parametrize("K", [1, 7, 64, 1000, 4096])
def test_int_matmul_is_exact(K):
    rng = np.random.default_rng(K)
    a = rng.integers(-127, 128, (5, K)).astype(np.int8)
    b = rng.integers(-127, 128, (3, K)).astype(np.int8)
    out = quant.int_matmul(a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int32) @ b.astype(np.int32).T)


def test_int32_bound():
    assert quant.int32_max_terms(8) == 133_144
    assert quant.int32_max_terms(8, allow_min=True) == 131_071
    K = quant.int32_max_terms(8)
    a = np.full((1, K), 127, np.int8)
    assert int(quant.int_matmul(a, a)[0, 0]) == K * 127 * 127 <= 2 ** 31 - 1   # the worst case fits
    a1 = np.full((1, K + 1), 127, np.int8)
    with pytest.raises(OverflowError, match="int32"):
        quant.int_matmul(a1, a1)


def test_accumulators():
    terms = np.full(4, 127 * 127, np.int32)                   # four worst-case int8 products
    assert quant.accumulate(terms, np.int32) == 4 * 16129
    assert quant.accumulate(terms, np.int16) == np.int16(np.int64(4 * 16129) - 2 ** 16)  # wrapped
    ones = np.ones(4096)
    assert quant.accumulate(ones, np.float16) == 2048          # 2048 + 1 rounds back to 2048
    assert quant.accumulate(ones, np.float32) == 4096


# ---- one tensor ----------------------------------------------------------------------------------
@pytest.mark.parametrize("granularity", ["tensor", "channel", "token"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bits", [4, 8, 12])
def test_quantize_error_bound(granularity, symmetric, bits):
    x = np.random.default_rng(bits).standard_normal((6, 40)) * np.arange(1, 7)[:, None]
    qt = quant.quantize(x, bits, granularity, symmetric)
    err = np.abs(quant.dequantize(qt) - x)
    assert np.all(err <= qt.scale / 2 * (1 + 1e-12))          # |x - deq(q(x))| <= S / 2 inside the range
    lo, hi = (-quant.qmax(bits), quant.qmax(bits)) if symmetric else (0, 2 ** bits - 1)
    assert qt.q.min() >= lo and qt.q.max() <= hi
    assert qt.q.dtype == (np.int8 if symmetric else np.uint8) if bits <= 8 else qt.q.dtype.itemsize == 2
    if granularity != "tensor":
        assert qt.scale.shape == (6, 1)
    if symmetric:                                              # the largest |x| maps to +-qmax exactly
        assert np.abs(qt.q.astype(int)).max() == quant.qmax(bits)


def test_zero_is_exact_and_zeros_quantise():
    x = np.array([[-1.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    for sym in (True, False):
        qt = quant.quantize(x, granularity="token", symmetric=sym)
        deq = quant.dequantize(qt)
        assert np.all(deq[x == 0] == 0)
        assert np.all(np.isfinite(deq))


def test_clamp_not_wrap():
    assert int(np.array(200).astype(np.int8)) == -56           # what a cast without clamp does
    qt = quant.quantize(np.array([200.0, -300.0, 5.0]), scale=1.0)
    np.testing.assert_array_equal(qt.q, [127, -127, 5])


def test_round_half_to_even():
    qt = quant.quantize(np.array([0.5, 1.5, 2.5, -0.5]), scale=1.0)
    np.testing.assert_array_equal(qt.q, [0, 2, 2, 0])


# ---- the schemes on one linear layer -------------------------------------------------------------
def _lin_case(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 16)).astype(np.float32)
    x[:, 3] *= 20                                              # an outlier feature
    w = rng.standard_normal((5, 16)) * 0.2
    b = rng.standard_normal(5)
    return x, w, b


def _absmax_rows(a):
    s = np.max(np.abs(a), axis=-1, keepdims=True) / 127
    return np.clip(np.rint(a / s), -127, 127), s


def test_w8a8_definition():
    x, w, b = _lin_case()
    y = quant.QLinear(w, b, "w8a8")(x)
    qx, sx = _absmax_rows(x.astype(np.float64))
    qw, sw = _absmax_rows(w.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(y, (qx @ qw.T) * sx * sw.T + b, rtol=FLOAT32_TOL, atol=FLOAT32_TOL)


def test_w8a8_tensor_definition():
    x, w, b = _lin_case()
    calib_max = np.abs(x).max(axis=0) * 0.5                    # calibration saw smaller values: clamps
    y = quant.QLinear(w, b, "w8a8-tensor", x_absmax=calib_max)(x)
    sx = calib_max.max() / 127
    qx = np.clip(np.rint(x / sx), -127, 127)
    sw = np.abs(w).max() / 127
    qw = np.rint(w / sw)
    np.testing.assert_allclose(y, (qx @ qw.T) * sx * sw + b, rtol=FLOAT32_TOL, atol=FLOAT32_TOL)


def test_w8a16_definition():
    x, w, b = _lin_case()
    qw, sw = _absmax_rows(w)
    ref = x.astype(np.float16).astype(np.float64) @ (qw * sw).T + b
    np.testing.assert_allclose(quant.QLinear(w, b, "w8a16")(x), ref, rtol=FLOAT32_TOL, atol=FLOAT32_TOL)


def test_llm_int8_definition():
    x, w, b = _lin_case()
    lin = quant.QLinear(w, b, "llm.int8", threshold=6.0)
    y = lin(x)
    assert lin.outlier_columns == {3}
    xi = x.astype(np.float64).copy()
    xi[:, 3] = 0
    qx, sx = _absmax_rows(xi)
    qw, sw = _absmax_rows(w.astype(np.float32).astype(np.float64))
    x16 = x[:, [3]].astype(np.float16).astype(np.float64)
    w16 = w[:, [3]].astype(np.float16).astype(np.float64)
    ref = (qx @ qw.T) * sx * sw.T + x16 @ w16.T + b
    np.testing.assert_allclose(y, ref, rtol=FLOAT32_TOL, atol=FLOAT32_TOL)
    # a threshold above every |x| is plain vector-wise w8a8
    np.testing.assert_array_equal(quant.QLinear(w, b, "llm.int8", threshold=1e9)(x),
                                  quant.QLinear(w, b, "w8a8")(x))


def test_llm_int8_outlier_weights_from_int8():
    """bitsandbytes' inference path (fp16_weights=False) multiplies the outlier columns by the
    int8 weights dequantised, S_w q_w, not by a float16 copy -- and stores no copy."""
    x, w, b = _lin_case()
    lin = quant.QLinear(w, b, "llm.int8", threshold=6.0, fp16_weights=False)
    y = lin(x)
    xi = x.astype(np.float64).copy()
    xi[:, 3] = 0
    qx, sx = _absmax_rows(xi)
    qw, sw = _absmax_rows(w.astype(np.float32).astype(np.float64))
    x16 = x[:, [3]].astype(np.float16).astype(np.float64)
    w_deq = (qw * sw)[:, [3]].astype(np.float16).astype(np.float64)
    ref = (qx @ qw.T) * sx * sw.T + x16 @ w_deq.T + b
    np.testing.assert_allclose(y, ref, rtol=FLOAT32_TOL, atol=FLOAT32_TOL)
    paper = quant.QLinear(w, b, "llm.int8", threshold=6.0)
    paper(x)
    assert paper.weight_nbytes() == lin.weight_nbytes() + 2 * 5 * 1   # one float16 column of 5 rows


def test_calibrate_scale_methods():
    rng = np.random.default_rng(0)
    x = rng.standard_t(3, 20_000)                            # heavy tails: a few large values
    amax = np.abs(x).max()
    assert quant.calibrate_scale(x, "absmax") == pytest.approx(amax / 127)
    assert quant.calibrate_scale(x, "percentile", percentile=99.9) == pytest.approx(
        np.percentile(np.abs(x), 99.9) / 127)

    def mse(scale, hi=127):
        return np.mean((x - scale * np.clip(np.rint(x / scale), -hi, hi)) ** 2)

    s_mse = quant.calibrate_scale(x, "mse")
    # the grid contains the absmax clip, so the MSE choice is never worse
    assert mse(s_mse) <= mse(amax / 127)
    grid = amax * np.arange(1, 201) / 200 / 127
    assert mse(s_mse) == pytest.approx(min(mse(g) for g in grid))
    # at 4 bits the rounding step is 18 times coarser, and clipping the tail pays
    s4 = quant.calibrate_scale(x, "mse", bits=4)
    assert s4 < 0.5 * amax / 7 and mse(s4, 7) < 0.5 * mse(amax / 7, 7)
    assert quant.calibrate_scale(np.zeros(4)) == 1.0
    assert quant.calibrate_scale(x, "absmax", bits=4) == pytest.approx(amax / 7)
    with pytest.raises(ValueError, match="method"):
        quant.calibrate_scale(x, "entropy")
    with pytest.raises(ValueError, match="percentile"):
        quant.calibrate_scale(x, "percentile", percentile=0)


@pytest.mark.parametrize("calibration", quant.CALIBRATIONS)
def test_static_calibrations_in_the_block(calibration):
    block = make_block()
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((4, 8, 16))
    qb = quant.quantize_block(block, "w8a8-tensor", calib, calibration=calibration)
    seen = {}
    quant.block_forward({k: v.astype(np.float64) for k, v in block.params.items()}, block.config,
                        calib, linear=lambda n, h: seen.setdefault(n, h) @ block.params[
                            quant.LINEAR_WEIGHTS[n][0]].T + block.params[quant.LINEAR_WEIGHTS[n][1]])
    for name, h in seen.items():
        assert qb.linears[name].x_scale == pytest.approx(quant.calibrate_scale(h, calibration), rel=1e-6)
    x = rng.standard_normal((2, 8, 16))
    assert rel(qb(x), block(x)) < QUANT_MARGIN * CALIBRATION_ERR


def test_dynamic_per_tensor_needs_no_calibration():
    x, w, b = _lin_case()
    lin = quant.QLinear(w, b, "w8a8-tensor", x_scale="dynamic")
    sx = np.abs(x).max() / 127                               # from this input, whatever came before
    qx = np.clip(np.rint(x / sx), -127, 127)
    sw = np.abs(w).max() / 127
    np.testing.assert_allclose(lin(x), (qx @ np.rint(w / sw).T) * sx * sw + b, rtol=FLOAT32_TOL,
                               atol=FLOAT32_TOL)
    qb = quant.quantize_block(make_block(), "w8a8-tensor", calibration="dynamic")
    assert all(l.dynamic_tensor for l in qb.linears.values())
    with pytest.raises(ValueError, match="calibration"):
        quant.quantize_block(make_block(), "w8a8-tensor", np.zeros((1, 2, 16)), calibration="max")
    with pytest.raises(ValueError, match="calib"):
        quant.quantize_block(make_block(), "w8a8-tensor", calibration="mse")


def test_smoothquant_definition():
    x, w, b = _lin_case()
    calib = np.abs(x).max(axis=0)
    y = quant.QLinear(w, b, "smoothquant", x_absmax=calib, alpha=0.5)(x)
    s = np.sqrt(calib) / np.sqrt(np.abs(w).max(axis=0))          # Eq. 4 with alpha = 1/2
    xs, ws = x / s, w * s
    qx, sx = _absmax_rows(xs)
    qw, sw = _absmax_rows(ws)
    np.testing.assert_allclose(y, (qx @ qw.T) * sx * sw.T + b, rtol=1e-4, atol=1e-4)
    # the migration itself is exact: X diag(s)^-1 (W diag(s))^T = X W^T
    np.testing.assert_allclose(xs @ ws.T, x @ w.T, rtol=1e-5, atol=1e-5)


def test_fp8_definition():
    x, w, b = _lin_case()
    f8 = quant.FP8_E4M3
    sx, sw = np.abs(x).max() / 448, np.abs(w).max() / 448
    ref = ((x / np.float32(sx)).astype(f8).astype(np.float64)
           @ (w.astype(np.float32) / np.float32(sw)).astype(f8).astype(np.float64).T) * sx * sw + b
    np.testing.assert_allclose(quant.QLinear(w, b, "fp8-e4m3")(x), ref, rtol=1e-4, atol=1e-4)
    assert quant.FP8_E4M3_MAX == 448


# ---- blocks, stacks, the LM ----------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_block_forward_equals_the_block(norm_first, causal):
    block = make_block(norm_first, causal=causal)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 16))
    mask = np.zeros((2, 5), bool)
    mask[1, -2:] = True
    rec = {}
    y = quant.block_forward(block.params, block.config, x, mask, record=rec)
    np.testing.assert_allclose(y, block(x, mask), rtol=0, atol=FLOAT64_TOL)
    assert set(rec) == {"ln1", "in_proj", "attn", "out_proj", "residual1", "ln2", "linear1", "act",
                        "linear2", "y"}


@pytest.mark.parametrize("scheme", quant.SCHEMES)
@pytest.mark.parametrize("norm_first", [True, False])
def test_quantized_block_is_close(scheme, norm_first):
    block = make_block(norm_first)
    rng = np.random.default_rng(2)
    x, calib = rng.standard_normal((2, 6, 16)), rng.standard_normal((4, 6, 16))
    options = {"threshold": LLM_INT8_THRESHOLD} if scheme == "llm.int8" else {}
    qb = quant.quantize_block(block, scheme, calib, **options)
    y = qb(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert rel(y, block(x)) < QUANT_MARGIN * BLOCK_ERR[scheme]
    assert 0 < qb.weight_nbytes() < quant.float_weight_nbytes(block, 4)
    if scheme == "llm.int8":
        # the outlier path was taken (after each LayerNorm), and its float16 columns beat int8 on them
        assert qb.linears["in_proj"].outlier_columns and qb.linears["linear1"].outlier_columns
        assert rel(y, block(x)) < rel(quant.quantize_block(block, "w8a8", calib)(x), block(x))


def test_quantized_block_float32_source_and_mask():
    block = make_block(dtype=np.float32)
    x = np.random.default_rng(3).standard_normal((2, 6, 16)).astype(np.float32)
    mask = np.zeros((2, 6), bool)
    mask[0, -1] = True
    qb = quant.quantize_block(block, "w8a8")
    assert rel(qb(x, key_padding_mask=mask), block(x, mask)) < QUANT_MARGIN * FLOAT32_SOURCE_ERR


def test_stack_and_lm():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32, causal=True)
    stack = TransformerStack(cfg, 3, dtype=np.float64, seed=0).eval()
    x = np.random.default_rng(4).standard_normal((2, 6, 16))
    for scheme in ("w8a8", "smoothquant"):
        qs = quant.quantize_block(stack, scheme, x)
        assert len(qs.layers) == 3 and rel(qs(x), stack(x)) < QUANT_MARGIN * STACK_ERR[scheme]
    lm = TinyLM(LMConfig(vocab_size=11, max_len=8, d_model=16, n_heads=2, d_ff=32), dtype=np.float64,
                seed=0).eval()
    tokens = np.random.default_rng(5).integers(0, 11, (3, 8))
    ql = quant.quantize_block(lm, "llm.int8", tokens, threshold=LLM_INT8_THRESHOLD)
    assert rel(ql(tokens), lm(tokens)) < QUANT_MARGIN * LM_ERR["llm.int8"]
    assert all(layer.linears["in_proj"].outlier_columns for layer in ql.stack.layers)
    ql = quant.quantize_block(lm, "w8a8-tensor", tokens)
    assert rel(ql(tokens), lm(tokens)) < QUANT_MARGIN * LM_ERR["w8a8-tensor"]


# ---- outliers ------------------------------------------------------------------------------------
def test_inject_outliers_keeps_the_function():
    block = make_block()
    x = np.random.default_rng(6).standard_normal((2, 6, 16))
    ref = block(x)
    big = quant.inject_outliers(block, [2, 9], 32.0)            # a power of 2: bit for bit
    np.testing.assert_array_equal(big(x), ref)
    odd = quant.inject_outliers(block, [2, 9], 20.0)
    np.testing.assert_allclose(odd(x), ref, rtol=0, atol=FLOAT64_TOL)
    rec = {}
    quant.block_forward(big.params, big.config, x, record=rec)
    h = np.abs(rec["ln1"]).max(axis=(0, 1))                     # LN output magnitude per channel
    assert h[[2, 9]].min() > 10 * np.delete(h, [2, 9]).max()
    np.testing.assert_array_equal(block(x), ref)                # the original is untouched
    lm = TinyLM(LMConfig(vocab_size=11, max_len=8, d_model=16, n_heads=2, d_ff=32), dtype=np.float64,
                seed=0).eval()
    tokens = np.arange(16).reshape(2, 8) % 11
    np.testing.assert_array_equal(quant.inject_outliers(lm, [1], 16.0)(tokens), lm(tokens))


def test_outliers_break_per_tensor_and_smoothquant_recovers():
    block = quant.inject_outliers(make_block(), [2, 9], 64.0)
    rng = np.random.default_rng(7)
    x, calib = rng.standard_normal((2, 6, 16)), rng.standard_normal((4, 6, 16))
    ref = block(x)
    quantized = {s: quant.quantize_block(block, s, calib) for s in quant.SCHEMES}
    err = {s: rel(q(x), ref) for s, q in quantized.items()}
    assert err["w8a8-tensor"] > 5 * err["smoothquant"]
    assert err["w8a8"] > 2 * err["llm.int8"]
    # at the default threshold, exactly the injected channels took LLM.int8's float16 path
    assert quantized["llm.int8"].linears["in_proj"].outlier_columns == {2, 9}
    assert quantized["llm.int8"].linears["linear1"].outlier_columns == {2, 9}


# ---- bad input -----------------------------------------------------------------------------------
def test_bad_input():
    block = make_block()
    with pytest.raises(ValueError, match="scheme"):
        quant.quantize_block(block, "int4")
    with pytest.raises(ValueError, match="calib"):
        quant.quantize_block(block, "smoothquant")
    with pytest.raises(ValueError, match="calib"):
        quant.quantize_block(block, "w8a8-tensor", np.zeros((2, 3, 7)))
    with pytest.raises(TypeError, match="alpha"):
        quant.quantize_block(block, "w8a8", alpha=0.5)
    with pytest.raises(ValueError, match="alpha"):
        quant.quantize_block(block, "smoothquant", np.ones((1, 2, 16)), alpha=1.5)
    with pytest.raises(ValueError, match="threshold"):
        quant.quantize_block(block, "llm.int8", threshold=-1)
    with pytest.raises(ValueError, match="eval"):
        quant.quantize_block(make_block().train(), "w8a8")
    with pytest.raises(TypeError, match="float16"):
        quant.quantize_block(make_block(dtype=np.float16), "w8a8")
    with pytest.raises(TypeError, match="model"):
        quant.quantize_block(np.zeros(3), "w8a8")
    with pytest.raises(ValueError, match="x"):
        quant.quantize_block(block, "w8a8")(np.zeros((2, 16)))
    with pytest.raises(ValueError, match="Pre-LN"):
        quant.inject_outliers(make_block(norm_first=False), [0], 8.0)
    with pytest.raises(ValueError, match="channels"):
        quant.inject_outliers(block, [16], 8.0)
    with pytest.raises(ValueError, match="factor"):
        quant.inject_outliers(block, [1], 0.0)
    with pytest.raises(TypeError, match="integer"):
        quant.int_matmul(np.ones((2, 3)), np.ones((2, 3), np.int8))
    with pytest.raises(ValueError, match="K"):
        quant.int_matmul(np.ones((2, 3), np.int8), np.ones((2, 4), np.int8))
    with pytest.raises(ValueError, match="granularity"):
        quant.quantize(np.ones(3), granularity="group")
    with pytest.raises(ValueError, match="bits"):
        quant.quantize(np.ones(3), bits=1)
    with pytest.raises(TypeError, match="x"):
        quant.quantize(np.array(["a"]))
    with pytest.raises(TypeError, match="QTensor"):
        quant.dequantize(np.ones(3))


def test_smoothquant_per_tensor_definition():
    """granularity="tensor": per-tensor weights and a static per-tensor scale of the smoothed X."""
    x, w, b = _lin_case()
    calib = np.abs(x).max(axis=0)
    y = quant.QLinear(w, b, "smoothquant", x_absmax=calib, alpha=0.5, granularity="tensor")(x)
    s = np.sqrt(calib) / np.sqrt(np.abs(w).max(axis=0))
    xs, ws = x / s, w * s
    sx, sw = (calib / s).max() / 127, np.abs(ws).max() / 127
    qx, qw = np.clip(np.rint(xs / sx), -127, 127), np.rint(ws / sw)
    np.testing.assert_allclose(y, (qx @ qw.T) * sx * sw + b, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="granularity"):
        quant.quantize_block(make_block(), "smoothquant", np.ones((1, 2, 16)), granularity="row")


# ---- the chapter's figures -----------------------------------------------------------------------
def test_int8_explorable_is_registered_and_honest():
    from preln.chapters.figures import all_explorables
    from preln.chapters.figures import int8 as fig
    plot, controls = all_explorables()["int8.activation_error"]
    assert plot is fig.plot_activation_error and len(controls) == 3
    med = lambda *a: np.median(np.delete(fig.activation_errors(*a)[0], fig.OUTLIER_CHANNEL))
    # an outlier hurts the other channels per tensor; the decomposition removes the harm
    assert med(8, "per tensor", 64) > 10 * med(8, "per tensor", 1)
    assert med(8, "per token + float outliers", 64) <= med(8, "per token", 64)
    assert med(4, "per token", 1) > med(8, "per token", 1)
    assert "int8" in fig.activation_error_alt(8, "per tensor", 64)


def test_new_int8_figures_are_labelled():
    from preln.chapters import inference as inf
    from preln.quant import qmatvec
    from preln.chapters.figures import int8 as fig
    from tests.figure_checks import assert_labelled
    m = inf.PUBLISHED_MODELS["Llama 3 8B"]
    assert_labelled(fig.plot_weight_bits_decode(m, {"H100": inf.PUBLISHED["H100 SXM"]}, [1, 8, 64], 512))
    rows = [qmatvec.MatvecTiming("float32", 4000, 1e-3, 0.0), qmatvec.MatvecTiming("int8", 1000, 5e-4, 0.0)]
    assert_labelled(fig.plot_matvec(rows, 4e6))
    ppl = {(mth, b, g): 2.0 + 1.0 / b for mth in ("rtn", "gptq", "awq") for b in (3, 4) for g in (8, "row")}
    assert_labelled(fig.plot_weight_only((3, 4), (8, "row"), ppl, 2.0))
    clips = np.linspace(0.1, 1, 5)
    assert_labelled(fig.plot_calibration(clips, {"8-bit": clips ** 2}, {"mse": (0.5, 0.25)}, 8))
