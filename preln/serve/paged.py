"""A paged KV cache and continuous batching: sequences of different lengths join and leave one
running batch, their keys and values kept in fixed-size blocks (PagedAttention, Kwon et al. 2023,
arXiv 2309.06180; iteration-level scheduling, Yu et al. 2022, Orca, OSDI).

    from preln.serve.paged import ContinuousBatcher, Request
    server = ContinuousBatcher(lm, n_blocks=64, block_size=8)        # lm: a causal preln.models.lm.TinyLM
    result = server.run([Request(rid=0, prompt=ids, n_new=16, arrival=0), ...])
    result.tokens[0]                  # prompt + generated ids, as lm.generate gives them (greedy)
    result.steps[-1].blocks_used      # what the cache held after the last step

Memory. A contiguous :class:`preln.nn.block.KVCache` reserves ``max_len`` positions per sequence up
front, whatever length the sequence reaches. :class:`PagedKVCache` keeps one pool of ``n_blocks``
physical blocks per layer, each holding ``block_size`` positions' keys and values::

    k, v: (n_layers, n_blocks, n_kv, block_size, d_h)

and a *block table* per sequence: the list of physical blocks that hold its positions in order;
position p lives in block ``table[p // block_size]`` at offset ``p % block_size``. A sequence gets
a block when its next position needs one and gives all of them back when it finishes, so it never
holds more than ``block_size - 1`` unused positions, and none for positions it never reaches.

Attention. :func:`paged_attention` reads a sequence's blocks in place, one after another through
its block table, with the online softmax of FlashAttention (a running max m, sum l and an
unnormalised accumulator): the keys and values are never gathered into one array. Grouped-query
attention (``n_kv_heads < n_heads``) is supported: query head h reads KV head h // group.

Scheduling (:class:`ContinuousBatcher`). Every step: (1) each running sequence reserves room for
one more position; if the pool is out of blocks, the most recently admitted sequence is preempted
-- its blocks freed, itself put back at the head of the queue, to be recomputed from its tokens so
far (vLLM's recomputation, section 4.5); (2) waiting requests are admitted first come, first
served while their prompt fits in the free blocks; (3) one forward step runs every newly admitted
sequence's prompt (its prefill) and one token of every other running sequence (its decode step)
together: the linear layers see all their rows at once, attention runs per sequence over its own
blocks; (4) each sequence samples its next token, and those that reached ``n_new`` tokens leave,
freeing their blocks. Every sequence's logits equal those of decoding it alone with a contiguous
KV cache, to round-off (tests/test_paged.py).
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from preln.models.lm import TinyLM, sample_next
from preln.ops import layer_norm_forward
from preln.ops.attention import online_softmax_step, tiles
from preln.precision import resolve_dtype
from preln.validation import check_token_ids, index_in, nonnegative_float, nonnegative_int, positive_int

__all__ = ["PagedKVCache", "OutOfBlocks", "paged_attention", "paged_forward", "Request",
           "StepRecord", "ServeResult", "ContinuousBatcher"]


class OutOfBlocks(MemoryError):
    """The pool has fewer free blocks than a reservation needs (nothing was allocated)."""


class PagedKVCache:
    """Keys and values of many sequences in a pool of fixed-size blocks, one block table each.

    n_layers, n_blocks, block_size, n_kv_heads, d_head: the pool's shape (see the module docstring).
    dtype: storage dtype of K and V.
    """

    def __init__(self, n_layers, n_blocks, block_size, n_kv_heads, d_head, dtype=np.float64):
        self.n_layers = positive_int(n_layers, "n_layers")
        self.n_blocks = positive_int(n_blocks, "n_blocks")
        self.block_size = positive_int(block_size, "block_size")
        self.n_kv_heads = positive_int(n_kv_heads, "n_kv_heads")
        self.d_head = positive_int(d_head, "d_head")
        self.dtype = resolve_dtype(dtype)            # float storage: an int8 pool would truncate
        shape = (self.n_layers, self.n_blocks, self.n_kv_heads, self.block_size, self.d_head)
        self.k = np.zeros(shape, self.dtype)         # (L, n_blocks, n_kv, block_size, d_h)
        self.v = np.zeros(shape, self.dtype)
        self.tables = {}                             # seq -> [physical block ids], in position order
        self.lengths = {}                            # seq -> positions committed
        self._free = list(range(self.n_blocks - 1, -1, -1))   # a stack: block 0 is handed out first

    # ---- sequences and blocks --------------------------------------------------------------------
    def add(self, seq):
        """A new sequence with an empty block table."""
        if seq in self.tables:
            raise ValueError(f"seq: {seq!r} is already in the cache")
        self.tables[seq] = []
        self.lengths[seq] = 0

    def remove(self, seq):
        """The sequence leaves: its blocks go back to the free list."""
        self.check_seq(seq)
        self._free.extend(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    def blocks_needed(self, seq, n):
        """Blocks ``seq`` must still get to hold n more positions."""
        self.check_seq(seq)
        total = -(-(self.lengths[seq] + n) // self.block_size)
        return max(0, total - len(self.tables[seq]))

    def reserve(self, seq, n):
        """Allocate the blocks for positions length .. length + n - 1 of ``seq`` (all or none)."""
        need = self.blocks_needed(seq, positive_int(n, "n"))
        if need > len(self._free):
            raise OutOfBlocks(f"reserve: {seq!r} needs {need} more blocks for {n} positions; "
                              f"{len(self._free)} of {self.n_blocks} are free")
        for _ in range(need):
            self.tables[seq].append(self._free.pop())

    def write(self, layer, seq, k, v):
        """Store n new positions' keys and values, k, v: (n_kv, n, d_h), after the committed ones
        (reserve them first). The step's attention reads them before :meth:`commit`."""
        layer = index_in(layer, self.n_layers, "layer")       # -1 is not "the last layer"
        self.check_seq(seq)
        k, v = np.asarray(k), np.asarray(v)
        want = (self.n_kv_heads, k.shape[1] if k.ndim == 3 else -1, self.d_head)
        if k.ndim != 3 or k.shape != want or v.shape != k.shape:
            raise ValueError(f"k, v: expected (n_kv, n, d_h) = (n_kv={self.n_kv_heads}, n, "
                             f"d_h={self.d_head}) each; got {k.shape} and {v.shape}")
        t0, table, bs = self.lengths[seq], self.tables[seq], self.block_size
        if -(-(t0 + k.shape[1]) // bs) > len(table):
            raise ValueError(f"write: positions {t0} .. {t0 + k.shape[1] - 1} of {seq!r} have no "
                             f"block; reserve({seq!r}, {k.shape[1]}) first")
        for i in range(k.shape[1]):                  # position p -> (table[p // bs], p % bs)
            block, offset = table[(t0 + i) // bs], (t0 + i) % bs
            self.k[layer, block, :, offset] = k[:, i]
            self.v[layer, block, :, offset] = v[:, i]

    def commit(self, seq, n):
        """The n written positions are now part of ``seq`` (after every layer has written them)."""
        self.check_seq(seq)
        n = nonnegative_int(n, "n")
        if self.lengths[seq] + n > len(self.tables[seq]) * self.block_size:
            raise ValueError(f"commit: {seq!r} has room for {len(self.tables[seq]) * self.block_size} "
                             f"positions; cannot commit {self.lengths[seq]} + {n}")
        self.lengths[seq] += n

    def check_seq(self, seq):
        """A KeyError naming ``seq`` unless it was added."""
        if seq not in self.tables:
            raise KeyError(f"seq: {seq!r} is not in the cache (add it first)")

    # ---- memory ----------------------------------------------------------------------------------
    @property
    def free_blocks(self):
        return len(self._free)

    @property
    def blocks_used(self):
        return self.n_blocks - len(self._free)

    @property
    def bytes_per_position(self):
        """One position's keys and values in every layer: 2 n_layers n_kv d_h itemsize."""
        return 2 * self.n_layers * self.n_kv_heads * self.d_head * self.dtype.itemsize

    @property
    def nbytes(self):
        """The whole pool: n_blocks * block_size positions."""
        return self.k.nbytes + self.v.nbytes

    @property
    def used_nbytes(self):
        """The blocks that belong to some sequence."""
        return self.blocks_used * self.block_size * self.bytes_per_position

    @property
    def token_nbytes(self):
        """The positions actually stored: sum of the sequences' lengths."""
        return sum(self.lengths.values()) * self.bytes_per_position

    def __repr__(self):
        return (f"PagedKVCache(n_layers={self.n_layers}, n_blocks={self.n_blocks}, "
                f"block_size={self.block_size}, n_kv_heads={self.n_kv_heads}, d_head={self.d_head}, "
                f"sequences={len(self.tables)}, blocks_used={self.blocks_used})")


def paged_attention(q, cache, layer, seq, q_start):  # (H, n, d_h) -> (H, n, d_h)
    """Causal attention of n queries at positions q_start .. q_start + n - 1 of ``seq`` over its
    positions 0 .. q_start + n - 1, read block by block through its block table.

    The online softmax (:func:`preln.ops.attention.online_softmax_step`), one block a key tile:
    z = q k_b^T / sqrt(d_h) with later positions masked; m' = max(m, rowmax z);
    l = e^(m - m') l + rowsum e^(z - m'); A = e^(m - m') A + e^(z - m') v_b; at the end O = A / l.
    Query head h reads KV head h // (H / n_kv).
    """
    H, n, dh = q.shape
    n_kv, bs = cache.n_kv_heads, cache.block_size
    if H % n_kv or dh != cache.d_head:
        raise ValueError(f"q: expected (H, n, d_h) with H a multiple of n_kv = {n_kv} and "
                         f"d_h = {cache.d_head}; got shape {q.shape}")
    layer = index_in(layer, cache.n_layers, "layer")                # -1 is not "the last layer"
    cache.check_seq(seq)
    q_start, room = nonnegative_int(q_start, "q_start"), len(cache.tables[seq]) * bs
    if q_start + n > room:       # positions past the reserved blocks: nothing to read
        raise ValueError(f"q_start: expected q_start + n <= {room}, the positions reserved for {seq!r}; "
                         f"got {q_start} + {n}")
    g = H // n_kv
    end = q_start + n                                                # positions < end are visible
    qg = q.reshape(n_kv, g * n, dh) / np.sqrt(dh)                  # (n_kv, g n, d_h): heads kv*g + j
    q_pos = q_start + np.tile(np.arange(n), g)                      # (g n,) each row's position
    m = np.full((n_kv, g * n, 1), -np.inf)
    l = np.zeros((n_kv, g * n, 1))
    acc = np.zeros((n_kv, g * n, dh))
    for (j0, _), block in zip(tiles(end, bs), cache.tables[seq]):   # one key tile per block
        kb, vb = cache.k[layer, block], cache.v[layer, block]      # (n_kv, bs, d_h), in place
        k_pos = j0 + np.arange(bs)                                   # (bs,)
        z = qg @ kb.transpose(0, 2, 1)                               # (n_kv, g n, bs)
        z = np.where(k_pos[None, None, :] <= q_pos[None, :, None], z, -np.inf)   # causal
        m, l, acc = online_softmax_step(m, l, acc, z, vb)
    return (acc / l).reshape(H, n, dh).astype(q.dtype, copy=False)


class _PagedLayer:
    """One layer of the pool as a block's KV store for one step: the step's N rows are the new
    positions of several sequences (spans: (seq, row0, n, t0) each), their keys and values go
    into each sequence's blocks, and each sequence's queries read its own blocks (in float64, the
    online softmax's own arithmetic: ``policy`` and ``watch`` are not used)."""

    def __init__(self, cache, layer, spans):
        self.cache, self.layer, self.spans = cache, layer, spans

    def attend(self, q, k, v, policy=None, watch=None):  # (1, H, N, d_h) each -> (1, H, N, d_h)
        o = np.empty_like(q)
        for seq, r0, n, t0 in self.spans:
            rows = slice(r0, r0 + n)                                 # seq's rows -> (H, n, d_h)
            self.cache.write(self.layer, seq, k[0, :, rows], v[0, :, rows])
            o[0, :, rows] = paged_attention(q[0, :, rows], self.cache, self.layer, seq, t0)
        return o


def _block_step(block, layer, x, cache, spans):  # (N, D) -> (N, D)
    """One TransformerBlock on the rows of several sequences, as one batch row (1, N, D): the
    block's own forward, op by op, its attention core the pool's layer (:class:`_PagedLayer`)."""
    return block.step(x[None], _PagedLayer(cache, layer, spans), fused=False)[0]


def paged_forward(lm, cache, chunks):  # [(seq, (n_i,) ids)] -> [(n_i, V) logits]
    """One forward step of ``lm`` over several sequences at once, each continuing where its cache
    ends: chunks = [(seq, token ids)], n_i ids each (a prompt for a prefill, one id for a decode
    step). Reserves and commits the positions in ``cache``; returns each chunk's logits."""
    if not isinstance(lm, TinyLM):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM; got {type(lm).__name__}")
    spans, rows = [], 0
    for seq, ids in chunks:
        t0 = cache.lengths[seq]
        if t0 + len(ids) > lm.config.max_len:
            raise ValueError(f"chunks: {seq!r} would reach position {t0 + len(ids) - 1}, past the "
                             f"model's max_len={lm.config.max_len}")
        cache.reserve(seq, len(ids))
        spans.append((seq, rows, len(ids), t0))
        rows += len(ids)
    ids = np.concatenate([np.asarray(t, np.int64) for _, t in chunks])            # (N,)
    pos = np.concatenate([t0 + np.arange(n) for _, _, n, t0 in spans])            # (N,)
    x = lm.io.embed_rows(lm.own, ids, pos, "chunks")                              # (N, D)
    for layer, block in enumerate(lm.stack.layers):
        x = _block_step(block, layer, x, cache, spans)                          # (N, D)
    stack = lm.stack
    if stack.final_norm:
        x = layer_norm_forward(x, stack.norm["weight"], stack.norm["bias"], stack.config.eps)[0]
    logits = lm.io.logits(lm.own, x)[0]                                          # (N, V)
    for seq, _, n, _ in spans:
        cache.commit(seq, n)
    return [logits[r0:r0 + n] for _, r0, n, _ in spans]


# ---- continuous batching --------------------------------------------------------------------------
class Request(NamedTuple):
    """A generation request: ``n_new`` tokens after ``prompt``, arriving at scheduler step ``arrival``."""

    rid: int
    prompt: np.ndarray         # (S0,) int token ids
    n_new: int
    arrival: int = 0


class StepRecord(NamedTuple):
    """What one scheduler step did and what the cache held after it."""

    step: int
    running: tuple             # request ids in this step's batch
    prefill_tokens: int        # positions of newly admitted sequences run this step
    decode_tokens: int         # one per sequence already running
    blocks_used: int
    tokens_stored: int         # positions held: the sequences' lengths
    reserved_tokens: int       # what reserving max_len per running sequence would hold


class ServeResult(NamedTuple):
    tokens: dict               # rid -> (S0 + n_new,) int64: the prompt, then the generated ids
    logits: dict               # rid -> (n_new, V): the logits each generated token was sampled from
    steps: list                # [StepRecord], one per scheduler step
    finished_at: dict          # rid -> the step after which it left the batch
    preemptions: int           # sequences preempted (freed and later recomputed)


class _Seq:
    def __init__(self, req, rng):
        self.rid, self.n_prompt, self.n_new = req.rid, len(req.prompt), req.n_new
        self.tokens = [int(t) for t in req.prompt]
        self.logits = []
        self.rng = rng
        self.fresh = True          # not in the cache: its next step is a prefill of all its tokens

    @property
    def done(self):
        return len(self.tokens) - self.n_prompt >= self.n_new


class ContinuousBatcher:
    """Serve requests with a :class:`PagedKVCache` of ``n_blocks`` blocks of ``block_size``
    positions, scheduling a running batch step by step (see the module docstring).

    lm: a causal :class:`preln.models.lm.TinyLM` (eval mode). max_batch: at most this many sequences per
    step (None: as many as the blocks allow). ``block_size = lm.config.max_len`` with one block per
    sequence is the contiguous reservation of max_len positions, for comparison.
    """

    def __init__(self, lm, n_blocks, block_size, max_batch=None):
        if not isinstance(lm, TinyLM):
            raise TypeError(f"lm: expected a preln.models.lm.TinyLM; got {type(lm).__name__}")
        cfg = lm.config
        self.lm = lm.eval()
        self.cache = PagedKVCache(cfg.n_layers, n_blocks, block_size, cfg.n_heads,
                                  cfg.d_model // cfg.n_heads, lm.dtype)
        self.max_batch = None if max_batch is None else positive_int(max_batch, "max_batch")

    def _check(self, requests):
        seen = set()
        for r in requests:
            if not isinstance(r, Request):
                raise TypeError(f"requests: expected preln.serve.paged.Request items; got {type(r).__name__}")
            prompt = check_token_ids(r.prompt, self.lm.config.vocab_size, f"requests[{r.rid}].prompt", ndim=1)
            positive_int(r.n_new, f"requests[{r.rid}].n_new")
            nonnegative_int(r.arrival, f"requests[{r.rid}].arrival")
            positions = prompt.size + r.n_new - 1          # the last token is sampled, never fed back
            if positions > self.lm.config.max_len:
                raise ValueError(f"requests[{r.rid}]: prompt {prompt.size} + n_new {r.n_new} tokens "
                                 f"need {positions} positions; the model has {self.lm.config.max_len}")
            blocks = -(-positions // self.cache.block_size)
            if blocks > self.cache.n_blocks:
                raise ValueError(f"requests[{r.rid}]: needs {blocks} blocks alone; the pool has "
                                 f"{self.cache.n_blocks}")
            if r.rid in seen:
                raise ValueError(f"requests: request id {r.rid!r} appears twice")
            seen.add(r.rid)

    def run(self, requests, temperature=0.0, seed=0, max_steps=100_000):
        """Serve ``requests`` (a list of :class:`Request`) to completion -> :class:`ServeResult`.

        temperature 0: greedy; otherwise each request samples from its own generator,
        ``np.random.default_rng([seed, rid])``, so its tokens do not depend on the others.
        """
        self._check(requests)
        # checked before any step (sample_next checks it too): a failure mid-run would leave
        # sequences in the cache
        nonnegative_float(temperature, "temperature")
        cache, max_len = self.cache, self.lm.config.max_len
        pending = deque(sorted(requests, key=lambda r: (r.arrival, r.rid)))
        waiting, running = deque(), []
        out = ServeResult({}, {}, [], {}, 0)
        preemptions = 0
        for step in range(max_steps):
            if not (pending or waiting or running):
                break
            while pending and pending[0].arrival <= step:             # arrivals join the queue
                r = pending.popleft()
                waiting.append(_Seq(r, np.random.default_rng([seed, r.rid])))
            # (1) room for one more position of every running sequence; preempt the newest if needed
            i = 0
            while i < len(running):
                seq = running[i]
                try:
                    cache.reserve(seq.rid, 1)
                    i += 1
                except OutOfBlocks:
                    victim = running.pop()                           # the most recently admitted
                    cache.remove(victim.rid)
                    victim.fresh = True                              # recompute from its tokens
                    waiting.appendleft(victim)
                    preemptions += 1
            # (2) admit waiting sequences, first come first served, while their prefill fits
            while waiting and (self.max_batch is None or len(running) < self.max_batch):
                seq = waiting[0]
                need = -(-len(seq.tokens) // cache.block_size)
                if need > cache.free_blocks:
                    break
                waiting.popleft()
                cache.add(seq.rid)
                cache.reserve(seq.rid, len(seq.tokens))
                running.append(seq)
            if not running:
                out.steps.append(StepRecord(step, (), 0, 0, cache.blocks_used, 0, 0))
                continue
            # (3) one forward step: prefills of the new sequences, one token of the others
            chunks = [(s.rid, s.tokens if s.fresh else s.tokens[-1:]) for s in running]
            logits = paged_forward(self.lm, cache, chunks)
            prefill = sum(len(c) for s, (_, c) in zip(running, chunks) if s.fresh)
            record = (step, tuple(s.rid for s in running), prefill,
                      sum(not s.fresh for s in running))
            # (4) sample; the step's memory is what the cache holds now; finished sequences leave
            for s, z in zip(running, logits):
                s.fresh = False
                s.logits.append(z[-1])                               # (V,): the next token's logits
                s.tokens.append(int(sample_next(z[-1][None], temperature, s.rng)[0]))
            out.steps.append(StepRecord(*record, cache.blocks_used, sum(cache.lengths.values()),
                                        len(running) * max_len))
            for s in [s for s in running if s.done]:
                running.remove(s)
                cache.remove(s.rid)
                out.tokens[s.rid] = np.array(s.tokens, np.int64)
                out.logits[s.rid] = np.array(s.logits)                # (n_new, V)
                out.finished_at[s.rid] = step
        else:
            raise RuntimeError(f"run: not finished after max_steps={max_steps} steps")
        return out._replace(preemptions=preemptions)
