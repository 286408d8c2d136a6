"""Figures and tables for readers with low vision or colour-blindness, and alt text that travels
with the notebook (issue 24): data colours at 3:1, legends of 10 pt, series apart under simulated
deuteranopia and protanopia, 2x PNGs with an HTML <img alt> beside them, named tables."""
import ast
import base64
import html as htmlmod
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from figure_checks import (LEGEND_MIN_PT, MACHADO_2009, MIN_DELTA_E, assert_accessible,  # noqa: E402
                           delta_e, series_conflicts, simulated_lab)
from preln import nb  # noqa: E402
from preln.chapters import viz  # noqa: E402
from preln.chapters.figures import all_explorables  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIGURE_MODULES = sorted((ROOT / "preln" / "chapters" / "figures").glob("*.py"))
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
LAB_TOLERANCE = 0.5        # CIELAB units: what a simulation may move white or grey (rounding of the matrices)


@pytest.fixture(autouse=True)
def _style():
    viz.apply_style()
    yield
    plt.close("all")


# ---- colours ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["light", "dark"])
def test_every_data_colour_is_3_to_1_on_the_figure_face(mode):
    ratios = {c: viz.data_contrast(c, mode) for c in viz.PALETTE}
    assert min(ratios.values()) >= viz.MIN_DATA_CONTRAST, ratios
    # the check can fail: the published orange, sky blue and yellow are below 3:1
    published = {c: viz.data_contrast(c, mode) for c in viz.OKABE_ITO}
    assert sorted(c for c, r in published.items() if r < viz.MIN_DATA_CONTRAST) == ["#56B4E9", "#E69F00", "#F0E442"]


def test_dark_mode_is_the_themes_filter_on_the_white_face():
    # brightness(.8) contrast(1.2): white -> 0.86, black stays black, mid-grey 0.5 -> 0.38
    assert viz.shown_colour("white", "dark") == pytest.approx((0.86,) * 3)
    assert viz.shown_colour("black", "dark") == (0.0, 0.0, 0.0)
    assert viz.shown_colour((0.5, 0.5, 0.5), "dark") == pytest.approx((0.38,) * 3)
    assert viz.contrast_ratio("white", "black") == pytest.approx(21.0)
    with pytest.raises(ValueError, match="mode"):
        viz.shown_colour("white", "sepia")


def test_the_colour_blindness_simulation_keeps_greys_and_merges_red_with_green():
    for vision, m in MACHADO_2009.items():
        assert m.sum(axis=1) == pytest.approx(np.ones(3), abs=1e-3), f"{vision}: greys must stay grey"
        for grey in ("white", "0.5", "black"):
            assert np.abs(simulated_lab(grey, vision) - simulated_lab(grey)).max() < LAB_TOLERANCE
    # the darkened orange and vermillion: far apart in normal vision, one colour under deuteranopia
    orange, vermillion = viz.PALETTE[3], viz.PALETTE[1]
    assert delta_e(orange, vermillion) > MIN_DELTA_E
    assert delta_e(orange, vermillion, "deuteranopia") < delta_e(orange, vermillion) / 10


def _two_lines(style_b="-", label_on_plot=False):
    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], "-", color=viz.PALETTE[1], label="vermillion series")
    ax.plot([0, 1], [1, 0], style_b, color=viz.PALETTE[3], label="orange series")
    if label_on_plot:
        ax.text(0.9, 0.1, "orange series")
    ax.legend()
    return ax


def test_series_told_apart_by_colour_alone_are_caught():
    bad = series_conflicts(_two_lines())
    assert bad and bad[0][:3] == ("vermillion series", "orange series", "deuteranopia")
    assert series_conflicts(_two_lines("--")) == [], "a line style tells them apart"
    assert series_conflicts(_two_lines("o-")) == [], "so does a marker"
    assert series_conflicts(_two_lines(label_on_plot=True)) == [], "so does a label on the plot"
    with pytest.raises(AssertionError, match="colour alone"):
        assert_accessible(_two_lines().figure)


def test_a_small_legend_and_a_pale_series_are_caught():
    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color=viz.PALETTE[0], label="a")
    ax.legend(fontsize=8)
    with pytest.raises(AssertionError, match="legend text of 8"):
        assert_accessible(fig)
    ax.legend()
    assert_accessible(fig)
    ax.fill_between([0, 1], [0, 1], color=viz.PALETTE[2], alpha=0.3, label="pale area")
    ax.legend()
    with pytest.raises(AssertionError, match="below 3.0:1"):
        assert_accessible(fig)


@pytest.mark.parametrize("name", sorted(all_explorables()))
def test_every_explorable_frame_is_readable(name):
    """The first and the last frame of each explorable: legends, contrast, colour-blind separation."""
    plot, controls = all_explorables()[name]
    values = [list(v) for v in controls.values()]
    for pick in (0, -1):
        fig = plot(**{k: v[pick] for k, v in zip(controls, values)})
        assert_accessible(fig)
        plt.close(fig)


def _static_figures():
    """The static figures of the inference and shape-flow chapters, on small made-up data (the
    notebooks draw them from measurements; the other chapters' tests call assert_labelled, which
    runs the same checks)."""
    from preln.chapters import inference as inf
    from preln.chapters.figures import inference as figs
    from preln.chapters.figures import shape_flow as sf
    from preln.chapters.shapes import fit_exponent
    from preln.nn.config import BlockConfig

    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=64)
    roof = inf.Roofline("toy", 50e9, 10e9)
    un, fu = inf.op_traffic(cfg, 2, 32, "unfused"), inf.op_traffic(cfg, 2, 32, "fused")
    times = {o.name: 1e-3 for o in un}
    x = np.array([64, 128, 256, 512])
    fit = fit_exponent(x, 3.0 * x ** 2.0)
    yield figs.plot_roofline(roof, un, fu, times)
    yield figs.plot_published(inf.PUBLISHED, un, roof)
    yield figs.plot_predicted_vs_measured(un, times, roof)
    yield figs.plot_fusion_bytes([("softmax", 800, 200), ("LayerNorm", 1200, 200)])
    yield figs.plot_attention_io([("S", x, 3.0 * x ** 2, x ** 2, fit, fit, "panel")] * 3)
    yield figs.plot_decode_times(x, 1e-3 * x, 1e-5 * x ** 2, fit, fit)
    yield figs.plot_decode_batch(x, 10.0 * x, 12.0 * x, 200)
    yield figs.plot_decode_ops([inf.PUBLISHED_MODELS["OPT-13B"]], {"H100": (inf.PUBLISHED["H100 SXM"], 2)}, 1024,
                               batches=[1, 8, 64])
    yield sf.plot_flops_vs_size(x, x ** 2.0, fit, x, x ** 2.0, fit, 128, 64)
    yield sf.plot_timings(x, 1e-6 * x ** 2, fit, x, 1e-6 * x ** 2, fit, 128, 64,
                          fit_mask_S=[False, True, True, True])
    yield sf.plot_peak_memory(x, 1e3 * x ** 2, x, 1e3 * x, x, 4.0 * x ** 2, S_cross=256)


def test_the_static_figures_are_readable():
    for fig in _static_figures():
        assert_accessible(fig)


def test_no_figure_code_asks_for_a_small_legend():
    """Legends take rcParams' legend.fontsize (10 pt); a `fontsize=` below it in a legend() call of
    the figure modules would undo that (the static figures are drawn only by the notebooks)."""
    assert matplotlib.rcParams["legend.fontsize"] >= LEGEND_MIN_PT
    found = []
    for path in FIGURE_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "legend":
                for kw in node.keywords:
                    if kw.arg in ("fontsize", "title_fontsize") and isinstance(kw.value, ast.Constant) \
                            and kw.value.value < LEGEND_MIN_PT:
                        found.append(f"{path.name}:{node.lineno}")
    assert not found, f"legends below {LEGEND_MIN_PT} pt: {found}"


def test_the_stacked_bar_names_every_visible_segment_in_words():
    from preln.chapters import inference as inf
    from preln.chapters.figures import inference as figs

    n, d, c = 4096, 64, 98_304            # the chapter's setting
    terms = {"standard": inf.attention_access_terms(n, d, kind="standard"),
             "FA1": inf.attention_access_terms(n, d, c, "fa1"),
             "FA2": inf.attention_access_terms(n, d, c, "fa2")}
    fig = figs.plot_attention_terms(terms)
    assert_accessible(fig)
    words = " ".join(t.get_text() for t in fig.axes[0].texts)
    longest = max(sum(t.values()) for t in terms.values())
    for t in terms.values():
        for (array, kind), count in t.items():
            if count >= figs.DIRECT_NOTE_MIN * longest:
                assert f"{array} {kind[0]}" in words, (array, kind, words)
    alt, description = nb.describe(fig)
    assert len(alt) <= nb.ALT_MAX and "68.2 M" in alt and "writes of Z" in description


# ---- alt text that travels with the notebook ---------------------------------------------------

@pytest.fixture(autouse=True)
def _no_shell_left():
    """An IPython shell made here is a process-wide singleton: drop it after each test, or later
    tests in this worker (viz's "live() needs a kernel") would find a kernel that is not there."""
    yield
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        InteractiveShell.clear_instance()


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    assert nb.register_figure_display(ip)
    return ip


def _img(tag):
    m = re.search(r"<img [^>]*>", tag)
    assert m, tag
    return m.group(0)


def test_a_figure_displays_as_a_2x_png_and_an_img_with_its_alt():
    ip = _shell()
    fig = Figure(figsize=(5.0, 3.0))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="identity")
    ax.set(xlabel="input", ylabel="output", title="Identity map")
    ax.legend()
    nb.set_alt(fig, "A straight line from (0, 0) to (1, 1).")
    data, metadata = ip.display_formatter.format(fig)
    assert set(data) >= {"image/png", "text/html", "text/plain"}
    png = base64.b64decode(data["image/png"])
    w, h = nb.png_size(png)
    img = _img(data["text/html"])
    assert 'alt="A straight line from (0, 0) to (1, 1)."' in img
    assert f'width="{round(w / 2)}" height="{round(h / 2)}"' in img, "shown at half its pixels: 2x"
    assert metadata["image/png"] == {"width": round(w / 2)}, "no height: the site would fix the aspect"
    assert w > 2 * 5.0 * 100 * 0.9, "drawn at 200 dpi (bbox_inches='tight' trims a little)"
    assert data["image/png"] in img, "the <img> shows the same bytes"
    assert png[25] == 3, "a palette PNG (colour type 3)"
    again, _ = ip.display_formatter.format(fig)
    assert again["image/png"] == data["image/png"], "deterministic: nbval compares the HTML"


def test_the_inline_backends_png_does_not_replace_the_2x_one():
    """matplotlib-inline registers an image/png formatter for Figure, which IPython would prefer to
    the mimebundle's PNG: the stored image/png would then not be the bytes the <img> shows."""
    from IPython.core.pylabtools import select_figure_formats

    ip = _shell()
    select_figure_formats(ip, {"png"})                     # what the inline backend does when it loads
    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1])
    assert "data:image/png;base64," + ip.display_formatter.format(fig)[0]["image/png"] not in \
        ip.display_formatter.format(fig)[0]["text/html"], "the inline backend's PNG wins (the bug)"
    nb.register_figure_display(ip)
    data, _ = ip.display_formatter.format(fig)
    assert "data:image/png;base64," + data["image/png"] in data["text/html"]
    from matplotlib_inline.config import InlineBackend
    assert InlineBackend.instance().figure_formats == set(), "and it registers none when it loads later"


def test_a_long_description_goes_into_details_named_by_the_image():
    long = ("The curve rises. " + "It is steep at first and then levels off towards one. " * 4).strip()
    data, _ = nb.image_bundle(_tiny_png(), long, scale=2)
    img = _img(data["text/html"])
    assert 'alt="The curve rises."' in img
    did = re.search(r'aria-describedby="([^"]+)"', img).group(1)
    desc = re.search(rf'<details class="preln-figure-description"><summary>[^<]+</summary><p id="{did}">([^<]*)</p>',
                     data["text/html"])
    assert desc and htmlmod.unescape(desc.group(1)) == long
    with pytest.raises(ValueError, match="at most 150"):
        nb.set_alt(Figure(), long)
    with pytest.raises(ValueError, match="alt"):
        nb.image_bundle(_tiny_png(), "  ")
    with pytest.raises(ValueError, match="scale"):
        nb.image_bundle(_tiny_png(), "a dot", scale=0)


def test_a_figure_without_words_is_described_from_its_labels():
    fig = Figure()
    a, b = fig.subplots(1, 2)
    a.plot([1, 2], label="measured")
    a.legend()
    a.set(xlabel="step", ylabel="loss", title="Training")
    b.set(xlabel="step", ylabel="lr")
    alt, description = nb.describe(fig)
    assert alt == "Figure of 2 panels: Training; loss against step; series: measured."
    assert description == "Panel 1: Training; loss against step; series: measured. Panel 2: lr against step."
    bars = Figure()
    ax = bars.add_subplot()
    ax.barh(range(4), [1, 2, 3, 4])
    ax.set_yticks(range(4), ["norm1", "qkv", "softmax", "gelu"])
    ax.set_xlabel("MiB")
    assert nb.describe(bars)[0] == "Figure: 4 categories (norm1, qkv, softmax, …) against MiB.", \
        "a bar chart's categories stand in for its missing axis label"


def _tiny_png():
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1])
    return viz.figure_png(fig, dpi=20)


def test_explorable_alts_are_short_with_the_rest_described():
    plot, controls = all_explorables()["shape_flow.ops"]
    from preln.chapters.figures import shape_flow

    small = {k: list(v)[:1] for k, v in controls.items()}
    ex = viz.explorable(plot, small, alt=shape_flow.ops_alt, title="ops")
    html = ex.to_html()
    assert len(ex.alts[ex.initial]) > nb.ALT_MAX, "this alt needs a longer description"
    img = _img(html)
    alt = htmlmod.unescape(re.search(r'alt="([^"]*)"', img).group(1))
    assert 0 < len(alt) <= nb.ALT_MAX and "aria-describedby" in img
    w, h = nb.png_size(ex.frames[ex.initial])
    assert f'width="{round(w / 2)}" height="{round(h / 2)}"' in img, "frames are 2x too"


def test_the_site_shows_the_png_not_the_html_copy():
    """_config.yml ranks image/png above text/html for the HTML builders (myst-nb: lower wins)."""
    from myst_nb.core.render import get_mime_priority

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    overrides = [tuple(o) for o in config["sphinx"]["config"]["nb_mime_priority_overrides"]]
    for builder in ("html", "dirhtml", "singlehtml"):
        order = get_mime_priority(builder, overrides)
        assert order.index("image/png") < order.index("text/html"), builder
    assert get_mime_priority("html", ()).index("text/html") < get_mime_priority("html", ()).index("image/png"), \
        "without the override the HTML copy (0.3 MB of base64 per figure) would be inlined"


def _figure_outputs(path):
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for output in cell.get("outputs", []):
            if "image/png" in output.get("data", {}):
                yield i, output["data"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_stored_figure_output_has_an_html_img_with_alt(path):
    """What JupyterLab shows of a downloaded chapter (it prefers text/html): every stored figure
    output carries an <img> of its own PNG with a non-empty alt of at most ALT_MAX characters.
    Fails for a chapter until it is re-executed with this package (`make notebooks`)."""
    missing = []
    for i, data in _figure_outputs(path):
        page = "".join(data.get("text/html", ""))
        m = re.search(r'<img [^>]*alt="([^"]*)"[^>]*>', page)
        png = "".join(data["image/png"]).replace("\n", "")
        if not m or not m.group(1).strip() or png not in page or len(htmlmod.unescape(m.group(1))) > nb.ALT_MAX:
            missing.append(i)
    assert not missing, f"{path.name}: figure outputs of cells {missing} have no HTML <img> with a short alt"


# ---- tables ------------------------------------------------------------------------------------

def _check_table(page, rows):
    assert re.search(r"<caption>[^<]+</caption>", page), "every table is named by a caption"
    assert page.count("scope='row'") + page.count('scope="row"') == rows, "each row is named by a row header"
    assert "<th>" not in page and "<th style" not in page, "header cells say what they head (scope)"


def test_the_html_tables_have_captions_and_row_headers():
    from preln.chapters import inference as inf
    from preln.chapters import shapes
    from preln.chapters.figures import derivation, inference, precision, shape_flow
    from preln.nn.config import BlockConfig

    _check_table(derivation.Table(["name", "err"], [("dx", 1e-9), ("dw", 2e-9)])._repr_html_(), 2)
    assert "<caption>name: err</caption>" in derivation.Table(["name", "err"], [("dx", 1.0)])._repr_html_()
    _check_table(precision.Table(["format", "max"], [("float16", 65504)], caption="Formats")._repr_html_(), 1)
    with pytest.raises(ValueError, match="caption"):
        precision.Table(["a", "b"], [(1, 2)], caption=" ")._repr_html_()
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=64)
    flow = shapes.shape_flow(cfg, 2, 8)
    _check_table(shape_flow.shape_table_html(flow), len(flow.rows) + 1)
    _check_table(shape_flow.backward_table_html(flow), len(flow.rows) + 2)
    kept = shapes.kept_bytes_per_token(cfg)
    _check_table(shape_flow.kept_per_token_html(kept), len(kept) + 1)
    un, fu = inf.op_traffic(cfg, 2, 8), inf.op_traffic(cfg, 2, 8, schedule="fused")
    n_rows = len(un) + len({o.name for o in fu} - {o.name for o in un}) + 1
    _check_table(inference.traffic_table_html(un, fu, "traffic"), n_rows)
    roof = inf.Roofline("machine", peak_flops=1e12, bandwidth=1e11)
    page = inference.bound_table_html({4: un}, {"machine": (roof, 4)}, "bound")
    _check_table(page, sum(o.flops > 0 for o in un))
