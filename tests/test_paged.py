"""preln.serve.paged: the paged KV cache and continuous batching equal decoding each sequence alone with a
contiguous KVCache, for every arrival order, length, block size and pool size; memory accounting."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preln.models.lm import LMConfig, TinyLM
from preln.serve.paged import ContinuousBatcher, OutOfBlocks, PagedKVCache, Request, paged_attention

#: float64 logits of the paged step (unfused ops, attention block by block) against the contiguous
#: cache's decode (fused kernels, tiled attention): the same arithmetic in another order
PAGED_TOL = 1e-10
#: float64 attention computed two ways
EXACT = 1e-12
SERVE_SETTINGS = settings(max_examples=30, deadline=None)

_LMS = {}


def tiny_lm(norm_first=True):
    """Random-init float64 LMs, one per variant (building one per example would dominate)."""
    if norm_first not in _LMS:
        cfg = LMConfig(vocab_size=13, max_len=24, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                       norm_first=norm_first)
        _LMS[norm_first] = TinyLM(cfg, dtype=np.float64, seed=3).eval()
    return _LMS[norm_first]


def contiguous_logits(lm, tokens, n_prompt):
    """Decode ``tokens`` alone with a contiguous KVCache, teacher-forced: the logits after the
    prompt and after each later token but the last -> (len(tokens) - n_prompt, V)."""
    kv = lm.kv_cache(1, len(tokens))
    out = [lm.decode(tokens[None, :n_prompt], kv)[0, -1]]
    for t in range(n_prompt, len(tokens) - 1):
        out.append(lm.decode(tokens[None, t:t + 1], kv)[0, -1])
    return np.array(out)


# ---- the cache ----------------------------------------------------------------------------------
def test_block_tables_and_the_free_list():
    c = PagedKVCache(n_layers=1, n_blocks=4, block_size=3, n_kv_heads=1, d_head=2)
    c.add("a")
    c.add("b")
    c.reserve("a", 4)                                    # 4 positions: 2 blocks
    c.reserve("b", 1)
    assert c.tables == {"a": [0, 1], "b": [2]} and c.free_blocks == 1
    with pytest.raises(OutOfBlocks, match="needs 2 more blocks"):
        c.reserve("b", 7)                                # 7 positions: 3 blocks, 1 held, 1 free
    assert c.tables["b"] == [2] and c.free_blocks == 1  # all or nothing
    k = np.arange(8.0).reshape(1, 4, 2)
    c.write(0, "a", k, -k)
    c.commit("a", 4)
    assert c.lengths["a"] == 4 and np.array_equal(c.k[0, 1, 0, 0], k[0, 3])   # position 3 -> block 1
    assert c.token_nbytes == 4 * c.bytes_per_position == 4 * 2 * 1 * 1 * 2 * 8
    assert c.used_nbytes == 3 * 3 * c.bytes_per_position and c.nbytes == 4 * 3 * c.bytes_per_position
    c.remove("a")
    assert c.free_blocks == 3 and "a" not in c.tables
    c.add("c")
    c.reserve("c", 2)
    assert c.tables["c"] == [0]                          # freed blocks are reused
    with pytest.raises(ValueError, match="reserve"):
        c.write(0, "c", np.zeros((1, 4, 2)), np.zeros((1, 4, 2)))   # 4 positions, 1 block
    with pytest.raises(ValueError, match="n_kv"):
        c.write(0, "c", np.zeros((2, 1, 2)), np.zeros((2, 1, 2)))
    with pytest.raises(KeyError, match="zz"):
        c.reserve("zz", 1)
    with pytest.raises(ValueError, match="already"):
        c.add("c")
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(1, 4, 0, 1, 2)


@pytest.mark.parametrize("H, n_kv", [(4, 4), (4, 2), (4, 1)])
def test_paged_attention_is_causal_attention_over_scattered_blocks(H, n_kv):
    rng = np.random.default_rng(H * 10 + n_kv)
    d, bs, T, n = 8, 3, 11, 4                            # 11 positions; the last 4 are queries
    c = PagedKVCache(1, 12, bs, n_kv, d)
    for s in ("x", "y"):
        c.add(s)
    k, v = rng.standard_normal((2, n_kv, T, d))
    for t in range(T):                                   # interleave with another sequence, so the
        c.reserve("x", 1)                                # blocks of "x" are not contiguous
        c.write(0, "x", k[:, t:t + 1], v[:, t:t + 1])
        c.commit("x", 1)
        c.reserve("y", 1)
        c.write(0, "y", k[:, :1] + 100, v[:, :1])
        c.commit("y", 1)
    assert c.tables["x"] != list(range(len(c.tables["x"])))
    q = rng.standard_normal((H, n, d))
    out = paged_attention(q, c, 0, "x", q_start=T - n)
    g = H // n_kv
    kr, vr = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)       # query head h -> KV head h // g
    z = q @ kr.transpose(0, 2, 1) / np.sqrt(d)                       # (H, n, T)
    z = np.where(np.arange(T)[None, None] <= (T - n + np.arange(n))[None, :, None], z, -np.inf)
    p = np.exp(z - z.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ vr
    assert np.abs(out - ref).max() < EXACT
    with pytest.raises(ValueError, match="q"):
        paged_attention(np.zeros((3, 1, d)), c, 0, "x", 0) if n_kv > 1 else \
            paged_attention(np.zeros((H, 1, d + 1)), c, 0, "x", 0)


# ---- continuous batching equals decoding alone ------------------------------------------------------
requests = st.lists(st.tuples(st.integers(1, 10), st.integers(1, 10), st.integers(0, 8)),
                    min_size=1, max_size=6)


@SERVE_SETTINGS
@given(reqs=requests, block_size=st.sampled_from([1, 2, 3, 4, 8, 24]), spare=st.integers(0, 12),
       norm_first=st.booleans(), seed=st.integers(0, 2**16))
def test_continuous_batching_equals_contiguous_decode(reqs, block_size, spare, norm_first, seed):
    """Every request's logits, at every generated token, equal decoding it alone with a contiguous
    KVCache; its greedy tokens equal lm.generate -- whatever the arrival order, the prompt and
    output lengths, the block size, and a pool small enough to force preemption."""
    lm = tiny_lm(norm_first)
    rng = np.random.default_rng(seed)
    stream = [Request(i, rng.integers(0, 13, s0), n_new, arrival)
              for i, (s0, n_new, arrival) in enumerate(reqs)]
    need = max(-(-(len(r.prompt) + r.n_new - 1) // block_size) for r in stream)
    server = ContinuousBatcher(lm, n_blocks=need + spare, block_size=block_size)
    result = server.run(stream)
    assert server.cache.blocks_used == 0 and not server.cache.tables      # everything was freed
    for r in stream:
        tokens = result.tokens[r.rid]
        assert np.array_equal(tokens, lm.generate(r.prompt, r.n_new))
        ref = contiguous_logits(lm, tokens, len(r.prompt))
        assert ref.shape == result.logits[r.rid].shape == (r.n_new, 13)
        assert np.abs(result.logits[r.rid] - ref).max() < PAGED_TOL
        assert result.finished_at[r.rid] >= r.arrival + r.n_new - 1
    for rec in result.steps:                             # memory: never more than a block's slack
        assert rec.blocks_used * block_size - rec.tokens_stored <= len(rec.running) * (block_size - 1)
        assert rec.tokens_stored <= rec.reserved_tokens or block_size > lm.config.max_len


def test_preemption_recomputes_and_still_agrees():
    lm = tiny_lm()
    rng = np.random.default_rng(0)
    stream = [Request(i, rng.integers(0, 13, 6), 12, 0) for i in range(4)]
    server = ContinuousBatcher(lm, n_blocks=5, block_size=4)     # 17 positions each: 5 blocks
    result = server.run(stream)
    assert result.preemptions > 0
    for r in stream:
        assert np.array_equal(result.tokens[r.rid], lm.generate(r.prompt, r.n_new))


def test_sampling_does_not_depend_on_the_batch():
    lm = tiny_lm()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 13, 5) for _ in range(4)]
    a = ContinuousBatcher(lm, 40, 4).run([Request(i, p, 8, 0) for i, p in enumerate(prompts)],
                                         temperature=0.9, seed=5)
    b = ContinuousBatcher(lm, 40, 4).run([Request(i, p, 8, 3 - i) for i, p in enumerate(prompts)],
                                         temperature=0.9, seed=5)
    for i in range(4):
        assert np.array_equal(a.tokens[i], b.tokens[i])
    assert any(not np.array_equal(a.tokens[i], lm.generate(prompts[i], 8)) for i in range(4))


def test_paging_saves_memory_against_reserving_max_len():
    """On a stream of varied lengths the paged cache holds little more than the tokens; a
    reservation of max_len per sequence (one block of max_len each) holds max_len per sequence."""
    lm = tiny_lm()
    rng = np.random.default_rng(2)
    stream = [Request(i, rng.integers(0, 13, int(rng.integers(1, 8))), int(rng.integers(1, 8)),
                      int(rng.integers(0, 6))) for i in range(10)]
    max_len = lm.config.max_len
    paged = ContinuousBatcher(lm, n_blocks=40, block_size=2).run(stream)
    whole = ContinuousBatcher(lm, n_blocks=10, block_size=max_len).run(stream)
    for rec in whole.steps:
        assert rec.blocks_used * max_len == rec.reserved_tokens
    peak_paged = max(r.blocks_used * 2 for r in paged.steps)
    peak_whole = max(r.blocks_used * max_len for r in whole.steps)
    used = sum(r.tokens_stored for r in paged.steps) / sum(r.blocks_used * 2 for r in paged.steps)
    assert peak_paged < peak_whole / 2 and used > 0.7
    for i in range(10):
        assert np.array_equal(paged.tokens[i], whole.tokens[i])


@pytest.mark.parametrize("make, match", [
    (lambda: Request(0, np.zeros(0, np.int64), 3), "prompt"),
    (lambda: Request(0, np.zeros(3, np.int64), 0), "n_new"),
    (lambda: Request(0, np.zeros(3, np.int64), 3, -1), "arrival"),
    (lambda: Request(0, np.zeros(20, np.int64), 10), "positions"),
    (lambda: Request(0, np.zeros(3), 3), "prompt"),
])
def test_bad_requests(make, match):
    with pytest.raises(ValueError, match=match):
        ContinuousBatcher(tiny_lm(), 40, 4).run([make()])


def test_bad_server_arguments():
    with pytest.raises(TypeError, match="lm"):
        ContinuousBatcher("lm", 4, 4)
    with pytest.raises(ValueError, match="needs 3 blocks alone"):
        ContinuousBatcher(tiny_lm(), 2, 4).run([Request(0, np.zeros(6, np.int64), 5)])
    r = Request(0, np.zeros(3, np.int64), 2)
    with pytest.raises(ValueError, match="twice"):
        ContinuousBatcher(tiny_lm(), 10, 4).run([r, r])
    with pytest.raises(TypeError, match="Request"):
        ContinuousBatcher(tiny_lm(), 10, 4).run([(0, [1], 2)])
