"""The functional core, op by op: float64 central-difference gradient checks and known values.

Every check uses the loss L = sum(out * w) with a random w, so dL/dout = w (preln.gradcheck).
"""
import numpy as np
import pytest

from preln.gradcheck import check_op_gradient, numerical_gradient, rel_error
from preln.ops import (activation_backward, activation_forward, attention_backward, attention_forward,
                       dropout_backward, dropout_forward, gelu, gelu_tanh, layer_norm_backward,
                       layer_norm_forward, linear_backward, linear_forward, merge_heads, relu,
                       softmax, softmax_backward, softmax_forward, split_heads)
from preln.precision import NAIVE, SAFE

#: analytic vs central-difference gradients (eps = 1e-6) of float64 ops; a bug gives > 1e-3
GRAD_RTOL_F64 = 1e-7
#: float64 identities that should hold to a few units of round-off
EXACT_F64 = 1e-13


# ---- gradient checks --------------------------------------------------------------------------
def test_linear_gradients(rng):
    inputs = dict(x=rng.standard_normal((2, 3, 5)), w=rng.standard_normal((4, 5)), b=rng.standard_normal(4))
    errors = check_op_gradient(lambda x, w, b: linear_forward(x, w, b), linear_backward, inputs,
                               ("x", "w", "b"), rng)
    assert max(errors.values()) < GRAD_RTOL_F64, errors


def test_layer_norm_gradients_incl_dgamma_dbeta(rng):
    inputs = dict(x=rng.standard_normal((2, 3, 6)) * 3 + 1, gamma=rng.standard_normal(6),
                  beta=rng.standard_normal(6))
    errors = check_op_gradient(lambda x, gamma, beta: layer_norm_forward(x, gamma, beta, 1e-5),
                               layer_norm_backward, inputs, ("x", "gamma", "beta"), rng)
    assert max(errors.values()) < GRAD_RTOL_F64, errors


@pytest.mark.parametrize("kind", ["gelu", "gelu_tanh", "relu"])
def test_activation_gradients(kind, rng):
    x = rng.standard_normal((3, 7)) * 2
    x[np.abs(x) < 0.05] += 0.1            # relu is not differentiable at 0: keep away from it
    errors = check_op_gradient(lambda x: activation_forward(x, kind), activation_backward,
                               dict(x=x), ("x",), rng)
    assert errors["x"] < GRAD_RTOL_F64


def test_softmax_gradient(rng):
    x = rng.standard_normal((3, 4, 6)) * 3
    errors = check_op_gradient(lambda x: softmax_forward(x), lambda dp, p: softmax_backward(dp, p),
                               dict(x=x), ("x",), rng)
    assert errors["x"] < GRAD_RTOL_F64


def test_softmax_gradient_with_masked_entries(rng):
    bias = np.where(rng.random((3, 6)) < 0.4, -np.inf, 0.0)
    bias[:, 0] = 0.0                      # one visible entry per row
    x = rng.standard_normal((3, 6))
    w = rng.standard_normal((3, 6))
    p, cache = softmax_forward(x + bias)
    analytic = softmax_backward(w, cache)
    numeric = numerical_gradient(lambda a: np.sum(softmax_forward(a + bias)[0] * w), x)
    assert rel_error(analytic, numeric) < GRAD_RTOL_F64
    assert np.all(analytic[np.isinf(bias)] == 0)


def _qkv(rng, B=2, H=2, S=5, dh=3):
    return {name: rng.standard_normal((B, H, S, dh)) for name in ("q", "k", "v")}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_attention_gradients(causal, padding, rng):
    kpm = None
    if padding:
        kpm = np.array([[False, False, False, True, True],
                        [False, True, False, False, True]])
    fwd = lambda q, k, v: attention_forward(q, k, v, kpm, causal)
    errors = check_op_gradient(fwd, attention_backward, _qkv(rng), ("q", "k", "v"), rng)
    assert max(errors.values()) < GRAD_RTOL_F64, errors


def test_attention_gradients_with_dropout_fixed_mask(rng):
    """With a fresh generator of the same seed on every call, each forward draws the same mask."""
    kpm = np.array([[False, False, False, False, True], [False, False, True, False, False]])
    fwd = lambda q, k, v: attention_forward(q, k, v, kpm, True, 0.3, np.random.default_rng(7))
    out, cache = fwd(**_qkv(np.random.default_rng(0)))
    assert cache.drop_mask is not None and not cache.drop_mask.all()   # dropout really drops
    errors = check_op_gradient(fwd, attention_backward, _qkv(rng), ("q", "k", "v"), rng)
    assert max(errors.values()) < GRAD_RTOL_F64, errors


def test_attention_backward_recomputes_p_when_not_kept(rng):
    qkv = _qkv(rng)
    kpm = np.array([[False, True, False, False, False], [False, False, False, False, True]])
    dout = rng.standard_normal(qkv["q"].shape)
    _, kept = attention_forward(**qkv, key_padding_mask=kpm, causal=True)
    _, recompute = attention_forward(**qkv, key_padding_mask=kpm, causal=True, keep_probs=False)
    assert kept.p is not None and recompute.p is None
    for a, b in zip(attention_backward(dout, kept), attention_backward(dout, recompute)):
        np.testing.assert_allclose(a, b, rtol=0, atol=EXACT_F64)


def test_dropout_gradient_fixed_mask(rng):
    fwd = lambda x: dropout_forward(x, 0.4, np.random.default_rng(3))
    out, mask = fwd(rng.standard_normal((4, 6)))
    assert 0 < mask.sum() < mask.size
    errors = check_op_gradient(fwd, lambda d, m: dropout_backward(d, m, 0.4),
                               dict(x=rng.standard_normal((4, 6))), ("x",), rng)
    assert errors["x"] < GRAD_RTOL_F64


def test_split_merge_heads_round_trip(rng):
    x = rng.standard_normal((2, 5, 12))
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(h[:, 1], x[:, :, 4:8])      # head h uses columns h*d_h:(h+1)*d_h
    np.testing.assert_array_equal(merge_heads(h), x)


# ---- known values -------------------------------------------------------------------------------
def test_layer_norm_biased_variance_eps_inside_sqrt():
    """x = [0, 1e-3]: mean 5e-4, biased var 2.5e-7 (unbiased 5e-7), eps = 1e-5 dominates."""
    x = np.array([[0.0, 1e-3]])
    eps = 1e-5
    y, _ = layer_norm_forward(x, np.ones(2), np.zeros(2), eps)
    expected = (x - 5e-4) / np.sqrt(2.5e-7 + eps)                 # biased variance, eps inside
    np.testing.assert_allclose(y, expected, rtol=EXACT_F64)
    assert y[0, 1] == pytest.approx(5e-4 / np.sqrt(1.025e-5), rel=1e-12)    # = 0.156173...
    unbiased = (x - 5e-4) / np.sqrt(5e-7 + eps)
    eps_outside = (x - 5e-4) / (np.sqrt(2.5e-7) + eps)
    assert np.abs(y - unbiased).max() > 1e-3                      # would differ: 0.1562 vs 0.1543
    assert np.abs(y - eps_outside).max() > 0.5                    # would differ: 0.1562 vs 0.9804


def test_layer_norm_hand_made_input_with_gamma_beta():
    x = np.array([[1.0, 2.0, 3.0, 4.0]])              # mean 2.5, biased var 1.25
    gamma, beta = np.array([1.0, 2.0, 0.5, -1.0]), np.array([0.0, 1.0, -1.0, 0.5])
    y, cache = layer_norm_forward(x, gamma, beta, 1e-5)
    np.testing.assert_allclose(y, (x - 2.5) / np.sqrt(1.25 + 1e-5) * gamma + beta, rtol=EXACT_F64)
    assert cache.mean.item() == 2.5 and cache.rstd.item() == pytest.approx(1 / np.sqrt(1.25 + 1e-5))


def test_gelu_known_values():
    assert gelu(np.array(1.0)) == pytest.approx(0.8413447460685429, rel=1e-15, abs=0)
    assert gelu(np.array(-1.0)) == pytest.approx(-0.15865525393145707, rel=1e-15, abs=0)
    assert gelu(np.array(0.0)) == 0.0
    assert relu(np.array([-2.0, 0.0, 3.0])).tolist() == [0.0, 0.0, 3.0]


def test_gelu_tanh_max_difference_near_minus_2_7():
    """The exact and tanh GELUs (Hendrycks & Gimpel 2016) differ by at most 4.7e-4, near x = -2.7:
    the value the derivation chapter measures and glues."""
    x = np.arange(-10.0, 10.0, 1e-5)
    diff = np.abs(gelu(x) - gelu_tanh(x))
    i = diff.argmax()
    assert diff[i] == pytest.approx(4.7e-4, abs=0.05e-4)          # measured 4.7324e-4
    assert x[i] == pytest.approx(-2.7, abs=0.05)                  # measured -2.6989


def test_softmax_fully_masked_row_is_zero_not_nan():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]])
    for policy in (SAFE, NAIVE):
        p = softmax(x, policy=policy)
        assert not np.isnan(p).any()
        np.testing.assert_array_equal(p[0], 0.0)
        np.testing.assert_allclose(p[1], [0.5, 0.0, 0.5])


def test_attention_fully_masked_query_gives_zero_output_and_gradient(rng):
    qkv = _qkv(rng)
    kpm = np.zeros((2, 5), bool)
    kpm[1] = True                                             # every key of batch 1 is padding
    out, cache = attention_forward(**qkv, key_padding_mask=kpm)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[1], 0.0)
    dq, dk, dv = attention_backward(rng.standard_normal(out.shape), cache)
    for g in (dq, dk, dv):
        assert np.isfinite(g).all()
        np.testing.assert_array_equal(g[1], 0.0)


def test_dropout_p0_is_identity_and_draws_nothing(rng):
    x = rng.standard_normal((3, 4))
    gen = np.random.default_rng(0)
    state = gen.bit_generator.state
    out, mask = dropout_forward(x, 0.0, gen)
    assert out is x and mask is None
    assert gen.bit_generator.state == state
    np.testing.assert_array_equal(dropout_backward(x, None, 0.0), x)


def test_dropout_keeps_expectation():
    """Inverted dropout: E[dropout(x)] = x. Mean of 10^6 draws of dropout(1) with p = 0.3."""
    p, n = 0.3, 1_000_000
    out, mask = dropout_forward(np.ones(n), p, np.random.default_rng(11))
    sigma = np.sqrt(p / (1 - p) / n)                  # std of the mean: Var = p/(1-p) per element
    assert abs(out.mean() - 1.0) < 5 * sigma
    assert abs((~mask).mean() - p) < 5 * np.sqrt(p * (1 - p) / n)
    assert set(np.unique(out)) == {0.0, 1 / (1 - p)}


def test_dropout_reuses_a_given_mask(rng):
    x = rng.standard_normal((3, 4))
    mask = rng.random((3, 4)) < 0.5
    out, same = dropout_forward(x, 0.5, None, mask)
    assert same is mask
    np.testing.assert_array_equal(out, x * mask * 2.0)
