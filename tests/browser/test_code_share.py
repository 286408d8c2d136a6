"""Code serves the text (issue 33): on every chapter at 1280 px, the code a reader sees without
opening anything takes at most MAX_SHARE of the page's height, and no visible code scrolls
sideways, nor does printed output (prose wraps; a printed table fits). Cells that only plot, glue,
assert or build an explorable are behind "Show code" (`hide-input`); scripts/code_share.py
measures (and prints the table of) what is checked here.
"""
from __future__ import annotations

import importlib.util

import pytest

from tests.browser.conftest import ROOT

pytestmark = pytest.mark.browser

# scripts/code_share.py, loaded by its path (scripts/ is not a package on sys.path)
_spec = importlib.util.spec_from_file_location("code_share", ROOT / "scripts" / "code_share.py")
code_share = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_share)

CHAPTERS = code_share.chapters()


def test_chapters_are_found():
    assert len(CHAPTERS) >= 10 and all(name.startswith("book/") for name in CHAPTERS)


@pytest.mark.parametrize("name", CHAPTERS)
def test_visible_code_share(open_page, name):
    page, _ = open_page(name, width=code_share.WIDTH, height=code_share.HEIGHT)
    m = code_share.measure(page)
    assert m["page"] > 0 and m["code"] >= 0, f"{name}: nothing measured ({m})"
    assert m["share"] <= code_share.MAX_SHARE, (
        f"{name}: visible code is {m['share']:.1%} of the page ({m['code']} of {m['page']} px), "
        f"over {code_share.MAX_SHARE:.0%}: put cells that only plot, glue or assert behind "
        "'Show code' (tag hide-input)")
    assert not m["scrolling"], (f"{name}: {len(m['scrolling'])} visible code cell(s) scroll "
                                f"sideways at {code_share.WIDTH} px: {m['scrolling']}")
    assert not m["outputs"], (f"{name}: {len(m['outputs'])} printed output(s) scroll sideways at "
                              f"{code_share.WIDTH} px (a printed table wider than the column?): "
                              f"{m['outputs']}")
