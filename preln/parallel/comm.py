"""Collectives written once, as rings over two primitives -- ``send(dst, array)`` and
``recv(src) -> array`` -- so that the in-process simulation of P ranks and torch.distributed
(gloo, CPU processes) run the same algorithm and move the same bytes, counted as they are sent.

A ring reduce-scatter of an N-byte array sends (P - 1)/P N bytes per rank in P - 1 steps; an
all-gather of the result the same again; an all-reduce is the two, 2 (P - 1)/P N (Patarasuk and
Yuan 2009; NCCL's ring). :func:`ring_bytes` is that formula; :class:`Traffic` is what was sent.
"""
import queue
import threading
from collections import defaultdict

import numpy as np

from preln.validation import positive_int

__all__ = ["COLLECTIVES", "ring_bytes", "Traffic", "Comm", "SimComm", "run_simulated", "TorchComm"]

#: the collectives a :class:`Comm` has
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def ring_bytes(kind, nbytes, world):
    """Bytes one rank sends in a ring ``kind`` over ``world`` ranks; ``nbytes``: the full array's
    bytes (all_reduce, reduce_scatter: the input; all_gather: the output)."""
    if kind not in COLLECTIVES:
        raise ValueError(f"kind: expected one of {COLLECTIVES}; got {kind!r}")
    steps = 2 * (world - 1) if kind == "all_reduce" else world - 1
    return steps * nbytes // world


class Traffic:
    """Calls and bytes sent per collective, by this rank."""

    def __init__(self):
        self.calls = defaultdict(int)
        self.bytes = defaultdict(int)

    def add(self, kind, nbytes):
        self.bytes[kind] += int(nbytes)

    def table(self):
        """{kind: (calls, bytes sent)} of the collectives that ran."""
        return {k: (self.calls[k], self.bytes[k]) for k in COLLECTIVES if self.calls[k]}


class Comm:
    """One rank's view of a group of ``world`` ranks; subclasses give ``send`` and ``recv``.
    Arrays are split along ``axis`` into ``world`` equal chunks (the caller checks divisibility)."""

    def __init__(self, rank, world):
        self.rank, self.world = int(rank), positive_int(world, "world")
        self.traffic = Traffic()
        self._kind = None

    def _send(self, array, kind):                      # to the next rank on the ring
        chunk = np.ascontiguousarray(array)
        self.traffic.add(kind, chunk.nbytes)
        self.send((self.rank + 1) % self.world, chunk)

    def _recv(self):                                   # from the previous rank on the ring
        return self.recv((self.rank - 1) % self.world)

    def _chunks(self, x, axis, name):
        if x.shape[axis] % self.world:
            raise ValueError(f"{name}: expected axis {axis} of length divisible by world={self.world}; "
                             f"got shape {x.shape}")
        return [c.copy() for c in np.split(x, self.world, axis=axis)]

    def reduce_scatter(self, x, axis=0):  # (.., n, ..) on each rank -> (.., n / P, ..)
        """The sum over ranks, each rank keeping chunk ``rank`` of it."""
        self.traffic.calls["reduce_scatter"] += 1
        return self._reduce_scatter(self._chunks(x, axis, "reduce_scatter"), "reduce_scatter")

    def all_gather(self, x, axis=0):  # (.., n, ..) -> (.., P n, ..), the ranks' chunks in rank order
        """Every rank's chunk on every rank."""
        self.traffic.calls["all_gather"] += 1
        return np.concatenate(self._all_gather(x, "all_gather"), axis=axis)

    def all_reduce(self, x):  # (...) -> (...), the sum over ranks
        """Reduce-scatter then all-gather of the flattened array: 2 (P - 1)/P of its bytes sent."""
        self.traffic.calls["all_reduce"] += 1
        flat = np.concatenate([x.reshape(-1), np.zeros(-x.size % self.world, x.dtype)])
        part = self._reduce_scatter(np.split(flat, self.world), "all_reduce")
        return np.concatenate(self._all_gather(part, "all_reduce"))[:x.size].reshape(x.shape)

    def _reduce_scatter(self, acc, kind):
        # step s: send chunk (r - s - 1), which holds s + 1 ranks' terms, add the one received;
        # the chunk received at the last step, s = P - 2, is chunk r, with all P terms
        P, r = self.world, self.rank
        for s in range(P - 1):
            self._send(acc[(r - s - 1) % P], kind)
            acc[(r - s - 2) % P] = acc[(r - s - 2) % P] + self._recv()
        return acc[r]

    def _all_gather(self, x, kind):
        # step s: forward the chunk received at step s - 1 (at s = 0, the rank's own)
        P, r = self.world, self.rank
        out = [None] * P
        out[r] = np.ascontiguousarray(x)
        for s in range(P - 1):
            self._send(out[(r - s) % P], kind)
            out[(r - s - 1) % P] = self._recv()
        return out


class SimComm(Comm):
    """A rank of P simulated in one process: P threads, a queue per (src, dst) pair."""

    def __init__(self, rank, world, queues, timeout):
        super().__init__(rank, world)
        self._queues, self._timeout = queues, timeout

    def send(self, dst, array):
        self._queues[self.rank, dst].put(array.copy())

    def recv(self, src):
        try:
            return self._queues[src, self.rank].get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"rank {self.rank}: nothing from rank {src} in {self._timeout} s "
                               "(a rank failed or skipped a collective)") from None


def run_simulated(world, fn, *args, timeout=60.0):
    """``[fn(comm, *args) for each rank]``, the P ranks as threads of this process (numpy's BLAS
    calls release the GIL); the first exception of any rank is raised."""
    world = positive_int(world, "world")
    queues = {(a, b): queue.Queue() for a in range(world) for b in range(world)}
    results, errors = [None] * world, [None] * world

    def rank_main(r):
        try:
            results[r] = fn(SimComm(r, world, queues, timeout), *args)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread below
            errors[r] = e

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


class TorchComm(Comm):
    """A rank of a torch.distributed process group (gloo on CPU): torch only moves the bytes."""

    def __init__(self, dist):
        super().__init__(dist.get_rank(), dist.get_world_size())
        self._dist = dist
        import torch
        self._torch = torch
        self._pending = []

    def send(self, dst, array):
        # isend, so that every rank on the ring can send before it receives
        t = self._torch.from_numpy(array)
        self._pending.append((self._dist.isend(t, dst), t))

    def recv(self, src):
        t = self._torch.from_numpy(np.empty(self._shape, self._dtype))
        self._dist.recv(t, src)
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
        return t.numpy()

    def _send(self, array, kind):
        # the receiver needs the chunk's shape and dtype: on a ring every chunk of a step has
        # the sent one's (equal chunks), so the rank that sends one knows what it receives
        self._shape, self._dtype = array.shape, array.dtype
        super()._send(array, kind)
