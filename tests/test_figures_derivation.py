"""Tests for preln/chapters/figures/derivation.py: plots return labelled Figures, data helpers are right."""
import numpy as np
import pytest
from matplotlib.figure import Figure

from preln import BlockConfig, TransformerBlock
from preln.chapters.figures import all_explorables
from preln.chapters.figures import derivation as figs
from preln.gradcheck import numerical_gradient, rel_error
from preln.ops import attention_forward, layer_norm_forward
from tests.figure_checks import assert_labelled, own_words

FD_TOL = 1e-7        # hand-written backward vs central differences (float64)
EXACT_TOL = 1e-12    # the same computation done two ways in float64


@pytest.fixture(scope="module")
def small():
    cfg = BlockConfig(d_model=8, n_heads=2, d_ff=16, norm_first=True, causal=True)
    block = TransformerBlock(cfg, dtype=np.float64, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 8))
    mask = np.array([[False] * 4, [False, False, False, True]])
    return cfg, block, x, mask, rng.standard_normal((2, 4, 8))


# ---- plots ----------------------------------------------------------------------------------

def test_static_plots_are_labelled_figures():
    steps = np.array([1e-2, 1e-4, 1e-6])
    assert_labelled(figs.plot_step_sweep(steps, np.array([1e-4, 1e-8, 1e-9])))
    assert_labelled(figs.plot_qk_variance([4, 16]))
    assert_labelled(figs.plot_gelu())
    assert_labelled(figs.plot_layernorm_graph())
    assert_labelled(figs.plot_eps_placement(8))


def test_static_plots_carry_short_alts_with_their_results():
    """Each plot's alt fits ALT_MAX without a cut, has no TeX, and quotes numbers of the data it got."""
    steps = 10.0 ** -np.arange(1, 9)
    plots = {"lowest at δ = 1e−5": figs.plot_step_sweep(steps, np.abs(np.log10(steps) + 5) + 1e-3),
             "d_h from 64 to 128": figs.plot_qk_variance([64, 128]),
             "x from −3 to 3": figs.plot_gelu(-3.0, 3.0),
             "x-hat": figs.plot_layernorm_graph(),
             "0.968 = √(15/16)": figs.plot_eps_placement(16)}
    for expected, fig in plots.items():
        alt, description = own_words(fig)
        assert expected in alt, alt


def test_explorables_registered_and_every_frame_is_a_labelled_figure():
    assert set(figs.EXPLORABLES) == {"qk_scaling", "attention_masks", "online_softmax"}
    found = all_explorables()
    for name, (plot, controls) in figs.EXPLORABLES.items():
        assert found[f"derivation.{name}"] == (plot, controls)
        ((control, values),) = controls.items()
        for value in values:
            assert_labelled(plot(**{control: value}))


@pytest.mark.parametrize("d_h", figs.EXPLORABLES["qk_scaling"][1]["d_h"])
def test_qk_scaling_alt_text_describes_the_frame(d_h):
    text = figs.qk_scaling_alt(d_h)
    assert f"d_h = {d_h}" in text and "entropy" in text


def test_attention_masks_alt_text_names_the_empty_rows():
    assert "rows 0, 1" in figs.attention_masks_alt("causal + left padding (first 2 keys)")
    assert "every row sums to 1" in figs.attention_masks_alt("causal")


# ---- data helpers ---------------------------------------------------------------------------

def test_forward_steps_is_the_pre_ln_block(small):
    cfg, block, x, mask, _ = small
    t = figs.forward_steps(x, block.params, cfg, mask)
    assert set(figs.FORWARD_STEPS) <= set(t)
    assert rel_error(t["y"], block(x, mask)) < EXACT_TOL
    assert t["q"].shape == (2, 2, 4, 4) and t["u"].shape == (2, 4, 16)


def test_forward_steps_override_recomputes_downstream(small):
    cfg, block, x, mask, _ = small
    t = figs.forward_steps(x, block.params, cfg, mask)
    zero_a = figs.forward_steps(x, block.params, cfg, mask, override={"a": np.zeros_like(t["a"])})
    assert np.array_equal(zero_a["x1"], x)                   # x1 = x + a with a = 0
    assert np.array_equal(zero_a["h1"], t["h1"])             # upstream untouched


def test_forward_steps_rejects_post_ln_and_dropout(small):
    _, block, x, _, _ = small
    for cfg in (BlockConfig(d_model=8, n_heads=2, d_ff=16, norm_first=False),
                BlockConfig(d_model=8, n_heads=2, d_ff=16, dropout=0.1)):
        with pytest.raises(ValueError, match="config"):
            figs.forward_steps(x, block.params, cfg)


def test_losses_give_the_block_gradients(small):
    cfg, block, x, mask, w = small
    block.zero_grad()
    block(x, mask)
    dx = block.backward(w)
    fd_x = numerical_gradient(figs.intermediate_loss(x, block.params, cfg, w, "x", mask), x)
    assert rel_error(dx, fd_x) < FD_TOL
    name = "norm2.weight"
    fd_p = numerical_gradient(figs.param_loss(x, block.params, cfg, w, name, mask), block.params[name])
    assert rel_error(block.grads[name], fd_p) < FD_TOL
    block.zero_grad()
    with pytest.raises(ValueError, match="name"):
        figs.intermediate_loss(x, block.params, cfg, w, "nope")
    with pytest.raises(KeyError, match="name"):
        figs.param_loss(x, block.params, cfg, w, "nope")


def test_qk_logit_variance_is_d_h():
    for d_h in (4, 64):
        st = figs.qk_logit_stats(d_h)
        assert abs(st["var"] / d_h - 1) < 0.15
        assert abs(st["var_scaled"] - 1) < 0.15


def test_softmax_saturation_without_scale():
    sat = figs.softmax_saturation(128)
    for kind in ("unscaled", "scaled"):
        assert 0 <= sat[kind]["entropy"] <= np.log(16) + EXACT_TOL
        assert np.allclose(sat[kind]["p"].sum(-1), 1)
    assert sat["unscaled"]["entropy"] < 0.5 * sat["scaled"]["entropy"]
    assert sat["unscaled"]["max_p"] > sat["scaled"]["max_p"]


def test_gelu_difference_matches_the_published_bound():
    d = figs.gelu_difference()
    assert abs(d["max_abs"] - 4.7e-4) < 0.05e-4            # pins this computation: 4.73e-4
    assert abs(d["x_at_max"] - 2.7) < 0.05                  # near |x| = 2.7
    assert np.abs(d["diff"] - d["diff"][::-1]).max() < EXACT_TOL   # an even function


@pytest.mark.parametrize("mask", list(figs.MASKS))
def test_masked_attention(mask):
    p, allowed = figs.masked_attention(mask)
    assert p.shape == allowed.shape == (figs.MASK_S, figs.MASK_S)
    assert np.all(p[~allowed] == 0)
    visible = allowed.any(-1)
    assert np.allclose(p[visible].sum(-1), 1)
    assert np.all(p[~visible] == 0)
    assert (~visible).sum() == (2 if mask.startswith("causal + left") else 0)


def test_table_text_and_html():
    t = figs.Table(["name", "err"], [("dx", 1.234e-9), ("a<b", 0.5)], caption="errors")
    text = repr(t)
    assert text.splitlines()[0] == "errors" and "1.2e-09" in text and "5.0e-01" in text
    html = t._repr_html_()
    assert "<caption>errors</caption>" in html and "a&lt;b" in html and html.count("<tr>") == 3
    with pytest.raises(ValueError, match="rows"):
        figs.Table(["a", "b"], [(1,)])


# ---- the LayerNorm graph, the online softmax, eps ---------------------------------------------

def test_layernorm_graph_edges_join_known_nodes():
    for a, b, label in figs.LN_GRAPH_EDGES:
        assert a in figs.LN_GRAPH_NODES and b in figs.LN_GRAPH_NODES and label.strip()
    # every node but x is computed from something, and x reaches y
    targets = {b for _, b, _ in figs.LN_GRAPH_EDGES}
    assert targets == set(figs.LN_GRAPH_NODES) - {"x"}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_tile,k_tile", [(1, 1), (3, 2), (4, 5), (16, 16)])
def test_online_softmax_trace_equals_plain_attention(causal, q_tile, k_tile):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 7, 4))
    out, trace = figs.online_softmax_trace(q, k, v, q_tile, k_tile, causal)
    plain, _ = attention_forward(q[None, None], k[None, None], v[None, None], causal=causal)
    assert np.abs(out - plain[0, 0]).max() < EXACT_TOL
    z = q @ k.T / 2.0                                         # tau = 1/sqrt(4)
    if causal:
        z = np.where(np.tri(7, dtype=bool), z, -np.inf)
    for rows in {(t["rows"].start, t["rows"].stop) for t in trace}:
        steps = [t for t in trace if (t["rows"].start, t["rows"].stop) == rows]
        ms = np.array([t["m"] for t in steps])
        assert np.all(np.diff(ms, axis=0) >= 0)               # the running max never decreases
        zr = z[rows[0]:rows[1]]
        m = zr.max(1)
        assert np.abs(steps[-1]["m"] - m).max() < EXACT_TOL
        assert np.abs(steps[-1]["l"] - np.exp(zr - m[:, None]).sum(1)).max() < EXACT_TOL
    if causal:                                                # no tile entirely right of the diagonal
        assert all(t["cols"].start <= t["rows"].stop - 1 for t in trace)


def test_online_softmax_explorable_frames_and_alt():
    _, _, _, _, trace = figs.tiling_example()
    steps = figs.EXPLORABLES["online_softmax"][1]["step"]
    assert steps == list(range(1, len(trace) + 1))
    assert len(trace) == 6                                    # 2 key tiles for rows 0-3, 4 for rows 4-7
    text = figs.online_softmax_alt(len(trace))
    assert "6 of 6 tiles" in text and "queries 4 to 7" in text and "keys 6 to 7" in text
    with pytest.raises(ValueError, match="step"):
        figs.plot_online_softmax(0)


@pytest.mark.parametrize("d", [4, 8, 64])
def test_layer_norm_output_std_matches_both_formulas(d):
    rng = np.random.default_rng(d)
    for scale in (1e-7, 1e-3, 1.0, 30.0):
        x = scale * rng.standard_normal((5, d))
        sigma = x.std(-1)
        inside, _ = layer_norm_forward(x, np.ones(d), np.zeros(d), 1e-5)
        outside = (x - x.mean(-1, keepdims=True)) / (x.std(-1, ddof=1, keepdims=True) + 1e-6)
        assert np.allclose(inside.std(-1), figs.layer_norm_output_std(sigma, d, 1e-5, "inside"),
                           rtol=1e-10, atol=1e-12)
        assert np.allclose(outside.std(-1), figs.layer_norm_output_std(sigma, d, 1e-6, "outside"),
                           rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="placement"):
        figs.layer_norm_output_std(1.0, d, 1e-5, "between")
