"""Weight-only quantisation of a language model: every linear layer of every block stored in groups
of ``bits``-bit codes (:mod:`preln.quant.groups`), chosen by round to nearest, GPTQ or AWQ, with
one function for every model family::

    from preln.quant.weight_only import quantize_model
    qlm = quantize_model(lm, "gptq", bits=4, group_size=32, calib=ids)
    qlm(ids); qlm.generate(prompt, 16); qlm.weight_nbytes()

Both families are quantised the same way: the model's own block with its linears swapped, through
the block's ``linear(name)`` hook, for a :class:`QuantLinear` -- a float32 scale and an integer
zero point (one byte) per group. ``lm`` a :class:`preln.models.lm.TinyLM` -> :class:`WeightOnlyLM`
of :class:`WeightOnlyBlock` s: a block's four linears quantised (each with its float32 bias);
embeddings, head and LayerNorms float32. ``lm`` a :class:`preln.models.llama_lm.LlamaLM` (e.g.
SmolLM2 from its GGUF file) -> :class:`WeightOnlyLlama` of :class:`WeightOnlyLlamaBlock` s: every
linear of every block (q, k, v, o, gate, up, down) and, with ``head=True``, the LM head (tied to
the embedding in SmolLM2: the embedding's lookup then dequantises its rows from the same codes)
quantised; RMSNorm gains stay float32.
:func:`preln.quant.groups.rtn`, :func:`preln.quant.gptq.gptq` or :func:`preln.quant.awq.awq`
choose the codes of each matrix (:func:`quantize_tensor`).

Why a quantised Llama decodes faster: at batch 1 a decode step is one matrix-vector product per
weight matrix, and a matvec reads every weight once for two flops -- its time is the bytes of the
weights over the memory bandwidth. Codes of <= 4 bits are packed two per byte and 5..8-bit codes
take a byte, so a step reads ~6x or ~3.5x fewer weight bytes than float32 (4 + 40/32 or 8 + 40/32
bits a weight at groups of 32); the fused numba kernels of :mod:`preln.quant.qmatvec` dequantise
them as they are read (no float copy of a matrix is made), from its row-tiled layout
(:class:`preln.quant.qmatvec.TiledQuant`), in which the kernels' inner loop is whole vector
instructions -- so that they keep up with memory, and fewer bytes do mean less time. Inputs of
more than :data:`MATVEC_ROWS` rows (a prefill, a forward) are compute-bound instead: there each
matrix is dequantised on the fly to float32 and multiplied by BLAS.

Calibration (GPTQ, AWQ) is "true sequential" in both families: each linear layer's inputs are
those of a forward in which every earlier layer (and every earlier linear of its own block) is
already quantised. AWQ's input scales are kept explicit (x / s before the product); for the
TinyLM's q, k, v projection its search judges the output of the block's own attention sublayer
(llm-awq's module2inspect), else each linear's own output.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from preln.models.lm import TinyLM
from preln.models.llama_lm import LlamaLM
from preln.nn.block import LINEAR_PARAMS, TransformerBlock
from preln.nn.llama import LlamaBlock
from preln.ops import rms_norm_forward
from preln.quant.awq import awq
from preln.quant.gptq import gptq
from preln.quant.groups import MAX_BITS, group_size_of, rtn
from preln.quant.qmatvec import TiledQuant
from preln.validation import check_bits, check_choice, check_token_ids

__all__ = ["METHODS", "MATVEC_ROWS", "LINEARS", "QuantLinear", "WeightOnlyLlamaBlock", "WeightOnlyLlama",
           "WeightOnlyBlock", "WeightOnlyLM", "check_quantize_args", "quantize_tensor", "quantize_model"]

#: the methods of :func:`quantize_model`
METHODS = ("rtn", "gptq", "awq")


# ---- the quantised linear and the quantised blocks ----------------------------------------------
#: inputs of at most this many rows run the fused dequantise-matvec kernel (one pass over the codes
#: for all rows); larger ones dequantise the matrix and call BLAS (the kernel's arithmetic grows
#: with the rows, BLAS's per weight falls)
MATVEC_ROWS = 4

#: the quantised linears of a block, in transformers' names, grouped by the input they read
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class QuantLinear:
    """y = (x / s) W^^T + b with W^ = S (q - Z) in groups of ``group_size`` input columns (s = 1
    unless AWQ; b: the layer's float32 bias, or None), stored as a
    :class:`preln.quant.qmatvec.TiledQuant`: codes packed two per byte (bits <= 4) or one per byte
    (5..8 bits), float32 S, one-byte integer Z, in the row tiles of the decode kernels."""

    def __init__(self, gq, in_scale=None, bias=None):
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
        self.bias = None if bias is None else np.asarray(bias, np.float32)               # (M,)

    @property
    def scale(self):  # (M, G) float32
        return self.tiled.scale

    @property
    def zero(self):  # (M, G) float32, the unsigned codes' zero points
        return self.tiled.zero

    @property
    def nbytes(self):
        """Bytes a product reads: the codes, the float32 scales and one-byte zero points, AWQ's input
        scales, the bias."""
        return int(self.tiled.nbytes + sum(a.nbytes for a in (self.in_scale, self.bias) if a is not None))

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
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], M)


class _QuantBlock:
    """What a weight-only quantised block adds to its family's float block: float32, inference
    only, its linears ``self.linears`` ({name: :class:`QuantLinear`}) swapped in through the
    family's ``linear(name)`` hook; ``params`` holds the norms only (no weight is drawn)."""

    init_of = staticmethod(lambda config, rng, dtype: {})     # the weights are the QuantLinears

    def __init__(self, config, linears, norms, attention="auto"):
        super().__init__(config, dtype=np.float32, attention=attention)
        self.params = {k: np.asarray(v, np.float32) for k, v in norms.items()}
        self.grads, self.linears = {}, dict(linears)
        self.eval()

    def linear(self, name, bias=True):  # -> h (B, S, in) -> ((B, S, out) float32, None: no backward)
        """The block's linear ``name``, swapped for its :class:`QuantLinear` (which holds the bias)."""
        if not bias:        # a fused kernel or a shard's sum would add it again
            raise ValueError(f"bias: a quantised {name} adds its own bias; got bias=False")
        q = self.linears[name]
        return lambda h: (q(h), None)

    def backward(self, dy):
        raise RuntimeError("backward: a weight-only quantised block is inference-only")

    def weight_nbytes(self):
        """Bytes stored: the QuantLinears' and the float32 norms'."""
        return sum(l.nbytes for l in self.linears.values()) + sum(v.nbytes for v in self.params.values())


class WeightOnlyLlamaBlock(_QuantBlock, LlamaBlock):
    """A float32 inference-only :class:`preln.LlamaBlock` whose seven linears are
    :class:`QuantLinear` s (``self.linears``); ``params`` holds the two RMSNorm gains only."""

    def fuses(self):
        return True                         # float32, safe policy: the fused kernels always apply

    def float_params(self):
        """The block's parameters with every linear dequantised (its effective float32 weight)."""
        out = dict(self.params)
        out.update({f"{n}.weight": l.dequantize() for n, l in self.linears.items()})
        return out


class WeightOnlyBlock(_QuantBlock, TransformerBlock):
    """A float32 inference-only :class:`preln.TransformerBlock` whose four linears are
    :class:`QuantLinear` s with their biases (``self.linears``); ``params`` holds the LayerNorms."""

    def fuses(self):
        return False    # the fused kernels add a bias from params: here each QuantLinear adds its own
class WeightOnlyLlama(LlamaLM):
    """A :class:`preln.models.llama_lm.LlamaLM` of :class:`WeightOnlyLlamaBlock` s (made by
    :func:`quantize_model`): the same ``forward``/``__call__``, ``kv_cache``, ``decode``,
    ``generate``, ``chat``, ``tokenizer``, with the embedding lookup and the head swapped for the
    quantised head's (``head``; None: float32); ``weight_nbytes()`` the bytes stored;
    ``dequantized()`` the float32 model of the same (dequantised) weights."""

    @classmethod
    def of(cls, lm, layers, head, method, bits, group_size, symmetric):
        own = {k: np.asarray(v, np.float32) for k, v in lm.own.items()}
        if lm.tied:
            own["lm_head.weight"] = own["model.embed_tokens.weight"]
        new = cls.from_parts(lm.config, layers, own, tokenizer=lm.tokenizer, metadata=lm.metadata,
                             context_length=lm.context_length, tensor_types=lm.tensor_types)
        new.head, new.tied_source = head, lm.tied
        new.method, new.bits, new.group_size, new.symmetric = method, bits, group_size, symmetric
        if head is not None:                # the float head (and a tied embedding) are not kept
            if lm.tied:
                del own["model.embed_tokens.weight"]
            del own["lm_head.weight"]
            new.own = own
        return new

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

    def embed(self, tokens, name="tokens"):  # (B, n) -> (B, n) float32, None: inference only
        tokens = check_token_ids(tokens, self.config.vocab_size, name)
        if "model.embed_tokens.weight" in self.own:
            return self.own["model.embed_tokens.weight"][tokens], None
        # the rows of the tied, quantised table
        return self.head.dequantize(tokens.reshape(-1)).reshape(*tokens.shape, -1), None

    def logits(self, h):  # (B, n, D) -> (B, n, V) float32, None: inference only
        if self.head is not None:
            return self.head(h), None
        return h @ self.own["lm_head.weight"].T, None

    def dequantized(self):
        """A float32 :class:`preln.models.llama_lm.LlamaLM` whose weights are this model's dequantised ones."""
        p = self.params
        layers = []
        for layer in self.layers:
            block = LlamaBlock(layer.config, dtype=np.float32, seed=0).eval()
            block.load_state_dict(layer.float_params())
            layers.append(block)
        own = {"model.embed_tokens.weight": p["model.embed_tokens.weight"],
               "model.norm.weight": p["model.norm.weight"], "lm_head.weight": p["lm_head.weight"]}
        if self.tied and self.head is None:
            own["lm_head.weight"] = own["model.embed_tokens.weight"]
        return LlamaLM.from_parts(self.config, layers, own, tokenizer=self.tokenizer, metadata=self.metadata,
                                  context_length=self.context_length, tensor_types=self.tensor_types)


class WeightOnlyLM(TinyLM):
    """A :class:`preln.models.lm.TinyLM` of :class:`WeightOnlyBlock` s (made by
    :func:`quantize_model`): the same ``forward``/``__call__``, ``kv_cache``, ``decode``,
    ``generate``; embeddings, LM head and the final LayerNorm float32."""

    def __init__(self, lm, blocks, method, bits, group_size, symmetric=False):
        super().__init__(lm.config, dtype=np.float32)   # a tiny float model, its weights replaced here
        self.own = {k: v.astype(np.float32) for k, v in lm.own.items()}
        self.stack.layers = list(blocks)
        self.stack.norm = {k: v.astype(np.float32) for k, v in lm.stack.norm.items()}
        self.own_grads, self.stack.norm_grads = {}, {}  # inference only
        self.method, self.bits, self.group_size, self.symmetric = method, bits, group_size, symmetric

    @property
    def blocks(self):
        return self.stack.layers

    def weight_nbytes(self):
        """Bytes of the blocks' linear layers: codes, scales and zero points, AWQ's input scales,
        the float32 biases (what the chapters compare with the layers in float32)."""
        return int(sum(l.nbytes for b in self.blocks for l in b.linears.values()))


def _attention_output(block, x):
    """in_proj's effective weight -> the output of ``block``'s own attention sublayer on in_proj's
    inputs x (B, S, D): what AWQ's search compares for the q, k, v projection (llm-awq's
    module2inspect). Sets the block's in_proj weight (the caller reloads its parameters)."""
    def output(w_eff):
        block.params["self_attn.in_proj_weight"] = w_eff
        return block.sublayers()[1](x).out                 # Attn(x), its last bias included
    return output


def check_quantize_args(method, bits, calib, options, caller):
    """The checks every weight-only quantiser makes -> bits: a method of METHODS, bits in range,
    no options for RTN, calibration ids for GPTQ and AWQ."""
    check_choice(method, METHODS, "method")
    bits = check_bits(bits, hi=MAX_BITS)
    if method == "rtn" and options:
        raise TypeError(f"{caller}: method 'rtn' takes no options; got {sorted(options)}")
    if method != "rtn" and calib is None:
        raise ValueError(f"calib: method {method!r} needs calibration token ids (B, S); got None")
    return bits


# ---- one matrix, one model ---------------------------------------------------------------------
def quantize_tensor(method, w, x, bits, group_size, symmetric=False, output=None, **options):
    """Quantise one weight ``w`` (M, K) by ``method`` on calibration inputs ``x`` (..., K; None for
    RTN) -> (GroupQuant, AWQ's input scales s (K,) or None). output: what AWQ's search judges
    (:func:`preln.quant.awq.awq`; None: the layer's own output)."""
    if method == "rtn":
        return rtn(w, bits, group_size, symmetric), None
    x = x.reshape(-1, x.shape[-1])
    if method == "gptq":
        return gptq(w, x, bits, group_size, symmetric, **options), None
    res = awq(w, x, bits, group_size, symmetric, output=output, **options)
    return res.quant, res.scale


class _Family(NamedTuple):
    """How :func:`quantize_model` walks one block family: ``stages``, the calibration forward's
    cache field holding each linear's input and the linears reading it, in the forward's order;
    ``weight(name)`` and ``bias(name)`` the parameter names of a linear (bias None: it has none);
    ``block`` the quantised block; ``output(block, name, x)`` what AWQ's search judges (None: the
    linear's own output)."""

    stages: tuple
    weight: object
    bias: object
    block: type
    output: object


_FAMILIES = {
    LlamaBlock: _Family(((lambda c: c.attn.q_proj.x, LINEARS[:3]), (lambda c: c.attn.o_proj.x, LINEARS[3:4]),
                         (lambda c: c.mlp.gate.x, LINEARS[4:6]), (lambda c: c.mlp.down.x, LINEARS[6:])),
                        lambda n: f"{n}.weight", lambda n: None, WeightOnlyLlamaBlock,
                        lambda block, n, x: None),
    TransformerBlock: _Family(((lambda c: c.attn.in_proj.x, ("in_proj",)), (lambda c: c.attn.out_proj.x, ("out_proj",)),
                               (lambda c: c.mlp.linear1.x, ("linear1",)), (lambda c: c.mlp.linear2.x, ("linear2",))),
                              lambda n: LINEAR_PARAMS[n][0], lambda n: LINEAR_PARAMS[n][1], WeightOnlyBlock,
                              lambda block, n, x: _attention_output(block, x) if n == "in_proj" else None),
}


def _quantize_blocks(layers, h, quantized):  # -> (quantised blocks, the last block's output or None)
    """Every linear of every block quantised by ``quantized(w, x, output, bias)``; with calibration
    inputs ``h`` (B, S, D) float64 (None: RTN), true sequential: each stage's inputs come from a
    float64 forward of the block whose earlier stages are already quantised."""
    out = []
    for layer in layers:
        fam = _FAMILIES[type(layer)]
        p64 = {k: v.astype(np.float64) for k, v in layer.params.items()}
        bias = lambda n: None if fam.bias(n) is None else p64[fam.bias(n)]
        linears = {}
        if h is None:
            linears = {n: quantized(p64[fam.weight(n)], None, None, bias(n)) for _, names in fam.stages for n in names}
        else:
            block = type(layer)(layer.config, dtype=np.float64, seed=0, attention=layer.attention).eval()
            for inputs, names in fam.stages:
                block.load_state_dict(p64)
                block.forward(h)
                x = inputs(block.cache)
                for n in names:
                    linears[n] = quantized(p64[fam.weight(n)], x, fam.output(block, n, x), bias(n))
                    p64[fam.weight(n)] = linears[n].dequantize().astype(np.float64)
            block.load_state_dict(p64)
            h = block.forward(h)
        swapped = {fam.weight(n) for n in linears} | {fam.bias(n) for n in linears}
        norms = {k: v for k, v in layer.params.items() if k not in swapped}
        out.append(fam.block(layer.config, linears, norms, attention=layer.attention))
    return out, h


def _check_grid(K_all, bits, group_size):
    """The tiled kernels' grid: bits 2..8, a group size dividing every K, even when packed."""
    if bits < 2:
        raise ValueError(f"bits: expected 2..{MAX_BITS} (a zero point and at least 4 levels); got {bits}")
    for K in sorted(set(K_all)):          # every K, checked before any work
        group_size_of(K, group_size)
    if group_size is not None and group_size % 2 and bits <= 4:
        raise ValueError(f"group_size: expected an even group size for {bits}-bit codes packed two per "
                         f"byte; got {group_size}")


def quantize_model(lm, method="rtn", bits=4, group_size=None, calib=None, symmetric=False, head=None, **options):
    """A weight-only quantised copy of a language model (module docstring).

    lm: a :class:`preln.models.lm.TinyLM` -> :class:`WeightOnlyLM`, or a float
    :class:`preln.models.llama_lm.LlamaLM` -> :class:`WeightOnlyLlama`. method: "rtn", "gptq" or
    "awq". bits: 2..8 (<= 4 packed two codes per byte). group_size: input columns per group, even
    below 5 bits, dividing every matrix's K, or None (one group per output row).
    calib: (B, S) token ids, needed by GPTQ and AWQ. head: quantise the LM head too -- a Llama's
    (None: yes; a tied embedding then reads its rows from the head's codes); a TinyLM's head stays
    float32 (None or False). options: GPTQ's ``block_size`` and ``damp``, AWQ's ``n_grid``.
    """
    bits = check_quantize_args(method, bits, calib, options, "quantize_model")
    llama = isinstance(lm, LlamaLM) and not isinstance(lm, WeightOnlyLlama)
    if not (llama or isinstance(lm, TinyLM) and not isinstance(lm, WeightOnlyLM)):
        raise TypeError(f"lm: expected a preln.models.lm.TinyLM or a float preln.models.llama_lm.LlamaLM; "
                        f"got {type(lm).__name__}")
    if not llama and head:
        raise ValueError(f"head: a TinyLM's head stays float32 (expected None or False); got {head!r}")
    _check_grid((lm.config.d_model, lm.config.d_ff), bits, group_size)

    def quantized(w, x, output=None, bias=None):
        gq, s = quantize_tensor(method, w, x, bits, group_size, symmetric, output, **options)
        return QuantLinear(gq, in_scale=s, bias=bias)

    h = None
    if method != "rtn":
        calib = check_token_ids(np.atleast_2d(np.asarray(calib)), lm.config.vocab_size, "calib")
        h = lm.io.embed(lm.own, calib, name="calib")[0].astype(np.float64)            # (B, S, D)
    layers, h = _quantize_blocks(lm.layers if llama else lm.stack.layers, h, quantized)
    if not llama:
        return WeightOnlyLM(lm, layers, method, bits, group_size, bool(symmetric))
    q_head = None
    if head is None or head:
        x = None if h is None else rms_norm_forward(h, lm.own["model.norm.weight"].astype(np.float64), lm.config.eps)[0]
        q_head = quantized(lm.own["lm_head.weight"], x)
    return WeightOnlyLlama.of(lm, layers, q_head, method, bits, group_size, bool(symmetric))
