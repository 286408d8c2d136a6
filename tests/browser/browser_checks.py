"""What the browser tests check on a page, as functions of a Playwright page (tests/browser).

- `axe_violations(page)`: axe-core (vendor/tests/axe-core, 4.14) with the WCAG 2.1 A/AA rules.
- `contrast(...)`: the WCAG contrast ratio of two CSS colours, computed in the page.
- `check_explorables(page, name)`: every explorable of preln.chapters.viz as a widget: named, grouped,
  keyboard-operable, announcing, with a visible focus ring.
"""
from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# scripts/sitebrowser.py: the server and Chromium, shared with make pdf; loaded by its path (scripts/ is
# not a package on sys.path)
_spec = importlib.util.spec_from_file_location("sitebrowser", ROOT / "scripts" / "sitebrowser.py")
sitebrowser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sitebrowser)
AXE_JS = ROOT / "vendor" / "tests" / "axe-core" / "axe.min.js"
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
FOCUS_RING_MIN = 3.0       # WCAG 1.4.11 non-text contrast: a focus indicator against its background
TEXT_CONTRAST_MIN = 4.5    # WCAG 1.4.3, normal text
ANNOUNCE_MS = 3_000        # the live region speaks 350 ms after the last move


def assert_clean(log, name):
    """Nothing from another origin, nothing failed, no HTTP error, no JavaScript error."""
    assert not log["foreign"], f"{name}: requests to other origins: {log['foreign']}"
    assert not log["failed"], f"{name}: failed requests: {log['failed']}"
    assert not log["bad_status"], f"{name}: HTTP errors: {log['bad_status']}"
    assert not log["page_errors"], f"{name}: JavaScript errors: {log['page_errors']}"
    assert not log["console"], f"{name}: console errors: {log['console']}"


@functools.lru_cache(maxsize=1)
def _axe():
    from axe_playwright_python.sync_playwright import Axe

    return Axe.from_file(AXE_JS)


def axe_version(page) -> str:
    return page.evaluate("() => window.axe ? axe.version : null")


A11Y_RECORD = ROOT / "_build" / "a11y"     # one JSON per page state: what axe found and passed


def axe_violations(page, contrast: bool = True, record: str | None = None) -> list[str]:
    """Run axe-core on the whole page with the WCAG 2.1 A/AA rules; one line per violation.

    axe files a text whose colours it could measure but which is exactly invisible (1:1, e.g.
    pink on pink) under "incomplete", not under "violations": those are counted too.
    ``contrast=False`` leaves out color-contrast, the slow rule (for a second run at another
    width: colours do not depend on it). ``record`` names a JSON file in _build/a11y/ that keeps
    the rules that passed, failed and could not decide (for the audit report)."""
    options = {"runOnly": {"type": "tag", "values": WCAG_TAGS}, "resultTypes": ["violations", "incomplete"]}
    # (resultTypes: passes and inapplicable come back with one node each; enough to list the rules)
    if not contrast:
        options["rules"] = {"color-contrast": {"enabled": False}}
    results = _axe().run(page, options=options)
    found = []
    for v in results.response["violations"]:
        nodes = "; ".join(f"{' '.join(map(str, n['target']))} ({(n.get('failureSummary') or '').splitlines()[-1].strip()[:140]})"
                          for n in v["nodes"][:4])
        found.append(f"{v['id']} [{v['impact']}] x{len(v['nodes'])}: {v['help']} -> {nodes}")
    for v in results.response["incomplete"]:
        if v["id"] != "color-contrast":
            continue
        for n in v["nodes"]:
            for check in n.get("any", []):
                data = check.get("data") or {}
                ratio, want = data.get("contrastRatio"), data.get("expectedContrastRatio")
                if data.get("fgColor") and data.get("bgColor") and ratio is not None and want \
                        and float(ratio) < float(str(want).split(":")[0]):
                    found.append(f"color-contrast (axe: incomplete, measured) {' '.join(map(str, n['target']))}: "
                                 f"{data['fgColor']} on {data['bgColor']} = {ratio}:1 < {want}")
    if record:
        r = results.response
        A11Y_RECORD.mkdir(parents=True, exist_ok=True)
        (A11Y_RECORD / f"{record}.json").write_text(json.dumps({
            "url": r.get("url"), "axe": r.get("testEngine", {}).get("version"), "tags": WCAG_TAGS,
            "violations": found, "passed": sorted(v["id"] for v in r.get("passes", [])),
            "incomplete": sorted(v["id"] for v in r.get("incomplete", []))}, indent=1))
    return found


# The effective background of an element (the first opaque one up the tree, else white/black
# canvas), and the contrast ratio of two colours: WCAG 2.1 relative luminance.
CONTRAST_JS = r"""
(() => {
  function rgb(c) { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; }
  function lum(c) { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); }
  function background(el) {
    for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0.5) return c; }
    return document.documentElement.dataset.theme === "dark" ? {r: 0, g: 0, b: 0, a: 1} : {r: 255, g: 255, b: 255, a: 1};
  }
  function ratio(a, b) { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); }
  window.__prelnContrast = {rgb, ratio, background};
})();
"""


def _focus_ring(page, selector):
    """(outline style, width px, contrast of the outline colour against the background behind it)
    of the element matching ``selector`` while it has keyboard focus."""
    page.evaluate(CONTRAST_JS)
    return page.evaluate("""sel => { const el = document.querySelector(sel); el.focus();
        const s = getComputedStyle(el), C = window.__prelnContrast;
        return {visible: el.matches(':focus-visible'), style: s.outlineStyle, width: parseFloat(s.outlineWidth),
                color: s.outlineColor,
                ratio: C.ratio(C.rgb(s.outlineColor), C.background(el.parentElement))}; }""", selector)


def control_names(page) -> list[str]:
    """The accessible name of every explorable control: its aria-labelledby or <label for> text."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('.preln-explorable [data-preln-control]'))
        .map(c => { const by = c.getAttribute('aria-labelledby');
                    const l = by ? document.getElementById(by) : document.querySelector(`label[for="${c.id}"]`);
                    return l ? l.textContent.trim() : ''; })""")


def check_explorables(page, name, *, interact: bool = True) -> int:
    """Every explorable on the page: a figure captioned by its title, each control named (unique on
    the page), pointing at the image, its announced value the real value; moving it by keyboard
    changes the frame and its alt text, and the live region says so; the focus ring is >= 3:1.
    Returns the number of explorables."""
    figures = page.locator("figure.preln-explorable")
    n = figures.count()
    if not n:
        return 0
    names = control_names(page)
    assert all(names), f"{name}: an explorable control without a name: {names}"
    dupes = sorted({x for x in names if names.count(x) > 1})
    assert not dupes, f"{name}: explorable controls share a name on the page: {dupes}"
    for e in range(n):
        fig = figures.nth(e)
        fid = fig.get_attribute("id")
        caption = fig.locator(":scope > figcaption")
        assert caption.count() == 1 and caption.inner_text().strip(), f"{name}: explorable #{e} has no caption"
        img = fig.locator("img.preln-explorable-frame")
        assert img.count() == 1, f"{name}: explorable #{e} has {img.count()} frame images"
        img_id = img.get_attribute("id")
        status = fig.locator("[role=status]")
        assert status.count() == 1, f"{name}: explorable #{e} has no live region"
        controls = fig.locator("[data-preln-control]")
        assert controls.count() >= 1, f"{name}: explorable #{e} has no controls"
        for c in range(controls.count()):
            ctl = controls.nth(c)
            cid = ctl.get_attribute("id")
            label = page.evaluate(
                "id => { const c = document.getElementById(id); const by = c.getAttribute('aria-labelledby');"
                " return (by ? document.getElementById(by) : document.querySelector(`label[for=\"${id}\"]`)).textContent.trim(); }", cid)
            assert ctl.get_attribute("aria-controls") == img_id, \
                f"{name}: control {label!r} does not point (aria-controls) at its figure's image"
            if ctl.get_attribute("role") == "slider":
                now, text = ctl.get_attribute("aria-valuenow"), ctl.get_attribute("aria-valuetext")
                lo, hi = float(ctl.get_attribute("aria-valuemin")), float(ctl.get_attribute("aria-valuemax"))
                assert lo <= float(now) <= hi, f"{name}: slider {label!r}: value {now} outside [{lo}, {hi}]"
                assert abs(float(now) - float(text)) <= 1e-4 * max(1.0, abs(float(now))), \
                    f"{name}: slider {label!r} announces {text!r} but its value is {now}"
            ring = _focus_ring(page, f"#{cid}")
            assert ring["visible"] and ring["style"] != "none" and ring["width"] >= 2, \
                f"{name}: control {label!r} shows no focus ring ({ring})"
            assert ring["ratio"] >= FOCUS_RING_MIN, \
                f"{name}: control {label!r}: focus ring {ring['color']} is {ring['ratio']:.2f}:1 against its background"
            if not interact:
                continue
            before_src = img.get_attribute("src")
            # the region keeps the previous control's announcement until this one's (350 ms later)
            before_said = status.inner_text()
            if ctl.get_attribute("role") == "slider":
                n_values = int(page.evaluate(f"() => JSON.parse(document.querySelector('#{fid} script.preln-explorable-data')"
                                             f".textContent).labels[{c}].length"))
                start = int(ctl.get_attribute("data-index"))
                ctl.focus()
                page.keyboard.press("Home" if start else "End")
                moved = int(ctl.get_attribute("data-index"))
                assert moved == (0 if start else n_values - 1), f"{name}: Home/End did not move slider {label!r}"
                assert img.get_attribute("src") != before_src, f"{name}: moving slider {label!r} did not change the image"
                before_src = img.get_attribute("src")
                page.keyboard.press("ArrowRight" if moved == 0 else "ArrowLeft")
                assert int(ctl.get_attribute("data-index")) == (1 if moved == 0 else n_values - 2), \
                    f"{name}: the arrow keys did not move slider {label!r}"
                now, text = ctl.get_attribute("aria-valuenow"), ctl.get_attribute("aria-valuetext")
                assert abs(float(now) - float(text)) <= 1e-4 * max(1.0, abs(float(now))), \
                    f"{name}: after a move, slider {label!r} announces {text!r} but its value is {now}"
            else:
                n_options = ctl.locator("option").count()
                if n_options < 2:
                    continue
                ctl.focus()
                current = int(ctl.input_value())
                ctl.select_option(index=(current + 1) % n_options)
            after_alt = img.get_attribute("alt")
            assert img.get_attribute("src") != before_src, f"{name}: moving control {label!r} did not change the image"
            assert after_alt and after_alt.strip(), f"{name}: a frame without alt text after moving {label!r}"
            assert img.evaluate("el => el.decode().then(() => el.naturalWidth > 0)"), \
                f"{name}: the new frame did not load after moving {label!r}"
            page.wait_for_function("([el, was]) => el.textContent.trim().length > 0 && el.textContent !== was",
                                   arg=[status.element_handle(), before_said], timeout=ANNOUNCE_MS)
            said = status.inner_text()
            assert label in said, f"{name}: the live region said {said!r}, not what {label!r} is now"
    return n


def check_math(page, name):
    """Every formula typeset by MathJax 3, none left raw, none in the Tab order, each with the
    hidden MathML that screen readers read."""
    n_math = page.locator(".math").count()
    if not n_math:
        return
    assert page.evaluate("() => !!(window.MathJax && window.MathJax.version)"), \
        f"{name}: the page has math but MathJax did not load"
    assert page.evaluate("() => window.MathJax.version.startsWith('3')"), f"{name}: MathJax is not v3"
    n_typeset = page.locator(".math mjx-container").count()
    assert n_typeset >= n_math, f"{name}: {n_math} math elements, only {n_typeset} typeset by MathJax"
    raw = page.evaluate(r"""() => Array.from(document.querySelectorAll('.math'))
        .filter(e => !e.querySelector('mjx-container'))
        .map(e => e.textContent.slice(0, 80))""")
    assert not raw, f"{name}: untypeset math left on the page: {raw}"
    body = page.locator(".bd-article").inner_text()
    leftover = [s for s in ("$$", "\\(", "\\[") if s in body]
    assert not leftover, f"{name}: raw TeX delimiters {leftover} left in the text"
    errors = page.locator("mjx-merror").all_inner_texts()
    assert not errors, f"{name}: MathJax errors (undefined macro or missing extension?): {errors}"
    # (a display formula wider than the column is a scrolling region, in the Tab order on purpose)
    tab_stops = page.locator("mjx-container[tabindex]:not([tabindex^='-']):not([data-preln-scroll])").count()
    assert tab_stops == 0, f"{name}: {tab_stops} formulas are in the Tab order"
    n_containers = page.locator("mjx-container").count()
    n_mml = page.locator("mjx-container > mjx-assistive-mml").count()
    assert n_mml == n_containers, f"{name}: {n_containers} formulas, {n_mml} with assistive MathML"


def scrolls_sideways(page) -> dict:
    """How wide the page is against the viewport, and what sticks out (for the message)."""
    return page.evaluate(r"""() => {
        const W = document.documentElement.clientWidth;
        const wide = [];
        for (const el of document.querySelectorAll('.bd-article *, .bd-header *, .bd-footer *')) {
          const r = el.getBoundingClientRect();
          if (r.width && r.right > W + 1) {
            let p = el.parentElement, inside = false;
            for (; p && p !== document.body; p = p.parentElement) {
              const o = getComputedStyle(p).overflowX;
              if (o !== 'visible' && p.getBoundingClientRect().right <= W + 1) { inside = true; break; }
            }
            if (!inside) wide.push(el.tagName.toLowerCase() + '.' + Array.from(el.classList).join('.')
                                   + ': ' + (el.textContent || '').trim().slice(0, 40));
          }
        }
        return {viewport: W, width: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth),
                wide: wide.slice(0, 6)};
    }""")


def scroll_regions(page) -> list[dict]:
    """Every box in the article that scrolls sideways: is it in the Tab order, and named?"""
    return page.evaluate(r"""() => Array.from(document.querySelectorAll('.bd-article div, .bd-article pre, .bd-article mjx-container, .bd-article table'))
        .filter(el => { const o = getComputedStyle(el).overflowX; return (o === 'auto' || o === 'scroll') && el.scrollWidth > el.clientWidth + 1; })
        .map(el => ({what: el.tagName.toLowerCase() + '.' + Array.from(el.classList).join('.'),
                     tabindex: el.tabIndex, role: el.getAttribute('role'), label: el.getAttribute('aria-label')}))""")
