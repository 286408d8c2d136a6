"""preln.chapters.inference: roofline arithmetic, bytes per op, instrumented attention I/O, decoding costs."""
import math

import numpy as np
import pytest

from preln import BlockConfig, TransformerBlock, TransformerStack
from preln.chapters import inference as inf
from preln.chapters.shapes import fit_exponent, shape_flow

EXACT = 1e-12          # float64 attention computed two ways (round-off of a few operations)
CFG = BlockConfig(d_model=64, n_heads=4, d_ff=256)


# ---- roofline ---------------------------------------------------------------------------------

def test_roofline_arithmetic():
    roof = inf.Roofline("toy", peak_flops=100e9, bandwidth=20e9)
    assert roof.ridge == 5.0
    assert np.allclose(roof.attainable([1.0, 5.0, 50.0]), [20e9, 100e9, 100e9])
    assert roof.time(1e9, 1e6) == pytest.approx(1e9 / 100e9)       # compute-bound
    assert roof.time(1e6, 1e9) == pytest.approx(1e9 / 20e9)        # memory-bound


def test_published_ridges():
    ridges = {name: r.ridge for name, r in inf.PUBLISHED.items()}
    assert round(ridges["A100 SXM 40GB"]) == 201
    assert round(ridges["A100 SXM 80GB"]) == 153
    assert round(ridges["H100 SXM"]) == 295
    assert round(ridges["H200 SXM"]) == 206
    assert all(r.source for r in inf.PUBLISHED.values())


def test_measurements_return_rates():
    assert inf.measure_gemm(n=64, repeats=1) > 0
    bw = inf.measure_bandwidth(nbytes=2**20, repeats=1)
    assert set(bw) == {"copy", "add", "triad"} and all(v > 0 for v in bw.values())


# ---- bytes per op ---------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", inf.SCHEDULES)
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_op_traffic_flops_are_shape_flows(schedule, activation):
    cfg = BlockConfig(d_model=64, n_heads=4, d_ff=256, activation=activation)
    ops = inf.op_traffic(cfg, 2, 32, schedule)
    flow = shape_flow(cfg, 2, 32, training=False, attention="plain")
    assert sum(o.flops for o in ops) == flow.totals["flops"]
    assert sum(o.flops for o in ops if o.matmul) >= flow.totals["matmul_flops"]


def test_op_traffic_counts():
    B, S, D, H, F = 2, 32, 64, 4, 256
    bsd, bsf, bhss = B * S * D, B * S * F, B * H * S * S
    un = {o.name: o for o in inf.op_traffic(CFG, B, S, "unfused")}
    fu = {o.name: o for o in inf.op_traffic(CFG, B, S, "fused")}
    assert un["norm1"].nbytes == 12 * bsd * 4                     # 7 reads + 5 writes of x's size
    assert un["attn.softmax"].nbytes == 8 * bhss * 4              # max, subtract, exp, sum, divide
    assert un["mlp.gelu"].nbytes == 5 * bsf * 4
    assert un["mlp.linear1"].nbytes == (bsd + D * F + 3 * bsf) * 4   # matmul + bias pass
    assert fu["attn.softmax"].nbytes == 2 * bhss * 4
    assert fu["bias + residual1 + norm2"].nbytes == 4 * bsd * 4
    assert fu["bias + residual2"].nbytes == 3 * bsd * 4
    assert fu["mlp.linear2"].nbytes == (bsf + D * F + bsd) * 4
    assert fu["bias + gelu"].nbytes == 2 * bsf * 4
    assert fu["mlp.linear1"].nbytes == (bsd + D * F + bsf) * 4
    for name in ("attn.in_proj", "attn.weighted_sum", "attn.merge_heads"):
        assert un[name] == fu[name]
    assert sum(o.nbytes for o in fu.values()) < sum(o.nbytes for o in un.values())
    assert all(o.intensity < 1 for o in un.values() if not o.matmul and o.flops)
    two = {o.name: o for o in inf.op_traffic(CFG, B, S, "unfused", itemsize=2)}
    assert all(two[n].nbytes * 2 == un[n].nbytes for n in un)


@pytest.mark.parametrize("kwargs, match", [
    (dict(config="cfg"), "config"), (dict(B=0), "B"), (dict(S=1.5), "S"),
    (dict(schedule="fast"), "schedule"), (dict(itemsize=0), "itemsize"),
    (dict(config=BlockConfig(d_model=64, n_heads=4, d_ff=256, norm_first=False)), "Pre-LN"),
])
def test_op_traffic_bad_input(kwargs, match):
    args = dict(config=CFG, B=2, S=8, schedule="unfused", itemsize=4) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        inf.op_traffic(**args)


@pytest.mark.parametrize("schedule", inf.SCHEDULES)
def test_time_ops_times_every_op(schedule):
    times = inf.time_ops(CFG, 1, 16, schedule, repeats=1, flush_bytes=2**20)
    assert list(times) == [o.name for o in inf.op_traffic(CFG, 1, 16, schedule)]
    assert all(t >= 0 and math.isfinite(t) for t in times.values())
    with pytest.raises(ValueError, match="schedule"):
        inf.time_ops(CFG, 1, 16, "fast")


def test_time_fusion_kernels_agree_with_numpy():
    rows = inf.time_fusion(nbytes=2**16, width=64, repeats=1, flush_bytes=2**16)
    assert [r.name for r in rows] == ["LayerNorm", "bias + residual + LayerNorm", "bias + GELU",
                                      "softmax", "bias + residual"]
    for r in rows:
        assert r.max_abs_diff < 1e-5 and r.fused_bytes < r.unfused_bytes and r.fused_s > 0


# ---- attention I/O ------------------------------------------------------------------------------

@pytest.mark.parametrize("order", inf.ORDERS)
@pytest.mark.parametrize("N, d, C", [(64, 8, 64), (100, 16, 200), (37, 5, 77), (256, 32, 4096),
                                     (50, 4, 10_000)])
def test_instrumented_attention_is_attention_and_counts_match(N, d, C, order):
    rng = np.random.default_rng(N + d)
    q, k, v = (rng.standard_normal((N, d)) for _ in range(3))
    ref = inf.reference_attention(q, k, v)
    o_std, io_std = inf.standard_attention_io(q, k, v)
    o_til, io_til = inf.tiled_attention_io(q, k, v, C, order)
    assert np.abs(o_std - ref).max() < EXACT
    assert np.abs(o_til - ref).max() < EXACT
    assert io_std.accesses == inf.attention_accesses(N, d, kind="standard") == 4 * N * d + 4 * N * N
    assert io_std.by_array == inf.attention_access_terms(N, d, kind="standard")
    # every term of the closed form is what the instrumented loop moved for that array
    assert io_til.by_array == inf.attention_access_terms(N, d, C, order)
    assert io_til.accesses == inf.attention_accesses(N, d, C, order)
    b_c, b_r = inf.flash_block_sizes(C, d)
    assert b_c == math.ceil(C / (4 * d)) and b_r == min(b_c, d)
    assert io_til.peak_fast <= 1.5 * C + 4 * d            # the block sizes keep the working set near C


def test_fa1_and_fa2_closed_forms():
    N, d, C = 4096, 64, 98_304                             # one A100 SM's 192 KB in 16-bit
    b_c, b_r = inf.flash_block_sizes(C, d)                 # fa1: B_c = 384 keys, B_r = 64 queries
    T_c = math.ceil(N / b_c)
    fa1 = inf.attention_accesses(N, d, C, "fa1")
    assert fa1 == 3 * N * d + 2 * N + T_c * (3 * N * d + 4 * N)
    assert inf.attention_accesses(N, d, C, kind="tiled") == fa1       # the old name
    T_r = math.ceil(N / b_c)                               # fa2: the 384-row block is the query block
    fa2 = inf.attention_accesses(N, d, C, "fa2")
    assert fa2 == 2 * N * d + N + 2 * T_r * N * d
    # what the FA2 loop order saves: O and l, m are never re-read or re-written, Q is read once
    assert fa1 - fa2 == T_c * (N * d + 4 * N) + N * d + N
    t1, t2 = inf.attention_access_terms(N, d, C, "fa1"), inf.attention_access_terms(N, d, C, "fa2")
    assert t1["O", "write"] == (1 + T_c) * N * d and t2["O", "write"] == N * d
    assert t1["K", "read"] == N * d and t2["K", "read"] == T_r * N * d


def test_flash_block_sizes():
    assert inf.flash_block_sizes(4096, 64) == (16, 16)
    assert inf.flash_block_sizes(98304, 64) == (384, 64)
    with pytest.raises(ValueError, match="C: expected at least d = 64"):
        inf.flash_block_sizes(32, 64)


@pytest.mark.parametrize("kind", inf.ORDERS)
def test_theorem_2_exponents_from_counts(kind):
    """Tiled: Theta(N^2 d^2 / C); standard: Theta(N d + N^2) -- exponents of the counts."""
    Ns, d, C = [1024, 2048, 4096, 8192], 64, 16384
    k_N = fit_exponent(Ns, [inf.attention_accesses(n, d, C, kind) for n in Ns]).exponent
    Cs = [4096, 8192, 16384, 32768]
    k_C = fit_exponent(Cs, [inf.attention_accesses(4096, d, c, kind) for c in Cs]).exponent
    ds = [16, 32, 64, 128]
    k_d = fit_exponent(ds, [inf.attention_accesses(4096, dd, 65536, kind) for dd in ds]).exponent
    assert 1.9 < k_N < 2.05 and -1.05 < k_C < -0.9 and 1.6 < k_d < 2.05
    k_std = fit_exponent(Ns, [inf.attention_accesses(n, d, kind="standard") for n in Ns]).exponent
    assert 1.9 < k_std <= 2.0


def test_attention_io_bad_input():
    q = np.zeros((8, 4))
    with pytest.raises(ValueError, match="q"):
        inf.tiled_attention_io(np.zeros(8), q, q, 64)
    with pytest.raises(ValueError, match="equal shapes"):
        inf.standard_attention_io(q, np.zeros((9, 4)), q)
    with pytest.raises(ValueError, match="order"):
        inf.tiled_attention_io(q, q, q, 64, order="fa3")
    with pytest.raises(ValueError, match="kind"):
        inf.attention_accesses(8, 4, 64, kind="flash")
    with pytest.raises(ValueError, match="C"):
        inf.attention_accesses(8, 4)


# ---- decoding -----------------------------------------------------------------------------------

def test_kv_cache_bytes_formula_and_published_example():
    # OPT-13B (Kwon et al. 2023, section 3): 2 (K, V) x 5120 x 40 layers x 2 bytes = 800 KiB per token
    assert inf.kv_cache_bytes(40, 1, 1, 5120, 2) == 819_200 == 800 * 1024
    cfg = BlockConfig(d_model=32, n_heads=2, d_ff=64, causal=True)
    stack = TransformerStack(cfg, 3, dtype=np.float32, seed=0)
    kv = stack.kv_cache(2, 10)
    assert sum(c.nbytes for c in kv.layers) == inf.kv_cache_bytes(3, 2, 10, 32, 4)
    with pytest.raises(ValueError, match="seq"):
        inf.kv_cache_bytes(1, 1, 0, 32, 4)


def test_block_params_counts_the_state_dict():
    block = TransformerBlock(CFG, dtype=np.float64)
    assert inf.block_params(CFG) == sum(v.size for v in block.state_dict().values())


@pytest.mark.parametrize("batch", [1, 4, 16, 64])
def test_decode_intensity_is_about_the_batch_in_16_bit(batch):
    opt = BlockConfig(d_model=5120, n_heads=40, d_ff=20480, causal=True)
    cost = inf.decode_cost(opt, 40, batch, context=1, itemsize=2)
    assert 0.95 * batch < cost.intensity < batch
    long = inf.decode_cost(opt, 40, batch, context=32768, itemsize=2)
    # attention over the cache does 4 c D FLOPs per 4 c D bytes (16-bit K and V): intensity 1,
    # whatever the batch, so a long context pulls a batched step down towards 1
    assert 0.99 < long.intensity < 2 if batch > 1 else long.intensity == pytest.approx(1, rel=1e-3)


def test_kv_cache_bytes_with_grouped_query_attention():
    # Llama 3 8B: 32 layers, 32 query heads of 128, 8 KV heads -> 2 x 32 x 8 x 128 x 2 B = 128 KiB
    assert inf.kv_cache_bytes(32, 1, 1, 4096, 2, n_heads=32, n_kv_heads=8) == 128 * 1024
    # the same width with multi-head attention (Llama 2 7B): 4 times as much
    assert inf.kv_cache_bytes(32, 1, 1, 4096, 2, n_heads=32, n_kv_heads=32) == 512 * 1024
    assert inf.kv_cache_bytes(32, 3, 5, 4096, 2, 32, 1) == 2 * 32 * 3 * 5 * 128 * 2   # MQA
    models = inf.PUBLISHED_MODELS
    assert models["Llama 3 8B"].kv_bytes_per_token(2) == 128 * 1024
    assert models["OPT-13B"].kv_bytes_per_token(2) == 800 * 1024
    with pytest.raises(ValueError, match="n_heads"):
        inf.kv_cache_bytes(1, 1, 1, 64, 2, n_kv_heads=2)
    with pytest.raises(ValueError, match="n_kv_heads"):
        inf.kv_cache_bytes(1, 1, 1, 64, 2, n_heads=4, n_kv_heads=3)


def test_decode_cost_with_groups_and_quantised_weights():
    opt = BlockConfig(d_model=5120, n_heads=40, d_ff=20480, causal=True)
    base = inf.decode_cost(opt, 40, 8, 512, itemsize=2)
    assert base == inf.decode_cost(opt, 40, 8, 512, 2, n_kv_heads=40)       # MHA is n_kv = H
    gqa = inf.decode_cost(opt, 40, 8, 512, 2, n_kv_heads=8)
    assert gqa.kv_bytes * 5 == base.kv_bytes and gqa.weight_bytes < base.weight_bytes
    w8 = inf.decode_cost(opt, 40, 8, 1, 2, weight_bits=8)
    w4 = inf.decode_cost(opt, 40, 8, 1, 2, weight_bits=4)
    w16 = inf.decode_cost(opt, 40, 8, 1, 2)
    # the weights dominate a short-context step: halving their bytes doubles the intensity
    assert 1.95 < w8.intensity / w16.intensity < 2.0 and 3.8 < w4.intensity / w16.intensity < 4.0
    g128 = inf.decode_cost(opt, 40, 8, 1, 2, weight_bits=4, group_size=128)
    assert inf.weight_bytes_per_value(4, 128) == 0.5 + 2.5 / 128
    assert g128.weight_bytes > w4.weight_bytes


def test_model_shapes_count_parameters():
    m = inf.PUBLISHED_MODELS
    # about 6.5e9 and 7.0e9 weights in the blocks (the rest of 7B, 8B is the embeddings and head)
    assert 6.4e9 < m["Llama 2 7B"].n_layers * m["Llama 2 7B"].layer_matrix_params() < 6.6e9
    assert 6.9e9 < m["Llama 3 8B"].n_layers * m["Llama 3 8B"].layer_matrix_params() < 7.0e9
    assert m["Llama 3 8B"].group == 4 and m["Llama 2 7B"].group == 1
    # OPT ties its embedding and head: one V x D matrix; Llama 2 and 3 have two
    opt, l2 = m["OPT-13B"], m["Llama 2 7B"]
    assert opt.weight_params() == 40 * opt.layer_matrix_params() + 50272 * 5120
    assert l2.weight_params() == 32 * l2.layer_matrix_params() + 2 * 32000 * 4096
    assert 12.7e9 < opt.weight_params() < 12.9e9 and 6.7e9 < l2.weight_params() < 6.8e9
    from preln.models.lm import LMConfig
    shape = inf.model_shape(LMConfig(vocab_size=29, max_len=64, d_model=32, n_heads=2, d_ff=128))
    assert shape.layer_matrix_params() * 1 == 4 * 32 * 32 + 2 * 32 * 128
    with pytest.raises(TypeError, match="lm"):
        inf.model_shape("opt")


@pytest.mark.parametrize("name", list(inf.PUBLISHED_MODELS))
def test_step_ops_flops_and_intensities(name):
    m = inf.PUBLISHED_MODELS[name]
    B, t = 4, 1000
    ops = {o.name: o for o in inf.step_ops(m, B, 1, t)}
    D, dh, kv = m.d_model, m.d_head, m.n_kv_heads
    matmul_flops = sum(o.flops for o in ops.values() if o.matmul and o.name != "attention")
    assert matmul_flops == 2 * B * m.layer_matrix_params()
    assert ops["attention"].flops == m.n_heads * B * (t + 1) * (4 * dh + 5)
    # attention reads each sequence's K and V: about the group size in FLOPs per byte (16-bit)
    assert 0.9 * m.group < ops["attention"].intensity < 1.1 * m.group
    assert ops["attention"].intensity == pytest.approx(
        {o.name: o for o in inf.step_ops(m, 64, 1, t)}["attention"].intensity, rel=1e-9)
    # a weight matmul's intensity is about the batch in 16-bit, twice that with int8 weights
    assert 0.9 * B < ops["out_proj"].intensity < B
    w8 = {o.name: o for o in inf.step_ops(m, B, 1, t, weight_bits=8)}
    assert 1.9 < w8["out_proj"].intensity / ops["out_proj"].intensity < 2.0
    # a prefill over the prompt puts every matmul far right of any published ridge
    pre = {o.name: o for o in inf.step_ops(m, 1, 2048, 0)}
    assert all(pre[n].intensity > 300 for n in ("qkv_proj", "out_proj"))


def test_compute_bound_batch():
    m = inf.PUBLISHED_MODELS["Llama 3 8B"]
    h100 = inf.PUBLISHED["H100 SXM"]
    b = inf.compute_bound_batch(m, h100, "out_proj", 4096)
    ops = lambda batch: {o.name: o for o in inf.step_ops(m, batch, 1, 4096)}
    assert ops(b)["out_proj"].intensity >= h100.ridge > ops(b - 1)["out_proj"].intensity
    assert h100.ridge < b < 1.3 * h100.ridge                          # near B = ridge in 16-bit
    b8 = inf.compute_bound_batch(m, h100, "out_proj", 4096, weight_bits=8)
    assert 0.45 * b < b8 < 0.55 * b                                    # int8 weights: half the batch
    assert inf.compute_bound_batch(m, h100, "attention", 4096) is None  # never, at any batch
    cpu = inf.Roofline("a CPU core", 100e9, 25e9)                       # ridge 4
    assert inf.compute_bound_batch(m, cpu, "attention", 4096) == 1      # GQA's 4: at the CPU ridge
    with pytest.raises(ValueError, match="op"):
        inf.compute_bound_batch(m, h100, "lm_head", 4096)


def test_predicted_ttft_is_compute_bound_and_tpot_memory_bound():
    m = inf.PUBLISHED_MODELS["Llama 3 8B"]
    h100 = inf.PUBLISHED["H100 SXM"]
    t = inf.predict_generation(m, h100, batch=1, prompt=512, n_new=64)
    blocks, head = m.n_layers * m.layer_matrix_params(), m.d_model * m.vocab_size
    prefill = {o.name: o for o in inf.step_ops(m, 1, 512, 0)}
    assert all(o.intensity > h100.ridge for o in prefill.values() if o.matmul and o.name != "attention")
    # TTFT: the blocks' matmuls at the peak, the head (one position) reading its weights; the
    # elementwise ops of 512 positions add a few percent
    lower = 2 * 512 * blocks / h100.peak_flops + 2 * head / h100.bandwidth
    assert lower < t.ttft < 1.15 * lower
    # TPOT: every weight read once per token
    decode = inf.step_ops(m, 1, 1, 512)
    assert all(o.intensity < h100.ridge for o in decode)
    assert t.tpot == pytest.approx(2 * (blocks + head) / h100.bandwidth, rel=0.05)
    assert inf.step_time(m, h100, 1, 1, 512) > inf.step_time(m, h100, 1, 1, 512, weight_bits=4)
    with pytest.raises(TypeError, match="roof"):
        inf.step_time(m, "H100", 1)
    with pytest.raises(TypeError, match="model"):
        inf.step_ops(BlockConfig(64, 4, 256), 1)


def test_time_generation_measures_prefill_and_steps():
    from preln.models.lm import LMConfig, TinyLM
    lm = TinyLM(LMConfig(vocab_size=11, max_len=16, d_model=16, n_heads=2, d_ff=32), seed=0)
    g = inf.time_generation(lm, np.zeros((2, 5), np.int64), n_new=4, repeats=1)
    assert g.ttft > 0 and g.tpot.shape == (3,) and np.all(g.tpot > 0) and g.mean_tpot > 0
    with pytest.raises(ValueError, match="prompt_ids"):
        inf.time_generation(lm, np.zeros(5, np.int64), 4)


def test_time_decode_best_per_step():
    calls = []
    best = inf.time_decode(lambda t: calls.append(t), 3, repeats=2)
    assert calls == [0, 1, 2, 0, 1, 2] and best.shape == (3,) and np.all(best >= 0)


# ---- figures ------------------------------------------------------------------------------------

def test_figures_draw():
    from preln.chapters.figures import inference as figs
    roof = inf.Roofline("toy", 50e9, 10e9)
    un = inf.op_traffic(CFG, 2, 32, "unfused")
    fu = inf.op_traffic(CFG, 2, 32, "fused")
    times = {o.name: 1e-3 for o in un}
    for fig in (figs.plot_roofline(roof, un, fu, times), figs.plot_published(inf.PUBLISHED, un, roof),
                figs.plot_predicted_vs_measured(un, times, roof),
                figs.plot_fusion_bytes([("softmax", 800, 200), ("LayerNorm", 1200, 200)])):
        assert fig.axes
    from preln.chapters.figures import all_explorables
    assert all_explorables()["inference.decode_roofline"] == figs.EXPLORABLES["decode_roofline"]
    plot, controls = figs.EXPLORABLES["decode_roofline"]
    n_frames = math.prod(len(v) for v in controls.values())
    assert n_frames <= 64
    assert plot(batch=1, context=512, gpu="A100 SXM 80GB").axes
    alt = figs.decode_roofline_alt(batch=1, context=512, gpu="H100 SXM")
    assert "memory-bound" in alt and "H100" in alt
    # batch 256 at context 512: the KV cache reads (intensity 1) keep even this step memory-bound
    assert "memory-bound" in figs.decode_roofline_alt(batch=256, context=512, gpu="A100 SXM 80GB")


def test_new_figures_are_labelled():
    from preln.chapters.figures import inference as figs
    from preln.models.lm import LMConfig, TinyLM
    from preln.serve.paged import ContinuousBatcher, Request
    from tests.figure_checks import assert_labelled
    terms = {"standard": inf.attention_access_terms(256, 16, kind="standard"),
             "FA1": inf.attention_access_terms(256, 16, 1024, "fa1"),
             "FA2": inf.attention_access_terms(256, 16, 1024, "fa2")}
    assert_labelled(figs.plot_attention_terms(terms))
    models = [inf.PUBLISHED_MODELS["OPT-13B"], inf.PUBLISHED_MODELS["Llama 3 8B"]]
    machines = {"toy (float32)": (inf.Roofline("toy", 50e9, 10e9), 4),
                "H100": (inf.PUBLISHED["H100 SXM"], 2)}
    assert_labelled(figs.plot_decode_ops(models, machines, 1024, batches=[1, 8, 64]))
    lm = TinyLM(LMConfig(vocab_size=11, max_len=16, d_model=16, n_heads=2, d_ff=32), seed=0)
    reqs = [Request(i, np.arange(3) % 11, 4, i) for i in range(3)]
    a = ContinuousBatcher(lm, 8, 2).run(reqs)
    b = ContinuousBatcher(lm, 1, 16).run(reqs)
    assert_labelled(figs.plot_paged_memory(a, b, 2, 16, 512))
    html = figs.bound_table_html({4: inf.op_traffic(CFG, 2, 32), 2: inf.op_traffic(CFG, 2, 32, itemsize=2)},
                                 machines, "caption")
    assert html.count("<tr>") == 1 + sum(1 for o in inf.op_traffic(CFG, 2, 32) if o.flops > 0)
    assert "compute" in html and "memory" in html
