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


def check_same_shape(value, shape, name):
    value = check_float_array(value, name)
    if value.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} (the shape of the last forward's "
                         f"output); got {value.shape}")
    return value
