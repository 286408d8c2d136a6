"""The book's diagrams (preln/chapters/diagrams.py, book/_ext/diagrams.py): both variants written,
valid SVG with their words as <text>, readable on a phone, self-contained, in contrast, and
labelled with the shapes the package computes."""
import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Parser
from docutils.utils import new_document

from preln import LlamaBlock, TransformerBlock
from preln.chapters import diagrams as dg
from preln.chapters.shapes import shape_flow
from preln.chapters.viz import contrast_ratio
from preln.parallel.tensor import shard_params

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"
MODES = ("light", "dark")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diagrams")
    paths = dg.write_all(folder)
    return folder, paths


def texts(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter(SVG + "text")]


def joined(name: str) -> str:
    return "\n".join(texts(dg.render(name)))


def test_every_diagram_is_written_in_both_variants_and_parses(written):
    folder, paths = written
    assert sorted(p.name for p in paths) == sorted(dg.file_name(n, m) for n in dg.DIAGRAMS for m in MODES)
    for name, diagram in dg.DIAGRAMS.items():
        assert any((ROOT / "book" / f"{diagram.chapter}{ext}").is_file() for ext in (".ipynb", ".md")), \
            diagram.chapter
        light, dark = ((folder / dg.file_name(name, m)).read_text(encoding="utf-8") for m in MODES)
        assert light != dark
        # the same words in both: only the colours change
        assert texts(light) == texts(dark) and len(texts(light)) >= 10
        for svg in (light, dark):
            root = ET.fromstring(svg)
            assert root.tag == SVG + "svg" and root.get("role") == "img"
            assert root.get("width") == str(dg.WIDTH)
            assert root.get("viewBox") == f"0 0 {dg.WIDTH} {root.get('height')}"
            title, desc = root.find(SVG + "title"), root.find(SVG + "desc")
            assert title is not None and len(title.text) > 10
            assert desc is not None and len(desc.text) > 200     # the whole diagram in words


def test_writing_again_leaves_unchanged_files_alone(written):
    folder, _ = written
    path = folder / dg.file_name("shape_flow", "light")
    before = path.stat().st_mtime_ns
    dg.write_all(folder)
    assert path.stat().st_mtime_ns == before      # Sphinx would otherwise rebuild the page


def test_text_stays_readable_on_a_phone():
    assert dg.MIN_FONT * min(1.0, dg.PHONE_COLUMN_PX / dg.WIDTH) >= dg.MIN_SHOWN_PX
    for name in dg.DIAGRAMS:
        sizes = [float(t.get("font-size")) for t in ET.fromstring(dg.render(name)).iter(SVG + "text")]
        assert min(sizes) >= dg.MIN_FONT, name


def test_every_label_fits_the_diagram_and_the_width_estimate_is_an_upper_bound():
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    for name in dg.DIAGRAMS:
        for t in ET.fromstring(dg.render(name)).iter(SVG + "text"):
            words, size = "".join(t.itertext()), float(t.get("font-size"))
            bold = t.get("font-weight") == "bold"
            est = dg.text_width(words, size, bold)
            prop = FontProperties(family="DejaVu Sans", weight="bold" if bold else "normal")
            assert est >= TextPath((0, 0), words, size=size, prop=prop).get_extents().width, words
            x = float(t.get("x"))
            left = {"start": x, "middle": x - est / 2, "end": x - est}[t.get("text-anchor")]
            assert 0 <= left and left + est <= dg.WIDTH, (name, words)
    with pytest.raises(ValueError, match="lines: .* wider than its 40 px box"):
        dg.Canvas(dg.THEMES["light"]).labelled(0, 0, 40, 30, ["softmax per row"])
    with pytest.raises(ValueError, match="size: expected at least MIN_FONT"):
        dg.Canvas(dg.THEMES["light"]).text(0, 0, "x", size=dg.MIN_FONT - 1)


def test_self_contained_no_external_reference():
    for name in dg.DIAGRAMS:
        for mode in MODES:
            svg = dg.render(name, mode)
            root = ET.fromstring(svg)
            for el in root.iter():
                assert el.tag.split("}")[1] not in {"image", "script", "foreignObject", "style", "a", "use"}
                for key, value in el.attrib.items():
                    assert "href" not in key, (name, key)
                    assert "http" not in value and "//" not in value, (name, key, value)
                    for ref in re.findall(r"url\(([^)]*)\)", value):
                        assert ref.startswith("#") and root.find(f".//*[@id='{ref[1:]}']") is not None


def test_colours_are_the_page_s_and_in_contrast():
    for mode, t in dg.THEMES.items():
        fills = [v for k, v in t.items() if k.endswith("_fill")] + [t["bg"]]
        for fill in fills:
            assert contrast_ratio(t["ink"], fill) >= dg.TEXT_CONTRAST, (mode, fill)
            assert contrast_ratio(t["muted"], fill) >= dg.TEXT_CONTRAST, (mode, fill)
        for role in dg._HUES:
            assert contrast_ratio(t[role], t["bg"]) >= dg.LINE_CONTRAST, (mode, role)
    # the dark page is the theme's dark background, so the image sits on the page unframed
    assert dg.THEMES["dark"]["bg"] in dg.render("shape_flow", "dark")
    assert dg.THEMES["light"]["bg"] in dg.render("shape_flow", "light")


def test_tensor_parallel_labels_are_shard_params_shapes():
    block = TransformerBlock(dg.TP_CONFIG, dtype=np.float64, seed=0)
    shard = shard_params(block, block.params, dg.TP_WORLD, 0)
    words = joined("tensor_parallel")
    for key, label in [("self_attn.in_proj_weight", "Wᵢₙ rows"),
                       ("self_attn.out_proj.weight", "Wₒᵤₜ cols"),
                       ("linear1.weight", "W₁ rows"), ("linear2.weight", "W₂ cols")]:
        rows, cols = shard[key].shape
        assert words.count(f"{label} ({rows}, {cols})") == dg.TP_WORLD, key
    H, F, P = dg.TP_CONFIG.n_heads, dg.TP_CONFIG.d_ff, dg.TP_WORLD
    assert f"heads {H // P}–{H - 1} of {H}" in words and f"units {F // P}–{F - 1}" in words
    assert words.count("column parallel") == 2 * P and words.count("row parallel") == 2 * P
    assert words.count("forward: all-reduce · SP: reduce-scatter") == 2      # one per sublayer


def test_shape_flow_boxes_are_the_ops_bytes():
    flow = shape_flow(dg.FLOW_CONFIG, dg.FLOW_B, dg.FLOW_S)
    words = joined("shape_flow")
    for r in flow.rows:
        assert dg.pretty(r.equation) in words
        size = dg._kib(r.out_bytes) if r.out_bytes else "a view"
        assert f"{dg._shape(r.output)}" in words and size in words
    # box area is proportional to bytes: the side of the (B, H, S, S) scores over (B, S, D)'s
    root = ET.fromstring(dg.render("shape_flow"))
    sides = sorted({float(r.get("width")) for r in root.iter(SVG + "rect") if r.get("rx") == "2"
                    and r.get("stroke-dasharray") is None and float(r.get("width")) > 14})
    big, small = flow.row("attn.scores").out_bytes, flow.row("norm1").out_bytes
    assert sides[-1] / sides[0] == pytest.approx(np.sqrt(big / small))
    assert sides[-1] == dg.FLOW_MAX_SIDE


def test_attention_draws_one_lane_per_head():
    words = texts(dg.render("attention_heads"))
    H = dg.MHA_CONFIG.n_heads
    assert [w for w in words if re.fullmatch(r"head \d+", w)] == [f"head {j + 1}" for j in range(H)]
    assert f"D = {dg.MHA_CONFIG.d_model}, H = {H} heads of dₕ = D / H = {dg.MHA_CONFIG.d_head}" in words


def test_block_graph_numbers_the_backward_and_sums_where_a_tensor_fed_two_ops():
    rows, edges, sums = dg.block_graph()
    words = texts(dg.render("block_graph"))
    n = len(rows)
    assert [w for w in words if w.isdigit()] == [str(n - i) for i in range(n)]
    names = [r.name for r in rows]
    # x and x1 each feed a norm and a residual add: their gradients meet at the norm
    assert {names[i]: nm for i, nm in sums.items()} == {"norm1": "x", "norm2": "x1"}
    assert "∂γ, ∂β, + dx′" in words and "∂γ, ∂β, + dx" in words
    assert (names.index("attn.split_heads"), names.index("attn.weighted_sum"), "v") in edges


def test_paged_cache_is_the_batcher_s():
    steps, snap, tables, lengths, used = dg.paged_scenario()
    assert used == steps[snap].blocks_used and sum(lengths.values()) == steps[snap].tokens_stored
    assert len(steps[snap].running) == len(dg.PAGED_REQUESTS)
    words = texts(dg.render("paged_kv_cache"))
    for r, table in tables.items():
        assert f"seq {'ABC'[r]}: {lengths[r]} tokens" in words
        assert -(-lengths[r] // dg.PAGED_BLOCK_SIZE) == len(table)     # no block more than needed
    assert words.count("P") == len(dg.PAGED_REQUESTS)                    # one prefill each
    assert words.count("free") == dg.PAGED_BLOCKS - used
    H, Hkv = dg.LLAMA_CONFIG.n_heads, dg.LLAMA_CONFIG.n_kv_heads
    assert [w for w in words if re.fullmatch(r"q\d+", w)] == [f"q{h}" for h in range(H)]
    assert [w for w in words if re.fullmatch(r"k\d+, v\d+", w)] == [f"k{g}, v{g}" for g in range(Hkv)]


def test_gpt_vs_llama_counts_the_blocks_parameters():
    words = joined("gpt_vs_llama")
    for block in (TransformerBlock(dg.GPT_CONFIG, seed=0), LlamaBlock(dg.LLAMA_CONFIG, seed=0)):
        assert f"{sum(v.size for v in block.params.values()):,} parameters" in words
    g, m = dg.GPT_CONFIG, dg.LLAMA_CONFIG
    assert f"MLP {g.d_model}→{g.d_ff}→{g.d_model}" in words
    assert f"SwiGLU {m.d_model}→{m.d_ff}→{m.d_model}" in words
    assert f"GQA: {m.n_kv_heads} k, v heads" in words


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"name: expected one of .*got 'nope'"):
        dg.render("nope")
    with pytest.raises(ValueError, match=r"mode: expected one of \['dark', 'light'\]; got 'sepia'"):
        dg.render("shape_flow", "sepia")


# -- the build's extension: a light diagram becomes the light/dark pair --------------------------
def extension():
    spec = importlib.util.spec_from_file_location("diagrams_ext", ROOT / "book" / "_ext" / "diagrams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_extension_pairs_each_diagram_with_its_dark_variant():
    ext = extension()
    doc = new_document("test", get_default_settings(Parser))
    image = nodes.image(uri="diagrams/shape_flow.svg", alt="Shapes", classes=[])
    other = nodes.image(uri="logo.svg", alt="Logo")
    figure = nodes.figure("", image, nodes.caption("", "Caption"))
    doc += [figure, other]
    ext.DarkVariant(doc).apply()
    pair = figure[0]
    assert isinstance(pair, nodes.container) and isinstance(figure[1], nodes.caption)
    light, dark = pair.children
    assert (light["uri"], light["classes"]) == ("diagrams/shape_flow.svg", ["only-light"])
    assert (dark["uri"], dark["classes"], dark["loading"]) == ("diagrams/shape_flow-dark.svg",
                                                              ["only-dark"], "lazy")
    assert light["alt"] == dark["alt"] == "Shapes"
    assert other["classes"] == [] and other["uri"] == "logo.svg"   # other images untouched


def test_the_build_wires_the_extension():
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["sphinx"]["local_extensions"]["diagrams"] == "book/_ext"


def test_the_kept_diagrams_are_what_the_package_draws():
    """book/diagrams/ is in git (JupyterLab shows a chapter's diagrams before any build) and is
    what the package draws now: after a change to the package, `make book` rewrites it."""
    folder = ROOT / "book" / "diagrams"
    stale = [dg.file_name(name, mode) for name in dg.DIAGRAMS for mode in MODES
             if not (folder / dg.file_name(name, mode)).is_file()
             or (folder / dg.file_name(name, mode)).read_text(encoding="utf-8") != dg.render(name, mode)]
    assert not stale, f"book/diagrams/ differs from the package's drawing (run make book): {stale}"


def test_every_diagram_is_shown_in_its_chapter():
    for name, diagram in dg.DIAGRAMS.items():
        source = next(p for p in (ROOT / "book" / f"{diagram.chapter}{ext}" for ext in (".ipynb", ".md"))
                      if p.is_file())
        assert f"diagrams/{dg.file_name(name, 'light')}" in source.read_text(encoding="utf-8"), name


def test_the_block_at_a_glance_is_the_default_block():
    words = texts(dg.render("preln_block"))
    cfg = dg.BLOCK_CONFIG
    assert f"D = {cfg.d_model}, H = {cfg.n_heads}, F = {cfg.d_ff}" in words
    assert f"H = {cfg.n_heads} heads of dₕ = {cfg.d_head}" in words
    assert [w for w in words if "LayerNorm" in w] == ["LN₁: LayerNorm", "LN₂: LayerNorm"]
    assert words.count("+") == 2 and words.count("identity") == 2       # two residual adds
    # the intro, the site's front page, shows it; the old hand-drawn strip is gone
    assert not (ROOT / "book" / "preln_block.svg").exists()
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert "```{figure} diagrams/preln_block.svg" in intro


def test_flash_loops_number_the_package_s_tiles_in_each_order():
    from preln.ops.attention import K_TILE, Q_TILE, tile_pairs

    S, fa2, fa1 = dg.flash_orders()
    assert fa2 == list(tile_pairs(S, S, Q_TILE, K_TILE, causal=True))     # the package's loop
    assert sorted(fa1) == sorted(fa2) and fa1 != fa2                       # same tiles, swapped loops
    assert [t[2] for t in fa1] == sorted(t[2] for t in fa1)                # FA-1: key tiles outer
    assert [t[0] for t in fa2] == sorted(t[0] for t in fa2)                # FA-2: query tiles outer
    words = texts(dg.render("flash_loops"))
    steps = [int(w) for w in words if w.isdigit()]
    assert sorted(steps) == sorted(2 * list(range(1, len(fa2) + 1)))       # each tile once per panel
    assert f"causal S = {S}: score tiles of {Q_TILE} queries × {K_TILE} keys" in words
    assert f"{len(fa1)} writes of an O tile" in words
    assert f"{S // Q_TILE} writes, one per query tile" in words


def test_gguf_blocks_are_the_reader_s_block_sizes_and_permutation():
    from preln.gguf.file import BLOCK, BLOCK_BYTES, dequantize_blocks, permute_qk

    words = texts(dg.render("gguf_blocks"))
    for fmt in ("Q8_0", "Q4_1"):
        assert f"{fmt}: {BLOCK} weights in {BLOCK_BYTES[fmt]} bytes" in words
        assert f"{8 * BLOCK_BYTES[fmt] / BLOCK:g} bits/weight" in words
    # what the diagram says of a Q4_1 byte is what the reader decodes: low nibble weight j,
    # high nibble weight j + 16 (scale 1, minimum 0)
    block = np.zeros(BLOCK_BYTES["Q4_1"], np.uint8)
    block[:2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    block[4 + 3] = 0x5A                                        # byte j = 3
    w = dequantize_blocks(block[None], "Q4_1")[0]
    assert (w[3], w[3 + BLOCK // 2]) == (0xA, 0x5)
    assert "weight j" in words and f"weight j + {BLOCK // 2}" in words
    dh = dg.PERMUTE_D_HEAD
    order = [int(r) for r in permute_qk(np.arange(dh), 1)]
    digits = [w for w in words if w.isdigit() and len(w) == 1]
    assert digits[-2 * dh:] == [str(r) for r in range(dh)] + [str(r) for r in order]


def test_int8_pipeline_states_the_package_s_bound_and_defaults():
    import inspect

    from preln.quant.int8 import SCHEME_OPTIONS, QLinear, int32_max_terms, qmax

    # the defaults named are the ones a quantised layer takes
    defaults = inspect.signature(QLinear).parameters
    assert SCHEME_OPTIONS["llm.int8"]["threshold"] == defaults["threshold"].default
    assert SCHEME_OPTIONS["smoothquant"]["alpha"] == defaults["alpha"].default
    words = joined("int8_pipeline")
    assert f"exact for K ≤ {int32_max_terms(8):,} terms" in words
    assert f"int8 in ±{qmax(8)}" in words
    assert f"some |x| ≥ {SCHEME_OPTIONS['llm.int8']['threshold']:g}" in words
    assert f"α = {SCHEME_OPTIONS['smoothquant']['alpha']:g}" in words


def test_float_formats_are_ml_dtypes_fields():
    import ml_dtypes

    words = texts(dg.render("float_formats"))
    for name in dg.FLOAT_FORMATS:
        f = ml_dtypes.finfo(getattr(ml_dtypes, name, None) or np.dtype(name))
        assert name in words
        assert dg.float_fields(name)[:3] == (f.bits, f.nexp, f.nmant)
        assert 1 + f.nexp + f.nmant == f.bits
    # the bars are drawn to one scale: a cell per bit, so float16 is half of float32
    root = ET.fromstring(dg.render("float_formats"))
    widths = [float(r.get("width")) for r in root.iter(SVG + "rect") if r.get("rx") == "0"
              and float(r.get("height")) == 22]
    per_bit = (dg.WIDTH - 20) / 32
    assert sum(widths[:3]) == pytest.approx(32 * per_bit) and sum(widths[3:6]) == pytest.approx(16 * per_bit)
    assert "65,504" in " ".join(words) and "448" in " ".join(words)


def test_pipeline_schedules_draw_the_package_s_schedules_and_their_peaks():
    from preln.chapters import parallel as par

    p, m = dg.PIPELINE_P, dg.PIPELINE_M
    scheds = dg.pipeline_schedules()
    for drawn, sched in zip(scheds.values(), (par.gpipe_train_schedule(p, m), par.one_f_one_b_schedule(p, m))):
        assert all(np.array_equal(a, b) for a, b in zip(drawn, sched))
    root = ET.fromstring(dg.render("pipeline_schedules"))
    cells = [("".join(t.itertext()), t.get("font-weight") == "bold") for t in root.iter(SVG + "text")]
    words = [w for w, _ in cells]
    for name, sched in scheds.items():
        # row by row: the stage (from 0), each busy step's micro-batch (from 1, as the chapter's
        # GPipe figure counts them; a backward in bold), the peak
        want = []
        for s in range(p):
            want.append((str(s), False))
            want += [(str(max(f, b) + 1), b >= 0) for f, b in zip(sched.forward[s], sched.backward[s])
                     if f >= 0 or b >= 0]
            want.append((str(sched.peak_in_flight[s]), True))
        start = words.index(name)
        assert cells[start + 4:start + 4 + len(want)] == want, name
        assert f"{sched.makespan} steps · bubble {round(100 * sched.bubble)} % · time →" in words
    assert list(scheds["1F1B"].peak_in_flight) == [p - s for s in range(p)]
    assert list(scheds["GPipe"].peak_in_flight) == [m] * p
    assert f"p = {p}, m = {m}" in words


GENERATED_ALTS = [n for n, d in dg.DIAGRAMS.items() if d.alt is not None]


@pytest.mark.parametrize("name", GENERATED_ALTS)
def test_the_chapter_s_alt_is_the_one_built_from_the_package(name):
    """The figure's :alt: in its chapter is dg.alt(name), word for word (rewrite the option from
    dg.alt when a constant changes)."""
    import nbformat

    chapter = dg.DIAGRAMS[name].chapter
    nb = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if f"diagrams/{dg.file_name(name, 'light')}" in c.source)
    figure = source[source.index(f"diagrams/{dg.file_name(name, 'light')}"):]
    alts = re.findall(r"^:alt: (.*)$", figure, re.M)
    assert alts and alts[0] == dg.alt(name)


def test_alt_texts_follow_the_constants_they_state(monkeypatch):
    """Change a constant the drawing reads and the alt text says the new value."""
    from preln.gguf import file as gguf_file

    before = {n: dg.alt(n) for n in GENERATED_ALTS}
    monkeypatch.setitem(gguf_file.BLOCK_BYTES, "Q8_0", 99)
    assert "Q8_0 block of 99 bytes" in dg.alt("gguf_blocks")
    monkeypatch.setattr(dg, "BLOCK", 64)
    assert "weight j + 32" in dg.alt("gguf_blocks") and "64 int8 codes" in dg.alt("gguf_blocks")
    monkeypatch.setattr(dg, "FLOAT_FORMATS", ("float16", "bfloat16"))
    assert dg.alt("float_formats").startswith("Diagram: the bit fields of float16 (1 sign, 5 exponent,"
                                              " 10 mantissa bits) and bfloat16 (1, 8, 7),")
    monkeypatch.setitem(dg.SCHEME_OPTIONS["smoothquant"], "alpha", 0.8)
    assert "α = 0.8" in dg.alt("int8_pipeline")
    monkeypatch.setattr(dg, "Q_TILE", dg.K_TILE)
    assert f"{dg.K_TILE} queries by {dg.K_TILE} keys" in dg.alt("flash_loops")
    monkeypatch.setattr(dg, "PIPELINE_M", 2)
    assert "for 2 micro-batches" in dg.alt("pipeline_schedules") and ": 2, 2, 2, 1." in dg.alt("pipeline_schedules")
    assert all(dg.alt(n) != before[n] for n in GENERATED_ALTS)
    with pytest.raises(ValueError, match="name: expected a diagram with a generated alt.*got 'shape_flow'"):
        dg.alt("shape_flow")
