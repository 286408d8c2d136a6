"""The tiny LM: cross-entropy, embeddings and the whole model against central differences."""
import numpy as np
import pytest

from preln.gradcheck import numerical_gradient, rel_error
from preln.models.lm import (CharVocab, LMConfig, TinyLM, batches, cross_entropy_backward,
                      cross_entropy_forward, embedding_backward, embedding_forward, grammar_corpus)

GRAD_TOL = 1e-7


def test_cross_entropy_value_and_gradient():
    rng = np.random.default_rng(0)
    z, t = rng.standard_normal((3, 4, 5)), rng.integers(0, 5, (3, 4))
    loss, cache = cross_entropy_forward(z, t)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    expected = -np.mean(np.log(np.take_along_axis(p, t[..., None], -1)))
    assert abs(loss - expected) < 1e-12
    dz = cross_entropy_backward(1.0, cache)
    num = numerical_gradient(lambda v: cross_entropy_forward(v, t)[0], z)
    assert rel_error(dz, num) < GRAD_TOL


def test_cross_entropy_is_stable():
    z = np.array([[1000.0, 0.0, -1000.0]])
    loss, cache = cross_entropy_forward(z, np.array([1]))
    assert np.isclose(loss, 1000.0) and np.isfinite(cross_entropy_backward(1.0, cache)).all()


def test_cross_entropy_matches_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is optional; it is only a reference")
    rng = np.random.default_rng(1)
    z, t = rng.standard_normal((6, 7)) * 5, rng.integers(0, 7, 6)
    zt = torch.from_numpy(z).requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(zt, torch.from_numpy(t))
    ref.backward()
    loss, cache = cross_entropy_forward(z, t)
    assert abs(loss - ref.item()) < 1e-12
    np.testing.assert_allclose(cross_entropy_backward(1.0, cache), zt.grad.numpy(), atol=1e-14)


def test_cross_entropy_bad_targets():
    with pytest.raises(ValueError, match="targets"):
        cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="targets"):
        cross_entropy_forward(np.zeros((2, 3)), np.array([0]))


def test_embedding_backward_scatter_adds():
    rng = np.random.default_rng(2)
    table, ids = rng.standard_normal((5, 3)), np.array([[0, 2, 2], [4, 0, 0]])
    out, cache = embedding_forward(ids, table)
    w = rng.standard_normal(out.shape)
    dtable = embedding_backward(w, cache)
    num = numerical_gradient(lambda v: np.sum(embedding_forward(ids, v)[0] * w), table)
    assert rel_error(dtable, num) < GRAD_TOL
    assert not dtable[[1, 3]].any()   # ids 1 and 3 are unused


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("tie", [False, True])
def test_lm_end_to_end_gradients(norm_first, tie):
    cfg = LMConfig(vocab_size=6, max_len=5, d_model=8, n_heads=2, d_ff=12, n_layers=2,
                   norm_first=norm_first, tie_weights=tie, activation="gelu")
    lm = TinyLM(cfg, dtype=np.float64, seed=4)
    rng = np.random.default_rng(3)
    tokens, targets = rng.integers(0, 6, (2, 4)), rng.integers(0, 6, (2, 4))
    loss, grads = lm.loss_and_grads(tokens, targets)
    grads = {k: v.copy() for k, v in grads.items()}
    assert ("head.weight" in grads) != tie
    names = ["tok_emb.weight", "pos_emb.weight", "head.bias", "stack.layers.0.linear1.weight",
             "stack.layers.1.self_attn.in_proj_weight"] + ([] if tie else ["head.weight"])
    for name in names:
        p = lm.params[name]
        def f(v):
            old = p.copy()
            p[...] = v
            out = lm.loss(tokens, targets)
            p[...] = old
            return out
        assert rel_error(grads[name], numerical_gradient(f, p)) < GRAD_TOL, name


def test_lm_is_causal():
    lm = TinyLM(LMConfig(vocab_size=6, max_len=6, d_model=8, n_heads=2, d_ff=12, n_layers=2), dtype=np.float64,
                seed=0)
    a = np.array([[1, 2, 3, 4, 5, 0]])
    b = a.copy(); b[0, 4:] = [0, 1]
    np.testing.assert_allclose(lm(a)[:, :4], lm(b)[:, :4], atol=1e-13)


def test_corpus_vocab_batches():
    text = grammar_corpus(5000, seed=0)
    assert text == grammar_corpus(5000, seed=0) and len(text) == 5000
    vocab = CharVocab(text)
    assert len(vocab) <= 100 and vocab.decode(vocab.encode(text[:50])) == text[:50]
    tok, tgt = next(batches(vocab.encode(text), 3, 7, seed=0))
    assert tok.shape == tgt.shape == (3, 7)
    np.testing.assert_array_equal(tok[:, 1:], tgt[:, :-1])
