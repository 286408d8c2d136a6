"""Decode speed of SmolLM2-135M: preln's float32 Llama blocks against torch eager, preln's int8 and
4-bit weight-only models (:func:`preln.quant.weight_only.quantize_model`, RTN, groups of 32, head included) against
preln's float32, and each against its own memory-bandwidth bound.

    python -m preln.gguf.bench [--prompt 32] [--new 32] [--rounds 5]

Batch 1, one thread (BLAS and torch), float32. Each round decodes ``--new`` tokens greedily after a
``--prompt``-token prefill, once with preln (``lm.decode`` with its KV cache) and once with
transformers' LlamaForCausalLM (eager attention, its DynamicCache, the same loop under
``torch.inference_mode``); the two alternate round by round, so a busy machine slows both alike.
Tokens/s is the median over rounds of n_new / (time of the n_new decode steps), in wall time and, as
"CPU tok/s", in this process's CPU time -- which a machine shared with other jobs inflates less
(time slices lost to them are not counted; their memory traffic still is).

The quantised models' bound uses their own weight bytes (``weight_nbytes()``: codes, float32 scales,
one-byte zero points) and the same float32 KV cache. A ``llama.cpp`` row (the file as stored, Q4_1,
``n_threads=1``) is added when ``llama_cpp`` happens to be importable; it is never a dependency.

Bytes per decoded token: every weight once (the tied head counted once: it is the embedding's
matrix, read for the head's product; the embedding's lookup reads one row) plus the KV cache read at
that position, 2 L H_kv d_h t 4 bytes, averaged over the decoded positions. The bound is the
measured read bandwidth (the best of ``a.sum()`` over a 256 MiB float32 array, one thread, measured
after every round and the best round kept) divided by those bytes.
"""
import argparse
import contextlib
import io
import time

import numpy as np

from preln.blas import blas_threads
from preln.measure import best_time
from preln.gguf.model import smollm2_path
from preln.models.llama_lm import LlamaLM
from preln.quant.weight_only import quantize_model

__all__ = ["read_bandwidth", "bytes_per_token", "preln_decode_seconds", "torch_decode_seconds",
           "llama_cpp_decode_seconds", "run", "main"]

PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "combined movable metal type, oil-based ink and a screw press into a system that")


def read_bandwidth(nbytes=256 * 2**20, repeats=5):
    """Bytes/s that one thread reads from memory: best time of summing a float32 array of nbytes."""
    a = np.ones(int(nbytes) // 4, np.float32)
    return a.nbytes / best_time(a.sum, repeats, warmup=0, clock=time.perf_counter)


def _clocks():  # -> [wall, CPU time of this process] in seconds
    return np.array([time.perf_counter(), time.process_time()])


def bytes_per_token(lm, prompt_len, n_new, itemsize=4):
    """(weight bytes, mean KV bytes) read per decoded token (see the module docstring)."""
    cfg = lm.config
    weights = lm.num_params() * itemsize
    per_position = 2 * cfg.n_layers * cfg.n_kv_heads * (cfg.d_model // cfg.n_heads) * itemsize
    positions = np.arange(prompt_len, prompt_len + n_new) + 1          # keys read at each step
    return weights, float(per_position * positions.mean())


def preln_decode_seconds(lm, prompt, n_new):
    """Seconds [wall, CPU] of n_new greedy decode steps after the prefill of ``prompt``; and the tokens."""
    kv = lm.kv_cache(1, len(prompt) + n_new)
    nxt = int(lm.decode(np.array([prompt]), kv)[0, -1].argmax())
    out = [nxt]
    t = _clocks()
    for _ in range(n_new):
        nxt = int(lm.decode(np.array([[nxt]]), kv)[0, -1].argmax())
        out.append(nxt)
    return _clocks() - t, out[:-1]


def torch_decode_seconds(model, prompt, n_new):
    """The same loop with transformers' model and its DynamicCache."""
    import torch
    from transformers import DynamicCache
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits
        nxt = int(logits[0, -1].argmax())
        out = [nxt]
        t = _clocks()
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True).logits
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
        return _clocks() - t, out[:-1]


def llama_cpp_decode_seconds(llm, prompt, n_new):
    """The same loop with llama-cpp-python's Llama (its own KV cache)."""
    llm.reset()
    llm.eval(prompt)
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    out = [nxt]
    t = _clocks()
    for _ in range(n_new):
        llm.eval([nxt])
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
    return _clocks() - t, out[:-1]


def llama_cpp_model(path, n_ctx):
    """llama_cpp.Llama on the file, one thread, or None when llama_cpp is not importable."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.Llama(model_path=str(path), n_threads=1, n_batch=n_ctx, n_ctx=n_ctx,
                           logits_all=True, verbose=False)


def torch_model(path):
    """transformers' float32 LlamaForCausalLM from the GGUF at ``path``, eager attention; or None
    with the reason when torch or transformers is not installed."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return None, f"torch eager not measured: {e.name} is not installed (test-only reference)"
    torch.set_num_threads(1)
    with contextlib.redirect_stderr(io.StringIO()):             # its GGUF conversion's progress bar
        model = transformers.LlamaForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), None


def run(prompt_len=32, n_new=32, rounds=5, path=None):
    """Measure and return the rows: {name: {"tok_s", "bound_frac", "cpu_tok_s", "cpu_bound_frac",
    "weight_bytes"}}, with the bytes and the bandwidth (the best of a measurement after each round)."""
    path = smollm2_path() if path is None else path
    lm = LlamaLM.from_gguf(path, dtype=np.float32)
    prompt = lm.tokenizer.encode(PROMPT)
    prompt = (prompt * (prompt_len // len(prompt) + 1))[:prompt_len]
    model, why = torch_model(path)
    models = {"preln": lm, "preln int8": quantize_model(lm, "rtn", bits=8, group_size=32),
              "preln 4-bit": quantize_model(lm, "rtn", bits=4, group_size=32)}
    runs = {name: (lambda m=m: preln_decode_seconds(m, prompt, n_new)) for name, m in models.items()}
    if model is not None:
        runs["torch eager"] = lambda: torch_decode_seconds(model, prompt, n_new)
    cpp = llama_cpp_model(path, prompt_len + n_new + 1)
    if cpp is not None:
        runs["llama.cpp Q4_1"] = lambda: llama_cpp_decode_seconds(cpp, prompt, n_new)
    weights, kv = bytes_per_token(lm, prompt_len, n_new)
    nbytes = {name: m.weight_nbytes() for name, m in models.items()}
    nbytes["preln"] = nbytes["torch eager"] = weights
    if cpp is not None:
        nbytes["llama.cpp Q4_1"] = path.stat().st_size              # the file: its blocks as stored
    times = {name: [] for name in runs}
    tokens = {}
    with blas_threads(1):
        for name in runs:                                          # warm-up: numba's compilation
            if name in models:
                preln_decode_seconds(models[name], prompt, 2)
        if model is not None:
            torch_decode_seconds(model, prompt, 2)
        bandwidth = 0.0
        for _ in range(rounds):                                    # interleaved, round by round
            for name, fn in runs.items():
                s, tokens[name] = fn()
                times[name].append(s)
            bandwidth = max(bandwidth, read_bandwidth())           # the least disturbed of the rounds
    bound = bandwidth / (weights + kv)
    rows = {}
    for name, t in times.items():
        wall, cpu = n_new / np.median(np.array(t), axis=0)         # tokens/s by each clock
        rows[name] = {"tok_s": float(wall), "bound_frac": float(wall) * (nbytes[name] + kv) / bandwidth,
                      "cpu_tok_s": float(cpu), "cpu_bound_frac": float(cpu) * (nbytes[name] + kv) / bandwidth,
                      "weight_bytes": nbytes[name]}
    return {"rows": rows, "weights": weights, "kv": kv, "bandwidth": bandwidth, "bound": bound,
            "why": why, "same_tokens": tokens.get("preln") == tokens.get("torch eager"),
            "prompt_len": prompt_len, "n_new": n_new, "rounds": rounds}


def report(r):
    lines = [f"SmolLM2-135M decode, batch 1, one thread, float32: prompt {r['prompt_len']} tokens, "
             f"{r['n_new']} decoded, median of {r['rounds']} interleaved rounds",
             f"bytes per decoded token: weights {r['weights'] / 1e6:.1f} MB + KV {r['kv'] / 1e6:.2f} MB; "
             f"read bandwidth {r['bandwidth'] / 1e9:.2f} GB/s -> bound {r['bound']:.1f} tokens/s",
             "(each row's bound: its own weight bytes + the KV cache, over that bandwidth)",
             "", f"{'':16s} {'weights MB':>10s} {'tokens/s':>9s} {'of bound':>9s} {'vs torch':>9s} "
             f"{'vs preln':>9s} | {'CPU tok/s':>9s} {'of bound':>9s} {'vs torch':>9s} {'vs preln':>9s}"]
    rows = r["rows"]
    for name, row in rows.items():
        cols = []
        for key, frac in (("tok_s", "bound_frac"), ("cpu_tok_s", "cpu_bound_frac")):
            ref = rows.get("torch eager", {}).get(key)
            ratio = f"{row[key] / ref:8.2f}x" if ref else "      n/a"
            cols.append(f"{row[key]:9.2f} {100 * row[frac]:8.1f}% {ratio} {row[key] / rows['preln'][key]:8.2f}x")
        lines.append(f"{name:16s} {row['weight_bytes'] / 1e6:10.1f} {cols[0]} | {cols[1]}")
    if r["why"]:
        lines.append(r["why"])
    if "llama.cpp Q4_1" not in r["rows"]:
        lines.append("llama.cpp not measured: llama_cpp is not importable (never a dependency)")
    if not r["why"] and not r["same_tokens"]:
        lines.append("note: the greedy tokens differ (float32 round-off between the two)")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m preln.gguf.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens before the decode")
    ap.add_argument("--new", type=int, default=32, help="tokens decoded per round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    args = ap.parse_args(argv)
    print(report(run(args.prompt, args.new, args.rounds)))


if __name__ == "__main__":
    main()
