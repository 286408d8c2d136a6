"""Inverted dropout: zero each element with probability p, scale the survivors by 1/(1-p), so the
expected value is unchanged and eval mode is the identity (as torch.nn.functional.dropout)."""
import numpy as np


def dropout_forward(x, p, rng, mask=None):  # (...) -> (...), mask (...) bool or None
    """Return ``(out, mask)``. ``rng`` is a ``np.random.Generator``; pass ``mask`` to reuse one.

    With p == 0 nothing is drawn and the mask is None.
    """
    if p == 0.0 and mask is None:
        return x, None
    if mask is None:
        mask = rng.random(x.shape, dtype=np.float32) >= p   # keep with probability 1 - p
    scale = x.dtype.type(1.0 / (1.0 - p))
    return x * mask * scale, mask


def dropout_backward(dout, mask, p):  # (...) -> (...)
    """out = x * mask / (1 - p)  =>  dx = dout * mask / (1 - p)."""
    if mask is None:
        return dout
    return dout * mask * dout.dtype.type(1.0 / (1.0 - p))
