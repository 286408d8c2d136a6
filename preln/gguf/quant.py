"""A GGUF Llama LM quantised weight-only (RTN, GPTQ or AWQ), decoding from its codes.

    import preln.gguf as gg
    lm = gg.load(gg.smollm2_path())
    qlm = gg.quantize(lm, "gptq", bits=4, group_size=32, calib=ids)   # -> WeightOnlyLlama
    qlm.generate(prompt, 16); qlm.weight_nbytes()

Every linear layer of every block (q, k, v, o, gate, up, down) and, with ``head=True``, the LM head
(tied to the embedding in SmolLM2: the embedding's lookup then dequantises its rows from the same
codes) is stored in groups of ``bits``-bit codes with a float32 scale and an integer zero point (one byte)
per group (:mod:`preln.quant.groups`; the codes chosen by :func:`preln.quant.groups.rtn`,
:func:`preln.quant.gptq.gptq` or :func:`preln.quant.awq.awq`). RMSNorm gains stay float32.

Why decode gets faster: at batch 1 a decode step is one matrix-vector product per weight matrix,
and a matvec reads every weight once for two flops -- its time is the bytes of the weights over
the memory bandwidth. Codes of <= 4 bits are packed two per byte and 5..8-bit codes take a byte, so
a step reads ~6x or ~3.5x fewer weight bytes than float32 (4 + 40/32 or 8 + 40/32 bits a weight
at groups of 32); the fused numba kernels of :mod:`preln.quant.qmatvec` dequantise them as they
are read (no float copy of a matrix is made), from its row-tiled layout
(:class:`preln.quant.qmatvec.TiledQuant`), in which the kernels' inner loop is whole vector
instructions -- so that they keep up with memory, and fewer bytes do mean less time. Inputs of
more than :data:`MATVEC_ROWS` rows (a prefill, a forward) are compute-bound instead: there each
matrix is dequantised on the fly to float32 and multiplied by BLAS.

Calibration (GPTQ, AWQ) is "true sequential": each linear layer's inputs are those of a float64
forward in which every earlier layer (and every earlier linear of its own block) is already
quantised. AWQ scales each linear's input channels by its own search on its own output; its
input scales are kept explicit (x / s before the kernel: K divisions per step).
"""
import copy

import numpy as np

from preln.gguf.model import GGUFLlama
from preln.nn.llama import LlamaBlock
from preln.nn.stack import StackKVCache
from preln.ops import rms_norm_forward
from preln.quant.awq import awq
from preln.quant.gptq import gptq
from preln.quant.groups import MAX_BITS, group_size_of, rtn
from preln.quant.qmatvec import TiledQuant
from preln.quant.weight_only import METHODS, check_quantize_args
from preln.validation import check_token_ids

__all__ = ["METHODS", "MATVEC_ROWS", "LINEARS", "QuantLinear", "WeightOnlyLlamaBlock", "WeightOnlyLlama",
           "quantize"]

#: inputs of at most this many rows run the fused dequantise-matvec kernel (one pass over the codes
#: for all rows); larger ones dequantise the matrix and call BLAS (the kernel's arithmetic grows
#: with the rows, BLAS's per weight falls)
MATVEC_ROWS = 4

#: the quantised linears of a block, in transformers' names, grouped by the input they read
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class QuantLinear:
    """y = (x / s) W^^T with W^ = S (q - Z) in groups of ``group_size`` input columns (s = 1 unless
    AWQ), stored as a :class:`preln.quant.qmatvec.TiledQuant`: codes packed two per byte (bits <= 4)
    or one per byte (5..8 bits), float32 S, one-byte integer Z, in the row tiles of the decode
    kernels."""

    def __init__(self, gq, in_scale=None):
        M, K = gq.q.shape
        q = gq.q.astype(np.int64)
        zero = gq.zero
        if gq.symmetric:        # codes in [-(2^(b-1) - 1), 2^(b-1) - 1]: shift them to unsigned
            q = q + 2 ** (gq.bits - 1)
            zero = zero + 2 ** (gq.bits - 1)
        self.bits, self.group_size, self.symmetric = gq.bits, gq.group_size, gq.symmetric
        self.shape = (M, K)
        self.packed = gq.bits <= 4
        self.tiled = TiledQuant(q, np.asarray(gq.scale, np.float32), zero, gq.bits, gq.group_size)
        self.in_scale = None if in_scale is None else np.asarray(in_scale, np.float32)   # (K,)

    @property
    def scale(self):  # (M, G) float32
        return self.tiled.scale

    @property
    def zero(self):  # (M, G) float32, the unsigned codes' zero points
        return self.tiled.zero

    @property
    def nbytes(self):
        """Bytes a product reads: the codes, the float32 scales and one-byte zero points, AWQ's input
        scales."""
        extra = 0 if self.in_scale is None else self.in_scale.nbytes
        return int(self.tiled.nbytes + extra)

    def dequantize_rows(self, rows=None):  # -> (len(rows) | M, K) float32 W^ (AWQ's 1 / s not applied)
        return self.tiled.dequantize(rows)

    def dequantize(self, rows=None):  # -> (M, K) float32: the effective weight, x W_eff^T = (x / s) W^^T
        w = self.dequantize_rows(rows)
        return w if self.in_scale is None else w / self.in_scale

    def __call__(self, x):  # (..., K) -> (..., M) float32
        x = np.asarray(x, np.float32)
        M, K = self.shape
        x2 = x.reshape(-1, K)
        if self.in_scale is not None:
            x2 = x2 / self.in_scale
        if x2.shape[0] > MATVEC_ROWS:                   # compute-bound: dequantise, then BLAS
            y = x2 @ self.tiled.dequantize_t()
        else:                                           # memory-bound: one pass over the codes
            y = self.tiled.matmul(x2)
        return y.reshape(*x.shape[:-1], M)


class WeightOnlyLlamaBlock(LlamaBlock):
    """A float32 inference-only :class:`preln.LlamaBlock` whose seven linears are
    :class:`QuantLinear` s (``self.linears``); ``params`` holds the two RMSNorm gains only."""

    @classmethod
    def from_block(cls, block, linears):
        new = copy.copy(block)              # the config and settings, no weights copied
        new.__class__ = cls
        new.dtype = np.dtype(np.float32)
        new.params = {k: v.astype(np.float32) for k, v in block.params.items() if k.endswith("layernorm.weight")}
        new.grads, new._cache, new.linears = {}, None, dict(linears)
        return new.eval()

    def fuses(self):
        return True                         # float32, safe policy: the fused kernels always apply

    def linear(self, name):  # -> h (B, S, in) -> ((B, S, out) float32, None: no backward)
        """The block's linear ``name``, swapped for its :class:`QuantLinear`."""
        q = self.linears[name]
        return lambda h: (q(h), None)

    def backward(self, dy):
        raise RuntimeError("backward: a weight-only quantised block is inference-only")

    def weight_nbytes(self):
        return sum(l.nbytes for l in self.linears.values()) + sum(v.nbytes for v in self.params.values())

    def float_params(self):
        """The block's parameters with every linear dequantised (its effective float32 weight)."""
        out = dict(self.params)
        out.update({f"{n}.weight": l.dequantize() for n, l in self.linears.items()})
        return out


class WeightOnlyLlama(GGUFLlama):
    """A :class:`preln.gguf.GGUFLlama` of :class:`WeightOnlyLlamaBlock` s (made by :func:`quantize`):
    the same ``forward``/``__call__``, ``kv_cache``, ``decode``, ``generate``, ``chat``,
    ``tokenizer``; ``weight_nbytes()`` the bytes stored; ``dequantized()`` the float32 model of the
    same (dequantised) weights; ``head`` the quantised LM head (None: float32)."""

    def __init__(self, lm, layers, head, method, bits, group_size, symmetric):
        own = {k: np.asarray(v, np.float32) for k, v in lm.own.items()}
        if lm.tied:
            own["lm_head.weight"] = own["model.embed_tokens.weight"]
        super().__init__(lm.config, layers, own, lm.tokenizer, lm.metadata, lm.context_length, lm.tensor_types)
        self.head, self.tied_source = head, lm.tied
        self.method, self.bits, self.group_size, self.symmetric = method, bits, group_size, symmetric
        if head is not None:                # the float head (and a tied embedding) are not kept
            if lm.tied:
                del own["model.embed_tokens.weight"]
            del own["lm_head.weight"]

    @property
    def head_quantized(self):
        return self.head is not None

    @property
    def tied(self):
        return self.tied_source

    @property
    def params(self):
        """Every parameter as its effective float32 value (the linears and head dequantised)."""
        out = {"model.embed_tokens.weight": self.embedding_table()}
        for i, layer in enumerate(self.layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in layer.float_params().items()})
        out["model.norm.weight"] = self.own["model.norm.weight"]
        out["lm_head.weight"] = (self.head.dequantize() if self.head is not None else self.own["lm_head.weight"])
        if self.tied and self.head is None:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out

    def embedding_table(self):
        if "model.embed_tokens.weight" in self.own:
            return self.own["model.embed_tokens.weight"]
        return self.head.dequantize()                   # tied and quantised: the head's codes

    def num_params(self):
        cfg = self.config
        n = sum(int(np.prod(l.shape)) for layer in self.layers for l in layer.linears.values())
        n += sum(v.size for layer in self.layers for v in layer.params.values()) + cfg.d_model
        return int(n + cfg.vocab_size * cfg.d_model * (1 if self.tied else 2))

    def weight_nbytes(self):
        """Bytes stored: codes, scales and zero points of the quantised matrices (AWQ's input
        scales too), the float32 gains, embedding and head that are not quantised."""
        n = sum(layer.weight_nbytes() for layer in self.layers)
        n += sum(v.nbytes for k, v in self.own.items() if not (k == "lm_head.weight" and self.tied
                                                                 and "model.embed_tokens.weight" in self.own))
        return int(n + (0 if self.head is None else self.head.nbytes))

    def decode(self, ids_new, kv):
        """ids_new (B, n) -> logits (B, n, V), float32; the cache grows by n."""
        ids_new = check_token_ids(ids_new, self.config.vocab_size, "ids_new")
        if not isinstance(kv, StackKVCache) or len(kv.layers) != len(self.layers):
            raise TypeError(f"kv: expected the StackKVCache of lm.kv_cache(batch, max_len); got "
                            f"{type(kv).__name__}")
        if "model.embed_tokens.weight" in self.own:
            h = self.own["model.embed_tokens.weight"][ids_new]                        # (B, n, D)
        else:                                       # the rows of the tied, quantised table
            h = self.head.dequantize(ids_new.reshape(-1)).reshape(*ids_new.shape, -1)
        for layer, layer_kv in zip(self.layers, kv.layers):
            h = layer.decode(h, layer_kv)                                              # (B, n, D)
        h, _ = rms_norm_forward(h, self.own["model.norm.weight"], self.config.eps)
        if self.head is not None:
            return self.head(h)                                                        # (B, n, V)
        return h @ self.own["lm_head.weight"].T

    def dequantized(self):
        """A float32 :class:`preln.gguf.GGUFLlama` whose weights are this model's dequantised ones."""
        p = self.params
        layers = []
        for i, layer in enumerate(self.layers):
            block = LlamaBlock(layer.config, dtype=np.float32, seed=0).eval()
            block.load_state_dict(layer.float_params())
            layers.append(block)
        own = {"model.embed_tokens.weight": p["model.embed_tokens.weight"],
               "model.norm.weight": p["model.norm.weight"], "lm_head.weight": p["lm_head.weight"]}
        if self.tied and self.head is None:
            own["lm_head.weight"] = own["model.embed_tokens.weight"]
        return GGUFLlama(self.config, layers, own, self.tokenizer, self.metadata, self.context_length,
                         self.tensor_types)


def _quantize_one(method, w, x, bits, group_size, symmetric, options):  # -> QuantLinear
    if method == "rtn":
        return QuantLinear(rtn(w, bits, group_size, symmetric))
    x = x.reshape(-1, x.shape[-1])
    if method == "gptq":
        return QuantLinear(gptq(w, x, bits, group_size, symmetric, **options))
    res = awq(w, x, bits, group_size, symmetric, **options)
    return QuantLinear(res.quant, in_scale=res.scale)


#: the calibration forward's cache field holding each linear's input, and the linears reading it
_STAGES = ((lambda c: c.attn.q_proj.x, LINEARS[:3]), (lambda c: c.attn.o_proj.x, LINEARS[3:4]),
           (lambda c: c.mlp.gate.x, LINEARS[4:6]), (lambda c: c.mlp.down.x, LINEARS[6:]))


def quantize(lm, method="rtn", bits=4, group_size=32, calib=None, symmetric=False, head=True, **options):
    """A weight-only quantised copy of a GGUF Llama LM -> :class:`WeightOnlyLlama`.

    method: "rtn", "gptq" or "awq". bits: 2..8 (<= 4 packed two codes per byte). group_size: input
    columns per group, dividing every matrix's K (D and F), or None (one group per output row).
    calib: (B, S) token ids, needed by GPTQ and AWQ. head: quantise the LM head too (a tied
    embedding then reads its rows from the head's codes). options: GPTQ's ``block_size`` and
    ``damp``, AWQ's ``n_grid``.
    """
    if not isinstance(lm, GGUFLlama) or isinstance(lm, WeightOnlyLlama):
        raise TypeError(f"lm: expected a float preln.gguf.GGUFLlama (preln.gguf.load); got {type(lm).__name__}")
    bits = check_quantize_args(method, bits, calib, options, "quantize")
    if bits < 2:
        raise ValueError(f"bits: expected 2..{MAX_BITS} (a zero point and at least 4 levels); got {bits}")
    cfg = lm.config
    for K in sorted({cfg.d_model, cfg.d_ff}):          # every K, checked before any work
        group_size_of(K, group_size)
    if group_size is not None and group_size % 2 and bits <= 4:
        raise ValueError(f"group_size: expected an even group size for {bits}-bit codes packed two per "
                         f"byte; got {group_size}")
    h = None
    if method != "rtn":
        calib = check_token_ids(np.atleast_2d(np.asarray(calib)), lm.config.vocab_size, "calib")
        h = lm.own["model.embed_tokens.weight"][calib].astype(np.float64)              # (B, S, D)
    layers = []
    for layer in lm.layers:
        p64 = {k: v.astype(np.float64) for k, v in layer.params.items()}
        linears = {}
        if h is None:
            linears = {n: _quantize_one(method, p64[f"{n}.weight"], None, bits, group_size, symmetric, options)
                       for n in LINEARS}
        else:                  # true sequential: each stage's inputs from the quantised stages before
            block = LlamaBlock(layer.config, dtype=np.float64, seed=0).eval()
            for inputs, names in _STAGES:
                block.load_state_dict(p64)
                block.forward(h)
                x = inputs(block.cache)
                for n in names:
                    linears[n] = _quantize_one(method, p64[f"{n}.weight"], x, bits, group_size, symmetric, options)
                    p64[f"{n}.weight"] = linears[n].dequantize().astype(np.float64)
            block.load_state_dict(p64)
            h = block.forward(h)
        layers.append(WeightOnlyLlamaBlock.from_block(layer, linears))
    q_head = None
    if head:
        x = None if h is None else rms_norm_forward(h, lm.own["model.norm.weight"].astype(np.float64), cfg.eps)[0]
        q_head = _quantize_one(method, lm.own["lm_head.weight"], x, bits, group_size, symmetric, options)
    return WeightOnlyLlama(lm, layers, q_head, method, bits, group_size, bool(symmetric))
