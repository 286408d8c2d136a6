"""Sphinx extension: the chapters' diagrams, drawn from the package when the build starts.

preln.chapters.diagrams draws each diagram twice, for the theme's light and dark mode, into
book/diagrams/ (<name>.svg and <name>-dark.svg; a file is rewritten only when it changed), so they
never lag the code. The files are kept in git too, so that a notebook opened in JupyterLab shows
them before any build; tests/test_diagrams.py fails when a kept file differs from what the
package draws. A chapter
shows one with a plain MyST figure of the light file; here that image becomes the pair, in a
<div> of its own: the light one with the theme's `only-light` class, the dark one `only-dark`
(pydata-sphinx-theme shows one per mode, and leaves `only-dark` images undimmed). The div keeps
the figure's caption from being a sibling of the images, which the theme's
`.only-light ~ figcaption` rule would hide in dark mode. The dark image loads lazily: in light mode
(and in the PDF, printed light) it is never shown, so never fetched. An SVG shown by <img> cannot
see the page's CSS, hence two files rather than one that follows the theme.
"""
from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

from preln.chapters.diagrams import DIAGRAMS, file_name, write_all

GENERATED = Path("book") / "diagrams"
# a figure's image that is a light diagram: .../diagrams/<name>.svg, or the intro's chapter map
# (.../_generated/chapter_map.svg, drawn in both modes by book/_ext/chapter_map.py)
LIGHT = re.compile(r"(^|/)(diagrams|_generated)/(?P<name>[a-z0-9_]+)\.svg$")
DRAWN_TWICE = set(DIAGRAMS) | {"chapter_map"}


class DarkVariant(SphinxTransform):
    """Each light diagram image -> a div holding it (only-light) and its dark twin (only-dark)."""

    default_priority = 400     # after MyST has made the figure, before images are collected

    def apply(self, **kwargs):
        for image in list(self.document.findall(nodes.image)):
            m = LIGHT.search(image.get("uri", ""))
            if not m or m["name"] not in DRAWN_TWICE:
                continue
            dark = image.deepcopy()
            dark["uri"] = image["uri"][:-len(file_name(m["name"], "light"))] + file_name(m["name"], "dark")
            dark["classes"] = [c for c in image["classes"] if c != "only-light"] + ["only-dark"]
            dark["loading"] = "lazy"
            light = image.deepcopy()
            light["classes"] = light["classes"] + ["only-light"]
            if any(k in image for k in ("width", "height", "scale")):
                # Sphinx links a scaled image to its file, the link taking the image's classes:
                # the hidden twin's link then stayed in the Tab order of the other mode (a Tab
                # stop with no box). A diagram is vector and scales itself: no link, as unscaled.
                for twin in (light, dark):
                    twin["classes"] = twin["classes"] + ["no-scaled-link"]
            pair = nodes.container("", light, dark, classes=["preln-diagram"])
            image.replace_self(pair)


def write_diagrams(app):
    write_all(Path(app.srcdir) / GENERATED)


def setup(app):
    app.connect("builder-inited", write_diagrams)
    app.add_transform(DarkVariant)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
