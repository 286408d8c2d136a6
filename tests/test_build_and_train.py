"""The on-ramp chapter's helpers (book/build_and_train.ipynb): its loss-curve figure (words read off
the data, labels on the plot rather than in a legend, text readable at the page's width) and the
recipe's rounding, preln.models.pretrained.round_params."""
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from figure_checks import assert_labelled, own_words  # noqa: E402
from preln.chapters.figures import build_and_train as bt  # noqa: E402
from preln.chapters.viz import apply_style  # noqa: E402
from preln.models.lm import LMConfig, TinyLM  # noqa: E402
from preln.models.pretrained import round_params  # noqa: E402

#: CSS px of the site's text column that a figure may have to fit (the narrowest the theme gives
#: the article at 1280 px); a wider figure is scaled down to it, and its text with it
COLUMN_PX = 640
#: CSS px per inch of a displayed figure (preln.nb: a 2x PNG at FIGURE_DPI = 200 shown at half size)
CSS_PX_PER_INCH = 100
#: the smallest text a figure may show on the site, in CSS px
MIN_TEXT_PX = 11


def _curves(steps=200, every=25, seed=0):
    """A made-up run: losses falling from ~3.5 to ~0.8, the held-out ones smooth."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    train = 0.8 + 2.7 * np.exp(-t / 40) + 0.03 * rng.standard_normal(steps)
    val_steps = np.arange(0, steps + 1, every)
    val = 0.78 + 2.75 * np.exp(-val_steps / 40)
    return train, val_steps, val


@pytest.fixture(autouse=True)
def _style():
    apply_style()


def test_loss_curves_say_what_they_plot():
    train, val_steps, val = _curves()
    fig = bt.plot_loss_curves(train, val_steps, val, 26, 20)
    assert_labelled(fig)
    alt, description = own_words(fig)
    tail = train[-20:].mean()
    assert f"from {train[0]:.2f} to {tail:.2f}" in alt
    assert f"from {val[0]:.2f} to {val[-1]:.2f} in 200 steps" in alt and "ln V = 3.26" in alt
    assert "measured every 25 steps" in description and "first 20 steps, shaded" in description
    assert f"{abs(val[-1] - tail):.2f} below the training loss" in description
    # below ln V from the first held-out point under it
    first_below = int(val_steps[np.argmax(val < np.log(26))])
    assert f"below the uniform guess from step {first_below} on" in description


def test_loss_curves_are_labelled_on_the_plot_not_in_a_legend():
    fig = bt.plot_loss_curves(*_curves(), 26, 20)
    ax = fig.axes[0]
    assert ax.get_legend() is None and not fig.legends
    words = [t.get_text() for t in ax.texts]
    assert "held-out text" in words and "training batches" in words and "warm-up" in words
    assert any(r"$\ln V$" in w for w in words)                 # mathtext, not "lnV" typed
    assert "$t$" in ax.get_xlabel()
    # every word inside the axes; the training label above its curve, the held-out one below its
    # (the training loss runs above the held-out loss: neither label crosses the other curve)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    for word, box in boxes.items():
        assert ax.bbox.x0 <= box.x0 and box.x1 <= ax.bbox.x1 and ax.bbox.y0 <= box.y0 and box.y1 <= ax.bbox.y1, word
    points = {t.get_text(): ax.transData.transform(t.xy) for t in ax.texts if hasattr(t, "xy")}
    assert boxes["training batches"].y0 > points["training batches"][1]
    assert boxes["held-out text"].y1 < points["held-out text"][1]


def test_loss_curve_text_is_readable_at_the_column_width():
    fig = bt.plot_loss_curves(*_curves(), 26, 20)
    fig.canvas.draw()
    width_px = fig.get_figwidth() * CSS_PX_PER_INCH
    shrink = min(1.0, COLUMN_PX / width_px)
    ax = fig.axes[0]
    texts = [t for t in fig.findobj(Text) + ax.get_xticklabels() + ax.get_yticklabels()
             if t.get_visible() and t.get_text().strip()]
    assert len(texts) > 10                                      # ticks, labels, title, direct labels
    smallest = min(t.get_fontsize() for t in texts) * CSS_PX_PER_INCH / 72 * shrink
    assert smallest >= MIN_TEXT_PX, f"smallest text {smallest:.1f} px at a {COLUMN_PX} px column"


@pytest.mark.parametrize("args, match", [
    (([3.0], [0, 1], [3.0, 2.0], 26, 5), "train_loss"),
    (([3.0, 2.0], [0, 1, 2], [3.0, 2.0], 26, 5), "val_steps, val_loss"),
    (([3.0, 2.0], [0, 1], [3.0, 2.0], 1, 5), "vocab_size"),
])
def test_loss_curves_name_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        bt.plot_loss_curves(*args)


def test_round_params_makes_the_recipes_model():
    lm = TinyLM(LMConfig(vocab_size=7, max_len=8, d_model=8, n_heads=2, d_ff=16, n_layers=2), dtype=np.float64,
                seed=3)
    D = lm.config.d_model
    rng = np.random.default_rng(0)
    for w in lm.params.values():                 # as after training: every value off the float32 grid
        w += 1e-9 * rng.standard_normal(w.shape) + 1e-3
    before = {k: w.copy() for k, w in lm.params.items()}
    assert round_params(lm) is lm
    for k, w in lm.params.items():
        assert w.dtype == np.float64
        np.testing.assert_array_equal(w, w.astype(np.float32))             # on the float32 grid
        if k.endswith("self_attn.in_proj_bias"):
            assert not w[D:2 * D].any()                                    # the key bias: exactly 0
            np.testing.assert_allclose(w[:D], before[k][:D], rtol=1e-7)    # queries and values kept
        else:
            np.testing.assert_allclose(w, before[k], rtol=1e-7, atol=1e-30)
    again = {k: w.copy() for k, w in lm.params.items()}
    round_params(lm)                                                       # a fixed point
    assert all(np.array_equal(w, again[k]) for k, w in lm.params.items())
