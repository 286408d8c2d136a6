"""Sphinx extension: the intro's map of the chapters, drawn from _toc.yml and the notebooks.

The map (book/_generated/chapter_map.svg, written when the build starts, so it never lags the
book) shows the parts of _toc.yml as groups, every chapter with its short title and an estimated
reading time, and two paths: the core path for a first reading (`preln_core_path` in _config.yml)
and the full path through every chapter. A reading time is counted from the notebook itself:
markdown words at READ_WPM, the code lines the site shows at CODE_LPM; on the core path the `deeper` cells (the side
roads marked "skip on a first reading") are left out. The SVG carries its text as text (it scales,
prints and is read by screen readers) and its own <title> and <desc>. It is drawn twice, like the
chapters' diagrams (book/_ext/diagrams.py shows one per mode): chapter_map.svg in the light
theme's colours and chapter_map-dark.svg in the dark theme's (preln.chapters.diagrams.THEMES), so
in dark mode it sits on the page instead of on the theme's light grey mat.
"""
from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

import yaml

from preln.chapters.diagrams import THEMES, file_name, text_width

#: words of prose (with its formulas) a reader takes in per minute, and lines of code
READ_WPM = 150
CODE_LPM = 10
#: times are rounded up to this many minutes (an estimate, not a measurement)
ROUND_MIN = 5
#: code cells the site does not show (their code is scaffolding: plots, glue, asserts)
HIDDEN = {"hide-input", "remove-input", "remove-cell", "hide-cell"}
GENERATED = Path("book") / "_generated" / "chapter_map.svg"

# layout, in px of the SVG: drawn WIDTH wide, about the content column of a 390 px phone (PHONE_PX),
# so that its smallest text (CAPTION_FONT) is shown at >= MIN_SHOWN_PX there; a title too long for
# its line wraps onto the next (widths estimated by preln.chapters.diagrams.text_width, an upper bound)
WIDTH, PHONE_PX, MIN_SHOWN_PX = 360, 342, 11
FONT, CAPTION_FONT, LINE, GAP = 15, 13, 19, 9
CORE_X, FULL_X, TEXT_X, KEY_H = 14, 34, 50, 64
INK, MUTED, CORE_COLOUR, PAPER = "#1f2328", "#57606a", "#0072B2", "#ffffff"
#: the same four roles in dark mode: the dark theme's text, muted text, the diagrams' blue (lifted to
#: >= 4.5:1 on the page) and the page itself
DARK = THEMES["dark"]
COLOURS = {"light": (INK, MUTED, CORE_COLOUR, PAPER),
           "dark": (DARK["ink"], DARK["muted"], DARK["attn"], DARK["bg"])}


def toc_parts(root: Path):
    """[(caption, [(name, title), ...]), ...] for the parts of _toc.yml whose entries are notebooks."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    parts = []
    for part in toc.get("parts", []):
        entries = [(e["file"].rsplit("/", 1)[-1], e.get("title")) for e in part.get("chapters", [])
                   if (root / (e["file"] + ".ipynb")).is_file()]
        if entries:
            parts.append((part["caption"], entries))
    return parts


def notebook_title(root: Path, name: str) -> str:
    cells = json.loads((root / "book" / f"{name}.ipynb").read_text())["cells"]
    first = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return first.splitlines()[0].lstrip("# ").strip()


def reading_minutes(root: Path, name: str, first_pass: bool) -> int:
    """Estimated minutes to read book/<name>.ipynb (without its `deeper` cells if first_pass)."""
    cells = json.loads((root / "book" / f"{name}.ipynb").read_text())["cells"][1:]   # after the bootstrap
    words = lines = 0
    for c in cells:
        tags = c.get("metadata", {}).get("tags", [])
        if first_pass and "deeper" in tags:
            continue
        src = "".join(c["source"])
        if c["cell_type"] == "markdown":
            words += len(src.split())
        elif c["cell_type"] == "code" and not HIDDEN.intersection(tags):   # the code a reader sees
            lines += sum(1 for l in src.splitlines() if l.strip() and not l.lstrip().startswith("#"))
    minutes = words / READ_WPM + lines / CODE_LPM
    return max(ROUND_MIN, ROUND_MIN * math.ceil(minutes / ROUND_MIN))


def hours(minutes: int) -> str:
    h, m = divmod(minutes, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def chapter_rows(root: Path, core):
    """[(caption, [dict(name, title, minutes, core), ...]), ...]: what the map shows. A title is
    numbered as the sidebar numbers it ("1. Build and train the block"), counting across parts."""
    parts, number = [], 0
    for caption, entries in toc_parts(root):
        rows = []
        for n, t in entries:
            number += 1
            rows.append(dict(name=n, title=f"{number}. {t or notebook_title(root, n)}", core=n in core,
                             minutes=reading_minutes(root, n, first_pass=n in core)))
        parts.append((caption, rows))
    return parts


def wrap(words: str, width: float, size: float, bold: bool = False) -> list[str]:
    """``words`` broken into lines of at most ``width`` px at font ``size`` (greedy, at spaces)."""
    lines = [""]
    for word in words.split():
        trial = f"{lines[-1]} {word}".strip()
        if lines[-1] and text_width(trial, size, bold) > width:
            lines.append(word)
        else:
            lines[-1] = trial
    return lines


def chapter_map_svg(root: Path, core, mode: str = "light") -> str:
    """The map as an SVG document, in the colours of the theme's ``mode`` ("light" or "dark")."""
    if mode not in COLOURS:
        raise ValueError(f"mode: expected one of {sorted(COLOURS)}; got {mode!r}")
    ink, muted, core_colour, paper = COLOURS[mode]
    rows = chapter_rows(root, core)
    chapters = [c for _, cs in rows for c in cs]
    unknown = sorted(set(core) - {c["name"] for c in chapters})
    if unknown:
        raise ValueError(f"preln_core_path: expected chapters of _toc.yml; got {unknown}")
    core_total = sum(c["minutes"] for c in chapters if c["core"])
    full_total = sum(reading_minutes(root, c["name"], first_pass=False) for c in chapters)
    minutes_w = max(text_width(f'{c["minutes"]} min', FONT) for c in chapters)
    title_w = WIDTH - 8 - minutes_w - 12 - TEXT_X                # between the rails and the times
    out, ys = [], {}
    y = KEY_H
    for caption, cs in rows:
        y += LINE + GAP
        out.append(f'<text x="{TEXT_X}" y="{y}" font-weight="bold" font-size="{CAPTION_FONT}" '
                   f'letter-spacing="1" fill="{core_colour}">{escape(caption.upper())}</text>')
        for c in cs:
            lines = wrap(c["title"], title_w, FONT, bold=c["core"])     # core titles are bold
            y += LINE + (GAP if c is cs[0] else 7)
            ys[c["name"]] = y - 5                                  # the dot: by the first line
            colour = ink if c["core"] else muted
            weight = ' font-weight="bold"' if c["core"] else ""
            out.append(f'<text x="{WIDTH - 8}" y="{y}" text-anchor="end" fill="{colour}">'
                       f'{c["minutes"]} min</text>')
            for k, line in enumerate(lines):
                out.append(f'<text x="{TEXT_X}" y="{y + k * LINE}"{weight} fill="{colour}">{escape(line)}</text>')
            y += LINE * (len(lines) - 1)
    height = y + 14
    first, last = ys[chapters[0]["name"]], ys[chapters[-1]["name"]]
    core_ys = [ys[c["name"]] for c in chapters if c["core"]]
    rails = [f'<line x1="{FULL_X}" y1="{first}" x2="{FULL_X}" y2="{last}" stroke="{muted}" '
             'stroke-width="2" stroke-dasharray="5 4"/>',
             f'<line x1="{CORE_X}" y1="{core_ys[0]}" x2="{CORE_X}" y2="{core_ys[-1]}" '
             f'stroke="{core_colour}" stroke-width="5"/>']
    for c in chapters:
        cy = ys[c["name"]]
        rails.append(f'<circle cx="{FULL_X}" cy="{cy}" r="5" fill="{paper}" stroke="{muted}" stroke-width="2"/>')
        if c["core"]:
            rails.append(f'<circle cx="{CORE_X}" cy="{cy}" r="7" fill="{core_colour}"/>')
    key = [f'<line x1="6" y1="18" x2="36" y2="18" stroke="{core_colour}" stroke-width="5"/>',
           f'<text x="44" y="23" fill="{ink}"><tspan font-weight="bold">Core path</tspan>, first reading: '
           f'{hours(core_total)}</text>',
           f'<line x1="6" y1="46" x2="36" y2="46" stroke="{muted}" stroke-width="2" stroke-dasharray="5 4"/>',
           f'<text x="44" y="51" fill="{ink}"><tspan font-weight="bold">Full path</tspan>, everything: '
           f'{hours(full_total)}</text>']
    core_names = [c["title"] for c in chapters if c["core"]]
    desc = (f"The book's {len(chapters)} chapters in {len(rows)} parts: "
            + "; ".join(f"{cap}: " + ", ".join(f'{c["title"]} ({c["minutes"]} min)' for c in cs)
                        for cap, cs in rows)
            + f". The core path for a first reading takes {hours(core_total)} and goes through "
            + ", ".join(core_names) + f". The full path goes through every chapter in order, "
            f"{hours(full_total)} with every side road.")
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" role="img" aria-labelledby="map-t map-d" '
        f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="{FONT}">',
        '<title id="map-t">Map of the chapters and the two reading paths</title>',
        f'<desc id="map-d">{escape(desc)}</desc>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" rx="10" fill="{paper}"/>',
        *key, *rails, *out, "</svg>", ""])


def write_map(app):
    root = Path(app.srcdir)
    (root / GENERATED).parent.mkdir(parents=True, exist_ok=True)
    for mode in COLOURS:
        path = (root / GENERATED).with_name(file_name(GENERATED.stem, mode))
        svg = chapter_map_svg(root, app.config.preln_core_path, mode)
        if not path.is_file() or path.read_text() != svg:  # unchanged bytes: no rebuild of the intro
            path.write_text(svg)


def setup(app):
    app.add_config_value("preln_core_path", [], "env")
    app.connect("builder-inited", write_map)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
