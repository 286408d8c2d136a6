"""What the chapters' notebooks use to hand numbers to their prose, with or without the book's toolchain.

The book's prose quotes computed numbers with myst-nb's ``{glue:text}`` role: a notebook cell calls
``glue("name", value)`` and the built page shows ``value`` where the text says ``name``. A learner who
runs a chapter on Colab, Binder or after a plain ``pip install preln`` has no myst-nb (it is part of
the book's build stack, not of the package), and the chapters must still run there. So every chapter
imports :func:`glue` from here: with myst-nb installed it *is* ``myst_nb.glue`` (the stored outputs,
and so the site, are unchanged); without it, it shows the value in the notebook, so the reader of
the raw notebook sees the number the prose refers to.

Figures: :func:`register_figure_display` (called by ``preln.chapters.viz.apply_style``) makes every
matplotlib Figure display as a 2x PNG plus an HTML ``<img>`` carrying its alt text, which JupyterLab
shows (it never reads the alt myst-nb keeps in cell metadata); :func:`set_alt` gives a figure its
words, :func:`describe` reads them (or makes them from the figure's titles, axes and legends).
"""
try:
    from myst_nb import glue as _myst_glue
except ImportError:          # a learner's environment: no book toolchain
    _myst_glue = None

__all__ = ["glue", "HAVE_MYST_NB", "sig", "fixed", "span", "listed", "set_alt", "describe", "short_alt", "image_bundle", "figure_bundle",
           "register_figure_display", "png_size", "palette_png", "FIGURE_DPI", "ALT_MAX"]

#: True when myst-nb is importable (the book's build environment and `make test`).
HAVE_MYST_NB = _myst_glue is not None


def glue(name, variable, display=True):
    """Glue ``variable`` under ``name`` for the book's ``{glue:...}`` roles (myst-nb's ``glue``).

    name:     the key the prose uses (a string).
    variable: any value; it is stored the way Jupyter would display it.
    display:  also show the value in the notebook (myst-nb's meaning). Without myst-nb the value is
              always shown, as ``name = value``, since nothing else would render it.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty string (the key the prose uses); got {name!r}")
    if _myst_glue is not None:
        return _myst_glue(name, variable, display=display)
    print(f"{name} = {variable!r}" if isinstance(variable, str) else f"{name} = {variable}")
    return None


# ---- figures: alt text that travels with the notebook -------------------------------------------
# JupyterLab renders a figure output's text/html in preference to its image/png, and its image
# renderer never reads cell metadata (where myst-nb keeps ``mystnb.image.alt``). So every figure is
# displayed as both: the PNG (what the book's build shows, _config.yml's nb_mime_priority_overrides)
# and an ``<img alt=...>`` of the same bytes (what a reader of the downloaded notebook hears). The
# site gives its PNG the alt and description of that copy (book/_ext/preln_site.py): the words are
# written once, by the code that draws the figure (set_alt). The
# PNG is drawn at FIGURE_DPI, twice the CSS size it is shown at, so zoom enlarges a sharp image; its
# output metadata gives the CSS width, which makes the site link the image to its full-size file.

#: pixels per inch of a displayed figure: 2x the 100 CSS px per inch it is shown at
FIGURE_DPI = 200
#: how many device pixels a figure has per CSS pixel (FIGURE_DPI / 100)
FIGURE_SCALE = 2
#: colours of a displayed figure's palette PNG (see palette_png)
FIGURE_COLORS = 256
#: the longest alt text, in characters (longer descriptions go into a <details> the image names
#: with aria-describedby: a screen reader reads an alt whole, with no way to skip its rest)
ALT_MAX = 150
#: the attributes of a matplotlib Figure that :func:`describe` reads its alt text and description from
ALT_ATTR, DESCRIPTION_ATTR = "preln_alt", "preln_description"

_IDS: dict = {}   # description ids already used in this kernel -> how often (ids stay unique)


def _squash(text):
    return " ".join(str(text).split())


def short_alt(text, limit=ALT_MAX):
    """``text`` itself if it has at most ``limit`` characters, else its first sentence, cut at a
    word to at most ``limit`` characters (with "…")."""
    import re

    text = _squash(text)
    if len(text) <= limit:
        return text
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", text, maxsplit=1)[0]
    if len(first) <= limit:
        return first
    cut = first[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def sig(x, digits=2, zeros=False):
    """``x`` at ``digits`` significant figures, as a figure's words say it: 0.63, 47, 1, 4.7e-4,
    3.4e38 (an exponent below 1e-3 and from 1e6 on, never "e-05"), with a Unicode minus, which a
    screen reader says ("minus"; a hyphen it may skip). ``zeros`` keeps trailing zeros (0.80, 4.0:
    measured values side by side)."""
    import math

    x = float(x)
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("−" if x < 0 else "") + "infinity"

    def trim(t):
        return t.rstrip("0").rstrip(".") if "." in t and not zeros else t

    r = float(f"{x:.{digits}g}")                 # rounded: 99.7 -> 100.0, 65504 -> 66000.0
    if r == 0 or 1e-3 <= abs(r) < 1e6:
        text = trim(f"{r:.{max(digits - 1 - math.floor(math.log10(abs(r))), 0) if r else 0}f}")
    else:
        mantissa, exponent = f"{r:.{digits - 1}e}".split("e")
        text = f"{trim(mantissa)}e{int(exponent)}"
    return text.replace("-", "−")


def fixed(x, decimals=2):
    """``x`` with ``decimals`` decimals, as a figure's words say it: a Unicode minus, and never
    "−0.00" (a fitted exponent of -0.001 is level, 0.00)."""
    return f"{round(float(x), decimals) + 0.0:.{decimals}f}".replace("-", "−")


def span(values, fmt=".3g"):
    """"a to b", the smallest and the largest of ``values`` in ``fmt``; one number where both print alike."""
    lo, hi = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return lo if lo == hi else f"{lo} to {hi}"


def listed(words):
    """Words joined as in a sentence: "a, b and c"."""
    words = [str(w) for w in words]
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def set_alt(fig, alt, description=None):
    """Attach ``alt`` (a short description, at most ALT_MAX characters) and optionally a longer
    ``description`` to ``fig``; returns ``fig``, for ``return set_alt(fig, ...)``."""
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"set_alt: alt must be a non-empty description (str), got {alt!r}")
    if len(_squash(alt)) > ALT_MAX:
        raise ValueError(f"set_alt: alt must be at most {ALT_MAX} characters (got {len(_squash(alt))}); "
                         "put the rest in description=")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ValueError(f"set_alt: description must be a non-empty str or None, got {description!r}")
    setattr(fig, ALT_ATTR, _squash(alt))
    setattr(fig, DESCRIPTION_ATTR, _squash(description) if description else None)
    return fig


def _axis_words(label, ticks):
    """What an axis shows: its label, else its categories (the tick labels of a bar chart)."""
    label = _squash(label)
    if label:
        return label
    names = [_squash(t.get_text()) for t in ticks if t.get_text().strip()]
    if names and not all(n.replace("−", "-").lstrip("-").replace(".", "", 1).isdigit() for n in names):
        return f"{len(names)} categories ({', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
    return ""


def describe(fig):
    """``(alt, description)`` of a figure: the ones given with :func:`set_alt`, else read off the
    figure itself, so that no figure goes without one: the alt names the figure (its title, what
    its first panel plots against what, and its series where they fit); the description lists
    each panel's title, axes and legend."""
    given = getattr(fig, ALT_ATTR, None)
    if given:
        return given, getattr(fig, DESCRIPTION_ATTR, None)
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    title = _squash(fig._suptitle.get_text()) if getattr(fig, "_suptitle", None) else ""
    panels, series = [], []
    for ax in axes:
        bits = []
        if ax.get_title().strip():
            bits.append(_squash(ax.get_title()))
        x = _axis_words(ax.get_xlabel(), ax.get_xticklabels())
        y = _axis_words(ax.get_ylabel(), ax.get_yticklabels())
        if x or y:
            bits.append(f"{y or 'values'} against {x or 'position'}")
        legend = ax.get_legend()
        names = [_squash(t.get_text()) for t in legend.get_texts() if t.get_text().strip()] if legend else []
        series.append(names)
        if names:
            bits.append("series: " + ", ".join(names))
        panels.append("; ".join(bits))
    kind = "Figure" if len(axes) <= 1 else f"Figure of {len(axes)} panels"
    first = panels[0].split("; series:")[0] if panels and panels[0] else "no labelled axes"
    alt = f"{kind}: {title + '; ' if title else ''}{first}"
    if series and series[0] and len(alt) + 10 + len(", ".join(series[0])) <= ALT_MAX:
        alt += "; series: " + ", ".join(series[0])
    alt = short_alt(alt + ".")
    description = " ".join(f"Panel {i + 1}: {p}." if len(panels) > 1 else f"{p}."
                           for i, p in enumerate(panels) if p)
    return alt, (description or None)


def png_size(png):
    """(width, height) in pixels from a PNG's IHDR chunk."""
    if not isinstance(png, (bytes, bytearray)) or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("png_size: png must be the bytes of a PNG image")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def palette_png(png, colors=256):
    """Re-encode PNG bytes as a palette PNG of at most ``colors`` colours (median cut, no dither:
    deterministic, and flat plot colours stay flat): about a third of matplotlib's RGBA bytes, so a
    2x figure weighs what a 1x one did."""
    import io
    import numbers

    if not (isinstance(colors, numbers.Integral) and not isinstance(colors, bool) and 2 <= colors <= 256):
        raise ValueError(f"palette_png: colors must be an int in 2..256, got {colors!r}")
    from PIL import Image   # matplotlib's own dependency

    rgb = Image.open(io.BytesIO(png)).convert("RGB")   # the figures are opaque (white face colour)
    pal = rgb.quantize(colors=int(colors), method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    pal.save(out, format="PNG", optimize=True)
    return out.getvalue()


def image_bundle(png, alt, scale=1, description=None):
    """A display bundle ``(data, metadata)`` that shows ``png`` with its alt text everywhere:
    image/png (with its CSS width as metadata) and a text/html ``<img alt=...>`` of
    the same bytes.

    alt:         the description; over ALT_MAX characters, its first sentence becomes the alt and
                 the whole of it the longer description.
    scale:       device pixels per CSS pixel (2 for a 2x PNG), so the image is shown at its CSS size.
    description: a longer description, in a ``<details>`` the image names with aria-describedby.
    """
    import base64
    import hashlib
    import html

    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"image_bundle: alt must be a non-empty description (str), got {alt!r}")
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0):
        raise ValueError(f"image_bundle: scale must be a positive number, got {scale!r}")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ValueError(f"image_bundle: description must be a non-empty str or None, got {description!r}")
    alt = _squash(alt)
    if len(alt) > ALT_MAX:
        alt, description = short_alt(alt), alt + (" " + _squash(description) if description else "")
    w, h = png_size(png)
    cw, ch = round(w / scale), round(h / scale)
    b64 = base64.b64encode(png).decode()
    e = html.escape
    img = (f'<img class="preln-figure" alt="{e(alt)}" width="{cw}" height="{ch}" '
           f'style="max-width:100%;height:auto"{{describedby}} src="data:image/png;base64,{b64}">')
    if description:
        # the id depends on the words, not the pixels (stable where an anti-aliased pixel moves)
        digest = hashlib.sha256((alt + "\n" + description).encode()).hexdigest()[:12]
        _IDS[digest] = _IDS.get(digest, 0) + 1
        did = f"preln-figure-{digest}" + (f"-{_IDS[digest]}" if _IDS[digest] > 1 else "")
        named = img.replace("{describedby}", f' aria-describedby="{did}"')
        tag = (f'<div class="preln-figure">{named}'
               f'<details class="preln-figure-description"><summary>Description of the figure</summary>'
               f'<p id="{did}">{e(_squash(description))}</p></details></div>')
    else:
        tag = img.replace("{describedby}", "")
    return ({"image/png": b64, "text/html": tag, "text/plain": f"<Figure: {alt}>"},
            # width only: the site writes it as an inline style, which a height would fix too
            # (a narrow screen's max-width:100% would then squash the figure instead of scaling it)
            {"image/png": {"width": cw}})


def figure_bundle(fig, include=None, exclude=None):
    """IPython's mimebundle formatter for a matplotlib Figure: a 2x PNG, see :func:`image_bundle`."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIGURE_DPI, bbox_inches="tight", metadata={"Software": None})
    alt, description = describe(fig)
    return image_bundle(palette_png(buf.getvalue(), FIGURE_COLORS), alt, scale=FIGURE_SCALE,
                        description=description)


def register_figure_display(ip=None):
    """Show every matplotlib Figure in this IPython session with :func:`figure_bundle` (returned
    figures, displayed figures and glued figures alike). A no-op outside IPython; returns whether
    it registered."""
    if ip is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        ip = get_ipython()
    if ip is None:
        return False
    from matplotlib.figure import Figure

    ip.display_formatter.mimebundle_formatter.for_type(Figure, figure_bundle)
    # IPython prefers a per-mime formatter registered for a type to the mimebundle's value, and
    # matplotlib-inline registers an image/png one for Figure (a 1x RGBA PNG: the <img> beside it
    # would hold other bytes). Ask it for none, now and when its backend loads later (it reads
    # figure_formats then), and drop any registered already. `%config InlineBackend.figure_formats`
    # still brings them back for a reader who wants them.
    try:
        from matplotlib_inline.config import InlineBackend
    except ImportError:            # no inline backend: nothing registers a per-mime formatter
        InlineBackend = None
    if InlineBackend is not None:
        InlineBackend.instance(parent=ip).figure_formats = set()
    for formatter in ip.display_formatter.formatters.values():
        formatter.pop(Figure, None)
    return True
