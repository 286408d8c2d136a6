"""The tiny Llama-style LM (preln.models.llama_lm): gradient checks, decoding, the training loop shared
with the reference LM, the experiment's matched parameter counts and its stored runs.

(The LM against transformers' LlamaForCausalLM is in tests/test_llama_reference.py.)"""
import numpy as np
import pytest

from preln.models import pretrained
from preln.chapters.figures import modern_block as mb
from preln.gradcheck import numerical_gradient, rel_error
from preln.models.llama_lm import LlamaLM, LlamaLMConfig
from preln.models.pretrained import held_out_loss, train_lm
from preln.models.lm import LMConfig, TinyLM
from preln.models.corpus import load_corpus

#: analytic vs central-difference gradients (eps = 1e-6) in float64
GRAD_TOL = 1e-7
#: the same float64 computation done two ways
SAME_F64 = 1e-12
#: stored losses are rounded to 7 decimals; a re-run on another BLAS kernel differs by round-off
STORED_LOSS_ATOL = 1e-6

#: float64 logits of the plain (train) and tiled (eval) attention: the same sums in another order
TILED_ATOL = 1e-13

TINY = LlamaLMConfig(vocab_size=7, d_model=8, n_heads=2, n_kv_heads=1, d_ff=12, n_layers=2)


def test_every_gradient(rng):
    lm = LlamaLM(TINY, dtype=np.float64, seed=1)
    tokens = rng.integers(0, 7, (2, 5))
    targets = rng.integers(0, 7, (2, 5))
    _, grads = lm.loss_and_grads(tokens, targets)
    grads = {k: v.copy() for k, v in grads.items()}
    assert set(grads) == set(lm.params)
    assert "model.layers.1.self_attn.k_proj.weight" in grads and "lm_head.weight" in grads
    for name, p in lm.params.items():
        original = p.copy()

        def loss(value, p=p):
            p[...] = value
            return lm.loss(tokens, targets)
        numeric = numerical_gradient(loss, original)
        p[...] = original
        assert rel_error(grads[name], numeric) < GRAD_TOL, name


def test_decode_equals_forward_past_the_trained_length(rng):
    lm = LlamaLM(TINY, dtype=np.float64, seed=2).eval()
    tokens = rng.integers(0, 7, (2, 11))
    full = lm(tokens)
    kv = lm.kv_cache(2, 11)
    parts = [lm.decode(tokens[:, a:b], kv) for a, b in ((0, 4), (4, 5), (5, 11))]
    assert kv.length == 11 and kv.nbytes == 2 * 2 * 2 * 11 * 1 * 4 * 8   # L * 2 * B * S * H_kv * d_h * 8
    assert rel_error(np.concatenate(parts, axis=1), full) < SAME_F64


def test_bad_input():
    with pytest.raises(TypeError, match="LlamaLMConfig"):
        LlamaLM(LMConfig())
    with pytest.raises(ValueError, match="init"):
        LlamaLM(TINY._replace(init="torch"))
    lm = LlamaLM(TINY)
    with pytest.raises(ValueError, match=r"token ids in \[0, 7\)"):
        lm(np.array([[0, 7]]))
    with pytest.raises(ValueError, match="integer"):
        lm(np.zeros((1, 3)))
    with pytest.raises(RuntimeError, match="no forward"):
        LlamaLM(TINY).backward(np.zeros((1, 2, 7)))


def test_an_eval_forward_keeps_nothing_for_a_backward(rng):
    """Eval mode: the same logits (its tiled attention sums in another order), no block or LM keeps its activations (a 256-token forward of
    SmolLM2 kept 251 MiB), and a backward says why it cannot run; train mode keeps them."""
    lm = LlamaLM(TINY, dtype=np.float64, seed=3)
    tokens = rng.integers(0, 7, (2, 5))
    train_logits = lm(tokens)
    assert all(layer.cache_nbytes() > 0 for layer in lm.layers)
    lm.eval()
    eval_logits = lm(tokens)
    np.testing.assert_allclose(eval_logits, train_logits, rtol=0, atol=TILED_ATOL)
    assert all(layer.cache_nbytes() == 0 for layer in lm.layers)
    with pytest.raises(RuntimeError, match="an eval-mode forward keeps no activations"):
        lm.backward(np.zeros_like(eval_logits))


def test_train_lm_is_the_reference_lm_s_loop():
    """train_lm on the reference LM's model and recipe gives preln.models.pretrained's losses, step for step."""
    _, vocab, ids = load_corpus()
    train_ids, val_ids = pretrained.split_ids(ids)
    steps = 30
    gpt = mb.build_model("gpt", len(vocab), 0)
    log = train_lm(gpt, train_ids, dict(pretrained.RECIPE, steps=steps), 0, val_ids, eval_every=10,
                   eval_windows=4)
    ref = pretrained.reference_lm_log()["train_loss"][:steps]
    assert np.array_equal(log["train_loss"], ref)            # the same arithmetic, the same order
    assert log["val_steps"] == [0, 10, 20, 30] and log["val_loss"][-1] < log["val_loss"][0]
    assert not gpt.stack.training                            # returned in eval mode


def test_experiment_models_have_equal_parameter_counts():
    _, vocab, _ = load_corpus()
    counts = {name: mb.build_model(name, len(vocab), 0).num_params() for name in mb.MODELS}
    for name, cfg in mb.experiment_configs(len(vocab)).items():
        if name != "gpt":
            assert mb._llama_params(cfg) == counts[name]
            # the closest SwiGLU width: one more or one less moves further from the reference
            for f in (cfg.d_ff - 1, cfg.d_ff + 1):
                assert abs(mb._llama_params(cfg._replace(d_ff=f)) - counts["gpt"]) >= \
                    abs(counts[name] - counts["gpt"])
    assert max(counts.values()) / min(counts.values()) < 1.005


def test_stored_runs_are_what_the_code_computes():
    """The stored experiment's first steps re-run here (seed 0 of the Llama model) and its stored
    weights give its stored held-out perplexity."""
    runs = mb.load_runs()
    assert runs["checks"]["gpt_seed0_equals_reference_lm_log"]
    assert set(runs["models"]) == set(mb.MODELS)
    _, vocab, ids = load_corpus()
    for name, entry in runs["models"].items():
        assert entry["params"] == mb.build_model(name, len(vocab), 0).num_params()
        assert [r["seed"] for r in entry["runs"]] == list(mb.EXPERIMENT["seeds"])
    _, log = mb.train_run("llama", 0, steps=20)
    stored = runs["models"]["llama"]["runs"][0]
    assert np.abs(np.array(log["train_loss"]) - stored["train_loss"][:20]).max() < STORED_LOSS_ATOL
    _, val_ids = pretrained.split_ids(ids)
    lm = mb.load_weights("llama", len(vocab))
    assert pretrained.perplexity(lm, val_ids) == pytest.approx(stored["val_ppl"], rel=1e-9)
    # the training loop's held-out loss is the log of the perplexity over the same windows
    # (a cross-entropy "> 0" held for any model)
    assert np.exp(held_out_loss(lm, val_ids, 64, 4)) == pytest.approx(
        pretrained.perplexity(lm, val_ids, seq_len=64, max_windows=4), rel=SAME_F64)


def test_generate_is_the_one_of_every_lm():
    """LlamaLM generates with the same generate as TinyLM (preln.models.lm.Generator): with and
    without the KV cache the same tokens, sampling deterministic given the seed, eval mode during
    it and the mode restored, and a stop token ending a single sequence."""
    lm = LlamaLM(TINY, seed=0)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    lm.train()
    greedy = lm.generate(prompt, 6)
    assert lm.training, "generate left the model in eval mode"
    assert greedy.shape == (2, 9) and np.array_equal(greedy[:, :3], prompt)
    assert np.array_equal(greedy, lm.generate(prompt, 6, use_cache=False))
    a = lm.generate(prompt, 6, temperature=1.0, seed=3)
    assert np.array_equal(a, lm.generate(prompt, 6, temperature=1.0, seed=3, use_cache=False))
    first = int(greedy[0, 3])
    stopped = lm.generate(prompt[0], 6, stop_at=first)
    assert stopped.tolist() == prompt[0].tolist() + [first]
    with pytest.raises(ValueError, match="temperature"):
        lm.generate(prompt, 2, temperature=-1.0)
