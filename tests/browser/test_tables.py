"""Every table of the built site's content is named, and labelled rows are row headers (issue 24).

Per page of the table of contents, in the article: each <table> has a <caption> with text (or an
aria-label / aria-labelledby); a table whose rows are labelled (a stub column: th in the body)
labels every body row with a th[scope=row] (in any column: the shape table's is its op, not its
index); a table without row headers is one of the few whose rows carry no label (NOT_ROW_LABELLED,
by caption). On the pages with transposes, no formula's spoken name says "down tack" (MathJax's reading of \\top).
"""
from __future__ import annotations

import pytest

from tests.browser.browser_checks import sitebrowser
from tests.browser.test_site import PAGES

pytestmark = pytest.mark.browser

# Tables whose rows are not labelled by their first cell (pairs of equations, side by side).
NOT_ROW_LABELLED = {"The modern block’s forward and its backward, line by line"}
TRANSPOSE_PAGES = {"book/derivation_ops", "book/modern_block", "book/intro"}
BAD_SPEECH = ("down tack", "up tack")
# MathJax (mathspeak) reads x^{\\mathsf{T}} as "x to the sans serif T power"; it has no "transpose" rule
TRANSPOSE_SPEECH = "sans serif T"

TABLES_JS = """() => Array.from(document.querySelectorAll('article table')).map(t => {
  const cap = t.querySelector(':scope > caption');
  const label = (t.getAttribute('aria-label') || '').trim();
  const by = (t.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean)
    .map(id => (document.getElementById(id) || {}).textContent || '').join(' ').trim();
  const body = Array.from(t.querySelectorAll(':scope > tbody > tr'));
  const capText = cap ? (cap.querySelector('.caption-text') || cap).textContent : '';
  return {name: (capText || label || by).replace(/\\s+/g, ' ').trim(),
          caption: cap ? cap.querySelector('.caption-text') ? cap.querySelector('.caption-text').textContent
                                                              : cap.textContent : '',
          rows: body.length,
          body_th: t.querySelectorAll(':scope > tbody th').length,
          row_headers: body.filter(r => r.querySelector(':scope > th[scope=row]')).length,
          head: (t.querySelector('tr') || {textContent: ''}).textContent.replace(/\\s+/g, ' ').trim().slice(0, 60)};
})"""


@pytest.mark.parametrize("name", PAGES)
def test_tables_are_named_with_row_headers(open_page, name):
    page, _ = open_page(name)
    found = page.evaluate(TABLES_JS)
    problems = []
    for t in found:
        what = f"table {t['name'] or t['head']!r}"
        if not t["name"]:
            problems.append(f"{what}: no caption, aria-label or aria-labelledby")
        if t["body_th"] or t["caption"].strip() not in NOT_ROW_LABELLED:
            if t["row_headers"] != t["rows"]:
                problems.append(f"{what}: {t['row_headers']} of {t['rows']} body rows have a th[scope=row]")
    assert not problems, f"{name}: " + "\n  ".join(problems)


@pytest.mark.parametrize("name", sorted(TRANSPOSE_PAGES))
def test_transposes_do_not_speak_as_tacks(open_page, name):
    page, _ = open_page(name)
    sitebrowser.settle(page)      # typeset, and every formula named (raises if speech failed)
    labels = page.evaluate("() => Array.from(document.querySelectorAll('mjx-container'))"
                           ".map(c => c.getAttribute('aria-label') || '')")
    assert any(TRANSPOSE_SPEECH in s for s in labels), \
        f"{name}: no formula speaks a transpose ({TRANSPOSE_SPEECH!r}): {labels[:5]}"
    bad = [s for s in labels if any(b in s.lower() for b in BAD_SPEECH)]
    assert not bad, f"{name}: formulas read with a tack: {bad[:5]}"
