"""Decoding with a KV cache: block.decode over any split of a sequence equals the full causal
forward; the cache's bytes are exact; bad use fails clearly; the stack and the tiny LM decode and
generate as their full forwards say they should."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preln import BlockConfig, TransformerBlock, TransformerStack
from preln.nn.block import KVCache
from preln.models.lm import LMConfig, TinyLM, sample_next
from preln.precision import BFLOAT16
from preln.nn.stack import StackKVCache

#: decode vs the full forward, max|a - b| / max(1, max|b|): the same float64 sums, some in other
#: BLAS blockings (one row at a time instead of the whole matrix)
SAME_F64 = 1e-12
#: the same, per storage dtype, relative to max|y|: float32 round-off (2^-24) times accumulation,
#: and a few units of the last place of float16 (2^-11) and bfloat16 (2^-8) -- a value that lands
#: near a rounding boundary may round the other way when its float32 sum differs in the last bits
DTYPE_TOL = {np.dtype(np.float64): SAME_F64, np.dtype(np.float32): 1e-6,
             np.dtype(np.float16): 2e-3, BFLOAT16: 1.6e-2}
#: sampled frequencies against softmax probabilities, 20000 draws: 4 standard errors at p = 1/2
FREQ_TOL = 0.015
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None)

D, H, F = 16, 4, 32
SPLITS = {"one chunk": [11], "token by token": [1] * 11, "prefill then tokens": [6, 1, 1, 1, 1, 1],
          "uneven": [3, 1, 5, 2]}


def causal_block(dtype=np.float64, norm_first=True, seed=0, **config):
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=F, causal=True, norm_first=norm_first, **config)
    return TransformerBlock(cfg, dtype=dtype, seed=seed).eval()


def rel_max(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def decode_in_chunks(model, x, sizes, kv):
    """Feed x (B, S, ...) to model.decode chunk by chunk; the outputs concatenated on axis 1."""
    outs, t = [], 0
    for n in sizes:
        outs.append(model.decode(x[:, t:t + n], kv))
        t += n
    assert t == x.shape[1]
    return np.concatenate(outs, axis=1)


# ---- the block -----------------------------------------------------------------------------------
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_decode_equals_full_causal_forward_f64(norm_first, split, rng):
    block = causal_block(norm_first=norm_first)
    x = rng.standard_normal((3, 11, D))
    kv = block.kv_cache(3, 16)
    y = decode_in_chunks(block, x, SPLITS[split], kv)
    assert y.shape == x.shape and y.dtype == np.float64
    assert rel_max(y, block(x)) < SAME_F64
    assert kv.length == 11
    # positions past kv.length were never written: the cache holds exactly the keys of x
    assert not kv.k[:, :, 11:].any() and not kv.v[:, :, 11:].any()


@PROPERTY_SETTINGS
@given(cuts=st.sets(st.integers(1, 23), max_size=8), norm_first=st.booleans(), seed=st.integers(0, 99))
def test_decode_any_split_equals_forward(cuts, norm_first, seed):
    """Any split of S = 24 positions into chunks (cuts are the chunk boundaries)."""
    S = 24
    bounds = [0, *sorted(cuts), S]
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    block = causal_block(norm_first=norm_first, seed=seed % 3)
    x = np.random.default_rng(seed).standard_normal((2, S, D))
    kv = block.kv_cache(2, S)
    assert rel_max(decode_in_chunks(block, x, sizes, kv), block(x)) < SAME_F64


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_decode_equals_forward_in_low_precision(dtype, norm_first, rng):
    block = causal_block(dtype, norm_first)
    x = rng.standard_normal((2, 40, D)).astype(dtype)
    kv = block.kv_cache(2, 40)
    assert kv.dtype == np.dtype(dtype)
    y = decode_in_chunks(block, x, [13, 1, 1, 25], kv)
    assert y.dtype == np.dtype(dtype)
    ref = block(x).astype(np.float64)
    assert rel_max(y, ref) / max(1.0, 1 / np.abs(ref).max()) < DTYPE_TOL[np.dtype(dtype)]


def test_decode_past_one_key_tile_equals_forward(rng):
    """More keys than one tile of the tiled attention (K_TILE = 512): the decode queries then walk
    several key tiles with the online softmax, and the causal limit falls inside a tile."""
    block = causal_block()
    x = rng.standard_normal((1, 600, D))
    kv = block.kv_cache(1, 600)
    assert rel_max(decode_in_chunks(block, x, [520, 1, 79], kv), block(x)) < SAME_F64


def test_decode_with_plain_attention_block_and_trace(rng):
    """The decode path is the same whatever the block's training attention; trace stays quiet."""
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=F, causal=True)
    block = TransformerBlock(cfg, dtype=np.float64, seed=2, attention="plain", trace=True).eval()
    x = rng.standard_normal((2, 9, D))
    kv = block.kv_cache(2, 9)
    assert rel_max(decode_in_chunks(block, x, [4, 5], kv), block(x)) < SAME_F64
    assert block.overflow is None


def test_kv_cache_bytes_and_state():
    block = causal_block(np.float32)
    kv = block.kv_cache(3, 50)
    assert isinstance(kv, KVCache) and kv.length == 0
    assert kv.nbytes == 2 * 3 * 50 * D * 4                      # 2 B max_len D itemsize, exactly
    assert kv.k.shape == kv.v.shape == (3, H, 50, D // H)
    assert kv.keys.shape == (3, H, 0, D // H)
    half = block.kv_cache(3, 50, dtype=np.float16)
    assert half.dtype == np.float16 and half.nbytes == kv.nbytes // 2
    assert causal_block(np.float64).kv_cache(1, 7).nbytes == 2 * 1 * 7 * D * 8
    block.decode(np.ones((3, 4, D), np.float32), kv)
    assert kv.length == 4 and kv.keys.shape == (3, H, 4, D // H)
    assert kv.reset() is kv and kv.length == 0 and kv.nbytes == 2 * 3 * 50 * D * 4
    assert "length=0" in repr(kv)


def test_float16_cache_for_float32_block_rounds_keys_once(rng):
    """A narrower cache stores each key and value rounded to float16; the result moves by about
    float16's round-off, not more."""
    block = causal_block(np.float32)
    x = rng.standard_normal((2, 12, D)).astype(np.float32)
    kv = block.kv_cache(2, 12, dtype=np.float16)
    y = decode_in_chunks(block, x, [5, 7], kv)
    assert y.dtype == np.float32
    err = rel_max(y, block(x))
    assert 0 < err < DTYPE_TOL[np.dtype(np.float16)]


def test_decode_leaves_the_training_cache_alone(rng):
    block = causal_block()
    x = rng.standard_normal((2, 5, D))
    block.train()
    block(x)
    cache = block.cache
    block.eval()
    block.decode(x[:, :2], block.kv_cache(2, 5))
    assert block.cache is cache


# ---- bad use ---------------------------------------------------------------------------------------
def test_decode_errors_are_clear(rng):
    block = causal_block()
    kv = block.kv_cache(2, 5)
    x = rng.standard_normal((2, 3, D))

    with pytest.raises(ValueError, match="causal"):            # a bidirectional block
        TransformerBlock(BlockConfig(d_model=D, n_heads=H, d_ff=F)).kv_cache(2, 5)
    bidir = TransformerBlock(BlockConfig(d_model=D, n_heads=H, d_ff=F), dtype=np.float64).eval()
    with pytest.raises(ValueError, match="decode: expected a causal block"):
        bidir.decode(x, kv)
    block.train()
    with pytest.raises(RuntimeError, match="training mode.*eval"):
        block.decode(x, kv)
    block.eval()
    with pytest.raises(TypeError, match="kv: expected a preln.nn.block.KVCache"):
        block.decode(x, {"k": None})
    with pytest.raises(ValueError, match=r"x_new: expected batch B = 2 \(the cache's\); got shape \(3, 3, 16\)"):
        block.decode(rng.standard_normal((3, 3, D)), kv)
    with pytest.raises(ValueError, match=r"x_new: expected last dimension D = d_model = 16"):
        block.decode(rng.standard_normal((2, 3, 8)), kv)
    with pytest.raises(ValueError, match="x_new: expected a 3-D array"):
        block.decode(rng.standard_normal((2, D)), kv)
    with pytest.raises(ValueError, match="x_new: expected a non-empty"):
        block.decode(np.zeros((2, 0, D)), kv)
    with pytest.raises(TypeError, match="x_new: expected an array of real numbers"):
        block.decode(np.zeros((2, 1, D), complex), kv)
    other = TransformerBlock(BlockConfig(d_model=2 * D, n_heads=H, d_ff=F, causal=True)).eval()
    with pytest.raises(ValueError, match=r"kv: expected a cache of H = 4 heads of d_h = 8 \(D = 32\)"):
        other.decode(rng.standard_normal((2, 3, 2 * D)), kv)
    block.decode(x, kv)
    with pytest.raises(ValueError, match=r"kv: the cache is full: it holds 3 of max_len = 5 positions "
                                         r"and x_new brings 3 more"):
        block.decode(x, kv)
    assert kv.length == 3                                       # a refused step changes nothing
    for bad, err in [(0, ValueError), (-1, ValueError), (2.5, ValueError), (True, ValueError)]:
        with pytest.raises(err, match="batch: expected a positive int"):
            block.kv_cache(bad, 5)
        with pytest.raises(err, match="max_len: expected a positive int"):
            block.kv_cache(2, bad)
    with pytest.raises(TypeError, match="dtype: expected one of float64"):
        block.kv_cache(2, 5, dtype=np.int32)


# ---- the stack -------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_stack_decode_equals_forward(norm_first, rng):
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=F, causal=True, norm_first=norm_first)
    stack = TransformerStack(cfg, 3, dtype=np.float64, seed=1).eval()
    x = rng.standard_normal((2, 10, D))
    kv = stack.kv_cache(2, 12)
    assert isinstance(kv, StackKVCache) and len(kv) == 3 and kv.length == 0
    assert kv.nbytes == 3 * 2 * 2 * 12 * D * 8
    y = decode_in_chunks(stack, x, [4, 1, 5], kv)
    assert rel_max(y, stack(x)) < SAME_F64
    assert kv.length == 10 and all(c.length == 10 for c in kv.layers)


def test_stack_decode_errors(rng):
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=F, causal=True)
    stack = TransformerStack(cfg, 2).eval()
    kv = stack.kv_cache(2, 4)
    with pytest.raises(TypeError, match="kv: expected a preln.nn.stack.StackKVCache"):
        stack.decode(rng.standard_normal((2, 1, D)), kv.layers[0])
    with pytest.raises(ValueError, match="kv: expected one cache per layer, 2; got 3"):
        stack.decode(rng.standard_normal((2, 1, D)), TransformerStack(cfg, 3).kv_cache(2, 4))
    stack.decode(rng.standard_normal((2, 3, D)), kv)
    with pytest.raises(ValueError, match="cache is full"):
        stack.decode(rng.standard_normal((2, 2, D)), kv)
    assert [c.length for c in kv.layers] == [3, 3]             # no layer moved on a refused step


# ---- the tiny LM -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lm():
    return TinyLM(LMConfig(vocab_size=20, max_len=24, d_model=16, n_heads=2, d_ff=32), dtype=np.float64, seed=3)


@pytest.mark.parametrize("norm_first", [True, False], ids=["preln", "postln"])
def test_lm_decode_logits_equal_forward(norm_first, rng):
    model = TinyLM(LMConfig(vocab_size=20, max_len=24, d_model=16, n_heads=2, d_ff=32,
                            norm_first=norm_first), dtype=np.float64, seed=1).eval()
    tokens = rng.integers(0, 20, (2, 15))
    kv = model.kv_cache(2)
    assert kv.max_len == 24
    assert rel_max(decode_in_chunks(model, tokens, [7, 1, 1, 6], kv), model(tokens)) < SAME_F64


def test_greedy_generate_equals_argmax_of_repeated_full_forwards(lm, rng):
    prompt = rng.integers(0, 20, (3, 5))
    out = lm.generate(prompt, 12)
    assert out.shape == (3, 17) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :5], prompt)
    ids = prompt.copy()
    for _ in range(12):                                         # the definition, with no cache
        nxt = lm(ids)[:, -1].argmax(axis=-1)                    # (B,)
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
    np.testing.assert_array_equal(out, ids)
    np.testing.assert_array_equal(lm.generate(prompt, 12, use_cache=False), ids)
    one = lm.generate(prompt[1], 12)                            # a 1-D prompt gives a 1-D answer
    np.testing.assert_array_equal(one, ids[1])


def test_sampled_generate_is_deterministic_given_seed(lm):
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    a = lm.generate(prompt, 15, temperature=1.0, seed=7)
    b = lm.generate(prompt, 15, temperature=1.0, seed=7)
    c = lm.generate(prompt, 15, temperature=1.0, seed=8)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    np.testing.assert_array_equal(a, lm.generate(prompt, 15, temperature=1.0, seed=7, use_cache=False))
    assert lm.generate(prompt, 0).shape == (2, 3)


def test_generate_restores_the_mode(lm):
    lm.train()
    lm.generate([1, 2], 3)
    assert lm.stack.training and all(layer.training for layer in lm.stack.layers)
    lm.eval()
    lm.generate([1, 2], 3)
    assert not lm.stack.training


def test_sample_next_follows_softmax_of_logits_over_temperature():
    logits = np.tile(np.array([2.0, 1.0, 0.0, -1.0]), (20000, 1))           # 20000 rows, one draw each
    for temperature in (0.5, 1.0, 2.0):
        draws = sample_next(logits, temperature, np.random.default_rng(0))
        p = np.exp(logits[0] / temperature)
        p /= p.sum()
        freq = np.bincount(draws, minlength=4) / draws.size
        assert np.abs(freq - p).max() < FREQ_TOL, (temperature, freq, p)
    np.testing.assert_array_equal(sample_next(logits[:3], 0, None), [0, 0, 0])   # greedy


def test_generate_past_max_len_and_bad_arguments_fail_clearly(lm):
    prompt = np.zeros((1, 20), np.int64)
    assert lm.generate(prompt, 4).shape == (1, 24)              # exactly max_len: fine
    with pytest.raises(ValueError, match=r"n_new: the prompt's 20 tokens plus n_new=5 exceed the "
                                         r"model's max_len=24 positions"):
        lm.generate(prompt, 5)
    with pytest.raises(ValueError, match="max_len: expected at most the model's max_len=24"):
        lm.kv_cache(1, 25)
    kv = lm.eval().kv_cache(1)
    lm.decode(prompt, kv)
    with pytest.raises(ValueError, match=r"tokens_new: positions 20 .. 24 would pass the model's max_len=24"):
        lm.decode(np.zeros((1, 5), np.int64), kv)
    with pytest.raises(TypeError, match="kv: expected a preln.nn.stack.StackKVCache"):
        lm.decode(prompt, kv.layers[0])
    with pytest.raises(ValueError, match="temperature: expected a finite number >= 0"):
        lm.generate([1], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="n_new: expected an int >= 0"):
        lm.generate([1], 2.0)
    with pytest.raises(ValueError, match=r"prompt_ids: expected token ids in \[0, 20\); got \[0, 20\]"):
        lm.generate([0, 20], 2)
    with pytest.raises(ValueError, match="prompt_ids: expected a non-empty"):
        lm.generate(np.zeros((1, 0), np.int64), 2)
