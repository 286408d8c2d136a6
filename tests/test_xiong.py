"""The experiments of the Pre-LN vs Post-LN chapter (Xiong et al. 2020) and the stored sweep."""
import json

import numpy as np
import pytest

from preln.chapters import xiong

SMALL = dict(d=32, n_tokens=8, batch=16)
SAMPLING_TOL = 0.05   # relative slack for Monte-Carlo estimates of an expectation (a few hundred tokens)


def test_theory_stack_has_uniform_attention():
    stack = xiong.theory_stack(True, 2, d=16, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 5, 16))
    stack(x)
    p = stack.layers[1].cache.attn.sdpa.p                    # (B, H, S, S)
    np.testing.assert_allclose(p, 1 / 5, rtol=1e-12)
    assert stack.config.n_heads == 1 and stack.config.d_ff == 16 and stack.config.activation == "relu"


def test_lemma2_pre_ln_inside_bounds():
    l = np.arange(7)
    measured = xiong.residual_norms(True, 6, **SMALL, seeds=range(2))
    lo, hi = xiong.lemma2_bounds(l)
    assert np.all(measured >= lo * (1 - SAMPLING_TOL)) and np.all(measured <= hi * (1 + SAMPLING_TOL))
    assert np.all(np.diff(measured) > 0)                      # grows with depth


def test_lemma2_post_ln_three_halves():
    measured = xiong.residual_norms(False, 6, **SMALL, seeds=range(2))
    np.testing.assert_allclose(measured, 1.5, rtol=2 * SAMPLING_TOL)


def test_theorem1_direction():
    kw = dict(**SMALL, vocab=32, seeds=range(4))
    pre = xiong.last_layer_grad_norm(True, [2, 16], **kw)
    post = xiong.last_layer_grad_norm(False, [2, 16], **kw)
    assert pre[1] / pre[0] < 0.7          # 1/sqrt(8) = 0.35 expected; shrinks with depth
    assert post[1] / post[0] > 0.7        # does not shrink


def test_fit_exponent_recovers_a_power_law():
    L = np.array([6, 12, 24])
    slope, c = xiong.fit_exponent(L, 3.0 * L ** -0.5)
    assert abs(slope + 0.5) < 1e-12 and abs(c - 3.0) < 1e-12


def test_short_training_run_reduces_loss():
    run = xiong.train_lm(norm_first=True, n_layers=2, lr=3e-3, warmup=0, steps=30, seed=0,
                         eval_every=30, eval_batches=2)
    assert not run["diverged"] and len(run["train_loss"]) == 30
    assert run["eval_loss"][-1] < run["eval_loss"][0] - 0.5


def test_train_lm_is_deterministic():
    a = xiong.train_lm(norm_first=False, n_layers=1, steps=5, seed=3, eval_every=5, eval_batches=1)
    b = xiong.train_lm(norm_first=False, n_layers=1, steps=5, seed=3, eval_every=5, eval_batches=1)
    assert a["train_loss"] == b["train_loss"] and a["eval_loss"] == b["eval_loss"]


RUNS = xiong.DATA_DIR / "preln_vs_postln" / "runs.json"


@pytest.mark.skipif(not RUNS.exists(), reason="the sweep has not been run (scripts/sweep_preln_postln.py)")
def test_stored_sweep_agrees_with_a_rerun():
    data = json.loads(RUNS.read_text())
    stored = next(r for r in data["runs"] if not r["config"]["norm_first"] and r["config"]["n_layers"] == 2
                  and r["config"]["lr"] == 1e-2 and r["config"]["warmup"] == 0 and r["config"]["seed"] == 0)
    cfg = {**stored["config"], "steps": 10, "eval_every": 1000}
    rerun = xiong.train_lm(**cfg)
    np.testing.assert_allclose(rerun["train_loss"], stored["train_loss"][:10], rtol=1e-8)
    assert rerun["eval_loss"][0] == pytest.approx(stored["eval_loss"][0], rel=1e-8)


@pytest.mark.parametrize("norm_first", [True, False])
def test_sample_gradient_is_the_one_position_gradient(norm_first):
    # with one sequence of one token the batch-mean loss *is* the one-position loss
    kw = dict(d=16, n_tokens=1, batch=1, vocab=16, seeds=[3])
    full = xiong.layer_grad_norms(norm_first, 3, "linear2.weight", **kw)[-1]
    assert abs(xiong.last_layer_sample_grad_norm(norm_first, 3, **kw) / full - 1) < 1e-10


def test_stored_run_summaries_agree():
    from preln.chapters.figures import preln_vs_postln as figs
    finals = figs.seed_finals(False, 6, 1e-2, 0)
    assert len(finals) == 2
    assert figs.final_eval(False, 6, 1e-2, 0) == pytest.approx(np.mean(finals))
    assert figs.last_over_first([2.0, 5.0, 8.0]) == 4.0
    theory = figs.load_theory()
    depths = theory["setting"]["thm1_depths"]
    per_depth = figs.theory_per_depth(theory, "thm1_sample", "pre", depths)
    assert per_depth.shape == (len(depths),)
    assert per_depth[0] == pytest.approx(np.mean(theory["thm1_sample"]["pre"][str(depths[0])]))


def test_early_updates_adam_first_step_is_lr_per_weight():
    """Adam's first step moves every weight by lr whatever its gradient: the update-to-weight
    ratio is the same for Pre-LN and Post-LN, and warm-up divides it by T_warmup."""
    kw = dict(n_layers=2, lr=1e-2, steps=3, seed=0, d_model=16, n_heads=2, d_ff=32, seq_len=8,
              batch_size=4)
    pre = xiong.early_updates(True, warmup=0, **kw)
    post = xiong.early_updates(False, warmup=0, **kw)
    pre_wu = xiong.early_updates(True, warmup=100, **kw)
    for r in (pre, post, pre_wu):
        assert r["ratio"].shape == r["grad"].shape == r["sign_like"].shape == (3, 2)
        # |dW| = lr(1) for every weight with a nonzero gradient (a tiny ReLU model has a few zeros)
        assert r["sign_like"][0].min() > 0.9
        assert np.all(r["out_change"] > 0) and np.all(np.isfinite(r["loss"]))
    assert np.allclose(pre["ratio"][0], post["ratio"][0], rtol=0.05)
    assert not np.allclose(pre["grad"][0], post["grad"][0], rtol=0.05)   # different gradients
    assert pre_wu["lr"][0] == 1e-4
    assert np.allclose(pre_wu["ratio"][0] / pre["ratio"][0], 0.01, rtol=0.05)
    # the same run as train_lm: the losses before each update agree
    run = xiong.train_lm(True, warmup=0, eval_every=10_000, eval_batches=1, **kw)
    assert np.allclose(run["train_loss"], pre["loss"], rtol=1e-12)


def test_plot_early_updates_draws_two_panels():
    import matplotlib
    matplotlib.use("Agg")
    from preln.chapters.figures import preln_vs_postln as figs
    kw = dict(n_layers=2, lr=1e-2, steps=2, d_model=16, n_heads=2, d_ff=32, seq_len=8, batch_size=4)
    res = {(True, 0): xiong.early_updates(True, warmup=0, **kw),
           (False, 10): xiong.early_updates(False, warmup=10, **kw)}
    fig = figs.plot_early_updates(res)
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2
