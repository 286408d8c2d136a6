"""Measuring time and memory: one of each, for the chapters and the benchmark programs.

    t = time_interleaved({"a": f, "b": g})     # {name: Timing(best, median, samples)}
    s = best_time(f, repeats=5)                # seconds, the best of the repeats
    n = peak_bytes(f, warmup=1)                # bytes allocated at the peak of one call

Shared machines are noisy: interference only ever adds time, so the best of several repeats is the
estimate, and functions compared with each other run in turn in every round (a slow spell slows
them all). The default clock is this process's CPU time, which does not count the time other
programs hold the core. Memory is counted by tracemalloc, to which numpy reports its buffers: the
arrays a call allocates, not the process's resident size.
"""
from __future__ import annotations

import gc
import time
import tracemalloc
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np

from preln.blas import blas_threads
from preln.validation import nonnegative_int, positive_int

__all__ = ["Timing", "time_interleaved", "best_time", "peak_bytes"]


class Timing(NamedTuple):
    """Seconds: floats and (repeats,) samples for one function; (cases,) and (repeats, cases)
    arrays for several cases timed together (e.g. :func:`preln.chapters.shapes.time_forward`)."""

    best: float | np.ndarray        # the fastest run
    median: float | np.ndarray
    samples: np.ndarray             # in the order they ran


def time_interleaved(fns, repeats=5, warmup=1, threads=1, clock=time.process_time, setups=None,
                     collect=False):
    """Time every callable of ``fns`` (a dict ``name -> fn()``); returns ``{name: Timing}``.

    - interleaved: each of the ``repeats`` rounds calls every function once, in turn, so a slow
      spell slows every side of a comparison (``collect``: a garbage collection before each round,
      so that none happens inside a timing; it costs time on a large heap);
    - ``clock``: CPU time by default; ``time.perf_counter`` for wall time;
    - BLAS runs ``threads`` threads (:func:`preln.blas.blas_threads`; None leaves it as it is): a
      multi-threaded BLAS on a busy machine waits for the core another program holds;
    - ``warmup`` untimed calls of each function first (page faults, caches, lazy imports);
    - ``setups``: ``{name: fn()}`` run, untimed, before each call of that function.

    A chapter that asserts a ratio of two such timings states the margin it allows.
    """
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise TypeError(f"fns: expected a non-empty dict of name -> callable; got {fns!r}")
    repeats, warmup = positive_int(repeats, "repeats"), nonnegative_int(warmup, "warmup")
    setups = setups or {}

    def call(name, fn):
        if setups.get(name) is not None:
            setups[name]()
        t0 = clock()
        fn()
        return clock() - t0

    samples = np.zeros((repeats, len(fns)))
    with nullcontext() if threads is None else blas_threads(threads):
        for name, fn in fns.items():
            for _ in range(warmup):
                call(name, fn)
        for r in range(repeats):
            if collect:
                gc.collect()             # the last round's garbage is collected here, not timed
            for i, (name, fn) in enumerate(fns.items()):
                samples[r, i] = call(name, fn)
    return {name: Timing(float(samples[:, i].min()), float(np.median(samples[:, i])), samples[:, i])
            for i, name in enumerate(fns)}


def best_time(fn, repeats=3, warmup=1, clock=time.process_time, threads=None):
    """Seconds of the fastest of ``repeats`` calls of ``fn()`` (see :func:`time_interleaved`)."""
    return time_interleaved({"fn": fn}, repeats, warmup, threads, clock)["fn"].best


def peak_bytes(fn, setup=None, warmup=0):
    """Peak bytes allocated by one call of ``fn()`` beyond what was allocated before it.

    ``warmup`` untimed calls first (one-off allocations, lazy caches, happen there); ``setup()``
    runs before each call, outside the count (e.g. to drop a cache the last call left).
    """
    for _ in range(nonnegative_int(warmup, "warmup") + 1):
        if setup is not None:
            setup()
        gc.collect()
        was_tracing = tracemalloc.is_tracing()
        if not was_tracing:
            tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            fn()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            if not was_tracing:
                tracemalloc.stop()
    return int(peak - base)
