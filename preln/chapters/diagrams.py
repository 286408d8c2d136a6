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

import re
import sys
from html import escape
from pathlib import Path
from typing import Callable, NamedTuple

import ml_dtypes
import numpy as np

from preln.chapters.parallel import gpipe_train_schedule, one_f_one_b_schedule
from preln.chapters.shapes import shape_flow
from preln.chapters.viz import PALETTE, contrast_ratio
from preln.nn.block import TransformerBlock
from preln.nn.config import BlockConfig
from preln.gguf.file import BLOCK, BLOCK_BYTES, permute_qk
from preln.nn.llama import LlamaBlock, LlamaConfig
from preln.ops.attention import K_TILE, Q_TILE, tile_pairs
from preln.parallel.tensor import replicated, shard_params
from preln.quant.int8 import SCHEME_OPTIONS, int32_max_terms, qmax
from preln.serve.paged import PagedKVCache

__all__ = ["DIAGRAMS", "THEMES", "Diagram", "render", "write_all", "WIDTH", "MIN_FONT",
           "PHONE_COLUMN_PX", "MIN_SHOWN_PX", "file_name", "alt", "pipeline_schedules", "PIPELINE_P",
           "PIPELINE_M"]

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
         ["x′ = x + a + b_out", "b_out replicated, added once after the sum"]),
        ("LN₂", "mlp", [weight("linear1.weight", "W₁ rows"),
                        lambda r: ["GELU, " + span(r, F, "units"), f"of F = {F}"],
                        weight("linear2.weight", "W₂ cols")],
         ["y = x′ + z + b₂", "(B, S, D) · SP: (B, S/P, D)"])]
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
           ("h1", "h₁"), ("h2", "h₂"), ("x1", "x′"), ("LN(x)", "LN₁(x)"), ("LN(x′)", "LN₂(x′)"),
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
    c.text(10, y + 14, f"each block: k, v of Hₖᵥ = {Hkv} heads", anchor="start", bold=True)
    c.text(10, y + 32, f"GQA: query head h reads kv head ⌊h/{group}⌋", anchor="start",
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
            f"the keys and values of the Hₖᵥ key/value heads; with grouped-query attention "
            f"(H = {H} query heads, Hₖᵥ = {Hkv}) query head h reads key/value head ⌊h/{group}⌋.")
    return "A paged KV cache: timeline, block tables and pool", desc, y


# ---- 7. the Pre-LN block at a glance (intro, front page) -----------------------------------------
#: the package's default block
BLOCK_CONFIG = BlockConfig()


def _preln_block(c: Canvas):
    cfg = BLOCK_CONFIG
    D, H, F = cfg.d_model, cfg.n_heads, cfg.d_ff
    line, bx, bw = 40, 120, WIDTH - 130      # the residual stream's x; the sublayers' boxes
    cx = bx + bw / 2
    c.text(line, 22, "x (B, S, D)", italic=True, anchor="start")
    c.text(WIDTH - 10, 22, f"D = {D}, H = {H}, F = {F}", size=MIN_FONT, anchor="end",
           colour="muted")
    y = 30
    sublayers = [("LN₁", "attn", ["multi-head attention", f"H = {H} heads of dₕ = {cfg.d_head}"],
                  "x′ = x + Attn(LN₁(x))"),
                 ("LN₂", "mlp", ["MLP", f"D → F = {F} → D, GELU"], "y = x′ + MLP(LN₂(x′))")]
    for norm, role, lines, total in sublayers:
        branch = y + 14
        c.path(f"M{line:g},{y:g} V{branch:g} H{cx:g} V{branch + 16:g}")       # to the sublayer
        top = branch + 18
        c.labelled(bx, top, bw, 44, [f"{norm}: LayerNorm", "per position: − mean, ÷ std, γ, β"],
                   "norm")
        c.arrow(cx, top + 44, cx, top + 58)
        c.labelled(bx, top + 60, bw, 44, lines, role)
        plus = top + 104 + 22
        c.path(f"M{cx:g},{top + 104:g} V{plus:g} H{line + 13:g}", colour=role)  # back, added
        c.arrow(line, branch, line, plus - 12)                                  # the skip
        c.text(line + 6, (branch + plus) / 2 + 5, "identity", size=MIN_FONT, anchor="start",
               colour="muted", italic=True)
        c.items.append(f'<circle cx="{line:g}" cy="{plus:g}" r="11" fill="{c.t["bg"]}" '
                       f'stroke="{c.t["ink"]}" stroke-width="1.5"/>')
        c.text(line, plus + 5, "+", size=FONT)
        c.text(line + 18, plus + 28, total, size=MIN_FONT, anchor="start")
        c.path(f"M{line:g},{plus + 11:g} V{plus + 34:g}", arrow=False)
        y = plus + 34
    c.arrow(line, y, line, y + 28)
    c.text(line + 18, y + 24, "y (B, S, D): the next block's x", italic=True, anchor="start")
    desc = (f"The Pre-LN block (here D = {D}, H = {H}, F = {F}). The input x, of shape (B, S, D), "
            "runs down the residual stream. It branches into LayerNorm 1 and multi-head attention "
            f"({H} heads of width {cfg.d_head}), whose output is added back to x, giving x′ = "
            "x + Attn(LN₁(x)), also (B, S, D). Then x′ branches into LayerNorm 2 and the MLP "
            f"(D to F = {F} to D with GELU), whose output is added back to x′, giving y. The "
            "residual stream itself passes each sublayer unchanged (an identity): no normalisation "
            "sits on it.")
    return "The Pre-LN block at a glance", desc, y + 38


# ---- 8. FlashAttention-1 and -2: the order of the tile loops (inference) -------------------------
#: the tiled path's own tile sizes (preln.ops.attention.Q_TILE, K_TILE) over FLASH_TILES key
#: tiles of a causal sequence
FLASH_KEY_TILES = 4


def flash_orders(causal=True):
    """(S, FlashAttention-2's order, FlashAttention-1's order): the (i0, i1, j0, j1) score tiles
    of a causal S x S attention, S = FLASH_KEY_TILES key tiles, in the order each visits them.
    The second is the package's own loop (tile_pairs: query tiles outer); the first has the
    loops swapped (key tiles outer), as in Dao et al. 2022's Algorithm 1."""
    S = FLASH_KEY_TILES * K_TILE
    fa2 = list(tile_pairs(S, S, Q_TILE, K_TILE, causal=causal))
    fa1 = sorted(fa2, key=lambda t: (t[2], t[0]))
    return S, fa2, fa1


def _flash(c: Canvas):
    S, fa2, fa1 = flash_orders()
    n_q, n_k = S // Q_TILE, S // K_TILE
    cw = 40                                   # a key tile's width; a query tile's height in scale
    rh = cw * Q_TILE / K_TILE
    left = 34                                 # room for the "q ↓" of the first panel
    gap = WIDTH - 20 - left - 2 * n_k * cw
    c.text(10, 24, f"causal S = {S}: score tiles of {Q_TILE} queries × {K_TILE} keys",
           anchor="start", size=MIN_FONT, colour="muted")
    panels = [("FlashAttention-1", "key tile j outer", fa1, "kv"),
              ("FlashAttention-2", "query tile i outer", fa2, "attn")]
    top = 100
    for p, (name, outer, order, role) in enumerate(panels):
        x0 = 10 + left + p * (n_k * cw + gap)
        cx = x0 + n_k * cw / 2
        c.text(cx, 50, name, bold=True)
        c.text(cx, 68, outer, size=MIN_FONT)
        c.text(cx, top - 8, "keys →", size=MIN_FONT, colour="muted")
        if p == 0:
            c.text(x0 - 8, top + 14, "q", size=MIN_FONT, anchor="end", colour="muted")
            c.text(x0 - 8, top + 31, "↓", size=MIN_FONT, anchor="end", colour="muted")
        step = {t: k + 1 for k, t in enumerate(order)}
        for i in range(n_q):
            for j in range(n_k):
                t = next((t for t in order if t[0] == i * Q_TILE and t[2] == j * K_TILE), None)
                x, y = x0 + j * cw, top + i * rh
                if t is None:                     # wholly above the diagonal: never visited
                    c.box(x, y, cw, rh, rx=0, dashed=True, width=0.8, hollow=True)
                else:
                    c.box(x, y, cw, rh, role, rx=0, width=1)
                    c.text(x + cw / 2, y + rh / 2 + 5, str(step[t]), size=MIN_FONT)
    y = top + n_q * rh + 26
    writes1, writes2 = len(fa1), n_q
    lines = [("FA-1: per tile, read and write Oᵢ, mᵢ, lᵢ", f"{writes1} writes of an O tile"),
             ("FA-2: Oᵢ stays on chip over its row", f"{writes2} writes, one per query tile")]
    for first, second in lines:
        c.text(10, y, first, anchor="start", size=MIN_FONT)
        c.text(WIDTH - 10, y + 18, second, anchor="end", size=MIN_FONT, colour="muted")
        y += 44
    desc = (f"The tiles of a causal attention's scores for S = {S}, in tiles of {Q_TILE} queries "
            f"by {K_TILE} keys ({n_q} query tiles, {n_k} key tiles; the {n_q * n_k - len(fa2)} "
            f"tiles wholly above the diagonal are masked and skipped), numbered in the order each "
            f"algorithm visits them. FlashAttention-1 runs over key tiles in its outer loop and "
            f"over query tiles inside, so it reads and writes each query tile's output and "
            f"softmax statistics once per tile: {writes1} writes of an output tile. "
            f"FlashAttention-2, the package's order, runs over query tiles outside and key tiles "
            f"inside: a query tile's output stays on chip until its row of tiles is done, "
            f"{writes2} writes in all, and query tiles are independent, so they split over "
            f"thread blocks.")
    return "FlashAttention-1 and -2: the order of the tile loops", desc, y


# ---- 9. GGUF's Q8_0 and Q4_1 blocks, and the q/k row order (real_model) -------------------------
#: a head width small enough to draw every row of the q/k permutation
PERMUTE_D_HEAD = 8


def _gguf(c: Canvas):
    n = BLOCK
    per_byte = (WIDTH - 20) / max(BLOCK_BYTES[t] for t in ("Q8_0", "Q4_1"))
    y = 10
    # the book's names: the scale Δ and Q4_1's minimum w_min (llama.cpp's d and m)
    kinds = [("Q8_0", [("Δ", 2, "comm"), (f"q₀ … q₃₁: {n} × int8", n, "attn")],
              "Δ: float16 · w = Δ · q, q in −128…127"),
             ("Q4_1", [("Δ", 2, "comm"), ("wₘᵢₙ", 2, "norm"),
                       (f"{n // 2} bytes: 2 codes each", n // 2, "mlp")],
              "Δ, wₘᵢₙ: float16 · w = Δ · q + wₘᵢₙ, q in 0…15")]
    for name, fields, rule in kinds:
        nbytes = BLOCK_BYTES[name]
        c.text(10, y + 16, f"{name}: {n} weights in {nbytes} bytes", anchor="start", bold=True)
        c.text(WIDTH - 10, y + 16, f"{8 * nbytes / n:g} bits/weight", anchor="end", size=MIN_FONT,
               colour="muted")
        y += 26
        x = 10
        for k, (words, size, role) in enumerate(fields):
            w = size * per_byte
            c.box(x, y, w, 30, role, rx=0)
            if size > 2:
                c.text(x + w / 2, y + 20, words, size=MIN_FONT)
            else:                               # a 2-byte field: named below it
                c.text(x + (w / 2 if k == 0 else 0), y + 46, words, size=MIN_FONT,
                       anchor="middle" if k == 0 else "start")
            x += w
        c.text(10, y + 66, rule, anchor="start", size=MIN_FONT, colour="muted")
        y += 82
    # one Q4_1 byte: the low nibble holds weight j, the high nibble weight j + 16
    c.text(10, y + 14, "Q4_1 byte j:", anchor="start", size=MIN_FONT)
    bw = 26
    for k in range(8):
        x = 116 + k * bw
        c.box(x, y, bw, 22, "mlp" if k >= 4 else "attn", rx=0, width=1)
        c.text(x + bw / 2, y + 16, str(7 - k), size=MIN_FONT, colour="muted")
    c.text(116 + 2 * bw, y + 40, f"weight j + {n // 2}", size=MIN_FONT)
    c.text(116 + 6 * bw, y + 40, "weight j", size=MIN_FONT)
    y += 66
    # the q/k rows of one head, transformers' order above, GGUF's below
    dh = PERMUTE_D_HEAD
    order = [int(r) for r in permute_qk(np.arange(dh), 1)]
    c.text(10, y + 14, f"q, k rows of one head (dₕ = {dh}):", anchor="start", bold=True)
    y += 24
    cell = (WIDTH - 20) / dh
    rows = (("transformers: pairs (i, i + dₕ/2)", list(range(dh))),
            ("GGUF: pairs (2i, 2i + 1)", order))
    ys = []
    for words, rs in rows:
        c.text(10, y + 14, words, anchor="start", size=MIN_FONT)
        y += 20
        for k, r in enumerate(rs):
            # the first half of the head's rows and the second, which rotate-half pairs
            c.labelled(10 + k * cell + 3, y, cell - 6, 26, [str(r)], "attn" if r < dh // 2 else "kv")
        ys.append(y)
        y += 26 + 46
    for k, r in enumerate(order):               # GGUF's position k holds transformers' row r
        c.path(f"M{10 + r * cell + cell / 2:g},{ys[0] + 27:g} L{10 + k * cell + cell / 2:g},"
               f"{ys[1] - 22:g}", width=1)
    y -= 30
    desc = (f"Two GGUF quantisation blocks of {n} weights. Q8_0: {BLOCK_BYTES['Q8_0']} bytes, a "
            f"float16 scale Δ then {n} int8 codes q, w = Δ q ({8 * BLOCK_BYTES['Q8_0'] / n:g} bits "
            f"per weight). Q4_1: {BLOCK_BYTES['Q4_1']} bytes, a float16 scale Δ and minimum w_min, then "
            f"{n // 2} bytes of two 4-bit codes each, the low nibble of byte j for weight j and the "
            f"high nibble for weight j + {n // 2}; w = Δ q + w_min "
            f"({8 * BLOCK_BYTES['Q4_1'] / n:g} bits per weight). Below, the rows of one query or key "
            f"head (d_h = {dh}): transformers orders them so that rotate-half pairs row i with row "
            f"i + d_h/2; the GGUF file (llama.cpp) stores them in the order "
            + ", ".join(map(str, order)) + ", so that RoPE's pairs are adjacent rows.")
    return "GGUF's Q8_0 and Q4_1 blocks and the q/k row order", desc, y


# ---- 10. INT8 matmuls: the pipeline, LLM.int8's split, SmoothQuant's migration (int8) -----------
#: a subscript with no Unicode character (w): drawn a little lower in a <tspan>, then back up
_SUB_W = re.compile(r"([sq])_w(.*?)</text>")


def _int8(c: Canvas):
    first = len(c.items)
    q = qmax(8)
    thr = SCHEME_OPTIONS["llm.int8"]["threshold"]
    alpha = SCHEME_OPTIONS["smoothquant"]["alpha"]
    y, x0, full = 10, 10, WIDTH - 20

    def head(words):
        nonlocal y
        c.text(x0, y + 16, words, anchor="start", bold=True)
        y += 26

    def step(lines, role=None, arrow=True):
        nonlocal y
        h = 26 + 17 * (len(lines) - 1)
        c.labelled(x0, y, full, h, lines, role)
        y += h
        if arrow:
            c.arrow(WIDTH / 2, y, WIDTH / 2, y + 12)
            y += 12

    half = (full - 10) / 2
    mids = (x0 + half / 2, x0 + 1.5 * half + 10)     # the centres of two boxes side by side

    def pair(left, right):
        """Two boxes side by side: (lines, role) each."""
        nonlocal y
        for x, (lines, role) in zip((x0, x0 + half + 10), (left, right)):
            c.labelled(x, y, half, 43, lines, role)
        y += 43

    def arrows(join):
        """Down from the pair's centres: straight (into a pair) or joining (into one box)."""
        nonlocal y
        for k, x in enumerate(mids):
            c.arrow(x, y, WIDTH / 2 + (16 * k - 8) if join else x, y + 12)
        y += 12

    head("W8A8: Y = X Wᵀ in integers")
    pair((["X float (N, K)", f"sₓ = max|x| / {q}"], "attn"),
         (["W float (M, K)", f"s_w = max|w| / {q}"], "mlp"))
    arrows(join=False)
    step([f"quantise: q = round(x / s), int8 in ±{q}", "one scale per row of X and of W"], "attn")
    step(["int8 matmul: Σₖ qₓ q_w in int32",
          f"exact for K ≤ {int32_max_terms(8):,} terms"], "kv")
    step(["rescale: Y = sₓ s_w · acc (float)"], "mlp", arrow=False)
    y += 20
    head("LLM.int8: outlier columns in float16")
    step([f"columns of X with some |x| ≥ {thr:g}"], "attn", arrow=False)
    arrows(join=False)
    pair((["the rest", "int8 matmul"], "kv"), (["outliers (few)", "float16 matmul"], "comm"))
    arrows(join=True)
    step(["Y = int8 part + float16 part"], "mlp", arrow=False)
    y += 20
    head(f"SmoothQuant: outliers moved into W, α = {alpha:g}")
    step([f"sⱼ = max|Xⱼ|ᵅ / max|Wⱼ|¹⁻ᵅ", "one factor per input column j"], "norm")
    pair((["X′ = X diag(s)⁻¹", "tamer: int8 fits"], "attn"),
         (["W′ = W diag(s)", "absorbs the scale"], "mlp"))
    arrows(join=True)
    step(["X′ W′ᵀ = X Wᵀ, then the W8A8 path"], "kv", arrow=False)
    y += 10
    sub = r'\1<tspan dy="4" font-size="%d">w</tspan><tspan dy="-4">\2</tspan></text>' % MIN_FONT
    for k in range(first, len(c.items)):            # s_w, q_w: w as a subscript
        c.items[k] = _SUB_W.sub(sub, c.items[k])
    desc = (f"Three panels. W8A8: the activations X, (N, K), and the weights W, (M, K), are each "
            f"quantised to int8, row by row, with a scale s = max|x| / {q} (q = round(x / s)); the int8 product "
            f"accumulates its K terms in int32, exact for K up to {int32_max_terms(8):,} terms, and "
            f"is rescaled to float by the product of the two scales. LLM.int8: the columns of X "
            f"where some value reaches |x| ≥ {thr:g} go through a float16 matmul with the matching "
            f"columns of W, the rest through the int8 path, and the two parts are added. "
            f"SmoothQuant: a factor sⱼ, max|Xⱼ| to the power α over max|Wⱼ| to the power 1 − α, "
            f"per input column j (α = {alpha:g}), divides X's column j and multiplies W's, which leaves the product "
            f"unchanged and moves the outliers from the activations into the weights, where int8 "
            f"handles them; then the W8A8 path runs.")
    return "INT8 matrix products: W8A8, LLM.int8 and SmoothQuant", desc, y


# ---- 11. floating-point formats' bit fields (precision) ------------------------------------------
#: the formats the precision chapter compares, by their ml_dtypes / numpy names
FLOAT_FORMATS = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


def float_fields(name: str):
    """(bits, exponent bits, mantissa bits, finfo) of a float format, from ml_dtypes.finfo."""
    f = ml_dtypes.finfo(getattr(ml_dtypes, name, None) or np.dtype(name))
    return int(f.bits), int(f.nexp), int(f.nmant), f


def _float_formats(c: Canvas):
    bit = (WIDTH - 20) / 32
    y = 10
    fields = (("sign", "comm"), ("exponent", "attn"), ("mantissa", "mlp"))
    x = 10
    for words, role in fields:                  # the key: one colour per field
        c.box(x, y + 3, 14, 14, role, rx=0)
        c.text(x + 20, y + 15, words, anchor="start", size=MIN_FONT)
        x += 30 + text_width(words, MIN_FONT)
    c.text(WIDTH - 10, y + 15, "one cell per bit", anchor="end", size=MIN_FONT, colour="muted")
    y += 30
    described = []
    for name in FLOAT_FORMATS:
        bits, e, m, f = float_fields(name)
        c.text(10, y + 14, name, anchor="start", bold=True)
        c.text(WIDTH - 10, y + 14, f"max {_sci(float(f.max))} · ε {_sci(float(f.eps))}",
               anchor="end", size=MIN_FONT, colour="muted")
        y += 22
        x = 10
        for size, (_, role) in zip((1, e, m), fields):
            c.box(x, y, size * bit, 22, role, rx=0, width=1.2)
            for k in range(1, size):            # the bits, as thin dividers
                c.path(f"M{x + k * bit:g},{y + 4:g} V{y + 18:g}", colour=role, arrow=False,
                       width=0.6)
            c.text(x + size * bit / 2, y + 38, str(size), size=MIN_FONT)
            x += size * bit
        y += 50
        described.append(f"{name}: {bits} bits, 1 sign, {e} exponent, {m} mantissa; largest "
                         f"{float(f.max):.4g}, machine epsilon {float(f.eps):.4g}")
    desc = ("Bit fields of five floating-point formats, one cell per bit at the same scale: "
            + "; ".join(described) + ". bfloat16 keeps float32's exponent and so its range, with "
            "fewer mantissa bits; float16 has more mantissa bits and a much smaller range.")
    return "Floating-point formats: sign, exponent and mantissa bits", desc, y


def _sci(v: float) -> str:
    """A number as the diagrams print it: 65,504, 448, 0.125, 3.4 × 10³⁸, 1.2 × 10⁻⁷."""
    if 1 <= abs(v) < 1e6 and v == int(v):
        return f"{int(v):,}"
    if 1e-2 <= abs(v) < 1e6:
        return f"{v:.4g}"
    mant, exp = f"{v:.1e}".split("e")
    sup = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
    return f"{mant} × 10{str(int(exp)).translate(sup)}"

# ---- 12. GPipe and 1F1B: the pipeline's training step (many_devices) -----------------------------
#: the chapter's example: p stages, m micro-batches (its GPipe figure's p_demo, m_demo)
PIPELINE_P, PIPELINE_M = 4, 8


def pipeline_schedules(p=PIPELINE_P, m=PIPELINE_M):
    """The two schedules the diagram draws, by name: the package's own."""
    return {"GPipe": gpipe_train_schedule(p, m), "1F1B": one_f_one_b_schedule(p, m)}


def _pipeline(c: Canvas):
    p, m = PIPELINE_P, PIPELINE_M
    schedules = pipeline_schedules(p, m)
    T = max(s.makespan for s in schedules.values())
    left, right = 10 + 44, WIDTH - 10 - 40           # the grid, between the stage and peak columns
    cell, row = (right - left) / T, 21
    y = 10
    # the key: colour and weight both tell a forward from a backward
    x = 10
    for words, role, bold in (("forward i", "attn", False), ("backward i", "mlp", True)):
        c.box(x, y + 2, 16, 16, role, rx=0, width=1)
        c.text(x + 8, y + 15, "i", size=MIN_FONT, bold=bold)
        c.text(x + 22, y + 15, words, anchor="start", size=MIN_FONT)
        x += 40 + text_width(words, MIN_FONT)
    c.box(x, y + 2, 16, 16, rx=0, width=0.8, dashed=True, hollow=True)
    c.text(x + 22, y + 15, "idle", anchor="start", size=MIN_FONT)
    c.text(WIDTH - 10, y + 15, f"p = {p}, m = {m}", anchor="end", size=MIN_FONT, colour="muted")
    y += 34
    described = []
    for name, sched in schedules.items():
        how = "all forwards, then all backwards" if name == "GPipe" else "one forward, one backward"
        c.text(10, y + 14, name, anchor="start", bold=True)
        c.text(10 + text_width(name, FONT, bold=True) + 8, y + 14, how, anchor="start",
               size=MIN_FONT, colour="muted")
        y += 22
        c.text(10, y + 14, "stage", anchor="start", size=MIN_FONT, colour="muted")
        c.text(WIDTH - 10, y + 14, "peak", anchor="end", size=MIN_FONT, colour="muted")
        y += 20
        peak = sched.peak_in_flight
        for s in range(p):
            top = y + s * row
            c.text(10 + 20, top + 15, str(s), size=MIN_FONT)
            for t in range(sched.makespan):
                f, b = int(sched.forward[s, t]), int(sched.backward[s, t])
                x = left + t * cell
                if f < 0 and b < 0:
                    c.box(x + 1, top + 1, cell - 2, row - 2, rx=0, width=0.8, dashed=True, hollow=True)
                    continue
                c.box(x, top, cell, row, "attn" if f >= 0 else "mlp", rx=0, width=0.8)
                # micro-batches counted from 1, as the chapter's GPipe figure counts them
                c.text(x + cell / 2, top + 15, str(max(f, b) + 1), size=MIN_FONT, bold=b >= 0)
            c.text(WIDTH - 10 - 20, top + 15, str(int(peak[s])), size=FONT, bold=True)
        y += p * row + 20
        pct = round(100 * sched.bubble)
        c.text(left, y, f"{sched.makespan} steps · bubble {pct} % · time →", anchor="start",
               size=MIN_FONT, colour="muted")
        y += 24
        described.append(f"{name} ({how}): {sched.makespan} time steps, {pct} % of the "
                         f"stage-steps idle; the most micro-batches whose activations a stage "
                         f"holds at once, stage 0 to {p - 1}: " + ", ".join(map(str, peak)))
    c.text(10, y + 6, "peak: micro-batches whose activations", anchor="start", size=MIN_FONT,
           colour="muted")
    c.text(10, y + 24, "a stage holds, waiting for their backward", anchor="start", size=MIN_FONT,
           colour="muted")
    y += 34
    desc = (f"Two pipeline schedules of one training step on {p} stages (rows, stage 0 at the "
            f"top) with {m} micro-batches numbered 1 to {m}, one cell per time step, a forward "
            f"or a backward taking one step each; blank dashed cells are idle. "
            + ". ".join(described) + ". 1F1B starts the backward of each micro-batch as soon as "
            f"the last stage has its forward, so stage s holds at most p − s micro-batches instead "
            f"of all {m}, with the same makespan and bubble.")
    return "GPipe and 1F1B: one training step of a pipeline", desc, y


# ---- the registry --------------------------------------------------------------------------------
# ---- short alt texts: the facts they state, read off what the drawing reads ------------------------
def _flash_alt():
    S, fa2, fa1 = flash_orders()
    return (f"Diagram: a causal attention's score tiles for S = {S}, {Q_TILE} queries by {K_TILE} "
            f"keys each, numbered in visiting order. FlashAttention-1 goes down each column of key "
            f"tiles in turn and writes a query tile's output at every one of its {len(fa1)} visits; "
            f"FlashAttention-2 goes along each row of query tiles, keeping the output on chip and "
            f"writing it {S // Q_TILE} times, once per query tile.")


def _gguf_alt():
    n = BLOCK
    return (f"Diagram: a Q8_0 block of {BLOCK_BYTES['Q8_0']} bytes (a float16 scale and {n} int8 "
            f"codes) and a Q4_1 block of {BLOCK_BYTES['Q4_1']} bytes (a float16 scale and minimum, "
            f"then {n // 2} bytes holding two 4-bit codes each, the low nibble for weight j and the "
            f"high nibble for weight j + {n // 2}); below, the q or k rows of one head of width "
            f"{PERMUTE_D_HEAD} in transformers' order and in the GGUF file's order.")


def _int8_alt():
    thr = SCHEME_OPTIONS["llm.int8"]["threshold"]
    alpha = SCHEME_OPTIONS["smoothquant"]["alpha"]
    return (f"Diagram in three panels: the W8A8 pipeline (quantise X and W to int8 in ±{qmax(8)}, "
            f"multiply and accumulate in int32, exact for up to {int32_max_terms(8):,} terms, "
            f"rescale to float); LLM.int8's split of the columns of X with some |x| ≥ {thr:g} into "
            f"a float16 matmul; SmoothQuant's per-column factor (α = {alpha:g}) that divides X and "
            f"multiplies W before the W8A8 path.")


def _float_formats_alt():
    rows = []
    for k, name in enumerate(FLOAT_FORMATS):
        bits, e, m, _ = float_fields(name)
        rows.append(f"{name} (1 sign, {e} exponent, {m} mantissa bits)" if k == 0 else
                    f"{name} (1, {e}, {m})")
    return ("Diagram: the bit fields of " + ", ".join(rows[:-1]) + " and " + rows[-1]
            + ", one cell per bit at the same scale, with each format's largest value and eps.")


def _pipeline_alt():
    p, m = PIPELINE_P, PIPELINE_M
    gpipe, ofob = pipeline_schedules(p, m).values()
    return (f"Diagram: GPipe above 1F1B, {p} stages by {gpipe.makespan} time steps for {m} "
            f"micro-batches. GPipe runs every forward, then every backward: stages 0 to {p - 1} "
            f"hold at most {', '.join(map(str, gpipe.peak_in_flight))} micro-batches' activations "
            f"at once. "
            f"1F1B alternates one forward and one backward: "
            f"{', '.join(map(str, ofob.peak_in_flight))}. Both idle "
            f"{round(100 * ofob.bubble)} % of the time.")


class Diagram(NamedTuple):
    chapter: str                                  # the notebook the diagram belongs in
    draw: Callable                                # Canvas -> (title, desc, height)
    alt: Callable | None = None                   # () -> the figure's short alt text, where it
                                                  # states the package's numbers; else the chapter's


#: every diagram by name: the chapter it belongs in and how it is drawn
DIAGRAMS: dict[str, Diagram] = {
    "tensor_parallel": Diagram("many_devices", _tensor_parallel),
    "shape_flow": Diagram("shape_flow", _shape_flow),
    "attention_heads": Diagram("derivation_ops_attention", _attention),
    "block_graph": Diagram("derivation_block", _block_graph),
    "paged_kv_cache": Diagram("inference_serving", _paged),
    "gpt_vs_llama": Diagram("modern_block", _gpt_vs_llama),
    "preln_block": Diagram("intro", _preln_block),
    "flash_loops": Diagram("inference", _flash, _flash_alt),
    "gguf_blocks": Diagram("real_model", _gguf, _gguf_alt),
    "int8_pipeline": Diagram("int8", _int8, _int8_alt),
    "float_formats": Diagram("precision", _float_formats, _float_formats_alt),
    "pipeline_schedules": Diagram("many_devices", _pipeline, _pipeline_alt),
}


def alt(name: str) -> str:
    """The short alt text of diagram ``name``, built from the constants its drawing reads: the
    chapter's figure must give exactly this as its ``:alt:`` (tests/test_diagrams.py)."""
    if name not in DIAGRAMS or DIAGRAMS[name].alt is None:
        have = sorted(n for n, d in DIAGRAMS.items() if d.alt is not None)
        raise ValueError(f"name: expected a diagram with a generated alt, one of {have}; got {name!r}")
    return DIAGRAMS[name].alt()


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
