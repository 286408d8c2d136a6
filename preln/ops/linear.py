"""Linear layer: y = x @ W.T + b, with W stored (out, in) as PyTorch's nn.Linear does."""
from typing import NamedTuple

import numpy as np

from preln.precision import SAFE, compute_dtype, matmul


class LinearCache(NamedTuple):
    x: np.ndarray  # (..., in)
    w: np.ndarray  # (out, in)


def linear_forward(x, w, b, policy=SAFE):  # (..., in), (out, in), (out,) -> (..., out)
    """Return ``(x @ w.T + b, cache)``.

    x: (..., in); w: (out, in); b: (out,) or None. The product is one 2-D matmul over all leading
    axes (one BLAS call), accumulated in ``compute_dtype(x.dtype, policy)``.
    """
    ct = compute_dtype(x.dtype, policy)
    x2 = x.reshape(-1, x.shape[-1]).astype(ct, copy=False)  # (N, in), N = prod(leading axes)
    out = matmul(x2, w.astype(ct, copy=False).T)              # (N, out)
    if b is not None:
        out += b.astype(ct, copy=False)
    out = out.reshape(*x.shape[:-1], w.shape[0])              # (..., out)
    return out.astype(x.dtype, copy=False), LinearCache(x, w)


def linear_backward(dout, cache, policy=SAFE):  # (..., out) -> (..., in), (out, in), (out,)
    """Return ``(dx, dw, db)`` for ``out = x @ w.T + b``."""
    x, w = cache
    ct = compute_dtype(dout.dtype, policy)
    d2 = dout.reshape(-1, dout.shape[-1]).astype(ct, copy=False)  # (N, out)
    x2 = x.reshape(-1, x.shape[-1]).astype(ct, copy=False)        # (N, in)
    dx = matmul(d2, w.astype(ct, copy=False)).reshape(x.shape)    # out = x W^T  =>  dx = dout W
    dw = matmul(d2.T, x2)                                         # dW = dout^T x   (out, in)
    db = d2.sum(axis=0, dtype=ct)                                 # db = sum over rows
    dt = dout.dtype
    return dx.astype(dt, copy=False), dw.astype(dt, copy=False), db.astype(dt, copy=False)
