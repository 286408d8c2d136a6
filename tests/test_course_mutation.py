"""The course edition, slow part 3 (`make test-course`): each assignment's hidden checks catch at
least 90 % of the mutants of its solutions (preln/grade/mutate.py; `make mutation` prints the
table), and every plausible wrong answer of derivation_ops, int8, modern_block, inference,
many_devices and real_model loses its question — evaluated exactly as the grader evaluates (preln/grade/checks.py), in this process."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from preln.grade import mutate  # noqa: E402
from preln.grade import nbtools  # noqa: E402

TARGET = 0.90
#: a mutant that runs longer than this is caught (as the grader's per-cell timeout would)
MUTANT_TIMEOUT_S = 10


@pytest.mark.parametrize("name", nbtools.assignments())
def test_mutation_score(name):
    rows, survivors = mutate.mutate_assignment(name, timeout=MUTANT_TIMEOUT_S)
    n, caught = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{name}: {caught}/{n} mutants caught")
    assert n > 0
    assert caught / n >= TARGET, (f"{name}: {caught}/{n} = {caught / n:.1%} caught; survivors: "
                                  + "; ".join(f"{q} {old!r} -> {new!r}" for q, _, old, new in survivors[:15]))


def test_a_mutant_of_each_kind():
    kinds = {k for k, _ in mutate.line_mutants("    return x * 2.0 + y[-1]")}
    assert kinds == {"delete", "return", "const", "op"}


#: plausible wrong answers to derivation_ops (issue 9's list and the classic bugs): each must lose
#: its question, i.e. make that question's tests cell (public + hidden) fail
WRONG_ANSWERS = {
    "q1": {
        "missing keepdims": """def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1)
    var = ((x - mean) ** 2).mean(axis=-1)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta""",
        "eps outside the square root": """def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / (x.std(axis=-1, keepdims=True) + eps) * gamma + beta""",
        "unbiased variance": """def layer_norm_forward(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, ddof=1, keepdims=True) + eps) * gamma + beta""",
        "calls preln": """from preln.ops import layer_norm_forward as _lnf
def layer_norm_forward(x, gamma, beta, eps=1e-5):
    return _lnf(x, gamma, beta, eps)[0]""",
    },
    "q2": {
        "dgamma over the first axis only": """def layer_norm_backward(dy, x, gamma, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    g = dy * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)""",
        "sign error": """def layer_norm_backward(dy, x, gamma, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    axes = tuple(range(x.ndim - 1))
    g = dy * gamma
    dx = rstd * (g - g.mean(axis=-1, keepdims=True) + xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)""",
    },
    "q3": {
        "no max shift": """def softmax(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)""",
        "NaN on a fully masked row": """def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)""",
        "hard-coded return": """def softmax(x, axis=-1):
    return np.full(x.shape, 1.0 / x.shape[axis])""",
    },
    "q4": {
        "dropped padding mask": """def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    return softmax(s) @ v""",
        "no 1/sqrt(d_h)": """def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    s = q @ k.swapaxes(-1, -2)
    if key_padding_mask is not None:
        s = np.where(key_padding_mask[:, None, None, :], -np.inf, s)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    return softmax(s) @ v""",
        "causal mask hides the diagonal": """def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        s = np.where(key_padding_mask[:, None, None, :], -np.inf, s)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=0), -np.inf, s)
    return softmax(s) @ v""",
        "mask by -1e9 (a fully padded sequence is not zero)": """def attention(q, k, v, key_padding_mask=None, causal=False):
    S = q.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        s = s - 1e9 * key_padding_mask[:, None, None, :]
    if causal:
        s = s - 1e9 * np.triu(np.ones((S, S)), k=1)
    return softmax(s) @ v""",
    },
    "q5": {
        "tanh approximation": """def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_grad(x):
    cdf = 0.5 * (1.0 + erf(x / np.sqrt(2.0)))
    return cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)""",
        "derivative sign error": """def gelu(x):
    return x * 0.5 * (1.0 + erf(x / np.sqrt(2.0)))


def gelu_grad(x):
    cdf = 0.5 * (1.0 + erf(x / np.sqrt(2.0)))
    return cdf - x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)""",
    },
    "q6": {
        "sign error": """def softmax_backward(dp, p, axis=-1):
    return p * (dp + (p * dp).sum(axis=axis, keepdims=True))""",
        "missing keepdims": """def softmax_backward(dp, p, axis=-1):
    return p * (dp - (p * dp).sum(axis=axis))""",
    },
}


#: int8's plausible mistakes (issue 14.5): each loses its question; and what is merely another
#: way to write a correct answer does not
INT8_WRONG = {
    "q1": {
        "the scale from max instead of max |x|": """def quantize_absmax(x, per_row=False, scale=None):
    ft = np.result_type(x.dtype, np.float32)
    xs = x.astype(ft)
    if scale is None:
        amax = np.max(xs, axis=-1, keepdims=True) if per_row else np.max(xs)
        scale = np.where(amax > 0, amax / ft.type(QMAX), ft.type(1))
    scale = np.asarray(scale, dtype=ft)
    return np.clip(np.rint(xs / scale), -QMAX, QMAX).astype(np.int8), scale""",
        "truncation instead of rounding": """def quantize_absmax(x, per_row=False, scale=None):
    ft = np.result_type(x.dtype, np.float32)
    xs = x.astype(ft)
    if scale is None:
        amax = np.max(np.abs(xs), axis=-1, keepdims=True) if per_row else np.max(np.abs(xs))
        scale = np.where(amax > 0, amax / ft.type(QMAX), ft.type(1))
    scale = np.asarray(scale, dtype=ft)
    return np.clip(xs / scale, -QMAX, QMAX).astype(np.int8), scale""",
        "no clamp (int8 wraps around)": """def quantize_absmax(x, per_row=False, scale=None):
    ft = np.result_type(x.dtype, np.float32)
    xs = x.astype(ft)
    if scale is None:
        amax = np.max(np.abs(xs), axis=-1, keepdims=True) if per_row else np.max(np.abs(xs))
        scale = np.where(amax > 0, amax / ft.type(QMAX), ft.type(1))
    scale = np.asarray(scale, dtype=ft)
    return np.rint(xs / scale).astype(np.int8), scale""",
    },
    "q2": {
        "int8 matmul (wraps)": """def int8_matmul(a, b):
    return (a @ b.T).astype(np.int32)""",
        "no overflow check": """def int8_matmul(a, b):
    return (a.astype(np.int64) @ b.astype(np.int64).T).astype(np.int32)""",
    },
    "q3": {
        "quantised in float64, converted at the end": """def int8_linear(x, w, b):
    qx, sx = quantize_absmax(x, per_row=True)
    qw, sw = quantize_absmax(w, per_row=True)
    return (int8_matmul(qx, qw) * (sx * sw.T) + b).astype(np.float32)""",
        "per-tensor activation scale": """def int8_linear(x, w, b):
    qx, sx = quantize_absmax(x.astype(np.float32))
    qw, sw = quantize_absmax(w.astype(np.float32), per_row=True)
    return int8_matmul(qx, qw).astype(np.float32) * (sx * sw.T) + b.astype(np.float32)""",
    },
    "q6": {
        "the range not stretched to hold 0": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    wg = w.reshape(M, K // g, g)
    lo, hi = wg.min(axis=-1), wg.max(axis=-1)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    zero = np.rint(-lo / scale)
    q = np.clip(np.rint(wg / scale[..., None]) + zero[..., None], 0, 2 ** bits - 1)
    return q.reshape(M, K).astype(np.int64), scale, zero""",
        "2^b levels apart instead of 2^b - 1": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    wg = w.reshape(M, K // g, g)
    lo = np.minimum(wg.min(axis=-1), 0.0)
    hi = np.maximum(wg.max(axis=-1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / 2 ** bits, 1.0)
    zero = np.rint(-lo / scale)
    q = np.clip(np.rint(wg / scale[..., None]) + zero[..., None], 0, 2 ** bits - 1)
    return q.reshape(M, K).astype(np.int64), scale, zero""",
        "the zero point floored": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    wg = w.reshape(M, K // g, g)
    lo = np.minimum(wg.min(axis=-1), 0.0)
    hi = np.maximum(wg.max(axis=-1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    zero = np.floor(-lo / scale)
    q = np.clip(np.rint(wg / scale[..., None]) + zero[..., None], 0, 2 ** bits - 1)
    return q.reshape(M, K).astype(np.int64), scale, zero""",
        "groups of strided columns (j, j + K/g, ...) instead of consecutive ones": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    wg = w.reshape(M, g, K // g).swapaxes(1, 2)                   # (M, groups, g), strided
    lo = np.minimum(wg.min(axis=-1), 0.0)
    hi = np.maximum(wg.max(axis=-1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    zero = np.rint(-lo / scale)
    q = np.clip(np.rint(wg / scale[..., None]) + zero[..., None], 0, 2 ** bits - 1)
    return q.swapaxes(1, 2).reshape(M, K).astype(np.int64), scale, zero""",
        "no clamp": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    wg = w.reshape(M, K // g, g)
    lo = np.minimum(wg.min(axis=-1), 0.0)
    hi = np.maximum(wg.max(axis=-1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    zero = np.rint(-lo / scale)
    q = np.rint(wg / scale[..., None]) + zero[..., None]
    return q.reshape(M, K).astype(np.int64), scale, zero""",
        "no guard for a group of zeros (S = 0)": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    wg = w.reshape(M, K // g, g)
    lo = np.minimum(wg.min(axis=-1), 0.0)
    hi = np.maximum(wg.max(axis=-1), 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    with np.errstate(all="ignore"):
        zero = np.rint(-lo / scale)
        q = np.clip(np.rint(wg / scale[..., None]) + zero[..., None], 0, 2 ** bits - 1)
    return np.nan_to_num(q).reshape(M, K).astype(np.int64), scale, zero""",
        "calls preln": """from preln.quant.groups import rtn as _rtn
def rtn_groups(w, bits=4, group_size=None):
    r = _rtn(w, bits=bits, group_size=group_size)
    return r.q.astype(np.int64), r.scale, r.zero""",
    },
    "q7": {
        "no error feedback (round to nearest)": """def gptq_quantize(w, x, bits=4, damp=0.01):
    q, scale, zero = rtn_groups(w, bits)
    return scale * (q - zero)""",
        "the error not divided by U_ii": """def gptq_quantize(w, x, bits=4, damp=0.01):
    _, scale, zero = rtn_groups(w, bits)
    h = x.T @ x
    h = h + damp * np.mean(np.diag(h)) * np.eye(len(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    w = w.copy()
    w_hat = np.zeros_like(w)
    for i in range(w.shape[1]):
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        e = w[:, i] - w_hat[:, i]
        w[:, i:] -= np.outer(e, u[i, i:])
    return w_hat""",
        "the Cholesky factor of H instead of H^-1": """def gptq_quantize(w, x, bits=4, damp=0.01):
    _, scale, zero = rtn_groups(w, bits)
    h = x.T @ x
    h = h + damp * np.mean(np.diag(h)) * np.eye(len(h))
    u = np.linalg.cholesky(h).T
    w = w.copy()
    w_hat = np.zeros_like(w)
    for i in range(w.shape[1]):
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        e = (w[:, i] - w_hat[:, i]) / u[i, i]
        w[:, i:] -= np.outer(e, u[i, i:])
    return w_hat""",
        "absolute damping (lambda I, not relative to mean diag H)": """def gptq_quantize(w, x, bits=4, damp=0.01):
    _, scale, zero = rtn_groups(w, bits)
    h = x.T @ x + damp * np.eye(x.shape[1])
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    w = w.copy()
    w_hat = np.zeros_like(w)
    for i in range(w.shape[1]):
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        e = (w[:, i] - w_hat[:, i]) / u[i, i]
        w[:, i:] -= np.outer(e, u[i, i:])
    return w_hat""",
        "the grid recomputed from each updated column": """def gptq_quantize(w, x, bits=4, damp=0.01):
    h = x.T @ x
    h = h + damp * np.mean(np.diag(h)) * np.eye(len(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    w = w.copy()
    w_hat = np.zeros_like(w)
    for i in range(w.shape[1]):
        _, scale, zero = rtn_groups(w, bits)
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        e = (w[:, i] - w_hat[:, i]) / u[i, i]
        w[:, i:] -= np.outer(e, u[i, i:])
    return w_hat""",
        "updates w in place (no copy)": """def gptq_quantize(w, x, bits=4, damp=0.01):
    _, scale, zero = rtn_groups(w, bits)
    h = x.T @ x
    h = h + damp * np.mean(np.diag(h)) * np.eye(len(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    w_hat = np.zeros_like(w)
    for i in range(w.shape[1]):
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        e = (w[:, i] - w_hat[:, i]) / u[i, i]
        w[:, i:] -= np.outer(e, u[i, i:])
    return w_hat""",
        "calls preln": """from preln.quant.gptq import gptq as _gptq
def gptq_quantize(w, x, bits=4, damp=0.01):
    return _gptq(w, x, bits=bits, damp=damp).dequantize()""",
    },
}
INT8_RIGHT = {
    "q1": {"amax * (1 / 127), one ulp from amax / 127": """def quantize_absmax(x, per_row=False, scale=None):
    ft = np.result_type(x.dtype, np.float32)
    xs = x.astype(ft)
    if scale is None:
        amax = np.max(np.abs(xs), axis=-1, keepdims=True) if per_row else np.max(np.abs(xs))
        scale = np.where(amax > 0, amax * (1 / 127), 1).astype(ft)
    scale = np.asarray(scale, dtype=ft)
    return np.clip(np.rint(xs / scale), -QMAX, QMAX).astype(np.int8), scale"""},
    "q6": {"S = (h - l) * (1 / (2^b - 1)), a loop over the groups": """def rtn_groups(w, bits=4, group_size=None):
    M, K = w.shape
    g = K if group_size is None else group_size
    q = np.empty((M, K), dtype=np.int32)
    scale, zero = np.empty((M, K // g)), np.empty((M, K // g))
    top = 2 ** bits - 1
    for m in range(M):
        for j in range(K // g):
            grp = w[m, j * g:(j + 1) * g]
            lo, hi = min(grp.min(), 0.0), max(grp.max(), 0.0)
            s = (hi - lo) * (1 / top) if hi > lo else 1.0
            z = np.rint(-lo / s)
            scale[m, j], zero[m, j] = s, z
            q[m, j * g:(j + 1) * g] = np.clip(np.rint(grp / s) + z, 0, top)
    return q, scale, zero"""},
    "q7": {"the OBS step from the inverse Hessian, re-inverted after each column": """def gptq_quantize(w, x, bits=4, damp=0.01):
    _, scale, zero = rtn_groups(w, bits)
    h = x.T @ x
    h = h + damp * np.mean(np.diag(h)) * np.eye(len(h))
    w = w.copy()
    w_hat = np.zeros_like(w)
    K = w.shape[1]
    for i in range(K):
        h_inv = np.linalg.inv(h[i:, i:])                          # the columns not yet quantised
        q = np.clip(np.rint(w[:, i] / scale[:, 0]) + zero[:, 0], 0, 2 ** bits - 1)
        w_hat[:, i] = scale[:, 0] * (q - zero[:, 0])
        w[:, i:] -= np.outer((w[:, i] - w_hat[:, i]) / h_inv[0, 0], h_inv[0])
    return w_hat"""},
}


#: modern_block's plausible mistakes (issue 18.5): each loses its question
MODERN_WRONG = {
    "q1": {
        "eps outside the square root": """def rms_norm_forward(x, gamma, eps=1e-6):
    ct = np.result_type(x.dtype, np.float32)
    xc = x.astype(ct)
    return (xc / (np.sqrt((xc * xc).mean(axis=-1, keepdims=True)) + eps) * gamma).astype(x.dtype)""",
        "subtracting the mean (LayerNorm without a bias)": """def rms_norm_forward(x, gamma, eps=1e-6):
    ct = np.result_type(x.dtype, np.float32)
    xc = x.astype(ct)
    xc = xc - xc.mean(axis=-1, keepdims=True)
    return (xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps) * gamma).astype(x.dtype)""",
        "statistics in float16 (no float32 upcast)": """def rms_norm_forward(x, gamma, eps=1e-6):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gamma""",
        "calls preln": """from preln.ops import rms_norm_forward as _rms
def rms_norm_forward(x, gamma, eps=1e-6):
    return _rms(x, gamma, eps)[0]""",
    },
    "q2": {
        "LayerNorm's backward (an extra - mean(g) term)": """def rms_norm_backward(dy, x, gamma, eps=1e-6):
    rrms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * rrms
    g = dy * gamma
    dx = rrms * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=tuple(range(x.ndim - 1)))""",
        "dgamma over the first axis only": """def rms_norm_backward(dy, x, gamma, eps=1e-6):
    rrms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * rrms
    g = dy * gamma
    dx = rrms * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0)""",
        "dx without the xhat term (rrms treated as a constant)": """def rms_norm_backward(dy, x, gamma, eps=1e-6):
    rrms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return dy * gamma * rrms, (dy * x * rrms).sum(axis=tuple(range(x.ndim - 1)))""",
    },
    "q3": {
        "interleaved pairs (2i, 2i + 1) instead of rotate-half": """def rope(x, positions, theta=10000.0):
    d = x.shape[-1]
    freqs = theta ** (-2.0 * np.arange(d // 2) / d)
    angle = np.repeat(np.asarray(positions)[:, None] * freqs, 2, axis=-1)   # (S, d_h): w0 w0 w1 w1 ...
    rotated = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * np.cos(angle) + rotated * np.sin(angle)""",
        "wrong frequency exponent, theta^(-i/d_h)": """def rope(x, positions, theta=10000.0):
    half = x.shape[-1] // 2
    freqs = theta ** (-np.arange(half) / x.shape[-1])
    angle = np.tile(np.asarray(positions)[:, None] * freqs, 2)
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angle).astype(x.dtype) + rotated * np.sin(angle).astype(x.dtype)""",
        "positions ignored (0 .. S-1)": """def rope(x, positions, theta=10000.0):
    half = x.shape[-1] // 2
    freqs = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    angle = np.tile(np.arange(x.shape[-2])[:, None] * freqs, 2)
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angle).astype(x.dtype) + rotated * np.sin(angle).astype(x.dtype)""",
        "angles in x's dtype (float32 for a float32 x)": """def rope(x, positions, theta=10000.0):
    half = x.shape[-1] // 2
    freqs = (theta ** (-2.0 * np.arange(half) / x.shape[-1])).astype(x.dtype)
    angle = np.tile(np.asarray(positions).astype(x.dtype)[:, None] * freqs, 2)
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angle) + rotated * np.sin(angle)""",
        "rotate_half with the sign on the wrong half": """def rope(x, positions, theta=10000.0):
    half = x.shape[-1] // 2
    freqs = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    angle = np.tile(np.asarray(positions)[:, None] * freqs, 2)
    rotated = np.concatenate([x[..., half:], -x[..., :half]], axis=-1)
    return x * np.cos(angle).astype(x.dtype) + rotated * np.sin(angle).astype(x.dtype)""",
    },
    "q4": {
        "sign flip (the forward rotation again)": """def rope_backward(dout, positions, theta=10000.0):
    return rope(dout, positions, theta)""",
        "sign flip on cos": """def rope_backward(dout, positions, theta=10000.0):
    half = dout.shape[-1] // 2
    angle = np.tile(np.asarray(positions)[:, None] * theta ** (-2.0 * np.arange(half) / dout.shape[-1]), 2)
    rotated = np.concatenate([-dout[..., half:], dout[..., :half]], axis=-1)
    return -dout * np.cos(angle) - rotated * np.sin(angle)""",
    },
    "q5": {
        "SiLU derivative missing a term (sigma only)": """def silu_grad(a):
    return expit(a)


def swiglu_backward(dy, x, w_gate, w_up, w_down):
    a, b = x @ w_gate.T, x @ w_up.T
    s = a * expit(a)
    dg = dy @ w_down
    da, db = dg * b * silu_grad(a), dg * s
    lead = tuple(range(x.ndim - 1))
    return (da @ w_gate + db @ w_up, np.tensordot(da, x, axes=(lead, lead)),
            np.tensordot(db, x, axes=(lead, lead)), np.tensordot(dy, s * b, axes=(lead, lead)))""",
        "SiLU derivative missing a term (sigma + a sigma, no (1 - sigma))": """def silu_grad(a):
    sig = expit(a)
    return sig * (1 + a)


def swiglu_backward(dy, x, w_gate, w_up, w_down):
    a, b = x @ w_gate.T, x @ w_up.T
    s = a * expit(a)
    dg = dy @ w_down
    da, db = dg * b * silu_grad(a), dg * s
    lead = tuple(range(x.ndim - 1))
    return (da @ w_gate + db @ w_up, np.tensordot(da, x, axes=(lead, lead)),
            np.tensordot(db, x, axes=(lead, lead)), np.tensordot(dy, s * b, axes=(lead, lead)))""",
        "dx missing the up-projection path": """def silu_grad(a):
    sig = expit(a)
    return sig * (1 + a * (1 - sig))


def swiglu_backward(dy, x, w_gate, w_up, w_down):
    a, b = x @ w_gate.T, x @ w_up.T
    s = a * expit(a)
    dg = dy @ w_down
    da, db = dg * b * silu_grad(a), dg * s
    lead = tuple(range(x.ndim - 1))
    return (da @ w_gate, np.tensordot(da, x, axes=(lead, lead)),
            np.tensordot(db, x, axes=(lead, lead)), np.tensordot(dy, s * b, axes=(lead, lead)))""",
        "weight gradients that only work for 2-D x (da.T @ x)": """def silu_grad(a):
    sig = expit(a)
    return sig * (1 + a * (1 - sig))


def swiglu_backward(dy, x, w_gate, w_up, w_down):
    a, b = x @ w_gate.T, x @ w_up.T
    s = a * expit(a)
    dg = dy @ w_down
    da, db = dg * b * silu_grad(a), dg * s
    return da @ w_gate + db @ w_up, da.T @ x, db.T @ x, dy.T @ (s * b)""",
    },
    "q6": {
        "head mapping h % H_kv instead of h // G (np.tile)": """def gqa_attention(q, k, v, causal=False):
    H, H_kv, S = q.shape[1], k.shape[1], q.shape[2]
    if H % H_kv:
        raise ValueError(f"H_kv = {H_kv} does not divide H = {H}")
    k, v = np.tile(k, (1, H // H_kv, 1, 1)), np.tile(v, (1, H // H_kv, 1, 1))
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v""",
        "no max shift (overflows at large logits)": """def gqa_attention(q, k, v, causal=False):
    H, H_kv, S = q.shape[1], k.shape[1], q.shape[2]
    if H % H_kv:
        raise ValueError(f"H_kv = {H_kv} does not divide H = {H}")
    k, v = np.repeat(k, H // H_kv, axis=1), np.repeat(v, H // H_kv, axis=1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True) @ v""",
        "causal mask hides the diagonal": """def gqa_attention(q, k, v, causal=False):
    H, H_kv, S = q.shape[1], k.shape[1], q.shape[2]
    if H % H_kv:
        raise ValueError(f"H_kv = {H_kv} does not divide H = {H}")
    k, v = np.repeat(k, H // H_kv, axis=1), np.repeat(v, H // H_kv, axis=1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=0), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = np.nan_to_num(p)
    return p / np.maximum(p.sum(axis=-1, keepdims=True), 1e-300) @ v""",
        "calls preln's repeat_kv": """from preln.ops import repeat_kv
def gqa_attention(q, k, v, causal=False):
    H, H_kv, S = q.shape[1], k.shape[1], q.shape[2]
    if H % H_kv:
        raise ValueError(f"H_kv = {H_kv} does not divide H = {H}")
    k, v = repeat_kv(k, H // H_kv), repeat_kv(v, H // H_kv)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v""",
    },
    "q7": {
        "dK/dV not summed over the group (averaged)": """def gqa_attention_backward(dout, q, k, v, causal=False):
    B, H, S, dh = q.shape
    G = H // k.shape[1]
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = q @ kr.swapaxes(-1, -2) / np.sqrt(dh)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    dp = dout @ vr.swapaxes(-1, -2)
    dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(dh)
    dk = (dz.swapaxes(-1, -2) @ q).reshape(B, H // G, G, S, dh).mean(axis=2)
    dv = (p.swapaxes(-1, -2) @ dout).reshape(B, H // G, G, S, dh).mean(axis=2)
    return dz @ kr, dk, dv""",
        "dK/dV of the first query head of each group only": """def gqa_attention_backward(dout, q, k, v, causal=False):
    B, H, S, dh = q.shape
    G = H // k.shape[1]
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = q @ kr.swapaxes(-1, -2) / np.sqrt(dh)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    dp = dout @ vr.swapaxes(-1, -2)
    dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(dh)
    return dz @ kr, (dz.swapaxes(-1, -2) @ q)[:, ::G], (p.swapaxes(-1, -2) @ dout)[:, ::G]""",
        "head mapping h % H_kv instead of h // G": """def gqa_attention_backward(dout, q, k, v, causal=False):
    B, H, S, dh = q.shape
    H_kv = k.shape[1]
    G = H // H_kv
    kr, vr = np.tile(k, (1, G, 1, 1)), np.tile(v, (1, G, 1, 1))
    s = q @ kr.swapaxes(-1, -2) / np.sqrt(dh)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    dp = dout @ vr.swapaxes(-1, -2)
    dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / np.sqrt(dh)
    dk = (dz.swapaxes(-1, -2) @ q).reshape(B, G, H_kv, S, dh).sum(axis=1)
    dv = (p.swapaxes(-1, -2) @ dout).reshape(B, G, H_kv, S, dh).sum(axis=1)
    return dz @ kr, dk, dv""",
        "no 1/sqrt(d_h) in dq and dk": """def gqa_attention_backward(dout, q, k, v, causal=False):
    B, H, S, dh = q.shape
    G = H // k.shape[1]
    kr, vr = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = q @ kr.swapaxes(-1, -2) / np.sqrt(dh)
    if causal:
        s = np.where(np.triu(np.ones((S, S), dtype=bool), k=1), -np.inf, s)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    dp = dout @ vr.swapaxes(-1, -2)
    dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dk = (dz.swapaxes(-1, -2) @ q).reshape(B, H // G, G, S, dh).sum(axis=2)
    dv = (p.swapaxes(-1, -2) @ dout).reshape(B, H // G, G, S, dh).sum(axis=2)
    return dz @ kr, dk, dv""",
    },
}
#: correct modern_block answers in other styles than the solutions: each keeps its question
MODERN_RIGHT = {
    "q1": {"x * (mean + eps) ** -0.5, float32 by itemsize": """def rms_norm_forward(x, gamma, eps=1e-6):
    xs = x.astype(np.float32) if x.dtype.itemsize < 4 else x
    ms = np.einsum("...d,...d->...", xs, xs)[..., None] / xs.shape[-1]
    return (xs * (ms + eps) ** -0.5 * gamma).astype(x.dtype)"""},
    "q3": {"pairs as complex numbers rotated by exp(i p w)": """def rope(x, positions, theta=10000.0):
    h = x.shape[-1] // 2
    w = 1.0 / theta ** (np.arange(0, 2 * h, 2) / (2 * h))
    z = (x[..., :h].astype(np.float64) + 1j * x[..., h:]) * np.exp(1j * np.outer(positions, w))
    return np.concatenate([z.real, z.imag], axis=-1).astype(x.dtype)"""},
    "q4": {"the forward at the negated positions": """def rope_backward(dout, positions, theta=10000.0):
    return rope(dout, -np.asarray(positions), theta)"""},
    "q6": {"a loop over the query heads": """def gqa_attention(q, k, v, causal=False):
    B, H, S, dh = q.shape
    if H % k.shape[1] != 0:
        raise ValueError(f"n_kv_heads = {k.shape[1]} must divide n_heads = {H}")
    G = H // k.shape[1]
    out = np.empty_like(q)
    for h in range(H):
        s = np.einsum("bid,bjd->bij", q[:, h], k[:, h // G]) / np.sqrt(dh)
        if causal:
            s[:, np.triu_indices(S, 1)[0], np.triu_indices(S, 1)[1]] = -np.inf
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        out[:, h] = np.einsum("bij,bjd->bid", e / e.sum(axis=-1, keepdims=True), v[:, h // G])
    return out"""},
    "q7": {"a loop over the query heads, accumulating dk and dv": """def gqa_attention_backward(dout, q, k, v, causal=False):
    B, H, S, dh = q.shape
    G = H // k.shape[1]
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    mask = np.triu(np.ones((S, S), dtype=bool), 1) if causal else np.zeros((S, S), dtype=bool)
    for h in range(H):
        j = h // G
        s = np.where(mask, -np.inf, q[:, h] @ k[:, j].transpose(0, 2, 1) / np.sqrt(dh))
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        dp = dout[:, h] @ v[:, j].transpose(0, 2, 1)
        ds = p * (dp - np.einsum("bij,bij->bi", p, dp)[..., None])
        dq[:, h] = ds @ k[:, j] / np.sqrt(dh)
        dk[:, j] += ds.transpose(0, 2, 1) @ q[:, h] / np.sqrt(dh)
        dv[:, j] += p.transpose(0, 2, 1) @ dout[:, h]
    return dq, dk, dv"""},
}


#: inference's plausible mistakes (issue 17): each loses its question
INFERENCE_WRONG = {
    "q7": {
        "the KV cache at full width (only the projections shrink)": """def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    D, F, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    if H % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected a divisor of n_heads = {H}; got {n_kv_heads}")
    kv = n_kv_heads * (D // H)
    matrices = 2 * D * D + 2 * D * kv + 2 * D * F
    vectors = D + 2 * kv + D + F + D + 4 * D
    flops = n_layers * batch * (2 * matrices + 4 * context * D)
    nbytes = (n_layers * (matrices + vectors) + 2 * n_layers * batch * context * D) * itemsize
    return flops, nbytes""",
        "the projections at full width (only the cache shrinks)": """def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    D, F, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    if H % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected a divisor of n_heads = {H}; got {n_kv_heads}")
    kv = n_kv_heads * (D // H)
    matrices = 4 * D * D + 2 * D * F
    vectors = 4 * D + F + D + 4 * D
    flops = n_layers * batch * (2 * matrices + 4 * context * D)
    nbytes = (n_layers * (matrices + vectors) + 2 * n_layers * batch * context * kv) * itemsize
    return flops, nbytes""",
        "attention FLOPs shrunk with the KV heads": """def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    D, F, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    if H % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected a divisor of n_heads = {H}; got {n_kv_heads}")
    kv = n_kv_heads * (D // H)
    matrices = 2 * D * D + 2 * D * kv + 2 * D * F
    vectors = D + 2 * kv + D + F + D + 4 * D
    flops = n_layers * batch * (2 * matrices + 4 * context * kv)
    nbytes = (n_layers * (matrices + vectors) + 2 * n_layers * batch * context * kv) * itemsize
    return flops, nbytes""",
        "the k and v biases at full width": """def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    D, F, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    if H % n_kv_heads:
        raise ValueError(f"n_kv_heads: expected a divisor of n_heads = {H}; got {n_kv_heads}")
    kv = n_kv_heads * (D // H)
    matrices = 2 * D * D + 2 * D * kv + 2 * D * F
    vectors = 4 * D + F + D + 4 * D
    flops = n_layers * batch * (2 * matrices + 4 * context * D)
    nbytes = (n_layers * (matrices + vectors) + 2 * n_layers * batch * context * kv) * itemsize
    return flops, nbytes""",
        "no ValueError (n_kv_heads rounded down)": """def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    D, F, H = cfg.d_model, cfg.d_ff, cfg.n_heads
    kv = n_kv_heads * (D // H)
    matrices = 2 * D * D + 2 * D * kv + 2 * D * F
    vectors = D + 2 * kv + D + F + D + 4 * D
    flops = n_layers * batch * (2 * matrices + 4 * context * D)
    nbytes = (n_layers * (matrices + vectors) + 2 * n_layers * batch * context * kv) * itemsize
    return flops, nbytes""",
        "calls preln": """from preln.chapters.inference import decode_cost as _dc
def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    r = _dc(cfg, n_layers, batch, context, itemsize, n_kv_heads=n_kv_heads)
    return r.flops, r.nbytes""",
    },
    "q8": {
        "freed blocks pushed in order (the last block handed out first)": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks - 1, -1, -1))
    tables, lengths, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(tables.pop(seq))
            del lengths[seq]
            continue
        table = tables.setdefault(seq, [])
        lengths.setdefault(seq, 0)
        need = -(-(lengths[seq] + n) // block_size) - len(table)
        if need > len(free):
            refused.append(i)
            continue
        for _ in range(need):
            table.append(free.pop())
        lengths[seq] += n
    return tables, refused""",
        "the free blocks as a queue (freed blocks handed out last)": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks))
    tables, lengths, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(tables.pop(seq))
            del lengths[seq]
            continue
        table = tables.setdefault(seq, [])
        lengths.setdefault(seq, 0)
        need = -(-(lengths[seq] + n) // block_size) - len(table)
        if need > len(free):
            refused.append(i)
            continue
        for _ in range(need):
            table.append(free.pop(0))
        lengths[seq] += n
    return tables, refused""",
        "a partly filled last block not reused": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks - 1, -1, -1))
    tables, refused = {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(reversed(tables.pop(seq)))
            continue
        table = tables.setdefault(seq, [])
        need = -(-n // block_size)
        if need > len(free):
            refused.append(i)
            continue
        for _ in range(need):
            table.append(free.pop())
    return tables, refused""",
        "what fits is allocated on a refusal (not all or none)": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks - 1, -1, -1))
    tables, lengths, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(reversed(tables.pop(seq)))
            del lengths[seq]
            continue
        table = tables.setdefault(seq, [])
        lengths.setdefault(seq, 0)
        need = -(-(lengths[seq] + n) // block_size) - len(table)
        if need > len(free):
            refused.append(i)
            table.extend(free.pop() for _ in range(len(free)))
            continue
        for _ in range(need):
            table.append(free.pop())
        lengths[seq] += n
    return tables, refused""",
        "the length grows on a refusal": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks - 1, -1, -1))
    tables, lengths, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(reversed(tables.pop(seq)))
            del lengths[seq]
            continue
        table = tables.setdefault(seq, [])
        lengths.setdefault(seq, 0)
        need = -(-(lengths[seq] + n) // block_size) - len(table)
        lengths[seq] += n
        if need > len(free):
            refused.append(i)
            continue
        for _ in range(need):
            table.append(free.pop())
    return tables, refused""",
        "a sequence refused at once left out of the tables": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks - 1, -1, -1))
    tables, lengths, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(reversed(tables.pop(seq)))
            del lengths[seq]
            continue
        need = -(-(lengths.get(seq, 0) + n) // block_size) - len(tables.get(seq, []))
        if need > len(free):
            refused.append(i)
            continue
        table = tables.setdefault(seq, [])
        lengths.setdefault(seq, 0)
        for _ in range(need):
            table.append(free.pop())
        lengths[seq] += n
    return tables, refused""",
        "a returning sequence keeps its old length": """def block_tables(events, n_blocks, block_size):
    free = list(range(n_blocks - 1, -1, -1))
    tables, lengths, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extend(reversed(tables.pop(seq)))
            continue
        table = tables.setdefault(seq, [])
        lengths.setdefault(seq, 0)
        need = -(-(lengths[seq] + n) // block_size) - len(table)
        if need > len(free):
            refused.append(i)
            continue
        for _ in range(need):
            table.append(free.pop())
        lengths[seq] += n
    return tables, refused""",
        "calls preln": """from preln.serve.paged import PagedKVCache as _Cache
def block_tables(events, n_blocks, block_size):
    cache, refused = _Cache(1, n_blocks, block_size, 1, 1), []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            cache.remove(seq)
            continue
        if seq not in cache.tables:
            cache.add(seq)
        try:
            cache.reserve(seq, n)
        except MemoryError:
            refused.append(i)
            continue
        cache.commit(seq, n)
    return {s: list(t) for s, t in cache.tables.items()}, refused""",
    },
}
#: correct inference answers in other styles than the solutions: each keeps its question
INFERENCE_RIGHT = {
    "q7": {"question 2's count plus the difference of the K and V terms": """def gqa_decode_step_cost(cfg, n_layers, batch, context, n_kv_heads, itemsize=2):
    D, H = cfg.d_model, cfg.n_heads
    if n_kv_heads <= 0 or H % n_kv_heads != 0:
        raise ValueError(f"n_kv_heads = {n_kv_heads} does not divide n_heads = {H}")
    flops, nbytes = decode_step_cost(cfg, n_layers, batch, context, itemsize)
    cut = D - n_kv_heads * (D // H)                      # what each of K and V loses per row
    flops -= n_layers * batch * 2 * (2 * D * cut)
    nbytes -= n_layers * (2 * D * cut + 2 * cut) * itemsize + 2 * n_layers * batch * context * cut * itemsize
    return flops, nbytes"""},
    "q8": {"a deque of free blocks, lengths kept only for sequences that got a block": """from collections import deque
def block_tables(events, n_blocks, block_size):
    free = deque(range(n_blocks))                        # left end: the next block handed out
    tables, used, refused = {}, {}, []
    for i, (op, seq, n) in enumerate(events):
        if op == "free":
            free.extendleft(reversed(tables.pop(seq)))
            used.pop(seq, None)                          # its first grow may have been refused
            continue
        tables.setdefault(seq, [])
        have = used.get(seq, 0)
        more = (have + n + block_size - 1) // block_size - len(tables[seq])
        if more > len(free):
            refused.append(i)
            continue
        tables[seq] += [free.popleft() for _ in range(more)]
        used[seq] = have + n
    return tables, refused"""},
}


#: many_devices' plausible mistakes (issue 25.4): each loses its question
MANY_WRONG = {
    "q1": {
        "np.sum over the ranks (another order of addition)": """def ring_reduce_scatter(xs):
    P = len(xs)
    return np.split(np.sum(np.stack(xs), axis=0), P)""",
        "+= on views of the inputs": """def ring_reduce_scatter(xs):
    P = len(xs)
    acc = [np.split(x, P) for x in xs]
    for s in range(P - 1):
        sent = [acc[r][(r - s - 1) % P].copy() for r in range(P)]
        for r in range(P):
            acc[r][(r - s - 2) % P] += sent[(r - 1) % P]
    return [acc[r][r].copy() for r in range(P)]""",
        "sends the chunk it just received": """def ring_reduce_scatter(xs):
    P = len(xs)
    acc = [[c.copy() for c in np.split(x, P)] for x in xs]
    for s in range(P - 1):
        sent = [acc[r][(r + s + 1) % P] for r in range(P)]
        for r in range(P):
            c = (r + s) % P
            acc[r][c] = acc[r][c] + sent[(r - 1) % P]
    return [acc[r][(r + P - 1) % P] for r in range(P)]""",
    },
    "q2": {
        "no padding": """def ring_all_gather(chunks):
    return [np.concatenate(chunks) for _ in chunks]

def ring_all_reduce(xs):
    P, shape = len(xs), xs[0].shape
    return [y.reshape(shape) for y in ring_all_gather(ring_reduce_scatter([x.reshape(-1) for x in xs]))]""",
        "a sum in rank order": """def ring_all_gather(chunks):
    return [np.concatenate(chunks) for _ in chunks]

def ring_all_reduce(xs):
    total = xs[0].copy()
    for x in xs[1:]:
        total = total + x
    return [total.copy() for _ in xs]""",
        "gathers in the order received": """def ring_all_gather(chunks):
    P = len(chunks)
    out = []
    for r in range(P):
        out.append(np.concatenate([chunks[(r - s) % P] for s in range(P)]))
    return out

def ring_all_reduce(xs):
    P, shape, n = len(xs), xs[0].shape, xs[0].size
    flat = [np.concatenate([x.reshape(-1), np.zeros(-n % P, x.dtype)]) for x in xs]
    return [y[:n].reshape(shape) for y in ring_all_gather(ring_reduce_scatter(flat))]""",
    },
    "q3": {
        "an all-reduce counted as one pass": """def ring_bytes_sent(kind, nbytes, world):
    if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(kind)
    return (world - 1) * nbytes // world

def step_traffic(B, S, D, world, mode, itemsize=8):
    n = B * S * D * itemsize
    if mode == "tensor":
        return {"all_reduce": (4, 4 * ring_bytes_sent("all_reduce", n, world))}
    rep = -(-6 * D // world) * world * itemsize
    return {"all_reduce": (1, ring_bytes_sent("all_reduce", rep, world)),
            "reduce_scatter": (4, 4 * ring_bytes_sent("reduce_scatter", n, world)),
            "all_gather": (4, 4 * ring_bytes_sent("all_gather", n, world))}""",
        "the forward's collectives only": """def ring_bytes_sent(kind, nbytes, world):
    if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(kind)
    return (2 if kind == "all_reduce" else 1) * (world - 1) * nbytes // world

def step_traffic(B, S, D, world, mode, itemsize=8):
    n = B * S * D * itemsize
    if mode == "tensor":
        return {"all_reduce": (2, 2 * ring_bytes_sent("all_reduce", n, world))}
    return {"reduce_scatter": (2, 2 * ring_bytes_sent("reduce_scatter", n, world)),
            "all_gather": (2, 2 * ring_bytes_sent("all_gather", n, world))}""",
        "no all-reduce of the replicated gradients": """def ring_bytes_sent(kind, nbytes, world):
    if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(kind)
    return (2 if kind == "all_reduce" else 1) * (world - 1) * nbytes // world

def step_traffic(B, S, D, world, mode, itemsize=8):
    n = B * S * D * itemsize
    if mode == "tensor":
        return {"all_reduce": (4, 4 * ring_bytes_sent("all_reduce", n, world))}
    return {"reduce_scatter": (4, 4 * ring_bytes_sent("reduce_scatter", n, world)),
            "all_gather": (4, 4 * ring_bytes_sent("all_gather", n, world))}""",
        "bytes as floats": """def ring_bytes_sent(kind, nbytes, world):
    if kind not in ("all_reduce", "reduce_scatter", "all_gather"):
        raise ValueError(kind)
    return (2 if kind == "all_reduce" else 1) * (world - 1) / world * nbytes

def step_traffic(B, S, D, world, mode, itemsize=8):
    n = B * S * D * itemsize
    if mode == "tensor":
        return {"all_reduce": (4, 4 * ring_bytes_sent("all_reduce", n, world))}
    rep = -(-6 * D // world) * world * itemsize
    return {"all_reduce": (1, ring_bytes_sent("all_reduce", rep, world)),
            "reduce_scatter": (4, 4 * ring_bytes_sent("reduce_scatter", n, world)),
            "all_gather": (4, 4 * ring_bytes_sent("all_gather", n, world))}""",
    },
    "q4": {
        "b2 added on every rank": """def tp_mlp_forward(x, W1, b1, W2, b2, world):
    W1s, b1s, W2s = np.split(W1, world), np.split(b1, world), np.split(W2, world, axis=1)
    partials = [gelu_tanh(x @ W1s[r].T + b1s[r]) @ W2s[r].T + b2 for r in range(world)]
    return ring_all_reduce(partials)[0], partials""",
        "b1 not split (added whole)": """def tp_mlp_forward(x, W1, b1, W2, b2, world):
    F = W1.shape[0]
    W1s, W2s = np.split(W1, world), np.split(W2, world, axis=1)
    partials = [gelu_tanh(x @ W1s[r].T + b1[r * F // world]) @ W2s[r].T for r in range(world)]
    return ring_all_reduce(partials)[0] + b2, partials""",
        "activation after the sum": """def tp_mlp_forward(x, W1, b1, W2, b2, world):
    W1s, b1s, W2s = np.split(W1, world), np.split(b1, world), np.split(W2, world, axis=1)
    partials = [(x @ W1s[r].T + b1s[r]) @ W2s[r].T for r in range(world)]
    return gelu_tanh(ring_all_reduce(partials)[0]) + b2, partials""",
    },
    "q5": {
        "dx of rank 0 only (no all-reduce)": """def tp_mlp_backward(dy, x, W1, b1, W2, world):
    W1s, b1s, W2s = np.split(W1, world), np.split(b1, world), np.split(W2, world, axis=1)
    D = x.shape[-1]
    x2, dy2 = x.reshape(-1, D), dy.reshape(-1, D)
    shards, terms = [], []
    for r in range(world):
        u = x2 @ W1s[r].T + b1s[r]
        du = (dy2 @ W2s[r]) * gelu_tanh_grad(u)
        shards.append({"W1": du.T @ x2, "b1": du.sum(axis=0), "W2": dy2.T @ gelu_tanh(u)})
        terms.append((du @ W1s[r]).reshape(x.shape))
    return terms[0], shards, dy2.sum(axis=0)""",
        "no activation derivative": """def tp_mlp_backward(dy, x, W1, b1, W2, world):
    W1s, b1s, W2s = np.split(W1, world), np.split(b1, world), np.split(W2, world, axis=1)
    D = x.shape[-1]
    x2, dy2 = x.reshape(-1, D), dy.reshape(-1, D)
    shards, terms = [], []
    for r in range(world):
        u = x2 @ W1s[r].T + b1s[r]
        du = dy2 @ W2s[r]
        shards.append({"W1": du.T @ x2, "b1": du.sum(axis=0), "W2": dy2.T @ gelu_tanh(u)})
        terms.append((du @ W1s[r]).reshape(x.shape))
    return ring_all_reduce(terms)[0], shards, dy2.sum(axis=0)""",
        "dW2 from the pre-activation u": """def tp_mlp_backward(dy, x, W1, b1, W2, world):
    W1s, b1s, W2s = np.split(W1, world), np.split(b1, world), np.split(W2, world, axis=1)
    D = x.shape[-1]
    x2, dy2 = x.reshape(-1, D), dy.reshape(-1, D)
    shards, terms = [], []
    for r in range(world):
        u = x2 @ W1s[r].T + b1s[r]
        du = (dy2 @ W2s[r]) * gelu_tanh_grad(u)
        shards.append({"W1": du.T @ x2, "b1": du.sum(axis=0), "W2": dy2.T @ u})
        terms.append((du @ W1s[r]).reshape(x.shape))
    return ring_all_reduce(terms)[0], shards, dy2.sum(axis=0)""",
        "db2 divided among the ranks": """def tp_mlp_backward(dy, x, W1, b1, W2, world):
    W1s, b1s, W2s = np.split(W1, world), np.split(b1, world), np.split(W2, world, axis=1)
    D = x.shape[-1]
    x2, dy2 = x.reshape(-1, D), dy.reshape(-1, D)
    shards, terms = [], []
    for r in range(world):
        u = x2 @ W1s[r].T + b1s[r]
        du = (dy2 @ W2s[r]) * gelu_tanh_grad(u)
        shards.append({"W1": du.T @ x2, "b1": du.sum(axis=0), "W2": dy2.T @ gelu_tanh(u)})
        terms.append((du @ W1s[r]).reshape(x.shape))
    return ring_all_reduce(terms)[0], shards, dy2.sum(axis=0) / world""",
    },
    "q6": {
        "stage 2 partitions the parameters, not the gradients": """def zero_bytes(cfg, n_layers, world, stage, param_bytes=2, grad_bytes=2, state_bytes=12):
    if stage not in (0, 1, 2, 3):
        raise ValueError(stage)
    D, F = cfg.d_model, cfg.d_ff
    psi = n_layers * (4 * D * D + 2 * D * F + 9 * D + F)
    part = -(-psi // world)
    params = param_bytes * (part if stage >= 2 else psi)
    grads = grad_bytes * (part if stage >= 3 else psi)
    optimizer = state_bytes * (part if stage >= 1 else psi)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer}""",
        "no padding (floor division)": """def zero_bytes(cfg, n_layers, world, stage, param_bytes=2, grad_bytes=2, state_bytes=12):
    if stage not in (0, 1, 2, 3):
        raise ValueError(stage)
    D, F = cfg.d_model, cfg.d_ff
    psi = n_layers * (4 * D * D + 2 * D * F + 9 * D + F)
    part = psi // world
    params = param_bytes * (part if stage >= 3 else psi)
    grads = grad_bytes * (part if stage >= 2 else psi)
    optimizer = state_bytes * (part if stage >= 1 else psi)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer}""",
        "biases forgotten": """def zero_bytes(cfg, n_layers, world, stage, param_bytes=2, grad_bytes=2, state_bytes=12):
    if stage not in (0, 1, 2, 3):
        raise ValueError(stage)
    D, F = cfg.d_model, cfg.d_ff
    psi = n_layers * (4 * D * D + 2 * D * F + 4 * D)
    part = -(-psi // world)
    params = param_bytes * (part if stage >= 3 else psi)
    grads = grad_bytes * (part if stage >= 2 else psi)
    optimizer = state_bytes * (part if stage >= 1 else psi)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer}""",
    },
}

#: correct many_devices answers in other styles than the solutions: each keeps its question
MANY_RIGHT = {
    "q1": {
        "received + mine, a deque per rank": """from collections import deque
def ring_reduce_scatter(xs):
    P = len(xs)
    parts = [dict(enumerate(np.split(x.copy(), P))) for x in xs]
    for s in range(P - 1):
        outbox = deque(parts[r][(r - s - 1) % P] for r in range(P))
        outbox.rotate(1)                      # rank r now finds rank r - 1's message at r
        for r, got in enumerate(outbox):
            c = (r - s - 2) % P
            parts[r][c] = got + parts[r][c]
    return [parts[r][r] for r in range(P)]""",
    },
    "q6": {
        "math.ceil and a parameter table": """import math
def zero_bytes(cfg, n_layers, world, stage, param_bytes=2, grad_bytes=2, state_bytes=12):
    if stage not in range(4):
        raise ValueError(f"stage: expected 0-3; got {stage}")
    D, F = cfg.d_model, cfg.d_ff
    shapes = [(3 * D, D), (3 * D,), (D, D), (D,), (F, D), (F,), (D, F), (D,), (D,), (D,), (D,), (D,)]
    psi = n_layers * sum(math.prod(s) for s in shapes)
    share = math.ceil(psi / world) if psi < 2 ** 52 else -(-psi // world)
    held = {k: (share if stage >= t else psi) for k, t in (("params", 3), ("grads", 2), ("optimizer", 1))}
    out = {"params": param_bytes * held["params"], "grads": grad_bytes * held["grads"],
           "optimizer": state_bytes * held["optimizer"]}
    out["total"] = sum(out.values())
    return out""",
    },
}


#: real_model's plausible mistakes (issue 23.5): each loses its question
REAL_WRONG = {
    "q1": {
        "unsigned codes": """def q8_0_block(raw):
    if raw.shape != (34,):
        raise ValueError(raw.shape)
    return raw[:2].view(np.float16)[0].astype(np.float32) * raw[2:].astype(np.float32)""",
        "big-endian scale": """def q8_0_block(raw):
    if raw.shape != (34,):
        raise ValueError(raw.shape)
    d = np.float32(np.frombuffer(raw[:2].tobytes(), ">f2")[0])
    return d * raw[2:].view(np.int8).astype(np.float32)""",
        "the product in float16": """def q8_0_block(raw):
    if raw.shape != (34,):
        raise ValueError(raw.shape)
    return (raw[:2].view(np.float16)[0] * raw[2:].view(np.int8).astype(np.float16)).astype(np.float32)""",
        "no length check": """def q8_0_block(raw):
    return raw[:2].view(np.float16)[0].astype(np.float32) * raw[2:34].view(np.int8).astype(np.float32)""",
    },
    "q2": {
        "a Python loop over the rows": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(f"raw: {nbytes} bytes a row")
    out = np.empty((rows, nbytes // 20 * 32), np.float32)
    for r in range(rows):
        b = raw[r].reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        out[r] = (d * np.concatenate([b[:, 4:] & 15, b[:, 4:] >> 4], axis=-1).astype(np.float32) + m).ravel()
    return out""",
        "high nibble first": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(nbytes)
    b = raw.reshape(rows, -1, 20)
    d = b[..., :2].copy().view(np.float16).astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([b[..., 4:] >> 4, b[..., 4:] & 15], axis=-1).astype(np.float32)
    return (d * q + m).reshape(rows, -1)""",
        "nibbles of a byte as adjacent weights": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(nbytes)
    b = raw.reshape(rows, -1, 20)
    d = b[..., :2].copy().view(np.float16).astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = np.stack([b[..., 4:] & 15, b[..., 4:] >> 4], axis=-1).reshape(rows, -1, 32).astype(np.float32)
    return (d * q + m).reshape(rows, -1)""",
        "d and m swapped": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(nbytes)
    b = raw.reshape(rows, -1, 20)
    m = b[..., :2].copy().view(np.float16).astype(np.float32)
    d = b[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([b[..., 4:] & 15, b[..., 4:] >> 4], axis=-1).astype(np.float32)
    return (d * q + m).reshape(rows, -1)""",
        "the arithmetic in float16": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(nbytes)
    b = raw.reshape(rows, -1, 20)
    d = b[..., :2].copy().view(np.float16)
    m = b[..., 2:4].copy().view(np.float16)
    q = np.concatenate([b[..., 4:] & 15, b[..., 4:] >> 4], axis=-1).astype(np.float16)
    return (d * q + m).astype(np.float32).reshape(rows, -1)""",
        "w = d (q + m)": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20:
        raise ValueError(nbytes)
    b = raw.reshape(rows, -1, 20)
    d = b[..., :2].copy().view(np.float16).astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([b[..., 4:] & 15, b[..., 4:] >> 4], axis=-1).astype(np.float32)
    return (d * (q + m)).reshape(rows, -1)""",
    },
    "q3": {
        "the two directions swapped": """def to_rotate_half(w, n_heads):
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(rows)
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

def to_interleaved(w, n_heads):
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(rows)
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)""",
        "the whole matrix as one head": """def to_rotate_half(w, n_heads):
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(rows)
    return w.reshape(rows // 2, 2, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)

def to_interleaved(w, n_heads):
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(rows)
    return w.reshape(2, rows // 2, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)""",
        "2-D only: a bias (1-D) fails": """def to_rotate_half(w, n_heads):
    rows, cols = w.shape
    if rows % (2 * n_heads):
        raise ValueError(rows)
    h = rows // n_heads // 2
    return w.reshape(n_heads, h, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)

def to_interleaved(w, n_heads):
    rows, cols = w.shape
    if rows % (2 * n_heads):
        raise ValueError(rows)
    h = rows // n_heads // 2
    return w.reshape(n_heads, 2, h, cols).transpose(0, 2, 1, 3).reshape(rows, cols)""",
    },
    "q4": {
        "S = (hi - lo) / 2^bits": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(group_size)
    wg = w.astype(np.float64).reshape(M, -1, group_size)
    lo, hi = wg.min(-1, keepdims=True), wg.max(-1, keepdims=True)
    S = np.where(hi > lo, (hi - lo) / 2 ** bits, 1.0)
    if integer_zero:
        Z = np.rint(-lo / S)
        q = np.clip(np.rint(wg / S) + Z, 0, 2 ** bits - 1)
        return q.reshape(M, K).astype(np.int64), (S * (q - Z)).reshape(M, K)
    q = np.clip(np.rint((wg - lo) / S), 0, 2 ** bits - 1)
    return q.reshape(M, K).astype(np.int64), (S * q + lo).reshape(M, K)""",
        "floor instead of round": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(group_size)
    wg = w.astype(np.float64).reshape(M, -1, group_size)
    lo, hi = wg.min(-1, keepdims=True), wg.max(-1, keepdims=True)
    S = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    if integer_zero:
        Z = np.floor(-lo / S)
        q = np.clip(np.floor(wg / S) + Z, 0, 2 ** bits - 1)
        return q.reshape(M, K).astype(np.int64), (S * (q - Z)).reshape(M, K)
    q = np.clip(np.floor((wg - lo) / S), 0, 2 ** bits - 1)
    return q.reshape(M, K).astype(np.int64), (S * q + lo).reshape(M, K)""",
        "group_size ignored: one group per row": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(group_size)
    wg = w.astype(np.float64)
    lo, hi = wg.min(-1, keepdims=True), wg.max(-1, keepdims=True)
    S = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    if integer_zero:
        Z = np.rint(-lo / S)
        q = np.clip(np.rint(wg / S) + Z, 0, 2 ** bits - 1)
        return q.astype(np.int64), S * (q - Z)
    q = np.clip(np.rint((wg - lo) / S), 0, 2 ** bits - 1)
    return q.astype(np.int64), S * q + lo""",
        "the zero point not rounded (a float zero)": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(group_size)
    wg = w.astype(np.float64).reshape(M, -1, group_size)
    lo, hi = wg.min(-1, keepdims=True), wg.max(-1, keepdims=True)
    S = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    q = np.clip(np.rint((wg - lo) / S), 0, 2 ** bits - 1)
    return q.reshape(M, K).astype(np.int64), (S * q + lo).reshape(M, K)""",
        "computed in float32": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(group_size)
    wg = w.astype(np.float32).reshape(M, -1, group_size)
    lo, hi = wg.min(-1, keepdims=True), wg.max(-1, keepdims=True)
    S = np.where(hi > lo, (hi - lo) / np.float32(2 ** bits - 1), np.float32(1))
    if integer_zero:
        Z = np.rint(-lo / S)
        q = np.clip(np.rint(wg / S) + Z, 0, 2 ** bits - 1)
        w_hat = S * (q - Z)
    else:
        q = np.clip(np.rint((wg - lo) / S), 0, 2 ** bits - 1)
        w_hat = S * q + lo
    return q.reshape(M, K).astype(np.int64), w_hat.reshape(M, K).astype(np.float64)""",
    },
    "q5": {
        "without the minima's term": """def q4_1_matvec(raw, x):
    rows, nbytes = raw.shape
    b = raw.reshape(rows, nbytes // 20, 20)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    xb = x.astype(np.float64).reshape(-1, 32)
    dots = np.einsum("rbj,bj->rb", b[..., 4:] & 15, xb[:, :16]) + np.einsum("rbj,bj->rb", b[..., 4:] >> 4, xb[:, 16:])
    return (d * dots).sum(axis=1)""",
        "low and high nibbles swapped": """def q4_1_matvec(raw, x):
    rows, nbytes = raw.shape
    b = raw.reshape(rows, nbytes // 20, 20)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    xb = x.astype(np.float64).reshape(-1, 32)
    dots = np.einsum("rbj,bj->rb", b[..., 4:] >> 4, xb[:, :16]) + np.einsum("rbj,bj->rb", b[..., 4:] & 15, xb[:, 16:])
    return (d * dots).sum(axis=1) + m @ xb.sum(axis=1)""",
        "the dequantised matrix, then @": """def q4_1_matvec(raw, x):
    rows, nbytes = raw.shape
    b = raw.reshape(rows, nbytes // 20, 20)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float64)
    m = b[..., 2:4].copy().view(np.float16).astype(np.float64)
    q = np.concatenate([b[..., 4:] & 15, b[..., 4:] >> 4], axis=-1)
    return (d * q + m).reshape(rows, -1) @ x.astype(np.float64)""",
    },
}

#: correct real_model answers in other styles than the solutions: each keeps its question
REAL_RIGHT = {
    "q1": {
        "struct, one weight at a time": """import struct
def q8_0_block(raw):
    if len(raw) != 34 or raw.ndim != 1:
        raise ValueError(f"raw: expected 34 bytes; got shape {raw.shape}")
    data = raw.tobytes()
    d = np.float32(struct.unpack("<e", data[:2])[0])
    return np.array([d * np.float32(q) for q in struct.unpack("<32b", data[2:])], dtype=np.float32)""",
    },
    "q2": {
        "a loop over the 16 code bytes, float64 then cast": """def q4_1_blocks(raw):
    rows, nbytes = raw.shape
    if nbytes % 20 != 0:
        raise ValueError(f"raw: {nbytes} bytes a row is not whole 20-byte blocks")
    n = nbytes // 20
    b = raw.reshape(rows * n, 20)
    d = b[:, 0:2].copy().view("<f2")[:, 0].astype(np.float64)
    m = b[:, 2:4].copy().view("<f2")[:, 0].astype(np.float64)
    out = np.empty((rows * n, 32), np.float32)
    for i in range(16):
        out[:, i] = d * (b[:, 4 + i] & 0x0F) + m
        out[:, i + 16] = d * (b[:, 4 + i] >> 4) + m
    return out.reshape(rows, 32 * n)""",
    },
    "q3": {
        "an index array, one from the other": """def to_interleaved(w, n_heads):
    rows = w.shape[0]
    if rows % (2 * n_heads) != 0:
        raise ValueError(f"n_heads: {rows} rows are not {n_heads} even heads")
    d_h = rows // n_heads
    order = []
    for h in range(n_heads):
        for i in range(d_h // 2):
            order += [h * d_h + i, h * d_h + d_h // 2 + i]
    return w[np.array(order, dtype=np.intp)]

def to_rotate_half(w, n_heads):
    rows = w.shape[0]
    idx = to_interleaved(np.arange(rows), n_heads)
    out = np.empty_like(w)
    out[idx] = w
    return out""",
    },
    "q4": {
        "a loop over the groups": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size != 0:
        raise ValueError(f"group_size: {group_size} does not divide K = {K}")
    w = np.asarray(w, dtype=np.float64)
    codes, w_hat = np.zeros((M, K), np.int64), np.zeros((M, K))
    top = (1 << bits) - 1
    for r in range(M):
        for s in range(0, K, group_size):
            g = w[r, s:s + group_size]
            lo, hi = g.min(), g.max()
            S = (hi - lo) / top if hi > lo else 1.0
            if integer_zero:
                Z = np.rint(-lo / S)
                q = np.clip(np.rint(g / S) + Z, 0, top)
                w_hat[r, s:s + group_size] = S * (q - Z)
            else:
                q = np.clip(np.rint((g - lo) / S), 0, top)
                w_hat[r, s:s + group_size] = S * q + lo
            codes[r, s:s + group_size] = q
    return codes, w_hat""",
        "the transpose's layout: (K / g, g, M)": """def requantize(w, bits, group_size, integer_zero=False):
    M, K = w.shape
    if K % group_size:
        raise ValueError(group_size)
    wg = w.astype(np.float64).T.reshape(-1, group_size, M)
    lo, hi = wg.min(1, keepdims=True), wg.max(1, keepdims=True)
    S = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    if integer_zero:
        Z = np.rint(-lo / S)
        q = np.clip(np.rint(wg / S) + Z, 0, 2 ** bits - 1)
        w_hat = S * (q - Z)
    else:
        q = np.clip(np.rint((wg - lo) / S), 0, 2 ** bits - 1)
        w_hat = S * q + lo
    return q.reshape(K, M).T.astype(np.int64), w_hat.reshape(K, M).T""",
    },
    "q5": {
        "a loop over a block's 32 positions": """def q4_1_matvec(raw, x):
    rows, nbytes = raw.shape
    n = nbytes // 20
    b = raw.reshape(rows, n, 20)
    d = np.frombuffer(b[..., :2].tobytes(), "<f2").reshape(rows, n).astype(np.float64)
    m = np.frombuffer(b[..., 2:4].tobytes(), "<f2").reshape(rows, n).astype(np.float64)
    xb = np.asarray(x, np.float64).reshape(n, 32)
    acc = np.zeros((rows, n))
    for j in range(16):
        acc += (b[..., 4 + j] & 0x0F) * xb[:, j] + (b[..., 4 + j] >> 4) * xb[:, 16 + j]
    return np.einsum("rb,rb->r", d, acc) + np.einsum("rb,b->r", m, xb.sum(axis=1))""",
    },
}


def _plan(name):
    from preln.grade import checks
    return checks.plan_for(nbtools.source_path(name))


@pytest.mark.parametrize("name,key,label,right",
                         [("derivation_ops", q, w, False) for q, ws in WRONG_ANSWERS.items() for w in ws]
                         + [("int8", q, w, False) for q, ws in INT8_WRONG.items() for w in ws]
                         + [("int8", q, w, True) for q, ws in INT8_RIGHT.items() for w in ws]
                         + [("modern_block", q, w, False) for q, ws in MODERN_WRONG.items() for w in ws]
                         + [("modern_block", q, w, True) for q, ws in MODERN_RIGHT.items() for w in ws]
                         + [("inference", q, w, False) for q, ws in INFERENCE_WRONG.items() for w in ws]
                         + [("inference", q, w, True) for q, ws in INFERENCE_RIGHT.items() for w in ws]
                         + [("many_devices", q, w, False) for q, ws in MANY_WRONG.items() for w in ws]
                         + [("many_devices", q, w, True) for q, ws in MANY_RIGHT.items() for w in ws]
                         + [("real_model", q, w, False) for q, ws in REAL_WRONG.items() for w in ws]
                         + [("real_model", q, w, True) for q, ws in REAL_RIGHT.items() for w in ws])
def test_plausible_answers(name, key, label, right):
    plan = _plan(name)
    q = next(q for q in nbtools.questions(plan.nb) if q.key == key)
    assert mutate.run_question(plan, key, {}, MUTANT_TIMEOUT_S) is None          # the solution passes
    table = {("derivation_ops", False): WRONG_ANSWERS, ("int8", False): INT8_WRONG, ("int8", True): INT8_RIGHT,
             ("modern_block", False): MODERN_WRONG, ("modern_block", True): MODERN_RIGHT,
             ("inference", False): INFERENCE_WRONG, ("inference", True): INFERENCE_RIGHT,
             ("many_devices", False): MANY_WRONG, ("many_devices", True): MANY_RIGHT,
             ("real_model", False): REAL_WRONG, ("real_model", True): REAL_RIGHT}[name, right]
    reason = mutate.run_question(plan, key, {q.answers[0]: table[key][label]}, MUTANT_TIMEOUT_S)
    if right:
        assert reason is None, f"{name} {key}: the correct answer '{label}' fails: {reason}"
    else:
        assert reason is not None, f"{name} {key}: the wrong answer '{label}' passes every check"


# ---- issue 22 item 6: a course secret re-seeds the hidden inputs; honest answers keep their marks
#: questions whose hidden inputs are fixed grids (formats, shapes, step numbers, published GPUs),
#: not random draws: the secret leaves them as published (book/running.md says so). A random
#: question that escaped the re-seeding would show up here as a new entry.
GRID_QUESTIONS = {"inference": {"q1", "q2", "q5", "q6", "q7"}, "precision": {"q1", "q2", "q3"},
                  "preln_vs_postln": {"q1"}, "shape_flow": {"q1", "q2", "q3", "q4"}}


def _inputs(plan):
    return {k: q.inputs_document(10, 60)["inputs"] for k, q in plan.questions.items()}


def _solutions_pass(plan):
    from preln.grade import checks
    results, status = checks.run_in_process(plan, checks.exec_cells(plan.nb, {}))
    verdicts = checks.evaluate(plan, results, status, None)
    return {k: v.passed for k, v in verdicts.items()}


@pytest.mark.parametrize("name", nbtools.assignments())
def test_a_secret_reseeds_the_hidden_inputs_and_honest_scores_hold(name):
    from preln.grade import checks
    path = nbtools.source_path(name)
    plans = {s: checks.build_plan(path, s) for s in (None, "course secret A", "course secret B")}
    inputs = {s: _inputs(p) for s, p in plans.items()}
    same = {k for k in inputs[None] if inputs["course secret A"][k] == inputs["course secret B"][k]}
    assert same == GRID_QUESTIONS.get(name, set()), f"{name}: identical under two secrets: {sorted(same)}"
    assert {k for k in inputs[None] if inputs[None][k] == inputs["course secret A"][k]} == same
    for s, p in plans.items():                      # the solutions: full marks under every secret
        assert all(_solutions_pass(p).values()), (name, s, _solutions_pass(p))
    # the same secret gives the same inputs (every worker of a run builds the same plan)
    assert _inputs(checks.build_plan(path, "course secret A")) == inputs["course secret A"]


def test_the_secret_comes_from_the_environment_or_a_file(tmp_path, monkeypatch):
    from preln.grade import checks
    path = nbtools.source_path("derivation_ops")
    monkeypatch.setenv(checks.SECRET_ENV, "course secret A")
    assert _inputs(checks.plan_for(path)) == _inputs(checks.build_plan(path, "course secret A"))
    monkeypatch.delenv(checks.SECRET_ENV)
    assert _inputs(checks.plan_for(path)) == _inputs(checks.build_plan(path))
    (tmp_path / "secret").write_text("course secret A\n")
    assert checks.read_secret(tmp_path / "secret") == "course secret A"
    (tmp_path / "empty").write_text("\n")
    for bad in (tmp_path / "empty", tmp_path / "absent"):
        with pytest.raises(ValueError, match="secret-file"):
            checks.read_secret(bad)


# ---- issue 22 item 4: a trajectory question hands no call another call's expected values
#: a wrong Adam (no bias correction) that, like the attack of issue 22, reads every input of the
#: question (all of them reach the kernel) and answers with whichever candidate formula's result
#: shows up among the other calls' inputs
CANDIDATE_PICKER = '''
def _candidates(theta, g, m, v, t, lr, b1, b2, eps):
    m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    yield theta - lr * m1 / (np.sqrt(v1) + eps), m1, v1                      # the wrong default
    yield theta - lr * (m1 / (1 - b1 ** t)) / (np.sqrt(v1 / (1 - b2 ** t)) + eps), m1, v1

def adam_step(theta, g, m, v, t, lr, betas=(0.9, 0.98), eps=1e-8):
    seen = [a[0] for a, _ in ALL_INPUTS if len(a) > 0 and np.shape(a[0]) == np.shape(theta)]
    options = list(_candidates(theta, g, m, v, t, lr, *betas, eps))
    for new, m1, v1 in options:
        if any(np.allclose(new, s, rtol=1e-12, atol=0) for s in seen):
            return new, m1, v1
    return options[0]
'''


def test_a_candidate_picking_adam_finds_no_reference_state_among_the_inputs():
    from preln.grade import checks, wire
    plan = _plan("preln_vs_postln")
    qp = plan.questions["q2"]
    all_inputs = [wire.decode(qp.batch.trees[c["input"]], qp.batch.blobs, trusted=False) for c in qp.calls]
    ns = {"np": __import__("numpy"), "ALL_INPUTS": all_inputs}
    exec(CANDIDATE_PICKER, ns)                                     # noqa: S102: the test's own code
    results, status = checks.run_in_process(plan, ns, keys=["q2"])
    verdict = checks.evaluate(plan, results, status, None)["q2"]
    # the 21 steps from random states all fail: their inputs never hold a reference state
    assert verdict.n_failed >= 21, verdict.lines()


# ---- issue 22 item 5: each prompt states what its checks accept; ndarray subclasses are data
ACCEPTS = "**What the hidden checks accept:**"
SUBCLASS_NOTE = "an ndarray subclass without masked values"


class _Sub(__import__("numpy").ndarray):
    """A subclass that adds nothing (as a student's own array type might)."""


def _rewrap(value, how):
    import numpy as np
    if isinstance(value, np.ndarray) and type(value) is np.ndarray:
        if how == "sub":
            return value.view(_Sub)
        mask = np.zeros(value.shape, bool)
        if how == "masked" and value.size:
            mask.flat[0] = True
        return np.ma.MaskedArray(value, mask=mask)
    if isinstance(value, (tuple, list)):
        return type(value)(_rewrap(v, how) for v in value)
    if isinstance(value, dict):
        return {k: _rewrap(v, how) for k, v in value.items()}
    return value


def _returns_arrays(qp):
    import numpy as np

    def has(v):
        if isinstance(v, np.ndarray):
            return True
        if isinstance(v, (tuple, list)):
            return any(has(x) for x in v)
        return isinstance(v, dict) and any(has(x) for x in v.values())
    return any(has(getattr(e, "expected", None)) for _, _, exps in qp.checks for e in exps)


@pytest.mark.parametrize("name", nbtools.assignments())
def test_each_prompt_states_what_its_checks_accept_and_subclasses_are_data(name):
    from preln.grade import checks
    plan = _plan(name)
    prompts = {nbtools.grade_id(c)[:-len("_prompt")]: c.source for c in plan.nb.cells
               if (nbtools.grade_id(c) or "").endswith("_prompt")}
    ns = checks.exec_cells(plan.nb, {})
    for how in ("sub", "unmasked", "masked"):
        wrapped = dict(ns)
        for fn in plan.answer_names:
            wrapped[fn] = (lambda f: lambda *a, **k: _rewrap(f(*a, **k), how))(ns[fn])
        results, status = checks.run_in_process(plan, wrapped)
        verdicts = checks.evaluate(plan, results, status, None)
        for key, qp in plan.questions.items():
            arrays = _returns_arrays(qp)
            if how == "sub" or how == "unmasked" or not arrays:
                assert verdicts[key].passed, (name, key, how, verdicts[key].lines())
            else:                                   # a masked value is not data: the check fails
                assert not verdicts[key].passed, (name, key, how)
    for key, qp in plan.questions.items():
        assert ACCEPTS in prompts.get(key, ""), f"{name} {key}: the prompt does not state what the checks accept"
        # issue 32: the note on ndarray subclasses is said once, in the header, not in every prompt
        assert SUBCLASS_NOTE not in prompts[key], (name, key)
    header = plan.nb.cells[0].source
    assert (SUBCLASS_NOTE in " ".join(header.split())) == any(_returns_arrays(q) for q in plan.questions.values()), name
