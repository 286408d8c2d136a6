"""AWQ's scale search, without its clipping search: activation-aware weight quantisation -- scale
the input channels that carry large activations up before rounding (Lin et al. 2023, arXiv
2306.00978).

What differs from the published method: AWQ as published and as llm-awq runs it has two searches,
the per-channel scales (auto_scale) and then, per group, a clipping range for the scaled weights
(auto_clip: the largest |w| of each group shrunk by up to half, chosen by the output error). This
module implements the first only, so where the book compares "AWQ" with RTN and GPTQ it is AWQ's
scale search without its clipping search; the full method can do better.

    from preln.quant.awq import awq
    res = awq(w, x, bits=4, group_size=128)     # w (M, K) out x in; x (N, K) calibration inputs
    res.scale, res.alpha                         # s (K,), the exponent the grid search chose
    y = (x / res.scale) @ res.quant.dequantize().T      # the quantised layer

Why scaling helps. y = x W^T equals (x / s) (W diag(s))^T for any s > 0. Rounding W diag(s) to a
grid leaves an error of at most half a step in every weight, and the step of a group is set by
its largest weights; a channel k multiplied by s_k > 1 keeps its relative precision better while
its output contribution is divided by s_k again, so its rounding error in the output shrinks by
about s_k -- as long as scaling it does not raise the group's step much. The channels that matter
most are those with large activations ("salient" weights, section 3.1), so AWQ takes

    s_k = mean_n |x_nk| ^ alpha,  normalised by sqrt(max s * min s)

and chooses alpha from the grid 0, 1/n_grid, ..., (n_grid - 1)/n_grid by the layer's output
error on the calibration inputs, || x W^T - (x / s) Q(W diag(s))^T ||^2 (section 3.3; n_grid = 20
in the authors' code, llm-awq's auto_scale.py). alpha = 0 is s = 1, plain round to nearest, so on
the calibration inputs AWQ is never worse than it. The error is measured where the authors measure
it: at the output of the module the layer feeds (for the q, k, v projection, the whole attention
sublayer: an error in q and k passes through the softmax), else at the layer's own output.

In a model, dividing x by s costs nothing at run time: it is folded into the LayerNorm before
in_proj and linear1, or into the previous linear layer. Here it is kept explicit (the quantised
layer stores s). The clipping search (auto_clip) is left out, as said above.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from preln.quant.groups import MAX_BITS, GroupQuant, check_weight, rtn
from preln.validation import check_bits, positive_int

__all__ = ["AWQResult", "awq", "awq_scales"]


class AWQResult(NamedTuple):
    quant: GroupQuant        # W diag(s), quantised
    scale: np.ndarray        # (K,) s: divide the input by it
    alpha: float             # the exponent the search chose
    alphas: np.ndarray       # (n_grid,) the grid
    losses: np.ndarray       # (n_grid,) mean squared output error at each alpha


def awq_scales(x, alpha):  # (N, K), float -> (K,)
    """s = mean|x|^alpha per input channel, normalised by sqrt(max s min s) (llm-awq)."""
    s = np.maximum(np.mean(np.abs(x), axis=0) ** alpha, 1e-4)
    return s / np.sqrt(s.max() * s.min())


def awq(w, x, bits=4, group_size=None, symmetric=False, n_grid=20, output=None):
    """Grid-search AWQ's per-channel scales for ``w`` (M, K) on inputs ``x`` (N, K) -> AWQResult.

    output: the function whose error the search minimises, output(w_eff) for an effective weight
    w_eff = Q(W diag(s)) / s (so that x w_eff^T = (x / s) Q(W diag(s))^T); None: the layer's own
    output x w_eff^T. The authors judge the q, k, v projection by the output of the whole attention
    it feeds (llm-awq: module2inspect=self_attn), which :func:`preln.quant.weight_only.quantize_model`
    passes here.
    """
    w = check_weight(w)
    bits = check_bits(bits, hi=MAX_BITS)
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x: expected (N, K) calibration inputs with K = {w.shape[1]} (w is "
                         f"{w.shape}); got shape {x.shape}")
    n_grid = positive_int(n_grid, "n_grid")
    if output is None:
        def output(w_eff):                                               # the layer itself
            return x @ w_eff.T
    y = output(w)                                                        # the float output
    alphas = np.arange(n_grid) / n_grid
    losses, best = np.empty(n_grid), None
    for i, a in enumerate(alphas):
        s = awq_scales(x, a)                                             # (K,)
        g = rtn(w * s, bits, group_size, symmetric)                      # W diag(s), rounded
        losses[i] = np.mean((output(g.dequantize() / s) - y) ** 2)
        if best is None or losses[i] < losses[best[0]]:
            best = (i, g, s)
    i, g, s = best
    return AWQResult(g, s, float(alphas[i]), alphas, losses)
