"""A whole model's generation, op by op: published model shapes, prefill and decode steps on the
roofline, and measured generation times.

    llama = PUBLISHED_MODELS["Llama 3 8B"]               # grouped-query attention, 8 KV heads
    step_ops(llama, batch=16, new=1, context=4096)       # one decode step's ops, one layer
    predict_generation(llama, PUBLISHED["H100 SXM"], batch=1, prompt=512, n_new=128)

:func:`step_ops` splits a forward step of a :class:`ModelShape` (published configurations in
:data:`PUBLISHED_MODELS`) into its ops, for a prefill (all prompt positions at once) or a decode
step (one position per sequence): the per-op roofline. :func:`step_time` sums the ops' roofline
bounds, :func:`predict_generation` turns them into time to first token (TTFT) and time per output
token (TPOT), :func:`compute_bound_batch` finds the batch at which an op crosses a ridge point, and
:func:`time_generation` measures TTFT and TPOT of a :class:`preln.models.lm.TinyLM` on this machine.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from preln.chapters.inference.decode import kv_cache_bytes, weight_bytes_per_value
from preln.chapters.inference.roofline import OpTraffic, Roofline
from preln.validation import nonnegative_int, positive_int

__all__ = ["ModelShape", "PUBLISHED_MODELS", "model_shape", "step_ops", "head_ops", "step_time",
           "GenerationTimes", "predict_generation", "compute_bound_batch", "GenerationTiming",
           "time_generation", "time_decode"]

class ModelShape(NamedTuple):
    """A decoder-only language model's shape, as its paper or released configuration gives it.

    Biases and normalisation parameters are left out of every count below (a few D per layer), and
    so are learned position embeddings (OPT's: 2048 x D, 0.1 % of OPT-13B)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int       # = n_heads: multi-head; 1: multi-query; in between: grouped-query attention
    d_ff: int
    vocab_size: int
    gated: bool           # True: a gated MLP (SwiGLU: gate, up, down, three D x F matrices)
    max_context: int      # positions the model was trained for
    source: str = ""      # a citation key of book/references.bib
    tied_embeddings: bool = False   # True: the LM head is the token embedding (OPT), one V x D matrix

    d_head = property(lambda self: self.d_model // self.n_heads, doc="The width of one head.")
    group = property(lambda self: self.n_heads // self.n_kv_heads,
                     doc="Query heads per key/value head: 1 for multi-head attention.")

    def layer_matrix_params(self):
        """Weights of one layer's matrices: q and out (D x D), k and v (n_kv d_h x D), the MLP."""
        D = self.d_model
        return 2 * D * D + 2 * D * self.n_kv_heads * self.d_head + (3 if self.gated else 2) * D * self.d_ff

    def weight_params(self):
        """Every matrix weight: n_layers blocks, the token embedding and the LM head (V x D each, or
        one matrix for both when they are tied)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.d_model
        return self.n_layers * self.layer_matrix_params() + embeddings

    def kv_bytes_per_token(self, itemsize=2):
        """2 n_layers n_kv d_h itemsize: one position's keys and values in every layer."""
        return kv_cache_bytes(self.n_layers, 1, 1, self.d_model, itemsize, self.n_heads,
                              self.n_kv_heads)


#: Published configurations. OPT-13B: Zhang et al. 2022, Table 1 (ReLU MLP of 4D; the vocabulary,
#: context and tied embedding and head from the released configuration). Llama 2 7B: Touvron et al. 2023 (multi-head
#: attention; F = 11,008, vocabulary 32,000 from the released configuration). Llama 3 8B:
#: Grattafiori et al. 2024, Table 3 (8 key/value heads, F = 14,336, vocabulary 128,256).
PUBLISHED_MODELS = {
    "OPT-13B": ModelShape("OPT-13B", 40, 5120, 40, 40, 20480, 50272, False, 2048, "zhang2022opt",
                          tied_embeddings=True),
    "Llama 2 7B": ModelShape("Llama 2 7B", 32, 4096, 32, 32, 11008, 32000, True, 4096,
                             "touvron2023llama2"),
    "Llama 3 8B": ModelShape("Llama 3 8B", 32, 4096, 32, 8, 14336, 128256, True, 8192,
                             "grattafiori2024llama3"),
}


def model_shape(lm, name="reference LM"):
    """The :class:`ModelShape` of a :class:`preln.models.lm.TinyLM` (or its :class:`preln.models.lm.LMConfig`):
    multi-head attention, an ungated MLP."""
    from preln.models.lm import LMConfig, TinyLM
    cfg = lm.config if isinstance(lm, TinyLM) else lm
    if not isinstance(cfg, LMConfig):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM or LMConfig; got {type(lm).__name__}")
    return ModelShape(name, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_heads, cfg.d_ff,
                      cfg.vocab_size, False, cfg.max_len, "")


def _check_model(model):
    if not isinstance(model, ModelShape):
        raise TypeError(f"model: expected a preln.chapters.inference.ModelShape (see PUBLISHED_MODELS, "
                        f"model_shape); got {type(model).__name__}")


def step_ops(model, batch, new=1, context=0, itemsize=2, weight_bits=None, group_size=None):
    """Per-op FLOPs and bytes of ONE layer's forward over ``new`` positions of each of ``batch``
    sequences, which attend causally to ``context`` cached positions and to themselves.

    A prefill is ``new`` = the prompt's length, ``context`` = 0; a decode step is ``new`` = 1,
    ``context`` = the positions generated so far. Every op is one kernel that reads its inputs and
    writes its outputs once (the fused schedule of a GPU, not numpy's pass per operation):

    norm1, norm2     read and write N D (N = batch * new rows); 7 FLOPs per element, 5 per row
    qkv_proj         x (N, D) @ W^T, W ((D + 2 n_kv d_h), D): its output holds q and the new K, V
    attention        one fused kernel (FlashAttention or Flash-Decoding): reads q and the cached K
                     and V of every position (context + new, per sequence and KV head) once, writes
                     o; 4 d_h + 5 FLOPs per (query head, key) pair, causal pairs only
    out_proj         o (N, D) @ W^T, W (D, D)
    residual1, 2     read 2 N D, write N D
    linear1, linear2 (ungated) D -> F, F -> D with the activation between (read and write N F)
    gate_up, down    (gated) D -> 2F (gate and up in one product), F -> D; swiglu between them
                     reads 2 N F and writes N F

    Weights are read at ``weight_bits`` bits (None: 8 itemsize), activations and the KV cache at
    ``itemsize`` bytes. Returns a list of :class:`OpTraffic` (``matmul`` marks the contractions).
    """
    _check_model(model)
    batch, new = positive_int(batch, "batch"), positive_int(new, "new")
    context = nonnegative_int(context, "context")
    itemsize = positive_int(itemsize, "itemsize")
    s = itemsize
    w = weight_bytes_per_value(8 * s if weight_bits is None else weight_bits, group_size)
    D, H, kv, dh, F = model.d_model, model.n_heads, model.n_kv_heads, model.d_head, model.d_ff
    N, T = batch * new, context + new
    pairs = batch * (new * context + new * (new + 1) // 2)        # causal (query, key) pairs per head
    ops = []

    def add(name, flops, read, written, matmul=False):        # bytes
        ops.append(OpTraffic(name, int(flops), int(round(read)), int(round(written)), matmul))

    def matmul(name, k_in, n_out):
        add(name, 2 * N * k_in * n_out, k_in * n_out * w + N * k_in * s, N * n_out * s, True)

    def norm(name):
        add(name, 7 * N * D + 5 * N, N * D * s, N * D * s)

    norm("norm1")
    matmul("qkv_proj", D, D + 2 * kv * dh)
    add("attention", H * pairs * (4 * dh + 5), N * D * s + 2 * batch * kv * T * dh * s, N * D * s,
        True)
    matmul("out_proj", D, D)
    add("residual1", N * D, 2 * N * D * s, N * D * s)
    norm("norm2")
    if model.gated:
        matmul("gate_up", D, 2 * F)
        add("swiglu", 5 * N * F, 2 * N * F * s, N * F * s)
        matmul("down", F, D)
    else:
        matmul("linear1", D, F)
        add("activation", 5 * N * F, N * F * s, N * F * s)
        matmul("linear2", F, D)
    add("residual2", N * D, 2 * N * D * s, N * D * s)
    return ops


def head_ops(model, batch, itemsize=2, weight_bits=None, group_size=None):
    """The final LayerNorm and the LM head (D -> vocabulary) on one position per sequence: the
    only logits that generation needs, after a prefill as after a decode step."""
    _check_model(model)
    batch, s = positive_int(batch, "batch"), positive_int(itemsize, "itemsize")
    w = weight_bytes_per_value(8 * s if weight_bits is None else weight_bits, group_size)
    D, V = model.d_model, model.vocab_size
    return [OpTraffic("final norm", 7 * batch * D + 5 * batch, batch * D * s, batch * D * s, False),
            OpTraffic("lm_head", 2 * batch * D * V, int(round(D * V * w + batch * D * s)),
                      batch * V * s, True)]


def step_time(model, roof, batch, new=1, context=0, itemsize=2, weight_bits=None, group_size=None):
    """The roofline's lower bound on one forward step of the whole model (seconds): the sum over
    ops of max(FLOPs / peak, bytes / bandwidth) -- every layer's ops, then the head. Time is a sum
    over ops: an op left of the ridge costs its bytes even when the step's total intensity is high."""
    if not isinstance(roof, Roofline):
        raise TypeError(f"roof: expected a preln.chapters.inference.Roofline; got {type(roof).__name__}")
    layer = sum(float(roof.time(o.flops, o.nbytes))
                for o in step_ops(model, batch, new, context, itemsize, weight_bits, group_size))
    head = sum(float(roof.time(o.flops, o.nbytes))
               for o in head_ops(model, batch, itemsize, weight_bits, group_size))
    return model.n_layers * layer + head


class GenerationTimes(NamedTuple):
    """Time to first token (the prefill and its logits) and time per output token (decode steps)."""

    ttft: float           # seconds
    tpot: float           # seconds, mean over the decode steps


def predict_generation(model, roof, batch, prompt, n_new, itemsize=2, weight_bits=None,
                       group_size=None):
    """The roofline's prediction of TTFT and TPOT for ``batch`` prompts of ``prompt`` tokens each
    and ``n_new`` generated tokens: the first token comes from the prefill, token t > 1 from a
    decode step whose context holds prompt + t - 2 positions."""
    prompt, n_new = positive_int(prompt, "prompt"), positive_int(n_new, "n_new")
    ttft = step_time(model, roof, batch, prompt, 0, itemsize, weight_bits, group_size)
    steps = [step_time(model, roof, batch, 1, prompt + t, itemsize, weight_bits, group_size)
             for t in range(n_new - 1)]
    return GenerationTimes(ttft, float(np.mean(steps)) if steps else math.nan)


def compute_bound_batch(model, roof, op, context, itemsize=2, weight_bits=None, group_size=None,
                        max_batch=2**20):
    """The smallest batch at which decode op ``op`` (a name of :func:`step_ops`) reaches the ridge
    point of ``roof``, or None if it stays memory-bound up to ``max_batch``. A weight matmul's
    intensity grows with the batch (2 B k n / (k n w + B (k + n) s)); attention's and the
    elementwise ops' do not depend on it."""
    def intensity(b):
        ops = {o.name: o for o in step_ops(model, b, 1, context, itemsize, weight_bits, group_size)}
        if op not in ops:
            raise ValueError(f"op: expected one of {list(ops)}; got {op!r}")
        return ops[op].intensity

    if intensity(max_batch) < roof.ridge:
        return None
    lo, hi = 1, max_batch                      # intensity(hi) >= ridge; it grows with the batch
    if intensity(lo) >= roof.ridge:
        return 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if intensity(mid) >= roof.ridge else (mid, hi)
    return hi


class GenerationTiming(NamedTuple):
    """Measured generation: time to first token and the time of each decode step (CPU seconds)."""

    ttft: float                 # best over repeats: prefill + first token
    tpot: np.ndarray            # (n_new - 1,) best over repeats, one per decode step

    @property
    def mean_tpot(self):
        return float(np.mean(self.tpot))


def time_generation(lm, prompt_ids, n_new, repeats=5, clock=time.process_time):
    """Measure greedy generation with a :class:`preln.models.lm.TinyLM` and its KV cache.

    prompt_ids: (B, S0) ints. Each repeat makes a fresh cache, times the prefill with the first
    token (TTFT) and then each of the n_new - 1 decode steps (TPOT); prefill and decode steps
    alternate in every repeat, so a slow spell of a shared machine slows both. The best time of
    each is kept. CPU time by default: time the process spends descheduled does not count.
    """
    from preln.models.lm import TinyLM
    if not isinstance(lm, TinyLM):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM; got {type(lm).__name__}")
    ids = np.asarray(prompt_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt_ids: expected a (B, S0) integer array; got shape {ids.shape}")
    n_new = positive_int(n_new, "n_new")
    B, S0 = ids.shape
    best_ttft, best_tpot = math.inf, np.full(n_new - 1, math.inf)
    lm.eval()
    for r in range(positive_int(repeats, "repeats") + 1):       # round 0 warms up
        kv = lm.kv_cache(B, S0 + n_new)
        t0 = clock()
        tok = lm.decode(ids, kv)[:, -1].argmax(axis=-1)[:, None]          # (B, 1)
        ttft = clock() - t0
        tpot = np.empty(n_new - 1)
        for t in range(n_new - 1):
            t0 = clock()
            tok = lm.decode(tok, kv)[:, -1].argmax(axis=-1)[:, None]
            tpot[t] = clock() - t0
        if r > 0:
            best_ttft = min(best_ttft, ttft)
            best_tpot = np.minimum(best_tpot, tpot)
    return GenerationTiming(best_ttft, best_tpot)


def time_decode(step, n_tokens, repeats=3, clock=time.process_time):
    """Best CPU seconds per call of ``step(t)`` for t in range(n_tokens), as an array (n_tokens,).

    ``step(t)`` does the work of generating token t; repeats run the whole sequence again (the
    caller's step resets its state at t = 0) and the best time of each t is kept.
    """
    best = np.full(n_tokens, np.inf)
    for _ in range(repeats):
        for t in range(n_tokens):
            t0 = clock()
            step(t)
            best[t] = min(best[t], clock() - t0)
    return best
