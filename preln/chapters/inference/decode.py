"""The cost of one decoding step: the weights read once for the whole batch, each sequence's KV cache.

    decode_cost(cfg, n_layers=40, batch=8, context=2048, itemsize=2)

:func:`kv_cache_bytes` is ``2 * n_layers * batch * seq * n_kv * d_head * itemsize`` (K and V per
layer; multi-head attention has n_kv * d_head = d_model; grouped-query attention fewer KV heads);
Kwon et al. 2023 (vLLM, arXiv 2309.06180, section 3) give OPT-13B's 800 KB per token.
:func:`decode_cost` counts one decoding step: every weight is read once per step and shared by the
batch, each sequence reads its own KV cache, so the arithmetic intensity is about
``2 * batch / itemsize`` FLOPs per byte while the weights dominate the traffic -- about the batch
size in 16-bit formats (Pope et al. 2022, arXiv 2211.05102, section 2).
"""
from __future__ import annotations

from typing import NamedTuple

from preln.chapters.inference.roofline import arithmetic_intensity
from preln.nn.config import BlockConfig
from preln.validation import positive_int

__all__ = ["kv_cache_bytes", "weight_bytes_per_value", "block_params", "DecodeCost", "decode_cost"]

def kv_cache_bytes(n_layers, batch, seq, d_model, itemsize, n_heads=None, n_kv_heads=None):
    """K and V of every layer for every position: 2 * n_layers * batch * seq * n_kv * d_h * itemsize.

    Multi-head attention (``n_kv_heads`` None): n_kv d_h = d_model, so 2 L B S D itemsize.
    Grouped-query attention (Ainslie et al. 2023, arXiv 2305.13245): ``n_kv_heads`` key/value heads
    of d_h = d_model / n_heads each, shared by groups of n_heads / n_kv_heads query heads;
    multi-query attention (Shazeer 2019, arXiv 1911.02150) is n_kv_heads = 1.
    """
    for name, value in (("n_layers", n_layers), ("batch", batch), ("seq", seq),
                        ("d_model", d_model), ("itemsize", itemsize)):
        positive_int(value, name)
    width = _kv_width(d_model, n_heads, n_kv_heads)
    return 2 * n_layers * batch * seq * width * itemsize


def _kv_width(d_model, n_heads, n_kv_heads):  # -> n_kv * d_h, the width of one position's K (or V)
    if n_kv_heads is None:
        return d_model
    if n_heads is None:
        raise ValueError("n_heads: grouped-query attention needs n_heads (d_h = d_model / n_heads) "
                         f"with n_kv_heads = {n_kv_heads}; got None")
    n_heads, n_kv_heads = positive_int(n_heads, "n_heads"), positive_int(n_kv_heads, "n_kv_heads")
    if d_model % n_heads or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected n_heads = {n_heads} to divide d_model = {d_model} and "
                         f"n_kv_heads to divide n_heads; got n_kv_heads = {n_kv_heads}")
    return n_kv_heads * (d_model // n_heads)


def weight_bytes_per_value(bits=16, group_size=None, scale_bytes=2):
    """Bytes per stored weight: bits / 8, plus (scale_bytes + bits / 8) / group_size when every
    group of ``group_size`` weights of a row shares a scale (scale_bytes) and a zero point (bits).
    Per-channel scales (group_size None) cost one scale per row: left out (D times fewer)."""
    bits = positive_int(bits, "bits")
    if bits > 64:
        raise ValueError(f"bits: expected at most 64; got {bits}")
    if group_size is None:
        return bits / 8
    return bits / 8 + (scale_bytes + bits / 8) / positive_int(group_size, "group_size")


def block_params(config, n_kv_heads=None):
    """Parameters of one block: 4 D^2 + 2 D F weights, 3D + D + F + D biases, 4 D of LayerNorm.
    With ``n_kv_heads`` (grouped-query attention) the key and value projections are
    (n_kv d_h, D) each: 2 D^2 + 2 D n_kv d_h + 2 D F weights, 2 D + 2 n_kv d_h + F + D biases."""
    return _block_matrices(config, n_kv_heads) + _block_vectors(config, n_kv_heads)


def _block_matrices(config, n_kv_heads=None):
    D, F = config.d_model, config.d_ff
    kv = _kv_width(D, config.n_heads, n_kv_heads)
    return 2 * D * D + 2 * D * kv + 2 * D * F


def _block_vectors(config, n_kv_heads=None):
    D, F = config.d_model, config.d_ff
    kv = _kv_width(D, config.n_heads, n_kv_heads)
    return (D + 2 * kv) + D + F + D + 4 * D


class DecodeCost(NamedTuple):
    """One decoding step of ``batch`` sequences at context length ``context`` (blocks only)."""

    flops: int
    weight_bytes: int     # every block's weights, read once per step
    kv_bytes: int         # the KV caches read (and the new K, V written)
    batch: int

    @property
    def nbytes(self):
        return self.weight_bytes + self.kv_bytes

    intensity = property(arithmetic_intensity, doc="FLOPs per byte of traffic.")


def decode_cost(config, n_layers, batch, context, itemsize=2, n_kv_heads=None, weight_bits=None,
                group_size=None):
    """FLOPs and main-memory bytes of one decoding step (one new token per sequence).

    Per layer and sequence: the matmuls with the weights, 2 (4 D^2 + 2 D F) FLOPs (with
    ``n_kv_heads``, 2 (2 D^2 + 2 D n_kv d_h + 2 D F)), and attention over ``context`` cached
    positions, 4 context D FLOPs (q k^T and p v: every query head still attends). Bytes: the weights
    once per step (all sequences share them) -- the matrices at ``weight_bits`` bits (None: the
    activations' 8 itemsize; groups as :func:`weight_bytes_per_value`), biases and LayerNorm at
    ``itemsize`` -- and each sequence's K and V at ``context`` positions
    (:func:`kv_cache_bytes`). Activations (a few D per sequence) are left out.
    """
    if not isinstance(config, BlockConfig):
        raise TypeError(f"config: expected a preln.BlockConfig; got {type(config).__name__}")
    n_layers, batch = positive_int(n_layers, "n_layers"), positive_int(batch, "batch")
    context, itemsize = positive_int(context, "context"), positive_int(itemsize, "itemsize")
    D = config.d_model
    per_weight = weight_bytes_per_value(8 * itemsize if weight_bits is None else weight_bits,
                                        group_size)
    matrices = _block_matrices(config, n_kv_heads)
    flops = n_layers * batch * (2 * matrices + 4 * context * D)
    weights = n_layers * (matrices * per_weight + _block_vectors(config, n_kv_heads) * itemsize)
    kv = kv_cache_bytes(n_layers, batch, context, D, itemsize, config.n_heads, n_kv_heads)
    return DecodeCost(int(flops), int(round(weights)), int(kv), batch)
