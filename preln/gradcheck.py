"""Finite-difference gradient checks, in the style of CS231n's ``gradient_check.py``.

A hand-written backward is checked against central differences in float64::

    df/dx_i ~ (f(x + eps e_i) - f(x - eps e_i)) / (2 eps)         error O(eps^2) + O(u / eps)

with u = 2^-53 the float64 unit round-off; eps = 1e-6 balances the two, so a correct backward
agrees to about 1e-8 .. 1e-10 in the error measures below.

Two ways to turn two arrays into one number (a and b: the analytic and the numerical gradient)::

    rel_error(a, b)             = max_i |a_i - b_i| / max(1e-8, max_i (|a_i| + |b_i|))
    elementwise_rel_error(a, b) = max_i ( |a_i - b_i| / max(1e-8, |a_i| + |b_i|) )

The second is CS231n's ``rel_error`` (the maximum of the elementwise ratio). This package's
``rel_error``, the one the tests, the book and the assignments use, is the first: the largest
difference divided by the arrays' *global* scale. An entry whose gradient is ~0 cannot blow it up
(finite-difference noise of 1e-10 on an exact 0 gives the elementwise ratio 1e-2), but an error
confined to the small entries can hide behind the large ones -- a gradient that is 100 % wrong on
every entry 1e-6 times smaller than the largest scores about 1e-6.

The tests (tests/test_gradcheck.py, tests/test_ops.py, tests/test_block.py) and the derivation
chapters of the book use these helpers.
"""
import numpy as np

__all__ = ["numerical_gradient", "rel_error", "elementwise_rel_error", "random_functional",
           "check_op_gradient"]

#: the denominator's floor in both error measures, as in CS231n: two gradients that are both
#: below it are compared in absolute terms
ERROR_FLOOR = 1e-8


def numerical_gradient(f, x, eps=1e-6):  # f: array (...) -> scalar; x: (...) -> (...)
    """Central-difference gradient of the scalar function ``f`` at ``x``, in float64.

    f:   called with an array of x's shape; must return a real scalar (float or 0-d array).
         It must be deterministic: re-seed any RNG inside f (e.g. dropout) on every call.
    x:   any real array; it is copied to float64, ``x`` itself is not modified.
    eps: step; 1e-6 is right for float64 functions of O(1) inputs.

    Returns an array of x's shape (float64): grad[i] = (f(x + eps e_i) - f(x - eps e_i)) / 2 eps.
    Costs 2 * x.size calls of f.
    """
    x = np.array(x, dtype=np.float64)          # a copy: we perturb it in place
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        f_plus = float(f(x))
        x[i] = old - eps
        f_minus = float(f(x))
        x[i] = old
        grad[i] = (f_plus - f_minus) / (2 * eps)
    return grad


def _as_pair(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"b: expected the shape of a, {a.shape}; got {b.shape}")
    return a, b


def rel_error(a, b):  # (...), (...) -> float
    """The largest difference over the arrays' global scale, in float64 (not CS231n's ``rel_error``,
    which is :func:`elementwise_rel_error`)::

        max_i |a_i - b_i| / max(1e-8, max_i (|a_i| + |b_i|))

    One number for a whole array: entries whose gradient is ~0 do not blow it up, because every
    difference is measured against the largest entry. What it can miss: an error confined to the
    small entries. If every entry 1e-6 times smaller than the largest is wrong by 100 %, the
    result is only about 1e-6 (``elementwise_rel_error`` would give 1).
    """
    a, b = _as_pair(a, b)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(ERROR_FLOOR, float(np.max(np.abs(a) + np.abs(b)))))


def elementwise_rel_error(a, b):  # (...), (...) -> float
    """CS231n's ``rel_error``: the maximum of the elementwise relative error, in float64::

        max_i ( |a_i - b_i| / max(1e-8, |a_i| + |b_i|) )

    It sees an error in any single entry, however small the entry. What it flags wrongly: an entry
    whose exact gradient is 0 (or below ~1e-8), where central-difference noise of ~1e-10 alone
    gives a ratio of ~1e-2, far above any gradient-check tolerance.
    """
    a, b = _as_pair(a, b)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b) / np.maximum(ERROR_FLOOR, np.abs(a) + np.abs(b))))


def random_functional(shape, rng):  # shape -> w (shape)
    """A random weight array w for the scalar loss L = sum(y * w), so that dL/dy = w.

    Checking dL/dx against finite differences of L for a random w checks the whole Jacobian
    transpose-product, not just one direction that might hide a sign error.
    """
    return rng.standard_normal(shape)


def check_op_gradient(forward, backward, inputs, wrt, rng=None, eps=1e-6):
    """Compare an op's backward with central differences of ``L = sum(forward(**inputs) * w)``.

    forward:  ``forward(**inputs) -> (out, cache)``, e.g. ``lambda x, w, b: linear_forward(x, w, b)``.
    backward: ``backward(dout, cache) -> grads``, a tuple ordered like ``wrt`` (or a single array).
    inputs:   dict name -> float64 array; only the arrays named in ``wrt`` are perturbed.
    wrt:      the names, in the order ``backward`` returns their gradients.
    rng:      ``np.random.Generator`` for the functional weights w (default: seed 0).

    Returns a dict name -> rel_error(analytic, numerical).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    inputs = {k: (np.array(v, dtype=np.float64) if isinstance(v, np.ndarray) else v)
              for k, v in inputs.items()}
    out, cache = forward(**inputs)
    w = random_functional(out.shape, rng)
    grads = backward(w, cache)
    if not isinstance(grads, tuple):
        grads = (grads,)
    if len(grads) != len(wrt):
        raise ValueError(f"wrt: expected {len(grads)} names, one per gradient backward returns; "
                         f"got {len(wrt)}: {list(wrt)}")
    errors = {}
    for name, analytic in zip(wrt, grads):
        def loss(value, name=name):
            return float(np.sum(forward(**{**inputs, name: value})[0] * w))
        errors[name] = rel_error(analytic, numerical_gradient(loss, inputs[name], eps))
    return errors
