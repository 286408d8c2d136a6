"""The book's figure standard (issue 33, preln.chapters.viz and its ``violations``): every
figure this test can draw cheaply is checked as the site shows it at 1280 px: text at least
MIN_TEXT_PX, no legend over data, no "(dimensionless)", typeset labels (no ASCII ``x_L``, ``1e-05``
or hyphen minus), and the book's one colour per dtype, method and model. Every figure a chapter
displays is checked too, from the violations its output's metadata records.

Figures not yet redrawn to the standard are listed in NOT_YET, each with what fails; they are
strict xfails, so a figure that comes to pass must leave the list."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from preln.chapters import viz  # noqa: E402
from preln.chapters.figures import all_explorables  # noqa: E402
from preln.chapters.viz import TIGHT_PAD_IN, violations  # noqa: E402


@pytest.fixture(autouse=True)
def _style():
    viz.apply_style()
    yield
    plt.close("all")


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


def test_every_stored_figure_meets_the_standard():
    """Every figure a chapter displays recorded its violations of the standard in its output's
    metadata (viz.figure_bundle): none may have any, and none may lack the record."""
    import json
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    found, unchecked, n = {}, [], 0
    for path in sorted(book.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            for out in cell.get("outputs", []):
                if "image/png" not in out.get("data", {}):
                    continue
                n += 1
                record = out.get("metadata", {}).get("preln", {}).get("standard")
                if record is None:
                    unchecked.append(f"{path.stem} cell {i}")
                elif record:
                    found[f"{path.stem} cell {i}"] = record
    assert n > 40, n
    assert unchecked == [], "figures stored without the standard's record: re-execute (make notebooks)"
    assert found == {}


def test_typeset_text_reads_as_the_typeset_label():
    """Alt text, aria labels and live regions carry the ASCII math of a label typeset in characters
    (viz.typeset_text), as the page shows it; a subscript Unicode lacks stays as written."""
    from preln.chapters.viz import typeset_text

    assert typeset_text("Head width d_h = 64, W_in") == "Head width d\u2095 = 64, W\u1d62\u2099"
    assert typeset_text("eps = 1e-05, 2.5e-3") == "eps = 10\u207b\u2075, 2.5\u00d710\u207b\u00b3"
    assert typeset_text("sqrt((D-1)/D), -3") == "\u221a((D\u22121)/D), \u22123"
    for plain in ("rms(x_L)", "n_kv_heads", "Pre-LN vs Post-LN", "GPT-2"):
        assert typeset_text(plain) == plain


def test_every_stored_description_is_typeset():
    """No stored figure's or explorable's alt text, description, settings or button label keeps ASCII
    math that viz.typeset_text would typeset (d_h, 1e-05, sqrt(...), a hyphen for a minus)."""
    import html
    import json
    import re
    from pathlib import Path

    from preln.chapters.viz import typeset_text

    book = Path(__file__).resolve().parents[1] / "book"
    texts = re.compile(r'\balt="([^"]+)"|<p id="preln-[^"]*">([^<]*)</p>|aria-label="([^"]*)"'
                       r'|preln-explorable-settings">([^<]*)<')
    untypeset, n = [], 0
    for path in sorted(book.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            for out in cell.get("outputs", []):
                for m in texts.finditer("".join(out.get("data", {}).get("text/html", ""))):
                    text = html.unescape(next(g for g in m.groups() if g is not None))
                    n += 1
                    if typeset_text(text) != text:
                        untypeset.append(f"{path.stem} cell {i}: {text[:80]}")
    assert n > 100, n
    assert untypeset == [], "re-execute (make notebooks): " + "; ".join(untypeset[:5])
