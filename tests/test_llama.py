"""preln.LlamaBlock: gradient checks of dx and every parameter, decoding with a KV cache over any
split of the sequence, GQA as MHA with repeated heads, RoPE's shift invariance, state, modes,
16-bit storage and the errors bad input gets.

Gradient checks run on tiny float64 blocks (B=2, S=5, D=16, H=4, F=24) so that perturbing each of
the ~1800 parameters stays fast; the loss is L = sum(y * w) with a random w, so dL/dy = w. The
weights are scaled up from the N(0, 0.02^2) initialisation so that every term of the backward
matters (at 0.02 the block is nearly the identity).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preln import LlamaBlock, LlamaConfig, LlamaKVCache
from preln.gradcheck import numerical_gradient, rel_error
from preln.nn.llama import INIT_STD, llama_param_shapes
from preln.precision import BFLOAT16

#: analytic vs central-difference gradients (eps = 1e-6) in float64
GRAD_TOL = 1e-7
#: the same float64 computation done two ways (fused vs op by op, tiled vs plain, decode vs forward)
SAME_F64 = 1e-12
#: the same float32 computation done two ways, relative to the output's scale
SAME_F32 = 2e-6
#: 16-bit storage against the float64 block: a few units of the format's epsilon, at the output's scale
F16_TOL, BF16_TOL = 5e-3, 4e-2
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None)

B, S, D, H, F = 2, 5, 16, 4, 24
HEADS = {"MHA": 4, "GQA": 2, "MQA": 1}
PADDING = np.array([[False, False, False, False, True],
                    [False, True, False, False, False]])


def make(n_kv_heads=2, dtype=np.float64, seed=0, scale=10.0, **kw):
    """A small block whose weights are `scale` times the default's, RMSNorm gains near 1."""
    cfg = LlamaConfig(d_model=D, n_heads=H, n_kv_heads=n_kv_heads, d_ff=F, rope_theta=100.0)
    block = LlamaBlock(cfg, dtype=dtype, seed=seed, **kw)
    rng = np.random.default_rng(seed + 100)
    sd = {k: (1 + 0.2 * rng.standard_normal(v.shape) if "layernorm" in k else scale * v.astype(np.float64))
          for k, v in block.state_dict().items()}
    block.load_state_dict(sd)
    return block


def gradient_errors(block, x, kpm=None, positions=None, rng=None):
    w = rng.standard_normal(x.shape)

    def loss(xv):
        return float(np.sum(block(xv, kpm, positions) * w))

    block.zero_grad()
    block(x, kpm, positions)
    dx = block.backward(w)
    errors = {"x": rel_error(dx, numerical_gradient(loss, x))}
    for name in list(block.params):
        original = block.params[name]

        def loss_p(value, name=name):
            block.params[name] = value
            return loss(x)
        numeric = numerical_gradient(loss_p, original)
        block.params[name] = original
        errors[name] = rel_error(block.grads[name], numeric)
    return errors


@pytest.mark.parametrize("variant", ["causal", "padded", "positions", "tiled"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "op-by-op"])
@pytest.mark.parametrize("heads", list(HEADS))
def test_block_gradients(heads, fused, variant, rng):
    block = make(HEADS[heads], fused=fused, attention="tiled" if variant == "tiled" else "auto")
    x = rng.standard_normal((B, S, D))
    kpm = PADDING if variant == "padded" else None
    positions = np.array([np.arange(S) + 2, np.arange(S) + 7]) if variant == "positions" else None
    errors = gradient_errors(block, x, kpm, positions, rng)
    assert set(errors) == {"x"} | set(llama_param_shapes(block.config))
    bad = {k: v for k, v in errors.items() if not v < GRAD_TOL}
    assert not bad, bad


@pytest.mark.parametrize("dtype, tol", [(np.float64, SAME_F64), (np.float32, SAME_F32)], ids=["float64", "float32"])
@pytest.mark.parametrize("heads", list(HEADS))
def test_fused_equals_op_by_op(heads, dtype, tol, rng):
    fused, plain = make(HEADS[heads], dtype, fused=True), make(HEADS[heads], dtype, fused=False)
    assert fused.fuses() and not plain.fuses()
    x = rng.standard_normal((B, S, D)).astype(dtype)
    dy = rng.standard_normal((B, S, D)).astype(dtype)
    y1, y2 = fused(x, PADDING), plain(x, PADDING)
    assert fused.cache.fused and not plain.cache.fused
    assert rel_error(y1, y2) < tol
    assert rel_error(fused.backward(dy), plain.backward(dy)) < tol
    for k in fused.grads:
        assert rel_error(fused.grads[k], plain.grads[k]) < tol, k


@pytest.mark.parametrize("heads", list(HEADS))
def test_eval_tiled_equals_train_plain(heads, rng):
    block = make(HEADS[heads])
    x = rng.standard_normal((B, S, D))
    dy = rng.standard_normal((B, S, D))
    y_train = block.train()(x, PADDING)
    dx_train = block.backward(dy)
    assert block.cache.attn.sdpa.p is not None                     # training keeps P
    y_eval = block.eval()(x, PADDING)
    assert block.cache.attn.sdpa.p is None                         # tiled: P is recomputed
    dx_eval = block.backward(dy)
    assert rel_error(y_eval, y_train) < SAME_F64 and rel_error(dx_eval, dx_train) < SAME_F64


def test_causal(rng):
    """Output at position t does not depend on inputs after t, and a padding key is never read."""
    block = make(2)
    x = rng.standard_normal((B, S, D))
    y = block(x)
    x2 = x.copy()
    x2[:, 3:] += 5.0
    np.testing.assert_array_equal(block(x2)[:, :3], y[:, :3])
    x3 = x.copy()
    x3[0, 4] += 5.0                                                # padding key of sequence 0
    y_pad, y_pad3 = block(x, PADDING), block(x3, PADDING)
    np.testing.assert_array_equal(y_pad3[0, :4], y_pad[0, :4])


@pytest.mark.parametrize("n_kv", [2, 1], ids=["GQA", "MQA"])
def test_gqa_is_mha_with_repeated_key_value_weights(n_kv, rng):
    """A GQA block equals the MHA block whose k_proj / v_proj weights repeat each key/value head's
    rows for the G query heads that read it: the gradients of the repeated rows sum to GQA's."""
    gqa = make(n_kv)
    cfg = gqa.config
    G, dh = cfg.n_groups, cfg.d_head
    mha = LlamaBlock(LlamaConfig(d_model=D, n_heads=H, n_kv_heads=H, d_ff=F, rope_theta=100.0), dtype=np.float64)
    sd = gqa.state_dict()
    for name in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        sd[name] = np.repeat(sd[name].reshape(n_kv, dh, D), G, axis=0).reshape(H * dh, D)
    mha.load_state_dict(sd)
    x, dy = rng.standard_normal((B, S, D)), rng.standard_normal((B, S, D))
    assert rel_error(gqa(x, PADDING), mha(x, PADDING)) < SAME_F64
    assert rel_error(gqa.backward(dy), mha.backward(dy)) < SAME_F64
    for name in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        summed = mha.grads[name].reshape(n_kv, G, dh, D).sum(1).reshape(n_kv * dh, D)
        assert rel_error(gqa.grads[name], summed) < SAME_F64
    assert gqa.cache_nbytes() < mha.cache_nbytes()                 # k and v are G times smaller


@PROPERTY_SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), shift=st.integers(0, 5000), heads=st.sampled_from(list(HEADS)))
def test_a_shift_of_every_position_changes_nothing(seed, shift, heads):
    """RoPE makes every score a function of m - n: moving the whole sequence by `shift` positions
    leaves the block's output unchanged (to the round-off of cos/sin at angles up to ~5000)."""
    block = _cached_block(HEADS[heads])
    x = np.random.default_rng(seed).standard_normal((1, S, D))
    y0 = block(x)
    y1 = block(x, positions=np.arange(shift, shift + S))
    assert rel_error(y1, y0) < 1e-10


_BLOCKS = {}


def _cached_block(n_kv):
    if n_kv not in _BLOCKS:
        _BLOCKS[n_kv] = make(n_kv).eval()
    return _BLOCKS[n_kv]


# ---- decoding --------------------------------------------------------------------------------------
@PROPERTY_SETTINGS
@given(data=st.data(), heads=st.sampled_from(list(HEADS)), S_total=st.integers(1, 12),
       fused=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_decode_equals_the_full_forward_over_any_split(data, heads, S_total, fused, seed):
    cuts = sorted(data.draw(st.sets(st.integers(1, S_total - 1), max_size=S_total - 1), label="cuts")) \
        if S_total > 1 else []
    block = _cached_block(HEADS[heads])
    block.fused = fused
    x = np.random.default_rng(seed).standard_normal((B, S_total, D))
    full = block(x)
    kv = block.kv_cache(B, S_total + 2)
    bounds = [0, *cuts, S_total]
    out = [block.decode(x[:, a:b], kv) for a, b in zip(bounds[:-1], bounds[1:])]
    block.fused = True
    assert kv.length == S_total
    assert rel_error(np.concatenate(out, axis=1), full) < SAME_F64


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, BFLOAT16],
                         ids=["float64", "float32", "float16", "bfloat16"])
def test_kv_cache_holds_n_kv_heads(heads, dtype):
    block = LlamaBlock(LlamaConfig(d_model=D, n_heads=H, n_kv_heads=HEADS[heads], d_ff=F), dtype=dtype)
    kv = block.kv_cache(3, 11)
    itemsize = np.dtype(dtype).itemsize
    assert isinstance(kv, LlamaKVCache) and kv.k.shape == (3, HEADS[heads], 11, D // H)
    assert kv.nbytes == 2 * 3 * 11 * HEADS[heads] * (D // H) * itemsize
    assert block.kv_cache(3, 11, dtype=np.float16).nbytes == 2 * 3 * 11 * HEADS[heads] * (D // H) * 2
    assert "n_kv_heads=" in repr(kv)


def test_decode_errors(rng):
    block = make(2)
    x = rng.standard_normal((B, 3, D))
    kv = block.kv_cache(B, 4)
    with pytest.raises(RuntimeError, match="training mode"):
        block.decode(x, kv)
    block.eval()
    with pytest.raises(TypeError, match="LlamaKVCache"):
        block.decode(x, object())
    with pytest.raises(ValueError, match="H_kv = 2"):
        block.decode(x, make(1).kv_cache(B, 4))
    with pytest.raises(ValueError, match="batch B = 2"):
        block.decode(rng.standard_normal((1, 3, D)), kv)
    block.decode(x, kv)
    with pytest.raises(ValueError, match="the cache is full"):
        block.decode(x[:, :2], kv)
    assert kv.length == 3                                          # a failed step appends nothing


# ---- state, modes, precision --------------------------------------------------------------------
def test_state_dict_names_shapes_and_init():
    cfg = LlamaConfig(d_model=64, n_heads=8, n_kv_heads=2, d_ff=176)
    block = LlamaBlock(cfg, seed=0)
    sd = block.state_dict()
    assert list(sd) == ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                        "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                        "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                        "mlp.down_proj.weight"]
    assert sd["self_attn.k_proj.weight"].shape == (16, 64) and sd["mlp.down_proj.weight"].shape == (64, 176)
    assert (sd["input_layernorm.weight"] == 1).all()
    assert abs(sd["mlp.gate_proj.weight"].std() / INIT_STD - 1) < 0.05
    sd["mlp.up_proj.weight"][0, 0] = 7.0
    assert block.params["mlp.up_proj.weight"][0, 0] != 7.0          # a copy
    other = LlamaBlock(cfg, seed=1)
    other.load_state_dict(sd)
    assert all(np.array_equal(other.params[k], sd[k]) for k in sd)
    assert LlamaBlock(cfg, seed=0).state_dict()["self_attn.q_proj.weight"].tobytes() == \
        block.state_dict()["self_attn.q_proj.weight"].tobytes()    # the seed fixes the weights


def test_load_state_dict_errors():
    block = make(2)
    sd = block.state_dict()
    with pytest.raises(TypeError, match="dict"):
        block.load_state_dict([1])
    with pytest.raises(KeyError, match="missing key 'mlp.up_proj.weight'"):
        block.load_state_dict({k: v for k, v in sd.items() if k != "mlp.up_proj.weight"})
    with pytest.raises(KeyError, match="unexpected key 'self_attn.q_proj.bias'"):
        block.load_state_dict({**sd, "self_attn.q_proj.bias": np.zeros(D)})
    with pytest.raises(ValueError, match=r"self_attn.k_proj.weight.*expected shape \(8, 16\)"):
        block.load_state_dict({**sd, "self_attn.k_proj.weight": np.zeros((16, 16))})


def test_modes_and_gradient_accumulation(rng):
    block = make(2)
    assert block.training and block.eval() is block and not block.training
    assert block.train() is block and block.training
    x, dy = rng.standard_normal((B, S, D)), rng.standard_normal((B, S, D))
    block(x)
    block.backward(dy)
    once = {k: v.copy() for k, v in block.grads.items()}
    block(x)
    block.backward(dy)
    assert all(rel_error(block.grads[k], 2 * once[k]) < SAME_F64 for k in once)
    block.zero_grad()
    assert all((g == 0).all() for g in block.grads.values())
    assert block.cache_nbytes() > 0


@pytest.mark.parametrize("dtype, tol", [(np.float16, F16_TOL), (BFLOAT16, BF16_TOL)], ids=["float16", "bfloat16"])
def test_16bit_storage_is_close_to_float64(dtype, tol, rng):
    ref = make(2, scale=5.0)
    low = make(2, dtype=dtype, scale=5.0)
    assert not low.fuses()
    x = rng.standard_normal((B, S, D))
    y_ref, y = ref(x, PADDING), low(x, PADDING)
    assert y.dtype == dtype
    assert rel_error(y.astype(np.float64), y_ref) < tol
    dx = low.backward(np.ones_like(y))
    assert dx.dtype == dtype and all(g.dtype == dtype for g in low.grads.values())
    assert low.cache.norm1.rrms.dtype == np.float32               # the statistic in float32


def test_trace_names_the_op_that_overflows(rng):
    block = make(2, dtype=np.float16, scale=5.0, trace=True, policy="naive")
    x = 400 * rng.standard_normal((B, S, D))                       # sum of x^2 overflows float16
    block(x)
    assert block.overflow is not None and block.overflow.op == "input_layernorm.mean_square"
    safe = make(2, dtype=np.float16, scale=5.0, trace=True)
    safe(x)
    assert safe.overflow is None


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_heads=4, n_kv_heads=3), ValueError, "n_kv_heads: expected a divisor of n_heads=4"),
    (dict(d_model=24, n_heads=8, n_kv_heads=8), ValueError, "even head width.*d_h=3"),
    (dict(d_model=30, n_heads=4), ValueError, "n_heads: expected a divisor of d_model=30"),
    (dict(n_kv_heads=0), ValueError, "n_kv_heads: expected a positive int"),
    (dict(d_ff=2.5), ValueError, "d_ff: expected a positive int"),
    (dict(rope_theta=1.0), ValueError, "rope_theta"),
    (dict(eps=0.0), ValueError, "eps"),
])
def test_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        LlamaConfig(**kwargs)


def test_block_errors(rng):
    cfg = LlamaConfig(d_model=D, n_heads=H, n_kv_heads=2, d_ff=F)
    with pytest.raises(TypeError, match="preln.LlamaConfig"):
        LlamaBlock({"d_model": 16})
    with pytest.raises(TypeError, match="dtype"):
        LlamaBlock(cfg, dtype=np.int32)
    with pytest.raises(ValueError, match="attention"):
        LlamaBlock(cfg, attention="flash")
    block = LlamaBlock(cfg)
    with pytest.raises(RuntimeError, match="no forward"):
        block.backward(np.zeros((B, S, D)))
    with pytest.raises(ValueError, match="last dimension D = d_model = 16"):
        block(np.zeros((B, S, 8)))
    with pytest.raises(ValueError, match=r"positions: expected shape \(S,\) = \(5,\)"):
        block(np.zeros((B, S, D)), positions=np.arange(4))
    with pytest.raises(TypeError, match="key_padding_mask"):
        block(np.zeros((B, S, D)), np.zeros((B, S)))
    block(np.zeros((B, S, D)))
    with pytest.raises(ValueError, match="dy: expected shape"):
        block.backward(np.zeros((B, S + 1, D)))


def test_llama_ffn_width_is_metas_rule():
    from preln.nn.llama import llama_ffn_width
    assert llama_ffn_width(4096) == 11008                    # Llama 2 7B
    assert llama_ffn_width(5120) == 13824                    # Llama 2 13B
    assert llama_ffn_width(8192, 1.3, 4096) == 28672         # Llama 2 70B
    assert llama_ffn_width(4096, 1.3, 1024) == 14336         # Llama 3 8B
    with pytest.raises(ValueError, match="multiple_of"):
        llama_ffn_width(4096, 1.0, 0)
