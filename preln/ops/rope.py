"""Rotary position embeddings, RoPE (Su et al. 2021, "RoFormer", arXiv 2104.09864), in the
rotate-half layout that transformers' Llama uses (the GPT-NeoX layout).

A head's d_h dimensions form d_h / 2 pairs, dimension i with dimension i + d_h / 2, and at
position p pair i is rotated by the angle p * w_i, with frequencies falling geometrically:

    w_i      = theta^(-2 i / d_h),  i = 0 .. d_h/2 - 1          (theta = rope_theta, 10000 in Llama 2)
    cos, sin = cos(p w), sin(p w), each repeated over both halves   (..., S, d_h)
    out      = x * cos + rotate_half(x) * sin,   rotate_half(x) = concat(-x2, x1)

Rotating q at position m and k at position n makes their dot product a function of m - n alone,
<R_m q, R_n k> = <q, R_(n - m) k>, because R_m^T R_n = R_(n - m): attention scores see where two
tokens are relative to each other, not where they are. Rotations keep norms: |R_m q| = |q|.

Backward: a rotation is orthogonal, so dx = R^T dout -- the rotation by -p w:

    dx = dout * cos - rotate_half(dout) * sin

Positions are an argument, so a decoder with a KV cache rotates its new queries and keys at the
positions where they stand (``kv.length`` onwards). cos and sin are computed in float64 and rounded
once to the compute dtype (float32 for 16-bit storage).

Long contexts (``scaling=``, a :class:`RopeScaling` or transformers' ``rope_parameters`` dict, the
``rope_scaling`` of transformers 4): a model trained on L positions has seen the angles p w_i only
for p < L. The remedies change the frequencies so that a longer context s L maps into angles it saw
(s = ``factor``); each equals transformers' ``ROPE_INIT_FUNCTIONS[rope_type]``:

    "linear"   position interpolation (Chen et al. 2023, arXiv 2306.15595): w_i / s, i.e. p -> p / s
    "dynamic"  NTK-aware scaling, a larger base: theta' = theta (s S / L - (s - 1))^(d_h / (d_h - 2)),
               S = max(positions) + 1 (never below L); at S = s L with s = 1 the slowest pair is
               interpolated by exactly S / L and the fastest not at all
    "yarn"     YaRN (Peng et al. 2023, arXiv 2309.00071): pairs that turn more than beta_fast times in
               L positions keep w_i, pairs that turn fewer than beta_slow times get w_i / s, a ramp
               (linear in the pair index, as in YaRN's code) in between; cos and sin are multiplied by
               the attention factor 0.1 ln s + 1, so every score by its square
"""
import math
from typing import NamedTuple, Optional

import numpy as np

from preln.precision import elementwise_dtype

__all__ = ["ROPE_THETA", "ROPE_TYPES", "RopeCache", "RopeScaling", "check_rope_scaling", "rope_frequencies",
           "rope_attention_factor", "rope_cos_sin", "rotate_half", "rope_forward", "rope_backward"]

#: Llama 2's base (Llama 3 uses 500000)
ROPE_THETA = 10000.0


#: the ``rope_type`` values of transformers' rope_parameters that :func:`rope_frequencies` computes
ROPE_TYPES = ("default", "linear", "dynamic", "yarn")


class RopeScaling(NamedTuple):
    """A long-context remedy, in the keys of transformers' ``rope_parameters`` (its ``rope_scaling``
    before version 5), e.g. ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}``.

    rope_type: one of :data:`ROPE_TYPES`; factor: s >= 1, the context's growth over training;
    original_max_position_embeddings: L, the trained length ("dynamic" and "yarn"; transformers'
    "dynamic" reads it from the model's ``max_position_embeddings``); beta_fast, beta_slow,
    attention_factor, truncate: YaRN's, with transformers' defaults (None = 0.1 ln s + 1).
    """
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: Optional[int] = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: Optional[float] = None
    truncate: bool = True


def _number(value):
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating)) \
        and math.isfinite(value)


def check_rope_scaling(scaling, name="scaling"):  # -> RopeScaling | None
    """None, a :class:`RopeScaling` or a dict of its keys -> a validated RopeScaling (None stays None)."""
    if scaling is None:
        return None
    if isinstance(scaling, dict):
        if "rope_theta" in scaling:
            raise ValueError(f"{name}: expected no 'rope_theta' key (give the base as theta, LlamaConfig's "
                             f"rope_theta); got {scaling!r}")
        unknown = sorted(set(scaling) - set(RopeScaling._fields), key=str)
        if unknown:
            raise ValueError(f"{name}: expected keys among {RopeScaling._fields}; got unknown {unknown}")
        scaling = RopeScaling(**scaling)
    if not isinstance(scaling, RopeScaling):
        raise TypeError(f"{name}: expected None, a RopeScaling or a dict such as {{'rope_type': 'linear', "
                        f"'factor': 4.0}}; got {type(scaling).__name__}")
    kind, factor, L = scaling.rope_type, scaling.factor, scaling.original_max_position_embeddings
    if kind not in ROPE_TYPES:
        raise ValueError(f"{name}['rope_type']: expected one of {ROPE_TYPES}; got {kind!r}")
    if not _number(factor) or factor < 1:
        raise ValueError(f"{name}['factor']: expected a number >= 1 (the context's growth over the trained "
                         f"length); got {factor!r}")
    if kind in ("dynamic", "yarn"):
        if isinstance(L, (bool, np.bool_)) or not isinstance(L, (int, np.integer)) or L < 1:
            raise ValueError(f"{name}['original_max_position_embeddings']: expected the trained length, an "
                             f"int >= 1, for rope_type {kind!r}; got {L!r}")
        L = int(L)
    if not (_number(scaling.beta_fast) and _number(scaling.beta_slow) and scaling.beta_fast > scaling.beta_slow > 0):
        raise ValueError(f"{name}['beta_fast'], ['beta_slow']: expected numbers beta_fast > beta_slow > 0; got "
                         f"{scaling.beta_fast!r}, {scaling.beta_slow!r}")
    att = scaling.attention_factor
    if att is not None and (not _number(att) or not att > 0):
        raise ValueError(f"{name}['attention_factor']: expected None or a number > 0; got {att!r}")
    if not isinstance(scaling.truncate, (bool, np.bool_)):
        raise TypeError(f"{name}['truncate']: expected True or False; got {scaling.truncate!r}")
    return scaling._replace(factor=float(factor), original_max_position_embeddings=L)


def rope_attention_factor(scaling=None):  # -> float
    """The factor on cos and sin (so every score moves by its square): YaRN's ``attention_factor``,
    by default 0.1 ln s + 1 (1 for s = 1); 1 for every other rope_type."""
    scaling = check_rope_scaling(scaling)
    if scaling is None or scaling.rope_type != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)
    return 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1 else 1.0


def _yarn_frequencies(d_head, theta, s):  # transformers' _compute_yarn_parameters, in float64
    L, dims = s.original_max_position_embeddings, np.arange(0, d_head, 2, dtype=np.float64) / d_head

    def pair_turning(turns):  # the (fractional) pair index whose frequency turns `turns` times in L
        return d_head * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_turning(s.beta_fast), pair_turning(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_head - 1)
    if low == high:
        high += 0.001                               # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(d_head // 2) - low) / (high - low), 0.0, 1.0)   # 0: keep w_i, 1: w_i / s
    w = 1.0 / theta ** dims                         # the default frequencies, as rope_frequencies
    return w / s.factor * ramp + w * (1 - ramp)


class RopeCache(NamedTuple):
    cos: np.ndarray   # (S, d_h) or (B, 1, S, d_h), in the compute dtype
    sin: np.ndarray   # same shape


def _check_d_head(d_head, name):
    if isinstance(d_head, bool) or not isinstance(d_head, (int, np.integer)) or d_head < 2 or d_head % 2:
        raise ValueError(f"{name}: expected an even head width d_h >= 2 (RoPE rotates pairs of "
                         f"dimensions); got d_h = {d_head!r}")
    return int(d_head)


def _check_theta(theta):
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating)) or not theta > 1:
        raise ValueError(f"theta: expected a base rope_theta > 1 (10000 in Llama 2); got {theta!r}")
    return float(theta)


def rope_frequencies(d_head, theta=ROPE_THETA, scaling=None, seq_len=None):  # -> (d_h/2,) float64
    """w_i = 1 / theta^(2 i / d_h) for i = 0 .. d_h/2 - 1, transformers' inv_freq, in float64;
    with ``scaling`` (see the module docstring) the remedied frequencies. seq_len: S, the length
    "dynamic" scales for (default and minimum: the trained length); the other types ignore it."""
    d_head = _check_d_head(d_head, "d_head")
    theta = _check_theta(theta)
    s = check_rope_scaling(scaling)
    kind = "default" if s is None else s.rope_type
    if seq_len is not None and (isinstance(seq_len, (bool, np.bool_)) or
                                not isinstance(seq_len, (int, np.integer)) or seq_len < 1):
        raise ValueError(f"seq_len: expected None or an int >= 1; got {seq_len!r}")
    if kind == "yarn":
        return _yarn_frequencies(d_head, theta, s)
    if kind == "dynamic":
        if d_head < 4:
            raise ValueError(f"d_head: expected d_h >= 4 for rope_type 'dynamic' (the base's exponent is "
                             f"d_h / (d_h - 2)); got d_h = {d_head}")
        L = s.original_max_position_embeddings
        S = L if seq_len is None else max(int(seq_len), L)
        theta = theta * (s.factor * S / L - (s.factor - 1)) ** (d_head / (d_head - 2))
    w = 1.0 / (theta ** (np.arange(0, d_head, 2, dtype=np.float64) / d_head))
    return w / s.factor if kind == "linear" else w


def check_positions(positions, name="positions"):
    if hasattr(positions, "detach") and hasattr(positions, "numpy"):   # a torch tensor
        positions = positions.detach().cpu().numpy()
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu" or pos.ndim not in (1, 2) or pos.size == 0:
        raise ValueError(f"{name}: expected a non-empty (S,) or (B, S) integer array; got "
                         f"shape {pos.shape}, dtype {pos.dtype}")
    if pos.min() < 0:
        raise ValueError(f"{name}: expected positions >= 0; got {pos.min()}")
    return pos


def rope_cos_sin(positions, d_head, theta=ROPE_THETA, dtype=np.float64, scaling=None):  # -> 2 x (..., d_h)
    """cos(p w) and sin(p w) for every position p, each repeated over both halves of the head.

    positions: (S,) ints -> (S, d_h) tables, shared by the whole batch; (B, S) ints -> (B, 1, S, d_h),
    one row of positions per sequence (broadcast over the heads). Computed in float64, then cast.
    scaling: a long-context remedy (:class:`RopeScaling`); "dynamic" scales for max(positions) + 1,
    as transformers does, and "yarn" multiplies both tables by :func:`rope_attention_factor`.
    """
    pos = check_positions(positions)
    w = rope_frequencies(d_head, theta, scaling, seq_len=int(pos.max()) + 1)
    angle = pos[..., None].astype(np.float64) * w                                 # (..., S, d_h/2)
    angle = np.concatenate([angle, angle], axis=-1)                               # (..., S, d_h)
    if pos.ndim == 2:
        angle = angle[:, None]                                                    # (B, 1, S, d_h)
    a = rope_attention_factor(scaling)
    return (a * np.cos(angle)).astype(dtype), (a * np.sin(angle)).astype(dtype)


def rotate_half(x):  # (..., d_h) -> (..., d_h)
    """concat(-x2, x1) with x1, x2 the two halves of the last axis: each pair (x1_i, x2_i) turned
    by 90 degrees, the sin part of the rotation."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _tables(x, positions, theta, cos_sin, scaling):
    if x.ndim != 4:
        raise ValueError(f"x: expected a 4-D (B, H, S, d_h) array; got shape {x.shape}")
    B, _, S, d_head = x.shape
    _check_d_head(d_head, "x")
    ct = elementwise_dtype(x.dtype)
    if cos_sin is not None:
        cos, sin = cos_sin
        return cos.astype(ct, copy=False), sin.astype(ct, copy=False)
    pos = check_positions(positions)
    if pos.shape not in ((S,), (B, S)):
        raise ValueError(f"positions: expected shape (S,) = ({S},) or (B, S) = ({B}, {S}) for x of "
                         f"shape (B, H, S, d_h) = {x.shape}; got {pos.shape}")
    return rope_cos_sin(pos, d_head, theta, ct, scaling)


def rope_forward(x, positions=None, theta=ROPE_THETA, cos_sin=None, scaling=None):  # (B, H, S, d_h) -> same
    """Return ``(x * cos + rotate_half(x) * sin, cache)``: x rotated at ``positions``.

    x: (B, H, S, d_h), d_h even; positions: (S,) or (B, S) ints >= 0; theta: the base; scaling: a
    long-context remedy (:class:`RopeScaling`, see :func:`rope_cos_sin`).
    cos_sin: the (cos, sin) of :func:`rope_cos_sin`, when the caller has them already (a block
    rotates q and k with the same tables); positions, theta and scaling are then not used.
    """
    cos, sin = _tables(x, positions, theta, cos_sin, scaling)
    xc = x.astype(cos.dtype, copy=False)
    out = rotate_half(xc)
    out *= sin
    out += xc * cos
    return out.astype(x.dtype, copy=False), RopeCache(cos, sin)


def rope_backward(dout, cache):  # (B, H, S, d_h) -> (B, H, S, d_h)
    """dx = R^T dout = dout * cos - rotate_half(dout) * sin: the rotation by the opposite angle."""
    cos, sin = cache
    dc = dout.astype(cos.dtype, copy=False)
    dx = rotate_half(dc)
    dx *= -sin
    dx += dc * cos
    return dx.astype(dout.dtype, copy=False)
