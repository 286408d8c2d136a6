"""Tiled attention (the online softmax of FlashAttention, Dao et al. 2022) equals plain attention.

The tiled path is what eval mode runs (and training with attention="tiled"); the plain path is the
reference, so they must agree to round-off for every tiling and every mask. The second half checks
the tiled training forward and FlashAttention-2's backward: gradients equal the plain attention's
(float64, round-off) with dropout (the same mask), masks, MHA, GQA and MQA, and central differences.
"""
import numpy as np
import pytest

from preln.ops import attention_forward, flash_attention_forward
from preln.ops.attention import K_TILE, Q_TILE
from preln.precision import NAIVE, SAFE

#: max|tiled - plain| / max(1, max|plain|), by dtype: the same sums in a different order
TILED_TOL = {np.float64: 1e-12, np.float32: 1e-6, np.float16: 2e-3}

#: (S, q_tile, k_tile): one tile, S a multiple of the tiles, S not a multiple, tiles of 1,
#: tiles larger than S, and the defaults
TILINGS = [(1, 4, 4), (7, 8, 8), (16, 4, 8), (37, 8, 5), (50, 16, 16), (33, 1, 3), (64, 64, 16),
           (20, 100, 100), (600, Q_TILE, K_TILE)]
MASKS = ["none", "causal", "padding", "padding+causal", "fully_masked", "first_key_tile_masked",
         "first_key_tile_masked+causal"]


def make_mask(kind, B, S, k_tile, rng):
    """(key_padding_mask, causal) for a mask kind."""
    causal = "causal" in kind
    if kind.startswith("padding"):
        kpm = rng.random((B, S)) < 0.3
    elif kind == "fully_masked":
        kpm = np.zeros((B, S), bool)
        kpm[1] = True                    # every key of sequence 1 is padding: its output is 0
    elif kind.startswith("first_key_tile_masked"):
        kpm = np.zeros((B, S), bool)
        kpm[:, :min(k_tile, S - 1)] = True   # every query sees nothing in the first key tile;
    else:                                    # with causal, early query tiles see no key at all
        kpm = None
    return kpm, causal


def tiled_error(o_tiled, o_plain):
    o_tiled, o_plain = o_tiled.astype(np.float64), o_plain.astype(np.float64)
    return float(np.abs(o_tiled - o_plain).max() / max(1.0, np.abs(o_plain).max()))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("S, q_tile, k_tile", TILINGS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_tiled_equals_plain(dtype, S, q_tile, k_tile, mask):
    rng = np.random.default_rng(S * 1000 + q_tile * 10 + k_tile)
    B, H, dh = 2, 2, 8
    q, k, v = (rng.standard_normal((B, H, S, dh)).astype(dtype) for _ in range(3))
    kpm, causal = make_mask(mask, B, S, k_tile, rng)
    o_plain, _ = attention_forward(q, k, v, kpm, causal)
    o_tiled = flash_attention_forward(q, k, v, kpm, causal, q_tile=q_tile, k_tile=k_tile)
    assert o_tiled.dtype == dtype and o_tiled.shape == (B, H, S, dh)
    assert np.isfinite(o_tiled).all()
    assert tiled_error(o_tiled, o_plain) < TILED_TOL[dtype]
    if mask == "fully_masked":
        np.testing.assert_array_equal(o_tiled[1], 0)


def test_tiled_handles_large_logits_by_rescaling():
    """Logits of ~1e3: exp overflows float32 without the running max, the recurrence never does."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 40, 4)) * s for s in (30, 30, 1))
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    o_plain, _ = attention_forward(q, k, v)
    o_tiled = flash_attention_forward(q, k, v, q_tile=8, k_tile=8)
    assert np.isfinite(o_tiled).all()
    assert tiled_error(o_tiled, o_plain) < TILED_TOL[np.float32]


@pytest.mark.parametrize("mask", ["none", "causal", "padding+causal", "fully_masked"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16],
                         ids=["float64", "float32", "float16"])
@pytest.mark.parametrize("policy", [SAFE, NAIVE], ids=["safe", "naive"])
def test_tiled_equals_plain_under_each_policy(policy, dtype, mask):
    """The naive policy: no max subtraction, logits scaled after the product, 16-bit arithmetic."""
    rng = np.random.default_rng(42)
    B, H, S, dh = 2, 2, 45, 8
    q, k, v = (rng.standard_normal((B, H, S, dh)).astype(dtype) for _ in range(3))
    kpm, causal = make_mask(mask, B, S, 16, rng)
    o_plain, _ = attention_forward(q, k, v, kpm, causal, policy=policy)
    o_tiled = flash_attention_forward(q, k, v, kpm, causal, policy, q_tile=16, k_tile=16)
    assert np.isfinite(o_tiled.astype(np.float64)).all()
    assert tiled_error(o_tiled, o_plain) < TILED_TOL[dtype]


# ---- the tiled training forward and FlashAttention-2's backward ---------------------------------
from preln import BlockConfig, LlamaBlock, LlamaConfig, TransformerBlock          # noqa: E402
from preln.gradcheck import numerical_gradient, rel_error                        # noqa: E402
from preln.ops.attention import (AttentionCache, attention_backward, flash_attention_backward,  # noqa: E402
                                 flash_attention_train, flash_dropout_mask, mask_bias)
from preln.ops.dropout import dropout_forward                                    # noqa: E402
from preln.ops.softmax import softmax_forward                                    # noqa: E402

#: float64 max|tiled - plain| / max(1, max|plain|) for O and every gradient: sums in another order
GRAD_ROUNDOFF = 1e-12
#: float64 central differences (eps 1e-6) against the tiled backward
GRADCHECK_TOL = 1e-7


def plain_with_mask(q, k, v, kpm, causal, dp, mask):
    """Plain attention with the given dropout keep-mask: (O, AttentionCache)."""
    s = q @ np.repeat(k, q.shape[1] // k.shape[1], 1).swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    bias = mask_bias(kpm, causal, q.shape[2], k.shape[2])
    with np.errstate(invalid="ignore"):
        p, _ = softmax_forward(s if bias is None else s + bias, -1)
    p = np.nan_to_num(p)                                      # fully masked rows: P = 0, as tiled
    pd, _ = dropout_forward(p, dp, None, mask)
    o = pd @ np.repeat(v, q.shape[1] // v.shape[1], 1)
    return o, AttentionCache(q, k, v, p, mask, dp, kpm, causal, SAFE)


@pytest.mark.parametrize("h_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("mask", ["none", "causal", "padding+causal", "fully_masked"])
@pytest.mark.parametrize("S, q_tile, k_tile", [(37, 8, 5), (16, 4, 8), (20, 100, 100)])
def test_flash_backward_equals_plain(S, q_tile, k_tile, mask, dropout_p, h_kv):
    rng = np.random.default_rng(S + q_tile + 7 * k_tile)
    B, H, dh = 2, 4, 8
    q = rng.standard_normal((B, H, S, dh))
    k, v = (rng.standard_normal((B, h_kv, S, dh)) for _ in range(2))
    kpm, causal = make_mask(mask, B, S, k_tile, rng)
    o, cache = flash_attention_train(q, k, v, kpm, causal, dropout_p, 11, q_tile=q_tile, k_tile=k_tile)
    assert cache.lse.shape == (B, H, S, 1) and not hasattr(cache, "p")   # no (B, H, S, S) kept
    drop = flash_dropout_mask(cache) if dropout_p else None
    if dropout_p:
        assert 0.5 < drop.mean() < 0.9                                  # about 1 - p kept
    o_ref, c_ref = plain_with_mask(q, k, v, kpm, causal, dropout_p, drop)
    assert tiled_error(o, o_ref) < GRAD_ROUNDOFF
    do = rng.standard_normal(q.shape)
    for g, g_ref in zip(attention_backward(do, cache), attention_backward(do, c_ref)):
        assert g.shape == g_ref.shape
        assert tiled_error(g, g_ref) < GRAD_ROUNDOFF


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_flash_backward_against_central_differences(dropout_p):
    """The seed fixes the mask, so L(q, k, v) = sum(O * W) is a function central differences can take."""
    rng = np.random.default_rng(3)
    B, H, S, dh = 1, 2, 9, 4
    q, k, v = (rng.standard_normal((B, H if i == 0 else 1, S, dh)) for i in range(3))
    kpm = np.zeros((B, S), bool)
    kpm[0, -2:] = True
    w = rng.standard_normal((B, H, S, dh))
    f = lambda q_, k_, v_: float(np.sum(flash_attention_train(q_, k_, v_, kpm, True, dropout_p, 4,
                                                              q_tile=4, k_tile=3)[0] * w))
    _, cache = flash_attention_train(q, k, v, kpm, True, dropout_p, 4, q_tile=4, k_tile=3)
    dq, dk, dv = flash_attention_backward(w, cache)
    assert rel_error(dq, numerical_gradient(lambda a: f(a, k, v), q)) < GRADCHECK_TOL
    assert rel_error(dk, numerical_gradient(lambda a: f(q, a, v), k)) < GRADCHECK_TOL
    assert rel_error(dv, numerical_gradient(lambda a: f(q, k, a), v)) < GRADCHECK_TOL


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_training_block_equals_plain_block(norm_first, causal):
    """The block in training mode, attention="tiled" against "plain" (no dropout: the same draws)."""
    cfg = BlockConfig(d_model=16, n_heads=4, d_ff=24, norm_first=norm_first, causal=causal)
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, 600, 16)), rng.standard_normal((2, 600, 16))
    kpm = rng.random((2, 600)) < 0.2
    blocks = [TransformerBlock(cfg, dtype=np.float64, seed=1, attention=a) for a in ("plain", "tiled")]
    ys, dxs = [], []
    for b in blocks:
        ys.append(b(x, kpm))
        dxs.append(b.backward(dy))
    assert type(blocks[1].cache.attn.sdpa).__name__ == "FlashCache"
    assert tiled_error(ys[1], ys[0]) < GRAD_ROUNDOFF and tiled_error(dxs[1], dxs[0]) < GRAD_ROUNDOFF
    for name, g in blocks[0].grads.items():
        assert tiled_error(blocks[1].grads[name], g) < GRAD_ROUNDOFF, name


def test_tiled_training_block_with_dropout_gradcheck():
    """Dropout in the tiled training block: reseeding the block redraws every mask, so the
    block's input gradient equals central differences."""
    cfg = BlockConfig(d_model=8, n_heads=2, d_ff=12, dropout=0.2, causal=True)
    block = TransformerBlock(cfg, dtype=np.float64, seed=2, attention="tiled")
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 5, 8)), rng.standard_normal((1, 5, 8))
    def f(a):
        block.rng = np.random.default_rng(9)
        return float(np.sum(block(a) * w))
    f(x)
    dx = block.backward(w)
    assert rel_error(dx, numerical_gradient(f, x)) < GRADCHECK_TOL


@pytest.mark.parametrize("kw, match", [({"dropout_p": 1.0}, "dropout_p"), ({"q_tile": 0}, "q_tile"),
                                       ({"k_tile": 2.5}, "k_tile")])
def test_flash_train_rejects_bad_arguments(kw, match):
    q = np.zeros((1, 1, 4, 2))
    with pytest.raises(ValueError, match=match):
        flash_attention_train(q, q, q, **kw)
    _, cache = flash_attention_train(q, q, q)
    with pytest.raises(ValueError, match="dout"):
        flash_attention_backward(np.zeros((1, 1, 3, 2)), cache)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])          # MHA, GQA, MQA
def test_tiled_training_llama_block_equals_plain_block(n_kv_heads):
    """LlamaBlock in training mode (RoPE, causal, grouped key/value heads, a padding mask and
    left-padded positions), attention="tiled" against "plain": output, input gradient and every
    parameter gradient to round-off, with only O and the log-sum-exp kept by the tiled path."""
    cfg = LlamaConfig(d_model=16, n_heads=4, n_kv_heads=n_kv_heads, d_ff=24, rope_theta=100.0)
    rng = np.random.default_rng(3)
    B, S = 2, 300
    x, dy = rng.standard_normal((B, S, 16)), rng.standard_normal((B, S, 16))
    kpm = np.zeros((B, S), bool)
    kpm[1, :40] = True                                    # sequence 1 is left-padded by 40
    positions = np.maximum(np.arange(S) - 40 * np.arange(B)[:, None], 0)   # its first token at 0
    blocks = [LlamaBlock(cfg, dtype=np.float64, seed=1, attention=a) for a in ("plain", "tiled")]
    ys, dxs = [], []
    for b in blocks:
        b.train()
        ys.append(b(x, kpm, positions))
        dxs.append(b.backward(dy))
    assert type(blocks[1].cache.attn.sdpa).__name__ == "FlashCache"
    assert tiled_error(ys[1], ys[0]) < GRAD_ROUNDOFF and tiled_error(dxs[1], dxs[0]) < GRAD_ROUNDOFF
    assert blocks[0].grads.keys() == blocks[1].grads.keys()
    for name, g in blocks[0].grads.items():
        assert tiled_error(blocks[1].grads[name], g) < GRAD_ROUNDOFF, name
    # what the tiled path keeps instead of the (B, H, S, S) probabilities: O and L, linear in S
    assert blocks[1].cache_nbytes() < blocks[0].cache_nbytes() - B * cfg.n_heads * S * S * 8 // 2


# ---- the one tile iterator and online-softmax step ------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq, Sk, q_offset", [(7, 7, 0), (3, 10, 7), (10, 10, 0), (1, 5, 4)])
def test_tile_pairs_cover_each_visible_score_once(Sq, Sk, q_offset, causal):
    """Every (query, key) score that is not causally masked lies in exactly one tile; a tile
    wholly right of the diagonal is never visited."""
    from preln.ops.attention import tile_pairs
    hits = np.zeros((Sq, Sk), int)
    for i0, i1, j0, j1 in tile_pairs(Sq, Sk, 3, 4, causal, q_offset):
        hits[i0:i1, j0:j1] += 1
        if causal:
            assert j0 <= q_offset + i1 - 1          # the tile holds a key its last query sees
    visible = np.tril(np.ones((Sq, Sk), int), q_offset) if causal else np.ones((Sq, Sk), int)
    assert (hits >= visible).all() and hits.max() == 1


def test_online_softmax_step_over_tiles_is_softmax_times_v():
    """Folding the key tiles one by one, then O = acc / l, is softmax(s) v; a row with every key
    masked keeps l = 0 (P = 0, no NaN)."""
    from preln.ops.attention import online_softmax_step, tiles
    rng = np.random.default_rng(0)
    s, v = 3 * rng.standard_normal((2, 5, 11)), rng.standard_normal((2, 11, 4))
    s[0, 2] = -np.inf
    m, l, acc = np.full((2, 5, 1), -np.inf), np.zeros((2, 5, 1)), np.zeros((2, 5, 4))
    for j0, j1 in tiles(11, 4):
        m, l, acc = online_softmax_step(m, l, acc, s[..., j0:j1], v[:, j0:j1])
    assert l[0, 2, 0] == 0 and not acc[0, 2].any()
    e = np.exp(s - np.where(np.isfinite(s.max(-1, keepdims=True)), s.max(-1, keepdims=True), 0))
    want = (e / np.where(e.sum(-1, keepdims=True) == 0, 1, e.sum(-1, keepdims=True))) @ v
    np.testing.assert_allclose(acc / np.where(l == 0, 1, l), want, rtol=TILED_TOL[np.float64], atol=TILED_TOL[np.float64])
