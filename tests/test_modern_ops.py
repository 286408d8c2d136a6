"""The modern block's ops: RMSNorm, SiLU / SwiGLU, RoPE and grouped-query attention.

Each backward is checked against central differences in float64 (preln.gradcheck), and each op's
defining properties are checked for every input hypothesis draws: RoPE's score between positions
m and n depends on m - n alone, rotations keep norms, the backward is the inverse rotation; RMSNorm
ignores the input's scale; GQA equals multi-head attention on repeated keys and values.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preln.gradcheck import check_op_gradient, rel_error
from preln.ops import (attention_backward, attention_forward, flash_attention_forward, layer_norm_forward,
                       repeat_kv, rms_norm_backward, rms_norm_forward, rope_backward, rope_cos_sin,
                       rope_forward, rotate_half, silu, silu_backward, silu_forward, swiglu_backward,
                       swiglu_forward)
from preln.ops.rope import rope_frequencies
from preln.precision import BFLOAT16, NAIVE

#: analytic vs central-difference gradients (eps = 1e-6) in float64, rel_error
GRAD_TOL = 1e-7
#: two float64 computations of the same quantity in another order
SAME_F64 = 1e-12
#: 16-bit storage against float64: a few units of the format's epsilon
F16_TOL, BF16_TOL = 4e-3, 3e-2
PROPERTY_SETTINGS = settings(max_examples=40, deadline=None)


def grads_ok(errors):
    bad = {k: v for k, v in errors.items() if not v < GRAD_TOL}
    assert not bad, bad


# ---- RMSNorm -------------------------------------------------------------------------------------
def test_rms_norm_forward_is_the_formula(rng):
    x = rng.standard_normal((3, 5, 16))
    gamma = rng.standard_normal(16)
    y, cache = rms_norm_forward(x, gamma, 1e-6)
    expected = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * gamma
    assert rel_error(y, expected) < SAME_F64
    assert cache.rrms.shape == (3, 5, 1) and cache.x is x     # only what the backward needs


def test_rms_norm_eps_inside_the_square_root():
    x = np.zeros((1, 4))
    x[0, 0] = 1e-4                       # mean square 2.5e-9, far below eps
    y, _ = rms_norm_forward(x, np.ones(4), 1e-2)
    assert y[0, 0] == pytest.approx(1e-4 / np.sqrt(2.5e-9 + 1e-2), rel=1e-12)


@pytest.mark.parametrize("shape", [(2, 3, 8), (5, 8)])
def test_rms_norm_gradients(shape, rng):
    x = 2 * rng.standard_normal(shape) + 0.5
    gamma = 1 + 0.3 * rng.standard_normal(shape[-1])
    grads_ok(check_op_gradient(lambda x, gamma: rms_norm_forward(x, gamma, 1e-5), rms_norm_backward,
                               dict(x=x, gamma=gamma), ["x", "gamma"], rng))


def test_rms_norm_jacobian_is_layernorm_without_centring(rng):
    """d xhat/dx = r (I - xhat xhat^T / D) for RMSNorm; LayerNorm's has an extra -r 11^T / D."""
    D = 6
    x = rng.standard_normal(D) + 1.0
    J = np.stack([rms_norm_backward(e[None], rms_norm_forward(x[None], np.ones(D), 0.0)[1])[0][0]
                  for e in np.eye(D)])                          # row i = d y_i / dx
    r = 1 / np.sqrt((x ** 2).mean())
    xhat = x * r
    assert rel_error(J, r * (np.eye(D) - np.outer(xhat, xhat) / D)) < SAME_F64
    # on a zero-mean row LayerNorm and RMSNorm agree: the centring is all they differ by
    xc = x - x.mean()
    ln, _ = layer_norm_forward(xc[None], np.ones(D), np.zeros(D), 0.0)
    rms, _ = rms_norm_forward(xc[None], np.ones(D), 0.0)
    assert rel_error(ln, rms) < SAME_F64


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), c=st.floats(1e-3, 1e3))
def test_rms_norm_ignores_the_scale_of_its_input(seed, c):
    x = np.random.default_rng(seed).standard_normal((3, 12))
    gamma = np.random.default_rng(seed + 1).standard_normal(12)
    y1, _ = rms_norm_forward(x, gamma, 0.0)
    y2, _ = rms_norm_forward(c * x, gamma, 0.0)
    assert rel_error(y1, y2) < SAME_F64
    assert np.sqrt((rms_norm_forward(x, np.ones(12), 0.0)[0] ** 2).mean(-1)) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("dtype, tol", [(np.float16, F16_TOL), (BFLOAT16, BF16_TOL)], ids=["float16", "bfloat16"])
def test_rms_norm_16bit_statistic_in_float32(dtype, tol, rng):
    """300^2 * 16 overflows float16's 65504 as a 16-bit sum of squares; the safe policy sums in
    float32 and gets the float64 answer to the format's precision. The naive one returns 0."""
    x = 300 + 10 * rng.standard_normal((4, 16))
    gamma = np.ones(16)
    ref, _ = rms_norm_forward(x, gamma, 1e-6)
    y, cache = rms_norm_forward(x.astype(dtype), gamma.astype(dtype), 1e-6)
    assert y.dtype == dtype and cache.rrms.dtype == np.float32
    assert rel_error(y.astype(np.float64), ref) < tol
    if dtype == np.float16:
        with np.errstate(over="ignore"):                              # the overflow is the point
            y_naive, _ = rms_norm_forward(x.astype(dtype), gamma.astype(dtype), 1e-6, NAIVE)
        assert (y_naive == 0).all()                                   # rrms = 1 / sqrt(inf) = 0
    dx, dgamma = rms_norm_backward(np.ones_like(y), cache)
    assert dx.dtype == dtype and dgamma.dtype == dtype and np.isfinite(dx.astype(np.float32)).all()


# ---- SiLU and SwiGLU -----------------------------------------------------------------------------
def test_silu_values_and_gradient(rng):
    a = np.array([-800.0, -30.0, -1.0, 0.0, 1.0, 30.0, 800.0])     # no overflow warning at the ends
    with np.errstate(all="raise"):
        s = silu(a)
    assert s[3] == 0 and s[-1] == 800.0 and s[0] == 0.0
    assert s[4] == pytest.approx(1 / (1 + np.exp(-1.0)), rel=1e-15)
    x = 3 * rng.standard_normal((4, 6))
    grads_ok(check_op_gradient(silu_forward, silu_backward, dict(a=x), ["a"], rng))


def test_swiglu_forward_is_the_formula(rng):
    x = rng.standard_normal((2, 3, 8))
    wg, wu, wd = rng.standard_normal((12, 8)), rng.standard_normal((12, 8)), rng.standard_normal((8, 12))
    y, cache = swiglu_forward(x, wg, wu, wd)
    a, b = x @ wg.T, x @ wu.T
    assert rel_error(y, (a / (1 + np.exp(-a)) * b) @ wd.T) < SAME_F64
    assert rel_error(cache.a, a) < SAME_F64 and rel_error(cache.b, b) < SAME_F64


def test_swiglu_gradients(rng):
    x = rng.standard_normal((2, 3, 8))
    inputs = dict(x=x, w_gate=rng.standard_normal((12, 8)), w_up=rng.standard_normal((12, 8)),
                  w_down=rng.standard_normal((8, 12)))
    grads_ok(check_op_gradient(swiglu_forward, swiglu_backward, inputs,
                               ["x", "w_gate", "w_up", "w_down"], rng))


def test_swiglu_16bit_is_close_to_float64(rng):
    x = rng.standard_normal((4, 8))
    ws = [0.3 * rng.standard_normal(s) for s in ((12, 8), (12, 8), (8, 12))]
    ref, _ = swiglu_forward(x, *ws)
    y, cache = swiglu_forward(x.astype(np.float16), *(w.astype(np.float16) for w in ws))
    assert y.dtype == np.float16 and rel_error(y.astype(np.float64), ref) < F16_TOL
    grads = swiglu_backward(np.ones_like(y), cache)
    assert all(g.dtype == np.float16 for g in grads)


# ---- RoPE ----------------------------------------------------------------------------------------
def test_rope_tables_follow_transformers_formula():
    cos, sin = rope_cos_sin(np.arange(5), 8, 10000.0)
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, 8, 2) / 8))
    angle = np.arange(5)[:, None] * inv_freq
    assert cos.shape == (5, 8)
    np.testing.assert_array_equal(cos, np.cos(np.concatenate([angle, angle], -1)))
    np.testing.assert_array_equal(sin, np.sin(np.concatenate([angle, angle], -1)))
    np.testing.assert_array_equal(rope_frequencies(8), inv_freq)
    cos_b, _ = rope_cos_sin(np.array([[0, 1, 2], [5, 6, 7]]), 8)
    assert cos_b.shape == (2, 1, 3, 8)                               # one row per sequence


def test_rotate_half_pairs_i_with_i_plus_half():
    x = np.arange(1.0, 7.0)                                          # (x1 | x2) = (1 2 3 | 4 5 6)
    np.testing.assert_array_equal(rotate_half(x), [-4, -5, -6, 1, 2, 3])
    np.testing.assert_array_equal(rotate_half(rotate_half(x)), -x)   # two quarter turns


def test_rope_gradient(rng):
    x = rng.standard_normal((2, 3, 5, 8))
    for positions in (np.arange(4, 9), np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])):
        grads_ok(check_op_gradient(lambda x: rope_forward(x, positions, 100.0), rope_backward,
                                   dict(x=x), ["x"], rng))


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), m=st.integers(0, 4096), n=st.integers(0, 4096),
       shift=st.integers(-4096, 4096), d_half=st.integers(1, 16),
       theta=st.sampled_from([100.0, 10000.0, 500000.0]))
def test_rope_score_depends_only_on_the_offset(seed, m, n, shift, d_half, theta):
    """<R_m q, R_n k> = <R_(m+c) q, R_(n+c) k> for any shift c: the score sees m - n only."""
    shift = max(shift, -min(m, n))                                   # positions stay >= 0
    rng = np.random.default_rng(seed)
    d = 2 * d_half
    q, k = rng.standard_normal((1, 1, 1, d)), rng.standard_normal((1, 1, 1, d))

    def score(pm, pn):
        return float(np.sum(rope_forward(q, [pm], theta)[0] * rope_forward(k, [pn], theta)[0]))

    scale = np.linalg.norm(q) * np.linalg.norm(k)
    # angles up to ~8000 rad: cos/sin of them carry ~8000 * 2^-53 of round-off
    assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-11 * scale
    assert abs(score(m, n) - score(m - n + 4096, 4096)) < 1e-11 * scale if m >= n else True


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), S=st.integers(1, 8), d_half=st.integers(1, 8),
       start=st.integers(0, 10 ** 5))
def test_rope_is_a_rotation(seed, S, d_half, start):
    """|R x| = |x| for each head vector, and the backward is R^T = R^(-1): it undoes the forward."""
    x = np.random.default_rng(seed).standard_normal((2, 3, S, 2 * d_half))
    pos = np.arange(start, start + S)
    out, cache = rope_forward(x, pos)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-13)
    assert rel_error(rope_backward(out, cache), x) < SAME_F64
    # pair i is the 2-D rotation of (x_i, x_{i + d/2}) by the angle p w_i
    w = rope_frequencies(2 * d_half)
    ang = pos[:, None] * w                                              # (S, d/2)
    x1, x2 = x[..., :d_half], x[..., d_half:]
    assert rel_error(out[..., :d_half], x1 * np.cos(ang) - x2 * np.sin(ang)) < SAME_F64
    assert rel_error(out[..., d_half:], x2 * np.cos(ang) + x1 * np.sin(ang)) < SAME_F64


def test_rope_at_position_zero_is_the_identity(rng):
    x = rng.standard_normal((1, 2, 1, 6))
    np.testing.assert_array_equal(rope_forward(x, [0])[0], x)


@pytest.mark.parametrize("bad, match", [
    (dict(x=np.zeros((1, 1, 3, 5)), positions=np.arange(3)), "even head width"),
    (dict(x=np.zeros((1, 1, 3, 4)), positions=np.arange(4)), r"positions: expected shape \(S,\)"),
    (dict(x=np.zeros((1, 1, 3, 4)), positions=np.array([0.0, 1.0, 2.0])), "integer"),
    (dict(x=np.zeros((1, 1, 3, 4)), positions=np.array([-1, 0, 1])), ">= 0"),
    (dict(x=np.zeros((3, 4)), positions=np.arange(3)), "4-D"),
    (dict(x=np.zeros((1, 1, 3, 4)), positions=np.arange(3), theta=1.0), "theta"),
])
def test_rope_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        rope_forward(**bad)


# ---- grouped-query attention --------------------------------------------------------------------
def qkv(rng, B=2, H=4, H_kv=2, S=5, dh=6):
    return (rng.standard_normal((B, H, S, dh)), rng.standard_normal((B, H_kv, S, dh)),
            rng.standard_normal((B, H_kv, S, dh)))


KPM = np.array([[False, False, False, False, True], [False, True, False, False, False]])


@pytest.mark.parametrize("n_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("fused", [False, True], ids=["numpy", "fused"])
def test_grouped_attention_gradients(n_kv, fused, rng):
    q, k, v = qkv(rng, H_kv=n_kv)
    for kpm, causal in ((None, True), (KPM, True), (KPM, False)):
        errors = check_op_gradient(
            lambda q, k, v: attention_forward(q, k, v, kpm, causal, fused=fused),
            lambda d, c: attention_backward(d, c, fused=fused), dict(q=q, k=k, v=v), ["q", "k", "v"], rng)
        grads_ok(errors)


@pytest.mark.parametrize("n_kv", [2, 1], ids=["GQA", "MQA"])
def test_grouped_attention_is_mha_on_repeated_heads(n_kv, rng):
    """Forward: GQA = MHA on repeat_kv(k), repeat_kv(v). Backward: dk, dv of a shared head are the
    sums of the repeated heads' gradients over its group."""
    q, k, v = qkv(rng, H_kv=n_kv)
    G = q.shape[1] // n_kv
    dout = rng.standard_normal(q.shape)
    out, cache = attention_forward(q, k, v, KPM, True)
    out_rep, cache_rep = attention_forward(q, repeat_kv(k, G), repeat_kv(v, G), KPM, True)
    assert rel_error(out, out_rep) < SAME_F64
    dq, dk, dv = attention_backward(dout, cache)
    dq_r, dk_r, dv_r = attention_backward(dout, cache_rep)
    B, _, S, dh = k.shape
    assert dk.shape == k.shape and dv.shape == v.shape
    assert rel_error(dq, dq_r) < SAME_F64
    assert rel_error(dk, dk_r.reshape(B, n_kv, G, S, dh).sum(2)) < SAME_F64
    assert rel_error(dv, dv_r.reshape(B, n_kv, G, S, dh).sum(2)) < SAME_F64
    rep = repeat_kv(k, G)
    for h in range(q.shape[1]):                                 # query head h reads k/v head h // G
        np.testing.assert_array_equal(rep[:, h], k[:, h // G])


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), n_kv=st.sampled_from([1, 2, 4]), S=st.integers(1, 9),
       causal=st.booleans(), q_tile=st.integers(1, 4), k_tile=st.integers(1, 4))
def test_grouped_tiled_attention_equals_plain(seed, n_kv, S, causal, q_tile, k_tile):
    q, k, v = qkv(np.random.default_rng(seed), H_kv=n_kv, S=S)
    plain, _ = attention_forward(q, k, v, None, causal)
    fused, _ = attention_forward(q, k, v, None, causal, fused=True)
    tiled = flash_attention_forward(q, k, v, None, causal, q_tile=q_tile, k_tile=k_tile)
    assert rel_error(tiled, plain) < SAME_F64 and rel_error(fused, plain) < SAME_F64


def test_grouped_attention_bad_heads(rng):
    q, k, v = qkv(rng, H=4, H_kv=3)
    with pytest.raises(ValueError, match="dividing the H = 4 query heads; got H_kv = 3"):
        attention_forward(q, k, v)
    with pytest.raises(ValueError, match="dividing"):
        flash_attention_forward(q, k, v)
    q, k, v = qkv(rng, H=4, H_kv=2)
    with pytest.raises(ValueError, match="v: expected the shape of k"):
        attention_forward(q, k, v[:, :1])

