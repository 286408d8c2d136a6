"""Figures for the book: one style, deterministic PNGs, and kernel-free explorables.

Every chapter plots with this module so that the figures look alike, read well for colour-blind
readers (the Okabe-Ito palette, Okabe & Ito 2008), and store byte-identical outputs when a notebook
is re-executed (nbval compares them).

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
and a polite live region that announces a short summary of each new frame. The frames are
256-colour palette PNGs (a third of the bytes of matplotlib's RGBA), inlined as data URIs in a JSON
``<script>``, so the notebook works anywhere; the book's build (book/_ext/preln_site.py) moves them
into files next to the page, which the page fetches only when a reader moves a control. A ``<style>``
block and a few dozen lines of inline JavaScript, with no dependencies, make it work in JupyterLab
and on the site alike.
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

__all__ = ["PALETTE", "apply_style", "control", "explorable", "figure_png", "Control",
           "Explorable", "MAX_FRAMES", "FRAME_COLORS"]

# Okabe-Ito, ordered for a prop_cycle: the strongest contrasts first, yellow (weak on white) last.
PALETTE: list[str] = [
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#CC79A7",  # reddish purple
    "#000000",  # black
    "#F0E442",  # yellow
]

FRAME_DPI = 90          # explorable frames: light pages (a 5.5 x 3.4 in figure is 495 x 306 px)
# Explorable frames are re-encoded to a palette of this many colours (median cut, no dither): about a
# third of the bytes, and diverging colour maps keep both ends (64 colours lose the smaller one).
FRAME_COLORS = 256
MAX_FRAMES = 64         # the product of the control lengths; more frames make pages heavy
MAX_CONTROLS = 3

_STYLE: dict[str, Any] = {
    "figure.figsize": (5.5, 3.4),
    "figure.dpi": 100,
    "savefig.dpi": 100,
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
    from PIL import Image   # matplotlib's own dependency

    buf.seek(0)
    rgb = Image.open(buf).convert("RGB")   # the figures are opaque (white face colour)
    pal = rgb.quantize(colors=int(colors), method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    pal.save(out, format="PNG", optimize=True)
    return out.getvalue()


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


def _first_sentence(text: str, limit: int = 200) -> str:
    """The first sentence of ``text`` (up to ``limit`` characters, cut at a word)."""
    first = (_sentences(text) or [text.strip()])[0]
    return first if len(first) <= limit else first[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def _gist(alt: str, limit: int = 160) -> str:
    """What a live region says of a frame by default: the alt text's first sentence that does
    more than restate the settings (a short "d_h = 64." is skipped), up to ``limit`` characters."""
    sentences = _sentences(alt) or [alt.strip()]
    said = next((t for t in sentences if not (len(t) <= 60 and "=" in t)), sentences[0])
    return _first_sentence(said, limit)


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
        self.alts: dict[tuple[int, ...], str] = {}
        self.summaries: dict[tuple[int, ...], str] = {}
        self.timings: dict[tuple, float] = {}
        for idx in itertools.product(*(range(len(v)) for v in self.values)):
            kwargs = self._kwargs(idx)
            png, seconds = self._render(kwargs)
            self.frames[idx] = png
            self.timings[tuple(kwargs.values())] = seconds
            self.alts[idx] = self._alt_text(kwargs)
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
        return ", ".join(f"{lab} = {_label(v)}" for lab, v in zip(self.labels, kwargs.values()))

    def _summary(self, kwargs: Mapping[str, Any], alt: str, summary: Callable[..., str] | None) -> str:
        """The live region's words for a frame: the settings, then ``summary(**values)`` or the
        gist of the alt text (the full description stays on the image)."""
        if summary is None:
            return f"{self._settings(kwargs)}: {_gist(alt)}"
        text = summary(**kwargs)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"explorable: summary(**{dict(kwargs)!r}) returned {text!r}")
        return f"{self._settings(kwargs)}: {' '.join(text.split())}"

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
        parts = [_CSS, f'<figure class="preln-explorable" id="{uid}" data-preln-explorable="1">',
                 f'<figcaption id="{uid}-caption" class="preln-explorable-title"><strong>{e(caption)}</strong>'
                 f'<span class="preln-explorable-settings">: {e(self._settings(self._kwargs(i0)))}</span>'
                 '</figcaption>',
                 '<div class="preln-explorable-controls">']
        for c, (label, vals, labs) in enumerate(zip(self.labels, self.values, shown)):
            cid, j = f"{uid}-c{c}", i0[c]
            parts.append('<div class="preln-explorable-control">')
            if _is_numeric(vals) and len(vals) > 1:
                # An ARIA slider, not <input type=range>: a native range's value would be the index
                # of the frame (the values need not be evenly spaced); here aria-valuenow is the
                # value itself and aria-valuetext how it is shown.
                nums = [float(v) for v in vals]
                ticks = "".join(f'<span class="preln-slider-tick" style="left:{100 * k / (len(vals) - 1):.4g}%"></span>'
                                for k in range(len(vals)))
                parts.append(
                    f'<span class="preln-explorable-label" id="{cid}-label">{e(label)}</span>'
                    f'<span class="preln-slider" id="{cid}" role="slider" tabindex="0" data-preln-control="{c}" '
                    f'data-index="{j}" aria-labelledby="{cid}-label" aria-controls="{frame_id}" '
                    f'aria-valuemin="{_number(vals[nums.index(min(nums))])}" '
                    f'aria-valuemax="{_number(vals[nums.index(max(nums))])}" '
                    f'aria-valuenow="{_number(vals[j])}" aria-valuetext="{e(labs[j])}" '
                    f'style="--preln-pos:{j / (len(vals) - 1):.4g}">'
                    f'<span class="preln-slider-track">{ticks}<span class="preln-slider-thumb"></span></span></span>')
            else:
                opts = "".join(f'<option value="{k}"{" selected" if k == j else ""}>{e(lab)}</option>'
                               for k, lab in enumerate(labs))
                parts.append(f'<label class="preln-explorable-label" for="{cid}" id="{cid}-label">{e(label)}</label>'
                             f'<select id="{cid}" data-preln-control="{c}" aria-controls="{frame_id}">{opts}</select>')
            # the visible value; a screen reader hears it from the control itself
            parts.append(f'<span class="preln-explorable-value" id="{cid}-value" aria-hidden="true">{e(labs[j])}</span></div>')
        parts.append('</div>')
        width, height = _png_size(self.frames[i0])
        parts.append(f'<img class="preln-explorable-frame" id="{frame_id}" src="{_data_uri(self.frames[i0])}" '
                     f'alt="{e(self.alts[i0])}" width="{width}" height="{height}">')
        # announced politely after a move (never on load: it starts empty)
        parts.append('<p class="preln-explorable-status" role="status" aria-atomic="true"></p>')
        data = {"labels": shown, "values": [[_number(v) if _is_numeric(vals) else None for v in vals]
                                            for vals in self.values],
                "frames": {",".join(map(str, k)): [_data_uri(v), self.alts[k], self.summaries[k],
                                                   self._settings(self._kwargs(k))]
                           for k, v in self.frames.items()}}
        payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<script type="application/json" class="preln-explorable-data">{payload}</script>')
        parts.append("<script>" + _JS.replace("__ID__", uid) + "</script>")
        parts.append("</figure>")
        return "".join(parts)

    # -- live ------------------------------------------------------------------------------
    def live(self):
        """An ``ipywidgets.interactive`` that calls ``plot`` again for each setting (needs a kernel)."""
        try:
            import ipywidgets as widgets
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError as exc:   # pragma: no cover - the book's requirements include both
            raise RuntimeError("explorable.live() needs ipywidgets and IPython; "
                               "the kernel-free version is `display(explorable)`") from exc
        if get_ipython() is None:
            raise RuntimeError("explorable.live() needs a running IPython kernel (Jupyter); "
                               "outside one, display the explorable itself")

        def show(**kwargs):
            png, seconds = self._render(kwargs)
            self.timings[tuple(kwargs.values())] = seconds
            display(Image(data=png, format="png", metadata={"alt": self._alt_text(kwargs)}))

        ui = {}
        wide = {"description_width": "initial"}   # the descriptive labels, not cut to 80 px
        for c, (name, label, vals) in enumerate(zip(self.names, self.labels, self.values)):
            options = [(_label(v), v) for v in vals]
            value = vals[self.initial[c]]
            if _is_numeric(vals) and len(vals) > 1:
                ui[name] = widgets.SelectionSlider(options=options, value=value, description=label,
                                                   style=wide, continuous_update=False)
            else:
                ui[name] = widgets.Dropdown(options=options, value=value, description=label, style=wide)
        return widgets.interactive(show, **ui)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk: the <img> reserves its space before it loads."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("explorable: a frame is not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


# One <style> per explorable, so that it looks and works the same in JupyterLab (no site CSS) and
# on the site, where the theme's colour variables (pydata-sphinx-theme, light and dark) take over
# and book/_static/preln.css adds the print and dark-mode rules. Non-text contrast (WCAG 1.4.11):
# the thumb, the track and the focus ring are at least 3:1 against the page in both modes.
_CSS = """<style>
.preln-explorable{margin:1em 0;max-width:100%}
.preln-explorable-title{margin:0 0 .5em}
.preln-explorable-settings{display:none}
.preln-explorable-controls{display:flex;flex-wrap:wrap;gap:.5em 1.5em;align-items:center;margin-bottom:.5em}
.preln-explorable-control{display:flex;flex-wrap:wrap;align-items:center;gap:.25em .6em}
.preln-explorable-label{font-weight:600}
.preln-explorable-value{display:inline-block;min-width:4em;font-family:var(--pst-font-family-monospace,monospace)}
.preln-slider{position:relative;display:inline-block;width:11em;max-width:60vw;height:1.8em;cursor:pointer;touch-action:pan-y;border-radius:.3em}
.preln-slider-track{position:absolute;left:.7em;right:.7em;top:50%;height:4px;margin-top:-2px;border-radius:2px;background:var(--preln-track,#6b6f76)}
.preln-slider-tick{position:absolute;top:-3px;width:2px;height:10px;margin-left:-1px;background:var(--preln-track,#6b6f76)}
.preln-slider-thumb{position:absolute;top:50%;left:calc(var(--preln-pos,0)*100%);width:1.1em;height:1.1em;margin:-.55em 0 0 -.55em;border-radius:50%;box-sizing:border-box;background:var(--preln-thumb,#0b5cad);border:2px solid var(--preln-thumb-ring,#fff)}
.preln-slider:focus{outline:none}
.preln-slider:focus-visible,.preln-explorable select:focus-visible{outline:3px solid var(--preln-focus,#0b5cad);outline-offset:2px}
.preln-explorable-frame{display:block;max-width:100%;height:auto}
.preln-explorable-status{position:absolute!important;width:1px;height:1px;margin:-1px;padding:0;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap;border:0}
@media (forced-colors:active){.preln-slider-track,.preln-slider-tick{background:CanvasText}.preln-slider-thumb{background:Highlight;border-color:Canvas}}
@media print{.preln-explorable-controls{display:none}.preln-explorable-settings{display:inline}.preln-explorable{break-inside:avoid}}
</style>"""

# The controller, inlined in every explorable (no dependencies; runs once per id). Frame entries
# are [src, alt, announcement, settings]; src is a data URI in the notebook and a file on the site.
_JS = """(function(){var r=document.getElementById("__ID__");if(!r||r.getAttribute("data-ready"))return;
r.setAttribute("data-ready","1");
var d=JSON.parse(r.querySelector("script.preln-explorable-data").textContent);
var img=r.querySelector(".preln-explorable-frame"),live=r.querySelector(".preln-explorable-status"),
set=r.querySelector(".preln-explorable-settings"),cs=r.querySelectorAll("[data-preln-control]"),
idx=[],timer=null,fetched=false;
function prefetch(){if(fetched)return;fetched=true;for(var k in d.frames){var s=d.frames[k][0];
if(s.slice(0,5)!=="data:")(new Image()).src=s;}}
function show(){var f=d.frames[idx.join(",")];if(!f)return;
for(var i=0;i<cs.length;i++){var c=cs[i],j=idx[i],lab=d.labels[i][j];
document.getElementById(c.id+"-value").textContent=lab;
if(c.getAttribute("role")==="slider"){c.setAttribute("data-index",j);c.setAttribute("aria-valuenow",d.values[i][j]);
c.setAttribute("aria-valuetext",lab);c.style.setProperty("--preln-pos",j/(d.labels[i].length-1));}
else if(+c.value!==j)c.value=j;}
img.src=f[0];img.alt=f[1];if(set)set.textContent=": "+f[3];
clearTimeout(timer);timer=setTimeout(function(){live.textContent=f[2];},350);}
function choose(i,j){prefetch();j=Math.max(0,Math.min(d.labels[i].length-1,j));if(j!==idx[i]){idx[i]=j;show();}}
function slider(c,i){var n=d.labels[i].length,page=Math.max(1,Math.round(n/4));
c.addEventListener("keydown",function(e){var j=idx[i],k=e.key;
if(k==="ArrowRight"||k==="ArrowUp")j++;else if(k==="ArrowLeft"||k==="ArrowDown")j--;
else if(k==="PageUp")j+=page;else if(k==="PageDown")j-=page;else if(k==="Home")j=0;else if(k==="End")j=n-1;
else return;e.preventDefault();choose(i,j);});
function at(e){var t=c.firstChild.getBoundingClientRect();choose(i,Math.round((e.clientX-t.left)/Math.max(1,t.width)*(n-1)));}
c.addEventListener("pointerdown",function(e){if(e.button)return;e.preventDefault();c.focus();
if(c.setPointerCapture)c.setPointerCapture(e.pointerId);at(e);});
c.addEventListener("pointermove",function(e){if(c.hasPointerCapture&&c.hasPointerCapture(e.pointerId))at(e);});
var l=document.getElementById(c.id+"-label");if(l)l.addEventListener("click",function(){c.focus();});}
for(var i=0;i<cs.length;i++){var c=cs[i];idx.push(c.getAttribute("role")==="slider"?+c.getAttribute("data-index"):+c.value);
if(c.getAttribute("role")==="slider")slider(c,i);
else(function(c,i){function pick(){choose(i,+c.value);}c.addEventListener("change",pick);c.addEventListener("input",pick);})(c,i);}
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
        A numeric list becomes a slider, anything else a drop-down.
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
        ``summary(**values) -> str``: a short sentence the live region announces after the reader
        moves a control (after the settings). By default, the alt text's first sentence that does
        more than restate the settings, cut to 160 characters.

    Returns
    -------
    Explorable
        Displays as kernel-free HTML; ``.live()`` gives the ipywidgets version; ``.timings``.
    """
    return Explorable(plot, controls, alt=alt, title=title, initial=initial, labels=labels,
                      summary=summary)
