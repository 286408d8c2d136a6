"""How much of each chapter's page is visible code, on the built site at 1280 px (issue 33).

    python scripts/code_share.py                        # _build/html
    python scripts/code_share.py --site DIR --before DIR2   # both, side by side

For every chapter (a notebook page of _toc.yml) in headless Chromium (scripts/sitebrowser.py),
once MathJax has typeset the page: the height of the code inputs a reader sees without opening
anything (a `hide-input` cell's code behind its closed "Show code" toggle, or code in a closed
"Deeper" side road, takes no height), the page's height, their ratio, and how many visible code
inputs and printed outputs scroll sideways. tests/browser/test_code_share.py holds every chapter
to MAX_SHARE and to no sideways scrolling.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sitebrowser", ROOT / "scripts" / "sitebrowser.py")
sitebrowser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sitebrowser)

WIDTH, HEIGHT = 1280, 900
MAX_SHARE = 0.15          # the goal of issue 33: code is at most this share of a chapter's height
# A code block scrolls sideways when its content is wider than its box by more than round-off.
SCROLL_SLACK_PX = 1

MEASURE_JS = """() => {
  let code = 0; const scrolling = [];
  document.querySelectorAll('div.cell div.cell_input').forEach(el => {
    // Chromium lays out a closed <details>' content without showing it: skip it by hand
    if (el.closest('details:not([open])')) return;
    const h = el.getBoundingClientRect().height;
    if (!h) return;
    code += h;
    el.querySelectorAll('pre').forEach(pre => {
      if (pre.scrollWidth > pre.clientWidth + %d)
        scrolling.push(pre.textContent.split('\\n').find(l => l.length > 79) || '');
    });
  });
  // printed output (stream, text/plain): prose wraps, a table fits the column
  const outputs = [];
  document.querySelectorAll('div.cell_output div.output pre').forEach(pre => {
    if (pre.closest('details:not([open])') || !pre.clientWidth) return;
    if (pre.scrollWidth > pre.clientWidth + %d)
      outputs.push(pre.textContent.split('\\n').find(l => l.length > 79) || '');
  });
  return {code: Math.round(code), page: document.documentElement.scrollHeight, scrolling, outputs};
}""" % (SCROLL_SLACK_PX, SCROLL_SLACK_PX)


def chapters() -> list[str]:
    """The notebook pages of _toc.yml, in reading order."""
    return [p for p in sitebrowser.pages() if (ROOT / f"{p}.ipynb").is_file()]


def typeset(page) -> None:
    """Wait until MathJax has typeset the page (formulas change its height); fonts loaded."""
    page.wait_for_function("() => !window.MathJax || (window.MathJax.startup && "
                           "window.MathJax.startup.promise)", timeout=sitebrowser.SETTLE_MS)
    page.evaluate("() => window.MathJax && window.MathJax.startup ? "
                  "window.MathJax.startup.promise.then(() => true) : true")
    page.evaluate("() => document.fonts.ready.then(() => true)")


def measure(page) -> dict:
    """{code: px of visible code inputs, page: px of the page, share, scrolling: [first long
    line of each code input that scrolls sideways], outputs: [the same of printed outputs]} of
    the page open in ``page``."""
    typeset(page)
    m = page.evaluate(MEASURE_JS)
    m["share"] = m["code"] / m["page"] if m["page"] else 0.0
    return m


def measure_site(site: Path, names: list[str]) -> dict[str, dict]:
    from playwright.sync_api import sync_playwright

    server, url = sitebrowser.serve(site)
    try:
        with sync_playwright() as p:
            browser = sitebrowser.launch(p)
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
            page = context.new_page()
            page.set_default_timeout(60_000)
            out = {}
            for name in names:
                page.goto(f"{url}/{name}.html", wait_until="load")
                out[name] = measure(page)
            browser.close()
            return out
    finally:
        server.shutdown()
        server.server_close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, default=sitebrowser.SITE, help="the built site (after)")
    ap.add_argument("--before", type=Path, help="an earlier build of the site, for comparison")
    args = ap.parse_args()
    names = chapters()
    after = measure_site(args.site, names)
    before = measure_site(args.before, names) if args.before else {}
    head = f"{'chapter':28s} {'code px':>8s} {'page px':>8s} {'share':>6s} {'scroll':>6s} {'out':>4s}"
    if before:
        head += f" | {'before: code':>12s} {'page':>7s} {'share':>6s} {'scroll':>6s}"
    print(head)
    for name in names:
        a = after[name]
        row = (f"{name.split('/')[-1]:28s} {a['code']:8d} {a['page']:8d} {a['share']:6.1%} "
               f"{len(a['scrolling']):6d} {len(a['outputs']):4d}")
        if name in before:
            b = before[name]
            row += f" | {b['code']:12d} {b['page']:7d} {b['share']:6.1%} {len(b['scrolling']):6d}"
        print(row)
    worst = max(after.values(), key=lambda m: m["share"])
    print(f"largest share {worst['share']:.1%} (goal <= {MAX_SHARE:.0%}); "
          f"{sum(len(m['scrolling']) for m in after.values())} code inputs scroll sideways")
    return 0 if worst["share"] <= MAX_SHARE else 1


if __name__ == "__main__":
    raise SystemExit(main())
