"""preln.viz: the style, deterministic PNGs and the kernel-free explorables."""
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from preln.viz import MAX_FRAMES, PALETTE, apply_style, explorable, figure_png  # noqa: E402

OKABE_ITO = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}


def line_plot(scale, shift):
    fig, ax = plt.subplots()
    x = np.linspace(-3, 3, 61)
    ax.plot(x, np.tanh(scale * (x - shift)))
    ax.set_title(f"scale={scale:g}")
    return fig


def side_plot(scale, side):
    """A control with str values: ``side`` picks the centre of the curve."""
    return line_plot(scale, {"left": -1.0, "centre": 0.0}[side])


def alt_text(scale, shift):
    return f"tanh curve with slope {scale:g}, centred at {shift:g}"


@pytest.fixture(autouse=True)
def no_leaked_figures():
    plt.close("all")
    yield
    assert plt.get_fignums() == [], "a test left pyplot figures open"


def test_palette_is_okabe_ito():
    assert len(PALETTE) == 8 and set(PALETTE) == OKABE_ITO


def test_apply_style_sets_the_colour_cycle():
    apply_style()
    assert [c.upper() for c in matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]] == PALETTE
    assert matplotlib.rcParams["font.size"] >= 10


def test_figure_png_is_deterministic_and_has_no_software_stamp():
    a = line_plot(1.0, 0.0)
    b = line_plot(1.0, 0.0)
    pa, pb = figure_png(a), figure_png(b)
    plt.close(a), plt.close(b)
    assert pa[:8] == b"\x89PNG\r\n\x1a\n"
    assert pa == pb
    assert b"Software" not in pa and b"matplotlib" not in pa


def test_frames_alt_and_timings():
    controls = {"scale": [0.5, 1.0, 2.0], "shift": [-1.0, 0.0, 1.0, 2.0]}
    ex = explorable(line_plot, controls, alt=alt_text, title="tanh")
    assert len(ex.frames) == 12 == len(ex.alts) == len(ex.timings)
    assert len(set(ex.frames.values())) == 12, "every setting draws a different frame"
    assert ex.alts[(2, 1)] == "tanh curve with slope 2, centred at 0"
    assert set(ex.timings) == {(s, t) for s in controls["scale"] for t in controls["shift"]}
    assert all(t >= 0 for t in ex.timings.values())


def test_string_alt_gets_the_settings_appended():
    ex = explorable(line_plot, {"scale": [1, 2], "shift": [0.0]}, alt="A tanh curve")
    assert sorted(ex.alts.values()) == ["A tanh curve (scale = 1, shift = 0)",
                                        "A tanh curve (scale = 2, shift = 0)"]


def test_html_has_controls_image_and_all_frames():
    ex = explorable(side_plot, {"scale": [0.5, 1.0, 2.0], "side": ["left", "centre"]},
                    alt=lambda scale, side: f"slope {scale:g}, {side}",
                    initial={"scale": 1.0})
    html = ex._repr_html_()
    assert html.startswith(f'<div class="preln-explorable" id="{ex.id}">')
    assert len(re.findall(r'<input type="range"', html)) == 1          # numeric control
    assert len(re.findall(r"<select ", html)) == 1                       # str control
    assert len(re.findall(r"<label for=", html)) == 2
    assert len(re.findall(r'<output for="[^"]+" class="preln-explorable-value">', html)) == 2
    imgs = re.findall(r"<img [^>]*>", html)
    assert len(imgs) == 1 and 'alt="slope 1, left"' in imgs[0]           # the initial frame
    assert 'value="1"' in html                                           # initial scale index
    data = json.loads(re.search(r'<script type="application/json" class="preln-explorable-data">'
                                r"(.*?)</script>", html).group(1))
    assert data["labels"] == [["0.5", "1", "2"], ["left", "centre"]]
    assert len(data["frames"]) == 6 and all(f[1] for f in data["frames"].values())
    # self-contained: no external scripts, styles or images
    assert "<script src" not in html and "http://" not in html and "https://" not in html


def test_output_is_deterministic():
    make = lambda: explorable(line_plot, {"scale": [1.0, 2.0], "shift": [0.0]}, alt=alt_text)  # noqa: E731
    a, b = make(), make()
    assert a.frames == b.frames
    assert a.to_html().replace(a.id, "ID") == b.to_html().replace(b.id, "ID")
    assert a.id != b.id, "the same explorable shown twice needs distinct element ids"
    assert re.fullmatch(r"<explorable: scale, shift, 2 x 1 frames>", repr(a))


@pytest.mark.parametrize("controls, error", [
    ({}, ValueError),
    ({"a": [1], "b": [1], "c": [1], "d": [1]}, ValueError),
    ({"a": []}, ValueError),
    ({"a": list(range(MAX_FRAMES + 1))}, ValueError),
])
def test_bad_controls(controls, error):
    with pytest.raises(error):
        explorable(lambda **kw: plt.figure(), controls, alt="x")
    plt.close("all")


def test_alt_is_required_and_plot_must_return_a_figure():
    with pytest.raises(ValueError, match="alt"):
        explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt="  ")
    with pytest.raises(ValueError, match="alt"):
        explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt=lambda **kw: "")
    with pytest.raises(TypeError, match="Figure"):
        explorable(lambda scale: None, {"scale": [1.0]}, alt="x")
    with pytest.raises(ValueError, match="initial"):
        explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt="x", initial={"scale": 3.0})
    plt.close("all")


def test_live_needs_a_kernel():
    ex = explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt=alt_text)
    with pytest.raises(RuntimeError, match="kernel"):
        ex.live()


def test_live_in_ipython_returns_an_interactive():
    pytest.importorskip("ipywidgets")
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    try:
        import ipywidgets

        ex = explorable(side_plot, {"scale": [1.0, 2.0], "side": ["left", "centre"]},
                        alt=lambda scale, side: f"slope {scale:g}, {side}")
        w = ex.live()
        assert isinstance(w, ipywidgets.interactive)
        assert [type(c).__name__ for c in w.children[:2]] == ["SelectionSlider", "Dropdown"]
        n = len(ex.timings)
        w.children[0].value = 2.0      # recomputes with the real function
        assert len(ex.timings) == n and ex.timings[(2.0, "left")] >= 0
    finally:
        plt.close("all")
        del ip
