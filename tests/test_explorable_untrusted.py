"""An explorable in an untrusted notebook: JupyterLab's sanitizer (@jupyterlab/apputils Sanitizer,
sanitize-html) removes its <script> and <style> elements and every attribute outside its allow-list
(it keeps class, hidden, title, lang, dir and a filtered style, renames id to data-jupyter-id,
drops role, aria-* and data-*, and, as sanitize-html does, every attribute with an empty value but
alt). What is left must be the static first frame with its alt and a visible note, and no
control on show (without the <style> a slider is an empty, 0 px wide span).
tests/browser/test_jupyterlab.py checks the same in a real JupyterLab."""
from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from preln.chapters.viz import UNTRUSTED_NOTE, control, explorable  # noqa: E402

# JupyterLab's allowedAttributes["*"] (jlab_core, 4.x) plus what it allows on <img> and <label>.
KEPT_ATTRS = {"class", "id", "hidden", "inert", "dir", "lang", "title", "translate", "draggable",
              "spellcheck", "itemprop", "itemref", "itemscope", "src", "alt", "width", "height", "for",
              "value", "selected"}
EMPTY_OK = {"alt"}          # sanitize-html's allowedEmptyAttributes
DROPPED_ELEMENTS = {"script", "style"}
VOID = {"img", "br", "hr", "input", "meta", "link"}


class _Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    def hidden(self) -> bool:
        """Hidden by itself or an ancestor (the `hidden` attribute: no author CSS is left)."""
        node = self
        while node is not None:
            if "hidden" in node.attrs:
                return True
            node = node.parent
        return False

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


class _Sanitized(HTMLParser):
    """The explorable's HTML as the sanitizer leaves it, as a tree."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = _Node("root", {}, None)
        self.here, self.dropping = self.root, 0

    def handle_starttag(self, tag, attrs):
        if tag in DROPPED_ELEMENTS:
            self.dropping += 1
            return
        if self.dropping:
            return
        node = _Node(tag, {k: v for k, v in attrs if k in KEPT_ATTRS and (v or k in EMPTY_OK)}, self.here)
        self.here.children.append(node)
        if tag not in VOID:
            self.here = node

    def handle_endtag(self, tag):
        if tag in DROPPED_ELEMENTS:
            self.dropping -= 1
        elif not self.dropping and tag not in VOID and self.here.parent is not None:
            self.here = self.here.parent

    def handle_data(self, data):
        if not self.dropping:
            self.here.text += data


def _plot(scale, side):
    fig, ax = plt.subplots()
    x = np.linspace(-3, 3, 31)
    ax.plot(x, np.tanh(scale * (x - {"left": -1.0, "centre": 0.0}[side])))
    return fig


@pytest.fixture
def sanitized():
    ex = explorable(_plot, {"scale": control("slope", [0.5, 1.0, 2.0, 4.0]),
                            "side": control("centre", ["left", "centre"])},
                    alt=lambda scale, side: f"A tanh curve of slope {scale:g}, centred {side}.",
                    initial={"scale": 1.0}, title="A tanh curve")
    plt.close("all")
    parser = _Sanitized()
    parser.feed(ex.to_html())
    parser.close()
    return ex, list(parser.root.walk())


def test_untrusted_explorable_shows_its_first_frame_alt_and_the_note(sanitized):
    ex, nodes = sanitized
    imgs = [n for n in nodes if n.tag == "img"]
    assert len(imgs) == 1 and not imgs[0].hidden()
    assert imgs[0].attrs["src"].startswith("data:image/png;base64,")
    assert imgs[0].attrs["alt"] == "A tanh curve of slope 1, centred left."
    notes = [n for n in nodes if "preln-explorable-note" in n.attrs.get("class", "")]
    assert [n.text for n in notes] == [UNTRUSTED_NOTE] and not notes[0].hidden()
    assert "run the notebook (or trust it)" in UNTRUSTED_NOTE and "without a kernel" in UNTRUSTED_NOTE


def test_untrusted_explorable_shows_no_control(sanitized):
    _, nodes = sanitized
    # the slider and the segmented toggle are spans (their roles are dropped: found by their
    # classes), beside the slider its step and play buttons
    controls = [n for n in nodes if n.tag in ("select", "button")
                or {"preln-slider", "preln-segmented"} & set(n.attrs.get("class", "").split())]
    assert len(controls) == 5, "the fixture has a slider with three buttons and a toggle"
    shown = [n.tag for n in controls if not n.hidden()]
    assert shown == [], f"controls visible without the explorable's script and style: {shown}"
