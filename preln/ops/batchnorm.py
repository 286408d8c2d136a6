"""Batch normalisation (Ioffe & Szegedy 2015, arXiv 1502.03167, Algorithm 1 and section 3.1),
channels-last, with the running statistics of ``torch.nn.BatchNorm1d``.

The channel axis is the LAST axis: x is (N, C) or (B, S, C), and the statistics of channel c are
taken over every other axis -- over the N rows, or over all B * S tokens. (PyTorch's BatchNorm1d
puts the channel second, (N, C) or (N, C, L); a (B, S, C) array here is its (B, C, S) transposed.)

Training (``training=True``), with n = the number of values per channel:

    mean = x.mean(axes);  var = ((x - mean)**2).mean(axes)        (biased: used to normalise)
    rstd = 1 / sqrt(var + eps);  y = (x - mean) * rstd * gamma + beta
    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)   (UNBIASED)

Eval (``training=False``): y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta; the
running statistics are constants and are not updated.

Unlike LayerNorm, a token's output in training mode depends on the other tokens of the batch
(padding included), and eval mode computes a different function from training mode.
"""
from typing import NamedTuple

import numpy as np

from preln.validation import check_float_array, positive_int

__all__ = ["BatchNormCache", "batchnorm_forward", "batchnorm_backward", "BatchNorm1d"]


class BatchNormCache(NamedTuple):
    x: np.ndarray      # (..., C) the input
    gamma: np.ndarray  # (C,)
    mean: np.ndarray   # (C,) the batch mean (training) or running_mean (eval), statistics dtype
    rstd: np.ndarray   # (C,) 1 / sqrt(var + eps), statistics dtype; xhat is recomputed in backward
    training: bool     # True: mean and rstd depend on x (their gradient flows); False: constants


def _check_channel_vector(value, name, channels):
    a = check_float_array(value, name)
    if a.shape != (channels,):
        raise ValueError(f"{name}: expected shape (C,) = ({channels},), one value per channel "
                         f"(the last axis of x); got shape {a.shape}")
    return a


def _check_args(x, gamma, beta, running_mean, running_var, momentum, eps, training):
    x = check_float_array(x, "x")
    if x.dtype.kind != "f":
        raise TypeError(f"x: expected a floating-point array (float16, float32 or float64); "
                        f"got dtype {x.dtype}")
    if x.ndim not in (2, 3):
        raise ValueError(f"x: expected (N, C) or (B, S, C), channels last; got {x.ndim}-D shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"x: expected a non-empty array; got shape {x.shape}")
    C = x.shape[-1]
    gamma = _check_channel_vector(gamma, "gamma", C)
    beta = _check_channel_vector(beta, "beta", C)
    for name, a in (("running_mean", running_mean), ("running_var", running_var)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name}: expected a numpy array of shape ({C},) (updated in place); "
                            f"got {type(a).__name__}")
        _check_channel_vector(a, name, C)
        if a.dtype.kind != "f":
            raise TypeError(f"{name}: expected a float array (updated in place); got dtype {a.dtype}")
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"training: expected True or False; got {training!r}")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum <= 1:
        raise ValueError(f"momentum: expected a number in [0, 1] (the weight of the new batch); "
                         f"got {momentum!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps: expected a positive number; got {eps!r}")
    n = x.size // C
    if training and n < 2:
        raise ValueError(f"x: training mode needs more than 1 value per channel (the unbiased "
                         f"variance divides by n - 1); got shape {x.shape}, n = {n}")
    return x, gamma, beta


def batchnorm_forward(x, gamma, beta, running_mean, running_var, momentum=0.1, eps=1e-5,
                      training=True):  # (..., C) -> (..., C)
    """Return ``(y, cache)``; x: (N, C) or (B, S, C), channels last; gamma, beta: (C,).

    running_mean, running_var: (C,) float arrays. In training mode they are UPDATED IN PLACE, as
    ``torch.nn.functional.batch_norm`` does: running = (1 - momentum) running + momentum batch,
    with the unbiased batch variance. In eval mode they are read, not changed.
    """
    x, gamma, beta = _check_args(x, gamma, beta, running_mean, running_var, momentum, eps, training)
    ct = np.result_type(x.dtype, np.float32)                   # statistics in float32 or wider
    xc = x.astype(ct, copy=False)
    axes = tuple(range(x.ndim - 1))                            # every axis but the channel
    if training:
        n = x.size // x.shape[-1]
        mean = xc.mean(axis=axes)                              # (C,)
        var = ((xc - mean) ** 2).mean(axis=axes)               # (C,) biased: normalises the batch
        running_mean *= 1 - momentum
        running_mean += momentum * mean
        running_var *= 1 - momentum
        running_var += momentum * var * (n / (n - 1))          # unbiased: estimates the population
    else:
        mean = running_mean.astype(ct)                         # (C,) constants in eval mode
        var = running_var.astype(ct)
    rstd = 1 / np.sqrt(var + ct.type(eps))                     # (C,) eps inside the square root
    y = (xc - mean) * rstd * gamma.astype(ct) + beta.astype(ct)
    return y.astype(x.dtype, copy=False), BatchNormCache(x, gamma, mean, rstd, bool(training))


def batchnorm_backward(dy, cache):  # (..., C) -> (..., C), (C,), (C,)
    """Return ``(dx, dgamma, dbeta)``.

    With xhat = (x - mean) * rstd, g = gamma * dy and mean_n = the mean over the n values of a
    channel: training: dx = rstd * (g - mean_n(g) - xhat * mean_n(g * xhat)) -- LayerNorm's
    formula with the sums taken over the batch instead of the features; eval: dx = rstd * g.
    """
    if not isinstance(cache, BatchNormCache):
        raise TypeError(f"cache: expected the BatchNormCache returned by batchnorm_forward; "
                        f"got {type(cache).__name__}")
    x, gamma, mean, rstd, training = cache
    dy = check_float_array(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of the forward's output, {x.shape}; got {dy.shape}")
    ct = mean.dtype
    dyc = dy.astype(ct, copy=False)
    axes = tuple(range(x.ndim - 1))
    xhat = (x.astype(ct, copy=False) - mean) * rstd            # recomputed, not cached
    dgamma = (dyc * xhat).sum(axis=axes)                       # y = xhat * gamma + beta
    dbeta = dyc.sum(axis=axes)
    g = dyc * gamma.astype(ct)                                 # dL/dxhat
    if training:                                               # mean and rstd depend on every row
        dx = rstd * (g - g.mean(axis=axes) - xhat * (g * xhat).mean(axis=axes))
    else:                                                      # running statistics: constants
        dx = rstd * g
    dt = x.dtype                                               # gradients in the forward's dtype
    return dx.astype(dt, copy=False), dgamma.astype(dt, copy=False), dbeta.astype(dt, copy=False)


class BatchNorm1d:
    """A stateful BatchNorm over the last (channel) axis, like ``torch.nn.BatchNorm1d(C)``.

    Holds ``params`` ("weight" = gamma, "bias" = beta), ``grads``, the buffers ``running_mean``
    (zeros), ``running_var`` (ones) and ``num_batches_tracked``, and a ``training`` flag (True, as a
    fresh torch module). ``bn(x)`` -> y; ``bn.backward(dy)`` -> dx, adding into ``bn.grads``.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, dtype=np.float64):
        C = positive_int(num_features, "num_features")          # the channels C
        self.eps, self.momentum = eps, momentum
        self.params = {"weight": np.ones(C, dtype), "bias": np.zeros(C, dtype)}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.running_mean = np.zeros(C, dtype)
        self.running_var = np.ones(C, dtype)
        self.num_batches_tracked = 0
        self.training = True
        self._cache = None

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for g in self.grads.values():
            g[...] = 0

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        """x: (N, C) or (B, S, C) -> y of the same shape; updates the running statistics when training."""
        self._cache = None
        y, self._cache = batchnorm_forward(x, self.params["weight"], self.params["bias"],
                                           self.running_mean, self.running_var, self.momentum,
                                           self.eps, self.training)
        if self.training:
            self.num_batches_tracked += 1
        return y

    def backward(self, dy):
        """dy = dL/dy -> dL/dx; adds dL/dweight and dL/dbias into ``self.grads``."""
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate; call bn(x) first")
        dx, dgamma, dbeta = batchnorm_backward(dy, self._cache)
        self.grads["weight"] += dgamma
        self.grads["bias"] += dbeta
        return dx
