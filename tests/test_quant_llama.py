"""preln.quant.weight_only.quantize_model: a Llama LM quantised weight-only (RTN, GPTQ, AWQ) computes the float forward of
its own dequantised weights, decodes through the fused kernels to the same logits as its forward,
stores ~bits/32 of float32's bytes, and refuses bad arguments by name."""
import numpy as np
import pytest

import preln.gguf
from preln.models.llama_lm import LlamaLM, LlamaLMConfig
from preln.quant.weight_only import MATVEC_ROWS, QuantLinear, WeightOnlyLlama, quantize_model
from preln.nn.llama import LlamaBlock
from preln.quant import groups as gq

#: the quantised forward (BLAS on the dequantised float32 matrices) against the float32 model of
#: the same weights: the same products, so round-off only
QUANT_FORWARD_RTOL = 1e-5
#: decode (fused kernels, float32 sums in another order, the zero point applied per group) against
#: the forward, relative to the largest logit
DECODE_RTOL = 1e-4

CFG = LlamaLMConfig(vocab_size=50, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, n_layers=2, init="llama")


def tiny_lm(seed=0):
    """A float32 LlamaLM of random LlamaBlocks, tied head (SmolLM2's layout), no file needed."""
    rng = np.random.default_rng(seed)
    layers = [LlamaBlock(CFG.block_config(), dtype=np.float32, seed=seed + i).eval() for i in range(CFG.n_layers)]
    for layer in layers:   # gains away from 1 so that a wrong norm shows
        for k in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            layer.params[k] = rng.uniform(0.5, 1.5, CFG.d_model).astype(np.float32)
    embed = rng.normal(0, 0.5, (CFG.vocab_size, CFG.d_model)).astype(np.float32)
    own = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(CFG.d_model, np.float32),
           "lm_head.weight": embed}
    return LlamaLM.from_parts(CFG, layers, own)


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


@pytest.fixture(scope="module")
def calib():
    return np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 12))


IDS = np.array([[3, 17, 4, 41, 0, 9, 22, 8]])


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
@pytest.mark.parametrize("bits,group_size", [(3, 32), (4, 32), (4, None), (8, 32), (8, None)])
def test_forward_is_the_dequantised_float_forward_and_decode_matches(lm, calib, method, bits, group_size):
    qlm = quantize_model(lm, method, bits, group_size, calib=None if method == "rtn" else calib)
    assert isinstance(qlm, WeightOnlyLlama) and qlm.bits == bits and qlm.head_quantized
    ref = qlm.dequantized()(IDS)
    got = qlm(IDS)
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= QUANT_FORWARD_RTOL * scale
    assert np.abs(ref - lm(IDS)).max() > 1e-3 * scale        # it is a quantised model
    kv = qlm.kv_cache(1, IDS.shape[1])
    steps = np.concatenate([qlm.decode(IDS[:, i:i + 1], kv) for i in range(IDS.shape[1])], axis=1)
    assert kv.length == IDS.shape[1]
    assert np.abs(steps - got).max() <= DECODE_RTOL * scale


def test_decode_runs_the_kernels_and_generate_follows_it(lm, monkeypatch):
    qlm = quantize_model(lm, "rtn", 4, 32)
    calls = []
    from preln.quant import qmatvec
    real = qmatvec.TiledQuant.matmul
    monkeypatch.setattr(qmatvec.TiledQuant, "matmul", lambda self, x: calls.append(x.shape) or real(self, x))
    kv = qlm.kv_cache(1, 4)
    qlm.decode(IDS[:, :1], kv)
    assert len(calls) == 7 * CFG.n_layers + 1                 # seven linears a block, and the head
    assert set(calls) <= {(1, CFG.d_model), (1, CFG.d_ff)}   # one vector each: the decode kernel
    out = qlm.generate(IDS[0, :4], 3)
    assert out.shape == (7,) and (out[:4] == IDS[0, :4]).all()
    greedy = [int(np.argmax(qlm(out[:t])[-1])) for t in range(4, 7)]
    assert list(out[4:]) == greedy


def test_weight_bytes_fall_with_the_bits(lm):
    f32 = lm.weight_nbytes()
    q8, q4 = quantize_model(lm, "rtn", 8, None), quantize_model(lm, "rtn", 4, 32)
    n_codes = sum(int(np.prod(l.shape)) for layer in q4.layers for l in layer.linears.values()) \
        + CFG.vocab_size * CFG.d_model
    groups = n_codes // 32
    gains = (2 * CFG.n_layers + 1) * CFG.d_model * 4
    assert q4.weight_nbytes() == n_codes // 2 + (4 + 1) * groups + gains   # float32 scale, one-byte zero
    assert f32 / q8.weight_nbytes() > 3.5 and f32 / q4.weight_nbytes() > 5
    assert q4.num_params() == lm.num_params()


def test_awq_input_scales_reach_the_tied_embedding(lm, calib):
    qlm = quantize_model(lm, "awq", 4, 32, calib=calib)
    assert qlm.head.in_scale is not None
    table = qlm.params["model.embed_tokens.weight"]
    np.testing.assert_allclose(table, qlm.head.dequantize(), rtol=0, atol=0)
    kv = qlm.kv_cache(1, 1)
    np.testing.assert_allclose(qlm.decode(IDS[:, :1], kv), qlm.dequantized().decode(
        IDS[:, :1], qlm.dequantized().kv_cache(1, 1)), rtol=0, atol=DECODE_RTOL * 10)


@pytest.mark.parametrize("M,K,g,bits,sym", [(7, 96, 32, 4, False), (5, 96, None, 4, False), (3, 10, 2, 4, True),
                                            (9, 96, 3, 8, False), (4, 30, None, 8, True), (6, 12, 12, 3, False)])
def test_quant_linear_kernels_equal_the_numpy_reference(M, K, g, bits, sym):
    rng = np.random.default_rng(M * K)
    w = rng.standard_normal((M, K))
    lin = QuantLinear(gq.rtn(w, bits, g, sym))
    w_hat = gq.rtn(w, bits, g, sym).dequantize()               # float64, the groups module's own
    np.testing.assert_allclose(lin.dequantize(), w_hat, rtol=1e-6, atol=1e-7)
    for rows in (1, MATVEC_ROWS, MATVEC_ROWS + 3):             # kernel path and BLAS path
        x = rng.standard_normal((rows, K)).astype(np.float32)
        ref = x.astype(np.float64) @ w_hat.T
        assert np.abs(lin(x) - ref).max() <= 1e-5 * np.abs(ref).max()


def test_bad_input(lm, calib):
    with pytest.raises(ValueError, match="bits"):
        quantize_model(lm, "rtn", 9, 32)
    with pytest.raises(ValueError, match="bits"):
        quantize_model(lm, "rtn", 1, 32)
    with pytest.raises(ValueError, match="group_size: expected a divisor of the K = 64"):
        quantize_model(lm, "rtn", 4, 40)
    with pytest.raises(ValueError, match="group_size: expected an even group size"):
        quantize_model(lm, "rtn", 4, 1)
    with pytest.raises(ValueError, match="method"):
        quantize_model(lm, "smoothquant", 4, 32)
    with pytest.raises(ValueError, match="calib: method 'gptq' needs calibration"):
        quantize_model(lm, "gptq", 4, 32)
    with pytest.raises(ValueError, match="calib: expected token ids"):
        quantize_model(lm, "awq", 4, 32, calib=np.array([[CFG.vocab_size]]))
    with pytest.raises(TypeError, match="takes no options"):
        quantize_model(lm, "rtn", 4, 32, damp=0.1)
    with pytest.raises(TypeError, match="lm: expected a preln.models.lm.TinyLM or a float preln.models.llama_lm.LlamaLM"):
        quantize_model(quantize_model(lm, "rtn", 4, 32), "rtn")
    with pytest.raises(TypeError, match="lm: expected"):
        quantize_model({"weights": 1}, "rtn")
    qlm = quantize_model(lm, "rtn", 4, 32)
    with pytest.raises(RuntimeError, match="inference-only"):
        qlm.layers[0].backward(np.zeros((1, 1, CFG.d_model), np.float32))
    with pytest.raises(TypeError, match="kv: expected the StackKVCache"):
        qlm.decode(IDS[:, :1], None)


def test_smollm2_int4_decode_agrees_with_its_forward():
    try:
        path = preln.gguf.smollm2_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"SmolLM2's GGUF is not installed: {e}")
    lm = LlamaLM.from_gguf(path)
    with pytest.raises(ValueError, match="group_size: expected a divisor of the K = 576"):
        quantize_model(lm, "rtn", 4, 128)
    qlm = quantize_model(lm, "rtn", 4, 32)
    assert lm.weight_nbytes() / qlm.weight_nbytes() > 5
    ids = np.array(lm.tokenizer.encode("The printing press changed Europe because"))
    full = qlm(ids)
    kv = qlm.kv_cache(1, len(ids))
    qlm.decode(ids[None, :-1], kv)
    last = qlm.decode(ids[None, -1:], kv)[0, -1]
    assert np.abs(last - full[-1]).max() <= DECODE_RTOL * np.abs(full).max()
