"""Figures for the book: one style, deterministic PNGs, and kernel-free explorables.

Every chapter plots with this module so that the figures look alike, read well for colour-blind
readers (the Okabe-Ito palette, Okabe & Ito 2008, darkened to 3:1 on white), and store
byte-identical outputs when a notebook is re-executed (nbval compares them).

    from preln.chapters.viz import PALETTE, apply_style, control, explorable, figure_png

    apply_style()
    ex = explorable(plot, {"eps": control("LayerNorm epsilon eps", [1e-5, 1e-3, 1e-1])},
                    alt=lambda eps: f"... eps = {eps:g} ...", title="What eps does")
    ex            # in a notebook: every frame precomputed; a slider swaps them with no kernel
    ex.live()     # with a running kernel: an ipywidgets `interactive` that recomputes
    ex.timings    # seconds spent in `plot` for each frame (for the benchmark table)

The kernel-free version is plain HTML, built to be read by everyone (WCAG 2.1 AA): a ``<figure>``
captioned by the title, holding one labelled control per value list — a keyboard- and
pointer-operable ARIA slider for numbers (its announced value is the real value, not an index), a
``<select>`` otherwise — each pointing (``aria-controls``) at the ``<img>`` of the current frame,
and a polite live region that announces a short summary of each new frame. The image's alt is at
most ``preln.nb.ALT_MAX`` characters; a longer description goes into a ``<details>`` the image names
with ``aria-describedby``. The frames are drawn at twice their CSS size, as 256-colour palette
PNGs (a third of the bytes of matplotlib's RGBA), inlined as data URIs in a JSON ``<script>``, so
the notebook works anywhere; the book's build (book/_ext/preln_site.py) moves them into files next
to the page, which the page fetches only when a reader moves a control. A ``<style>``
block and a few dozen lines of inline JavaScript, with no dependencies, make it work in JupyterLab
and on the site alike.

The figure standard (issue 33; tests/test_figure_standard.py checks it on every figure it can
draw cheaply): figures are drawn at the content column's width (COLUMN_IN) so their text stays at
least MIN_TEXT_PX as shown; a dtype, quantisation method or model has one colour in every chapter
(``series_colour("GPTQ")``, SERIES_COLOURS); up to four series are named where they end
(``direct_labels``), more in a legend beside the data (``legend_outside``, ``figure_legend``);
log axes get enough labelled ticks (``log_ticks``); numbers in labels are typeset
(``tex_number``). Every static figure is also drawn for dark mode (``dark_png``), which the site
shows in place of the light one; explorable frames are shown through FRAME_DARK_FILTER, except
those with a colour scale (``has_colour_scale``: a heat map would read backwards inverted), which
are shown as drawn.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import itertools
import json
import numbers
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from preln.nb import (ALT_MAX, FIGURE_DPI, image_bundle, palette_png, png_size, register_figure_display,
                      short_alt)

__all__ = ["PALETTE", "OKABE_ITO", "COLUMN_PX", "MIN_TEXT_PX", "SERIES_COLOURS", "DTYPE_COLOURS",
           "METHOD_COLOURS", "MODEL_COLOURS", "series_colour", "series_name", "direct_labels",
           "legend_outside", "figure_legend", "log_ticks", "tex_number", "dark_png", "dark_colour",
           "figure_bundle", "DARK_BACKGROUND", "FRAME_DARK_FILTER", "apply_style", "control",
           "explorable", "figure_png", "Control", "Explorable", "MAX_FRAMES", "FRAME_COLORS",
           "contrast_ratio", "data_contrast", "shown_colour", "relative_luminance",
           "MIN_DATA_CONTRAST", "violations", "small_texts", "ascii_labels", "legends_over_data",
           "off_palette", "display_scale", "TIGHT_PAD_IN", "table_caption", "typeset_html", "has_colour_scale", "control_kind", "MAX_TOGGLE_VALUES", "PLAY_SECONDS"]

# Okabe-Ito (Okabe & Ito 2008), ordered for a prop_cycle, with its light hues darkened so that every
# data colour is at least 3:1 (WCAG 1.4.11, non-text contrast) against the figures' white face:
# orange, sky blue and yellow are 2.25, 2.31 and 1.32:1 on white as published. The hues are kept,
# so the palette stays apart under colour-blindness (tests/test_figures_a11y.py simulates
# deuteranopia and protanopia). In dark mode the site shows figures on their white face too, dimmed
# by the theme's filter (DARK_IMAGE_FILTER); the ratios hold there as well (shown_colour).
PALETTE: list[str] = [
    "#0072B2",  # blue                              5.19:1 on white
    "#D55E00",  # vermillion                        3.87:1
    "#009E73",  # bluish green                      3.42:1
    "#B77C00",  # orange, darkened from #E69F00     3.56:1
    "#3A8FC7",  # sky blue, darkened from #56B4E9   3.54:1
    "#C06C9C",  # reddish purple, from #CC79A7      3.58:1
    "#000000",  # black                             21:1
    "#948600",  # olive, darkened from yellow #F0E442 3.70:1
]
#: the published Okabe-Ito colours each PALETTE entry is (or is darkened from), in PALETTE's order
OKABE_ITO: list[str] = ["#0072B2", "#D55E00", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#000000",
                        "#F0E442"]
#: WCAG 1.4.11: a colour that carries data stands out from its background by at least this ratio
MIN_DATA_CONTRAST = 3.0
#: pydata-sphinx-theme's dark mode dims every image: ``filter: brightness(.8) contrast(1.2)``
#: (html[data-theme=dark] img), on the image's own white face (the figures are opaque)
DARK_IMAGE_FILTER = {"brightness": 0.8, "contrast": 1.2}


def _rgb(colour) -> tuple[float, float, float]:
    """Any matplotlib colour as sRGB in 0..1 (alpha dropped)."""
    from matplotlib.colors import to_rgb

    return tuple(float(c) for c in to_rgb(colour))


def relative_luminance(colour) -> float:
    """WCAG 2.1 relative luminance of an sRGB colour (0 black .. 1 white)."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in _rgb(colour)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a, b) -> float:
    """WCAG 2.1 contrast ratio of two colours (1 .. 21)."""
    hi, lo = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


#: the site's dark mode shows an explorable's frames through this CSS filter (book/_static/
#: preln.css): ``invert(0.93) hue-rotate(180deg)``, white to the page's #121212, hues kept
FRAME_DARK_FILTER = {"invert": 0.93, "hue-rotate": 180}
# CSS hue-rotate(180deg) as the Filter Effects spec's matrix on sRGB values (cos -1, sin 0)
_HUE_ROTATE_180 = ((-0.574, 1.430, 0.144), (0.426, 0.430, 0.144), (0.426, 1.430, -0.856))


def shown_colour(colour, mode: str = "light") -> tuple[float, float, float]:
    """How a figure's colour reaches the reader's eye on the site: as drawn in light mode, through
    the theme's DARK_IMAGE_FILTER in dark mode (CSS brightness then contrast, on sRGB values; an
    image without a dark variant), through FRAME_DARK_FILTER for an explorable's frame in dark
    mode ("frame-dark"). Static figures have a dark variant of their own (dark_png)."""
    if mode not in ("light", "dark", "frame-dark"):
        raise ValueError(f"shown_colour: mode must be 'light', 'dark' or 'frame-dark', got {mode!r}")
    rgb = _rgb(colour)
    if mode == "light":
        return rgb
    if mode == "frame-dark":
        a = FRAME_DARK_FILTER["invert"]
        inv = [a * (1 - c) + (1 - a) * c for c in rgb]
        return tuple(min(1.0, max(0.0, sum(m * c for m, c in zip(row, inv)))) for row in _HUE_ROTATE_180)
    b, k = DARK_IMAGE_FILTER["brightness"], DARK_IMAGE_FILTER["contrast"]
    return tuple(min(1.0, max(0.0, (b * c - 0.5) * k + 0.5)) for c in rgb)


def data_contrast(colour, mode: str = "light", background="white") -> float:
    """Contrast of a data colour against a figure's ``background`` as the site shows both in ``mode``."""
    return contrast_ratio(shown_colour(colour, mode), shown_colour(background, mode))


# Explorable frames are shown at FRAME_CSS_DPI CSS px per inch (a 5.5 x 3.4 in figure is 495 x 306
# CSS px) and drawn at twice that, so zoom enlarges a sharp image (256-colour PNGs keep them light).
FRAME_CSS_DPI = 90
FRAME_DPI = 2 * FRAME_CSS_DPI
# Explorable frames are re-encoded to a palette of this many colours (median cut, no dither): about a
# third of the bytes, and diverging colour maps keep both ends (64 colours lose the smaller one).
FRAME_COLORS = 256
MAX_FRAMES = 64         # the product of the control lengths; more frames make pages heavy
MAX_CONTROLS = 3

# ---- the book's figure standard (issue 33) --------------------------------------------------------
# Figures are designed at the width of the site's content column, so that text keeps the size it
# was drawn at: 688 CSS px at a 1280 px window (sphinx-book-theme 1.3's .cell_output, measured in
# Chromium), at 100 CSS px per inch for static figures (preln.nb: FIGURE_DPI / FIGURE_SCALE) and
# FRAME_CSS_DPI for explorable frames. A wider figure is scaled down to the column, its text with it.
COLUMN_PX = 688
#: CSS px per inch of a static figure (a 6.88 in figure fills the column)
CSS_PX_PER_INCH = 100
COLUMN_IN = COLUMN_PX / CSS_PX_PER_INCH
#: no text of a figure smaller than this, in CSS px as displayed at 1280 px
MIN_TEXT_PX = 11.0
#: one series per colour, the same in every chapter: a dtype, a quantisation method or a model is
#: drawn in its colour wherever it appears (tests/test_figure_standard.py checks the labels)
DTYPE_COLOURS: dict[str, str] = {
    "float64": PALETTE[6], "float32": PALETTE[0], "float16": PALETTE[1], "bfloat16": PALETTE[2],
    "fp8": PALETTE[5], "int8": PALETTE[3], "int4": PALETTE[4],
}
METHOD_COLOURS: dict[str, str] = {
    "float": PALETTE[6], "RTN": PALETTE[0], "GPTQ": PALETTE[1], "AWQ": PALETTE[2],
    "LLM.int8": PALETTE[5], "SmoothQuant": PALETTE[3],
}
MODEL_COLOURS: dict[str, str] = {
    "Pre-LN": PALETTE[0], "Post-LN": PALETTE[1],
    # the GPT-style block is the Pre-LN block of the Foundations chapters: it keeps Pre-LN's blue
    "GPT-style": PALETTE[0], "Llama-style": PALETTE[5], "Llama-style, MQA": PALETTE[2],
    "GPT-2 XL": PALETTE[0], "Llama 2 7B": PALETTE[1], "Llama 2 70B": PALETTE[2],
}
#: every named colour of the book, by the name a label carries
SERIES_COLOURS: dict[str, str] = {**DTYPE_COLOURS, **METHOD_COLOURS, **MODEL_COLOURS}
# how a name appears in labels: "round to nearest" is RTN, "bf16" bfloat16, ...
_ALIASES = {"round to nearest": "RTN", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
            "fp64": "float64"}


def series_name(label: str) -> str | None:
    """The SERIES_COLOURS name a label speaks of ("GPTQ, g128" -> "GPTQ"), or None: a method
    before a model before a dtype, and the longest name found as a whole word."""
    text = str(label)
    for alias, name in _ALIASES.items():
        text = re.sub(rf"(?<![\w-]){re.escape(alias)}(?![\w-])", name, text, flags=re.I)
    for names in (METHOD_COLOURS, MODEL_COLOURS, DTYPE_COLOURS):   # "RTN, 4-bit" is a method
        found = [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]
        if found:
            return max(found, key=len)
    return None


def series_colour(name: str) -> str:
    """The colour of a dtype, method or model (see SERIES_COLOURS); an unknown name is an error."""
    key = name if name in SERIES_COLOURS else series_name(name)
    if key is None:
        raise ValueError(f"series_colour: name must be one of {sorted(SERIES_COLOURS)} (or a label "
                         f"naming one), got {name!r}")
    return SERIES_COLOURS[key]


def direct_labels(ax, lines=None, *, x=None, pad_pt: float = 4.0, gap_pt: float = 11.0,
                  max_series: int = 4):
    """Label each line at its right end in its own colour, in place of a legend (for up to four
    series): the labels are the lines' own ``label``s, moved apart vertically (at least ``gap_pt``)
    so that none overlaps another. ``x`` (data units) places them at the lines' point nearest to
    it instead of their last point. A horizontal line (``axhline``) is labelled at the axes'
    right edge. More than ``max_series`` lines want a legend (legend_outside) instead."""
    import numpy as np

    lines = [ln for ln in (lines if lines is not None else ax.get_lines())
             if not ln.get_label().startswith("_") and len(ln.get_xdata())]
    if len(lines) > max_series:
        raise ValueError(f"direct_labels: lines must be at most {max_series} series (use a legend "
                         f"outside the axes for more), got {len(lines)}")
    ax.figure.draw_without_rendering()   # the final layout, so display positions hold
    to_pt = 72 / ax.figure.dpi
    ends = []
    for ln in lines:
        xs, ys = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
        ok = np.isfinite(xs) & np.isfinite(ys)
        xs, ys = xs[ok], ys[ok]
        i = len(xs) - 1 if x is None else int(np.argmin(np.abs(xs - x)))
        # an axhline's x is in axes units: its own transform places it
        ends.append(((xs[i], ys[i]), ln.get_transform().transform((xs[i], ys[i]))[1] * to_pt, ln))
    ends.sort(key=lambda e: e[1])
    placed: list[float] = []
    for xy, y_pt, ln in ends:   # bottom to top, each at least gap_pt above the one below
        at = max(y_pt, placed[-1] + gap_pt) if placed else y_pt
        placed.append(at)
        ax.annotate(ln.get_label(), xy=xy, xycoords=ln.get_transform(), xytext=(pad_pt, at - y_pt),
                    textcoords="offset points",
                    va="center", ha="left", color=ln.get_color(),
                    fontsize=_STYLE["legend.fontsize"], annotation_clip=False)
    return ax


def legend_outside(ax, *, where: str = "below", ncol: int | None = None, **kwargs):
    """A legend beside the data, never over it: under the axes (``where="below"``, in up to
    ``ncol`` columns) or to their right (``"right"``)."""
    handles, labels = ax.get_legend_handles_labels()
    if where == "below":
        ncol = ncol or min(len(labels), 2)
        return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.18),
                         ncol=ncol, **kwargs)
    if where == "right":
        return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1), **kwargs)
    raise ValueError(f"legend_outside: where must be 'below' or 'right', got {where!r}")


def figure_legend(fig, axes, *, ncol: int = 2):
    """One legend for several stacked axes, under them all (a legend under the top axes would sit
    on the next one's data)."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol)


def log_ticks(ax, which: str = "y"):
    """Enough labelled ticks on a log axis to read a value: 1 to 9 per decade where it spans about
    one decade, 1, 2, 5 where it spans at most two, every decade otherwise; numbers as plain
    numbers (0.02, 50, 2000) up to 10^4 each way and as mathtext powers of ten beyond."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if which not in ("x", "y"):
        raise ValueError(f"log_ticks: which must be 'x' or 'y', got {which!r}")
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    decades = math.log10(hi / lo) if lo > 0 else math.inf
    subs = (tuple(float(k) for k in range(1, 10)) if decades <= 1.2 else
            (1.0, 2.0, 5.0) if decades <= 2.2 else (1.0,))
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(_log_number))
    axis.set_minor_formatter(NullFormatter())
    return ax


def tex_number(v: float, digits: int = 3) -> str:
    """A number for a figure's label, typeset: ``1e-05`` as $10^{-5}$, ``4.73e-04`` as
    $4.73\times10^{-4}$ (``digits`` significant), plain with the Unicode minus from 0.001 to
    10^4 (``-0.5`` as −0.5)."""
    import math

    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    e = math.floor(math.log10(abs(v)) + 1e-12)
    if -3 <= e <= 4:
        return f"{v:.{max(digits, e + 1)}g}".replace("-", "\u2212")
    m = float(f"{v / 10 ** e:.{digits}g}")
    if abs(abs(m) - 1) < 1e-12:
        return f"${'-' if m < 0 else ''}10^{{{e}}}$"
    return f"${m:g}\\times10^{{{e}}}$"


def _log_number(v, _pos=None) -> str:
    """A tick value of a log axis: plain from 10^-4 to 10^4, a mathtext power of ten beyond."""
    import math

    if v <= 0:
        return ""
    e = math.floor(math.log10(v) + 1e-9)
    if -4 <= e <= 4:
        return f"{v:g}".replace("-", "\u2212")
    m = v / 10 ** e
    return (f"$10^{{{e}}}$" if abs(m - 1) < 1e-6 else f"${m:g}\\times10^{{{e}}}$")

_STYLE: dict[str, Any] = {
    "figure.figsize": (5.5, 3.4),
    "figure.dpi": 100,
    "savefig.dpi": FIGURE_DPI,   # 2x: zoom enlarges a sharp image (preln.nb.figure_bundle)
    "figure.constrained_layout.use": True,
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.frameon": False,
    "lines.linewidth": 2.0,
    "lines.markersize": 5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "cividis",   # perceptually uniform and colour-blind safe
    "svg.hashsalt": "preln",   # deterministic SVG ids, should anyone save SVG
}


def apply_style() -> None:
    """Set matplotlib rcParams for the book: the palette as the colour cycle, readable sizes."""
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams.update(_STYLE)
    mpl.rcParams["axes.prop_cycle"] = cycler(color=PALETTE)
    # every figure a notebook shows carries its alt text in a text/html <img> (JupyterLab's choice),
    # and its dark variant beside it
    if register_figure_display():
        from IPython import get_ipython
        from matplotlib.figure import Figure

        get_ipython().display_formatter.mimebundle_formatter.for_type(Figure, figure_bundle)


# ---- dark mode (issue 33) ---------------------------------------------------------------------
# Every static figure is also drawn for the site's dark mode, from the same Figure: its greys
# (text, axes, grid, white faces) mirrored onto the theme's dark background, its data colours kept
# where they stand out from that background by MIN_DATA_CONTRAST and lightened (same hue) until
# they do otherwise; colour-mapped images are left as drawn (cividis reads on both). The site
# shows it instead of the light PNG in dark mode (book/_ext/preln_site.py, the theme's only-dark
# and only-light classes), with no filter and no white mat; print and the PDF show the light one.
#: the page background in dark mode (pydata-sphinx-theme 0.17.1, --pst-color-background, measured
#: in Chromium): the dark figures' face
DARK_BACKGROUND = "#121212"
#: the lightest grey of a dark figure (its text and axes): black text's place
DARK_INK = 0.88
#: a grey is a colour with at most this spread between its RGB channels
_GREY_SPREAD = 0.06
#: a dark data colour is lightened to at least this contrast with DARK_BACKGROUND
DARK_DATA_CONTRAST = 4.0


def dark_colour(colour):
    """A figure's colour as its dark-mode variant draws it (RGBA, alpha kept)."""
    import colorsys

    from matplotlib.colors import to_rgba

    r, g, b, a = to_rgba(colour)
    bg = _rgb(DARK_BACKGROUND)
    if max(r, g, b) - min(r, g, b) <= _GREY_SPREAD:       # a grey: mirrored, white -> background
        v = 1.0 - (r + g + b) / 3
        return tuple(c + (DARK_INK - c) * v for c in bg) + (a,)
    h, light, sat = colorsys.rgb_to_hls(r, g, b)
    rgb = (r, g, b)
    while contrast_ratio(rgb, bg) < DARK_DATA_CONTRAST and light < 0.95:
        light = min(0.95, light + 0.02)
        rgb = colorsys.hls_to_rgb(h, light, sat)
    return tuple(rgb) + (a,)


def _recolour(fig):
    """Recolour every artist of ``fig`` with dark_colour; returns the undo (a list of calls)."""
    from matplotlib.collections import Collection
    from matplotlib.image import AxesImage
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.text import Text

    undo = []

    def swap(get, put):
        from matplotlib.colors import is_color_like

        old = get()
        if old is None or (isinstance(old, str) and (old == "none" or not is_color_like(old))):
            return                       # "face", "edge", "auto": follows another colour
        try:
            new = dark_colour(old)
        except ValueError:               # an array of colours
            import numpy as np

            arr = np.asarray(old, float)
            if arr.ndim != 2 or not len(arr):
                return
            new = np.array([dark_colour(c) for c in arr])
        put(new)
        undo.append(lambda: put(old))

    for art in fig.findobj():
        if isinstance(art, AxesImage):
            continue
        if isinstance(art, Text):
            swap(art.get_color, art.set_color)
            box = art.get_bbox_patch()
            if box is not None:
                swap(box.get_facecolor, box.set_facecolor)
                swap(box.get_edgecolor, box.set_edgecolor)
        elif isinstance(art, Line2D):
            # the marker colours follow the line's ("auto"): read all three before setting any,
            # or a marker would be recoloured twice (back to dark)
            c, mfc, mec = art.get_color(), art.get_markerfacecolor(), art.get_markeredgecolor()
            swap(lambda: c, art.set_color)
            swap(lambda: mfc, art.set_markerfacecolor)
            swap(lambda: mec, art.set_markeredgecolor)
        elif isinstance(art, Patch):
            swap(art.get_facecolor, art.set_facecolor)
            swap(art.get_edgecolor, art.set_edgecolor)
            if getattr(art, "_hatch_color", None) is not None:    # no public setter
                swap(lambda art=art: art._hatch_color,
                     lambda c, art=art: setattr(art, "_hatch_color", c))
        elif isinstance(art, Collection) and art.get_array() is None:   # not colour-mapped
            swap(art.get_facecolor, art.set_facecolor)
            swap(art.get_edgecolor, art.set_edgecolor)
    return undo


def dark_png(fig, *, dpi: float | None = None, colors: int | None = None, tight: bool = True) -> bytes:
    """``fig`` drawn for dark mode (see dark_colour) as PNG bytes, on DARK_BACKGROUND; ``fig`` is
    left as it was. ``tight`` crops it as preln.nb.figure_bundle crops the light one."""
    from preln.nb import FIGURE_DPI

    undo = _recolour(fig)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi or FIGURE_DPI, facecolor=DARK_BACKGROUND,
                    bbox_inches="tight" if tight else None, metadata={"Software": None})
    finally:
        for call in reversed(undo):
            call()
    return buf.getvalue() if colors is None else palette_png(buf.getvalue(), int(colors))


# ---- checks of the figure standard -------------------------------------------------------------
# ``violations(fig)`` names what keeps a drawn figure from the standard above: text smaller than
# MIN_TEXT_PX as displayed at 1280 px, ASCII where the book typesets (``x_L``, ``1e-05``, a hyphen
# as minus, ``sqrt(``) or "(dimensionless)", a legend over data, a named dtype, method or model off
# its colour. figure_bundle records them in every displayed figure's output metadata, so
# tests/test_figure_standard.py checks every stored figure of the book.

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


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

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
    shrink = min(1.0, COLUMN_PX / (width_in * css_dpi))
    return css_dpi / 72 * shrink


def small_texts(fig, css_dpi=CSS_PX_PER_INCH, tight=True):
    scale = display_scale(fig, css_dpi, tight)
    return sorted({(t.get_text()[:30], round(t.get_fontsize() * scale, 1))
                   for t in _texts(fig) if t.get_fontsize() * scale < MIN_TEXT_PX - 1e-9})


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
    import numpy as np
    from matplotlib.patches import Rectangle

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
    """(legend's first label, data points under it) of every legend drawn over data."""
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
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D

    if isinstance(artist, Line2D):
        return artist.get_color()
    if isinstance(artist, Collection):
        fc = artist.get_facecolor()
        return fc[0] if len(fc) else artist.get_edgecolor()[0]
    return artist.get_facecolor()


def off_palette(fig):
    """Labelled series that name a dtype, method or model drawn in another colour than the book's."""
    from matplotlib.colors import to_hex

    wrong = []
    for ax in fig.axes:
        for artist in ax.get_lines() + ax.collections + ax.patches:
            label = artist.get_label()
            name = None if label.startswith("_") else series_name(label)
            if name and to_hex(_colour(artist), keep_alpha=False) != to_hex(SERIES_COLOURS[name]):
                wrong.append((label, to_hex(_colour(artist)), name))
    return wrong


def violations(fig, css_dpi=CSS_PX_PER_INCH, tight=True):
    """{kind: what} of what keeps ``fig`` from the book's figure standard, as displayed at 1280 px
    (static figures at CSS_PX_PER_INCH, cropped tight; explorable frames at FRAME_CSS_DPI)."""
    return {k: v for k, v in {"small text": small_texts(fig, css_dpi, tight),
                              "ascii or dimensionless": ascii_labels(fig),
                              "legend over data": legends_over_data(fig),
                              "off the book's colours": off_palette(fig)}.items() if v}


#: the class of the dark variant's <img> in a figure's HTML copy (the site moves it into a file)
DARK_IMG_CLASS = "preln-figure-dark"


def figure_bundle(fig, include=None, exclude=None):
    """preln.nb.figure_bundle's 2x PNG and HTML copy, with the dark variant added to the HTML copy
    as a hidden <img> (JupyterLab shows the light one; the site shows each in its mode)."""
    from preln.nb import FIGURE_COLORS, describe, set_alt
    from preln.nb import figure_bundle as light_bundle

    alt, description = describe(fig)             # the alt and description read as typeset text
    set_alt(fig, typeset_text(alt), description and typeset_text(description))
    data, metadata = light_bundle(fig, include, exclude)
    dark = base64.b64encode(dark_png(fig, colors=FIGURE_COLORS)).decode()
    data["text/html"] += (f'<img class="{DARK_IMG_CLASS}" hidden="hidden" alt="" '
                          f'src="data:image/png;base64,{dark}">')
    # what keeps it from the book's figure standard, kept with the output for the tests to read
    metadata["preln"] = {"standard": {kind: [list(map(str, v)) if isinstance(v, tuple) else str(v)
                                             for v in found]
                                      for kind, found in violations(fig).items()}}
    return data, metadata


def figure_png(fig, *, dpi: float | None = None, colors: int | None = None) -> bytes:
    """Render a matplotlib Figure to PNG bytes that depend only on what is drawn.

    No "Software"/time metadata is written, so re-executing a notebook reproduces the same bytes.
    ``colors`` (2..256) re-encodes the image as a palette PNG of at most that many colours (median
    cut, no dithering: deterministic, and flat plot colours stay flat). The figure is not closed;
    the caller owns it.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi if dpi is not None else "figure",
                metadata={"Software": None})
    if colors is None:
        return buf.getvalue()
    if not (isinstance(colors, numbers.Integral) and 2 <= colors <= 256):
        raise ValueError(f"figure_png: colors must be an int in 2..256, got {colors!r}")
    return palette_png(buf.getvalue(), int(colors))


def table_caption(caption: str | None, columns: Sequence[Any]) -> str:
    """A table's caption: the one given, else one made of its column names (every table is named)."""
    if caption is not None and (not isinstance(caption, str) or not caption.strip()):
        raise ValueError(f"caption: expected a non-empty str or None, got {caption!r}")
    if caption:
        return caption
    cols = [str(c) for c in columns]
    return f"{cols[0]}: " + ", ".join(cols[1:]) if len(cols) > 1 else cols[0]


def _label(value: Any) -> str:
    """How a control value is shown: floats compactly (1e-05, 0.5), everything else as str."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):g}"
    return str(value)


def _is_numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)


def _number(value: Any) -> str:
    """A control value as an ARIA number (aria-valuenow): the value itself, in full precision."""
    return str(int(value)) if isinstance(value, numbers.Integral) else repr(float(value))


def _sentences(text: str) -> list[str]:
    return [t.strip() for t in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", " ".join(text.split())) if t.strip()]


# ASCII math in an explorable's title or control label, typeset as HTML (the frames use mathtext):
# 1e-05 as 10<sup>−5</sup>, sqrt(x) as √x, x_L as x<sub>L</sub>, a minus sign as U+2212
_E_NOTATION = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)e([+-]?)0*(\d+)(?![\w.])")
_SQRT = re.compile(r"\bsqrt\(((?:[^()]|\([^()]*\))*)\)")
_SUBSCRIPT = re.compile(r"(?<![\w\\])([A-Za-z])_([A-Za-z0-9]{1,3})(?!\w)")
# Unicode's subscript letters and digits: a subscript made of them is a character of the text, read
# in its place by a screen reader and by a PDF's text layer (NFKC gives the letter back); <sub> is
# the fallback for the rest (capitals)
_SUBSCRIPTS = dict(zip("0123456789aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"))


_SUPERSCRIPTS = dict(zip("0123456789\u2212", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻"))


def _typeset(text: str, as_html: bool) -> str:
    def e_notation(m):
        mant, sign, exp = m.group(1), "\u2212" if m.group(2) == "-" else "", m.group(3)
        power = (f"10<sup>{sign}{exp}</sup>" if as_html
                 else "10" + "".join(_SUPERSCRIPTS[c] for c in sign + exp))
        return power if float(mant) == 1 else f"{mant}\u00d7{power}"

    def sqrt(m):
        inner = m.group(1)
        return f"\u221a{inner}" if re.fullmatch(r"\w+", inner) else f"\u221a({inner})"

    def subscript(m):
        if set(m.group(2)) <= set(_SUBSCRIPTS):
            sub = "".join(_SUBSCRIPTS[c] for c in m.group(2))
            return f"<i>{m.group(1)}</i>{sub}" if as_html else m.group(1) + sub
        return f"<i>{m.group(1)}</i><sub>{m.group(2)}</sub>" if as_html else m.group(0)

    out = html.escape(text) if as_html else text
    out = _E_NOTATION.sub(e_notation, out)
    out = _SQRT.sub(sqrt, out)
    out = _SUBSCRIPT.sub(subscript, out)
    out = re.sub(r"(?<![\w-])([A-Za-z])-(\d)", "\\1\u2212\\2", out)    # D-1
    return re.sub(r"(?<![\w-])-(?=[\d(])|(?<=\s)-(?=\s)", "\u2212", out)


def typeset_html(text: str) -> str:
    """``text`` HTML-escaped, with its ASCII math typeset: ``1e-05`` as 10<sup>−5</sup>, ``sqrt(x)``
    as √x (√(...) around more than one term), a one-letter name with a subscript (``x_L``,
    ``d_h``) as x<sub>L</sub>, and a hyphen used as a minus (``-3``, ``a - b``, ``D-1``) as the
    Unicode minus. Code names with several underscores (``n_kv_heads``) are left alone."""
    return _typeset(text, as_html=True)


def typeset_text(text: str) -> str:
    """``text`` as plain text with its ASCII math typeset as typeset_html does, in characters
    only (for alt text, aria labels, live regions): 10⁻⁵, √x, dₕ, the Unicode minus. A subscript
    Unicode has no characters for (``x_L``) stays as written, which reads less ambiguously than
    ``xL``."""
    return _typeset(text, as_html=False)


def has_colour_scale(fig) -> bool:
    """Whether ``fig`` maps values to colours (an image, a mesh, a scatter coloured by value): in
    dark mode such an explorable frame is shown as drawn, not through FRAME_DARK_FILTER, whose
    inversion would turn its colour scale around (book/_static/preln.css)."""
    from matplotlib.cm import ScalarMappable

    return any(art.get_array() is not None
               for art in fig.findobj(lambda a: isinstance(a, ScalarMappable)))


def _first_sentence(text: str, limit: int = 200) -> str:
    """The first sentence of ``text`` (up to ``limit`` characters, cut at a word)."""
    first = (_sentences(text) or [text.strip()])[0]
    return first if len(first) <= limit else first[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def _gist(alt: str) -> str:
    """What a live region says of a frame by default: the alt text's first sentence that does
    more than restate the settings (a short "d_h = 64." is skipped), whole: an announcement cut
    with "…" loses the result, which is what the reader moved the control to hear."""
    sentences = _sentences(alt) or [alt.strip()]
    return next((t for t in sentences if not (len(t) <= 60 and "=" in t)), sentences[0])


#: at most this many values make a segmented toggle (a row of buttons); more make a slider
#: (numbers, in order) or a drop-down
MAX_TOGGLE_VALUES = 3
#: seconds between two steps when the reader presses play
PLAY_SECONDS = 1.2
#: the buttons beside a slider: (data-preln-<action>, the name before the control's label, glyph,
#: extra attributes)
STEP_BUTTONS = (("step", "previous", "‹", ' data-preln-by="-1"'),
                ("step", "next", "›", ' data-preln-by="1"'),
                ("play", "play through", "▶", ' aria-pressed="false"'))


def control_kind(values: Sequence[Any]) -> str:
    """How a control of these values is shown: "toggle" (at most MAX_TOGGLE_VALUES values),
    "slider" (more numbers, in the order given) or "select" (more of anything else)."""
    if len(values) <= MAX_TOGGLE_VALUES:
        return "toggle"
    return "slider" if _is_numeric(values) else "select"


class Control(list):
    """A control's values, with the label the reader sees next to the control.

    Made by :func:`control`. It is a ``list`` of the values (so ``controls["d_h"]`` iterates,
    indexes and compares as before), plus ``label``: a short descriptive name, unique on its page
    ("head width d_h", "sequence length S"), not the bare symbol.
    """

    def __init__(self, label: str, values: Iterable[Any]):
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"control: label must be a non-empty str, got {label!r}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"control: values must be a list of values, got {type(values).__name__}")
        super().__init__(values)
        self.label = " ".join(label.split())

    def __repr__(self) -> str:
        return f"control({self.label!r}, {list(self)!r})"


def control(label: str, values: Iterable[Any]) -> Control:
    """The values of one explorable control, labelled for the reader: ``control("head width d_h",
    [4, 8, 16])``. Use it in a ``controls`` dict, or give ``labels=`` to :func:`explorable`."""
    return Control(label, values)


_SEEN: dict[str, int] = {}   # same content shown twice in one kernel -> distinct, stable ids


class Explorable:
    """Precomputed frames of ``plot`` over every combination of ``controls``.

    Made by :func:`explorable`. Displays (``_repr_html_``) as kernel-free HTML.

    Attributes
    ----------
    names : list
        The control names (``plot``'s keyword arguments), in the order given.
    labels : list
        Each control's label as the reader sees it (``control(...)``/``labels=``, else the name).
    values : list
        Each control's list of values.
    frames : dict
        Palette-PNG bytes per frame, keyed by the tuple of value indices (one index per control).
    alts : dict
        Alt text per frame, with the same keys as ``frames``.
    summaries : dict
        What the live region announces when a frame is shown, same keys as ``frames``.
    timings : dict
        Seconds spent in ``plot(**values)`` per frame, keyed by the tuple of *values*.
    initial : tuple
        Indices of the frame shown first.
    id : str
        The HTML id of the snippet (stable across re-execution).
    """

    def __init__(self, plot: Callable[..., Any], controls: Mapping[str, Sequence[Any]], *,
                 alt: str | Callable[..., str], title: str | None = None,
                 initial: Mapping[str, Any] | None = None, labels: Mapping[str, str] | None = None,
                 summary: Callable[..., str] | None = None, dpi: float = FRAME_DPI,
                 colors: int | None = FRAME_COLORS):
        if not callable(plot):
            raise TypeError(f"explorable: plot must be callable(**values) -> Figure, got {type(plot).__name__}")
        if not isinstance(controls, Mapping) or not 1 <= len(controls) <= MAX_CONTROLS:
            raise ValueError(f"explorable: controls must be a dict of 1 to {MAX_CONTROLS} "
                             f"name -> list of values, got {controls!r}")
        self.names = [str(k) for k in controls]
        self.values = [list(v) for v in controls.values()]
        for name, vals in zip(self.names, self.values):
            if not vals:
                raise ValueError(f"explorable: control {name!r} has no values")
        n_frames = 1
        for vals in self.values:
            n_frames *= len(vals)
        if n_frames > MAX_FRAMES:
            raise ValueError(f"explorable: {n_frames} frames (product of the control lengths "
                             f"{[len(v) for v in self.values]}); at most {MAX_FRAMES} keep the page light")
        if not (isinstance(alt, str) or callable(alt)):
            raise TypeError("explorable: alt must be a str or callable(**values) -> str")
        if summary is None:   # an alt function may carry its own: alt.summary(**values) -> str
            summary = getattr(alt, "summary", None)
        if summary is not None and not callable(summary):
            raise TypeError(f"explorable: summary must be callable(**values) -> str, got {type(summary).__name__}")
        self.plot, self.alt, self.title, self.dpi, self.colors = plot, alt, title, dpi, colors

        # labels: labels= wins over control(...), which wins over the bare name
        labels = dict(labels or {})
        unknown = sorted(set(labels) - set(self.names))
        if unknown:
            raise ValueError(f"explorable: labels names unknown controls {unknown}; the controls are {self.names}")
        self.labels = []
        for name, vals in zip(self.names, controls.values()):
            lab = labels.get(name, getattr(vals, "label", name))
            if not isinstance(lab, str) or not lab.strip():
                raise ValueError(f"explorable: the label of control {name!r} must be a non-empty str, got {lab!r}")
            self.labels.append(" ".join(lab.split()))
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"explorable: two controls share a label: {self.labels}")

        self.initial = tuple(0 for _ in self.names)
        if initial:
            idx = list(self.initial)
            for name, value in initial.items():
                if name not in self.names:
                    raise ValueError(f"explorable: initial names unknown control {name!r}")
                i = self.names.index(name)
                if value not in self.values[i]:
                    raise ValueError(f"explorable: initial {name}={value!r} is not one of {self.values[i]!r}")
                idx[i] = self.values[i].index(value)
            self.initial = tuple(idx)

        self.frames: dict[tuple[int, ...], bytes] = {}
        #: a frame draws a colour scale (a heat map, a colour-mapped scatter): the site's dark mode
        #: shows such frames as drawn, since inverting them would read the scale backwards
        self.colormap = False
        self.alts: dict[tuple[int, ...], str] = {}
        self.summaries: dict[tuple[int, ...], str] = {}
        self.timings: dict[tuple, float] = {}
        for idx in itertools.product(*(range(len(v)) for v in self.values)):
            kwargs = self._kwargs(idx)
            png, seconds = self._render(kwargs)
            self.frames[idx] = png
            self.timings[tuple(kwargs.values())] = seconds
            self.alts[idx] = typeset_text(self._alt_text(kwargs))
            self.summaries[idx] = self._summary(kwargs, self.alts[idx], summary)

        # The id depends on what the figure says (title, controls, alt texts), not on its pixels,
        # so it is stable even where a different CPU or BLAS moves an anti-aliased pixel.
        digest = hashlib.sha256(repr((title, self.names, self.labels,
                                      [[_label(v) for v in vals] for vals in self.values],
                                      sorted(self.alts.items()))).encode()).hexdigest()[:12]
        _SEEN[digest] = _SEEN.get(digest, 0) + 1
        self.id = f"preln-explorable-{digest}" + (f"-{_SEEN[digest]}" if _SEEN[digest] > 1 else "")

    # -- computing -------------------------------------------------------------------------
    def _kwargs(self, idx: Sequence[int]) -> dict[str, Any]:
        return {name: vals[i] for name, vals, i in zip(self.names, self.values, idx)}

    def _render(self, kwargs: Mapping[str, Any]) -> tuple[bytes, float]:
        import matplotlib.pyplot as plt

        t0 = time.perf_counter()
        fig = self.plot(**kwargs)
        seconds = time.perf_counter() - t0
        if fig is None or not hasattr(fig, "savefig"):
            raise TypeError(f"explorable: plot(**{dict(kwargs)!r}) must return a matplotlib Figure, "
                            f"got {type(fig).__name__}")
        try:
            png = figure_png(fig, dpi=self.dpi, colors=self.colors)
            self.colormap = self.colormap or has_colour_scale(fig)
        finally:
            plt.close(fig)   # pyplot figures would otherwise all be shown at the end of the cell
        return png, seconds

    def _alt_text(self, kwargs: Mapping[str, Any]) -> str:
        if callable(self.alt):
            text = self.alt(**kwargs)
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"explorable: alt(**{dict(kwargs)!r}) returned {text!r}; "
                                 "every frame needs descriptive alt text")
            return text.strip()
        if not self.alt.strip():
            raise ValueError("explorable: alt text is empty; describe what the figure shows")
        settings = ", ".join(f"{k} = {_label(v)}" for k, v in kwargs.items())
        return f"{self.alt.strip()} ({settings})"

    def _settings(self, kwargs: Mapping[str, Any]) -> str:
        return typeset_text(", ".join(f"{lab} = {_label(v)}" for lab, v in zip(self.labels, kwargs.values())))

    def _summary(self, kwargs: Mapping[str, Any], alt: str, summary: Callable[..., str] | None) -> str:
        """What the live region says of a frame: ``summary(**values)`` (the result, with its key
        numbers) or the gist of the alt text. The page prefixes only the setting the reader changed;
        the full description stays on the image."""
        if summary is None:
            return _gist(alt)
        text = summary(**kwargs)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"explorable: summary(**{dict(kwargs)!r}) returned {text!r}")
        return " ".join(text.split())

    # -- display ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        shape = " x ".join(str(len(v)) for v in self.values)
        title = f" {self.title!r}" if self.title else ""
        return f"<explorable{title}: {', '.join(self.names)}, {shape} frames>"

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self) -> str:
        """The kernel-free HTML snippet (also what a notebook stores as the text/html output)."""
        e = html.escape
        uid, i0 = self.id, self.initial
        shown = [[_label(v) for v in vals] for vals in self.values]
        frame_id = f"{uid}-frame"
        caption = self.title or _first_sentence(self.alts[i0], 120)
        # the <style> goes before the <figure>: a figcaption must be the figure's first child
        scale = ' data-preln-colormap="1"' if self.colormap else ""
        parts = [_CSS, f'<figure class="preln-explorable" id="{uid}" data-preln-explorable="1"{scale}>',
                 f'<figcaption id="{uid}-caption" class="preln-explorable-title">'
                 '<span class="preln-explorable-badge">Interactive</span> '
                 f'<strong>{typeset_html(caption)}</strong>'
                 f'<span class="preln-explorable-settings">: {e(self._settings(self._kwargs(i0)))}</span>'
                 '</figcaption>',
                 # Kernel-free but not script-free: where the script does not run (an untrusted
                 # notebook in JupyterLab, whose sanitizer strips <script> and <style>), the figure
                 # is its first frame with its alt, this note, and no controls (they are hidden
                 # until the script shows them: without the <style> a slider is 0 px wide). The
                 # attribute has a value: sanitize-html drops empty ones (all but alt).
                 f'<p class="preln-explorable-note">{e(UNTRUSTED_NOTE)}</p>',
                 '<div class="preln-explorable-controls" hidden="hidden">']
        for c, (label, vals, labs) in enumerate(zip(self.labels, self.values, shown)):
            cid, j = f"{uid}-c{c}", i0[c]
            kind = control_kind(vals)
            # one row of the label | control | value grid (the row's div is display: contents)
            parts.append(f'<div class="preln-explorable-control preln-{kind}-row">')
            if kind == "slider":
                # An ARIA slider, not <input type=range>: a native range's value would be the index
                # of the frame (the values need not be evenly spaced); here aria-valuenow is the
                # value itself and aria-valuetext how it is shown.
                nums = [float(v) for v in vals]
                ticks = "".join(f'<span class="preln-slider-tick" style="left:{100 * k / (len(vals) - 1):.4g}%"></span>'
                                for k in range(len(vals)))
                parts.append(
                    f'<span class="preln-explorable-label" id="{cid}-label">{typeset_html(label)}</span>'
                    '<span class="preln-explorable-input">'
                    f'<span class="preln-slider" id="{cid}" role="slider" tabindex="0" data-preln-control="{c}" '
                    f'data-index="{j}" aria-labelledby="{cid}-label" aria-controls="{frame_id}" '
                    f'aria-valuemin="{_number(vals[nums.index(min(nums))])}" '
                    f'aria-valuemax="{_number(vals[nums.index(max(nums))])}" '
                    f'aria-valuenow="{_number(vals[j])}" aria-valuetext="{e(labs[j])}" '
                    f'style="--preln-pos:{j / (len(vals) - 1):.4g}">'
                    f'<span class="preln-slider-track">{ticks}<span class="preln-slider-thumb"></span></span></span>'
                    # step and play through the ordered values (the script hides play where the
                    # reader asked for reduced motion)
                    + "".join(f'<button type="button" class="preln-explorable-button" data-preln-{act}="{c}" '
                              f'aria-controls="{frame_id}" aria-label="{e(name)} {e(typeset_text(label))}"{extra}>'
                              f'<span aria-hidden="true">{glyph}</span></button>'
                              for act, name, glyph, extra in STEP_BUTTONS)
                    + '</span>'
                    # the one visible value; a screen reader hears it from the slider itself
                    + f'<span class="preln-explorable-value" id="{cid}-value" aria-hidden="true">{e(labs[j])}</span>')
            elif kind == "toggle":
                # a segmented toggle: an ARIA radio group that takes the focus itself and marks its
                # current choice with aria-activedescendant (WAI-ARIA APG's radio group pattern)
                segments = "".join(f'<span class="preln-segment" role="radio" id="{cid}-o{k}" data-k="{k}" '
                                   f'aria-checked="{"true" if k == j else "false"}">{e(lab)}</span>'
                                   for k, lab in enumerate(labs))
                parts.append(f'<span class="preln-explorable-label" id="{cid}-label">{typeset_html(label)}</span>'
                             f'<span class="preln-explorable-input preln-wide">'
                             f'<span class="preln-segmented" id="{cid}" role="radiogroup" tabindex="0" '
                             f'data-preln-control="{c}" data-index="{j}" aria-labelledby="{cid}-label" '
                             f'aria-controls="{frame_id}" aria-activedescendant="{cid}-o{j}">{segments}</span></span>')
            else:
                opts = "".join(f'<option value="{k}"{" selected" if k == j else ""}>{e(lab)}</option>'
                               for k, lab in enumerate(labs))
                # the drop-down shows its value: no second copy beside it
                parts.append(f'<label class="preln-explorable-label" for="{cid}" id="{cid}-label">{typeset_html(label)}</label>'
                             f'<span class="preln-explorable-input preln-wide">'
                             f'<select id="{cid}" data-preln-control="{c}" aria-controls="{frame_id}">{opts}</select></span>')
            parts.append('</div>')
        parts.append('</div>')
        width, height = (round(n * FRAME_CSS_DPI / self.dpi) for n in png_size(self.frames[i0]))
        # a short alt (a screen reader reads an alt whole) and, where the words run longer, the whole
        # description in a <details> the image names with aria-describedby (updated with the frame)
        long = any(len(a) > ALT_MAX for a in self.alts.values())
        described = f' aria-describedby="{uid}-description"' if long else ""
        # the frame links to its full-size file (a phone zooms into it); the script gives the link
        # its href on the site only (a data: URI cannot be opened as a page), and not on paper
        parts.append(f'<a class="image-reference preln-explorable-full">'
                     f'<img class="preln-explorable-frame" id="{frame_id}" src="{_data_uri(self.frames[i0])}" '
                     f'alt="{e(short_alt(self.alts[i0]))}"{described} width="{width}" height="{height}"></a>')
        if long:
            parts.append('<details class="preln-explorable-description"><summary>Description of the figure'
                         f'</summary><p id="{uid}-description">{e(self.alts[i0])}</p></details>')
        # announced politely after a move (never on load: it starts empty)
        parts.append('<p class="preln-explorable-status" role="status" aria-atomic="true"></p>')
        # the live region names a moved control as its label reads on the page (typeset)
        names = [typeset_text(label) for label in self.labels]
        data = {"names": names, "labels": shown, "play_ms": round(1000 * PLAY_SECONDS),
                "values": [[_number(v) if _is_numeric(vals) else None for v in vals] for vals in self.values],
                "frames": {",".join(map(str, k)): [_data_uri(v), short_alt(self.alts[k]), self.summaries[k],
                                                   self._settings(self._kwargs(k))]
                                                  + ([self.alts[k]] if long else [])
                           for k, v in self.frames.items()}}
        payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<script type="application/json" class="preln-explorable-data">{payload}</script>')
        parts.append("<script>" + _JS.replace("__ID__", uid) + "</script>")
        parts.append("</figure>")
        return "".join(parts)

    # -- live ------------------------------------------------------------------------------
    def live(self):
        """The controls as ipywidgets (a VBox: one row per control, then the output), calling
        ``plot`` again for each setting (needs a kernel). As on the page: a toggle for at most
        MAX_TOGGLE_VALUES values, a slider with a Play button for more numbers, else a drop-down."""
        try:
            import ipywidgets as widgets
            from IPython import get_ipython
            from IPython.display import display
        except ImportError as exc:   # pragma: no cover - the book's requirements include both
            raise RuntimeError("explorable.live() needs ipywidgets and IPython; "
                               "the kernel-free version is `display(explorable)`") from exc
        if get_ipython() is None:
            raise RuntimeError("explorable.live() needs a running IPython kernel (Jupyter); "
                               "outside one, display the explorable itself")

        def show(**kwargs):
            png, seconds = self._render(kwargs)
            self.timings[tuple(kwargs.values())] = seconds
            data, metadata = image_bundle(png, self._alt_text(kwargs), scale=self.dpi / FRAME_CSS_DPI)
            display(data, raw=True, metadata=metadata)

        ui, rows = {}, []
        wide = {"description_width": "initial"}   # the descriptive labels, not cut to 80 px
        for c, (name, label, vals) in enumerate(zip(self.names, self.labels, self.values)):
            options = [(_label(v), v) for v in vals]
            value = vals[self.initial[c]]
            kind = control_kind(vals)
            if kind == "toggle":       # the same segmented toggle as the kernel-free page
                ui[name] = widgets.ToggleButtons(options=options, value=value, description=label,
                                                 style=wide)
                rows.append(ui[name])
            elif kind == "slider":     # ordered: a play button steps through the values
                ui[name] = widgets.SelectionSlider(options=options, value=value, description=label,
                                                   style=wide, continuous_update=False)
                play = widgets.Play(value=self.initial[c], min=0, max=len(vals) - 1, step=1,
                                    interval=round(1000 * PLAY_SECONDS), show_repeat=False,
                                    description=f"play through {label}")
                widgets.jslink((play, "value"), (ui[name], "index"))
                rows.append(widgets.HBox([ui[name], play]))
            else:
                ui[name] = widgets.Dropdown(options=options, value=value, description=label,
                                            style=wide)
                rows.append(ui[name])
        return widgets.VBox([*rows, widgets.interactive_output(show, ui)])


# What an explorable says where its script cannot run (an untrusted notebook in JupyterLab).
UNTRUSTED_NOTE = ("Interactive figure: run the notebook (or trust it) to move the controls; "
                  "the book's website runs it without a kernel.")


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


# One <style> per explorable, so that it looks and works the same in JupyterLab (no site CSS) and
# on the site, where the theme's colour variables (pydata-sphinx-theme, light and dark) take over
# and book/_static/preln.css adds the print and dark-mode rules. Non-text contrast (WCAG 1.4.11):
# the thumb, the track and the focus ring are at least 3:1 against the page in both modes.
_CSS = """<style>
.preln-explorable{margin:1em 0;max-width:100%;box-sizing:border-box;padding:.75em .9em .5em;border:1px solid var(--preln-card-border,#8a8f98);border-radius:.5em}
.preln-explorable-controls[hidden]{display:none}
.preln-explorable-title{margin:0 0 .6em}
.preln-explorable-badge{display:inline-block;margin-right:.4em;padding:0 .45em;border:1px solid currentColor;border-radius:1em;font-size:.8em;font-weight:600;letter-spacing:.02em;vertical-align:.1em}
.preln-explorable-settings{display:none}
.preln-explorable-controls{display:grid;grid-template-columns:max-content auto minmax(0,1fr);gap:.45em .9em;align-items:center;margin-bottom:.6em}
.preln-explorable-control{display:contents}
.preln-explorable-label{font-weight:600}
.preln-explorable-input{display:flex;align-items:center;gap:.3em;min-width:0}
.preln-explorable-input.preln-wide{grid-column:span 2}
.preln-explorable-value{min-width:4.5em;white-space:nowrap;font-family:var(--pst-font-family-monospace,monospace)}
.preln-slider{position:relative;display:inline-block;width:12em;flex:0 1 auto;min-width:5em;height:1.8em;cursor:pointer;touch-action:pan-y;border-radius:.3em}
.preln-slider-track{position:absolute;left:.7em;right:.7em;top:50%;height:4px;margin-top:-2px;border-radius:2px;background:var(--preln-track,#6b6f76)}
.preln-slider-tick{position:absolute;top:-3px;width:2px;height:10px;margin-left:-1px;background:var(--preln-track,#6b6f76)}
.preln-slider-thumb{position:absolute;top:50%;left:calc(var(--preln-pos,0)*100%);width:1.1em;height:1.1em;margin:-.55em 0 0 -.55em;border-radius:50%;box-sizing:border-box;background:var(--preln-thumb,#0b5cad);border:2px solid var(--preln-thumb-ring,#fff)}
.preln-explorable-button{flex:none;min-width:2em;height:2em;padding:0;font-size:1.05em;border:1px solid var(--preln-track,#6b6f76);border-radius:.3em;background:transparent;color:inherit;font-family:inherit;line-height:1;cursor:pointer}
.preln-explorable-button[aria-disabled=true]{border-style:dashed;cursor:default}
.preln-explorable-button[aria-pressed=true]{background:var(--preln-thumb,#0b5cad);border-color:var(--preln-thumb,#0b5cad);color:var(--preln-thumb-ring,#fff)}
.preln-segmented{display:inline-flex;flex-wrap:wrap;max-width:100%;border-radius:.35em;cursor:pointer}
.preln-segment{padding:.2em .75em;border:1px solid var(--preln-track,#6b6f76);margin-left:-1px}
.preln-segment:first-child{margin-left:0;border-radius:.35em 0 0 .35em}
.preln-segment:last-child{border-radius:0 .35em .35em 0}
.preln-segment[aria-checked=true]{background:var(--preln-thumb,#0b5cad);border-color:var(--preln-thumb,#0b5cad);color:var(--preln-thumb-ring,#fff);font-weight:600}
.preln-slider:focus,.preln-segmented:focus{outline:none}
.preln-slider:focus-visible,.preln-segmented:focus-visible,.preln-explorable select:focus-visible,.preln-explorable-button:focus-visible{outline:3px solid var(--preln-focus,#0b5cad);outline-offset:2px}
.preln-explorable select{max-width:100%}
.preln-explorable-frame{display:block;max-width:100%;height:auto}
.preln-explorable-description{margin:.25em 0 0}
.preln-explorable-status{position:absolute!important;width:1px;height:1px;margin:-1px;padding:0;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap;border:0}
@media (max-width:36em){.preln-explorable{padding:.6em .6em .4em}.preln-explorable-controls{grid-template-columns:minmax(0,1fr) max-content;gap:.2em .6em}.preln-explorable-label{grid-column:1/-1;margin-top:.3em}.preln-explorable-value{min-width:0}.preln-slider{min-width:3.5em}.preln-explorable-button{min-width:1.8em}}
@media (forced-colors:active){.preln-slider-track,.preln-slider-tick{background:CanvasText}.preln-slider-thumb{background:Highlight;border-color:Canvas}.preln-segment[aria-checked=true],.preln-explorable-button[aria-pressed=true]{background:Highlight;color:HighlightText;forced-color-adjust:none}}
@media print{.preln-explorable-controls{display:none}.preln-explorable-settings{display:inline}.preln-explorable-badge{display:none}.preln-explorable{break-inside:avoid;border:0;padding:0}}
</style>"""

# The controller, inlined in every explorable (no dependencies; runs once per id). Frame entries
# are [src, alt, announcement, settings(, description)]; src is a data URI in the notebook and a file on the site.
# Controls: a slider (arrows, Page keys, Home/End, pointer; with step and play buttons), a
# segmented toggle (a radio group: arrows, Home/End, click), a <select>.
_JS = """(function(){var r=document.getElementById("__ID__");if(!r||r.getAttribute("data-ready"))return;
r.setAttribute("data-ready","1");
var note=r.querySelector(".preln-explorable-note");if(note)note.parentNode.removeChild(note);
r.querySelector(".preln-explorable-controls").hidden=false;
var d=JSON.parse(r.querySelector("script.preln-explorable-data").textContent);
var img=r.querySelector(".preln-explorable-frame"),live=r.querySelector(".preln-explorable-status"),
set=r.querySelector(".preln-explorable-settings"),desc=document.getElementById("__ID__-description"),cs=r.querySelectorAll("[data-preln-control]"),
idx=[],timer=null,fetched=false,moved=-1,playing=null;
var still=window.matchMedia&&window.matchMedia("(prefers-reduced-motion: reduce)").matches;
function full(){var a=img.parentNode;if(a.tagName==="A"&&img.getAttribute("src").slice(0,5)!=="data:")a.href=img.getAttribute("src");}
full();window.addEventListener("beforeprint",function(){img.parentNode.removeAttribute("href");});
window.addEventListener("afterprint",full);
function prefetch(){if(fetched)return;fetched=true;for(var k in d.frames){var s=d.frames[k][0];
if(s.slice(0,5)!=="data:")(new Image()).src=s;}}
function role(c){return c.getAttribute("role");}
function buttons(){var bs=r.querySelectorAll("[data-preln-step]");for(var b=0;b<bs.length;b++){var i=+bs[b].getAttribute("data-preln-step"),
by=+bs[b].getAttribute("data-preln-by"),j=idx[i]+by;bs[b].setAttribute("aria-disabled",j<0||j>d.labels[i].length-1?"true":"false");}}
function show(){var f=d.frames[idx.join(",")];if(!f)return;
for(var i=0;i<cs.length;i++){var c=cs[i],j=idx[i],lab=d.labels[i][j],v=document.getElementById(c.id+"-value");
if(v)v.textContent=lab;
if(role(c)==="slider"){c.setAttribute("data-index",j);c.setAttribute("aria-valuenow",d.values[i][j]);
c.setAttribute("aria-valuetext",lab);c.style.setProperty("--preln-pos",j/(d.labels[i].length-1));}
else if(role(c)==="radiogroup"){c.setAttribute("data-index",j);c.setAttribute("aria-activedescendant",c.id+"-o"+j);
var ss=c.querySelectorAll("[role=radio]");for(var k=0;k<ss.length;k++)ss[k].setAttribute("aria-checked",k===j?"true":"false");}
else if(+c.value!==j)c.value=j;}
buttons();
img.src=f[0];img.alt=f[1];full();if(set)set.textContent=": "+f[3];if(desc&&f[4])desc.textContent=f[4];
var said=moved<0?"":d.names[moved]+" "+d.labels[moved][idx[moved]]+": ";
clearTimeout(timer);timer=setTimeout(function(){live.textContent=said+f[2];},350);}
function choose(i,j){prefetch();j=Math.max(0,Math.min(d.labels[i].length-1,j));if(j!==idx[i]){idx[i]=j;moved=i;show();}}
function stop(){if(!playing)return;clearInterval(playing.t);playing.b.setAttribute("aria-pressed","false");
playing.b.firstChild.textContent="\u25B6";playing=null;}
function play(b,i){var n=d.labels[i].length;if(playing){var was=playing.b;stop();if(was===b)return;}
if(idx[i]>=n-1)choose(i,0);b.setAttribute("aria-pressed","true");b.firstChild.textContent="\u275A\u275A";
playing={b:b,t:setInterval(function(){choose(i,idx[i]+1);if(idx[i]>=n-1)stop();},d.play_ms)};}
function keys(c,i,wrap){var n=d.labels[i].length,page=Math.max(1,Math.round(n/4));
c.addEventListener("keydown",function(e){var j=idx[i],k=e.key;
if(k==="ArrowRight"||k==="ArrowUp")j++;else if(k==="ArrowLeft"||k==="ArrowDown")j--;
else if(!wrap&&k==="PageUp")j+=page;else if(!wrap&&k==="PageDown")j-=page;else if(k==="Home")j=0;else if(k==="End")j=n-1;
else return;e.preventDefault();stop();if(wrap)j=(j+n)%n;choose(i,j);});
var l=document.getElementById(c.id+"-label");if(l)l.addEventListener("click",function(){c.focus();});}
function slider(c,i){var n=d.labels[i].length;keys(c,i,false);
function at(e){var t=c.firstChild.getBoundingClientRect();choose(i,Math.round((e.clientX-t.left)/Math.max(1,t.width)*(n-1)));}
c.addEventListener("pointerdown",function(e){if(e.button)return;e.preventDefault();c.focus();stop();
if(c.setPointerCapture)c.setPointerCapture(e.pointerId);at(e);});
c.addEventListener("pointermove",function(e){if(c.hasPointerCapture&&c.hasPointerCapture(e.pointerId))at(e);});}
function toggle(c,i){keys(c,i,true);c.addEventListener("click",function(e){var s=e.target.closest("[role=radio]");
if(s&&c.contains(s)){c.focus();choose(i,+s.getAttribute("data-k"));}});}
for(var i=0;i<cs.length;i++){var c=cs[i];idx.push(c.tagName==="SELECT"?+c.value:+c.getAttribute("data-index"));
if(role(c)==="slider")slider(c,i);else if(role(c)==="radiogroup")toggle(c,i);
else(function(c,i){function pick(){choose(i,+c.value);}c.addEventListener("change",pick);c.addEventListener("input",pick);})(c,i);}
var bs=r.querySelectorAll("[data-preln-step]");for(var b=0;b<bs.length;b++)(function(b){b.addEventListener("click",function(){
if(b.getAttribute("aria-disabled")==="true")return;stop();var i=+b.getAttribute("data-preln-step");choose(i,idx[i]+(+b.getAttribute("data-preln-by")));});})(bs[b]);
var ps=r.querySelectorAll("[data-preln-play]");for(var p=0;p<ps.length;p++)(function(b){if(still){b.hidden=true;return;}
b.addEventListener("click",function(){play(b,+b.getAttribute("data-preln-play"));});})(ps[p]);
buttons();
r.addEventListener("focusin",prefetch);r.addEventListener("pointerenter",prefetch);
})();"""


def explorable(plot: Callable[..., Any], controls: Mapping[str, Sequence[Any]], *,
               alt: str | Callable[..., str], title: str | None = None,
               initial: Mapping[str, Any] | None = None, labels: Mapping[str, str] | None = None,
               summary: Callable[..., str] | None = None) -> Explorable:
    """Precompute ``plot(**values)`` for every combination of control values.

    Parameters
    ----------
    plot : callable
        ``plot(**values) -> matplotlib Figure``. Pure: the real computation from ``preln`` plus
        the plotting. Called once per frame; its figure is rendered to PNG and closed.
    controls : dict
        Control name (``plot``'s keyword) -> list of values, or :func:`control` (the values with
        their label). 1 to 3 controls; the product of their lengths is at most ``MAX_FRAMES``.
        At most MAX_TOGGLE_VALUES values become a segmented toggle; more numbers a slider with
        step and play buttons (in the order given); more of anything else a drop-down.
    alt : str or callable
        Descriptive alt text for each frame (what the figure shows, not "a plot"): a function
        ``alt(**values) -> str``, or a str used for every frame with the settings appended.
    title : str, optional
        The figure's caption, shown above the controls; it names the group of controls and image.
    initial : dict, optional
        Control name -> value of the frame shown first (and on a page without scripts);
        by default each control's first value.
    labels : dict, optional
        Control name -> the label the reader sees and hears ("head width d_h"): descriptive, and
        unique on the page. Overrides a :func:`control`'s label; without either the bare name is
        shown (tests/test_viz.py requires a label for every explorable of ``preln.chapters.figures``).
    summary : callable, optional
        ``summary(**values) -> str``: a short sentence with the result's key numbers, which the live
        region announces after the reader moves a control (after the one setting that changed). By
        default ``alt.summary`` if the alt function has one, else the alt text's first sentence
        that does more than restate the settings.

    Returns
    -------
    Explorable
        Displays as kernel-free HTML; ``.live()`` gives the ipywidgets version; ``.timings``.
    """
    return Explorable(plot, controls, alt=alt, title=title, initial=initial, labels=labels,
                      summary=summary)
