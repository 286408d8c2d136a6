"""Properties that hold for every input (hypothesis): softmax is a distribution, causality,
key padding, and shapes/dtypes preserved for all four storage dtypes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from preln import BlockConfig, SUPPORTED_DTYPES, TransformerBlock
from preln.ops import softmax
from preln.precision import BFLOAT16

PROPERTY_SETTINGS = settings(max_examples=25, deadline=None)
#: rows of a float64 softmax sum to 1 within a few units of round-off (S <= 64 terms)
SUM_TOL = {np.float64: 1e-13, np.float32: 1e-5}
#: positions unaffected by a change must be bit-identical; allow float64 round-off for BLAS blocking
SAME_F64 = 1e-12

#: the largest logits drawn: exp of their differences overflows unless the row max is subtracted
BIG = {np.float64: 1e300, np.float32: float(np.float32(1e30))}

D, H, F = 8, 2, 16
_BLOCKS = {}


def block(dtype=np.float64, **config):
    """Blocks are cached per (dtype, config): building one per example would dominate the time."""
    key = (np.dtype(dtype).name, tuple(sorted(config.items())))
    if key not in _BLOCKS:
        _BLOCKS[key] = TransformerBlock(BlockConfig(d_model=D, n_heads=H, d_ff=F, **config),
                                        dtype=dtype, seed=7)
    return _BLOCKS[key].eval() if config.get("_eval") else _BLOCKS[key]


def _x(seed, B, S):
    return np.random.default_rng(seed).standard_normal((B, S, D))


@PROPERTY_SETTINGS
@given(st.sampled_from([np.float64, np.float32]).flatmap(
    lambda dt: arrays(dt, st.tuples(st.integers(1, 4), st.integers(1, 64)),
                      elements=st.floats(-BIG[dt], BIG[dt],
                                         allow_nan=False, allow_infinity=False,
                                         width=32 if dt is np.float32 else 64))))
def test_softmax_rows_are_distributions(x):
    p = softmax(x)
    assert p.shape == x.shape and p.dtype == x.dtype
    assert np.isfinite(p).all()
    assert ((p >= 0) & (p <= 1)).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=SUM_TOL[x.dtype.type])
    assert (p[np.arange(len(x)), x.argmax(-1)] == p.max(-1)).all()   # the largest logit wins


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), S=st.integers(2, 12), data=st.data(),
       norm_first=st.booleans(), tiled=st.booleans())
def test_causal_output_ignores_the_future(seed, S, data, norm_first, tiled):
    t = data.draw(st.integers(0, S - 2), label="t")
    b = block(causal=True, norm_first=norm_first)
    b.train(not tiled)                      # eval runs the tiled attention, training the plain one
    x = _x(seed, 2, S)
    x2 = x.copy()
    x2[:, t + 1:] = np.random.default_rng(seed + 1).standard_normal(x2[:, t + 1:].shape) * 10
    y, y2 = b(x), b(x2)
    np.testing.assert_allclose(y2[:, :t + 1], y[:, :t + 1], rtol=0, atol=SAME_F64)
    assert np.abs(y2[:, t + 1:] - y[:, t + 1:]).max() > 1e-6     # the future did change


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), S=st.integers(2, 10), data=st.data(),
       norm_first=st.booleans(), causal=st.booleans())
def test_padded_key_input_does_not_reach_other_positions(seed, S, data, norm_first, causal):
    """Changing x at a padded position j changes no output except row j itself: j is masked as a
    key for every query, and padded *query* rows are computed like any other row (as PyTorch)."""
    B = 2
    kpm = np.array(data.draw(arrays(bool, (B, S)), label="kpm"))
    j = data.draw(st.integers(0, S - 1), label="j")
    kpm[:, j] = True
    b = block(causal=causal, norm_first=norm_first).train()
    x = _x(seed, B, S)
    x2 = x.copy()
    x2[:, j] += 3.0 * np.random.default_rng(seed + 1).standard_normal((B, D))  # LN cancels a constant
    y, y2 = b(x, kpm), b(x2, kpm)
    assert np.isfinite(y).all() and np.isfinite(y2).all()
    others = np.arange(S) != j
    np.testing.assert_allclose(y2[:, others], y[:, others], rtol=0, atol=SAME_F64)
    assert np.abs(y2[:, j] - y[:, j]).max() > 1e-6             # row j is computed, not zeroed


@PROPERTY_SETTINGS
@given(dtype=st.sampled_from(SUPPORTED_DTYPES), B=st.integers(1, 3), S=st.integers(1, 9),
       training=st.booleans(), use_mask=st.booleans(), seed=st.integers(0, 1000))
def test_shapes_and_dtypes_preserved(dtype, B, S, training, use_mask, seed):
    b = block(dtype, dropout=0.1).train(training)
    b.zero_grad()
    x = _x(seed, B, S).astype(dtype)
    kpm = (np.random.default_rng(seed).random((B, S)) < 0.3) if use_mask else None
    y = b(x, kpm)
    assert y.shape == (B, S, D) and y.dtype == dtype
    assert np.isfinite(y.astype(np.float64)).all()
    dx = b.backward(np.ones_like(y))
    assert dx.shape == (B, S, D) and dx.dtype == dtype
    for name, g in b.grads.items():
        assert g.dtype == dtype and g.shape == b.params[name].shape, name


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=lambda d: np.dtype(d).name)
def test_float64_input_is_cast_to_the_block_dtype(dtype):
    b = block(dtype)
    y = b(_x(0, 1, 3))                            # float64 x into a 16/32-bit block
    assert y.dtype == dtype == b.params["linear1.weight"].dtype


def test_each_supported_dtype_builds_a_block_from_its_name():
    """The parametrisations above run over SUPPORTED_DTYPES; each, named as a learner names it
    ("bfloat16"), gives a block storing that dtype (not a silent float64 one)."""
    assert [np.dtype(d).name for d in SUPPORTED_DTYPES] == ["float64", "float32", "float16", "bfloat16"]
    for d in SUPPORTED_DTYPES:
        b = TransformerBlock(BlockConfig(d_model=D, n_heads=H, d_ff=F), dtype=np.dtype(d).name)
        assert b.dtype == d and b.params["linear1.weight"].dtype == d
    assert TransformerBlock(BlockConfig(d_model=D, n_heads=H, d_ff=F), dtype="bfloat16").dtype == BFLOAT16
