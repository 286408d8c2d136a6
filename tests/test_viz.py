"""preln.chapters.viz: the style, deterministic PNGs and the kernel-free explorables."""
import base64
import io
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from preln.chapters import viz  # noqa: E402
from preln.chapters.viz import (MAX_FRAMES, PALETTE, Control, apply_style, control, explorable,  # noqa: E402
                       figure_png)

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


HUE_TOLERANCE = 0.02   # of the colour wheel (7 degrees): a darkened Okabe-Ito colour keeps its hue


def test_palette_is_okabe_ito_darkened_to_keep_its_hues():
    import colorsys

    from matplotlib.colors import to_rgb

    from preln.chapters.viz import OKABE_ITO as PUBLISHED
    assert len(PALETTE) == 8 and set(PUBLISHED) == OKABE_ITO
    for ours, theirs in zip(PALETTE, PUBLISHED):
        h1, l1, _ = colorsys.rgb_to_hls(*to_rgb(ours))
        h2, l2, _ = colorsys.rgb_to_hls(*to_rgb(theirs))
        assert ours == theirs or (l1 < l2 and min(abs(h1 - h2), 1 - abs(h1 - h2)) < HUE_TOLERANCE), (ours, theirs)
    assert sum(a != b for a, b in zip(PALETTE, PUBLISHED)) == 4, "only the four light hues are darkened"


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


def _data(html):
    return json.loads(re.search(r'<script type="application/json" class="preln-explorable-data">'
                                r"(.*?)</script>", html).group(1))


def test_palette_frames_are_small_deterministic_pngs():
    fig = line_plot(1.0, 0.0)
    rgba, pal, again = figure_png(fig), figure_png(fig, colors=256), figure_png(fig, colors=256)
    plt.close(fig)
    assert pal == again, "palette re-encoding must be deterministic (reproducible builds)"
    assert pal[:8] == b"\x89PNG\r\n\x1a\n" and pal[25] == 3, "colour type 3: a palette PNG"
    assert rgba[25] == 6, "matplotlib writes RGBA"
    assert len(pal) < len(rgba)
    with pytest.raises(ValueError, match="colors"):
        figure_png(fig, colors=1)


def test_control_is_a_labelled_list():
    c = control("head width d_h", [4, 8, 16])
    assert isinstance(c, Control) and isinstance(c, list)
    assert c == [4, 8, 16] and list(c) == [4, 8, 16] and c[1] == 8 and c.label == "head width d_h"
    assert "head width d_h" in repr(c)
    with pytest.raises(ValueError, match="label"):
        control("  ", [1, 2])
    with pytest.raises(TypeError, match="values"):
        control("a label", "abc")


def test_labels_from_control_and_keyword():
    ex = explorable(line_plot, {"scale": control("slope of the curve", [1.0, 2.0]), "shift": [0.0, 1.0]},
                    alt=alt_text, labels={"shift": "horizontal shift"})
    assert ex.labels == ["slope of the curve", "horizontal shift"]
    ex = explorable(line_plot, {"scale": control("slope of the curve", [1.0]), "shift": [0.0]},
                    alt=alt_text, labels={"scale": "steepness"})
    assert ex.labels == ["steepness", "shift"], "labels= wins; without a label the name is shown"
    with pytest.raises(ValueError, match="unknown"):
        explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt=alt_text, labels={"slope": "x"})
    with pytest.raises(ValueError, match="share a label"):
        explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt=alt_text,
                   labels={"scale": "a knob", "shift": "a knob"})
    plt.close("all")


def test_html_is_an_accessible_widget():
    ex = explorable(side_plot, {"scale": control("slope of the curve", [0.5, 1.0, 2.0, 4.0]),
                                "side": control("where the curve is centred", ["left", "centre"])},
                    alt=lambda scale, side: f"A tanh curve of slope {scale:g}, centred {side}. More detail.",
                    initial={"scale": 1.0}, title="A tanh curve")
    html = ex._repr_html_()
    uid, frame = ex.id, f"{ex.id}-frame"
    # a <figure> captioned by the title groups the controls and the image; a visible badge says
    # it is interactive
    assert re.search(rf'</style><figure class="preln-explorable" id="{uid}"[^>]*><figcaption id="{uid}-caption"'
                     rf'[^>]*><span class="preln-explorable-badge">Interactive</span> <strong>A tanh curve</strong>', html)
    assert html.endswith("</figure>")
    # more than MAX_TOGGLE_VALUES numbers: an ARIA slider whose value is the real value, not an index
    sliders = re.findall(r'<span class="preln-slider" [^>]*role="slider"[^>]*>', html)
    assert len(sliders) == 1
    s = sliders[0]
    for attr, want in [("aria-valuenow", "1.0"), ("aria-valuetext", "1"), ("aria-valuemin", "0.5"),
                       ("aria-valuemax", "4.0"), ("aria-controls", frame), ("tabindex", "0"),
                       ("aria-labelledby", f"{uid}-c0-label")]:
        assert f'{attr}="{want}"' in s, (attr, s)
    assert f'<span class="preln-explorable-label" id="{uid}-c0-label">slope of the curve</span>' in html
    # ... with step and play buttons, named after the control, pointing at the image
    buttons = re.findall(r"<button [^>]*>", html)
    assert [re.search(r'aria-label="([^"]*)"', b).group(1) for b in buttons] == [
        "previous slope of the curve", "next slope of the curve", "play through slope of the curve"]
    assert all(f'aria-controls="{frame}"' in b and 'type="button"' in b for b in buttons)
    assert 'aria-pressed="false"' in buttons[2]
    # ... and its value shown once, beside it
    assert html.count(f'id="{uid}-c0-value"') == 1
    # at most MAX_TOGGLE_VALUES values: a segmented toggle, a radio group named by its label
    group = re.search(r'<span class="preln-segmented" [^>]*>', html).group(0)
    for attr, want in [("role", "radiogroup"), ("tabindex", "0"), ("aria-labelledby", f"{uid}-c1-label"),
                       ("aria-controls", frame), ("aria-activedescendant", f"{uid}-c1-o0"),
                       ("data-preln-control", "1")]:
        assert f'{attr}="{want}"' in group, (attr, group)
    radios = re.findall(r'<span class="preln-segment" role="radio" id="([^"]+)" data-k="(\d)" '
                        r'aria-checked="(true|false)">([^<]*)</span>', html)
    assert radios == [(f"{uid}-c1-o0", "0", "true", "left"), (f"{uid}-c1-o1", "1", "false", "centre")]
    assert f'id="{uid}-c1-value"' not in html, "a toggle shows its value itself: no echo"
    imgs = re.findall(r"<img [^>]*>", html)
    assert len(imgs) == 1 and f'id="{frame}"' in imgs[0]
    assert 'alt="A tanh curve of slope 1, centred left. More detail."' in imgs[0]
    assert "aria-describedby" not in imgs[0] and "<details" not in html, "a short alt needs no description"
    assert re.search(r'width="\d+" height="\d+"', imgs[0]), "the image reserves its space"
    # a polite live region, empty until the reader moves a control
    assert '<p class="preln-explorable-status" role="status" aria-atomic="true"></p>' in html
    data = _data(html)
    assert data["labels"] == [["0.5", "1", "2", "4"], ["left", "centre"]]
    assert data["values"][0] == ["0.5", "1.0", "2.0", "4.0"]
    assert data["play_ms"] == round(1000 * viz.PLAY_SECONDS)
    assert len(data["frames"]) == 8
    src, alt, said, settings = data["frames"]["2,1"]
    assert src.startswith("data:image/png;base64,") and alt.startswith("A tanh curve of slope 2")
    # the announcement is the result; the page prefixes only the setting the reader changed
    assert said == "A tanh curve of slope 2, centred centre."
    assert data["names"] == ["slope of the curve", "where the curve is centred"]
    assert settings == "slope of the curve = 2, where the curve is centred = centre"
    # self-contained: no external scripts, styles or images
    assert "<script src" not in html and "http://" not in html and "https://" not in html


def test_a_drop_down_shows_its_value_once():
    models = ["Llama 2 7B", "Llama 2 13B", "Llama 2 70B", "GPT-3 175B"]
    ex = explorable(lambda model: line_plot(1.0, 0.0), {"model": control("model", models)},
                    alt=lambda model: f"A curve for {model}.", initial={"model": "Llama 2 70B"})
    html = ex.to_html()
    assert re.search(rf'<label class="preln-explorable-label" for="{ex.id}-c0"[^>]*>model</label>'
                     rf'<span class="preln-explorable-input preln-wide"><select id="{ex.id}-c0" [^>]*'
                     rf'aria-controls="{ex.id}-frame"', html)
    # "Llama 2 70B" once, in the selected option: no value echoed beside the drop-down
    controls = re.search(r'<div class="preln-explorable-controls".*?</select>', html, re.S).group(0)
    assert controls.count("Llama 2 70B") == 1 and '<option value="2" selected>Llama 2 70B</option>' in controls
    assert "<button" not in html and 'role="radiogroup"' not in html


def test_control_kind_follows_the_number_and_kind_of_values():
    assert viz.control_kind([1, 2, 3]) == viz.control_kind(["a", "b"]) == "toggle"
    assert viz.control_kind([1, 2, 3, 4]) == "slider"
    assert viz.control_kind(["a", "b", "c", "d"]) == viz.control_kind([1, 2, "x", 4]) == "select"
    assert viz.MAX_TOGGLE_VALUES == 3


def test_a_long_alt_is_cut_to_its_first_sentence_and_described_in_full():
    from preln.nb import ALT_MAX

    words = "The curve rises from minus one to one. " + "It is steep near its centre and flat far from it. " * 4

    ex = explorable(line_plot, {"scale": [1.0, 2.0], "shift": [0.0]},
                    alt=lambda scale, shift: f"Slope {scale:g}. " + words)
    html = ex.to_html()
    img = re.search(r"<img [^>]*>", html).group(0)
    assert 'alt="Slope 1."' in img and f'aria-describedby="{ex.id}-description"' in img
    desc = re.search(rf'<details class="preln-explorable-description"><summary>[^<]+</summary>'
                     rf'<p id="{ex.id}-description">([^<]*)</p></details>', html)
    assert desc and desc.group(1).startswith("Slope 1. The curve rises") and len(desc.group(1)) > ALT_MAX
    frame = _data(html)["frames"]["1,0"]
    assert frame[1] == "Slope 2." and frame[4] == ex.alts[(1, 0)], "each frame carries its own description"
    assert 'getElementById("' + ex.id + '-description")' in html, "the script updates the description"


def test_summary_callable_is_announced():
    ex = explorable(line_plot, {"scale": [1.0, 2.0], "shift": [0.0]}, alt=alt_text,
                    summary=lambda scale, shift: f"slope {scale:g}")
    assert ex.summaries[(1, 0)] == "slope 2"
    # an alt function may carry its summary
    alt = lambda scale, shift: alt_text(scale, shift)  # noqa: E731
    alt.summary = lambda scale, shift: f"the slope is {scale:g}"
    assert explorable(line_plot, {"scale": [3.0], "shift": [0.0]}, alt=alt).summaries[(0, 0)] == "the slope is 3"
    with pytest.raises(ValueError, match="summary"):
        explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt=alt_text, summary=lambda **kw: " ")
    plt.close("all")


def test_every_explorable_of_the_book_has_descriptive_unique_labels():
    """The book's explorables (preln.chapters.figures.*.EXPLORABLES) name each control for the reader:
    a label that is not the bare symbol, unique among the explorables of its chapter (one page)."""
    from preln.chapters.figures import all_explorables

    by_chapter = {}
    for key, (plot, controls) in all_explorables().items():
        for name, values in controls.items():
            label = getattr(values, "label", None)
            assert label, f"{key}: control {name!r} has no label: use preln.chapters.viz.control(label, values)"
            assert label.casefold() != name.casefold(), f"{key}: control {name!r} is labelled by its bare name"
            by_chapter.setdefault(key.split(".")[0], []).append((label, f"{key}:{name}"))
    for chapter, labels in by_chapter.items():
        seen = {}
        for label, where in labels:
            assert label not in seen, f"{chapter}: {where} and {seen[label]} share the label {label!r}"
            seen[label] = where


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


@pytest.fixture
def no_shell():
    """No IPython shell in this process: another test on the same xdist worker may have left its
    process-wide singleton behind (in random order, before or after these tests)."""
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    yield
    InteractiveShell.clear_instance()


def test_live_needs_a_kernel(no_shell):
    ex = explorable(line_plot, {"scale": [1.0], "shift": [0.0]}, alt=alt_text)
    with pytest.raises(RuntimeError, match="kernel"):
        ex.live()


def test_live_in_ipython_has_the_page_s_controls(no_shell):
    pytest.importorskip("ipywidgets")
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    try:
        import ipywidgets

        ex = explorable(side_plot, {"scale": [1.0, 2.0, 3.0, 4.0], "side": ["left", "centre"]},
                        alt=lambda scale, side: f"slope {scale:g}, {side}")
        w = ex.live()
        assert isinstance(w, ipywidgets.VBox)
        slider_row, toggle, out = w.children
        slider, play = slider_row.children
        assert (type(slider).__name__, type(toggle).__name__, type(play).__name__) == (
            "SelectionSlider", "ToggleButtons", "Play")
        assert [slider.description, toggle.description] == ["scale", "side"]
        # play steps through the slider's values, one every PLAY_SECONDS, and stops at the end
        assert (play.min, play.max, play.value) == (0, 3, 0) and not play.repeat
        assert play.interval == round(1000 * viz.PLAY_SECONDS)
        assert isinstance(out, ipywidgets.Output)
        n = len(ex.timings)
        slider.value = 2.0      # recomputes with the real function
        assert len(ex.timings) == n and ex.timings[(2.0, "left")] >= 0
        toggle.value = "centre"
        assert ex.timings[(2.0, "centre")] >= 0
    finally:
        plt.close("all")
        # the shell is a process-wide singleton: left behind, the tests after this one (on this
        # xdist worker) ran "in a kernel" (test_live_needs_a_kernel failed in reverse order)
        type(ip).clear_instance()


def _site_extension():
    """book/_ext/preln_site.py, the Sphinx extension that publishes the explorables (loaded by its
    path: book/_ext is on sys.path only inside a Sphinx build)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "book" / "_ext" / "preln_site.py"
    spec = importlib.util.spec_from_file_location("preln_site", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_build_moves_frames_into_content_named_files(tmp_path):
    import hashlib

    site = _site_extension()
    ex = explorable(side_plot, {"scale": control("slope of the curve", [0.5, 1.0, 2.0]),
                                "side": control("where the curve is centred", ["left", "centre"])},
                    alt=lambda scale, side: f"slope {scale:g}, {side}")
    html = ex.to_html()
    out = site.extract_frames(html, tmp_path / "a", lambda path: "../" + path)
    assert "data:image" not in out, "the page's HTML keeps no image data"
    files = sorted((tmp_path / "a" / site.FRAMES_DIR).iterdir())
    assert {f.read_bytes() for f in files} == set(ex.frames.values())
    assert all(f.name == hashlib.sha256(f.read_bytes()).hexdigest()[:24] + ".png" for f in files)
    data = _data(out)
    assert len(data["frames"]) == len(ex.frames)
    assert all(f[0].startswith(f"../{site.FRAMES_DIR}/") and f[0].endswith(".png") for f in data["frames"].values())
    img = re.findall(r"<img [^>]*>", out)
    assert len(img) == 1 and 'loading="lazy"' in img[0] and f'src="../{site.FRAMES_DIR}/' in img[0]
    # reproducible: the same notebook output gives the same page and the same files
    again = site.extract_frames(html, tmp_path / "b", lambda path: "../" + path)
    assert again == out
    assert [f.read_bytes() for f in sorted((tmp_path / "b" / site.FRAMES_DIR).iterdir())] == [f.read_bytes() for f in files]


def test_the_site_build_fixes_the_bibliography_role():
    site = _site_extension()
    html = '<div role="list" class="citation-list"><div class="citation" id="id1" role="doc-biblioentry">x</div></div>'
    fixed = site.fix_markup(html)
    assert "doc-biblioentry" not in fixed and 'class="citation" id="id1" role="listitem"' in fixed


def test_the_site_gives_a_figure_the_words_of_its_notebook_output():
    """The site shows a figure's PNG (myst-nb names the file by its SHA-256) with the alt and the
    description that preln.nb wrote into the output's HTML copy: the words are written once."""
    import hashlib

    from preln import nb

    site = _site_extension()
    fig = side_plot(1.0, "left")
    nb.set_alt(fig, "A tanh curve of slope 1 & centred left.", "It rises from −1 to 1 <steeply>.")
    plain = nb.set_alt(side_plot(2.0, "left"), "A steeper curve.")
    outputs = [{"output_type": "display_data", "metadata": meta, "data": data}
               for data, meta in (nb.figure_bundle(fig), nb.figure_bundle(plain))]
    plt.close("all")
    words = site.figure_words({"cells": [{"cell_type": "code", "outputs": outputs}]})
    sha = [hashlib.sha256(base64.b64decode(o["data"]["image/png"])).hexdigest() for o in outputs]
    assert set(words) == set(sha)
    page = (f'<a class="reference internal image-reference" href="../_images/{sha[0]}.png"><img alt="../_images/'
            f'{sha[0]}.png" src="../_images/{sha[0]}.png" style="width: 562px;" />\n</a>\n<p>text</p>'
            f'<img alt="" src="../_images/{sha[1]}.png" />'
            f'<img alt="a logo" src="../_static/logo.png" />')
    out = site.apply_figure_words(page, words)
    imgs = re.findall(r"<img [^>]*>", out)
    assert 'alt="A tanh curve of slope 1 &amp; centred left."' in imgs[0]
    did = re.search(r'aria-describedby="([^"]+)"', imgs[0]).group(1)
    # the description follows the link, not inside it (a link holds the image only)
    assert re.search(rf'</a><details class="preln-figure-description"><summary>[^<]+</summary>'
                     rf'<p id="{did}">It rises from −1 to 1 &lt;steeply&gt;.</p></details>\n<p>text</p>', out)
    assert 'alt="A steeper curve."' in imgs[1] and "aria-describedby" not in imgs[1]
    assert imgs[2] == '<img alt="a logo" src="../_static/logo.png" />', "other images are left alone"
    assert site.apply_figure_words(page, {}) == page


# ---- dark variants and captions (issue 33) ------------------------------------------------------

#: how far (CIELAB-free: a plain sRGB channel difference) a dark figure's grey may sit from the
#: mirrored value (palette quantisation of the PNG)
GREY_TOLERANCE = 0.02


def test_dark_colours_mirror_greys_and_keep_data_readable():
    from preln.chapters import viz

    bg = viz._rgb(viz.DARK_BACKGROUND)
    assert viz.dark_colour("white")[:3] == pytest.approx(bg)          # the face: the page's
    assert viz.dark_colour("black")[:3] == pytest.approx((viz.DARK_INK,) * 3)   # text: light
    for colour in PALETTE:   # every data colour readable on the dark face, its hue kept
        shown = viz.dark_colour(colour)[:3]
        assert viz.contrast_ratio(shown, bg) >= viz.MIN_DATA_CONTRAST, colour
    blue = viz.dark_colour(PALETTE[0])[:3]
    assert blue[2] > blue[0] and blue[2] > blue[1], "blue stays blue"
    # the check can fail: the light palette's black itself is invisible on the dark face
    assert viz.contrast_ratio(PALETTE[6], bg) < viz.MIN_DATA_CONTRAST
    assert viz.contrast_ratio(viz.dark_colour(PALETTE[0])[:3], bg) >= viz.DARK_DATA_CONTRAST
    assert viz.dark_colour((1, 0, 0, 0.25))[3] == 0.25                 # alpha kept


def test_the_dark_variant_is_drawn_without_changing_the_figure():
    from matplotlib.colors import to_hex
    from PIL import Image

    from preln import nb
    from preln.chapters import viz

    fig = line_plot(1.0, 0.0)
    fig.axes[0].set_title("a title")
    before = [to_hex(c) for c in (fig.axes[0].lines[0].get_color(), fig.axes[0].title.get_color())]
    light = Image.open(io.BytesIO(viz.figure_png(fig, dpi=50))).convert("RGB")
    dark = Image.open(io.BytesIO(viz.dark_png(fig, dpi=50, tight=False))).convert("RGB")
    after = [to_hex(c) for c in (fig.axes[0].lines[0].get_color(), fig.axes[0].title.get_color())]
    assert before == after and light.size == dark.size
    corner = np.asarray(dark)[1, 1] / 255
    assert corner == pytest.approx(viz._rgb(viz.DARK_BACKGROUND), abs=GREY_TOLERANCE)
    # the bundle's HTML copy carries it, hidden (JupyterLab shows the light image)
    data, _ = viz.figure_bundle(nb.set_alt(fig, "A line."))
    assert data["text/html"].count("<img") == 2 and 'class="preln-figure-dark" hidden="hidden"' in data["text/html"]
    plt.close(fig)


def test_the_site_shows_the_dark_variant_in_dark_mode_and_the_description_after_the_caption():
    site = _site_extension()
    sha = "ab" * 32
    page = (f'<figure class="align-default" id="fig-x">\n<a class="reference internal image-reference" '
            f'href="../_images/{sha}.png"><img alt="x" src="../_images/{sha}.png" style="width: 500px;" />\n'
            '</a>\n<figcaption>\n<p><span class="caption-number">Fig. 1 </span>A caption.</p>\n</figcaption>\n'
            '</figure>\n<p>text</p>')
    words = {sha: ("An alt.", '<details class="preln-figure-description"><summary>Description of the '
                              'figure</summary><p id="d1">Long.</p></details>')}
    out = site.apply_figure_words(page, words)
    # image, caption, then the long description, inside the figure
    assert re.search(r"</figcaption><details class=\"preln-figure-description\">.*?</details>\n</figure>", out, re.S)
    written = {}
    out = site.apply_dark_figures(out, {sha: b"PNG"}, lambda name, png: written.setdefault(name, png))
    assert written == {f"{sha}-dark.png": b"PNG"}
    imgs = re.findall(r"<img [^>]*>", out)
    assert len(imgs) == 2
    assert 'class="only-light"' in imgs[0] and f"{sha}.png" in imgs[0] and 'loading="lazy"' in imgs[0]
    assert 'class="only-dark"' in imgs[1] and f"{sha}-dark.png" in imgs[1] and 'loading="lazy"' in imgs[1]
    for img in imgs:   # both named and described alike: only one is shown at a time
        assert 'alt="An alt."' in img and 'aria-describedby="d1"' in img
    # one link to the full-size image: the light PNG, naming the dark one for dark mode
    links = re.findall(r"<a [^>]*>", out)
    assert links == [f'<a class="reference internal image-reference" href="../_images/{sha}.png" '
                     f'data-preln-dark-href="../_images/{sha}-dark.png">']
    # a figure without a dark variant is left alone
    assert site.apply_dark_figures(page, {}, lambda *a: None) == page
    notebook = {"cells": [{"cell_type": "code", "outputs": [{"data": {
        "image/png": base64.b64encode(b"light").decode(),
        "text/html": '<img alt="a"><img class="preln-figure-dark" hidden="hidden" alt="" src="data:image/png;base64,'
                     + base64.b64encode(b"dark").decode() + '">'}}]}]}
    import hashlib

    assert site.figure_darks(notebook) == {hashlib.sha256(b"light").hexdigest(): b"dark"}


def test_explorable_frames_in_dark_mode_keep_hue_and_contrast():
    from preln.chapters import viz

    face = viz.shown_colour("white", "frame-dark")
    assert face == pytest.approx(viz._rgb("#121212"), abs=1 / 255)     # the page's background
    assert viz.contrast_ratio(viz.shown_colour("black", "frame-dark"), face) > 15   # text: light
    for colour in PALETTE:
        assert viz.data_contrast(colour, "frame-dark") >= viz.MIN_DATA_CONTRAST, colour
    r, g, b = viz.shown_colour(PALETTE[0], "frame-dark")
    assert b > r and b > g, "blue stays blue"
    css = (Path(__file__).resolve().parents[1] / "book" / "_static" / "preln.css").read_text()
    a = viz.FRAME_DARK_FILTER["invert"]
    assert f"filter: invert({a:g}) hue-rotate({viz.FRAME_DARK_FILTER['hue-rotate']}deg)" in css
    with pytest.raises(ValueError, match="mode"):
        viz.shown_colour("white", "sepia")


def test_an_explorable_frame_links_to_its_full_size_file_on_the_site_only():
    ex = explorable(line_plot, {"scale": [1.0, 2.0], "shift": [0.0]}, alt=alt_text)
    html = ex._repr_html_()
    frame = re.search(r'<a class="image-reference preln-explorable-full">(<img class="preln-explorable-frame"[^>]*>)</a>',
                      html)
    assert frame and "href" not in html[frame.start():frame.start() + 60]
    # the script links a file (the site), never a data: URI (the notebook)
    assert 'slice(0,5)!=="data:")a.href=img.getAttribute("src")' in html
    assert 'addEventListener("beforeprint",function(){img.parentNode.removeAttribute("href");})' in html


def test_the_precision_map_s_default_frame_moves_along_both_axes():
    """The overflow explorable's default (float16, naive) shows the wall as the diagonal
    sqrt(65520 / D): it moves with the width and with the input rms, and not with depth."""
    import inspect
    import math

    from preln.chapters import numerics
    from preln.chapters.figures import precision as prec

    plot, controls = prec.EXPLORABLES["overflow_map"]
    default = {k: p.default for k, p in inspect.signature(plot).parameters.items()}
    assert set(default) == set(controls) and all(default[k] in controls[k] for k in controls)
    grid = numerics.overflow_map(**default)                       # (widths, input rms)
    assert grid.shape == (len(numerics.GRID_D), len(numerics.GRID_SCALES))
    walls = [int(np.argmax(row == 1)) for row in grid]
    for d, wall, row in zip(numerics.GRID_D, walls, grid):
        assert (row[:wall] == 0).all() and row[wall] == 1
        # the largest token of the unit input, scaled, passes d * rms^2 = 65520 there
        z_ss = numerics.residual_stream(d, 1.0, 0, "float16", "naive", tokens=2)["max_token_ss"][0, 0]
        z_rms = math.sqrt(z_ss / d)
        assert (numerics.GRID_SCALES[wall] * z_rms >= math.sqrt(65520 / d)
                > numerics.GRID_SCALES[wall - 1] * z_rms)
    assert all(np.diff(walls) < 0)                                # wider: overflows sooner
    for depth in controls["depth"]:                               # every frame: the same wall
        assert [int(np.argmax(r == 1)) for r in numerics.overflow_map("float16", "naive", depth)] == walls
    assert not (numerics.overflow_map("float16", "safe", 1) == 1).any()
    assert (numerics.overflow_map("bfloat16", "naive", numerics.GRID_DEPTH) == 0).all()
    alt = prec.overflow_map_alt(**default)
    assert all(f"at D = {d}" in alt for d in numerics.GRID_D)
    plt.close(plot(**default))
    with pytest.raises(ValueError, match=r"depth: expected an int from 1 to GRID_DEPTH=24; got 0"):
        numerics.overflow_map("float16", "naive", 0)


def test_explorable_titles_typeset_ascii_math():
    """An explorable's title and control labels are HTML: their ASCII math is typeset there (the
    frames use mathtext), code names are left alone (issue 33)."""
    from preln.chapters.viz import typeset_html

    assert typeset_html("logits with and without 1/sqrt(d_h)") == \
        "logits with and without 1/\u221a<i>d</i>\u2095"
    assert typeset_html("x_L and W_in") == "<i>x</i><sub>L</sub> and <i>W</i>\u1d62\u2099"
    assert typeset_html("sqrt((D-1)/D) at eps = 1e-05") == \
        "\u221a((D\u22121)/D) at eps = 10<sup>\u22125</sup>"
    assert typeset_html("offset (query - key), -3") == "offset (query \u2212 key), \u22123"
    for plain in ("n_kv_heads", "Pre-LN vs Post-LN", "FlashAttention-2", "GPT-2", "32-layer"):
        assert typeset_html(plain) == plain
    assert typeset_html("<b>") == "&lt;b&gt;"


def test_heat_map_frames_keep_their_colour_scale_in_dark_mode():
    """Dark mode inverts an explorable's frames (FRAME_DARK_FILTER), which would read a heat map's
    colour scale backwards: a frame with a colour scale marks its figure, and the site's CSS shows
    such frames as drawn (issue 33)."""
    import numpy as np
    from matplotlib.figure import Figure

    def heat(k):
        fig = Figure(figsize=(3, 2))
        fig.subplots().imshow(np.arange(12.0).reshape(3, 4) * k)
        return fig

    line = line_plot(1.0, 0.0)
    assert viz.has_colour_scale(heat(1.0)) and not viz.has_colour_scale(line)
    plt.close(line)
    hot = explorable(heat, {"k": [1.0, 2.0]}, alt="A 3 by 4 heat map of a ramp.")
    assert 'data-preln-colormap="1"' in hot.to_html()
    cool = explorable(line_plot, {"scale": [1.0, 2.0], "shift": [0.0]}, alt=alt_text)
    assert "data-preln-colormap" not in cool.to_html()
    css = (Path(__file__).resolve().parents[1] / "book" / "_static" / "preln.css").read_text()
    rule = re.search(r"figure\[data-preln-colormap\] img\.preln-explorable-frame \{([^}]*)\}", css)
    assert rule and "filter: none" in rule.group(1)
