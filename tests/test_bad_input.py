"""Bad input fails early, with a message that names the argument, what was expected and what
was received, never a numpy traceback from deep inside."""
import re

import numpy as np
import pytest

from preln import BlockConfig, PreLNTransformerBlock, TransformerBlock
from preln.precision import resolve_dtype

D = 8


@pytest.fixture
def block():
    return TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16), dtype=np.float64, seed=0)


def x_of(*shape, dtype=np.float64):
    return np.zeros(shape, dtype)


# ---- x ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, error, match", [
    (x_of(4, D), ValueError, r"x: expected a 3-D array \(B, S, D\).*got 2-D shape \(4, 8\)"),
    (x_of(1, 2, 3, D), ValueError, r"x: expected a 3-D array.*got 4-D shape \(1, 2, 3, 8\)"),
    (x_of(1, 4, 7), ValueError, r"x: expected last dimension D = d_model = 8; got shape \(1, 4, 7\)"),
    (x_of(0, 4, D), ValueError, r"x: expected a non-empty \(B, S, D\) array; got shape \(0, 4, 8\)"),
    (x_of(1, 0, D), ValueError, r"x: expected a non-empty .*got shape \(1, 0, 8\)"),
    (np.full((1, 2, D), "a"), TypeError, r"x: expected an array of real numbers; got dtype <U1"),
    (np.empty((1, 2, D), object), TypeError, r"x: expected an array of real numbers; got dtype object"),
    (x_of(1, 2, D, dtype=complex), TypeError, r"x: expected an array of real numbers; got dtype complex128"),
    (x_of(1, 2, D, dtype=bool), TypeError, r"x: expected an array of real numbers; got dtype bool"),
    ("hello", TypeError, r"x: expected a numpy array; got str"),
    (None, TypeError, r"x: expected a numpy array; got NoneType"),
], ids=["rank2", "rank4", "last_dim", "empty_B", "empty_S", "strings", "object", "complex", "bool",
        "str", "None"])
def test_bad_x(block, x, error, match):
    with pytest.raises(error, match=match):
        block(x)


def test_integer_and_list_x_are_accepted_as_numbers(block):
    assert block(np.ones((1, 2, D), int)).dtype == np.float64
    assert block([[[0.5] * D] * 2]).shape == (1, 2, D)


# ---- key_padding_mask ---------------------------------------------------------------------------
@pytest.mark.parametrize("mask, error, match", [
    (np.zeros((1, 2)), TypeError, r"key_padding_mask: expected a bool array \(True = padding key\); got dtype float64"),
    (np.zeros((1, 2), int), TypeError, r"key_padding_mask: expected a bool array.*got dtype int64"),
    (np.zeros((2, 2), bool), ValueError, r"key_padding_mask: expected shape \(B, S\) = \(1, 2\); got \(2, 2\)"),
    (np.zeros((1, 2, 1), bool), ValueError, r"key_padding_mask: expected shape \(B, S\) = \(1, 2\); got \(1, 2, 1\)"),
    (np.zeros(2, bool), ValueError, r"key_padding_mask: expected shape \(B, S\) = \(1, 2\); got \(2,\)"),
    ("pad", TypeError, r"key_padding_mask: expected a numpy array; got str"),
], ids=["float", "int", "wrong_B", "rank3", "rank1", "str"])
def test_bad_mask(block, mask, error, match):
    with pytest.raises(error, match=match):
        block(x_of(1, 2, D), mask)


# ---- backward -----------------------------------------------------------------------------------
def test_backward_before_forward(block):
    with pytest.raises(RuntimeError, match=r"backward: no forward to differentiate; call block\(x\) first"):
        block.backward(x_of(1, 2, D))


@pytest.mark.parametrize("dy, error, match", [
    (x_of(1, 3, D), ValueError, r"dy: expected shape \(1, 2, 8\) \(the shape of the last forward's output\); got \(1, 3, 8\)"),
    (x_of(2, D), ValueError, r"dy: expected shape \(1, 2, 8\).*got \(2, 8\)"),
    (np.full((1, 2, D), "x"), TypeError, r"dy: expected an array of real numbers; got dtype <U1"),
    (3.0, TypeError, r"dy: expected a numpy array; got float"),
], ids=["shape", "rank", "strings", "scalar"])
def test_bad_dy(block, dy, error, match):
    block(x_of(1, 2, D))
    with pytest.raises(error, match=match):
        block.backward(dy)


def test_backward_after_a_forward_that_raised(block):
    """The backward's message promises that a forward that raised leaves nothing to differentiate:
    dy must not silently be applied to an older forward's cache."""
    block(x_of(1, 2, D))
    with pytest.raises(ValueError):
        block(x_of(1, 3, D + 1))
    with pytest.raises(RuntimeError, match=r"backward: no forward to differentiate"):
        block.backward(x_of(1, 2, D))


# ---- config -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(d_model=10, n_heads=4), ValueError, r"n_heads: expected a divisor of d_model=10; got 4"),
    (dict(dropout=1.0), ValueError, r"dropout: expected a probability in \[0, 1\); got 1.0"),
    (dict(dropout=-0.1), ValueError, r"dropout: expected a probability in \[0, 1\); got -0.1"),
    (dict(dropout="0.1"), ValueError, r"dropout: expected a probability in \[0, 1\); got '0.1'"),
    (dict(activation="swish"), ValueError, r"activation: expected one of \('gelu', 'gelu_tanh', 'relu'\); got 'swish'"),
    (dict(d_model=8.0), ValueError, r"d_model: expected a positive int; got 8.0"),
    (dict(d_ff=True), ValueError, r"d_ff: expected a positive int; got True"),
    (dict(n_heads=0), ValueError, r"n_heads: expected a positive int; got 0"),
    (dict(d_model=-4), ValueError, r"d_model: expected a positive int; got -4"),
    (dict(eps=0), ValueError, r"eps: expected a positive float; got 0"),
    (dict(eps=-1e-5), ValueError, r"eps: expected a positive float; got -1e-05"),
    (dict(eps="1e-5"), ValueError, r"eps: expected a positive float; got '1e-5'"),
    (dict(norm_first=1), TypeError, r"norm_first: expected a bool; got 1"),
    (dict(causal="yes"), TypeError, r"causal: expected a bool; got 'yes'"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_bad_config(kwargs, error, match):
    with pytest.raises(error, match=match):
        BlockConfig(**kwargs)


def test_config_is_frozen():
    cfg = BlockConfig()
    with pytest.raises(AttributeError):
        cfg.d_model = 32


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dtype=np.int32), TypeError, r"dtype: expected one of float64, float32, float16, bfloat16; got <class 'numpy.int32'>"),
    (dict(dtype="float128"), TypeError, r"dtype: expected one of float64, float32, float16, bfloat16; got 'float128'"),
    (dict(dtype="int8"), TypeError, r"dtype: expected one of .*; got 'int8'"),
    (dict(policy="fast"), ValueError, r"policy: expected 'safe', 'naive' or a preln.Policy; got 'fast'"),
    (dict(policy=None), ValueError, r"policy: expected 'safe', 'naive' or a preln.Policy; got None"),
    (dict(attention="flash"), ValueError, r"attention: expected 'auto', 'plain' or 'tiled'; got 'flash'"),
], ids=["int32", "float128", "int8", "policy", "policy_None", "attention"])
def test_bad_block_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16), **kwargs)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "float8", "half precision"])
def test_unparseable_dtype_string_is_rejected(dtype):
    """A string numpy cannot parse must not fall through as a valid dtype (it must not silently
    give a float64 block)."""
    with pytest.raises(TypeError, match=rf"dtype: expected one of float64, float32, float16, bfloat16; got '{dtype}'"):
        resolve_dtype(dtype)
    with pytest.raises(TypeError, match=r"dtype: expected one of"):
        TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16), dtype=dtype)


def test_config_must_be_a_block_config():
    with pytest.raises(TypeError, match=r"config: expected a preln.BlockConfig; got dict"):
        TransformerBlock({"d_model": 8})
    with pytest.raises(ValueError, match=r"d_model: expected a positive int; got 0"):
        PreLNTransformerBlock(d_model=0)


# ---- state dict ---------------------------------------------------------------------------------
def test_state_dict_not_a_dict(block):
    with pytest.raises(TypeError, match=r"state_dict: expected a dict of arrays; got list"):
        block.load_state_dict(list(block.state_dict().values()))


def test_state_dict_missing_key(block):
    sd = block.state_dict()
    del sd["norm1.bias"]
    with pytest.raises(KeyError, match=r"state_dict: missing key 'norm1.bias'.*expected the keys"):
        block.load_state_dict(sd)


def test_state_dict_extra_key(block):
    sd = {**block.state_dict(), "self_attn.bias_k": np.zeros(D)}
    with pytest.raises(KeyError, match=r"state_dict: unexpected key 'self_attn.bias_k'"):
        block.load_state_dict(sd)


def test_state_dict_misshaped_key(block):
    sd = {**block.state_dict(), "linear1.weight": np.zeros((D, 16))}      # transposed
    with pytest.raises(ValueError, match=re.escape("state_dict['linear1.weight']: expected shape (16, 8); got (8, 16)")):
        block.load_state_dict(sd)


def test_state_dict_failed_load_leaves_the_block_unchanged(block):
    before = block.state_dict()
    sd = {k: np.ones_like(v) for k, v in before.items()}
    sd["norm2.bias"] = np.zeros(D + 1)
    with pytest.raises(ValueError):
        block.load_state_dict(sd)
    for k, v in block.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("value, dtype_name", [(np.full((16, D), "a"), "<U1"),
                                               (np.zeros((16, D), complex), "complex128"),
                                               (np.zeros((16, D), object), "object")])
def test_state_dict_non_real_value(block, value, dtype_name):
    """A parameter of strings, complex or objects is named like a bad x is, not cast silently."""
    sd = {**block.state_dict(), "linear1.weight": value}
    with pytest.raises(TypeError, match=re.escape(f"state_dict['linear1.weight']: expected an array of real numbers; got dtype {dtype_name}")):
        block.load_state_dict(sd)


# ---- check_finite -------------------------------------------------------------------------------
def test_check_finite_names_norm1_variance():
    """float16, naive policy, rms 100 at d_model 256: 256 * 100^2 overflows the sum of squares."""
    b = TransformerBlock(BlockConfig(d_model=256, n_heads=4, d_ff=64), dtype=np.float16,
                         policy="naive", check_finite=True)
    x = 100 * np.random.default_rng(0).standard_normal((1, 4, 256))
    with pytest.raises(FloatingPointError, match=r"^norm1\.variance: output float16\[1, 4, 1\] is not finite; largest \|input\| was \d+"):
        b(x)
    with pytest.raises(RuntimeError, match=r"no forward to differentiate"):
        b.backward(np.zeros((1, 4, 256), np.float16))          # the failed forward left no cache


def test_check_finite_names_an_attention_op():
    """Small inputs (LayerNorm fine) but huge q.k logits: the naive softmax's exp overflows."""
    b = TransformerBlock(BlockConfig(d_model=16, n_heads=2, d_ff=32), dtype=np.float16,
                         policy="naive", check_finite=True, seed=0)
    sd = b.state_dict()
    sd["self_attn.in_proj_weight"] = sd["self_attn.in_proj_weight"] * 8
    b.load_state_dict(sd)
    x = np.random.default_rng(0).standard_normal((1, 6, 16))
    with pytest.raises(FloatingPointError, match=r"^attn\.(scores|exp)"):
        b(x)
    b.eval()                                                    # the tiled path names it too
    with pytest.raises(FloatingPointError, match=r"^attn\.(scores|exp)"):
        b(x)
    safe = TransformerBlock(b.config, dtype=np.float16, check_finite=True)
    safe.load_state_dict(sd)
    assert np.isfinite(safe(x).astype(np.float64)).all()       # the safe policy does not raise


def test_check_finite_off_by_default_lets_nan_through(block):
    x = x_of(1, 2, D)
    x[0, 0, 0] = np.nan
    y = block(x)                                                # no error without check_finite
    assert np.isnan(y[0, 0]).all() and block.overflow is None
    strict = TransformerBlock(block.config, dtype=np.float64, check_finite=True)
    with pytest.raises(FloatingPointError, match=r"^norm1\.variance"):
        strict(x)
