"""The fused kernels (preln.ops.fused) equal the unfused ops they replace to round-off, for float32
and float64, with masks, at the edges (underflowing exp, fully masked rows, large |x| in GELU);
the block takes the fused path exactly where it should, and its forward and gradients agree with
the op-by-op path."""
import numpy as np
import pytest

from preln import BlockConfig, TransformerBlock
from preln.gradcheck import numerical_gradient, rel_error
from preln.ops.fused import _numba
from preln.ops import (activation_backward, activation_forward, fused, layer_norm_backward,
                       layer_norm_forward, mask_bias, softmax_backward, softmax_forward)
from preln.precision import BFLOAT16

#: fused vs unfused, max|a - b| / max(1, max|b|): the same math in another order (and, in float32,
#: exp and Phi as polynomials with ~1 ulp of error where numpy's are ~1 ulp too)
ROUNDOFF = {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 2e-6}
#: float32 GELU: A&S 7.1.26 has |error| <= 1.5e-7 in erfc, the same formula on both paths
GELU_F32 = 2e-6
#: the float32 exp polynomial against float64 exp, relative, over the normal range: a few units of
#: float32's 2^-23 (numpy's own float32 exp is within 1)
EXP_F32_RTOL = 4e-7
GRAD_RTOL_F64 = 1e-7
DTYPES = [np.float64, np.float32]
IDS = ["float64", "float32"]


def err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


# ---- kernels against the ops -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_layer_norm_equals_unfused(dtype, rng):
    x = (3 + 5 * rng.standard_normal((3, 7, 48))).astype(dtype)     # an offset mean, a wide spread
    gamma, beta = rng.standard_normal(48).astype(dtype), rng.standard_normal(48).astype(dtype)
    y, c = fused.layer_norm(x, gamma, beta, 1e-5)
    y_ref, c_ref = layer_norm_forward(x, gamma, beta, 1e-5)
    tol = ROUNDOFF[np.dtype(dtype)]
    assert y.dtype == dtype and y.shape == x.shape and c.mean.shape == (3, 7, 1)
    assert err(y, y_ref) < tol
    assert err(c.mean, c_ref.mean) < tol and err(c.rstd, c_ref.rstd) < tol
    assert c.x is x and c.mean.dtype == c_ref.mean.dtype == dtype
    dy = rng.standard_normal(x.shape).astype(dtype)                    # the same backward applies
    for a, b in zip(layer_norm_backward(dy, c), layer_norm_backward(dy, c_ref)):
        assert err(a, b) < 10 * tol


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_add_layer_norm_equals_residual_then_unfused(dtype, rng):
    x, a = (rng.standard_normal((2, 5, 32)).astype(dtype) for _ in range(2))
    b, gamma, beta = (rng.standard_normal(32).astype(dtype) for _ in range(3))
    r, y, c = fused.add_layer_norm(x, a, b, gamma, beta, 1e-5)
    r_ref = x + (a + b)
    y_ref, c_ref = layer_norm_forward(r_ref, gamma, beta, 1e-5)
    assert r.shape == y.shape == x.shape
    assert err(r, r_ref) < ROUNDOFF[np.dtype(dtype)]                  # summed in another order
    assert err(y, y_ref) < ROUNDOFF[np.dtype(dtype)]
    assert c.x is r and err(c.rstd, c_ref.rstd) < ROUNDOFF[np.dtype(dtype)]
    _, y0, _ = fused.add_layer_norm(x, a, None, gamma, beta)          # bias=None adds nothing
    assert err(y0, layer_norm_forward(x + a, gamma, beta)[0]) < ROUNDOFF[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bias_residual(dtype, rng):
    x, z = (rng.standard_normal((2, 3, 16)).astype(dtype) for _ in range(2))
    b = rng.standard_normal(16).astype(dtype)
    np.testing.assert_array_equal(fused.bias_residual(x, z, b), x + (z + b))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bias_gelu_and_its_backward_equal_unfused(dtype, rng):
    u0 = (4 * rng.standard_normal((3, 5, 64))).astype(dtype)
    u0[0, 0, :6] = [-40, -9, -5.5, 0, 5.5, 40]                         # tails and 0
    b = rng.standard_normal(64).astype(dtype)
    b[:6] = 0
    u_ref = u0 + b
    g_ref, c_ref = activation_forward(u_ref, "gelu")
    g, c = fused.bias_gelu(u0.copy(), b)
    tol = GELU_F32 if dtype == np.float32 else ROUNDOFF[np.dtype(dtype)]
    assert g.dtype == dtype and c.kind == "gelu"
    np.testing.assert_array_equal(c.x, u_ref)                          # u = u0 + b, kept
    assert err(g, g_ref) < tol and err(c.cdf, c_ref.cdf) < tol
    assert g[0, 0, 0] == 0 and g[0, 0, 3] == 0 and g[0, 0, 5] == u_ref[0, 0, 5]   # -40, 0, +40
    dg = rng.standard_normal(u0.shape).astype(dtype)
    assert err(fused.gelu_backward(dg, c), activation_backward(dg, c_ref)) < tol
    u_mine = u0.copy()
    g_eval, none = fused.bias_gelu(u_mine, b, keep=False)              # inference: g over u0
    assert none is None and np.shares_memory(g_eval, u_mine)
    assert err(g_eval, g_ref) < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "padding+causal", "offset"])
def test_softmax_equals_scaled_masked_unfused(dtype, mask, rng):
    B, H, Sq, Sk = 2, 3, 5, 9
    s = (6 * rng.standard_normal((B, H, Sq, Sk))).astype(dtype)
    kpm = None
    if "padding" in mask:
        kpm = np.zeros((B, Sk), bool)
        kpm[0, -3:] = True
        kpm[1, 0] = True
    causal = "causal" in mask or mask == "offset"
    q0 = Sk - Sq if mask == "offset" else 0                            # queries are the last Sq
    p = fused.softmax(s, 0.25, kpm, causal, q0)
    bias = mask_bias(kpm, causal, Sq, Sk, q0)
    p_ref, _ = softmax_forward(s * dtype(0.25) + (0 if bias is None else bias.astype(dtype)))
    assert p.dtype == dtype and p.shape == s.shape
    assert err(p, p_ref) < ROUNDOFF[np.dtype(dtype)]
    if bias is not None:
        assert (p[np.broadcast_to(bias, p.shape) == -np.inf] == 0).all()   # masked keys: exactly 0
    dp = rng.standard_normal(p.shape).astype(dtype)
    assert err(fused.softmax_backward(dp, p), softmax_backward(dp, p)) < ROUNDOFF[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_softmax_edges(dtype):
    s = np.zeros((1, 1, 3, 4), dtype)
    s[0, 0, 0] = [0, -200, -1000, 3]                                   # exp underflows to 0
    s[0, 0, 1] = [1e4, 1e4, -1e4, 0]                                   # huge logits: max subtracted
    kpm = np.array([[False, False, False, False]])
    p = fused.softmax(s, 1.0, kpm)
    p_ref, _ = softmax_forward(s)
    assert err(p, p_ref) < ROUNDOFF[np.dtype(dtype)] and np.isfinite(p).all()
    np.testing.assert_allclose(p.sum(-1), 1, rtol=ROUNDOFF[np.dtype(dtype)])
    allpad = fused.softmax(s, 1.0, np.ones((1, 4), bool))             # no visible key: zeros, no NaN
    np.testing.assert_array_equal(allpad, 0)
    with pytest.raises(ValueError, match=r"s: expected a 4-D \(B, H, Sq, Sk\) array"):
        fused.softmax(s[0])


def test_exp32_polynomial_accuracy():
    """The vectorisable float32 exp against float64 exp over the whole normal range (the kernels
    take exp of numbers <= 0; the positive side is checked up to where 2^k stays a float32)."""
    x = np.concatenate([np.linspace(-87.3, 88.3, 2001), [-1e-30, 0.0, 1e-30]]).astype(np.float32)
    ours = np.array([_numba.exp32(v) for v in x], np.float64)          # scalar calls
    ref = np.exp(x.astype(np.float64))
    assert (np.abs(ours - ref) / ref).max() < EXP_F32_RTOL
    assert _numba.exp32(np.float32(-100)) == 0 and _numba.exp32(np.float32(0)) == 1
    assert _numba.exp32(np.float32(89)) == np.inf


# ---- the block -------------------------------------------------------------------------------------
def _pair(dtype=np.float64, **config):
    cfg = BlockConfig(d_model=16, n_heads=4, d_ff=32, **config)
    fast = TransformerBlock(cfg, dtype=dtype, seed=3)
    slow = TransformerBlock(cfg, dtype=dtype, seed=3, fused=False)
    return fast, slow


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
@pytest.mark.parametrize("variant", ["plain", "causal+padding", "relu", "eval"])
def test_block_fused_equals_unfused_forward_and_backward(dtype, norm_first, variant, rng):
    config = dict(norm_first=norm_first, causal="causal" in variant,
                  activation="relu" if variant == "relu" else "gelu")
    fast, slow = _pair(dtype, **config)
    if variant == "eval":
        fast.eval(), slow.eval()
    x = rng.standard_normal((2, 6, 16)).astype(dtype)
    kpm = np.array([[False] * 5 + [True], [False] * 6]) if "padding" in variant else None
    dy = rng.standard_normal(x.shape).astype(dtype)
    assert fast.fuses() and not slow.fuses()
    y, y_ref = fast(x, kpm), slow(x, kpm)
    assert fast.cache.fused and not slow.cache.fused
    tol = ROUNDOFF[np.dtype(dtype)]
    assert err(y, y_ref) < tol
    assert fast.cache_nbytes() == slow.cache_nbytes()                 # the same tensors are kept
    assert err(fast.backward(dy), slow.backward(dy)) < 10 * tol
    for k in fast.grads:
        assert err(fast.grads[k], slow.grads[k]) < 10 * tol, k


@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_fused_block_gradients_against_central_differences(norm_first, rng):
    fast, _ = _pair(norm_first=norm_first, causal=True)
    x, w = rng.standard_normal((2, 4, 16)), rng.standard_normal((2, 4, 16))
    fast(x)
    dx = fast.backward(w)
    assert rel_error(dx, numerical_gradient(lambda v: float(np.sum(fast(v) * w)), x)) < GRAD_RTOL_F64


@pytest.mark.parametrize("case", ["float16", "bfloat16", "naive", "trace", "check_finite",
                                  "dropout", "fused=False"])
def test_block_keeps_the_op_by_op_path_where_it_must(case):
    cfg = BlockConfig(d_model=16, n_heads=4, d_ff=32, dropout=0.1 if case == "dropout" else 0.0)
    kwargs = {"float16": dict(dtype=np.float16), "bfloat16": dict(dtype=BFLOAT16),
              "naive": dict(policy="naive"), "trace": dict(trace=True),
              "check_finite": dict(check_finite=True), "dropout": {},
              "fused=False": dict(fused=False)}[case]
    block = TransformerBlock(cfg, **kwargs)
    assert not block.fuses()
    block(np.ones((1, 3, 16)))
    assert not block.cache.fused
    if case == "dropout":
        assert block.eval().fuses()                                    # eval: no dropout, fused


def test_fused_argument_is_checked():
    with pytest.raises(TypeError, match="fused: expected True or False; got 'yes'"):
        TransformerBlock(BlockConfig(d_model=16, n_heads=4, d_ff=32), fused="yes")
