"""preln.chapters.shapes agrees with the real block: every row's output shape against the block's cache,
the kept bytes against block.cache_nbytes(), the matmul FLOPs against the closed form."""
import itertools

import matplotlib
import ml_dtypes
import numpy as np
import pytest

from preln import BlockConfig, TransformerBlock
from preln.chapters import shapes
from preln.ops import merge_heads
from preln.chapters.shapes import closed_form_flops, fit_exponent, observed_shapes, shape_flow

matplotlib.use("Agg")

CONFIGS = [
    dict(d_model=8, n_heads=2, d_ff=16),
    dict(d_model=32, n_heads=4, d_ff=48, activation="relu"),
    dict(d_model=24, n_heads=3, d_ff=96, activation="gelu_tanh", causal=True),
    dict(d_model=16, n_heads=1, d_ff=64, norm_first=False),
    dict(d_model=16, n_heads=4, d_ff=32, dropout=0.1),
    dict(d_model=16, n_heads=2, d_ff=32, dropout=0.2, norm_first=False, causal=True),
]
SIZES = [(1, 1), (2, 5), (3, 300)]   # S = 300 > Q_TILE: the tiled path runs several tiles
DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]


def run(cfg_kwargs, B, S, dtype=np.float32, training=True, mask=False, attention="auto"):
    cfg = BlockConfig(**cfg_kwargs)
    block = TransformerBlock(cfg, dtype=dtype, seed=0, attention=attention).train(training)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, cfg.d_model)).astype(block.dtype)
    kpm = None
    if mask:
        kpm = np.zeros((B, S), bool)
        kpm[:, S // 2:] = True
    y = block(x, kpm)
    flow = shape_flow(cfg, B, S, dtype=dtype, training=training, attention=attention,
                      key_padding_mask=mask)
    return cfg, block, x, y, flow


def root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def cache_shapes(block, x, y):
    """Output shape of each op, read straight from the cache (independent of shapes.py)."""
    c = block.cache
    cfg = block.config
    B, S, D = x.shape
    H, dh = cfg.n_heads, cfg.d_head
    sd = c.attn.sdpa
    got = {
        "attn.in_proj": (B, S, sd.q.shape[1] * sd.q.shape[3] * 3),
        "attn.split_heads": sd.q.shape,
        "attn.merge_heads": c.attn.out_proj.x.shape,
        "mlp.linear1": c.mlp.act.x.shape,
        f"mlp.{cfg.activation}": c.mlp.linear2.x.shape,
    }
    assert sd.q.shape == sd.k.shape == sd.v.shape == (B, H, S, dh)
    assert root(sd.q) is root(sd.k) is root(sd.v)       # views of one qkv buffer
    if sd.p is not None:
        got["attn.scores"] = got["attn.softmax"] = sd.p.shape
        got["attn.weighted_sum"] = sd.q.shape
        if sd.drop_mask is not None:
            got["attn.dropout"] = sd.drop_mask.shape
    else:
        got["attn.tiled"] = sd.q.shape
    for name, m in (("dropout1", c.attn.drop_mask), ("mlp.dropout", c.mlp.hidden_mask),
                    ("dropout2", c.mlp.drop_mask)):
        if m is not None:
            got[name] = m.shape
    if cfg.norm_first:
        got.update(norm1=c.attn.in_proj.x.shape, residual1=c.ln2.x.shape, norm2=c.mlp.linear1.x.shape,
                   residual2=y.shape)
        got["attn.out_proj"] = c.ln2.x.shape
        got["mlp.linear2"] = y.shape
    else:
        got.update(residual1=c.ln1.x.shape, norm1=c.mlp.linear1.x.shape, residual2=c.ln2.x.shape,
                   norm2=y.shape)
        got["attn.out_proj"] = c.ln1.x.shape
        got["mlp.linear2"] = c.ln2.x.shape
    return got


@pytest.mark.parametrize("cfg_kwargs", CONFIGS)
@pytest.mark.parametrize("B,S", SIZES)
@pytest.mark.parametrize("training", [True, False])
def test_rows_match_the_block(cfg_kwargs, B, S, training):
    cfg, block, x, y, flow = run(cfg_kwargs, B, S, training=training)
    got = cache_shapes(block, x, y)
    names = [r.name for r in flow.rows]
    assert sorted(names) == sorted(got), f"rows {names} vs ops seen in the cache {sorted(got)}"
    for r in flow.rows:
        assert r.output == got[r.name], f"{r.name}: accounting {r.output}, block {got[r.name]}"
    assert observed_shapes(block, y) == {r.name: r.output for r in flow.rows}
    assert flow.totals["kept_bytes"] == block.cache_nbytes()
    assert flow.path == ("plain" if training else "tiled")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("cfg_kwargs", CONFIGS)
@pytest.mark.parametrize("training,mask", [(True, False), (True, True), (False, True)])
def test_kept_bytes_equal_cache_nbytes(dtype, cfg_kwargs, training, mask):
    cfg, block, x, y, flow = run(cfg_kwargs, 2, 300, dtype=dtype, training=training, mask=mask)
    assert flow.totals["kept_bytes"] == block.cache_nbytes()
    c = block.cache
    if training:   # the kept dtypes: P in the storage dtype, LayerNorm statistics in >= float32
        p_row = flow.row("attn.softmax")
        assert c.attn.sdpa.p.dtype == p_row.kept[0][2] == block.dtype
    mean_dtype = [d for n, s, d in flow.row("norm1").kept if n == "mean"][0]
    assert c.ln1.mean.dtype == mean_dtype


@pytest.mark.parametrize("attention", ["plain", "tiled"])
def test_forced_attention_path(attention):
    cfg, block, x, y, flow = run(CONFIGS[0], 2, 40, training=True, attention=attention)
    assert flow.path == attention
    assert flow.totals["kept_bytes"] == block.cache_nbytes()


def test_output_bytes_and_values_of_single_ops():
    cfg, block, x, y, flow = run(CONFIGS[1], 2, 7)
    c = block.cache
    qkv = np.concatenate([merge_heads(c.attn.sdpa.q), merge_heads(c.attn.sdpa.k),
                          merge_heads(c.attn.sdpa.v)], axis=-1)
    assert flow.row("attn.in_proj").out_bytes == qkv.nbytes
    assert flow.row("attn.softmax").kept_bytes == c.attn.sdpa.p.nbytes
    assert flow.row("attn.split_heads").out_bytes == 0          # a view
    assert flow.row("attn.merge_heads").out_bytes == c.attn.out_proj.x.nbytes   # a copy
    assert flow.row("mlp.relu").kept_bytes == c.mlp.act.x.nbytes


@pytest.mark.parametrize("cfg_kwargs", CONFIGS)
@pytest.mark.parametrize("B,S", [(1, 1), (2, 17), (3, 600)])
def test_matmul_flops_closed_form(cfg_kwargs, B, S):
    cfg = BlockConfig(**cfg_kwargs)
    D, F = cfg.d_model, cfg.d_ff
    expected = 2 * B * S * (4 * D * D + 2 * D * F) + 4 * B * S * S * D
    assert closed_form_flops(cfg, B, S) == expected
    plain = shape_flow(cfg, B, S, training=True)
    assert plain.totals["matmul_flops"] == expected == plain.totals["closed_form_flops"]
    tiled = shape_flow(cfg, B, S, training=False)
    if cfg.causal and S > 256:      # the tiled path skips key tiles wholly after the diagonal
        assert tiled.totals["matmul_flops"] < expected
    else:
        assert tiled.totals["matmul_flops"] == expected
    for flow in (plain, tiled):
        assert all(r.flops >= r.matmul_flops >= 0 for r in flow.rows)
        assert flow.totals["flops"] == sum(r.flops for r in flow.rows)


def test_matmul_flops_from_the_row_shapes():
    """Each matmul row's FLOPs are 2 m k n of its input shapes (the definition, recomputed)."""
    cfg = BlockConfig(d_model=24, n_heads=3, d_ff=40)
    B, S = 2, 9
    flow = shape_flow(cfg, B, S)
    for r in flow.rows:
        shapes_in = dict(r.inputs)
        if r.name in ("attn.in_proj", "attn.out_proj", "mlp.linear1", "mlp.linear2"):
            (xname, xs), (wname, ws) = r.inputs
            assert r.matmul_flops == 2 * int(np.prod(xs[:-1])) * ws[1] * ws[0]
        elif r.name == "attn.scores":
            b, h, s, dh = shapes_in["q"]
            assert r.matmul_flops == 2 * b * h * s * s * dh
        elif r.name == "attn.weighted_sum":
            b, h, s, s2 = shapes_in["p"]
            assert r.matmul_flops == 2 * b * h * s * s2 * shapes_in["v"][-1]
        else:
            assert r.matmul_flops == 0


def test_tiled_causal_flops_about_half():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32, causal=True)
    S = 4096
    tiled = shape_flow(cfg, 1, S, training=False)
    attn = tiled.row("attn.tiled").matmul_flops
    full = 4 * S * S * cfg.d_model
    assert 0.5 < attn / full < 0.6   # 1/2 plus the partly masked diagonal tiles


def test_dropout_rows_only_when_training():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.1)
    train = [r.name for r in shape_flow(cfg, 1, 4, training=True).rows]
    evals = [r.name for r in shape_flow(cfg, 1, 4, training=False).rows]
    assert {"attn.dropout", "dropout1", "mlp.dropout", "dropout2"} <= set(train)
    assert not any("dropout" in n for n in evals)


def test_params_total():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32)
    block = TransformerBlock(cfg, dtype=np.float64)
    flow = shape_flow(cfg, 1, 1, dtype=np.float64)
    assert flow.totals["params"] == sum(p.size for p in block.params.values())
    assert flow.totals["param_bytes"] == sum(p.nbytes for p in block.params.values())


@pytest.mark.parametrize("bad", [dict(B=0), dict(S=-1), dict(B=1.5), dict(attention="fast"),
                                 dict(dtype="int8")])
def test_bad_arguments(bad):
    kwargs = dict(config=BlockConfig(), B=1, S=2) | bad
    with pytest.raises((ValueError, TypeError)):
        shape_flow(**kwargs)
    with pytest.raises(TypeError, match="config"):
        shape_flow({"d_model": 4}, 1, 1)


def test_row_lookup():
    flow = shape_flow(BlockConfig(), 1, 2)
    assert flow.row("norm1").name == "norm1"
    with pytest.raises(KeyError, match="no op"):
        flow.row("attention")


# ---- measurement helpers ------------------------------------------------------------------

def test_fit_exponent_recovers_a_power_law():
    x = np.array([2.0, 4.0, 8.0, 16.0])
    fit = fit_exponent(x, 3.0 * x ** 1.7)
    assert fit.exponent == pytest.approx(1.7, abs=1e-12)
    assert fit.coefficient == pytest.approx(3.0, rel=1e-12)
    assert fit(5.0) == pytest.approx(3.0 * 5.0 ** 1.7)
    with pytest.raises(ValueError, match="positive"):
        fit_exponent([1, 2], [0, 1])
    with pytest.raises(ValueError, match="same length"):
        fit_exponent([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="distinct"):
        fit_exponent([2, 2], [1, 2])


def test_flop_exponents_in_each_regime():
    cfg = BlockConfig(d_model=64, n_heads=4, d_ff=256)
    S = [4096, 8192, 16384, 32768]          # S >> 2D + F: the S^2 term
    k_S = fit_exponent(S, [shape_flow(cfg, 1, s).totals["flops"] for s in S]).exponent
    assert 1.9 < k_S < 2.0
    D = [1024, 2048, 4096, 8192]            # D >> S: the D^2 term
    k_D = fit_exponent(D, [shape_flow(BlockConfig(d_model=d, n_heads=8, d_ff=4 * d), 1, 64)
                           .totals["flops"] for d in D]).exponent
    assert 1.95 < k_D < 2.0


def test_time_forward_shapes_and_blas_threads():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32)
    t = shapes.time_forward([(cfg, 1, 8), (cfg, 1, 16)], repeats=2, warmup=0)
    assert t.best.shape == t.median.shape == (2,) and t.samples.shape == (2, 2)
    assert np.all(t.best > 0) and np.all(t.best <= t.median)
    with shapes.blas_threads(1) as n:
        assert n >= 0


def test_peak_memory_plain_is_quadratic_tiled_is_not():
    cfg = BlockConfig(d_model=16, n_heads=4, d_ff=32)
    S = 2048
    plain = shapes.peak_forward_bytes(cfg, 1, S, training=True)
    tiled = shapes.peak_forward_bytes(cfg, 1, S, training=False)
    p_bytes = 4 * S * S * 4                               # (B, H, S, S) float32
    assert plain >= shape_flow(cfg, 1, S, training=True).totals["kept_bytes"] > p_bytes
    assert shape_flow(cfg, 1, S, training=False).totals["kept_bytes"] <= tiled < p_bytes / 4


def test_formatting():
    assert shapes.format_bytes(512) == "512 B"
    assert shapes.format_bytes(1536) == "1.5 KiB"
    assert shapes.format_bytes(2 ** 30) == "1 GiB"
    assert shapes.format_count(999) == "999"
    assert shapes.format_count(12_345_678) == "12.3 M"


# ---- figures ----------------------------------------------------------------------------------

def test_explorables_are_registered_and_draw():
    # how fast a frame draws is measured by `python -m preln.bench --widgets` (a table), not here:
    # a timed assertion flips on a shared, busy machine
    import matplotlib.pyplot as plt

    from preln.chapters.figures import all_explorables
    from preln.chapters.figures import shape_flow as figs

    found = all_explorables()
    assert {"shape_flow.ops", "shape_flow.flops_split"} <= set(found)
    for name, (plot, controls) in figs.EXPLORABLES.items():
        n_frames = int(np.prod([len(v) for v in controls.values()]))
        assert n_frames <= 64, f"{name}: {n_frames} frames"
        first = {k: v[0] for k, v in controls.items()}
        last = {k: v[-1] for k, v in controls.items()}
        for kw in (first, last):
            fig = plot(**kw)
            assert hasattr(fig, "savefig")
            plt.close(fig)
    assert "S = 8192" in figs.ops_alt(8192, 64, 4)
    assert "S* = 2D + F = 384" in figs.flops_split_alt(64, 4)


def test_shape_table_lists_every_op():
    from preln.chapters.figures.shape_flow import shape_table_html

    flow = shape_flow(BlockConfig(dropout=0.1), 2, 8)
    table = shape_table_html(flow)
    for r in flow.rows:
        assert f"<code>{r.name}</code>" in table
    assert table.count("<tr") == len(flow.rows) + 2         # header, rows, total


@pytest.mark.parametrize("cfg_kwargs,B,S", list(itertools.product(CONFIGS[:2], [1, 3], [5])))
def test_observed_shapes_needs_a_forward(cfg_kwargs, B, S):
    block = TransformerBlock(BlockConfig(**cfg_kwargs))
    with pytest.raises(RuntimeError, match="forward"):
        observed_shapes(block, None)


# ---- kept bytes per token, the forward's line count, backward FLOPs (shape-flow chapter) -----

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("cfg_kwargs", CONFIGS)
def test_kept_bytes_per_token_list_adds_up_to_the_formula(dtype, cfg_kwargs):
    """c = (8D + 3F) itemsize + 4 statistics (GELU), the list of kept arrays adds up to it, and
    it is what the tiled path keeps per token (the same list shape_flow sums)."""
    cfg = BlockConfig(**cfg_kwargs)
    D, F = cfg.d_model, cfg.d_ff
    item = np.dtype(dtype).itemsize
    stat = max(item, 4)                        # LayerNorm statistics: float32 or wider
    kept = shapes.kept_bytes_per_token(cfg, dtype=dtype)
    names = [name for _, name, _ in kept]
    assert any(name.startswith("qkv") for name in names)        # the q/k/v buffer, 3D per token
    per_name = {name: b for _, name, b in kept}
    assert per_name["qkv (q, k, v are views)"] == 3 * D * item
    if cfg.activation == "gelu":
        expected = (8 * D + 2 * F) * item + F * stat + 4 * stat    # Phi(u) in the elementwise dtype
    else:
        expected = (8 * D + 2 * F) * item + 4 * stat
    assert sum(b for _, _, b in kept) == expected
    B, S = 2, 7
    tiled = shape_flow(cfg, B, S, dtype=dtype, training=False, attention="tiled")
    assert tiled.totals["kept_bytes"] == B * S * expected


def test_kept_bytes_per_token_float32_default():
    cfg = BlockConfig(d_model=64, n_heads=4, d_ff=256)
    assert sum(b for _, _, b in shapes.kept_bytes_per_token(cfg)) == (8 * 64 + 3 * 256 + 4) * 4


ARITHMETIC_LINES = ["norm1", "attn.in_proj", "attn.scores", "attn.softmax", "attn.weighted_sum",
                    "attn.out_proj", "residual1", "norm2", "mlp.linear1", "mlp.gelu", "mlp.linear2",
                    "residual2"]


def test_forward_line_count_matches_the_chapter_equation():
    """One Pre-LN forward: 14 ops, of which 12 do arithmetic (split/merge heads only move data)
    -- and the shape-flow chapter's equation has one line per arithmetic op."""
    import json
    import pathlib
    import re
    flow = shape_flow(BlockConfig(d_model=64, n_heads=4, d_ff=256), 2, 128)
    assert len(flow.rows) == 14
    arithmetic = [r.name for r in flow.rows if r.flops > 0]
    assert arithmetic == ARITHMETIC_LINES
    assert [r.name for r in flow.rows if r.flops == 0] == ["attn.split_heads", "attn.merge_heads"]
    nb = json.loads((pathlib.Path(__file__).parents[1] / "book" / "shape_flow.ipynb").read_text())
    md = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    aligned = re.search(r"\\begin\{aligned\}(.*?)\\end\{aligned\}", md, re.S).group(1)
    lines = [ln for ln in aligned.split("\\\\") if ln.strip()]
    assert len(lines) == len(arithmetic)


@pytest.mark.parametrize("cfg_kwargs", CONFIGS)
@pytest.mark.parametrize("B,S", [(1, 1), (2, 17), (3, 600)])
def test_backward_matmuls_are_twice_the_forward(cfg_kwargs, B, S):
    cfg = BlockConfig(**cfg_kwargs)
    plain = shape_flow(cfg, B, S, training=True, attention="plain")
    t = plain.totals
    assert t["backward_matmul_flops"] == 2 * t["matmul_flops"] == 2 * closed_form_flops(cfg, B, S)
    assert t["backward_matmul_flops"] == t["closed_form_backward_flops"]
    for r in plain.rows:                               # op by op: dx and dW of every product
        assert r.backward_matmul_flops == 2 * r.matmul_flops, r.name
    tiled = shape_flow(cfg, B, S, training=False, attention="tiled")
    extra = 2 * B * S * S * cfg.d_model                # the backward recomputes q k^T
    assert tiled.totals["backward_matmul_flops"] == 2 * closed_form_flops(cfg, B, S) + extra
    assert tiled.totals["backward_matmul_flops"] == tiled.totals["closed_form_backward_flops"]


def test_backward_elementwise_counts_per_op():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.1)
    B, S, D, H, F = 2, 5, 16, 2, 32
    flow = shape_flow(cfg, B, S)
    bw = {r.name: r.backward_flops - r.backward_matmul_flops for r in flow.rows}
    assert bw["norm1"] == 13 * B * S * D + 2 * B * S + 2 * D
    assert bw["attn.in_proj"] == B * S * 3 * D + 3 * D * D + 3 * D     # db + grads +=
    assert bw["attn.scores"] == 2 * B * S * D                        # tau on dq and dk
    assert bw["attn.softmax"] == 4 * B * H * S * S
    assert bw["attn.dropout"] == 4 * B * H * S * S
    assert bw["mlp.gelu"] == 7 * B * S * F
    assert bw["residual1"] == bw["residual2"] == B * S * D
    assert bw["attn.split_heads"] == bw["attn.merge_heads"] == 0


def test_training_flops_are_about_six_n_per_token():
    """Forward + backward matmuls per token = 6 N + 12 S D exactly (N: the weight matrices'
    parameters, 4 D^2 + 2 D F); with everything counted the backward is about 2x the forward."""
    for D, F, S in [(64, 256, 128), (768, 3072, 1024), (256, 1024, 16)]:
        cfg = BlockConfig(d_model=D, n_heads=4, d_ff=F)
        t = shape_flow(cfg, 1, S).totals
        n_matmul = 4 * D * D + 2 * D * F
        assert (t["matmul_flops"] + t["backward_matmul_flops"]) / S == 6 * n_matmul + 12 * S * D
        assert 1.8 < t["backward_flops"] / t["flops"] < 2.2


def test_time_backward_returns_two_timings():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32)
    for fused in (True, False):
        fwd, bwd = shapes.time_backward([(cfg, 1, 8), (cfg, 2, 8)], repeats=2, warmup=1, fused=fused)
        for t in (fwd, bwd):
            assert t.best.shape == (2,) and t.samples.shape == (2, 2) and np.all(t.best > 0)


def test_time_backward_times_fused_and_unfused_interleaved():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32)
    fwd, bwd = shapes.time_backward([(cfg, 1, 8), (cfg, 1, 8)], repeats=2, fused=[True, False])
    assert fwd.best.shape == bwd.best.shape == (2,) and np.all(bwd.best > 0)
    with pytest.raises(ValueError, match="fused"):
        shapes.time_backward([(cfg, 1, 8)], repeats=1, fused=[True, False])
