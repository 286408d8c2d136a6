"""The book's figure standard (issue 33, preln.chapters.viz): every figure this test can draw
cheaply is checked as the site shows it at 1280 px: text at least MIN_TEXT_PX, no legend over
data, no "(dimensionless)", typeset labels (no ASCII ``x_L``, ``1e-05`` or hyphen minus), and the
book's one colour per dtype, method and model.

Figures not yet redrawn to the standard are listed in NOT_YET, each with what fails; they are
strict xfails, so a figure that comes to pass must leave the list."""
import math
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import Collection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from preln.chapters import viz  # noqa: E402
from preln.chapters.figures import all_explorables  # noqa: E402

#: tight bounding box padding matplotlib adds around a saved static figure (bbox_inches="tight")
TIGHT_PAD_IN = 0.1
#: a data point this far inside a legend's box (display px) counts as covered
LEGEND_INSET_PX = 1.0
#: lines are checked against legends at a point every this many display px
SEGMENT_STEP_PX = 2.0

# ASCII where the book typesets: a subscript (x_L), e-notation (1e-05), a hyphen as minus (-3),
# a function name in ASCII (sqrt(...)); math between $...$ is typeset and is not searched
_ASCII = {
    "subscript": re.compile(r"(?<![\w\\])[A-Za-z]_[A-Za-z0-9{]"),
    "e-notation": re.compile(r"\d(?:\.\d+)?e[+\-]?\d"),
    "hyphen minus": re.compile(r"(?<![\w)\]])-\d"),
    "ascii sqrt": re.compile(r"\bsqrt\("),
}


@pytest.fixture(autouse=True)
def _style():
    viz.apply_style()
    yield
    plt.close("all")


# ---- the checks ------------------------------------------------------------------------------

def _drawn(fig):
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _texts(fig):
    """Every text the reader sees: titles, labels, annotations, legends, tick labels in view."""
    out = [t for t in fig.texts]
    for lg in fig.legends:
        out += lg.get_texts()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        out += ax.texts
        if ax.get_legend():
            out += ax.get_legend().get_texts() + [ax.get_legend().get_title()]
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = sorted((lo, hi))
            for minor in (False, True):
                for tick in (axis.get_minor_ticks() if minor else axis.get_major_ticks()):
                    if lo - 1e-12 <= tick.get_loc() <= hi + 1e-12:
                        out += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def display_scale(fig, css_dpi, tight):
    """CSS px per point as displayed: a figure wider than the column is scaled down to it."""
    renderer = _drawn(fig)
    if tight:
        width_in = fig.get_tightbbox(renderer).width + 2 * TIGHT_PAD_IN
    else:
        width_in = fig.get_size_inches()[0]
    shrink = min(1.0, viz.COLUMN_PX / (width_in * css_dpi))
    return css_dpi / 72 * shrink


def small_texts(fig, css_dpi=viz.CSS_PX_PER_INCH, tight=True):
    scale = display_scale(fig, css_dpi, tight)
    return sorted({(t.get_text()[:30], round(t.get_fontsize() * scale, 1))
                   for t in _texts(fig) if t.get_fontsize() * scale < viz.MIN_TEXT_PX - 1e-9})


def _outside_math(text):
    return re.sub(r"\$[^$]*\$", "", text)


def ascii_labels(fig):
    found = []
    for t in _texts(fig):
        plain = _outside_math(t.get_text())
        found += [(kind, t.get_text()) for kind, rx in _ASCII.items() if rx.search(plain)]
        if "dimensionless" in plain:
            found.append(("dimensionless", t.get_text()))
    return found


def _data_points(ax):
    """Display coordinates of the data an axes draws, inside the axes: line vertices (and points
    between them), scatter offsets, bar corners and centres."""
    pts = []
    for ln in ax.get_lines():
        if not ln.get_visible() or not len(ln.get_xdata()):
            continue
        xy = ln.get_transform().transform(np.column_stack([ln.get_xdata(), ln.get_ydata()]).astype(float))
        xy = xy[np.all(np.isfinite(xy), axis=1)]
        if len(xy) > 1 and ln.get_linestyle() not in ("None", "none", ""):
            for a, b in zip(xy[:-1], xy[1:]):   # a point every SEGMENT_STEP_PX along each segment
                n = max(2, int(np.hypot(*(b - a)) / SEGMENT_STEP_PX) + 1)
                t = np.linspace(0, 1, n)[:, None]
                pts.append(a * (1 - t) + b * t)
        pts.append(xy)
    for c in ax.collections:
        if c.get_visible() and len(c.get_offsets()):
            xy = c.get_offset_transform().transform(np.asarray(c.get_offsets(), float))
            pts.append(xy[np.all(np.isfinite(xy), axis=1)])
    for p in ax.patches:
        if isinstance(p, Rectangle) and p.get_visible() and p.get_width() and p.get_height():
            b = p.get_window_extent()
            pts.append(np.array([[b.x0, b.y0], [b.x1, b.y1], [b.x0, b.y1], [b.x1, b.y0],
                                 [(b.x0 + b.x1) / 2, (b.y0 + b.y1) / 2]]))
    if not pts:
        return np.zeros((0, 2))
    xy = np.concatenate(pts)
    box = ax.bbox          # data outside the axes is clipped: not drawn, so not covered
    inside = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
    return xy[inside]


def legends_over_data(fig):
    _drawn(fig)
    legends = [lg for lg in fig.legends] + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    hits = []
    for lg in legends:
        box = lg.get_window_extent().padded(-LEGEND_INSET_PX)
        for ax in fig.axes:
            xy = _data_points(ax)
            inside = ((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0) & (xy[:, 1] < box.y1))
            if inside.any():
                hits.append((lg.get_texts()[0].get_text() if lg.get_texts() else "legend", int(inside.sum())))
    return hits


def _colour(artist):
    if isinstance(artist, Line2D):
        return artist.get_color()
    if isinstance(artist, Collection):
        fc = artist.get_facecolor()
        return fc[0] if len(fc) else artist.get_edgecolor()[0]
    return artist.get_facecolor()


def off_palette(fig):
    """Labelled series that name a dtype, method or model drawn in another colour than the book's."""
    wrong = []
    for ax in fig.axes:
        for artist in ax.get_lines() + ax.collections + ax.patches:
            label = artist.get_label()
            name = None if label.startswith("_") else viz.series_name(label)
            if name and to_hex(_colour(artist), keep_alpha=False) != to_hex(viz.SERIES_COLOURS[name]):
                wrong.append((label, to_hex(_colour(artist)), name))
    return wrong


def violations(fig, css_dpi=viz.CSS_PX_PER_INCH, tight=True):
    return {k: v for k, v in {"small text": small_texts(fig, css_dpi, tight),
                              "ascii or dimensionless": ascii_labels(fig),
                              "legend over data": legends_over_data(fig),
                              "off the book's colours": off_palette(fig)}.items() if v}


# ---- the checks can fail ----------------------------------------------------------------------

def _bad_figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3))                 # twice the column: its 10 pt ticks shown at ~7 px
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color=viz.PALETTE[3], label="GPTQ")   # GPTQ is vermillion
    ax.plot([0, 1], [1, 0], label="other")
    ax.legend(loc="center")                       # over both lines
    ax.set_xlabel("x_L (dimensionless)")
    ax.set_ylabel("error at eps = 1e-05")
    return fig


def test_the_checks_catch_a_bad_figure():
    found = violations(_bad_figure())
    assert set(found) == {"small text", "ascii or dimensionless", "legend over data", "off the book's colours"}
    kinds = {k for k, _ in found["ascii or dimensionless"]}
    assert kinds == {"subscript", "e-notation", "dimensionless"}
    assert found["off the book's colours"] == [("GPTQ", to_hex(viz.PALETTE[3]), "GPTQ")]


def test_a_figure_to_the_standard_passes():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(viz.COLUMN_IN - 2 * TIGHT_PAD_IN, 3))
    ax = fig.subplots()
    for name in ("RTN", "GPTQ", "AWQ"):
        ax.plot([1, 10, 100], np.array([3.0, 2.0, 1.5]) * (1 + len(name) / 10),
                color=viz.series_colour(name), label=name)
    ax.set_yscale("log")
    ax.set_xscale("log")
    viz.log_ticks(ax, "y")
    viz.direct_labels(ax)
    ax.set_xlabel(r"group size $g$ (weights per scale)")
    ax.set_ylabel(r"error at $\varepsilon = 10^{-5}$")
    assert violations(fig) == {}
    # a short log axis gets 1-2-5 ticks, labelled as numbers with the Unicode minus
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "2" in labels and "5" in labels, labels
    assert viz._log_number(0.05) == "0.05" and viz._log_number(1e-5) == "$10^{-5}$"


def test_series_names_and_colours():
    assert viz.series_name("round to nearest, g128") == "RTN"
    assert viz.series_name("4-bit RTN g32, all") == "RTN"             # the method, not the dtype
    assert viz.series_name("GPT-style (Pre-LN)") == "GPT-style"
    assert viz.series_name("float32 reference") == "float32"
    assert viz.series_name("floating point") is None
    assert viz.series_colour("AWQ") == viz.METHOD_COLOURS["AWQ"]
    with pytest.raises(ValueError, match="name must be one of"):
        viz.series_colour("Q7_K")
    # one colour per name within each family: two methods never share one
    for family in (viz.DTYPE_COLOURS, viz.METHOD_COLOURS):
        assert len(set(family.values())) == len(family), family


def test_direct_labels_refuse_more_than_four_series():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    for k in range(5):
        ax.plot([0, 1], [k, k], label=f"s{k}")
    with pytest.raises(ValueError, match="at most 4"):
        viz.direct_labels(ax)


# ---- the book's figures -------------------------------------------------------------------------

#: figures not yet redrawn: name -> what still fails (strict xfail: remove a name once it passes)
NOT_YET = {}


def _explorable_first_frames():
    for name, (plot, controls) in sorted(all_explorables().items()):
        yield name, lambda plot=plot, controls=controls: plot(**{k: list(v)[0] for k, v in controls.items()})


def _static_figures():
    from test_figures_a11y import _static_figures as a11y_static

    yield from ((f"static.{i}", (lambda f=f: f)) for i, f in enumerate(a11y_static()))
    yield from _fixed_static_figures()


def _fixed_static_figures():
    """The figures redrawn for issue 33, on small made-up data."""
    from preln.chapters.figures import real_model

    points = [("float32", 538e6, 20.2), ("RTN 4-bit g32, all", 88e6, 27.8),
              ("GPTQ 4-bit g32, all", 88e6, 25.1), ("AWQ 4-bit g32, all", 88e6, 26.0),
              ("RTN 3-bit g32, all", 70e6, 69.8)]
    yield "real_model.bytes_vs_perplexity", lambda: real_model.plot_bytes_vs_perplexity(points, 20.2)
    from preln.chapters.figures import derivation_block as db

    sizes = (2, 4, 8, 16)
    from preln.chapters.figures import precision as prec

    t = np.arange(0, 16, 2.0 ** -5)
    safe = 1 / (1 + np.exp(-t))
    yield "precision.softmax_overflow", lambda: prec.plot_softmax_overflow(
        t, np.where(t < 11.09, safe, np.nan), safe, 11.09)
    depth = np.arange(129)
    yield "precision.stream_growth", lambda: prec.plot_stream_growth(
        {64: 1 + 0.15 * depth, 128: 1 + 0.13 * depth}, (4096, 8192, 12288),
        xavier={64: 1 + 1.4 * depth[:33]})
    from preln.chapters.figures import modern_block as mb

    pos = np.arange(160)
    yield "modern_block.loss_by_position", lambda: mb.plot_loss_by_position(
        {"GPT-style, 64 positions": 2.0 / (1 + pos / 20) + 0.6,
         "Llama-style, 256 positions": 2.0 / (1 + pos / 20) + 0.5})
    yield "modern_block.loss_by_position.scalings", lambda: mb.plot_loss_by_position(
        {"none": 1 + pos / 40, "linear": 1 + pos / 80, "yarn": 1 + pos / 400})
    from preln.chapters.figures import many_devices as md

    yield "many_devices.tp_times", lambda: md.plot_tp_times("Llama 2 7B", 4096)
    yield "many_devices.schedule", lambda: md.plot_schedule(4, 8)
    from preln.chapters import numerics

    yield "precision.number_line", lambda: prec.plot_number_line(numerics.format_rows())
    from preln.chapters.figures import derivation as dv
    from preln.chapters.figures import preln_vs_postln as pvp
    from test_figures_alt_numerics import _dynamic_run
    from test_figures_int8_alt import _figures as int8_figures

    for name, fig, *_ in int8_figures():
        yield f"int8.{name}", lambda fig=fig: fig
    yield "precision.dynamic_scaling", lambda: prec.plot_dynamic_scaling(
        _dynamic_run(), np.geomspace(2.0 ** -10, 2.0 ** -14, 20))
    yield "derivation.gelu", dv.plot_gelu
    yield "derivation.layernorm_graph", dv.plot_layernorm_graph
    yield "derivation.eps_placement", lambda: dv.plot_eps_placement(8)
    steps = np.logspace(-8, -2, 7)
    yield "derivation.step_sweep", lambda: dv.plot_step_sweep(steps, np.abs(np.log10(steps) + 5) + 1e-3)
    yield "preln_vs_postln.final_loss", pvp.plot_final_loss
    L = np.array([4, 8, 16])
    yield "preln_vs_postln.theorem1", lambda: pvp.plot_theorem1(
        L, 2 / np.sqrt(L), np.full(3, 3.0), {"pre": (-0.5, 2.0), "post": (0.0, 3.0)}, 0.1 + 0 * L, 0.2 * L)
    one = dict(lr=np.full(2, 1e-2), ratio=np.array([[0.07, 0.07], [0.05, 0.05]]),
               sign_like=np.array([[1.0, 1.0], [0.1, 0.1]]))
    yield "preln_vs_postln.early_updates", lambda: pvp.plot_early_updates(
        {(True, 0): one, (False, 10): {**one, "ratio": one["ratio"] / 10}})
    yield "derivation_block.stack_diagram", lambda: db.plot_stack_diagram(n_layers=2)
    from preln.chapters.figures import build_and_train as bt

    steps = np.arange(1, 201)
    yield "build_and_train.loss_curves", lambda: bt.plot_loss_curves(
        3.3 * np.exp(-steps / 60) + 0.8, np.arange(0, 201, 25), 3.3 * np.exp(-np.arange(0, 201, 25) / 60) + 0.8,
        26, 20)
    yield "derivation_block.batchnorm", lambda: db.plot_batchnorm(
        db.bn_running_trace(n_steps=20, batch=8, seed=0), db.bn_train_eval_gap(sizes, n_batches=20, seed=0),
        sizes, db.bn_padding_effect(pad_counts=(0, 4, 8)))


EXPLORABLE_CASES = list(_explorable_first_frames())


def _case(name, make, css_dpi, tight):
    marks = [pytest.mark.xfail(strict=True, reason=NOT_YET[name])] if name in NOT_YET else []
    return pytest.param(make, css_dpi, tight, id=name, marks=marks)


@pytest.mark.parametrize("make, css_dpi, tight",
                         [_case(n, m, viz.FRAME_CSS_DPI, False) for n, m in EXPLORABLE_CASES])
def test_explorable_frames_meet_the_standard(make, css_dpi, tight):
    fig = make()
    assert violations(fig, css_dpi, tight) == {}


def test_static_figures_meet_the_standard():
    found = {}
    for name, make in _static_figures():
        bad = violations(make())
        if bad and name not in NOT_YET:
            found[name] = bad
    assert found == {}


def test_the_dpi_and_column_agree():
    from preln import nb

    assert nb.FIGURE_DPI / nb.FIGURE_SCALE == viz.CSS_PX_PER_INCH
    assert math.isclose(viz.COLUMN_IN * viz.CSS_PX_PER_INCH, viz.COLUMN_PX)


def test_every_static_figure_has_a_numbered_caption():
    """A figure output (image/png) of a chapter is a MyST figure (mystnb.figure: caption and name),
    which the site numbers and the PDF tags."""
    import json
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    missing = []
    for path in sorted(book.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            figure = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
            shows = any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
            if shows and not (figure.get("caption", "").strip() and figure.get("name")):
                missing.append(f"{path.name} cell {i}")
    assert missing == []


def test_the_number_line_draws_each_format_in_its_colour():
    """One colour per dtype across the book: the number line's bars take viz.DTYPE_COLOURS, not
    the palette in the order of the rows (float8 formats are fp8's colour)."""
    from preln.chapters import numerics
    from preln.chapters.figures import precision as prec

    rows = numerics.format_rows()
    ax = prec.plot_number_line(rows).axes[0]
    solid = [p for p in ax.patches if p.get_alpha() is None]       # the normal range of each row
    assert [to_hex(p.get_facecolor(), keep_alpha=False) for p in solid] == \
        [to_hex(viz.series_colour("fp8" if r["name"].startswith("float8") else r["name"])) for r in rows]
    assert to_hex(prec.dtype_colour("float16")) == to_hex(viz.DTYPE_COLOURS["float16"])
