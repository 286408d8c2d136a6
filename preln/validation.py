"""Input validation: fail early, naming the argument, what was expected and what was received."""
import numpy as np

from preln.precision import BFLOAT16


def as_array(value, name):
    """numpy arrays pass through; torch tensors and nested lists are converted; anything else is a TypeError."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "numpy"):   # a torch.Tensor, without importing torch
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    raise TypeError(f"{name}: expected a numpy array; got {type(value).__name__}")


def check_float_array(value, name):
    a = as_array(value, name)
    if a.dtype.kind not in "fiu" and a.dtype != BFLOAT16:
        raise TypeError(f"{name}: expected an array of real numbers; got dtype {a.dtype}")
    return a


def check_input(x, d_model, dtype, name="x"):  # -> (B, S, D) in the block's dtype
    """x must be (B, S, D) with D = d_model and no empty axis; it is cast to the block's dtype."""
    x = check_float_array(x, name)
    if x.ndim != 3:
        raise ValueError(f"{name}: expected a 3-D array (B, S, D) with D = d_model = {d_model}; "
                         f"got {x.ndim}-D shape {x.shape}")
    if x.shape[-1] != d_model:
        raise ValueError(f"{name}: expected last dimension D = d_model = {d_model}; got shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"{name}: expected a non-empty (B, S, D) array; got shape {x.shape}")
    return x.astype(dtype, copy=False)


def check_mask(mask, x_shape, name="key_padding_mask"):  # -> (B, S) bool or None
    if mask is None:
        return None
    mask = as_array(mask, name)
    if mask.dtype != np.bool_:
        raise TypeError(f"{name}: expected a bool array (True = padding key); got dtype {mask.dtype}")
    if mask.shape != tuple(x_shape[:2]):
        raise ValueError(f"{name}: expected shape (B, S) = {tuple(x_shape[:2])}; got {mask.shape}")
    return mask


def check_all_finite(a, name):  # -> a
    """A ValueError counting the NaN and inf in ``a`` unless there are none: quantisers have no code
    for them (a NaN rounds to an arbitrary integer, an inf makes the scale inf)."""
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: expected finite values; got {int(np.isnan(a).sum())} nan and "
                         f"{int(np.isinf(a).sum())} inf among {a.size}")
    return a


def check_same_shape(value, shape, name):
    value = check_float_array(value, name)
    if value.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (the shape of the last forward's "
                         f"output); got {value.shape}")
    return value


# ---- scalars: one check each, used by every config, block, cache, LM, quantiser and server --------
def _is_int(value):
    # numpy ints count (a shape read from an array is one); bool is an int to Python but never a size
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def positive_int(value, name):  # -> int >= 1
    """``value`` as a Python int >= 1; Python and numpy ints pass, bool and everything else is a ValueError."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name}: expected a positive int; got {value!r}")
    return int(value)


def nonnegative_int(value, name):  # -> int >= 0
    """``value`` as a Python int >= 0 (bool refused)."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name}: expected an int >= 0; got {value!r}")
    return int(value)


def index_in(value, size, name):  # -> int in [0, size)
    """An index into ``size`` items, counted from 0: a negative one is refused, not read from the end."""
    if not _is_int(value) or not 0 <= value < size:
        raise ValueError(f"{name}: expected an int in [0, {size}); got {value!r}")
    return int(value)


def check_bool(value, name):  # -> bool
    """True or False (numpy's bool too); a string such as "no" is a TypeError, not truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False; got {value!r}")
    return bool(value)


def check_seed(seed, name="seed"):
    """What ``np.random.default_rng`` takes from a caller: None (fresh entropy), an int >= 0 or a
    SeedSequence / Generator (a stack's layer gets one); -1, 1.5 or True is refused."""
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.Generator)) or \
            (_is_int(seed) and seed >= 0):
        return seed
    raise ValueError(f"{name}: expected an int >= 0, None or a np.random.SeedSequence; got {seed!r}")


def check_choice(value, choices, name):
    """``value`` if it is one of ``choices``, else a ValueError listing them."""
    try:
        ok = value in choices
    except TypeError:            # an unhashable value against a set
        ok = False
    if not ok:
        raise ValueError(f"{name}: expected one of {tuple(choices)}; got {value!r}")
    return value


def check_bits(bits, lo=2, hi=16):  # -> int in [lo, hi]
    """A bit width in [lo, hi] (int8's grid takes 2..16 bits, the weight-only group grid 2..8)."""
    if not _is_int(bits) or not lo <= bits <= hi:
        raise ValueError(f"bits: expected an int in [{lo}, {hi}]; got {bits!r}")
    return int(bits)


def _is_real(value):  # a finite Python or numpy number, not a bool
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating)) \
        and bool(np.isfinite(value))


def positive_float(value, name):  # -> float > 0
    if not _is_real(value) or not value > 0:
        raise ValueError(f"{name}: expected a positive float; got {value!r}")
    return value


def nonnegative_float(value, name):  # -> finite float >= 0
    """A finite number >= 0 (a temperature, where 0 means greedy); nan and inf are refused."""
    if not _is_real(value) or not value >= 0:
        raise ValueError(f"{name}: expected a finite number >= 0; got {value!r}")
    return value


def check_token_ids(tokens, vocab_size, name="tokens", ndim=2):  # -> int array
    """Token ids: a non-empty integer array of ``ndim`` axes, every id in [0, vocab_size). A -1
    is refused: numpy would read it as the last row of the embedding."""
    tokens = np.asarray(tokens)
    want = "(B, S)" if ndim == 2 else f"{ndim}-D"
    if tokens.ndim != ndim or not np.issubdtype(tokens.dtype, np.integer) or 0 in tokens.shape:
        raise ValueError(f"{name}: expected a non-empty {want} integer array; got shape "
                         f"{tokens.shape}, dtype {tokens.dtype}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name}: expected token ids in [0, {vocab_size}); got [{lo}, {hi}]")
    return tokens


def check_state_keys(state_dict, shapes):
    """A strict state dict: a dict with every key of ``shapes`` and no other."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict: expected a dict of arrays; got {type(state_dict).__name__}")
    missing = [k for k in shapes if k not in state_dict]
    extra = [k for k in state_dict if k not in shapes]
    if missing:
        raise KeyError(f"state_dict: missing key {missing[0]!r} (missing: {missing}); "
                       f"expected the keys {list(shapes)}")
    if extra:
        raise KeyError(f"state_dict: unexpected key {extra[0]!r} (extra: {extra}); "
                       f"expected the keys {list(shapes)}")
