"""The alt text and description of the Precision and Pre-LN vs Post-LN figures (issue 24): set by
each figure function, short, plain words, and read from the data it was given."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from preln.chapters import numerics  # noqa: E402
from preln.chapters.figures import precision as prec  # noqa: E402
from preln.chapters.figures import preln_vs_postln as figs  # noqa: E402
from figure_checks import own_words  # noqa: E402


def _closed_words(fig):
    """own_words, and the figure closed (these tests make many)."""
    plt.close(fig)
    return own_words(fig)


def _dynamic_run(n=20):
    scale = 2.0 ** np.minimum(10 + np.arange(n) // 5, 12)
    skipped = np.zeros(n, bool)
    skipped[[0, 12]] = True
    flushed = np.full(n, 2e-5)
    flushed[skipped] = np.nan
    return dict(scale=scale, skipped=skipped, max_abs=np.full(n, 1.0), flushed=flushed,
                flushed_unscaled=np.linspace(1e-3, 0.5, n))


def test_precision_figures_say_what_their_data_shows():
    alt, _ = _closed_words(prec.plot_number_line(numerics.format_rows()))
    assert "float16 65504" in alt and "float8_e4m3fn 448" in alt

    t = np.arange(0, 16, 0.25)
    safe = 1 / (1 + np.exp(-t))
    naive = np.where(t < 11.25, safe, np.nan)
    assert "NaN from t = 11.25 on" in _closed_words(prec.plot_softmax_overflow(t, naive, safe, 11.09))[0]
    assert "stays finite" in _closed_words(prec.plot_softmax_overflow(t, safe, safe, 11.09))[0]

    ds = [512, 2048, 8192]
    alt, description = _closed_words(prec.plot_layernorm_thresholds(ds, np.sqrt(65520 / np.array(ds))))
    assert "falls from 11.3 to 2.83" in alt and "lie on it" in alt and "5.66 at D = 2048" in description

    curves = {64: np.linspace(1, 3, 33)}
    alt, description = _closed_words(prec.plot_stream_growth(curves, (4096, 65520)))
    assert "reaches 3 in 32 blocks" in alt and "Xavier" not in alt
    assert "D = 65520 at block 0" in description and "below the limit for D = 4096" in description
    alt, _ = _closed_words(prec.plot_stream_growth(curves, (4096,), xavier={64: np.linspace(1, 9, 9)}))
    assert "Xavier init 9 in 8, 16 times faster" in alt

    rows = [dict(scale=2.0 ** k, flushed=f, overflowed=o)
            for k, f, o in ((0, 0.3, 0), (4, 0.004, 0), (8, 0.0, 0.5), (12, 0.0, 1.0))]
    alt, description = _closed_words(prec.plot_loss_scale_window(rows, 2.0 ** 6))
    assert "30 % flush to 0 at 2^0" in alt and "from 2^4 to 2^4" in alt and "overflow from 2^8" in alt
    assert "reaches 100 % at 2^12" in description

    alt, description = _closed_words(prec.plot_dynamic_scaling(_dynamic_run(), np.geomspace(2.0 ** -10, 2.0 ** -14, 20)))
    assert "2 overflowing steps skipped" in alt and "under 0.01 %" in alt and "up to 50 %" in alt
    assert "skipped steps, 0 and 12" in description and "doubles every 5 steps" in description


def test_preln_vs_postln_figures_say_what_their_data_shows():
    l = np.arange(7)
    alt, _ = _closed_words(figs.plot_lemma2(1 + l, np.full(6, 1.5)))
    assert "rises from 1 to 7, inside Lemma 2's band" in alt and "near 3/2 (1.5 to 1.5)" in alt

    L = np.array([4, 8, 16])
    alt, description = _closed_words(figs.plot_theorem1(L, 2 / np.sqrt(L), np.full(3, 3.0),
                                                  {"pre": (-0.5, 2.0), "post": (0.0, 3.0)}, 0.1 + 0 * L, 0.2 * L))
    assert "falls as L^−0.50 (1 to 0.5)" in alt and "stays level as L^0 (3 to 3)" in alt
    assert "exponent 1.00, above the one-position 0" in description
    # a fitted slope that rounds to zero reads as flat, never as a negative zero
    fig = figs.plot_theorem1(L, 2 / np.sqrt(L), np.full(3, 3.0), {"pre": (-0.5, 2.0), "post": (-0.003, 3.0)})
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert "Post-LN fit: flat, $\\propto L^{0}$" in labels and "Pre-LN fit: $\\propto L^{-0.50}$" in labels
    alt, _ = _closed_words(fig)
    assert "stays level as L^0 (3 to 3)" in alt and "0.00" not in alt

    up, down = np.linspace(0.1, 0.5, 6), np.linspace(0.5, 0.25, 6)
    alt, _ = _closed_words(figs.plot_fig3a(down, up, down, up))
    assert alt.endswith("first 22, 5, 5 for Post-LN; 0.82, 0.5, 0.5 for Pre-LN.")

    alt, description = _closed_words(figs.plot_training(6, 1e-2, 0))
    assert "Post-LN without warm-up ends highest" in alt and "held-out 2.90" in description
    alt, _ = _closed_words(figs.plot_final_loss())
    assert "2.90 without warm-up" in alt


def test_early_updates_alt_handles_any_runs():
    one = dict(lr=np.full(2, 1e-2), ratio=np.array([[0.07, 0.07], [0.05, 0.05]]),
               sign_like=np.array([[1.0, 1.0], [0.1, 0.1]]))
    alt, description = _closed_words(figs.plot_early_updates({(True, 0): one, (False, 0): one}))
    assert "starts at 7 % without warm-up, for Pre-LN and Post-LN alike" in alt
    alt, _ = _closed_words(figs.plot_early_updates({(True, 0): one, (False, 10): {**one, "ratio": one["ratio"] / 10}}))
    assert "7 % without warm-up and 0.7 % with 10 warm-up steps." in alt
