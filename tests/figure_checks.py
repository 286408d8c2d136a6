"""What every figure of the book must have, checked by the figure tests of each chapter.

``assert_labelled(fig)`` is what each chapter's tests call on each figure, and ``own_words(fig)``
checks the alt text and description its figure function set. ``assert_labelled`` also runs
``assert_accessible``: legends of at least LEGEND_MIN_PT, data colours of at least 3:1 against the
figure's face as the site shows it (light mode, and dark mode through the theme's image filter), and
series that stay apart for a reader with deuteranopia or protanopia (Machado, Oliveira & Fernandes
2009, severity 1): two series whose simulated colours are closer than MIN_DELTA_E must differ by
line style, marker or hatch, or one of them must be labelled on the plot itself.
"""
import re

import numpy as np
from matplotlib.collections import Collection
from matplotlib.colors import to_rgb, to_rgba
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from preln.chapters.viz import MIN_DATA_CONTRAST, data_contrast

#: the smallest legend text, in points (the issue's 10 pt; at 2x a 10 pt legend is 14 CSS px)
LEGEND_MIN_PT = 10
#: CIELAB distance (CIE76) below which two series' colours are "the same" to a reader: about the
#: distance of Okabe-Ito's blue and its (darkened) sky blue in normal vision (12.7), which no
#: reader should have to tell apart on a thin line
MIN_DELTA_E = 15.0

# Machado, Oliveira & Fernandes (2009), "A physiologically-based model for simulation of color
# vision deficiency", IEEE TVCG 15(6), Table 1 at severity 1.0; they act on linear RGB.
MACHADO_2009 = {
    "protanopia": np.array([[0.152286, 1.052583, -0.204868],
                            [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968],
                              [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
}
VISIONS = ("normal", "deuteranopia", "protanopia")

_SRGB_TO_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
_D65 = np.array([0.95047, 1.0, 1.08883])


def _linear(rgb):
    c = np.asarray(rgb, dtype=float)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def simulated_lab(colour, vision="normal"):
    """CIELAB (D65) of ``colour`` as seen with ``vision`` (normal, deuteranopia, protanopia)."""
    lin = _linear(to_rgb(colour))
    if vision != "normal":
        lin = np.clip(MACHADO_2009[vision] @ lin, 0.0, 1.0)
    xyz = _SRGB_TO_XYZ @ lin / _D65
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e(a, b, vision="normal"):
    """CIE76 distance of two colours as seen with ``vision``."""
    return float(np.linalg.norm(simulated_lab(a, vision) - simulated_lab(b, vision)))


def _over(rgba, background):
    """An RGBA colour composited over an opaque background (what the PNG holds)."""
    r, g, b, a = to_rgba(rgba)
    bg = to_rgb(background)
    return tuple(a * c + (1 - a) * k for c, k in zip((r, g, b), bg))


def _dashes(ls):
    """A line style as a comparable value: '-' for solid, else its dash pattern."""
    if isinstance(ls, tuple):           # a collection's (offset, dashes)
        return "-" if not ls[1] else tuple(np.round(ls[1], 1))
    return {"solid": "-", "dashed": "--", "dotted": ":", "dashdot": "-."}.get(ls, ls)


def _series(handle):
    """(kind, style, colour) of a legend handle: what tells it apart besides its colour."""
    if isinstance(handle, (BarContainer, ErrorbarContainer)):
        handle = handle.patches[0] if isinstance(handle, BarContainer) else handle.lines[0]
    if isinstance(handle, Line2D):
        marker = handle.get_marker()
        marker = "" if marker in (None, "None", "", " ") else str(marker)
        ls = handle.get_linestyle()
        # get_linestyle() says "--" for every custom dash pattern: compare the pattern itself
        ls = "" if ls in ("None", "", " ") else _dashes(getattr(handle, "_unscaled_dash_pattern", ls))
        colour = handle.get_color()
        face = to_rgba(handle.get_markerfacecolor())
        hollow = bool(marker) and face[3] == 0          # open markers differ from filled ones
        if not ls:                      # markers only: their fill, or their edge if they are open
            colour = face if not hollow else handle.get_markeredgecolor()
        return "line", (ls, marker, hollow), colour
    if isinstance(handle, Patch):
        fc = handle.get_facecolor()
        colour = fc if fc[3] > 0 else handle.get_edgecolor()
        return "patch", (handle.get_hatch() or "",), colour
    if isinstance(handle, Collection):
        fc, ec = handle.get_facecolor(), handle.get_edgecolor()
        colour = fc[0] if len(fc) and fc[0][3] > 0 else ec[0]
        ls = handle.get_linestyle()
        ls = _dashes(ls[0]) if len(ls) else "-"
        return type(handle).__name__, (ls, handle.get_hatch() or ""), colour
    raise AssertionError(f"legend handle of an unknown kind: {handle!r}")


def _direct_labels(ax):
    """Words written on the plot itself (texts and annotations), each stripped."""
    return [" ".join(t.get_text().split()) for t in ax.texts if t.get_visible() and t.get_text().strip()]


def _is_labelled(label, texts):
    pat = re.compile(rf"(^|[\s,(]){re.escape(label)}($|[\s,:)=])")
    return any(pat.search(t) for t in texts)


def series_conflicts(ax):
    """Pairs of ``ax``'s legend series that only colour tells apart, and not even colour for some
    reader: [(label, label, vision, ΔE)]."""
    handles, labels = ax.get_legend_handles_labels()
    legend = ax.get_legend()
    if legend is not None and legend.legend_handles:   # a legend drawn from handles=... only
        pairs = [(h, t.get_text()) for h, t in zip(legend.legend_handles, legend.get_texts())]
        if len(pairs) > len(handles):
            handles, labels = [p[0] for p in pairs], [p[1] for p in pairs]
    series = [(lab, *_series(h)) for h, lab in zip(handles, labels) if lab and not lab.startswith("_")]
    texts = _direct_labels(ax)
    bad = []
    for i, (la, ka, sa, ca) in enumerate(series):
        for lb, kb, sb, cb in series[i + 1:]:
            if (ka, sa) != (kb, sb) or _is_labelled(la, texts) or _is_labelled(lb, texts):
                continue
            for vision in VISIONS:
                d = delta_e(ca, cb, vision)
                if d < MIN_DELTA_E:
                    bad.append((la, lb, vision, round(d, 1)))
                    break
    return bad


def low_contrast_series(ax):
    """Legend series whose colour (over the axes' face) is under 3:1 there, in light or dark mode:
    [(label, mode, ratio)]."""
    face = ax.get_facecolor()
    out = []
    handles, labels = ax.get_legend_handles_labels()
    for h, lab in zip(handles, labels):
        if not lab or lab.startswith("_"):
            continue
        colours = [_over(_series(h)[2], face)]
        if isinstance(h, Patch) and h.get_linewidth() > 0:
            colours.append(_over(h.get_edgecolor(), face))   # a swatch stands out by its edge, or its fill
        for mode in ("light", "dark"):
            r = max(data_contrast(c, mode, background=face) for c in colours)
            if r < MIN_DATA_CONTRAST:
                out.append((lab, mode, round(r, 2)))
    return out


def assert_accessible(fig):
    """Legends readable, data colours at 3:1, series apart under colour-blindness (see the module)."""
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            sizes = [t.get_fontsize() for t in legend.get_texts()]
            if legend.get_title().get_text():
                sizes.append(legend.get_title().get_fontsize())
            assert min(sizes) >= LEGEND_MIN_PT, \
                f"axes {ax.get_title()!r}: legend text of {min(sizes)} pt (at least {LEGEND_MIN_PT})"
        low = low_contrast_series(ax)
        assert not low, f"axes {ax.get_title()!r}: series below {MIN_DATA_CONTRAST}:1: {low}"
        bad = series_conflicts(ax)
        assert not bad, (f"axes {ax.get_title()!r}: series told apart by colour alone, and too close "
                         f"(ΔE < {MIN_DELTA_E}) for some readers: {bad}")
    for legend in fig.legends:
        assert min(t.get_fontsize() for t in legend.get_texts()) >= LEGEND_MIN_PT


def assert_labelled(fig):
    """Every data axes (not a colour bar) has an x label, a y label and at least one artist; and
    the figure is readable (assert_accessible)."""
    assert isinstance(fig, Figure)
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert axes, "the figure has no axes"
    for ax in axes:
        assert ax.get_xlabel().strip(), f"axes {ax.get_title()!r} has no x label"
        assert ax.get_ylabel().strip(), f"axes {ax.get_title()!r} has no y label"
        assert ax.has_data() or ax.images or ax.texts, f"axes {ax.get_title()!r} is empty"
    assert_accessible(fig)


def own_words(fig):
    """``(alt, description)`` that the figure function gave ``fig`` with preln.nb.set_alt, checked:
    both set (not read off the axes), the alt within ALT_MAX and not cut, whole sentences, and no
    TeX, "nan", "e+" or "-0.00" in either."""
    from preln.nb import ALT_ATTR, ALT_MAX, DESCRIPTION_ATTR

    alt, description = getattr(fig, ALT_ATTR, None), getattr(fig, DESCRIPTION_ATTR, None)
    assert alt and description, "the figure function must call set_alt with a description"
    assert len(alt) <= ALT_MAX and "…" not in alt and alt.endswith("."), alt
    assert description.endswith("."), description
    for text in (alt, description):
        assert not re.search(r"[$\\{}]|e\+|\bnan\b|-0\.00", text), text
    return alt, description
