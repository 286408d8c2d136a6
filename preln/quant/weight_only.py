"""Weight-only quantisation of a language model: every linear layer of every block stored in groups
of ``bits``-bit codes (:mod:`preln.quant.groups`), chosen by round to nearest, GPTQ or AWQ, with
one function for every model family::

    from preln.quant.weight_only import quantize_model
    qlm = quantize_model(lm, "gptq", bits=4, group_size=32, calib=ids)
    qlm(ids); qlm.generate(prompt, 16); qlm.weight_nbytes()

``lm`` a :class:`preln.models.lm.TinyLM` -> :class:`WeightOnlyLM`: each of a block's four linears a
:class:`WeightOnlyLinear` (its dequantised float32 weight and its bias); embeddings, head and
LayerNorms float32. ``lm`` a :class:`preln.models.llama_lm.LlamaLM` (e.g. SmolLM2 from its GGUF
file) -> :class:`WeightOnlyLlama`: every linear of every block (q, k, v, o, gate, up, down) and,
with ``head=True``, the LM head (tied to the embedding in SmolLM2: the embedding's lookup then
dequantises its rows from the same codes) a :class:`QuantLinear`, with a float32 scale and an
integer zero point (one byte) per group; RMSNorm gains stay float32.
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
TinyLM's q, k, v projection its search judges the whole attention sublayer's output (llm-awq's
module2inspect), else each linear's own output.
"""
from __future__ import annotations

import copy

import numpy as np

from preln.models.lm import TinyLM
from preln.models.llama_lm import LlamaLM
from preln.nn.llama import LlamaBlock
from preln.ops import attention_forward, layer_norm_forward, merge_heads, rms_norm_forward, split_heads
from preln.quant.awq import awq
from preln.quant.gptq import gptq
from preln.quant.groups import MAX_BITS, SCALE_BYTES, group_size_of, rtn
from preln.quant.int8 import LINEAR_WEIGHTS, block_forward
from preln.quant.qmatvec import TiledQuant
from preln.validation import check_bits, check_choice, check_input, check_mask, check_token_ids

__all__ = ["METHODS", "MATVEC_ROWS", "LINEARS", "QuantLinear", "WeightOnlyLlamaBlock", "WeightOnlyLlama",
           "WeightOnlyLinear", "WeightOnlyBlock", "WeightOnlyLM", "check_quantize_args", "quantize_tensor",
           "quantize_model"]

#: the methods of :func:`quantize_model`
METHODS = ("rtn", "gptq", "awq")


# ---- a quantised Llama: the tiled kernels ------------------------------------------------------
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
        new.grads, new.linears = {}, dict(linears)
        return new.drop_cache().eval()      # the copy forgets the float block's last forward

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


# ---- a quantised TinyLM: dense float32 products --------------------------------------------
class WeightOnlyLinear:
    """y = (x / s) W^^T + b, with W^ the dequantised group codes of W diag(s) (s = 1 unless AWQ):
    float32 arithmetic on weights that are stored in ``bits`` bits."""

    def __init__(self, gq, bias, in_scale=None):
        self.gq = gq
        self.in_scale = None if in_scale is None else np.asarray(in_scale, np.float32)   # (K,)
        self.w_hat = gq.dequantize().astype(np.float32)                                  # (M, K)
        if self.in_scale is not None:
            self.w_hat = self.w_hat / self.in_scale                   # (x / s) W^T = x (W^ / s)^T
        self.bias = np.asarray(bias, np.float32)

    def __call__(self, x):  # (N, K) -> (N, M)
        return np.asarray(x, np.float32) @ self.w_hat.T + self.bias

    def weight_nbytes(self):
        """Codes, scales and zero points, AWQ's float16 input scales, the float32 bias."""
        extra = 0 if self.in_scale is None else self.in_scale.size * SCALE_BYTES
        return self.gq.nbytes() + extra + self.bias.nbytes


class WeightOnlyBlock:
    """An inference-only block whose four linear layers are :class:`WeightOnlyLinear`."""

    def __init__(self, params, config, linears):
        self.params = {k: v.astype(np.float32) for k, v in params.items()}
        self.config, self.linears = config, linears

    def __call__(self, x, key_padding_mask=None):  # (B, S, D) -> (B, S, D) float32
        x = check_input(x, self.config.d_model, np.float32)              # (B, S, D)
        kpm = check_mask(key_padding_mask, x.shape)
        return block_forward(self.params, self.config, x, kpm, lambda name, h: self.linears[name](h))

    def weight_nbytes(self):
        return sum(l.weight_nbytes() for l in self.linears.values())


class WeightOnlyLM:
    """A :class:`preln.models.lm.TinyLM` whose blocks are :class:`WeightOnlyBlock`; embeddings, LM head
    and the final LayerNorm stay float32. Maps (B, S) token ids to (B, S, V) logits."""

    def __init__(self, lm, blocks, method, bits, group_size):
        self.config, self.io = lm.config, lm.io
        self.own = {k: v.astype(np.float32) for k, v in lm.own.items()}
        self.norm = {k: v.astype(np.float32) for k, v in lm.stack.norm.items()}
        self.eps = lm.stack.config.eps
        self.blocks, self.method, self.bits, self.group_size = blocks, method, bits, group_size

    def __call__(self, tokens):  # (B, S) int -> (B, S, V) float32
        h, _ = self.io.embed(self.own, tokens)                                       # (B, S, D)
        for block in self.blocks:
            h = block(h)
        if self.norm:
            h = layer_norm_forward(h, self.norm["weight"], self.norm["bias"], self.eps)[0]
        return self.io.logits(self.own, h)[0]                                        # (B, S, V)

    forward = __call__

    def weight_nbytes(self):
        return sum(b.weight_nbytes() for b in self.blocks)


def _attention_output(x, shape, p, cfg):
    """in_proj's effective weight -> the attention sublayer's output on inputs x (B S, D): what
    AWQ's search compares for the q, k, v projection."""
    def output(w_eff):
        qkv = x.reshape(shape) @ w_eff.T + p["self_attn.in_proj_bias"]            # (B, S, 3D)
        q, k, v = (split_heads(t, cfg.n_heads) for t in np.split(qkv, 3, axis=-1))  # (B, H, S, d_h)
        o = merge_heads(attention_forward(q, k, v, None, cfg.causal)[0])           # (B, S, D)
        return o @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
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


def _quantize_tiny(lm, method, bits, group_size, calib, symmetric, options):  # -> WeightOnlyLM
    def quantized(w, b, x, output=None):
        gq, s = quantize_tensor(method, w, x, bits, group_size, symmetric, output, **options)
        return WeightOnlyLinear(gq, b, in_scale=s)

    h = None
    if method != "rtn":
        h, _ = lm.io.embed(lm.own, calib, name="calib")                # (B, S, D)
    blocks = []
    for layer in lm.stack.layers:
        p64 = {k: v.astype(np.float64) for k, v in layer.params.items()}
        linears = {}

        def linear(name, x):          # quantise each linear the first time it runs, from its input
            w, b = LINEAR_WEIGHTS[name]
            if name not in linears:
                out = (_attention_output(x, h.shape, p64, layer.config)
                       if method == "awq" and name == "in_proj" else None)
                linears[name] = quantized(p64[w], p64[b], x, out)
            return linears[name](x).astype(np.float64)

        if h is None:                                                  # RTN: no data needed
            for name, (w, b) in LINEAR_WEIGHTS.items():
                linears[name] = quantized(p64[w], p64[b], None)
        else:                         # true sequential: the next inputs come from quantised layers
            h = block_forward(p64, layer.config, h, linear=linear)
        blocks.append(WeightOnlyBlock(p64, layer.config, linears))
    return WeightOnlyLM(lm, blocks, method, bits, group_size)


#: the calibration forward's cache field holding each linear's input, and the linears reading it
_STAGES = ((lambda c: c.attn.q_proj.x, LINEARS[:3]), (lambda c: c.attn.o_proj.x, LINEARS[3:4]),
           (lambda c: c.mlp.gate.x, LINEARS[4:6]), (lambda c: c.mlp.down.x, LINEARS[6:]))


def _quantize_llama(lm, method, bits, group_size, calib, symmetric, head, options):  # -> WeightOnlyLlama
    if bits < 2:
        raise ValueError(f"bits: expected 2..{MAX_BITS} (a zero point and at least 4 levels); got {bits}")
    cfg = lm.config
    for K in sorted({cfg.d_model, cfg.d_ff}):          # every K, checked before any work
        group_size_of(K, group_size)
    if group_size is not None and group_size % 2 and bits <= 4:
        raise ValueError(f"group_size: expected an even group size for {bits}-bit codes packed two per "
                         f"byte; got {group_size}")

    def quantized(w, x):
        gq, s = quantize_tensor(method, w, x, bits, group_size, symmetric, **options)
        return QuantLinear(gq, in_scale=s)

    h = None
    if method != "rtn":
        calib = check_token_ids(np.atleast_2d(np.asarray(calib)), cfg.vocab_size, "calib")
        h = lm.own["model.embed_tokens.weight"][calib].astype(np.float64)              # (B, S, D)
    layers = []
    for layer in lm.layers:
        p64 = {k: v.astype(np.float64) for k, v in layer.params.items()}
        linears = {}
        if h is None:
            linears = {n: quantized(p64[f"{n}.weight"], None) for n in LINEARS}
        else:                  # true sequential: each stage's inputs from the quantised stages before
            block = LlamaBlock(layer.config, dtype=np.float64, seed=0).eval()
            for inputs, names in _STAGES:
                block.load_state_dict(p64)
                block.forward(h)
                x = inputs(block.cache)
                for n in names:
                    linears[n] = quantized(p64[f"{n}.weight"], x)
                    p64[f"{n}.weight"] = linears[n].dequantize().astype(np.float64)
            block.load_state_dict(p64)
            h = block.forward(h)
        layers.append(WeightOnlyLlamaBlock.from_block(layer, linears))
    q_head = None
    if head:
        x = None if h is None else rms_norm_forward(h, lm.own["model.norm.weight"].astype(np.float64), cfg.eps)[0]
        q_head = quantized(lm.own["lm_head.weight"], x)
    return WeightOnlyLlama.of(lm, layers, q_head, method, bits, group_size, bool(symmetric))


def quantize_model(lm, method="rtn", bits=4, group_size=None, calib=None, symmetric=False, head=None, **options):
    """A weight-only quantised copy of a language model (module docstring).

    lm: a :class:`preln.models.lm.TinyLM` -> :class:`WeightOnlyLM`, or a float
    :class:`preln.models.llama_lm.LlamaLM` -> :class:`WeightOnlyLlama`. method: "rtn", "gptq" or
    "awq". bits: 2..8 for a Llama (<= 4 packed two codes per byte), 1..8 for a TinyLM. group_size:
    input columns per group, dividing every matrix's K, or None (one group per output row).
    calib: (B, S) token ids, needed by GPTQ and AWQ. head: quantise the LM head too -- a Llama's
    (None: yes; a tied embedding then reads its rows from the head's codes); a TinyLM's head stays
    float32 (None or False). options: GPTQ's ``block_size`` and ``damp``, AWQ's ``n_grid``.
    """
    bits = check_quantize_args(method, bits, calib, options, "quantize_model")
    if isinstance(lm, LlamaLM) and not isinstance(lm, WeightOnlyLlama):
        return _quantize_llama(lm, method, bits, group_size, calib, symmetric, head is None or head, options)
    if isinstance(lm, TinyLM):
        if head:
            raise ValueError(f"head: a TinyLM's head stays float32 (expected None or False); got {head!r}")
        return _quantize_tiny(lm, method, bits, group_size, calib, symmetric, options)
    raise TypeError(f"lm: expected a preln.models.lm.TinyLM or a float preln.models.llama_lm.LlamaLM; "
                    f"got {type(lm).__name__}")
