"""What the chapters' notebooks use to hand numbers to their prose, with or without the book's toolchain.

The book's prose quotes computed numbers: a notebook cell calls ``glue("name", value)`` and the text
shows ``value`` where it says ``{eval}`glue.text("name:.1f")``` (below). A learner who
runs a chapter on Colab, Binder or after a plain ``pip install preln`` has no myst-nb (it is part of
the book's build stack, not of the package), and the chapters must still run there. So every chapter
imports :func:`glue` from here: with myst-nb installed it *is* ``myst_nb.glue`` (the stored outputs,
and so the site, are unchanged); without it, it shows the value in the notebook, so the reader of
a notebook where MyST does not render (Colab) sees the number the prose refers to.

Figures: :func:`register_figure_display` (called by ``preln.chapters.viz.apply_style``) makes every
matplotlib Figure display as a 2x PNG plus an HTML ``<img>`` carrying its alt text, which JupyterLab
shows (it never reads the alt myst-nb keeps in cell metadata); :func:`set_alt` gives a figure its
words, :func:`describe` reads them (or makes them from the figure's titles, axes and legends).

Numbers in the prose (issue 31): a markdown cell writes ``{eval}`glue.text("name:.1f")```, a MyST
inline expression. :func:`glue` also keeps each value in this kernel, and ``glue.text`` formats it
as myst-nb's ``{glue:text}`name:.1f``` did. ``make notebooks`` evaluates every markdown cell's
expressions once the notebook has run and stores the results in the cell's ``user_expressions``
metadata: JupyterLab with jupyterlab-myst shows them without a kernel, the site's build reads the
same stored values (book/_ext/preln_eval.py), and ``make test-notebooks`` re-evaluates and compares.
"""
import re

try:
    from myst_nb import glue as _myst_glue
except ImportError:          # a learner's environment: no book toolchain
    _myst_glue = None

__all__ = ["glue", "HAVE_MYST_NB", "glued_text", "eval_expressions", "evaluate_in_kernel", "store_expressions",
           "stale_expressions", "measured_expressions", "check_line", "BLANK_HINT", "sig", "fixed", "span", "listed", "set_alt", "describe", "short_alt", "image_bundle", "figure_bundle",
           "register_figure_display", "png_size", "palette_png", "FIGURE_DPI", "ALT_MAX",
           "OUTPUT_COLUMNS", "reads_as_table"]

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
    _GLUED[name] = variable
    if _myst_glue is not None:
        return _myst_glue(name, variable, display=display)
    print(f"{name} = {variable!r}" if isinstance(variable, str) else f"{name} = {variable}")
    return None


# ---- numbers in the prose: MyST inline expressions ---------------------------------------------
# A chapter's prose says {eval}`glue.text("name:fmt")`: a Python expression that jupyterlab-myst
# (2.7) sends to the kernel when the markdown cell runs, storing the reply in the cell's metadata
# ("user_expressions": [{"expression": ..., "result": {"status", "data", "metadata"}}]) and showing
# it from there on open. A str result's text/plain is its repr, '63.4'; jupyterlab-myst strips the
# quotes (src/components/inlineExpression.tsx, PlainTextRenderer) and the site reads it back with
# ast.literal_eval. The result is the number at the precision the prose shows, the same under
# every BLAS kernel, as glued values are.

_GLUED: dict = {}   # name -> value, every glue() of this kernel (the last call of a name wins)

#: a MyST eval role, `{eval}`expression``: (its backticks, the expression)
EVAL_ROLE = r"\{eval\}(`+)(.+?)\1"


def _format_like_myst_nb(value, fmt_spec):
    """``value`` formatted as myst-nb 1.4's ``{glue:text}`` formats a glued value: the text/plain
    Jupyter stores for it, read back as a Python literal, cast by the format's type character
    (myst_nb.core.variables.format_plain_text; tests/test_eval_roles.py checks the two agree)."""
    import ast

    try:
        from IPython.lib.pretty import pretty
    except ImportError:        # no IPython: no Jupyter either; repr is what pretty gives a number
        pretty = repr
    text = pretty(value)
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if fmt_spec == "":
        return str(value)
    kind = fmt_spec[-1]
    if kind == "s":
        value = str(value)
    elif kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, fmt_spec)


def glued_text(spec):
    """The text the prose shows for ``spec``, ``"name"`` or ``"name:fmt"`` (``fmt`` a format spec:
    ``.1f``, ``.3g``, ``,``, ``d`` ...): the value last glued under ``name``, formatted as myst-nb's
    ``{glue:text}`name:fmt``` did. Available as ``glue.text``, the form the chapters' prose uses."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"spec: expected 'name' or 'name:format' (a str); got {spec!r}")
    name, fmt_spec = spec.rsplit(":", 1) if ":" in spec else (spec, "")   # as myst-nb splits it
    if name not in _GLUED:
        raise KeyError(f"nothing glued under {name!r} yet: run the cell that calls glue({name!r}, ...) "
                       "first, then this markdown cell")
    return _format_like_myst_nb(_GLUED[name], fmt_spec)


glue.text = glued_text


def measured_expressions(nb):
    """The ``{eval}`` expressions of notebook ``nb`` that quote a value glued by a cell marked
    ``# NBVAL_IGNORE_OUTPUT`` (a measurement of the machine: a time, a bandwidth), by its stored
    outputs: nbval compares neither that cell's outputs nor these values, only that they exist."""
    names = {out.get("metadata", {}).get("scrapbook", {}).get("name")
             for cell in nb.cells if cell.cell_type == "code" and "NBVAL_IGNORE_OUTPUT" in cell.source
             for out in cell.get("outputs", [])} - {None}
    quoted = re.compile(r"""glue\.text\(["']([^"':]+)""")
    return {e for cell in nb.cells if cell.cell_type == "markdown" for e in eval_expressions(cell.source)
            if (m := quoted.search(e)) and m.group(1) in names}


def eval_expressions(source):
    """The expressions of the ``{eval}`...``` roles in markdown ``source``, each once, in order."""
    if not isinstance(source, str):
        raise TypeError(f"source: expected a markdown cell's source (str); got {type(source).__name__}")
    return list(dict.fromkeys(m.group(2) for m in re.finditer(EVAL_ROLE, source)))


def evaluate_in_kernel(kc, expressions, timeout=60):
    """``{expression: result}``: ``expressions`` evaluated by the kernel of client ``kc`` as Jupyter
    user expressions (what jupyterlab-myst sends): each result is ``{"status": "ok", "data": {...},
    "metadata": {...}}`` or an error (``status``, ``ename``, ``evalue``, ``traceback``). ``kc``: a
    blocking or an asynchronous jupyter_client kernel client."""
    import inspect

    expressions = list(expressions)
    if not expressions:
        return {}
    msg_id = kc.execute("", silent=False, store_history=False,
                        user_expressions={str(i): e for i, e in enumerate(expressions)})
    get_reply = kc.get_shell_msg
    if inspect.iscoroutinefunction(get_reply):   # an asynchronous client (nbclient's)
        from jupyter_core.utils import run_sync  # what nbclient runs its own calls with

        get_reply = run_sync(get_reply)
    reply = get_reply(timeout=timeout)
    while reply.get("parent_header", {}).get("msg_id") != msg_id:   # a reply to an earlier request
        reply = get_reply(timeout=timeout)
    content = reply["content"]
    if content.get("status") != "ok":
        raise RuntimeError(f"the kernel did not evaluate the expressions: {content.get('ename')}: "
                           f"{content.get('evalue')}")
    return {e: content["user_expressions"][str(i)] for i, e in enumerate(expressions)}


def store_expressions(nb, evaluate):
    """Give every markdown cell of notebook ``nb`` (nbformat) with ``{eval}`` roles the results of
    ``evaluate(expressions) -> {expression: result}`` in its ``user_expressions`` metadata (what
    jupyterlab-myst reads); drop stale metadata of a cell that has no role left. Returns
    ``[(cell index, expression, error text)]`` for the expressions that failed."""
    failed = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        expressions = eval_expressions(cell.source)
        if not expressions:
            cell.metadata.pop("user_expressions", None)
            continue
        results = evaluate(expressions)
        cell.metadata["user_expressions"] = [{"expression": e, "result": results[e]} for e in expressions]
        failed += [(index, e, f"{results[e].get('ename')}: {results[e].get('evalue')}")
                   for e in expressions if results[e].get("status") != "ok"]
    return failed


def stale_expressions(nb, evaluate, measured=()):
    """``[(cell index, expression, stored text, evaluated text)]`` for each ``{eval}`` role of
    notebook ``nb`` whose stored result (``user_expressions``) is missing or differs from what
    ``evaluate`` computes now (compared as the text/plain a reader sees). Expressions in
    ``measured`` quote a measurement of the machine (a timing): for those only a missing or failing
    value is stale, as nbval ignores the output of the cell that measured it."""
    def shown(result):
        if not result:
            return None
        if result.get("status") != "ok":
            return f"{result.get('ename')}: {result.get('evalue')}"
        return result.get("data", {}).get("text/plain")

    stale = []
    for index, cell in enumerate(nb.cells):
        expressions = eval_expressions(cell.source) if cell.cell_type == "markdown" else []
        if not expressions:
            continue
        stored = {u.get("expression"): u.get("result") for u in cell.metadata.get("user_expressions", [])}
        now = evaluate(expressions)
        stale += [(index, e, shown(stored.get(e)), shown(now[e])) for e in expressions
                  if (stored.get(e) or {}).get("status") != "ok" or now[e].get("status") != "ok"
                  or (e not in measured and shown(stored.get(e)) != shown(now[e]))]
    return stale


# ---- "write the line" exercises ----------------------------------------------------------------
# A chapter's exercise cell holds the line to write as `name = ...` (Python's Ellipsis: the cell runs,
# so the notebook executes top to bottom under nbval), and the next cell calls check_line. Its output
# is words, never a traceback, and the same on every machine: the stored output says "your turn".

#: what check_line prints while the blank is still `...`
BLANK_HINT = "Your turn: replace the `...` in the cell above with your line, run it, then run this cell."


#: monospace characters an output line holds at 1280 px on the site (a 688 px column)
OUTPUT_COLUMNS = 79
# two or more spaces between words: a column gap
_COLUMN_GAP = re.compile(r"\S {2,}\S")


def reads_as_table(text):
    """Whether printed output reads as a table (two or more lines with column gaps): the site wraps
    long lines of prose, and a table must fit in OUTPUT_COLUMNS instead (tests/test_code_width.py)."""
    return sum(1 for line in text.splitlines() if _COLUMN_GAP.search(line)) >= 2


def check_line(answer, expected, hint, rtol=1e-7, atol=1e-12):
    """Say whether a learner's ``answer`` (an array or number) equals ``expected``; returns True if so.

    answer:   what the learner's line computed (``...`` while the line is still blank).
    expected: what the package (or the chapter's reference) computes.
    hint:     one sentence that helps without giving the line away, printed when the answer is wrong.
    rtol, atol: how close counts as equal (numpy's allclose).
    """
    import numpy as np

    if not isinstance(hint, str) or not hint:
        raise TypeError(f"hint: expected a non-empty sentence for the learner; got {hint!r}")
    if answer is Ellipsis:
        print(BLANK_HINT)
        return False
    try:
        got = np.asarray(answer, dtype=np.float64)
    except (TypeError, ValueError):
        print(f"Not yet: your line gave a {type(answer).__name__}, not numbers. {hint}")
        return False
    want = np.asarray(expected, dtype=np.float64)
    if got.shape != want.shape:
        print(f"Not yet: your result has shape {got.shape}; it should have shape {want.shape}. {hint}")
        return False
    if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        worst = float(np.max(np.abs(got - want))) if got.size else 0.0
        print(f"Not yet: the shape is right, but the values differ (by up to {sig(worst)}). {hint}")
        return False
    print("Right: your line computes what the package computes.")
    return True

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
