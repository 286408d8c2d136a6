"""preln.chapters.parallel: memory per device, bytes and times of the collectives, the bubble, the
simulated data-parallel and ZeRO steps, the measured training-step memory, the parsed check."""
import copy

import numpy as np
import pytest

from preln import BlockConfig, LlamaBlock, LlamaConfig, TransformerBlock, TransformerStack
from preln.chapters import parallel as par
from preln.models.optim import Adam
from preln.parallel import predicted_traffic, replicated

#: float64 gradients summed in another order than one device's: round-off only
SUM_ORDER_TOL = 1e-13
#: the checkpointing formula (L x block input + one block's step) against tracemalloc's peak
CHECKPOINT_FORMULA_TOL = 0.25


def test_param_counts_are_the_released_checkpoints():
    # the parameter counts of the released checkpoints (their configurations' tensors, summed)
    released = {"GPT-2 small": 124_439_808, "GPT-2 XL": 1_557_611_200, "Llama 2 7B": 6_738_415_616,
                "Llama 2 70B": 68_976_648_192, "Llama 3 8B": 8_030_261_248}
    assert {k: par.param_count(m) for k, m in par.MODELS.items()} == released
    with pytest.raises(TypeError, match="model: expected"):
        par.param_count(BlockConfig())


def test_zero_memory_reproduces_the_zero_paper():
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, N_d = 64, K = 12
    gb = [par.zero_memory(7_500_000_000, 64, s).total / 1e9 for s in par.ZERO_STAGES]
    assert [round(g, 1) for g in gb] == [120.0, 31.4, 16.6, 1.9]
    m = par.zero_memory(1000, 4, 2, precision="float32", activations=7)
    assert m == (4000, 1000, 2000, 7.0) and m.total == 7007
    assert par.zero_memory(1000, 1, 3) == par.zero_memory(1000, 1, 0)   # one rank: nothing to shard
    with pytest.raises(ValueError, match="stage: expected"):
        par.zero_memory(10, 2, 4)
    with pytest.raises(ValueError, match="precision: expected"):
        par.zero_memory(10, 2, 1, precision="fp8")


def test_zero_traffic_stage_three_is_one_and_a_half_times():
    n, P = 10 ** 6, 8
    base = par.zero_traffic(n, P, 0)
    assert base == 2 * (P - 1) * n * 2 // P
    assert par.zero_traffic(n, P, 1) == par.zero_traffic(n, P, 2) == base
    assert par.zero_traffic(n, P, 3) == pytest.approx(1.5 * base, rel=1e-9)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_traffic_formulas_are_predicted_traffic(world):
    blocks = [TransformerBlock(BlockConfig(d_model=32, n_heads=4, d_ff=64), dtype=np.float64, seed=0),
              LlamaBlock(LlamaConfig(d_model=32, n_heads=8, n_kv_heads=4, d_ff=48), dtype=np.float64, seed=0)]
    for block in blocks:
        n_rep = sum(block.params[k].size for k in replicated(block))
        assert par.tp_traffic(32, 2, 8, world, itemsize=8) == predicted_traffic(block, 2, 8, world, "tensor")
        assert (par.sp_traffic(32, 2, 8, world, n_rep, itemsize=8)
                == predicted_traffic(block, 2, 8, world, "sequence"))


def test_tp_break_even_is_where_the_times_cross():
    model = par.MODELS["Llama 2 7B"]
    for link in par.LINKS.values():
        p = par.tp_break_even(model, link)
        c, m = par.tp_layer_times(model, 4096, 2, link, latency=0.0)
        # communication / compute grows like (P - 1): equal at p
        assert m / c == pytest.approx((2 - 1) / (p - 1), rel=1e-12)
    fast, slow = par.LINKS["NVLink 4"], par.LINKS["InfiniBand NDR"]
    assert par.largest_paying_tp(model, 4096, fast) >= par.largest_paying_tp(model, 4096, slow)
    assert par.largest_paying_tp(model, 4096, fast, latency=0.0) == 8      # 9.4 with no latency
    assert par.tp_layer_times(model, 4096, 1, slow)[1] == 0.0
    with pytest.raises(TypeError, match="link: expected"):
        par.collective_time(1, 450e9, 1)


@pytest.mark.parametrize("p, m", [(1, 1), (4, 1), (4, 8), (8, 32)])
def test_bubble_is_the_idle_share_of_the_schedule(p, m):
    grid = par.gpipe_schedule(p, m)
    assert grid.shape == (p, m + p - 1)
    assert all(sorted(row[row >= 0]) == list(range(m)) for row in grid)   # each stage sees each once
    assert np.all(np.diff(np.argmax(grid == 0, axis=1)) == 1)           # micro-batch 0 moves one stage a step
    assert (grid < 0).mean() == pytest.approx(par.bubble_fraction(p, m), rel=1e-12)
    with pytest.raises(ValueError, match="m"):
        par.bubble_fraction(2, 0)


def _block_and_batch(B=4):
    block = TransformerBlock(BlockConfig(d_model=32, n_heads=4, d_ff=64), dtype=np.float64, seed=1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, 8, 32))
    return block, x, rng.standard_normal(x.shape)


@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_and_zero_steps(world):
    block, x, dy = _block_and_batch()
    before = copy.deepcopy(block.params)
    ref = copy.deepcopy(block)
    ref.zero_grad()
    ref.forward(x)
    ref.backward(dy)
    grads, traffic = par.data_parallel_grads(block, x, dy, world)
    for k in ref.grads:
        assert np.abs(grads[k] - ref.grads[k]).max() <= SUM_ORDER_TOL * np.abs(ref.grads[k]).max(), k
    n = sum(v.size for v in block.params.values())
    padded = -(-n // world) * world * 8
    assert all(t == {"all_reduce": (1, 2 * (world - 1) * padded // world)} for t in traffic)
    # ZeRO-2: the same sums (reduce-scatter is the all-reduce's first half), so the step is the
    # data-parallel Adam step bit for bit, with 1/P of the moments and the same bytes sent
    new, z_traffic, state = par.zero_adam_step(block, x, dy, world, lr=1e-3)
    dp = copy.deepcopy(block)
    Adam(dp.params, lr=1e-3).step(grads)
    assert all(np.array_equal(new[k], dp.params[k]) for k in new)
    assert all(sum(b for _, b in t.values()) == traffic[0]["all_reduce"][1] for t in z_traffic)
    assert state == [2 * padded // world] * world
    assert all(np.array_equal(block.params[k], before[k]) for k in before)   # the block is untouched
    with pytest.raises(ValueError, match="divisible by world"):
        par.data_parallel_grads(block, x[:3], dy[:3], 2)


def test_peak_memory_tiled_linear_and_checkpointing():
    cfg = BlockConfig(d_model=32, n_heads=4, d_ff=64)
    rng = np.random.default_rng(0)
    peaks = {}
    for att in ("plain", "tiled"):
        for S in (512, 2048):
            b = TransformerBlock(cfg, dtype=np.float32, seed=0, attention=att)
            x = rng.standard_normal((1, S, 32)).astype(np.float32)
            peaks[att, S] = par.peak_train_step_bytes(b, x, x)
    assert peaks["plain", 2048] / peaks["plain", 512] > 9        # quadratic: the (S, S) arrays
    assert peaks["tiled", 2048] / peaks["tiled", 512] <= 6       # linear, as issue 25 asks
    x = rng.standard_normal((2, 128, 32)).astype(np.float32)
    one = TransformerBlock(cfg, dtype=np.float32, seed=0, attention="tiled")
    step = par.peak_train_step_bytes(one, x, x)
    L = 6
    ckpt = par.peak_train_step_bytes(TransformerStack(cfg, L, dtype=np.float32, seed=0, attention="tiled",
                                                      checkpoint=True), x, x)
    full = par.peak_train_step_bytes(TransformerStack(cfg, L, dtype=np.float32, seed=0, attention="tiled"), x, x)
    assert ckpt < full
    assert abs(ckpt / (L * x.nbytes + step) - 1) <= CHECKPOINT_FORMULA_TOL


REPORT = """sharded block over 2 ranks (simulated in threads), B=2, S=8, float64
block        mode      max rel err  collective      calls    bytes  formula
transformer  tensor        7.2e-16  all_reduce          4    16384    16384
llama        sequence      6.2e-16  all_gather          4     8192     8192
                                    all_reduce          1      512      512
equal to the single-process block and the formula
"""


def test_parse_parallel_report():
    cases, ok = par.parse_parallel_report(REPORT)
    assert ok and cases == {("transformer", "tensor"): {"error": 7.2e-16, "traffic": {"all_reduce": (4, 16384, 16384)}},
                            ("llama", "sequence"): {"error": 6.2e-16, "traffic": {"all_gather": (4, 8192, 8192),
                                                                                   "all_reduce": (1, 512, 512)}}}
    bad = REPORT.replace("16384    16384", "16384    16000  MISMATCH").replace("equal to the", "FAILED")
    assert par.parse_parallel_report(bad)[1] is False


def test_run_parallel_check_simulated():
    run = par.run_parallel_check(2, timeout=60, simulate=True)
    assert run.ok and run.returncode == 0 and run.backend == "simulated ranks"
    assert set(run.cases) == {(f, m) for f in ("transformer", "llama") for m in ("tensor", "sequence")}
    for case in run.cases.values():
        assert case["error"] < 1e-12
        assert all(sent == formula for _, sent, formula in case["traffic"].values())


def test_figures_draw_what_the_module_computes():
    from preln.chapters.figures import all_explorables
    from preln.chapters.figures import many_devices as figs
    from tests.figure_checks import assert_labelled

    assert all_explorables()["many_devices.memory"] == figs.EXPLORABLES["memory"]
    mems = figs.memory_per_device("Llama 2 70B", 3)
    assert [m.total for m in mems] == sorted((m.total for m in mems), reverse=True)   # more ranks, less each
    # 16 bytes x 69.0e9 / P + 80 layers x 4096 x 8192 x 2 bytes: 74.3 GB at P = 16, 143 GB at 8
    alt = figs.memory_alt("Llama 2 70B", 3)
    assert "fits in 80 GB from P = 16 on" in alt and "1,109 GB at P = 1" in alt
    assert "never fits" in figs.memory_alt("Llama 2 70B", 2)        # the 16-bit weights stay whole
    fig = figs.plot_memory("GPT-2 XL", 0)
    assert len(fig.axes[0].patches) == len(figs.WORLDS) * 4        # four stacked parts per P
    sched = figs.plot_schedule(3, 4)
    assert "bubble, 33 %" in sched.axes[0].get_title()
    tp = figs.plot_tp_times("Llama 2 7B", 4096)
    assert len(tp.axes[0].lines) == 1 + len(par.LINKS)
    for f in (fig, figs.plot_memory("Llama 2 70B", 3), sched, tp):
        assert_labelled(f)
