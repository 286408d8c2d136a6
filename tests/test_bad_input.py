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
    (dict(norm_first=1), TypeError, r"norm_first: expected True or False; got 1"),
    (dict(causal="yes"), TypeError, r"causal: expected True or False; got 'yes'"),
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
    (dict(attention="flash"), ValueError, r"attention: expected one of \('auto', 'plain', 'tiled'\); got 'flash'"),
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


# ---- the inputs of issue 21: every entry point, the same clear error --------------------------
def _tiny_lm(**kw):
    from preln.models.lm import LMConfig, TinyLM
    return TinyLM(LMConfig(vocab_size=11, max_len=8, d_model=D, n_heads=2, d_ff=16, n_layers=1, **kw),
                  seed=0).eval()


def _quantised_lms():
    from preln.quant.int8 import quantize_block
    from preln.quant.weight_only import quantize_model
    lm = _tiny_lm()
    return {"TinyLM": lm, "QuantizedLM": quantize_block(lm, "w8a8"),
            "WeightOnlyLM": quantize_model(lm, "rtn", bits=4)}


@pytest.mark.parametrize("name", ["TinyLM", "QuantizedLM", "WeightOnlyLM"])
def test_token_id_minus_one_is_refused_not_read_as_the_last_row(name):
    """numpy reads table[-1] as the last embedding row; every LM says so instead."""
    lm = _quantised_lms()[name]
    with pytest.raises(ValueError, match=r"tokens: expected token ids in \[0, 11\); got \[-1, 3\]"):
        lm(np.array([[0, -1, 3]]))
    with pytest.raises(ValueError, match=r"tokens: expected token ids in \[0, 11\); got \[0, 11\]"):
        lm(np.array([[0, 11]]))


@pytest.mark.parametrize("name", ["TinyLM", "QuantizedLM", "WeightOnlyLM"])
def test_more_positions_than_max_len_is_a_clear_error(name):
    """S > max_len: a message naming max_len, not a numpy broadcast error."""
    lm = _quantised_lms()[name]
    with pytest.raises(ValueError, match=r"tokens: expected at most max_len=8 positions; got 9"):
        lm(np.zeros((1, 9), int))


def test_llama_lm_refuses_minus_one_too():
    from preln.models.llama_lm import LlamaLM, LlamaLMConfig
    lm = LlamaLM(LlamaLMConfig(vocab_size=7, d_model=8, n_heads=2, n_kv_heads=1, d_ff=16, n_layers=1))
    with pytest.raises(ValueError, match=r"tokens: expected token ids in \[0, 7\); got \[-1, 2\]"):
        lm(np.array([[2, -1]]))


def test_paged_forward_refuses_minus_one():
    from preln.serve.paged import PagedKVCache, paged_forward
    lm = _tiny_lm()
    cache = PagedKVCache(1, 4, 4, 2, D // 2)
    cache.add("a")
    with pytest.raises(ValueError, match=r"chunks: expected token ids in \[0, 11\); got \[-1, 2\]"):
        paged_forward(lm, cache, [("a", np.array([2, -1]))])


def test_continuous_batcher_refuses_an_out_of_vocabulary_prompt():
    from preln.serve.paged import ContinuousBatcher, Request
    server = ContinuousBatcher(_tiny_lm(), n_blocks=4, block_size=4)
    with pytest.raises(ValueError, match=r"requests\[0\]\.prompt: expected token ids in \[0, 11\); got \[-1, 1\]"):
        server.run([Request(rid=0, prompt=np.array([1, -1]), n_new=2)])


def test_quantized_block_checks_its_mask():
    """A float mask was accepted (and read as True/False by where); now the block's own check."""
    from preln.quant.int8 import quantize_block
    b = TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16), dtype=np.float32).eval()
    q = quantize_block(b, "w8a8")
    with pytest.raises(TypeError, match=r"key_padding_mask: expected a bool array \(True = padding key\); got dtype float64"):
        q(x_of(1, 2, D), np.zeros((1, 2)))
    with pytest.raises(ValueError, match=r"key_padding_mask: expected shape \(B, S\) = \(1, 2\); got \(1, 3\)"):
        q(x_of(1, 2, D), np.zeros((1, 3), bool))
    with pytest.raises(ValueError, match=r"x: expected last dimension D = d_model = 8; got shape \(1, 2, 7\)"):
        q(x_of(1, 2, D - 1))


def test_numpy_ints_are_accepted_by_both_configs_and_stored_as_int():
    from preln import LlamaConfig
    cfg = BlockConfig(d_model=np.int64(8), n_heads=np.int32(2), d_ff=np.int64(16))
    assert cfg == BlockConfig(d_model=8, n_heads=2, d_ff=16) and type(cfg.d_model) is int
    lcfg = LlamaConfig(d_model=np.int64(8), n_heads=2, n_kv_heads=np.int64(1), d_ff=16)
    assert type(lcfg.n_kv_heads) is int and lcfg.n_groups == 2
    for make in (lambda: BlockConfig(d_model=True), lambda: LlamaConfig(d_model=np.bool_(True))):
        with pytest.raises(ValueError, match=r"d_model: expected a positive int; got (True|np.True_)"):
            make()


def test_paged_cache_refuses_integer_storage():
    from preln.serve.paged import PagedKVCache
    with pytest.raises(TypeError, match=r"dtype: expected one of float64, float32, float16, bfloat16; got <class 'numpy.int8'>"):
        PagedKVCache(1, 2, 4, 1, 4, dtype=np.int8)


@pytest.fixture
def paged():
    from preln.serve.paged import PagedKVCache
    cache = PagedKVCache(2, 4, 4, 1, 4)
    cache.add("a")
    cache.reserve("a", 2)
    return cache


@pytest.mark.parametrize("n", [-3, 1.0, True])
def test_paged_commit_refuses_a_negative_or_non_int_count(paged, n):
    with pytest.raises(ValueError, match=r"n: expected an int >= 0; got"):
        paged.commit("a", n)
    assert paged.lengths["a"] == 0                                # nothing was committed


@pytest.mark.parametrize("layer", [-1, 2, 0.0])
def test_paged_write_refuses_a_layer_outside_0_to_n_layers(paged, layer):
    """-1 used to write the last layer."""
    k = np.ones((1, 2, 4))
    with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 2\); got"):
        paged.write(layer, "a", k, k)
    assert not paged.k.any()                                      # nothing was written


def test_transformer_block_decode_refuses_a_llama_cache():
    """LlamaKVCache was a subclass of KVCache, so a TransformerBlock took it."""
    from preln import LlamaBlock, LlamaConfig
    b = TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16, causal=True), dtype=np.float64).eval()
    llama_kv = LlamaBlock(LlamaConfig(d_model=D, n_heads=2, n_kv_heads=2, d_ff=16)).kv_cache(1, 4)
    with pytest.raises(TypeError, match=r"kv: expected a preln.nn.block.KVCache from block.kv_cache\(batch, max_len\); got LlamaKVCache"):
        b.decode(x_of(1, 1, D), llama_kv)
    with pytest.raises(TypeError, match=r"kv: expected a preln.nn.llama.LlamaKVCache.*got KVCache"):
        LlamaBlock(LlamaConfig(d_model=D, n_heads=2, n_kv_heads=2, d_ff=16)).eval().decode(
            x_of(1, 1, D), b.kv_cache(1, 4))


@pytest.mark.parametrize("flag", ["check_finite", "trace", "fused"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_block_flags_must_be_bools(flag, value):
    """check_finite="no" used to become True (bool("no")); both block families refuse it."""
    from preln import LlamaBlock, LlamaConfig
    for make in (lambda kw: TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16), **kw),
                 lambda kw: LlamaBlock(LlamaConfig(d_model=D, n_heads=2, n_kv_heads=1, d_ff=16), **kw)):
        with pytest.raises(TypeError, match=rf"{flag}: expected True or False; got {value!r}"):
            make({flag: value})


@pytest.mark.parametrize("call, match", [
    (lambda: __import__("preln.nn.stack", fromlist=["x"]).TransformerStack(BlockConfig(d_model=D, n_heads=2, d_ff=16), 0),
     r"n_layers: expected a positive int; got 0"),
    (lambda: __import__("preln.quant.groups", fromlist=["x"]).rtn(np.ones((2, 4)), bits=9),
     r"bits: expected an int in \[2, 8\]; got 9"),
    (lambda: __import__("preln.quant.int8", fromlist=["x"]).quantize(np.ones(4), bits=17),
     r"bits: expected an int in \[2, 16\]; got 17"),
    (lambda: __import__("preln.quant.gptq", fromlist=["x"]).gptq(np.ones((2, 4)), np.ones((3, 4)), block_size=np.int64(0)),
     r"block_size: expected a positive int; got "),
    (lambda: __import__("preln.serve.paged", fromlist=["x"]).ContinuousBatcher(_tiny_lm(), 4, 4, max_batch=True),
     r"max_batch: expected a positive int; got True"),
    (lambda: _tiny_lm().generate(np.array([1]), n_new=-1), r"n_new: expected an int >= 0; got -1"),
], ids=["stack", "group_bits", "int8_bits", "gptq_block_size", "batcher", "generate"])
def test_sizes_share_one_check(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- the edges of issue 35: each was a silent wrong answer or an unnamed error -----------------
@pytest.mark.parametrize("temperature, shown", [(-1, "-1"), (float("nan"), "nan"), (float("inf"), "inf"),
                                                ("0.5", "'0.5'"), (True, "True")])
def test_a_temperature_must_be_finite_and_not_negative(temperature, shown):
    """-1 sampled from softmax(-logits), nan and inf ran too: sample_next and the server refuse
    them, the server before any step (so no sequence is left in its cache)."""
    from preln.models.lm import sample_next
    from preln.serve.paged import ContinuousBatcher, Request
    match = rf"temperature: expected a finite number >= 0; got {re.escape(shown)}"
    with pytest.raises(ValueError, match=match):
        sample_next(np.zeros((1, 11)), temperature, np.random.default_rng(0))
    server = ContinuousBatcher(_tiny_lm(), n_blocks=4, block_size=4)
    with pytest.raises(ValueError, match=match):
        server.run([Request(rid=0, prompt=np.array([1, 2]), n_new=2)], temperature=temperature)
    assert server.cache.tables == {}


@pytest.fixture
def paged_written(paged):
    """Sequence "a" of ``paged`` with 2 positions written and committed in both layers."""
    kv = np.ones((1, 2, 4))
    for layer in (0, 1):
        paged.write(layer, "a", kv, kv)
    paged.commit("a", 2)
    return paged


@pytest.mark.parametrize("layer, seq, q_start, error, match", [
    (-1, "a", 1, ValueError, r"layer: expected an int in \[0, 2\); got -1"),       # read the last layer
    (0, "a", -5, ValueError, r"q_start: expected an int >= 0; got -5"),            # returned NaN
    (0, "a", 4, ValueError, r"q_start: expected q_start \+ n <= 4, the positions reserved for 'a'; got 4 \+ 1"),
    (0, "zz", 1, KeyError, r"seq: 'zz' is not in the cache \(add it first\)"),     # was KeyError: 'zz'
], ids=["layer_minus_one", "q_start_negative", "q_start_past_the_blocks", "unknown_seq"])
def test_paged_attention_refuses_what_write_refuses(paged_written, layer, seq, q_start, error, match):
    from preln.serve.paged import paged_attention
    with pytest.raises(error, match=match):
        paged_attention(np.ones((1, 1, 4)), paged_written, layer, seq, q_start)


def test_paged_attention_reads_the_positions_it_is_given(paged_written):
    """The legal call the checks must let through: one query at position 1 over positions 0, 1
    whose values are all ones -> an output of ones."""
    from preln.serve.paged import paged_attention
    np.testing.assert_array_equal(paged_attention(np.ones((1, 1, 4)), paged_written, 1, "a", 1),
                                  np.ones((1, 1, 4)))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(x=np.array([1.0, np.nan, 2.0])), ValueError, r"x: expected finite values; got 1 nan and 0 inf among 3"),
    (dict(x=np.array([1.0, -np.inf])), ValueError, r"x: expected finite values; got 0 nan and 1 inf among 2"),
    (dict(symmetric="no"), TypeError, r"symmetric: expected True or False; got 'no'"),
    (dict(zero_point=300), ValueError, r"zero_point: expected None with symmetric=True \(Z = 0\); got 300"),
    (dict(symmetric=False, zero_point=3), ValueError, r"zero_point: expected None when the scale is computed from x; got 3"),
    (dict(symmetric=False, scale=0.1, zero_point=300), ValueError, r"zero_point: expected integers in \[0, 255\]; got 300"),
    (dict(symmetric=False, scale=0.1, zero_point=-1), ValueError, r"zero_point: expected integers in \[0, 255\]; got -1"),
    (dict(symmetric=False, scale=0.1, zero_point=2.5), ValueError, r"zero_point: expected integers in \[0, 255\]; got 2.5"),
    (dict(granularity="row"), ValueError, r"granularity: expected one of \('tensor', 'channel', 'token'\); got 'row'"),
], ids=["nan", "inf", "symmetric_no", "zero_point_symmetric", "zero_point_computed_scale",
        "zero_point_300", "zero_point_negative", "zero_point_float", "granularity"])
def test_int8_quantize_refuses_what_it_cannot_represent(kwargs, error, match):
    """NaN became code 0 (with a RuntimeWarning), "no" was truthy, a zero point of 300 was ignored
    or clamped codes to garbage."""
    from preln.quant.int8 import quantize
    kwargs = {"x": np.array([0.5, -1.0, 2.0]), **kwargs}
    with pytest.raises(error, match=match):
        quantize(**kwargs)


def test_int8_quantize_keeps_a_legal_static_zero_point():
    from preln.quant.int8 import dequantize, quantize
    qt = quantize(np.array([0.0, 0.5, 1.0]), symmetric=False, scale=0.5, zero_point=np.int64(3))
    np.testing.assert_array_equal(qt.q, [3, 4, 5])
    np.testing.assert_array_equal(dequantize(qt), [0.0, 0.5, 1.0])


@pytest.mark.parametrize("value, counts", [(np.nan, "2 nan and 0 inf"), (np.inf, "0 nan and 2 inf")])
def test_group_rtn_refuses_non_finite_weights(value, counts):
    """NaN/inf weights made garbage codes (an all-zero row of codes, a NaN scale)."""
    from preln.quant.groups import rtn
    w = np.ones((2, 4))
    w[:, 1] = value
    with pytest.raises(ValueError, match=rf"w: expected finite values; got {counts} among 8"):
        rtn(w)
    with pytest.raises(TypeError, match=r"symmetric: expected True or False; got 'no'"):
        rtn(np.ones((2, 4)), symmetric="no")


@pytest.fixture(scope="module")
def gguf_tokenizer():
    """A byte-level BPE vocabulary of the 256 byte characters and one control token."""
    pytest.importorskip("tokenizers")
    from preln.gguf.tokenizer import GGUFTokenizer, bytes_to_unicode
    tokens = ["<|endoftext|>"] + list(bytes_to_unicode().values())
    return GGUFTokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
                          "tokenizer.ggml.token_type": [3] + [1] * 256})


@pytest.mark.parametrize("ids, match", [
    ([1.5], r"ids: expected a non-empty 1-D integer array; got shape \(1,\), dtype float64"),
    ([True], r"ids: expected a non-empty 1-D integer array; got shape \(1,\), dtype bool"),
    ([[1, 2]], r"ids: expected a non-empty 1-D integer array; got shape \(1, 2\)"),
    ([1, 257], r"ids: expected token ids in \[0, 257\); got \[1, 257\]"),
    ([-1], r"ids: expected token ids in \[0, 257\); got \[-1, -1\]"),
], ids=["float", "bool", "2d", "too_large", "minus_one"])
def test_gguf_decode_refuses_ids_that_are_not_token_ids(gguf_tokenizer, ids, match):
    """decode([1.5]) decoded id 1."""
    with pytest.raises(ValueError, match=match):
        gguf_tokenizer.decode(ids)


def test_gguf_tokenizer_round_trip_and_a_lone_surrogate(gguf_tokenizer):
    tok = gguf_tokenizer
    assert tok.decode(tok.encode("héllo")) == "héllo" and tok.decode([]) == ""
    with pytest.raises(ValueError, match=r"text: expected Unicode text \(encodable as UTF-8\); got '\\ud800' at index 2, a lone surrogate"):
        tok.encode("ab\ud800")                       # was "TextInputSequence must be str"


def test_gguf_chat_without_a_tokenizer_says_so():
    """A model loaded with tokenizer=False raised "'NoneType' object has no attribute ..."; chat is
    written once (preln.models.lm.Generator), so a TinyLM without a tokenizer says the same."""
    from preln import LlamaBlock, LlamaConfig
    from preln.models.llama_lm import LlamaLM, LlamaLMConfig
    block = LlamaBlock(LlamaConfig(d_model=D, n_heads=2, n_kv_heads=1, d_ff=16))
    lm = LlamaLM.from_parts(LlamaLMConfig(d_model=D, n_heads=2, n_kv_heads=1, d_ff=16, n_layers=1), [block], {})
    with pytest.raises(ValueError, match=r"tokenizer: expected a GGUFTokenizer to render the chat template; got None"):
        lm.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match=r"tokenizer: expected a GGUFTokenizer to render the chat template; got None"):
        _tiny_lm().chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("value, held", [(np.inf, "inf"), (np.nan, "nan")])
def test_check_finite_says_a_non_finite_input_came_in(block, value, held):
    """An inf input was reported as "largest |input| was 0" (the largest *finite* one)."""
    strict = TransformerBlock(block.config, dtype=np.float64, check_finite=True)
    x = x_of(1, 2, D)
    x[0, 0, 0] = value
    with pytest.raises(FloatingPointError, match=rf"^norm1\.variance: output float64\[1, 2, 1\] is not finite; "
                                                  rf"an input already held {held} \(passed on, not an overflow"):
        strict(x)


@pytest.mark.parametrize("timeout, shown", [("0", "0.0"), ("-1", "-1.0"), ("nan", "nan")])
def test_parallel_cli_refuses_a_timeout_that_cannot_run(capsys, timeout, shown):
    """--timeout 0 was a traceback (the queue's or the spawn's)."""
    from preln.parallel.distributed import main
    with pytest.raises(SystemExit) as exit_:
        main(["--simulate", "--timeout", timeout])
    assert exit_.value.code == 2
    assert f"--timeout: expected a positive float; got {shown}" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_block_seed_is_named(seed):
    """seed=-1 raised numpy's "expected non-negative integer", naming no argument."""
    from preln import LlamaBlock, LlamaConfig
    match = rf"seed: expected an int >= 0, None or a np.random.SeedSequence; got {re.escape(repr(seed))}"
    with pytest.raises(ValueError, match=match):
        TransformerBlock(BlockConfig(d_model=D, n_heads=2, d_ff=16), seed=seed)
    with pytest.raises(ValueError, match=match):
        LlamaBlock(LlamaConfig(d_model=D, n_heads=2, n_kv_heads=1, d_ff=16), seed=seed)


def test_block_seed_takes_what_a_stack_passes():
    cfg = BlockConfig(d_model=D, n_heads=2, d_ff=16)
    a = TransformerBlock(cfg, seed=np.random.SeedSequence(5).spawn(1)[0])
    b = TransformerBlock(cfg, seed=np.random.SeedSequence(5).spawn(1)[0])
    np.testing.assert_array_equal(a.params["linear1.weight"], b.params["linear1.weight"])
    assert TransformerBlock(cfg, seed=np.int64(3)).params["linear1.weight"].shape == (16, D)


@pytest.mark.parametrize("mask, error, match", [
    (np.zeros((1, 8), int), TypeError, r"key_padding_mask: expected a bool array \(True = padding key\); got dtype int64"),
    (np.zeros((1, 6), bool), ValueError, r"key_padding_mask: expected shape \(B, S\) = \(1, 8\); got \(1, 6\)"),
], ids=["int", "shape"])
def test_parallel_block_checks_its_mask(mask, error, match):
    """An int mask was accepted (and read as True/False by the attention)."""
    from preln.parallel import ParallelBlock, run_simulated
    from preln.parallel.distributed import example_block
    block = example_block("transformer")

    def rank(comm):
        ParallelBlock(block, comm, key_padding_mask=mask).forward(np.zeros((1, 8, block.config.d_model)))

    with pytest.raises(error, match=match):
        run_simulated(1, rank)
