"""preln.measure: the one timing protocol (interleaved rounds, best of repeats) and the one peak
memory count (tracemalloc) that the chapters and the benchmark programs use."""
import numpy as np
import pytest

from preln.measure import best_time, peak_bytes, time_interleaved

#: a float64 array of this many elements is the allocation peak_bytes must see
N_ALLOC = 1_000_000
#: tracemalloc also counts Python's own small objects around the call
SLACK_BYTES = 64 * 1024


def test_time_interleaved_runs_every_function_in_turn():
    calls = []
    timed = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                             repeats=3, warmup=1)
    # one warm-up each, then three rounds that each call a, then b
    assert calls == ["a", "b"] + ["a", "b"] * 3
    for t in timed.values():
        assert t.samples.shape == (3,) and 0 <= t.best <= t.median and t.best == t.samples.min()


def test_setups_run_before_each_call_untimed():
    calls = []
    time_interleaved({"a": lambda: calls.append("a")}, repeats=2, warmup=1,
                     setups={"a": lambda: calls.append("setup")})
    assert calls == ["setup", "a"] * 3


def test_time_interleaved_compares_unequal_work():
    x = np.random.default_rng(0).standard_normal(200_000)
    timed = time_interleaved({"once": lambda: np.sort(x), "five": lambda: [np.sort(x) for _ in range(5)]},
                             repeats=3)
    assert timed["five"].best > timed["once"].best
    assert best_time(lambda: [np.sort(x) for _ in range(5)]) > best_time(lambda: None)


def test_time_interleaved_rejects_bad_input():
    with pytest.raises(TypeError, match="fns"):
        time_interleaved([lambda: None])
    with pytest.raises(ValueError, match="repeats"):
        time_interleaved({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        time_interleaved({"a": lambda: None}, warmup=-1)


def test_peak_bytes_sees_a_temporary_and_not_what_was_there_before():
    before = np.ones(4 * N_ALLOC)                     # allocated before: not counted
    peak = peak_bytes(lambda: np.ones(N_ALLOC).sum())
    assert 8 * N_ALLOC <= peak <= 8 * N_ALLOC + SLACK_BYTES
    assert before.size == 4 * N_ALLOC


def test_peak_bytes_warm_up_takes_one_off_allocations():
    cache = []

    def fn():                                         # allocates its buffer on the first call only
        if not cache:
            cache.append(np.ones(N_ALLOC))
        return cache[0].sum()

    assert peak_bytes(fn) >= 8 * N_ALLOC
    cache.clear()
    assert peak_bytes(fn, warmup=1) < SLACK_BYTES
