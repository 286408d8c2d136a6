"""The course edition, slow part 3 (`make test-course`): each assignment's tests catch at least
90 % of the mutants of its solutions (scripts/course/mutate.py; `make mutation` prints the table)."""
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


@pytest.mark.parametrize("key,label", [(q, w) for q, ws in WRONG_ANSWERS.items() for w in ws])
def test_plausible_wrong_answers_lose_their_question(key, label):
    nb = nbtools.read(nbtools.source_path("derivation_ops"))
    q = next(q for q in nbtools.questions(nb) if q.key == key)
    assert mutate.run_question(nb, q, {}, MUTANT_TIMEOUT_S) is None          # the solution passes
    reason = mutate.run_question(nb, q, {q.answers[0]: WRONG_ANSWERS[key][label]}, MUTANT_TIMEOUT_S)
    assert reason is not None, f"{key}: the wrong answer '{label}' passes every test"
