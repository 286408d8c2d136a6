"""Focus visible on every focusable element of every page (WCAG 2.4.7, 1.4.11; issue 24).

The test tabs through each page with the keyboard, from the top to the last Tab stop, and sorts
the Tab stops into kinds (tag, role, classes: "the header's dropdown buttons", "a sideways-
scrolling output", "a sidebar link" ...). For the first and the last of each kind, in light and in dark mode, it
takes two screenshots of the element's box and a margin around it, without and with focus, and
compares them pixel by pixel. A pixel counts as part of the focus indicator when its colour
changed by >= 3:1 (the WCAG contrast ratio between the unfocused and the focused colour: the ring
against the background it is drawn on). Each side of the box must have such pixels along most of
its length, close to the edge: a ring that is missing, too faint, or cut off by a parent's
overflow (the output boxes, the admonitions) fails on the side it lost. Tooltips are hidden and
transitions switched off while measuring (a tooltip is not a focus indicator; the end state is
what is measured). The theme's chrome, the same template on every page, is measured on a few pages
(CHROME_PAGES); each page's content on every page. What was measured goes to _build/a11y/focus-<page>-<mode>.json.
"""
from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from tests.browser.browser_checks import A11Y_RECORD, FOCUS_RING_MIN, sitebrowser
from tests.browser.test_site import PAGES, SEARCH

pytestmark = pytest.mark.browser

MAX_TAB_STOPS = 5_000      # a page with more is a runaway Tab loop
SAMPLES_PER_KIND = 2       # the first and the last Tab stop of each kind
PAD = 8                    # CSS px of margin around the box in the screenshots
BAND_OUT, BAND_IN = 7, 4   # a ring counts within this distance outside / inside the box's edge
MIN_SIDE_COVERAGE = 0.6    # of each side's length, the ring is there (corners and rounding aside)
MIN_SIDE_PX = 4            # a side shorter than this is not judged (it is a corner)

# Everything that could change between the two screenshots but the focus indicator.
FREEZE_CSS = """
.tooltip, .popover { display: none !important; }
*, *::before, *::after { transition: none !important; animation: none !important; caret-color: transparent !important; }
"""

TAB_JS = r"""i => {
  const el = document.activeElement;
  if (!el || el === document.body || el === document.documentElement) return null;
  if (el.hasAttribute('data-preln-tab')) return {again: true};
  el.setAttribute('data-preln-tab', String(i));
  const cls = Array.from(el.classList).filter(c => !/^(active|current|show|collapsed|toggle-button-hidden)$/.test(c) && !/\d/.test(c));
  const scroll = el.hasAttribute('data-preln-scroll') || (el.scrollWidth > el.clientWidth + 1 && el.tabIndex >= 0 && !/^(A|BUTTON|INPUT|SELECT|SUMMARY)$/.test(el.tagName));
  const where = el.closest('.bd-header, .bd-header-article, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-footer, .prev-next-area, .admonition, .cell_output, .cell_input, .bd-article');
  return {kind: [el.tagName.toLowerCase(), el.getAttribute('role') || '', cls.sort().join('.'), scroll ? 'scrolls' : '',
                 where ? where.classList[0] : ''].join('|'),
          name: (el.getAttribute('aria-label') || el.innerText || el.getAttribute('title') || '').trim().slice(0, 50)};
}"""

# (a box taller than the window below the theme's sticky headers is brought up to just under them:
# its top side is then judged, not hidden by the header)
PREPARE_JS = r"""i => {
  const el = document.querySelector(`[data-preln-tab="${i}"]`);
  el.scrollIntoView({block: 'center', inline: 'nearest'});
  const stuck = Array.from(document.querySelectorAll('.bd-header, .bd-header-article'))
    .filter(h => ['sticky', 'fixed'].includes(getComputedStyle(h).position) && !el.closest('.bd-header, .bd-header-article'))
    .map(h => h.getBoundingClientRect().bottom);
  const below = Math.max(0, ...stuck) + 16, top = el.getBoundingClientRect().top;
  if (top < below) window.scrollBy(0, top - below);
  if (document.activeElement && document.activeElement.blur) document.activeElement.blur();
  return true;
}"""

# Where the ring is drawn on a container of the focused element, not on it: pydata-sphinx-theme's
# search field rings its <form> (.bd-search:focus-within), around the magnifier icon and the input.
RING_OWNERS = ".bd-search"

FOCUS_JS = r"""([i, owners]) => {
  const el = document.querySelector(`[data-preln-tab="${i}"]`);
  el.focus({preventScroll: true});
  const box = el.closest(owners) || el;
  const rects = Array.from(box.getClientRects()).filter(r => r.width > 0 && r.height > 0)
    .map(r => ({x: r.x, y: r.y, w: r.width, h: r.height}));
  return {focused: document.activeElement === el, visible: el.matches(':focus-visible'), rects,
          vw: document.documentElement.clientWidth, vh: window.innerHeight};
}"""


def _rgb(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float64) / 255.0


def _luminance(rgb: np.ndarray) -> np.ndarray:
    """WCAG 2.1 relative luminance of each pixel."""
    lin = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return lin @ np.array([0.2126, 0.7152, 0.0722])


def ring_sides(before: np.ndarray, after: np.ndarray, box: tuple[float, float, float, float],
               sides=("top", "right", "bottom", "left")) -> dict:
    """For each side of ``box`` (x0, y0, x1, y1 in the screenshots' pixels) that lies inside them:
    the fraction of its length where some pixel near the edge changed by >= 3:1, and the
    median contrast of those pixels."""
    la, lb = _luminance(before), _luminance(after)
    ratio = (np.maximum(la, lb) + 0.05) / (np.minimum(la, lb) + 0.05)
    changed = ratio >= FOCUS_RING_MIN
    h, w = changed.shape
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    out = {}
    for side in sides:
        if side in ("top", "bottom"):
            edge = y0 if side == "top" else y1
            lo, hi = (edge - BAND_OUT, edge + BAND_IN) if side == "top" else (edge - BAND_IN, edge + BAND_OUT)
            if lo < 0 or hi > h or x1 - x0 < MIN_SIDE_PX:
                continue
            band, rband = changed[lo:hi, max(x0, 0):min(x1, w)], ratio[lo:hi, max(x0, 0):min(x1, w)]
            covered = band.any(axis=0)
        else:
            edge = x0 if side == "left" else x1
            lo, hi = (edge - BAND_OUT, edge + BAND_IN) if side == "left" else (edge - BAND_IN, edge + BAND_OUT)
            if lo < 0 or hi > w or y1 - y0 < MIN_SIDE_PX:
                continue
            band, rband = changed[max(y0, 0):min(y1, h), lo:hi], ratio[max(y0, 0):min(y1, h), lo:hi]
            covered = band.any(axis=1)
        if covered.size == 0:
            continue
        out[side] = {"coverage": float(covered.mean()),
                     "contrast": float(np.median(rband[band])) if band.any() else 1.0}
    return out


def _tab_stops(page) -> list[dict]:
    stops = []
    for i in range(MAX_TAB_STOPS):
        page.keyboard.press("Tab")
        d = page.evaluate(TAB_JS, i)
        if d is None or d.get("again"):
            return stops
        d["index"] = i
        stops.append(d)
    pytest.fail(f"more than {MAX_TAB_STOPS} Tab stops: a keyboard trap or a runaway page?")


def _sample(stops: list[dict], chrome: bool = True) -> list[dict]:
    kinds: dict[str, list[dict]] = {}
    for s in stops:
        if chrome or s["kind"].rsplit("|", 1)[-1] not in CHROME:
            kinds.setdefault(s["kind"], []).append(s)
    chosen = []
    for members in kinds.values():
        picks = {0, len(members) - 1} if len(members) >= SAMPLES_PER_KIND else set(range(len(members)))
        chosen += [dict(members[k], count=len(members)) for k in sorted(picks)]
    return chosen


def measure_focus(page, stop: dict) -> dict:
    """Screenshots of one Tab stop without and with focus; the ring's sides (see ring_sides)."""
    page.evaluate(PREPARE_JS, stop["index"])
    page.wait_for_timeout(30)
    state = page.evaluate(FOCUS_JS, [stop["index"], RING_OWNERS])
    rects = state["rects"]
    result = {"kind": stop["kind"], "name": stop["name"], "focused": state["focused"], "visible": state["visible"]}
    if not rects:
        result["error"] = "no box on screen when focused"
        return result
    xs0, ys0 = min(r["x"] for r in rects), min(r["y"] for r in rects)
    xs1, ys1 = max(r["x"] + r["w"] for r in rects), max(r["y"] + r["h"] for r in rects)
    clip = {"x": max(0.0, xs0 - PAD), "y": max(0.0, ys0 - PAD)}
    clip["width"] = min(state["vw"], xs1 + PAD) - clip["x"]
    clip["height"] = min(state["vh"], ys1 + PAD) - clip["y"]
    if clip["width"] < 2 or clip["height"] < 2:
        result["error"] = f"box off screen: {rects}"
        return result
    after = _rgb(page.screenshot(clip=clip, caret="hide", scale="css"))
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.wait_for_timeout(30)
    before = _rgb(page.screenshot(clip=clip, caret="hide", scale="css"))
    if before.shape != after.shape:
        result["error"] = "the page moved between the screenshots"
        return result
    # one line box: its four sides; a link broken over lines: its first and last line's outer sides
    first, last = rects[0], rects[-1]
    sides = {}
    for rect, which in ([(first, ("top", "right", "bottom", "left"))] if len(rects) == 1 else
                        [(first, ("top", "left")), (last, ("bottom", "right"))]):
        box = (rect["x"] - clip["x"], rect["y"] - clip["y"], rect["x"] + rect["w"] - clip["x"],
               rect["y"] + rect["h"] - clip["y"])
        sides.update(ring_sides(before, after, box, which))
    result["sides"] = sides
    return result


def _problems(results: list[dict]) -> list[str]:
    bad = []
    for r in results:
        where = f"{r['kind']} ({r['name']!r})"
        if r.get("error"):
            bad.append(f"{where}: {r['error']}")
            continue
        if not (r["focused"] and r["visible"]):
            bad.append(f"{where}: not :focus-visible after a keyboard focus")
            continue
        sides = r["sides"]
        if len(sides) < 2:
            bad.append(f"{where}: fewer than two sides of its box on screen ({sides})")
            continue
        weak = {s: f"{v['coverage']:.0%} at {v['contrast']:.2f}:1" for s, v in sides.items()
                if v["coverage"] < MIN_SIDE_COVERAGE}
        if weak:
            bad.append(f"{where}: no focus ring changing >= {FOCUS_RING_MIN}:1 along these sides: {weak}")
    return bad


def _record(name: str, mode: str, n_stops: int, results: list[dict]) -> None:
    A11Y_RECORD.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", name)
    (A11Y_RECORD / f"focus-{stem}-{mode}.json").write_text(json.dumps(
        {"page": name, "mode": mode, "tab_stops": n_stops, "measured": results}, indent=1))


# (index.html only leads to the front page, book/intro, which PAGES holds)
FOCUS_PAGES = PAGES + ["genindex", SEARCH, "404.html"]
# The theme's chrome (header, sidebars, footer, previous/next links) is one template on every page:
# its Tab stops are measured on these pages (the first page, the chapter with the most kinds of Tab
# stop, the API reference and Sphinx's own pages); every page is tabbed through, and its content
# (article, cells, admonitions) measured, on all pages.
CHROME = {"bd-header", "bd-header-article", "bd-sidebar-primary", "bd-sidebar-secondary", "bd-footer",
          "prev-next-area"}
CHROME_PAGES = {PAGES[0], "book/derivation_ops", "book/api", "genindex", SEARCH, "404.html"}


@pytest.mark.parametrize("name", FOCUS_PAGES)
def test_focus_visible(open_page, name):
    page, log = open_page(name)
    sitebrowser.settle(page)
    page.add_style_tag(content=FREEZE_CSS)
    stops = _tab_stops(page)
    assert stops, f"{name}: nothing on the page takes keyboard focus"
    sample = _sample(stops, chrome=name in CHROME_PAGES)
    problems = []
    for mode in ("light", "dark"):
        page.emulate_media(color_scheme=mode)
        if page.evaluate("() => !!document.documentElement.dataset.theme"):
            page.wait_for_function(f"() => document.documentElement.dataset.theme === '{mode}'", timeout=5_000)
        results = [measure_focus(page, s) for s in sample]
        _record(name, mode, len(stops), results)
        problems += [f"[{mode}] {p}" for p in _problems(results)]
    assert not problems, (f"{name}: {len(problems)} of {2 * len(sample)} measured Tab stops "
                          f"({len(stops)} on the page) show no focus ring:\n  " + "\n  ".join(problems))


def test_ring_measure_sees_a_clipped_ring():
    """The measure itself: a full ring passes on all sides, a ring cut off on one side fails there,
    and a ring of too little contrast fails everywhere."""
    bg = np.ones((40, 60, 3))
    ring = bg.copy()
    ring[5:8, 5:55] = ring[32:35, 5:55] = 0.0                 # top, bottom
    ring[5:35, 5:8] = ring[5:35, 52:55] = 0.0                 # left, right
    box = (8, 8, 52, 32)
    full = ring_sides(bg, ring, box)
    assert set(full) == {"top", "right", "bottom", "left"}
    assert all(v["coverage"] >= MIN_SIDE_COVERAGE for v in full.values()), full
    clipped = ring.copy()
    clipped[:, 45:] = 1.0                                      # a parent's overflow cuts the right side
    cut = ring_sides(bg, clipped, box)
    assert cut["right"]["coverage"] < MIN_SIDE_COVERAGE and cut["left"]["coverage"] >= MIN_SIDE_COVERAGE
    faint = bg.copy()
    faint[ring[..., 0] == 0.0] = 0.8                           # light grey on white: ~1.5:1
    assert all(v["coverage"] < MIN_SIDE_COVERAGE for v in ring_sides(bg, faint, box).values())
