"""Pipeline schedules (preln/chapters/parallel.py): GPipe's and 1F1B's training step, op by op."""
import numpy as np
import pytest

from preln.chapters import parallel as par

SCHEDULES = {"gpipe": par.gpipe_train_schedule, "1f1b": par.one_f_one_b_schedule}
SIZES = [(1, 1), (2, 1), (4, 2), (4, 4), (4, 8), (3, 7), (8, 32)]


def steps_of(grid, i):
    """The time steps at which each stage works on micro-batch i: (p,) ints."""
    s, t = np.nonzero(grid == i)
    assert np.array_equal(s, np.arange(grid.shape[0])), "each stage once per micro-batch"
    return t


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("p, m", SIZES)
def test_every_stage_runs_m_forwards_and_m_backwards_in_dependency_order(kind, p, m):
    sched = SCHEDULES[kind](p, m)
    assert sched.forward.shape == sched.backward.shape == (p, sched.makespan)
    # one op per stage per step
    assert not ((sched.forward >= 0) & (sched.backward >= 0)).any()
    for row_f, row_b in zip(sched.forward, sched.backward):
        assert sorted(row_f[row_f >= 0]) == sorted(row_b[row_b >= 0]) == list(range(m))
    for i in range(m):
        f, b = steps_of(sched.forward, i), steps_of(sched.backward, i)
        assert np.all(f < b)                        # forward before backward on each stage
        assert np.all(np.diff(f) >= 1)              # forward goes down the stages
        assert np.all(np.diff(b) <= -1)             # backward comes back up
        assert b[-1] > f[-1]                        # the last stage turns around after its forward


@pytest.mark.parametrize("p, m", SIZES)
def test_1f1b_has_gpipe_s_makespan_and_bubble_with_fewer_micro_batches_in_flight(p, m):
    gpipe, ofob = par.gpipe_train_schedule(p, m), par.one_f_one_b_schedule(p, m)
    assert gpipe.makespan == ofob.makespan == 2 * (m + p - 1)
    assert gpipe.bubble == pytest.approx(par.bubble_fraction(p, m), rel=1e-12)
    assert ofob.bubble == pytest.approx(par.bubble_fraction(p, m), rel=1e-12)
    assert np.array_equal(gpipe.peak_in_flight, np.full(p, m))
    assert np.array_equal(ofob.peak_in_flight, np.minimum(p - np.arange(p), m))
    for sched in (gpipe, ofob):                     # all activations freed at the end
        assert np.all(sched.in_flight >= 0) and np.all(sched.in_flight[:, -1] == 0)


def test_1f1b_alternates_after_its_warm_up():
    """Megatron-LM's non-interleaved schedule (Narayanan et al. 2021, figure 4), p = 4, m = 8."""
    p, m = 4, 8
    sched = par.one_f_one_b_schedule(p, m)
    for s in range(p):
        ops = [("F", f) if f >= 0 else ("B", b)
               for f, b in zip(sched.forward[s], sched.backward[s]) if f >= 0 or b >= 0]
        warm = p - 1 - s
        assert ops[:warm] == [("F", i) for i in range(warm)]
        assert [k for k, _ in ops[warm:warm + 2 * (m - warm)]] == ["F", "B"] * (m - warm)
        assert ops[warm + 2 * (m - warm):] == [("B", i) for i in range(m - warm, m)]
    # the last stage runs each backward right after its forward
    assert np.array_equal(np.nonzero(sched.backward[-1] >= 0)[0],
                          np.nonzero(sched.forward[-1] >= 0)[0] + 1)


def test_gpipe_s_forward_grid_is_the_first_half_of_its_training_step():
    for p, m in SIZES:
        sched = par.gpipe_train_schedule(p, m)
        assert np.array_equal(par.gpipe_schedule(p, m), sched.forward[:, :m + p - 1])
        assert (sched.forward[:, m + p - 1:] < 0).all() and (sched.backward[:, :m + p - 1] < 0).all()


@pytest.mark.parametrize("kind", SCHEDULES)
def test_bad_sizes_name_the_argument(kind):
    with pytest.raises(ValueError, match="m"):
        SCHEDULES[kind](4, 0)
    with pytest.raises((ValueError, TypeError), match="p"):
        SCHEDULES[kind](2.5, 4)


def test_an_order_that_waits_for_itself_fails_instead_of_hanging():
    # stage 0 would run backward 0 before forward 0: its input never comes
    with pytest.raises(ValueError, match="orders: a stage waits for an op that never runs"):
        par._run_pipeline([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]], 2)
