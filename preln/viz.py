"""Figures for the book: one style, deterministic PNGs, and kernel-free explorables.

Every chapter plots with this module so that the figures look alike, read well for colour-blind
readers (the Okabe-Ito palette, Okabe & Ito 2008), and store byte-identical outputs when a notebook
is re-executed (nbval compares them).

    from preln.viz import PALETTE, apply_style, explorable, figure_png

    apply_style()
    ex = explorable(plot, {"eps": [1e-5, 1e-3, 1e-1]}, alt=lambda eps: f"... eps = {eps:g} ...")
    ex            # in a notebook: every frame precomputed; a slider swaps them with no kernel
    ex.live()     # with a running kernel: an ipywidgets `interactive` that recomputes
    ex.timings    # seconds spent in `plot` for each frame (for the benchmark table)

The kernel-free version is plain HTML: one ``<img>`` (the default frame, so the page reads as a
static figure when scripts are off), one ``<input type=range>`` or ``<select>`` per control with an
``<output>`` showing the current value, the frames as base64 PNGs in a JSON ``<script>``, and a
dozen lines of inline JavaScript with no dependencies.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import itertools
import json
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["PALETTE", "apply_style", "explorable", "figure_png", "Explorable", "MAX_FRAMES"]

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


def figure_png(fig, *, dpi: float | None = None) -> bytes:
    """Render a matplotlib Figure to PNG bytes that depend only on what is drawn.

    No "Software"/time metadata is written, so re-executing a notebook reproduces the same bytes.
    The figure is not closed; the caller owns it.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi if dpi is not None else "figure",
                metadata={"Software": None})
    return buf.getvalue()


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


_SEEN: dict[str, int] = {}   # same content shown twice in one kernel -> distinct, stable ids


class Explorable:
    """Precomputed frames of ``plot`` over every combination of ``controls``.

    Made by :func:`explorable`. Displays (``_repr_html_``) as kernel-free HTML.

    Attributes
    ----------
    names : list
        The control names, in the order given.
    values : list
        Each control's list of values.
    frames : dict
        PNG bytes per frame, keyed by the tuple of value indices (one index per control).
    alts : dict
        Alt text per frame, with the same keys as ``frames``.
    timings : dict
        Seconds spent in ``plot(**values)`` per frame, keyed by the tuple of *values*.
    initial : tuple
        Indices of the frame shown first.
    id : str
        The HTML id of the snippet (stable across re-execution).
    """

    def __init__(self, plot: Callable[..., Any], controls: Mapping[str, Sequence[Any]], *,
                 alt: str | Callable[..., str], title: str | None = None,
                 initial: Mapping[str, Any] | None = None, dpi: float = FRAME_DPI):
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
        self.plot, self.alt, self.title, self.dpi = plot, alt, title, dpi

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
        self.timings: dict[tuple, float] = {}
        for idx in itertools.product(*(range(len(v)) for v in self.values)):
            kwargs = self._kwargs(idx)
            png, seconds = self._render(kwargs)
            self.frames[idx] = png
            self.timings[tuple(kwargs.values())] = seconds
            self.alts[idx] = self._alt_text(kwargs)

        # The id depends on what the figure says (title, controls, alt texts), not on its pixels,
        # so it is stable even where a different CPU or BLAS moves an anti-aliased pixel.
        digest = hashlib.sha256(repr((title, self.names, [[_label(v) for v in vals] for vals in self.values],
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
            png = figure_png(fig, dpi=self.dpi)
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
        uid = self.id
        labels = [[_label(v) for v in vals] for vals in self.values]
        parts = [f'<div class="preln-explorable" id="{uid}">']
        if self.title:
            parts.append(f'<p class="preln-explorable-title"><strong>{e(self.title)}</strong></p>')
        parts.append('<div class="preln-explorable-controls">')
        for c, (name, vals, labs) in enumerate(zip(self.names, self.values, labels)):
            cid, i0 = f"{uid}-c{c}", self.initial[c]
            parts.append(f'<div class="preln-explorable-control"><label for="{cid}">{e(name)}</label> ')
            if _is_numeric(vals) and len(vals) > 1:
                parts.append(f'<input type="range" id="{cid}" name="{e(name)}" min="0" max="{len(vals) - 1}" '
                             f'step="1" value="{i0}" aria-valuetext="{e(labs[i0])}">')
            else:
                opts = "".join(f'<option value="{i}"{" selected" if i == i0 else ""}>{e(lab)}</option>'
                               for i, lab in enumerate(labs))
                parts.append(f'<select id="{cid}" name="{e(name)}">{opts}</select>')
            parts.append(f' <output for="{cid}" class="preln-explorable-value">{e(labs[i0])}</output></div>')
        parts.append('</div>')
        png0, alt0 = self.frames[self.initial], self.alts[self.initial]
        parts.append(f'<img class="preln-explorable-frame" src="data:image/png;base64,'
                     f'{base64.b64encode(png0).decode()}" alt="{e(alt0)}" style="max-width:100%;height:auto">')
        data = {"labels": labels,
                "frames": {",".join(map(str, k)): [base64.b64encode(v).decode(), self.alts[k]]
                           for k, v in self.frames.items()}}
        payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<script type="application/json" class="preln-explorable-data">{payload}</script>')
        parts.append("<script>" + _JS.replace("__ID__", uid) + "</script>")
        parts.append("</div>")
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
        for c, (name, vals) in enumerate(zip(self.names, self.values)):
            options = [(_label(v), v) for v in vals]
            value = vals[self.initial[c]]
            if _is_numeric(vals) and len(vals) > 1:
                ui[name] = widgets.SelectionSlider(options=options, value=value, description=name,
                                                   continuous_update=False)
            else:
                ui[name] = widgets.Dropdown(options=options, value=value, description=name)
        return widgets.interactive(show, **ui)


_JS = """(function(){var r=document.getElementById("__ID__");if(!r||r.getAttribute("data-ready"))return;
r.setAttribute("data-ready","1");
var d=JSON.parse(r.querySelector("script.preln-explorable-data").textContent);
var img=r.querySelector("img.preln-explorable-frame");
var cs=r.querySelectorAll(".preln-explorable-control input, .preln-explorable-control select");
function show(){var k=[];for(var i=0;i<cs.length;i++){var j=+cs[i].value,lab=d.labels[i][j];k.push(j);
var o=r.querySelector('output[for="'+cs[i].id+'"]');if(o)o.textContent=lab;
if(cs[i].type==="range")cs[i].setAttribute("aria-valuetext",lab);}
var f=d.frames[k.join(",")];if(f){img.src="data:image/png;base64,"+f[0];img.alt=f[1];}}
for(var i=0;i<cs.length;i++){cs[i].addEventListener("input",show);cs[i].addEventListener("change",show);}
})();"""


def explorable(plot: Callable[..., Any], controls: Mapping[str, Sequence[Any]], *,
               alt: str | Callable[..., str], title: str | None = None,
               initial: Mapping[str, Any] | None = None) -> Explorable:
    """Precompute ``plot(**values)`` for every combination of control values.

    Parameters
    ----------
    plot : callable
        ``plot(**values) -> matplotlib Figure``. Pure: the real computation from ``preln`` plus
        the plotting. Called once per frame; its figure is rendered to PNG and closed.
    controls : dict
        Control name -> list of values. 1 to 3 controls; the product of their lengths is at most
        ``MAX_FRAMES``. A numeric list becomes a slider, anything else a drop-down.
    alt : str or callable
        Descriptive alt text for each frame (what the figure shows, not "a plot"): a function
        ``alt(**values) -> str``, or a str used for every frame with the settings appended.
    title : str, optional
        Shown above the controls.
    initial : dict, optional
        Control name -> value of the frame shown first (and on a page without scripts);
        by default each control's first value.

    Returns
    -------
    Explorable
        Displays as kernel-free HTML; ``.live()`` gives the ipywidgets version; ``.timings``.
    """
    return Explorable(plot, controls, alt=alt, title=title, initial=initial)
