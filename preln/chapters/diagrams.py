"""The book's diagrams as SVG, drawn from the package's own shapes and configurations.

    from preln.chapters.diagrams import DIAGRAMS, render, write_all

    svg = render("shape_flow", "dark")     # one diagram, one theme, as an SVG document
    write_all(folder)                      # every diagram in both themes: <name>.svg, <name>-dark.svg

The book's build (book/_ext/diagrams.py) writes them into book/diagrams/ (kept in git) and shows the
light file in light mode and the dark one in dark mode. Every label that states a shape, a count
or a split is read off the package — :func:`preln.chapters.shapes.shape_flow`,
:func:`preln.parallel.tensor.shard_params`, a real :class:`preln.serve.paged.PagedKVCache` — so a
diagram cannot drift from the code. Each SVG carries its words as ``<text>`` (it scales, prints and
is searchable), a ``<title>`` and a ``<desc>``, and is drawn WIDTH px wide with text of at least
MIN_FONT px, so that a 390 px phone, which shows it PHONE_COLUMN_PX wide, still shows the text at
MIN_SHOWN_PX or more. Colours are the book's palette (:mod:`preln.chapters.viz`); the dark theme
uses the site's dark background and text colours and lightens each hue to stand out on it.

``python -m preln.chapters.diagrams FOLDER`` writes them (JupyterLab shows a chapter's diagram
once they exist; the site's build writes them itself).
"""
from __future__ import annotations

import sys
from html import escape
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from preln.chapters.shapes import shape_flow
from preln.chapters.viz import PALETTE, contrast_ratio
from preln.nn.block import TransformerBlock
from preln.nn.config import BlockConfig
from preln.nn.llama import LlamaBlock, LlamaConfig
from preln.parallel.tensor import replicated, shard_params
from preln.serve.paged import PagedKVCache

__all__ = ["DIAGRAMS", "THEMES", "Diagram", "render", "write_all", "WIDTH", "MIN_FONT",
           "PHONE_COLUMN_PX", "MIN_SHOWN_PX", "file_name"]

#: width of every diagram in SVG px (its natural width on the page)
WIDTH = 400
#: a figure image's width on a 390 px wide phone (measured on the built site: the column less its
#: padding); a diagram wider than this is scaled down by PHONE_COLUMN_PX / WIDTH
PHONE_COLUMN_PX = 342
#: the smallest text a reader should get, in CSS px as displayed (the issue's standard)
MIN_SHOWN_PX = 11
#: text sizes in SVG px; MIN_FONT * PHONE_COLUMN_PX / WIDTH >= MIN_SHOWN_PX
FONT, MIN_FONT = 14, 13
#: text on a box's fill, and a hue's lines against the page: WCAG 1.4.3 and 1.4.11
TEXT_CONTRAST, LINE_CONTRAST = 4.5, 3.0
#: how much of a hue a box's fill takes (the rest is the page's background), per mode: on the
#: dark page a weaker tint would leave the boxes hard to tell apart
TINT = {"light": 0.16, "dark": 0.26}

# The page's own colours, so a diagram sits on the page without a frame: the background and text
# of each mode as the site shows them (pydata-sphinx-theme 0.17's --pst-color-text-base and
# -text-muted; sphinx-book-theme 1.3 sets the dark background to #121212)
_PAGE = {"light": ("#ffffff", "#222832", "#48566b"), "dark": ("#121212", "#ced6dd", "#9ca4af")}
# one hue per kind of thing, the same in every diagram (PALETTE: blue, vermillion, green,
# orange, sky blue, reddish purple); the collectives take the purple, which stays apart from the
# norms' orange on the dark page too
_HUES = {"attn": PALETTE[0], "comm": PALETTE[5], "mlp": PALETTE[2], "norm": PALETTE[3],
         "kv": PALETTE[1], "seq": PALETTE[4]}


def _hex(rgb) -> str:
    return "#" + "".join(f"{round(255 * min(1.0, max(0.0, c))):02x}" for c in rgb)


def _rgb(colour: str):
    return tuple(int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))


def _mix(a: str, b: str, t: float) -> str:
    """t of colour a, 1 - t of colour b (sRGB)."""
    return _hex([t * x + (1 - t) * y for x, y in zip(_rgb(a), _rgb(b))])


def _lift(colour: str, background: str, ratio: float) -> str:
    """``colour`` mixed towards white until it stands out from ``background`` by ``ratio``."""
    for t in np.linspace(1.0, 0.0, 41):
        c = _mix(colour, "#ffffff", float(t))
        if contrast_ratio(c, background) >= ratio:
            return c
    return "#ffffff"


def _theme(mode: str) -> dict:
    bg, ink, muted = _PAGE[mode]
    t = {"mode": mode, "bg": bg, "ink": ink, "muted": muted}
    for role, hue in _HUES.items():
        # on the dark page a hue is lightened until it is as clear as text: thin strokes at
        # the bare 3:1 look dim there, and the box fills are mixed from this colour
        line = hue if mode == "light" else _lift(hue, bg, TEXT_CONTRAST)
        t[role] = line
        t[role + "_fill"] = _mix(line, bg, TINT[mode])
    t["plain_fill"] = _mix(muted, bg, TINT[mode] / 2)
    return t


#: the two colour themes, by mode: page background, ink, muted ink, and per role a line colour and
#: a fill
THEMES = {mode: _theme(mode) for mode in _PAGE}


def file_name(name: str, mode: str) -> str:
    """The file a diagram is written to: <name>.svg (light) or <name>-dark.svg."""
    return f"{name}.svg" if mode == "light" else f"{name}-{mode}.svg"


# ---- drawing ------------------------------------------------------------------------------------
# Advance widths of DejaVu Sans (the first font asked for; the fallbacks are narrower), in em:
# narrow glyphs, wide ones, and the rest; an upper bound within a few per cent for these labels.
_NARROW = set(" ijlI.,:;'|!()[]/·ᵀᵢⱼ-")
_WIDE = set("MWmw∝⊙≈∞−→↑↓+=×÷")
#: bold glyphs are wider by about this factor
BOLD = 1.12


def text_width(words: str, size: float, bold: bool = False) -> float:
    """Estimated width in px of ``words`` at font size ``size`` (an upper bound for DejaVu Sans:
    tests/test_diagrams.py measures every label with its glyphs)."""
    ems = sum(0.34 if ch in _NARROW else 0.9 if ch in _WIDE else 0.74 if ch.isupper() else
              0.64 if ch.isdigit() else 0.6
              for ch in words)
    return ems * size * (BOLD if bold else 1.0)


class Canvas:
    """SVG elements in one theme; y grows downwards."""

    def __init__(self, theme: dict):
        self.t, self.items = theme, []

    def text(self, x, y, words, size=FONT, anchor="middle", colour="ink", bold=False, italic=False):
        if size < MIN_FONT:
            raise ValueError(f"size: expected at least MIN_FONT={MIN_FONT} px; got {size}")
        extra = (' font-weight="bold"' if bold else "") + (' font-style="italic"' if italic else "")
        self.items.append(f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" '
                          f'fill="{self.t[colour]}"{extra}>{escape(pretty(words))}</text>')

    def box(self, x, y, w, h, role=None, dashed=False, rx=6, width=1.5, hollow=False):
        stroke = self.t[role] if role else self.t["muted"]
        fill = "none" if hollow else self.t[role + "_fill"] if role else self.t["plain_fill"]
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.items.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx}" '
                          f'fill="{fill}" stroke="{stroke}" stroke-width="{width}"{dash}/>')

    def labelled(self, x, y, w, h, lines, role=None, dashed=False):
        """A box with one to three centred lines: the first at FONT, the rest at MIN_FONT."""
        for i, line in enumerate(lines):
            if text_width(pretty(line), FONT if i == 0 else MIN_FONT) > w - 6:
                raise ValueError(f"lines: {line!r} is wider than its {w:g} px box")
        self.box(x, y, w, h, role, dashed)
        step = 17
        top = y + h / 2 - step * (len(lines) - 1) / 2 + 5
        for i, line in enumerate(lines):
            self.text(x + w / 2, top + i * step, line, FONT if i == 0 else MIN_FONT,
                      colour="ink" if i == 0 else "muted")

    def arrow(self, x1, y1, x2, y2, colour="muted", dashed=False):
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.items.append(f'<path d="M{x1:g},{y1:g} L{x2:g},{y2:g}" stroke="{self.t[colour]}" '
                          f'stroke-width="1.6" fill="none" marker-end="url(#arrow-{colour})"{dash}/>')

    def path(self, d, colour="muted", arrow=True, width=1.6):
        end = f' marker-end="url(#arrow-{colour})"' if arrow else ""
        self.items.append(f'<path d="{d}" stroke="{self.t[colour]}" stroke-width="{width}" '
                          f'fill="none"{end}/>')

    def svg(self, title: str, desc: str, height: float) -> str:
        markers = "".join(
            f'<marker id="arrow-{c}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            f'fill="{self.t[c]}"/></marker>' for c in ("muted", "ink", "comm", "attn", "mlp"))
        height = int(np.ceil(height))
        return "\n".join([
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" aria-labelledby="d-title d-desc" '
            'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
            f'<title id="d-title">{escape(title)}</title>',
            f'<desc id="d-desc">{escape(desc)}</desc>',
            f"<defs>{markers}</defs>",
            f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="{self.t["bg"]}"/>',
            *self.items, "</svg>", ""])


def _shape(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ")"


def _kib(n: int) -> str:
    return f"{n / 2**10:g} KiB"


# ---- 1. the block sharded over P ranks (many_devices) --------------------------------------------
#: the many_devices chapter's block and split: its default BlockConfig over two ranks
TP_CONFIG, TP_WORLD = BlockConfig(), 2
# a sublayer's entry and exit (preln.parallel.tensor._Parts.enter / leave and their backwards)
ENTER = ("forward: identity · SP: all-gather", "backward: all-reduce · SP: reduce-scatter")
LEAVE = ("forward: all-reduce · SP: reduce-scatter", "backward: identity · SP: all-gather")


def tensor_parallel_parts(config=TP_CONFIG, world=TP_WORLD):
    """{parameter: (full shape, one rank's shape, how it is split)} from shard_params itself."""
    block = TransformerBlock(config, dtype=np.float64, seed=0)
    shard = shard_params(block, block.params, world, 0)
    parts = {}
    for k, w in block.params.items():
        how = ("replicated" if k in replicated(block) else
               "column parallel" if shard[k].shape[0] < w.shape[0] else "row parallel")
        parts[k] = (w.shape, shard[k].shape, how)
    return parts


def _tensor_parallel(c: Canvas):
    cfg, P = TP_CONFIG, TP_WORLD
    parts = tensor_parallel_parts(cfg, P)
    H, F = cfg.n_heads, cfg.d_ff
    lane_w, gap, x0 = (WIDTH - 20 - 10 * (P - 1)) / P, 10, 10
    lanes = [x0 + r * (lane_w + gap) for r in range(P)]
    full_w = WIDTH - 20
    y = 10

    def whole(lines, role=None, h=44):
        nonlocal y
        c.labelled(x0, y, full_w, h, lines, role)
        c.arrow(WIDTH / 2, y + h, WIDTH / 2, y + h + 14)
        y += h + 14

    def collective(forward, backward):
        nonlocal y
        c.labelled(x0, y, full_w, 44, [forward, backward], "comm")
        y += 44

    def fan():                          # one arrow down each rank's lane
        nonlocal y
        for lx in lanes:
            c.arrow(lx + lane_w / 2, y, lx + lane_w / 2, y + 14)
        y += 14

    def sublayer(rows, role):
        """rows: [(lines per rank)] -> boxes in each rank's lane."""
        nonlocal y
        for r, lx in enumerate(lanes):
            yy = y
            for i, lines_of in enumerate(rows):
                lines = lines_of(r)
                h = 26 + 17 * (len(lines) - 1)
                c.labelled(lx, yy, lane_w, h, lines, role)
                yy += h
                if i < len(rows) - 1:
                    c.arrow(lx + lane_w / 2, yy, lx + lane_w / 2, yy + 12)
                    yy += 12
        y = yy

    def weight(name, label):
        full, one, how = parts[name]
        return lambda r: [f"{label} {_shape(one)}", how]

    def span(r, n, what):               # rank r's share of n heads or units
        k = n // P
        return f"{what} {r * k}–{(r + 1) * k - 1}"

    for r, lx in enumerate(lanes):
        c.text(lx + lane_w / 2, y + 14, f"rank {r}", bold=True)
    y += 24
    whole(["x: (B, S, D) on every rank", "sequence parallel (SP): (B, S/P, D)"])
    sublayers = [
        ("LN₁", "attn", [weight("self_attn.in_proj_weight", "W_in rows"),
                         lambda r: [span(r, H, "heads") + f" of {H}", f"dₕ = {cfg.d_head}"],
                         weight("self_attn.out_proj.weight", "W_out cols")],
         ["x₁ = x + a + b_out", "b_out replicated, added once after the sum"]),
        ("LN₂", "mlp", [weight("linear1.weight", "W₁ rows"),
                        lambda r: ["GELU, " + span(r, F, "units"), f"of F = {F}"],
                        weight("linear2.weight", "W₂ cols")],
         ["y = x₁ + z + b₂", "(B, S, D) · SP: (B, S/P, D)"])]
    for k, (norm, role, rows, residual) in enumerate(sublayers):
        whole([f"{norm}, on every rank", "γ, β replicated"], "norm")
        collective(*ENTER)
        fan()
        sublayer(rows + [lambda r: ["partial sum", "(B, S, D)"]], role)
        fan()
        collective(*LEAVE)
        c.arrow(WIDTH / 2, y, WIDTH / 2, y + 14)
        y += 14
        if k < len(sublayers) - 1:
            whole(residual)
        else:
            c.labelled(x0, y, full_w, 44, residual)
            y += 54
    split = "; ".join(f"{k} {_shape(f)} to {_shape(o)} per rank, {how}"
                      for k, (f, o, how) in parts.items())
    desc = (f"The Pre-LN block split over P = {P} ranks (tensor parallel, D = {cfg.d_model}, "
            f"H = {H}, F = {F}). Each rank holds H/P whole heads and F/P hidden units: the first "
            "matrix of each sublayer is split by its output units (column parallel), the second by "
            "its input units (row parallel); each rank's output is a partial sum, added by one "
            "all-reduce per sublayer, after which the bias and the residual are added on every "
            "rank. With sequence parallel, the norms and residuals run on S/P positions, the "
            "sublayer's input is all-gathered along S and its output reduce-scattered along S. "
            f"Parameters: {split}.")
    return "The Pre-LN block sharded over two ranks", desc, y


# ---- 2. the shape flow, box area proportional to bytes (shape_flow) -------------------------------
#: the shape_flow chapter's case: the default block, B = 2, S = 128, float32, training
FLOW_CONFIG, FLOW_B, FLOW_S = BlockConfig(d_model=64, n_heads=4, d_ff=256), 2, 128
#: the largest box's side, px; the others scale by the square root of their bytes
FLOW_MAX_SIDE = 92
FLOW_ROW_MIN = 36

_PRETTY = [("W_in^T", "Wᵢₙᵀ"), ("W_out^T", "W_outᵀ"), ("W_1^T", "W₁ᵀ"), ("W_2^T", "W₂ᵀ"),
           ("b_in", "bᵢₙ"), ("b_1", "b₁"), ("b_2", "b₂"), ("k^T", "kᵀ"), ("sqrt(d_h)", "√dₕ"),
           ("h1", "h₁"), ("h2", "h₂"), ("x1", "x₁"), ("LN(x)", "LN₁(x)"), ("LN(x₁)", "LN₂(x₁)"),
           ("W_in", "Wᵢₙ"), ("W_out", "Wₒᵤₜ"), ("b_out", "bₒᵤₜ"), ("d_h", "dₕ"), (" * ", " · ")]


def pretty(equation: str) -> str:
    """An equation of shapes.OpRow in the book's notation (subscripts, superscript T, √)."""
    for a, b in _PRETTY:
        equation = equation.replace(a, b)
    return equation


def _grows_with_s2(shape, S) -> bool:
    return len(shape) == 4 and shape[-1] == S and shape[-2] == S


def _shape_flow(c: Canvas):
    flow = shape_flow(FLOW_CONFIG, FLOW_B, FLOW_S)
    largest = max(r.out_bytes for r in flow.rows)
    scale = FLOW_MAX_SIDE / np.sqrt(largest)
    y, x_box, x_text = 10, 10, 20 + FLOW_MAX_SIDE
    c.text(10, y + 14, "area ∝ bytes the op writes", anchor="start", bold=True)
    c.text(10, y + 60, f"B = {FLOW_B}, S = {FLOW_S}, D = {FLOW_CONFIG.d_model}, "
                       f"H = {FLOW_CONFIG.n_heads}, F = {FLOW_CONFIG.d_ff}, float32",
           anchor="start", size=MIN_FONT, colour="muted")
    for i, (role, words) in enumerate((("comm", "grows with S²"), ("attn", "grows with S"))):
        c.box(266, y + 2 + 20 * i, 14, 14, role, rx=2)
        c.text(286, y + 14 + 20 * i, words, anchor="start", size=MIN_FONT)
    y += 74
    for r in flow.rows:
        shape = r.output
        side = float(scale * np.sqrt(r.out_bytes)) if r.out_bytes else 0.0
        row_h = max(side, FLOW_ROW_MIN)
        if side:
            role = "comm" if _grows_with_s2(shape, FLOW_S) else "attn"
            c.box(x_box + (FLOW_MAX_SIDE - side) / 2, y + (row_h - side) / 2, side, side, role, rx=2)
        else:
            c.box(x_box + FLOW_MAX_SIDE / 2 - 12, y + row_h / 2 - 12, 24, 24, dashed=True, rx=2)
        mid = y + row_h / 2
        c.text(x_text, mid - 3, pretty(r.equation), anchor="start")
        size = _kib(r.out_bytes) if r.out_bytes else "a view: no bytes"
        outs = _shape(shape) + (f" ×{len(r.outputs)}" if len(r.outputs) > 1 else "")
        c.text(x_text, mid + 14, f"{outs} · {size}", anchor="start", size=MIN_FONT, colour="muted")
        y += row_h + 8
    big = [r for r in flow.rows if _grows_with_s2(r.output, FLOW_S)]
    desc = (f"One Pre-LN forward (B = {FLOW_B}, S = {FLOW_S}, D = {FLOW_CONFIG.d_model}, "
            f"H = {FLOW_CONFIG.n_heads}, F = {FLOW_CONFIG.d_ff}, float32), one square per op, in "
            "order, its area proportional to the bytes the op writes: "
            + "; ".join(f"{pretty(r.equation)}: {_shape(r.output)}, "
                        f"{_kib(r.out_bytes) if r.out_bytes else 'a view'}" for r in flow.rows)
            + ". The largest squares are " + " and ".join(pretty(r.equation) for r in big)
            + f", the (B, H, S, S) scores and probabilities, which grow with S².")
    return "Every tensor of the block's forward, drawn to scale by its bytes", desc, y + 2


# ---- 3. multi-head attention's insides (derivation_ops_attention) ---------------------------------
#: the package's default block (H heads of d_h = D / H)
MHA_CONFIG = BlockConfig()
#: at most this many head lanes are drawn (the rest are "…")
MHA_MAX_LANES = 4


def _attention(c: Canvas):
    cfg = MHA_CONFIG
    D, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    rows = {r.name: r for r in shape_flow(cfg, 1, 1).rows}     # the op order and its equations
    y, x0, full = 10, 10, WIDTH - 20

    def step(lines, role=None, h=44):
        nonlocal y
        c.labelled(x0, y, full, h, lines, role)
        c.arrow(WIDTH / 2, y + h, WIDTH / 2, y + h + 16)
        y += h + 16

    c.text(WIDTH / 2, y + 14, f"D = {D}, H = {H} heads of dₕ = D / H = {dh}", colour="muted",
           size=MIN_FONT)
    y += 26
    step(["h₁ = LN₁(x): (B, S, D)"])
    step([pretty(rows["attn.in_proj"].equation), "(B, S, 3D): one product for q, k, v"], "attn")
    step(["split heads: a reshape, no arithmetic", "q, k, v: 3 × (B, H, S, dₕ)"])
    lanes = min(H, MHA_MAX_LANES)
    shown = list(range(lanes)) if H <= MHA_MAX_LANES else list(range(lanes - 1))
    gap = 8
    lw = (full - gap * (lanes - 1)) / lanes
    labels = [("qⱼ kⱼᵀ / √dₕ", "(S, S)", "attn"), ("+ mask", "−∞ hides", None),
              ("softmax", "per row", "attn"), ("· vⱼ", "(S, dₕ)", "attn")]
    top = y
    for i in range(lanes):
        lx = x0 + i * (lw + gap)
        yy = top
        if i == len(shown):                       # more heads than lanes: the last lane is "…"
            c.text(lx + lw / 2, yy + 120, "…", size=FONT * 2)
            c.text(lx + lw / 2, yy + 150, f"heads {len(shown) + 1}–{H}", size=MIN_FONT)
            continue
        c.text(lx + lw / 2, yy + 14, f"head {shown[i] + 1}", bold=True)
        yy += 24
        for j, (first, second, role) in enumerate(labels):
            c.labelled(lx, yy, lw, 42, [first, second], role, dashed=role is None)
            yy += 42
            if j < len(labels) - 1:
                c.arrow(lx + lw / 2, yy, lx + lw / 2, yy + 12)
                yy += 12
        c.arrow(lx + lw / 2, yy, lx + lw / 2, yy + 16)
    y = top + 24 + 4 * 42 + 3 * 12 + 16
    step(["merge (concat) heads: (B, S, D)", "head j: columns j·dₕ to (j+1)·dₕ − 1"])
    c.labelled(x0, y, full, 44, [pretty(rows["attn.out_proj"].equation),
                                 "(B, S, D): W_out mixes the heads"], "attn")
    y += 54
    desc = (f"Multi-head attention for D = {D} and H = {H} heads of d_h = {dh}: the normed "
            "input h, (B, S, D), goes through one product with W_in to q, k and v, (B, S, 3D); "
            "splitting the heads reshapes them to three (B, H, S, d_h) arrays. Each head j then "
            "computes its scores q_j k_j^T / sqrt(d_h), (S, S), adds the mask (minus infinity "
            "where a key is hidden), takes the softmax of each row and multiplies by v_j, (S, d_h). "
            "Merging the heads concatenates them back to (B, S, D), and W_out mixes them into the "
            "output a, (B, S, D).")
    return "Inside multi-head attention", desc, y


# ---- 6. GPT-style and Llama-style blocks side by side (modern_block) ------------------------------
#: the modern_block chapter's two blocks
GPT_CONFIG = BlockConfig(d_model=64, n_heads=8, d_ff=256, causal=True)
LLAMA_CONFIG = LlamaConfig(d_model=64, n_heads=8, n_kv_heads=2, d_ff=176)


def _n_params(block) -> int:
    return sum(int(v.size) for v in block.params.values())


def _gpt_vs_llama(c: Canvas):
    g, m = GPT_CONFIG, LLAMA_CONFIG
    n_g, n_m = _n_params(TransformerBlock(g, seed=0)), _n_params(LlamaBlock(m, seed=0))
    cols = [("GPT-style (Pre-LN)", n_g,
             [(["LayerNorm", "− mean, ÷ std, γ, β"], "norm"),
              ([f"attention, H = {g.n_heads}", f"{g.n_heads} k, v heads", "biases"], "attn"),
              (["LayerNorm", "− mean, ÷ std, γ, β"], "norm"),
              ([f"MLP {g.d_model}→{g.d_ff}→{g.d_model}", "GELU · bias"], "mlp")]),
            ("Llama-style", n_m,
             [(["RMSNorm", "÷ rms, γ"], "norm"),
              ([f"attention, H = {m.n_heads}", f"GQA: {m.n_kv_heads} k, v heads",
                "RoPE on q, k"], "attn"),
              (["RMSNorm", "÷ rms, γ"], "norm"),
              ([f"SwiGLU {m.d_model}→{m.d_ff}→{m.d_model}", "SiLU(gate) ⊙ up"], "mlp")])]
    gap = 16
    cw = (WIDTH - 20 - gap) / 2
    bottom = 0
    for i, (name, n, boxes) in enumerate(cols):
        x = 10 + i * (cw + gap)
        bx, bw = x + 22, cw - 22                  # the residual line runs left of the boxes
        cx = bx + bw / 2
        c.text(x + cw / 2, 24, name, bold=True)
        c.text(x + cw / 2, 44, f"{n:,} parameters", size=MIN_FONT, colour="muted")
        y = 58
        c.text(cx, y + 14, "x (B, S, D)", italic=True)
        y += 22
        for j, (lines, role) in enumerate(boxes):
            if j % 2 == 0:                        # a sublayer starts: the residual branches off
                start = y + 4
                c.path(f"M{cx:g},{start:g} H{x + 8:g}", arrow=False)
            c.arrow(cx, y, cx, y + 14)
            y += 14
            h = 44 + 17 * (len(lines) - 2)
            c.labelled(bx, y, bw, h, lines, role)
            y += h
            if j % 2 == 1:                        # ... and joins again
                c.arrow(cx, y, cx, y + 14)
                y += 14
                c.items.append(f'<circle cx="{cx:g}" cy="{y + 11:g}" r="11" fill="{c.t["bg"]}" '
                               f'stroke="{c.t["muted"]}" stroke-width="1.5"/>')
                c.text(cx, y + 16, "+", size=FONT)
                c.path(f"M{x + 8:g},{start:g} V{y + 11:g} H{cx - 12:g}")
                y += 22
        c.arrow(cx, y, cx, y + 14)
        c.text(cx, y + 30, "y (B, S, D)", italic=True)
        bottom = max(bottom, y + 40)
    desc = (f"Two blocks side by side, both Pre-LN with two residual connections. GPT-style "
            f"({n_g:,} parameters, D = {g.d_model}): LayerNorm, multi-head attention with "
            f"H = {g.n_heads} query, key and value heads and biases, LayerNorm, an MLP "
            f"{g.d_model} to {g.d_ff} to {g.d_model} with GELU and biases. Llama-style "
            f"({n_m:,} parameters): RMSNorm, grouped-query attention with H = {m.n_heads} query "
            f"heads sharing {m.n_kv_heads} key and value heads, RoPE applied to queries and keys, "
            f"RMSNorm, a SwiGLU MLP {m.d_model} to {m.d_ff} to {m.d_model}, no biases.")
    return "A GPT-style and a Llama-style block side by side", desc, bottom


# ---- 4. the block's graph and the backward's order (derivation_block) -----------------------------
#: the derivation chapter's block: Pre-LN, plain attention (its rows name every intermediate)
GRAPH_CONFIG = BlockConfig()
# what each op's backward produces besides the gradient of its input: its parameters' gradients
_PARAM_GRADS = {"norm": "∂γ, ∂β", "attn.in_proj": "∂W, ∂b", "attn.out_proj": "∂W, ∂b",
                "mlp.linear": "∂W, ∂b", "residual": "to both", "attn.split": "reshape",
                "attn.merge": "reshape"}


def block_graph(config=GRAPH_CONFIG):
    """(rows, edges, sums): the forward ops of shape_flow in order; edges (from row or -1 for the
    input x, to row, the tensor's name); sums {row: name}: where the backward adds the gradients
    of a tensor that fed two ops (at its first consumer, the last the backward reaches)."""
    rows = shape_flow(config, 1, 1, training=True, attention="plain").rows
    made = {"x": -1}
    edges, consumers = [], {}
    for i, r in enumerate(rows):
        for name, _ in r.inputs:
            if name in made:
                edges.append((made[name], i, name))
                # a tensor is its name and the op that made it (merge writes a new o)
                consumers.setdefault((made[name], name), []).append(i)
        for name, _ in r.outputs:
            made[name] = i
    sums = {min(cs): name for (_, name), cs in consumers.items() if len(cs) > 1}
    return rows, edges, sums


def _block_graph(c: Canvas):
    rows, edges, sums = block_graph()
    n = len(rows)
    bx, bw, rh, gap = 62, 200, 30, 12
    circle_x, note_x = bx + bw + 24, bx + bw + 42
    top = 62
    ys = {i: top + i * (rh + gap) for i in range(n)}
    c.text(bx + bw / 2, 20, "forward ↓", bold=True)
    c.text(circle_x + 40, 20, "backward ↑", bold=True)
    c.text(WIDTH - 6, 38, "step, and what it adds", size=MIN_FONT, anchor="end",
           colour="muted")
    c.text(bx + bw / 2, 44, "x (B, S, D)", italic=True)
    ys[-1] = 28
    lanes = {}
    for src, dst, name in edges:
        y0 = ys[src] + (rh if src >= 0 else 22)
        if dst == src + 1 or src == -1 and dst == 0:
            c.arrow(bx + bw / 2, y0, bx + bw / 2, ys[dst])
            continue
        lane = lanes.setdefault(name, 48 - 16 * len(lanes))    # one lane per skipping tensor
        start = (bx, y0 - rh / 2) if src >= 0 else (bx + bw / 2 - 52, y0 - 6)
        c.path(f"M{start[0]:g},{start[1]:g} H{lane:g} "
               f"V{ys[dst] + rh / 2:g} H{bx:g}", colour="muted")
        c.text(lane + 3, ys[dst] + rh / 2 - 5, name, size=MIN_FONT, anchor="start",
               colour="muted", italic=True)
    for i, r in enumerate(rows):
        role = ("attn" if r.name.startswith("attn") else "mlp" if r.name.startswith("mlp")
                else "norm" if r.name.startswith("norm") else None)
        c.labelled(bx, ys[i], bw, rh, [r.equation], role)
        step = n - i
        c.items.append(f'<circle cx="{circle_x:g}" cy="{ys[i] + rh / 2:g}" r="11" '
                       f'fill="{c.t["comm_fill"]}" stroke="{c.t["comm"]}" stroke-width="1.5"/>')
        c.text(circle_x, ys[i] + rh / 2 + 5, str(step), size=MIN_FONT)
        if i < n - 1:
            c.arrow(circle_x, ys[i + 1] + rh / 2 - 12, circle_x, ys[i] + rh / 2 + 12, colour="comm")
        note = next((v for k, v in _PARAM_GRADS.items() if r.name.startswith(k)), "")
        if i in sums:
            note = (note + ", " if note else "") + "+ d" + sums[i]
        if note:
            c.text(note_x, ys[i] + rh / 2 + 5, note, size=MIN_FONT, anchor="start")
    c.text(circle_x, ys[n - 1] + rh + 24, "dy", italic=True)
    c.arrow(circle_x, ys[n - 1] + rh + 10, circle_x, ys[n - 1] + rh / 2 + 12, colour="comm")
    height = ys[n - 1] + rh + 34
    desc = ("The Pre-LN block's forward as a graph of its " + str(n) + " ops, top to bottom: "
            + "; ".join(pretty(r.equation) for r in rows)
            + ". Skip edges carry "
            + ", ".join(sorted({nm for s, d, nm in edges if d != s + 1 and s != -1}))
            + " past the ops between. The backward runs the same ops bottom to top, step 1 at the "
            "last op; each Linear adds its weight and bias gradients, each LayerNorm its gamma "
            "and beta gradients, each residual add passes its gradient to both terms, and "
            + " and ".join(f"at step {n - i} the two gradients of {nm} are summed"
                           for i, nm in sorted(sums.items())) + ".")
    return "The block's graph, forward and backward", desc, height


# ---- 5. the paged KV cache, grouped-query heads, prefill and decode (inference_serving) -----------
#: the scenario: a small causal LM served by ContinuousBatcher; (prompt length, new tokens,
#: arrival step) per request, a pool of PAGED_BLOCKS blocks of PAGED_BLOCK_SIZE positions
PAGED_REQUESTS = ((6, 4, 0), (3, 5, 1), (5, 3, 3))
PAGED_BLOCKS, PAGED_BLOCK_SIZE = 8, 4
_SEQ_ROLES = ("attn", "mlp", "norm")
_SEQ_NAMES = "ABC"


def paged_scenario():
    """(steps, snapshot step, {rid: block table}, {rid: length}, blocks used) of a real
    ContinuousBatcher run; the tables are the cache's, replayed step by step with the scheduler's
    own order (reserve for the running, admit the new, commit, release the finished) up to the
    step with the most sequences running."""
    from preln.models.lm import LMConfig, TinyLM
    from preln.serve.paged import ContinuousBatcher, Request

    lm = TinyLM(LMConfig(vocab_size=16, max_len=16, d_model=8, n_heads=2, d_ff=16, n_layers=1),
                seed=0)
    rng = np.random.default_rng(0)
    reqs = [Request(rid=i, prompt=rng.integers(0, 16, n0), n_new=k, arrival=t)
            for i, (n0, k, t) in enumerate(PAGED_REQUESTS)]
    result = ContinuousBatcher(lm, PAGED_BLOCKS, PAGED_BLOCK_SIZE).run(reqs)
    if result.preemptions:
        raise RuntimeError("paged_scenario: expected a run without preemption")
    snap = max(result.steps, key=lambda st: len(st.running)).step
    cache = PagedKVCache(1, PAGED_BLOCKS, PAGED_BLOCK_SIZE, 1, 1)
    for st in result.steps[:snap + 1]:
        fresh = [r for r in st.running if r not in cache.tables]
        for r in st.running:
            if r in fresh:
                cache.add(r)
                cache.reserve(r, PAGED_REQUESTS[r][0])
                cache.commit(r, PAGED_REQUESTS[r][0])
            else:
                cache.reserve(r, 1)
                cache.commit(r, 1)
        if st.step < snap:
            for r in [r for r in st.running if result.finished_at[r] == st.step]:
                cache.remove(r)
    if cache.blocks_used != result.steps[snap].blocks_used:
        raise RuntimeError("paged_scenario: the replay disagrees with the batcher's record")
    return result.steps, snap, dict(cache.tables), dict(cache.lengths), cache.blocks_used


def _paged(c: Canvas):
    steps, snap, tables, lengths, used = paged_scenario()
    m = LLAMA_CONFIG
    first = {}
    for st in steps:
        for r in st.running:
            first.setdefault(r, st.step)
    # (1) the timeline
    y, x0 = 10, 70
    c.text(10, y + 14, "scheduler steps: prefill P, decode D", anchor="start", bold=True)
    y += 26
    cw = (WIDTH - x0 - 10) / len(steps)
    for st in steps:
        c.text(x0 + (st.step + 0.5) * cw, y + 12, str(st.step), size=MIN_FONT, colour="muted")
    y += 18
    for r in sorted(first):
        c.text(10, y + 18, f"seq {_SEQ_NAMES[r]}", anchor="start", size=MIN_FONT)
        for st in steps:
            if r in st.running:
                prefill = st.step == first[r]
                c.box(x0 + st.step * cw + 1, y + 2, cw - 2, 24, _SEQ_ROLES[r], rx=3,
                      dashed=not prefill)
                c.text(x0 + (st.step + 0.5) * cw, y + 19, "P" if prefill else "D", size=MIN_FONT,
                       bold=prefill)
        y += 28
    c.box(x0 + snap * cw - 1, 52, cw + 2, y - 50, rx=3, width=2.5, hollow=True)   # the snapshot
    y += 14
    # (2) the block tables at the marked step, and (3) the pool
    c.text(10, y + 14, f"after step {snap}: block tables → pool", anchor="start", bold=True)
    y += 28
    cell, gw = 30, (WIDTH - 20) / len(tables)        # one group per sequence, side by side
    table_pos = {}
    for k, r in enumerate(sorted(tables)):
        gx = 10 + k * gw
        c.text(gx, y + 14, f"seq {_SEQ_NAMES[r]}: {lengths[r]} tokens", anchor="start", size=MIN_FONT)
        for j, b in enumerate(tables[r]):
            x = gx + j * (cell + 4)
            c.labelled(x, y + 22, cell, 26, [str(b)], _SEQ_ROLES[r])
            table_pos[b] = (x + cell / 2, y + 48, r)
    y += 48 + 44
    pw = (WIDTH - 20) / PAGED_BLOCKS
    owner = {b: r for r, bs in tables.items() for b in bs}
    for b in range(PAGED_BLOCKS):
        x = 10 + b * pw
        r = owner.get(b)
        c.box(x + 2, y, pw - 4, 46, _SEQ_ROLES[r] if r is not None else None, rx=3,
              dashed=r is None)
        c.text(x + pw / 2, y + 18, str(b), size=MIN_FONT, bold=True)
        if r is not None:                         # the positions this block holds
            held = min(PAGED_BLOCK_SIZE, lengths[r] - tables[r].index(b) * PAGED_BLOCK_SIZE)
            slot = (pw - 12) / PAGED_BLOCK_SIZE
            for k in range(PAGED_BLOCK_SIZE):
                fill = c.t[_SEQ_ROLES[r]] if k < held else c.t["bg"]
                c.items.append(f'<rect x="{x + 6 + k * slot:g}" y="{y + 28:g}" width="{slot - 2:g}" '
                               f'height="10" fill="{fill}" stroke="{c.t[_SEQ_ROLES[r]]}"/>')
            tx, ty, _ = table_pos[b]
            c.path(f"M{tx:g},{ty:g} L{x + pw / 2:g},{y - 2:g}", colour="muted", width=1)
        else:
            c.text(x + pw / 2, y + 36, "free", size=MIN_FONT, colour="muted")
    y += 52
    c.text(10, y + 14, f"pool: {PAGED_BLOCKS} blocks of {PAGED_BLOCK_SIZE} positions, "
                       f"{used} in use", anchor="start", size=MIN_FONT, colour="muted")
    y += 34
    # (4) grouped-query attention: which key/value head each query head reads
    H, Hkv = m.n_heads, m.n_kv_heads
    group = H // Hkv
    c.text(10, y + 14, f"each block: k, v of H_kv = {Hkv} heads", anchor="start", bold=True)
    c.text(10, y + 32, f"GQA: query head h reads kv head h // {group}", anchor="start",
           size=MIN_FONT, colour="muted")
    y += 46
    qx = [10 + (WIDTH - 20) * (h + 0.5) / H for h in range(H)]
    kx = [10 + (WIDTH - 20) * (g + 0.5) / Hkv for g in range(Hkv)]
    for h in range(H):
        c.items.append(f'<circle cx="{qx[h]:g}" cy="{y + 12:g}" r="11" fill="{c.t["attn_fill"]}" '
                       f'stroke="{c.t["attn"]}" stroke-width="1.5"/>')
        c.text(qx[h], y + 17, f"q{h}", size=MIN_FONT)
        c.path(f"M{qx[h]:g},{y + 24:g} L{kx[h // group]:g},{y + 63:g}", colour="muted",
               arrow=False)
    for g in range(Hkv):
        c.labelled(kx[g] - 45, y + 64, 90, 26, [f"k{g}, v{g}"], "kv")
    y += 100
    desc = (f"Three sequences served by continuous batching with a paged KV cache of "
            f"{PAGED_BLOCKS} blocks of {PAGED_BLOCK_SIZE} positions. Timeline: "
            + "; ".join(f"sequence {_SEQ_NAMES[r]} prefills its prompt at step {first[r]} and "
                        f"decodes one token per step until step "
                        f"{max(st.step for st in steps if r in st.running)}" for r in sorted(first))
            + f". After step {snap} the block tables are: "
            + "; ".join(f"sequence {_SEQ_NAMES[r]}, {lengths[r]} tokens, blocks "
                        + ", ".join(map(str, tables[r])) for r in sorted(tables))
            + f"; {used} of {PAGED_BLOCKS} blocks are in use, the others free. Each block holds "
            f"the keys and values of the H_kv key/value heads; with grouped-query attention "
            f"(H = {H} query heads, H_kv = {Hkv}) query head h reads key/value head h // {group}.")
    return "A paged KV cache: timeline, block tables and pool", desc, y


# ---- the registry --------------------------------------------------------------------------------
class Diagram(NamedTuple):
    chapter: str                                  # the notebook the diagram belongs in
    draw: Callable                                # Canvas -> (title, desc, height)


#: every diagram by name: the chapter it belongs in and how it is drawn
DIAGRAMS: dict[str, Diagram] = {
    "tensor_parallel": Diagram("many_devices", _tensor_parallel),
    "shape_flow": Diagram("shape_flow", _shape_flow),
    "attention_heads": Diagram("derivation_ops_attention", _attention),
    "block_graph": Diagram("derivation_block", _block_graph),
    "paged_kv_cache": Diagram("inference_serving", _paged),
    "gpt_vs_llama": Diagram("modern_block", _gpt_vs_llama),
}


def render(name: str, mode: str = "light") -> str:
    """Diagram ``name`` in theme ``mode`` ("light" or "dark"), as an SVG document."""
    if name not in DIAGRAMS:
        raise ValueError(f"name: expected one of {sorted(DIAGRAMS)}; got {name!r}")
    if mode not in THEMES:
        raise ValueError(f"mode: expected one of {sorted(THEMES)}; got {mode!r}")
    canvas = Canvas(THEMES[mode])
    title, desc, height = DIAGRAMS[name].draw(canvas)
    return canvas.svg(title, desc, height)


def write_all(folder) -> list[Path]:
    """Write every diagram in both themes into ``folder``; a file whose bytes would not change is
    left alone (so Sphinx does not rebuild the pages that show it). Returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in DIAGRAMS:
        for mode in THEMES:
            path = folder / file_name(name, mode)
            svg = render(name, mode)
            if not path.is_file() or path.read_text(encoding="utf-8") != svg:
                path.write_text(svg, encoding="utf-8")
            paths.append(path)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m preln.chapters.diagrams FOLDER")
    for p in write_all(sys.argv[1]):
        print(p)
