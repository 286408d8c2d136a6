"""RoPE's long-context remedies (``scaling=`` of :mod:`preln.ops.rope`, ``LlamaConfig.rope_scaling``):
position interpolation ("linear"), NTK-aware scaling ("dynamic") and YaRN ("yarn") against their
formulas worked by hand, through the block, against bad input, and against transformers'
``ROPE_INIT_FUNCTIONS`` and ``LlamaRotaryEmbedding`` where torch and transformers are installed
(those tests skip with a reason where they are not: they are optional references)."""
import math

import numpy as np
import pytest

from preln import LlamaBlock, LlamaConfig
from preln.gradcheck import check_op_gradient, rel_error
from preln.ops import rope_backward, rope_cos_sin, rope_forward
from preln.ops.rope import RopeScaling, check_rope_scaling, rope_attention_factor, rope_frequencies

#: one float64 quantity computed two ways (a formula by hand against the package)
EXACT = 1e-13
#: analytic against central-difference gradients, float64
FD_TOL = 1e-7
#: transformers builds inv_freq in float32: one rounding of each frequency (2^-24 ~ 6e-8, twice)
F32_FREQ = 2e-7
#: its cos/sin come from float32 angles p w; for p < 256 their error is ~256 * 6e-8 = 1.5e-5 rad
F32_TABLE = 3e-5

D_H, THETA, L, S_FACTOR = 16, 1e4, 64, 4.0
LINEAR = {"rope_type": "linear", "factor": S_FACTOR}
DYNAMIC = {"rope_type": "dynamic", "factor": S_FACTOR, "original_max_position_embeddings": L}
YARN = {"rope_type": "yarn", "factor": S_FACTOR, "original_max_position_embeddings": L}


# ---- formulas by hand ----------------------------------------------------------------------------
def test_linear_is_position_interpolation():
    w = THETA ** (-np.arange(0, D_H, 2) / D_H)
    p = np.arange(0, 257, 8)
    cos, sin = rope_cos_sin(p, D_H, THETA, scaling=LINEAR)
    angle = (p[:, None] / S_FACTOR) * w                        # p -> p / s (Chen et al. 2023)
    assert np.abs(cos[:, :D_H // 2] - np.cos(angle)).max() < EXACT
    assert np.abs(sin[:, D_H // 2:] - np.sin(angle)).max() < EXACT
    # position s p under interpolation is position p without it
    c0, s0 = rope_cos_sin(p // 4, D_H, THETA)
    cl, sl = rope_cos_sin(4 * (p // 4), D_H, THETA, scaling=LINEAR)
    assert np.abs(cl - c0).max() < EXACT and np.abs(sl - s0).max() < EXACT


def test_dynamic_ntk_keeps_the_fastest_pair_and_stretches_the_slowest():
    w = rope_frequencies(D_H, THETA)
    # at or below the trained length the tables are the default ones
    for seq_len in (None, 1, L):
        np.testing.assert_array_equal(rope_frequencies(D_H, THETA, DYNAMIC, seq_len=seq_len), w)
    # factor 1 at S = 4 L: base theta * 4^(d/(d-2)); pair 0 unchanged, the last pair exactly w / 4
    plain = dict(DYNAMIC, factor=1.0)
    w4 = rope_frequencies(D_H, THETA, plain, seq_len=4 * L)
    base = THETA * 4.0 ** (D_H / (D_H - 2))
    assert rel_error(w4, base ** (-np.arange(0, D_H, 2) / D_H)) < EXACT
    assert w4[0] == 1.0 and abs(w4[-1] / w[-1] - 1 / 4) < EXACT
    # transformers' formula with factor s: the base grows by (s S / L - (s - 1))^(d/(d-2))
    ws = rope_frequencies(D_H, THETA, DYNAMIC, seq_len=4 * L)
    assert abs(ws[-1] / w[-1] - 1 / (4 * 4 - 3)) < EXACT
    # rope_cos_sin scales for max(positions) + 1
    cos, _ = rope_cos_sin(np.arange(4 * L), D_H, THETA, scaling=plain)
    assert np.abs(cos[:, :D_H // 2] - np.cos(np.arange(4 * L)[:, None] * w4)).max() < EXACT


def test_yarn_by_hand():
    # d_h = 16, theta = 1e4, L = 64: pair i turns 64 w_i / 2 pi = 10.2, 3.2, 1.02, 0.32, ... times.
    # The ramp runs over the pair index from floor(16 ln(64 / (32 * 2 pi)) / (2 ln 1e4)) = floor(-0.99)
    # -> 0 to ceil(16 ln(64 / 2 pi) / (2 ln 1e4)) = ceil(2.02) = 3: ramp i / 3, and
    # w_i' = w_i (1 - r) + r w_i / 4  ->  w_i / w_i' = 1, 1 / (2/3 + 1/12) = 4/3, 1 / (1/3 + 2/12) = 2, 4, ...
    w = rope_frequencies(D_H, THETA)
    wy = rope_frequencies(D_H, THETA, YARN)
    assert rel_error(w / wy, np.array([1, 4 / 3, 2, 4, 4, 4, 4, 4])) < EXACT
    a = 0.1 * math.log(4.0) + 1                                # the attention factor sqrt(1/t)
    assert abs(rope_attention_factor(YARN) - a) < EXACT
    cos, sin = rope_cos_sin(np.arange(50), D_H, THETA, scaling=YARN)
    assert np.abs(cos ** 2 + sin ** 2 - a ** 2).max() < EXACT   # each score grows by a^2
    assert rope_attention_factor(dict(YARN, attention_factor=1.0)) == 1.0
    assert rope_attention_factor(LINEAR) == rope_attention_factor(DYNAMIC) == rope_attention_factor(None) == 1.0
    # factor 1 changes nothing; truncate=False moves the ramp's ends off the integers
    assert rel_error(rope_frequencies(D_H, THETA, dict(YARN, factor=1.0)), w) < EXACT
    assert rope_attention_factor(dict(YARN, factor=1.0)) == 1.0
    high = D_H * math.log(L / (2 * math.pi)) / (2 * math.log(THETA))      # 2.02, not rounded up to 3
    r = np.clip(np.arange(D_H // 2) / high, 0, 1)
    wt = rope_frequencies(D_H, THETA, dict(YARN, truncate=False))
    assert rel_error(w / wt, 1 / (1 - r + r / S_FACTOR)) < EXACT and (w / wt)[1] > 4 / 3


@pytest.mark.parametrize("scaling", [LINEAR, YARN], ids=["linear", "yarn"])
def test_static_remedies_keep_scores_a_function_of_the_offset(rng, scaling):
    q, k = rng.standard_normal((2, 1, 1, 1, D_H))

    def score(m, n):
        return float(np.sum(rope_forward(q, [m], THETA, scaling=scaling)[0]
                            * rope_forward(k, [n], THETA, scaling=scaling)[0]))

    assert abs(score(5, 2) - score(205, 202)) < 1e-12 * abs(score(5, 2)) + 1e-12


@pytest.mark.parametrize("scaling", [LINEAR, DYNAMIC, YARN], ids=["linear", "dynamic", "yarn"])
def test_scaled_rope_gradient(rng, scaling):
    positions = np.arange(3) + 70                              # past L: "dynamic" scales
    x = rng.standard_normal((2, 2, 3, 8))
    err = check_op_gradient(lambda x: rope_forward(x, positions, 100.0, scaling=scaling), rope_backward,
                            dict(x=x), ["x"], rng)
    assert err["x"] < FD_TOL


# ---- through the block -------------------------------------------------------------------------------
def test_block_with_linear_scaling_is_the_block_at_positions_over_s(rng):
    cfg = LlamaConfig(d_model=32, n_heads=4, n_kv_heads=2, d_ff=48)
    plain = LlamaBlock(cfg, dtype=np.float64, seed=3)
    # weights 10x the initial ones: scores far from 0, so that positions matter to the output
    plain.load_state_dict({k: v if "layernorm" in k else 10 * v for k, v in plain.state_dict().items()})
    scaled = LlamaBlock(LlamaConfig(d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, rope_scaling=LINEAR),
                        dtype=np.float64, seed=3)
    scaled.load_state_dict(plain.state_dict())
    assert scaled.config.rope_scaling == RopeScaling("linear", 4.0)
    hash(scaled.config)                                        # the frozen config stays hashable
    x = rng.standard_normal((2, 6, 32))
    assert rel_error(scaled(x, positions=4 * np.arange(6)), plain(x)) < EXACT
    assert rel_error(scaled(x), plain(x)) > 1e-3               # and the scaling is used at all


def test_block_decode_uses_the_scaling(rng):
    blk = LlamaBlock(LlamaConfig(d_model=16, n_heads=2, n_kv_heads=1, d_ff=24, rope_scaling=YARN),
                     dtype=np.float64, seed=0)
    blk.load_state_dict({k: v if "layernorm" in k else 10 * v for k, v in blk.state_dict().items()})
    blk.eval()
    x = rng.standard_normal((1, 9, 16))
    kv = blk.kv_cache(1, 9)
    parts = [blk.decode(x[:, :5], kv), blk.decode(x[:, 5:], kv)]
    assert rel_error(np.concatenate(parts, 1), blk(x)) < 1e-12


def test_fused_and_op_by_op_blocks_agree_with_yarn_tables(rng):
    # the fused RoPE kernel takes YaRN's tables (cos, sin times the attention factor) as they are
    blk = LlamaBlock(LlamaConfig(d_model=16, n_heads=2, n_kv_heads=1, d_ff=24, rope_scaling=YARN),
                     dtype=np.float64, seed=1)
    blk.load_state_dict({k: v if "layernorm" in k else 10 * v for k, v in blk.state_dict().items()})
    x, dy = rng.standard_normal((2, 2, 70, 16))
    out = {}
    for fused in (True, False):
        blk.fused = fused
        assert blk.fuses() is fused
        blk.zero_grad()
        y = blk(x)
        out[fused] = (y, blk.backward(dy), {k: g.copy() for k, g in blk.grads.items()})
    assert rel_error(out[True][0], out[False][0]) < 1e-12 and rel_error(out[True][1], out[False][1]) < 1e-12
    assert all(rel_error(out[True][2][k], out[False][2][k]) < 1e-12 for k in out[True][2])


def test_scaling_accepts_a_dict_or_a_named_tuple():
    assert check_rope_scaling(None) is None
    assert check_rope_scaling(YARN) == RopeScaling("yarn", 4.0, 64)
    assert check_rope_scaling(RopeScaling("dynamic", 2, 8)).factor == 2.0


# ---- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scaling, err, match", [
    ({"rope_type": "ntk", "factor": 2.0}, ValueError, r"scaling\['rope_type'\]: expected one of"),
    ({"rope_type": "linear", "factor": 0.5}, ValueError, r"scaling\['factor'\]: expected a number >= 1"),
    ({"rope_type": "linear", "factor": float("inf")}, ValueError, r"scaling\['factor'\]"),
    ({"rope_type": "linear", "factor": True}, ValueError, r"scaling\['factor'\]"),
    ({"rope_type": "yarn", "factor": 4.0}, ValueError, r"original_max_position_embeddings'\]: expected the trained"),
    ({"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 6.4}, ValueError,
     r"original_max_position_embeddings"),
    ({"rope_type": "linear", "factor": 2.0, "scale": 2}, ValueError, r"got unknown \['scale'\]"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, ValueError, r"no 'rope_theta' key"),
    (dict(YARN, beta_fast=1.0, beta_slow=32.0), ValueError, r"beta_fast > beta_slow > 0"),
    (dict(YARN, attention_factor=-1.0), ValueError, r"attention_factor'\]: expected None or a number > 0"),
    (dict(YARN, truncate="yes"), TypeError, r"truncate'\]: expected True or False"),
    ("yarn", TypeError, r"scaling: expected None, a RopeScaling or a dict"),
])
def test_bad_scaling(scaling, err, match):
    with pytest.raises(err, match=match):
        rope_cos_sin(np.arange(4), D_H, THETA, scaling=scaling)


def test_bad_scaling_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"rope_scaling\['rope_type'\]"):
        LlamaConfig(rope_scaling={"rope_type": "bogus"})
    with pytest.raises(ValueError, match=r"seq_len: expected None or an int >= 1; got 0"):
        rope_frequencies(D_H, THETA, DYNAMIC, seq_len=0)
    with pytest.raises(ValueError, match=r"d_head: expected d_h >= 4 for rope_type 'dynamic'"):
        rope_frequencies(2, THETA, DYNAMIC)


# ---- against transformers (optional reference) -------------------------------------------------------
def _transformers():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: it is an optional reference, never a "
                                "dependency")
    pytest.importorskip("transformers", reason="transformers not installed: it is an optional test-only "
                        "reference (.ci/run installs transformers==5.23.0 next to the local torch wheel)")
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    return torch, HFLlamaConfig, ROPE_INIT_FUNCTIONS, LlamaRotaryEmbedding


def _hf_config(HFLlamaConfig, scaling):
    params = {k: v for k, v in scaling.items() if not (scaling["rope_type"] == "dynamic"
                                                     and k == "original_max_position_embeddings")}
    # transformers' "dynamic" reads the trained length from max_position_embeddings
    return HFLlamaConfig(hidden_size=2 * D_H, num_attention_heads=2, head_dim=D_H, max_position_embeddings=L,
                         rope_parameters={**params, "rope_theta": THETA})


CASES = [LINEAR, DYNAMIC, YARN, dict(YARN, factor=8.0, beta_fast=16, beta_slow=2, truncate=False),
         dict(YARN, attention_factor=1.0)]
CASE_IDS = ["linear", "dynamic", "yarn", "yarn-options", "yarn-no-temperature"]


@pytest.mark.parametrize("scaling", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("seq_len", [None, 4 * L])
def test_frequencies_equal_transformers_rope_init_functions(scaling, seq_len):
    torch, HFLlamaConfig, ROPE_INIT_FUNCTIONS, _ = _transformers()
    inv_freq, attention = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](_hf_config(HFLlamaConfig, scaling), "cpu",
                                                                    seq_len=seq_len)
    ours = rope_frequencies(D_H, THETA, scaling, seq_len=seq_len)
    assert rel_error(ours, inv_freq.double().numpy()) < F32_FREQ
    assert abs(rope_attention_factor(scaling) - attention) < EXACT


@pytest.mark.parametrize("scaling", CASES, ids=CASE_IDS)
def test_tables_equal_transformers_rotary_embedding(scaling):
    torch, HFLlamaConfig, _, LlamaRotaryEmbedding = _transformers()
    emb = LlamaRotaryEmbedding(_hf_config(HFLlamaConfig, scaling))
    for S in (L // 2, 4 * L):                        # "dynamic" rescales past L and resets below it
        cos_t, sin_t = emb(torch.zeros(1, S, 2 * D_H), torch.arange(S)[None])
        cos, sin = rope_cos_sin(np.arange(S), D_H, THETA, scaling=scaling)
        assert np.abs(cos - cos_t[0].double().numpy()).max() < F32_TABLE
        assert np.abs(sin - sin_t[0].double().numpy()).max() < F32_TABLE
