"""Explorables as cards (issue 33, item 5): a visible "Interactive" badge, a label | control | value
grid aligned across rows, segmented toggles (a keyboard-operable radio group) for at most three
values, a drop-down without an echoed value, a slider with one value and step / play buttons,
a layout that holds at 390 and 320 CSS px, and axe with no violation in both modes.

The card is checked on a real page of the built site, in the theme's CSS: a fresh explorable
(preln.chapters.viz, as the code draws it now) takes the place of the page's first explorable,
so the check holds whatever the stored notebook outputs were made with. Its script is run as
the page would run it. Also: the dark-mode link of a figure opens the dark PNG.
"""
from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from preln.chapters.viz import PLAY_SECONDS, control, explorable  # noqa: E402
from tests.browser.browser_checks import assert_clean, axe_violations  # noqa: E402

#: a chapter with explorables (the first is replaced by the card under test)
PAGE = "book/derivation_ops_attention"
#: a chapter whose static figures have dark variants
FIGURE_PAGE = "book/precision"
SLOPES = [0.25, 0.5, 1.0, 2.0, 4.0]
MODELS = ["Llama 2 7B", "Llama 2 13B", "Llama 2 70B", "GPT-3 175B"]
#: px: how far apart two things on one row may sit (their vertical centres)
SAME_ROW_PX = 8
#: px: how far apart the left edges of one grid column may be
ALIGNED_PX = 1


def _plot(slope, side, model):
    fig = Figure(figsize=(6.0, 3.0))
    ax = fig.add_subplot()
    x = np.linspace(-3, 3, 31)
    ax.plot(x, np.tanh(slope * (x - {"left": -1.0, "centre": 0.0}[side])))
    ax.set_title(model)
    return fig


@pytest.fixture(scope="module")
def card():
    ex = explorable(_plot, {"slope": control("slope of the curve", SLOPES),
                            "side": control("where the curve is centred", ["left", "centre"]),
                            "model": control("model", MODELS)},
                    alt=lambda slope, side, model: f"A tanh curve of slope {slope:g}, centred {side}, for {model}.",
                    title="A tanh curve", initial={"model": "Llama 2 70B"})
    return ex.id, ex.to_html()


# the page's first explorable -> the card (its <style> and <figure>); its script re-created so
# that it runs (scripts parsed into a <template> never do). The page's other explorables bring
# their own copies of the <style>, as stored in the notebook: until the notebooks are executed
# again those are an older version, which would override the card's rules; they go.
INJECT_JS = """html => {
  const old = document.querySelector('figure.preln-explorable');
  const t = document.createElement('template');
  t.innerHTML = html;
  const fig = t.content.querySelector('figure');
  for (const s of document.querySelectorAll('style')) {
    if (s.textContent.includes('.preln-explorable-controls')) s.remove();
  }
  old.replaceWith(t.content);
  for (const s of fig.querySelectorAll('script:not([type])')) {
    const n = document.createElement('script');
    n.textContent = s.textContent;
    s.replaceWith(n);
  }
  return fig.id;
}"""


def _open_card(open_page, card, mode="light", width=1280):
    uid, html = card
    page, log = open_page(PAGE, mode=mode, width=width)
    assert page.evaluate(INJECT_JS, html) == uid
    page.wait_for_selector(f"#{uid}[data-ready]", state="attached")
    return page, log, uid


def _box(page, selector):
    return page.locator(selector).bounding_box()


def _centre_y(box):
    return box["y"] + box["height"] / 2


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("width", [1280, 390, 320])
def test_the_card_is_a_grid_that_holds_on_a_phone(open_page, card, mode, width):
    page, log, uid = _open_card(open_page, card, mode, width)
    badge = page.locator(f"#{uid} .preln-explorable-badge")
    assert badge.is_visible() and badge.inner_text() == "Interactive"
    # the three kinds of control
    assert page.locator(f"#{uid}-c0[role=slider]").count() == 1
    assert page.locator(f"#{uid}-c1[role=radiogroup] [role=radio]").count() == 2
    assert page.locator(f"select#{uid}-c2").count() == 1
    # the slider's value sits on its row, right of the buttons, on one line
    slider, value = _box(page, f"#{uid}-c0"), _box(page, f"#{uid}-c0-value")
    play = _box(page, f"#{uid} [data-preln-play]")
    assert abs(_centre_y(slider) - _centre_y(value)) <= SAME_ROW_PX, (slider, value)
    assert value["x"] >= play["x"] + play["width"], "the value wraps under the control"
    assert value["height"] < 2 * page.evaluate(f"parseFloat(getComputedStyle(document.getElementById('{uid}-c0-value')).lineHeight) || 24")
    # the value is shown once: the slider's; the drop-down shows its own, nothing beside it
    controls_text = page.locator(f"#{uid} .preln-explorable-controls").inner_text()
    assert controls_text.count("0.25") == 1
    assert page.locator(f"#{uid}-c2-value, #{uid}-c1-value").count() == 0
    labels = [_box(page, f"#{uid}-c{c}-label") for c in range(3)]
    inputs = [_box(page, f"#{uid}-c{c}") for c in range(3)]
    if width >= 1280:
        # label | control | value: labels in one column, controls in the next, each row level
        assert max(b["x"] for b in labels) - min(b["x"] for b in labels) <= ALIGNED_PX
        assert max(b["x"] for b in inputs) - min(b["x"] for b in inputs) <= ALIGNED_PX
        assert all(lab["x"] + lab["width"] <= box["x"] for lab, box in zip(labels, inputs))
        for lab, box in zip(labels, inputs):
            assert abs(_centre_y(lab) - _centre_y(box)) <= SAME_ROW_PX
    else:
        # on a phone each label heads its row, and the control follows below it
        for lab, box in zip(labels, inputs):
            assert box["y"] >= lab["y"] + lab["height"] - 1
    # nothing wider than the window (WCAG 1.4.10 reflow)
    card_box = _box(page, f"#{uid}")
    assert card_box["x"] >= 0 and card_box["x"] + card_box["width"] <= width
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert_clean(log, f"{PAGE} {mode} {width}")


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_axe_finds_no_violation_with_the_card(open_page, card, mode):
    page, log, uid = _open_card(open_page, card, mode)
    page.locator(f"#{uid}-c1").focus()          # a state with a focused toggle too
    page.keyboard.press("ArrowRight")
    found = axe_violations(page)
    assert not found, "\n".join(found)


def test_the_toggle_is_a_keyboard_radio_group(open_page, card):
    page, log, uid = _open_card(open_page, card)
    group, img = page.locator(f"#{uid}-c1"), page.locator(f"#{uid}-frame")
    radios = group.locator("[role=radio]")

    def checked():
        return [radios.nth(k).get_attribute("aria-checked") for k in range(radios.count())]

    assert checked() == ["true", "false"]
    before = img.get_attribute("src")
    group.focus()
    page.keyboard.press("ArrowRight")
    assert checked() == ["false", "true"]
    assert group.get_attribute("aria-activedescendant") == f"{uid}-c1-o1"
    assert img.get_attribute("src") != before and "centred centre" in img.get_attribute("alt")
    page.wait_for_function("el => el.textContent.includes('where the curve is centred centre')",
                           arg=page.locator(f"#{uid} [role=status]").element_handle(), timeout=3_000)
    page.keyboard.press("ArrowRight")                  # a radio group wraps around
    assert checked() == ["true", "false"]
    page.keyboard.press("End")
    assert checked() == ["false", "true"]
    radios.nth(0).click()                              # and takes a click on a segment
    assert checked() == ["true", "false"]
    assert page.evaluate("document.activeElement.id") == f"{uid}-c1"
    assert_clean(log, PAGE)


def test_step_and_play_walk_the_slider_and_stop_at_the_end(open_page, card):
    page, log, uid = _open_card(open_page, card)
    slider = page.locator(f"#{uid}-c0")
    prev, nxt = page.locator(f"#{uid} [data-preln-by='-1']"), page.locator(f"#{uid} [data-preln-by='1']")
    play = page.locator(f"#{uid} [data-preln-play]")
    value = page.locator(f"#{uid}-c0-value")
    assert prev.get_attribute("aria-disabled") == "true"       # at the first value
    # keyboard: Tab from the slider to the buttons, Enter / Space press them
    slider.focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.getAttribute('data-preln-by')") == "1"
    page.keyboard.press("Enter")
    assert slider.get_attribute("data-index") == "1" and value.inner_text() == "0.5"
    assert slider.get_attribute("aria-valuenow") == "0.5"
    prev.focus()
    page.keyboard.press("Space")
    assert slider.get_attribute("data-index") == "0" and prev.get_attribute("aria-disabled") == "true"
    # play: one step every PLAY_SECONDS, to the last value, then it stops by itself
    play.focus()
    t0 = time.monotonic()
    page.keyboard.press("Enter")
    assert play.get_attribute("aria-pressed") == "true"
    steps = len(SLOPES) - 1
    page.wait_for_function("el => el.getAttribute('aria-pressed') === 'false'", arg=play.element_handle(),
                           timeout=int(1000 * PLAY_SECONDS * (steps + 3)))
    elapsed = time.monotonic() - t0
    assert slider.get_attribute("data-index") == str(steps) and value.inner_text() == "4"
    assert elapsed >= 0.9 * PLAY_SECONDS * steps, f"played {steps} steps in {elapsed:.2f} s"
    assert nxt.get_attribute("aria-disabled") == "true"
    # pressed again at the end, it starts over from the first value; pressed once more, it pauses
    play.click()
    assert slider.get_attribute("data-index") == "0" and play.get_attribute("aria-pressed") == "true"
    play.click()
    assert play.get_attribute("aria-pressed") == "false"
    page.wait_for_timeout(int(1500 * PLAY_SECONDS))
    assert slider.get_attribute("data-index") == "0", "a paused play moved on"
    assert_clean(log, PAGE)


def test_play_is_not_offered_under_reduced_motion(browser, site_url, card):
    uid, html = card
    context = browser.new_context(viewport={"width": 1280, "height": 900}, reduced_motion="reduce")
    try:
        page = context.new_page()
        page.goto(f"{site_url}/{PAGE}.html", wait_until="load")
        page.evaluate(INJECT_JS, html)
        page.wait_for_selector(f"#{uid}[data-ready]", state="attached")
        assert not page.locator(f"#{uid} [data-preln-play]").is_visible()
        assert page.locator(f"#{uid} [data-preln-by='1']").is_visible()      # stepping stays
    finally:
        context.close()


def test_a_figure_opens_its_dark_image_in_dark_mode(open_page):
    """Every static figure links to its full-size image: the light PNG in light mode, the dark one
    in dark mode (book/_ext/preln_site.py names it, book/_static/preln-site.js switches)."""
    for mode, suffix in (("light", ".png"), ("dark", "-dark.png")):
        page, log = open_page(FIGURE_PAGE, mode=mode)
        links = page.locator("a.image-reference[data-preln-dark-href]")
        assert links.count() >= 1, f"{FIGURE_PAGE}: no figure link with a dark variant"
        for k in range(links.count()):
            a = links.nth(k)
            href = a.get_attribute("href")
            assert href.endswith(suffix) and (mode == "dark" or not href.endswith("-dark.png")), (mode, href)
            # the link opens the image the page shows
            shown = a.locator("img.only-dark" if mode == "dark" else "img.only-light")
            assert shown.get_attribute("src").rsplit("/", 1)[-1] == href.rsplit("/", 1)[-1]
        # the theme's switch follows: to light, the link follows
        if mode == "dark":
            page.evaluate("document.documentElement.setAttribute('data-theme', 'light')")
            assert links.first.get_attribute("href").endswith(".png") and \
                not links.first.get_attribute("href").endswith("-dark.png")
        assert_clean(log, f"{FIGURE_PAGE} {mode}")
