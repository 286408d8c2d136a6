"""Every drawn figure of the site has its dark twin in dark mode (issue 33, dark mode): the build's
extension (book/_ext/diagrams.py) pairs each diagram of preln.chapters.diagrams, and the intro's
chapter map (book/_ext/chapter_map.py), with its -dark.svg. A name the pairing missed showed its
light drawing on the theme's grey mat in dark mode (int8_pipeline: a digit in the name)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

from preln.chapters.diagrams import DIAGRAMS, THEMES

ROOT = Path(__file__).resolve().parents[1]
CORE = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]["preln_core_path"]


def _ext(name):
    spec = importlib.util.spec_from_file_location(f"{name}_ext", ROOT / "book" / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paired(uri: str):
    """The (light, dark) images the extension makes of a figure of ``uri``, or None if untouched."""
    doc = new_document("test", get_default_settings(Parser))
    figure = nodes.figure("", nodes.image(uri=uri, alt="A"), nodes.caption("", "Caption"))
    doc += figure
    _ext("diagrams").DarkVariant(doc).apply()
    return figure[0].children if isinstance(figure[0], nodes.container) else None


@pytest.mark.parametrize("name", sorted(DIAGRAMS))
def test_every_diagram_is_paired(name):
    pair = _paired(f"diagrams/{name}.svg")
    assert pair is not None, f"diagrams/{name}.svg is not paired with its dark variant"
    assert [p["uri"] for p in pair] == [f"diagrams/{name}.svg", f"diagrams/{name}-dark.svg"]


def test_the_chapter_map_is_paired():
    pair = _paired("_generated/chapter_map.svg")
    assert pair is not None and pair[1]["uri"] == "_generated/chapter_map-dark.svg"
    assert _paired("_generated/other.svg") is None       # only what is drawn twice


def test_the_dark_chapter_map_is_the_light_one_in_the_dark_theme_colours():
    m = _ext("chapter_map")
    light, dark = (m.chapter_map_svg(ROOT, CORE, mode) for mode in ("light", "dark"))
    for old, new in zip(m.COLOURS["light"], m.COLOURS["dark"]):
        light = light.replace(f'"{old}"', f'"{new}"')
    assert light == dark, "the two maps differ in more than their colours"
    assert f'fill="{THEMES["dark"]["bg"]}"' in dark and f'fill="{m.PAPER}"' not in dark
    with pytest.raises(ValueError, match=r"mode: expected one of \['dark', 'light'\]; got 'sepia'"):
        m.chapter_map_svg(ROOT, CORE, "sepia")
    assert not re.search(r'fill="#(1f2328|57606a)"', dark), "light ink left in the dark map"


def test_a_scaled_pair_is_not_linked():
    """A figure given a width (the chapter map) is linked by Sphinx to its file, the link carrying
    the image's only-light / only-dark class; the twins opt out (Sphinx's no-scaled-link)."""
    doc = new_document("test", get_default_settings(Parser))
    figure = nodes.figure("", nodes.image(uri="_generated/chapter_map.svg", alt="A", width="360px"))
    doc += figure
    _ext("diagrams").DarkVariant(doc).apply()
    assert all("no-scaled-link" in twin["classes"] for twin in figure[0].children)
    unscaled = _paired("diagrams/shape_flow.svg")
    assert not any("no-scaled-link" in twin["classes"] for twin in unscaled)
