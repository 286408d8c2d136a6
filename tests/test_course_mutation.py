"""The course edition, slow part 3 (`make test-course`): each assignment's hidden checks catch at
least 90 % of the mutants of its solutions (scripts/course/mutate.py; `make mutation` prints the
table), and every plausible wrong answer of derivation_ops and int8 loses its question — evaluated
exactly as the grader evaluates (scripts/course/checks.py), in this process."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "course"))
sys.path.insert(0, str(ROOT))
import mutate  # noqa: E402
import nbtools  # noqa: E402

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
}


def _plan(name):
    import checks
    return checks.plan_for(nbtools.source_path(name))


@pytest.mark.parametrize("name,key,label,right",
                         [("derivation_ops", q, w, False) for q, ws in WRONG_ANSWERS.items() for w in ws]
                         + [("int8", q, w, False) for q, ws in INT8_WRONG.items() for w in ws]
                         + [("int8", q, w, True) for q, ws in INT8_RIGHT.items() for w in ws])
def test_plausible_answers(name, key, label, right):
    plan = _plan(name)
    q = next(q for q in nbtools.questions(plan.nb) if q.key == key)
    assert mutate.run_question(plan, key, {}, MUTANT_TIMEOUT_S) is None          # the solution passes
    table = (INT8_RIGHT if right else INT8_WRONG) if name == "int8" else WRONG_ANSWERS
    reason = mutate.run_question(plan, key, {q.answers[0]: table[key][label]}, MUTANT_TIMEOUT_S)
    if right:
        assert reason is None, f"{name} {key}: the correct answer '{label}' fails: {reason}"
    else:
        assert reason is not None, f"{name} {key}: the wrong answer '{label}' passes every check"
