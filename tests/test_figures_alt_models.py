"""The alt text and description of the modern-block, many-devices, serving and real-model figures
(issue 24): set by each figure function, short, plain words, and read from the data it was given."""
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from preln.chapters import inference as inf  # noqa: E402
from preln.chapters.figures import inference as serving  # noqa: E402
from preln.chapters.figures import many_devices as md  # noqa: E402
from preln.chapters.figures import modern_block as mb  # noqa: E402
from preln.chapters.figures import real_model as rmf  # noqa: E402
from figure_checks import own_words  # noqa: E402


def test_rope_wavelengths_are_read_off_the_frequencies():
    alt, description = own_words(mb.plot_rope_frequencies(64))
    assert "32 RoPE pairs" in alt and "6.3 positions" in alt and "47 thousand" in alt and "2.1 million" in alt
    alt16, _ = own_words(mb.plot_rope_frequencies(16, thetas=(100.0,)))
    assert "8 RoPE pairs" in alt16 and "(θ 100)" in alt16 and "million" not in alt16


def test_loss_by_position_words_follow_the_curves_given():
    flat = np.full(64, 0.8)
    rising = np.r_[np.full(64, 0.6), np.full(64, 1.1), np.full(128, 4.0)]
    alt, description = own_words(mb.plot_loss_by_position({"short": flat, "long": rising}))
    assert "short (0.80), long (0.60, 4.0)" in alt
    assert "1.1 at positions 64 to 127" in description and "positions 0 to 63" in description
    # the other call of the chapter: three long curves, other labels
    alt3, _ = own_words(mb.plot_loss_by_position(
        {"none": rising, "interpolated, s = 4": np.full(256, 4.1), "YaRN, s = 4": np.full(256, 0.9)}))
    assert "none (0.60, 4.0), interpolated, s = 4 (4.1, 4.1), YaRN, s = 4 (0.90, 0.90)" in alt3


def test_the_schedule_says_its_bubble():
    alt, description = own_words(md.plot_schedule(4, 8))
    assert "4 stages by 11 time steps" in alt and "3 of 11 steps, 27 %" in alt
    assert "3 of every 11 steps" in description


def test_tensor_parallel_words_name_where_communication_passes_compute():
    alt, description = own_words(md.plot_tp_times("Llama 2 7B", 4096))
    assert "at P = 8 (NVLink 4), 4 (PCIe 5.0 x16), 2 (InfiniBand NDR)" in alt
    assert "below compute up to P = 4 and above it from P = 8" in description
    alt_short, _ = own_words(md.plot_tp_times("Llama 2 7B", 4096, degrees=(1, 2, 4)))
    assert "never over NVLink 4" in alt_short


def test_decode_ops_words_give_the_crossing_batches():
    h100 = inf.PUBLISHED["H100 SXM"]
    model = inf.PUBLISHED_MODELS["OPT-13B"]
    fig = serving.plot_decode_ops([model], {"H100": (h100, 2)}, 4096)
    alt, description = own_words(fig)
    crossings = [inf.compute_bound_batch(model, h100, op, 4096) for op in ("qkv_proj", "out_proj", "linear2")]
    assert f"batch {min(crossings)} to {max(crossings)}" in alt and "below all" in alt
    alt_few, _ = own_words(serving.plot_decode_ops([model], {"H100": (h100, 2)}, 4096, batches=[1, 8]))
    assert "pass no ridge up to batch 8" in alt_few


def test_paged_memory_words_are_counted_from_the_runs():
    def rec(step, running, blocks, stored, reserved):
        return SimpleNamespace(step=step, running=tuple(range(running)), blocks_used=blocks,
                               tokens_stored=stored, reserved_tokens=reserved)

    paged = SimpleNamespace(steps=[rec(0, 2, 3, 20, 128), rec(1, 3, 5, 35, 192), rec(2, 1, 2, 10, 64)])
    reserved = SimpleNamespace(steps=[rec(i, 1, 1, 10, 64) for i in range(5)])
    alt, description = own_words(serving.plot_paged_memory(paged, reserved, 8, 64, 1024))
    assert "81% filled" in alt and "17%" in alt and "up to 3 sequences, done in 3 steps against 5" in alt
    assert "2.0 on average and up to 3" in description


def test_bytes_against_perplexity_draws_the_points_and_names_the_best():
    points = [("float32", 538.1e6, 20.2), ("4-bit", 88.4e6, 27.8), ("3-bit", 88.4e6, 69.8)]
    fig = rmf.plot_bytes_vs_perplexity(points, 20.2)
    ax = fig.axes[0]
    # a dot plot: a row per model, perplexity on a log axis, a series per method, the float32 line
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{lab} · {b / 1e6:.0f} MB" for lab, b, _ in points]
    assert len(ax.lines) == 1 + 1 and ax.get_xscale() == "log"
    alt, description = own_words(fig)
    assert "float32 20.2 at 538 MB" in alt and "2 models at 88 MB: 27.8 to 69.8, lowest 4-bit" in alt
    assert "6.1 times fewer bytes" in description and "3-bit: 88.4 MB, perplexity 69.8, 3.46 times" in description


def test_bytes_against_perplexity_tells_every_model_apart():
    """The chapter's 8 models, 7 of them reading the same bytes: each on a row of its own, the
    methods apart by marker and colour, also under simulated colour-blindness."""
    from figure_checks import assert_accessible

    points = [("float32", 538.1e6, 20.2), ("4-bit", 88.4e6, 27.8), ("3-bit", 88.4e6, 69.8)]
    points += [(f"3-bit {m}, {t} tokens", 88.4e6, 40.0 + i) for i, (m, t) in
               enumerate([("GPTQ", 256), ("GPTQ", 2048), ("AWQ", 256), ("AWQ", 1024), ("AWQ", 2048)])]
    fig = rmf.plot_bytes_vs_perplexity(points, 20.2)
    assert_accessible(fig)
    rows = sorted(y for line in fig.axes[0].lines[:-1] for y in line.get_ydata())
    assert rows == list(range(len(points)))
    styles = [(line.get_marker(), line.get_color()) for line in fig.axes[0].lines[:-1]]
    assert len(set(m for m, _ in styles)) == len(styles) == 3, styles     # float, GPTQ, AWQ
    with pytest.raises(ValueError, match="points"):
        rmf.plot_bytes_vs_perplexity(points * 2, 20.2)
