"""Tests for preln/chapters/figures/derivation_block.py: the data helpers compute what the chapter says they
compute, and every plot is a labelled Figure."""
import numpy as np
import pytest
from matplotlib.figure import Figure

from preln import BlockConfig, TransformerBlock
from preln.chapters.figures import all_explorables
from preln.chapters.figures import derivation_block as figs
from preln.gradcheck import numerical_gradient, rel_error
from tests.figure_checks import assert_labelled, own_words

FD_TOL = 1e-7        # hand-written backward vs central differences (float64)
EXACT_TOL = 1e-12    # the same computation done two ways in float64


# ---- Jacobians -----------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_first", [True, False])
def test_block_jacobian_matches_finite_differences(norm_first):
    cfg = BlockConfig(d_model=8, n_heads=2, d_ff=16, norm_first=norm_first)
    block = TransformerBlock(cfg, dtype=np.float64, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 8))
    J = figs.block_jacobian(block, x)
    assert J.shape == (24, 24)
    for i in (0, 7, 23):                                     # rows: gradients of single outputs
        fd = numerical_gradient(lambda z: float(block(z).ravel()[i]), x).ravel()
        assert rel_error(J[i], fd) < FD_TOL
    assert all(not g.any() for g in block.grads.values())    # parameter gradients left at zero
    with pytest.raises(ValueError, match=r"x: expected one sequence, shape \(1, S, D\)"):
        figs.block_jacobian(block, np.zeros((2, 3, 8)))


def test_jacobian_stats():
    st = figs.jacobian_stats(2 * np.eye(4))
    assert st["diag"] == 2.0 and st["dist"] == 1.0


def test_pre_ln_jacobian_approaches_identity_post_ln_scales_inversely():
    big, small = figs.jacobian_pair(8, 4.0), figs.jacobian_pair(8, 0.5)
    pre_big, pre_small = figs.jacobian_stats(big["J_pre"]), figs.jacobian_stats(small["J_pre"])
    post_big, post_small = figs.jacobian_stats(big["J_post"]), figs.jacobian_stats(small["J_post"])
    assert pre_big["dist"] < pre_small["dist"] / 4
    assert abs(pre_big["diag"] - 1) < 0.05
    assert post_small["diag"] > 4 * post_big["diag"]


# ---- the stack -----------------------------------------------------------------------------------

def _law(scales, n_layers):
    """Data shaped as the chapter's 1/rms(x_L) cell measures it (the law itself is asserted there)."""
    scales = np.array(scales, dtype=float)
    rms = 0.9 * scales
    return {"scales": scales, "n_layers": n_layers, "rms_xL": rms, "grad_norm": 4.5 / rms, "ln_gain": 1 / rms}


# ---- dropout and BatchNorm ---------------------------------------------------------------------

def test_dropout_moments():
    m = figs.dropout_moments(0.5, np.array([1.0, -2.0, 0.5]), n_draws=20000, seed=0)
    assert abs(m["kept"] - 0.5) < 0.01
    assert abs(m["mean_ratio"] - 1) < 0.02
    assert abs(m["second_ratio"] - 2) < 0.05
    assert np.abs(m["survivor_scale"] - 2).max() < EXACT_TOL


def test_batchnorm_experiments():
    tr = figs.bn_running_trace(n_steps=40, batch=16, momentum=0.1, seed=0)
    assert tr["mean"][0] == 0 and tr["var"][0] == 1 and tr["mean"].size == 41
    assert tr["bn"].num_batches_tracked == 40
    gap = figs.bn_train_eval_gap((2, 8, 32), n_batches=50, seed=0)
    assert np.all(gap["ln"] == 0) and np.all(np.diff(gap["bn"]) < 0)
    pad = figs.bn_padding_effect((0, 8))
    assert pad["bn"][0] == 0 < pad["bn"][1] and np.all(pad["ln"] == 0)
    assert list(pad["pad_fraction"]) == [0.0, 0.5]


# ---- plots ---------------------------------------------------------------------------------------

def test_plots_are_labelled_figures():
    assert_labelled(figs.plot_final_norm_scaling(_law((1, 2), n_layers=1)))
    ps = [0.1, 0.5]
    assert_labelled(figs.plot_dropout_moments(ps, [figs.dropout_moments(p, np.ones(3), 100) for p in ps]))
    tr = figs.bn_running_trace(n_steps=5)
    gap = figs.bn_train_eval_gap((2, 4), n_batches=5)
    assert_labelled(figs.plot_batchnorm(tr, gap, (2, 4), figs.bn_padding_effect((0, 4))))
    fig = figs.plot_stack_diagram(n_layers=2)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("LN") == 8 and "final LN" in texts     # 4 branch LNs + 4 on Post-LN's stream


def test_plots_describe_the_data_they_were_given():
    ps = [0.2, 0.5]
    figures = {"crosses 6 LayerNorms": figs.plot_stack_diagram(n_layers=3),
               "after 2 Pre-LN blocks": figs.plot_final_norm_scaling(_law((1, 4), n_layers=2)),
               "p from 0.2 to 0.5": figs.plot_dropout_moments(ps, [figs.dropout_moments(p, np.ones(3), 100) for p in ps]),
               "padding moves outputs": figs.plot_batchnorm(figs.bn_running_trace(n_steps=5),
                                                            figs.bn_train_eval_gap((2, 4), n_batches=5), (2, 4),
                                                            figs.bn_padding_effect((0, 4)))}
    for expected, fig in figures.items():
        alt, description = own_words(fig)
        assert expected in alt, alt
    assert "LayerNorm's change is exactly 0" in description


def test_explorables_registered_and_frames_are_labelled():
    assert set(figs.EXPLORABLES) == {"jacobians", "batchnorm_token"}
    found = all_explorables()
    for name, (plot, controls) in figs.EXPLORABLES.items():
        assert found[f"derivation_block.{name}"] == (plot, controls)
        assert_labelled(plot(**{k: v[0] for k, v in controls.items()}))
    text = figs.jacobians_alt(8, 1.0)
    assert "Pre-LN" in text and "Post-LN" in text and "D = 8" in text
    text = figs.bn_token_alt(4, 0.5)
    assert "batch of 4 real tokens and 4 zero padding tokens" in text and "LayerNorm" in text


def test_bn_token_outputs():
    out = figs.bn_token_outputs(batch_size=4, pad_fraction=0.5)
    assert out["n_pad"] == 4 and out["ln"].shape == (8,)
    assert np.array_equal(out["ln"], figs.bn_token_outputs(64, 0.75)["ln"])     # LayerNorm: no batch
    pop = (figs.bn_token_outputs(2)["bn_eval"])                                  # eval: population stats
    token = figs.POP_MEAN + figs.POP_STD * np.random.default_rng(0).standard_normal(8)
    assert np.abs(pop - (token - figs.POP_MEAN) / np.sqrt(figs.POP_STD ** 2 + 1e-5)).max() < EXACT_TOL
    with pytest.raises(ValueError, match="pad_fraction"):
        figs.bn_token_outputs(4, 1.0)
