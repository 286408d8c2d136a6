"""Tiled attention (the online softmax of FlashAttention, Dao et al. 2022) equals plain attention.

The tiled path is what eval mode runs; the plain path is what training runs and what the backward
differentiates, so they must agree to round-off for every tiling and every mask.
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
