"""GPTQ: quantise a linear layer one input column at a time, compensating each rounding error
with the columns not yet quantised (Frantar, Ashkboos, Hoefler & Alistarh 2022, arXiv 2210.17323).

    from preln.quant.gptq import gptq
    g = gptq(w, x, bits=4, group_size=128)       # w (M, K) out x in; x (N, K) calibration inputs
    w_hat = g.dequantize()                        # a preln.quant.groups.GroupQuant

The objective. A layer y = x W^T is quantised to W^ so as to keep its outputs on calibration
inputs X (N rows): minimise || X W^T - X W^^T ||_F^2 = sum over rows w of W of
(w - w^) H (w - w^)^T with H = X^T X (K, K), the same H for every row.

One step (Optimal Brain Surgeon, Hassibi & Stork 1993, as Optimal Brain Quantisation uses it,
Frantar & Alistarh 2022, arXiv 2208.11580). Let F be the columns not yet quantised and w_F a row's
current weights there -- the least-squares optimum given the columns already fixed. Fixing column
i in F at its grid value q_i, the new optimum of the other columns of F is

    w_F  <-  w_F - (w_i - q_i) / [H_F^-1]_ii * [H_F^-1]_{:, i}

where H_F^-1 is the inverse of H restricted to F. GPTQ's two observations: quantising the columns
in one fixed order (not OBQ's greedy order, which differs per row) lets every row share the
sequence of H_F^-1; and those are all read off one matrix, the upper Cholesky factor U of H^-1
(H^-1 = U^T U): row i of U from column i on is [H_F^-1]_{i, F} / sqrt([H_F^-1]_ii) for
F = {i, ..., K-1}. So with d_i = U_ii the step is, for all rows at once::

    err = (W[:, i] - Q[:, i]) / U[i, i]          # (M,)
    W[:, i:] -= err[:, None] * U[i, i:]          # (M, K - i)

Lazy batches (the reference implementation, IST-DASLab/gptq, gptq.py). Column i's update touches
every later column; done eagerly that is K rank-1 updates of an (M, K) matrix, bound by memory.
Instead the columns are taken in blocks of ``block_size``: inside a block the updates are applied
to the block's columns only, their errors collected, and at the end of the block the later
columns get them all in one matrix product, W[:, i2:] -= Err @ U[i1:i2, i2:] -- the same sums in
another order, so the result is the same to round-off (tests/test_gptq.py checks it).

Groups: the scale and zero point of a group of ``group_size`` columns are chosen from the current
weights, with every update so far, when its first column is reached; a block must then hold whole
groups or groups must start at block boundaries (block_size a multiple or a divisor of
group_size), so that blocking changes nothing. (The reference
code takes a group's grid from the weights as they stood at the start of the lazy batch, which
differs for groups that start inside a batch.) Damping: ``damp`` times the
mean of diag(H) is added to the diagonal (the reference's percdamp, 0.01), which also makes H
invertible when some inputs never vary; columns whose input is always 0 are set to 0.
"""
from __future__ import annotations

import numpy as np

from scipy.linalg import cholesky, solve_triangular

from preln.quant.groups import MAX_BITS, GroupQuant, check_weight, group_size_of, group_grid, round_to_grid
from preln.validation import check_bits, positive_int

__all__ = ["gptq", "hessian", "inverse_hessian_factor"]


def hessian(x):  # (N, K) -> (K, K)
    """H = X^T X: the quadratic form of the layer's squared output error (GPTQ scales it by 2/N;
    a constant factor changes nothing, and damping is relative to diag(H))."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"x: expected (N, K) calibration inputs, one row per token; got shape {x.shape}")
    return x.T @ x


def inverse_hessian_factor(h, damp=0.01):  # (K, K) -> (K, K) upper triangular
    """U, upper triangular, with (H + damp mean(diag H) I)^-1 = U^T U -- from a Cholesky factor of H
    and one triangular solve, never a general inverse.

    The Cholesky factor of J H J (J reverses the order of the columns) read backwards is an upper
    triangular R with H = R R^T; then H^-1 = R^-T R^-1, so U = R^-1, upper triangular with a
    positive diagonal: the factor is unique, so it is the one the inverse's Cholesky would give.
    """
    h = np.array(h, np.float64)
    h[np.diag_indices_from(h)] += damp * np.mean(np.diag(h))
    r = cholesky(h[::-1, ::-1], lower=True)[::-1, ::-1]          # upper triangular, H = R R^T
    return solve_triangular(r, np.eye(len(h)), lower=False)      # U = R^-1


def gptq(w, x, bits=4, group_size=None, symmetric=False, block_size=128, damp=0.01, trace=None):
    """GPTQ-quantise ``w`` (M, K) on calibration inputs ``x`` (N, K) -> GroupQuant.

    bits, group_size, symmetric: the grid (preln.quant.groups). block_size: columns per lazy batch
    (a multiple or a divisor of group_size). damp: relative dampening of H. trace: a list to which the value of
    every column just before it is quantised, (i, W[:, i]), is appended -- the weights as GPTQ's
    updates have left them (tests compare them with the exact least-squares optimum).
    """
    w = check_weight(w).copy()
    bits = check_bits(bits, hi=MAX_BITS)
    M, K = w.shape
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x: expected (N, K) calibration inputs with K = {K} (w is {w.shape}); "
                         f"got shape {x.shape}")
    g = group_size_of(K, group_size)
    block_size = min(positive_int(block_size, "block_size"), K)
    if block_size % g and g % block_size and g != K:
        raise ValueError(f"block_size: expected a multiple or a divisor of group_size = {g} (every "
                         f"group must start a lazy batch or lie inside one); got {block_size}")
    if not (np.isfinite(damp) and damp >= 0):
        raise ValueError(f"damp: expected a number >= 0; got {damp!r}")
    h = hessian(x)
    dead = np.diag(h) == 0                     # inputs that are always 0: their weights do nothing
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    u = inverse_hessian_factor(h, damp)        # (K, K), H^-1 = U^T U
    q = np.zeros((M, K))
    scale = np.zeros((M, K // g))
    zero = np.zeros((M, K // g))
    for i1 in range(0, K, block_size):
        i2 = min(i1 + block_size, K)
        w1 = w[:, i1:i2].copy()                # this block's columns, updated eagerly
        err1 = np.zeros((M, i2 - i1))
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % g == 0:                   # a new group: its grid from the current weights,
                # in this block (w1, updated) and, if it reaches past the block, in w (a group that
                # does starts the block, so no update of this block is pending there yet)
                cur = np.concatenate([w1[:, i:i + g], w[:, i2:col + g]], axis=1)   # (M, g)
                s, z = group_grid(cur, bits, symmetric)                            # (M, 1) each
                scale[:, col // g], zero[:, col // g] = s[:, 0], z[:, 0]
            if trace is not None:
                trace.append((col, w1[:, i].copy()))
            s, z = scale[:, col // g], zero[:, col // g]
            q[:, col], w_q = round_to_grid(w1[:, i], s, z, bits, symmetric)
            e = (w1[:, i] - w_q) / u1[i, i]                           # (M,)
            w1[:, i:] -= e[:, None] * u1[i, i:][None, :]              # the OBS update, in the block
            err1[:, i] = e
        w[:, i2:] -= err1 @ u[i1:i2, i2:]                             # the lazy batch's update
    return GroupQuant(q.astype(np.int16), scale, zero, bits, g, bool(symmetric))
