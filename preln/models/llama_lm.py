"""A tiny Llama-style character language model: :class:`preln.models.lm.TinyLM` with the modern block.

    tokens (B, S) int -> h_0 = E_tok[tokens]               (B, S, D); no position embedding:
                      -> h_l = LlamaBlock_l(h_{l-1})      RoPE rotates q and k in every block
                      -> h   = RMSNorm_f(h_L)             the final norm of a Pre-norm stack
                      -> logits = h W_head^T              (B, S, V); no bias, as Llama's lm_head

Parameter names are those of transformers' ``LlamaForCausalLM.state_dict()``:
``model.embed_tokens.weight`` (V, D), ``model.layers.l.<LlamaBlock name>``, ``model.norm.weight``
(D,), ``lm_head.weight`` (V, D). Every backward is written by hand: the cross-entropy's, the head's,
the final RMSNorm's, each block's, and the embedding's scatter-add.

A real model: ``LlamaLM.from_gguf(path)`` reads a Llama-architecture GGUF file (llama.cpp's format,
:func:`preln.gguf.model.read_llama`) with its tokenizer -- SmolLM2-135M-Instruct is
``LlamaLM.from_gguf(preln.gguf.smollm2_path())`` -- and ``lm.chat(messages)`` answers in its
chat template. :func:`preln.quant.weight_only.quantize_model` quantises it weight-only.

Initialisation (``init``): "xavier" (default) draws every block weight from N(0, 2 / (n_in + n_out)),
the embedding from N(0, 0.02^2) and the head Xavier normal -- TinyLM's scheme (Xiong et al. 2020),
so that the chapter's comparison with the reference LM changes the block and nothing else;
"llama" is transformers' N(0, 0.02^2) everywhere.

:func:`preln.models.pretrained.train_lm` trains it with the reference LM's recipe.
"""
import copy
from typing import NamedTuple

import numpy as np

from preln.gguf.model import read_llama
from preln.gguf.tokenizer import GGUFTokenizer
from preln.models.lm import LanguageModel, TokenIO, embedding_backward
from preln.nn.base import DEFAULT_ATTENTION, DEFAULT_DTYPE
from preln.nn.llama import LlamaBlock, LlamaConfig
from preln.ops import linear_backward, rms_norm_backward, rms_norm_forward
from preln.nn.stack import StackKVCache
from preln.validation import check_choice, positive_int

__all__ = ["LlamaLMConfig", "LlamaLM"]


class LlamaLMConfig(NamedTuple):
    vocab_size: int = 32
    d_model: int = 32
    n_heads: int = 2
    n_kv_heads: int = 2
    d_ff: int = 96
    n_layers: int = 2
    rope_theta: float = 10000.0
    eps: float = 1e-6
    init: str = "xavier"          # "xavier" (TinyLM's scheme) or "llama" (N(0, 0.02^2))
    rope_scaling: object = None   # a long-context remedy, see preln.ops.rope.RopeScaling

    def block_config(self):
        return LlamaConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                           d_ff=self.d_ff, rope_theta=self.rope_theta, eps=self.eps,
                           rope_scaling=self.rope_scaling)


class LlamaLM(LanguageModel):
    """A causal LM: an embedding, L :class:`preln.LlamaBlock` s, RMSNorm, a head -- a character LM
    trained here, or a real model read from a GGUF file (:meth:`from_gguf`): then ``tokenizer``
    (a :class:`preln.gguf.GGUFTokenizer`), ``metadata``, ``context_length`` (the trained context)
    and ``tensor_types`` ({GGUF name: type}) say what the file held, and the head may be the
    embedding itself (``tied``). dtype and attention are the blocks' (float32 and "auto", as for
    every block)."""

    tokenizer = None
    metadata = {}
    context_length = None
    tensor_types = {}

    def __init__(self, config=LlamaLMConfig(), dtype=DEFAULT_DTYPE, seed=0, attention=DEFAULT_ATTENTION):
        if not isinstance(config, LlamaLMConfig):
            raise TypeError(f"config: expected a preln.models.llama_lm.LlamaLMConfig; got {type(config).__name__}")
        check_choice(config.init, ("xavier", "llama"), "init")
        positive_int(config.n_layers, "n_layers")
        self.config = config
        self.dtype = np.dtype(dtype)
        block_cfg = config.block_config()
        seeds = np.random.SeedSequence(seed).spawn(config.n_layers + 1)
        self.layers = [LlamaBlock(block_cfg, dtype=self.dtype, seed=s, attention=attention) for s in seeds[:-1]]
        rng = np.random.default_rng(seeds[-1])
        if config.init == "xavier":
            for layer in self.layers:
                layer.load_state_dict({k: (v if k.endswith("layernorm.weight") else
                                           layer.rng.normal(0.0, np.sqrt(2.0 / sum(v.shape)), v.shape))
                                       for k, v in layer.state_dict().items()})
        V, D = config.vocab_size, config.d_model
        head_std = np.sqrt(2.0 / (V + D)) if config.init == "xavier" else 0.02
        self.own = {"model.embed_tokens.weight": rng.normal(0, 0.02, (V, D)),
                    "model.norm.weight": np.ones(D),
                    "lm_head.weight": rng.normal(0, head_std, (V, D))}
        self.own = {k: v.astype(self.dtype) for k, v in self.own.items()}
        self._own_grads = None
        self.io = self.token_io(config)
        self._cache = None

    @staticmethod
    def token_io(config):
        return TokenIO(config.vocab_size, None, tok="model.embed_tokens.weight", pos=None,
                       head="lm_head.weight", bias=None)

    @classmethod
    def from_parts(cls, config, layers, own, tokenizer=None, metadata=None, context_length=None,
                   tensor_types=None):
        """An LM of given blocks and ``own`` (embed_tokens, norm, lm_head: the embedding itself
        when tied), no weights drawn; the rest as :meth:`from_gguf` sets them."""
        if not isinstance(config, LlamaLMConfig):
            raise TypeError(f"config: expected a preln.models.llama_lm.LlamaLMConfig; got {type(config).__name__}")
        lm = cls.__new__(cls)
        lm.config, lm.layers, lm.own = config, list(layers), dict(own)
        lm.dtype = lm.layers[0].dtype
        lm.io, lm._own_grads, lm._cache = cls.token_io(config), None, None
        lm.tokenizer, lm.metadata, lm.context_length = tokenizer, metadata or {}, context_length
        lm.tensor_types = tensor_types or {}
        return lm

    @classmethod
    def from_gguf(cls, path, dtype=np.float32, tokenizer=True):
        """The Llama-architecture GGUF file at ``path`` (:func:`preln.gguf.model.read_llama`) as an
        LM in eval mode, every weight dequantised to ``dtype`` (float32 or float64), with the
        file's tokenizer (tokenizer=False skips it); a tied head (no ``output.weight``) is the
        embedding array itself."""
        f = read_llama(path, dtype)
        config = LlamaLMConfig(**f.config)
        template = LlamaBlock(config.block_config(), dtype=f.own["model.norm.weight"].dtype, seed=0).eval()
        layers = []
        for sd in f.layers:
            block = copy.copy(template)    # the config and settings; load_state_dict replaces the weights
            block.load_state_dict(sd)      # shapes checked; cast to dtype
            layers.append(block)
        return cls.from_parts(config, layers, f.own, GGUFTokenizer(f.metadata) if tokenizer else None,
                              f.metadata, f.context_length, f.tensor_types)

    @property
    def own_grads(self):   # allocated at the first use: a loaded model that only decodes needs none
        if self._own_grads is None:
            self._own_grads = {k: np.zeros_like(v) for k, v in self.own.items()}
        return self._own_grads

    @property
    def tied(self):
        """Whether the head is the embedding (a GGUF file without output.weight)."""
        return self.own["lm_head.weight"] is self.own["model.embed_tokens.weight"]

    def num_params(self):
        """Distinct parameters (a tied head counted once)."""
        n = sum(v.size for v in self.params.values())
        return int(n - (self.own["lm_head.weight"].size if self.tied else 0))

    def weight_nbytes(self):
        """Bytes of the parameters as stored here (a tied head counted once)."""
        n = sum(v.nbytes for v in self.params.values())
        return int(n - (self.own["lm_head.weight"].nbytes if self.tied else 0))

    # ---- parameters ----------------------------------------------------------------------------
    def _named(self, own, of_layer):  # transformers' order: embedding, layers, norm, head
        out = {"model.embed_tokens.weight": own["model.embed_tokens.weight"]}
        for i, layer in enumerate(self.layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in of_layer(layer).items()})
        out["model.norm.weight"] = own["model.norm.weight"]
        out["lm_head.weight"] = own["lm_head.weight"]
        return out

    @property
    def params(self):
        """name -> the live parameter array (an optimiser updates them in place)."""
        return self._named(self.own, lambda layer: layer.params)

    @property
    def grads(self):
        return self._named(self.own_grads, lambda layer: layer.grads)

    def children(self):
        return self.layers

    # ---- forward and backward ------------------------------------------------------------------
    def embed(self, tokens, name="tokens"):  # (B, S) int -> h_0 (B, S, D), cache
        return self.io.embed(self.own, tokens, name=name)

    def logits(self, h):  # (B, S, D) -> (B, S, V), cache
        return self.io.logits(self.own, h)

    def forward(self, tokens):  # (B, S) or (S,) int -> logits (B, S, V) or (S, V)
        tokens = np.asarray(tokens)
        if tokens.ndim == 1:                                                        # one sequence
            return self.forward(tokens[None])[0]
        keep = self.training            # eval: nothing is kept for a backward (only decode's KV cache)
        h, c_emb = self.embed(tokens)                                               # (B, S, D)
        for layer in self.layers:
            h = layer(h)                                                            # (B, S, D)
            if not keep:
                layer.drop_cache()      # its activations go as soon as the next layer has its input
        h, c_norm = rms_norm_forward(h, self.own["model.norm.weight"], self.config.eps)
        logits, c_head = self.logits(h)                                             # (B, S, V)
        self._cache = (c_emb, c_norm, c_head) if keep else None
        return logits

    __call__ = forward

    def backward(self, dlogits):  # (B, S, V) -> None; accumulates into grads
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate; call lm(tokens) first (in train "
                               "mode: an eval-mode forward keeps no activations)")
        c_emb, c_norm, c_head = self._cache
        dh, dw, _ = linear_backward(dlogits, c_head)                  # logits = h W_head^T
        self.own_grads["lm_head.weight"] += dw
        dh, dgamma = rms_norm_backward(dh, c_norm)                    # h = RMSNorm_f(h_L)
        self.own_grads["model.norm.weight"] += dgamma
        for layer in reversed(self.layers):
            dh = layer.backward(dh)                                   # h_l = Block_l(h_{l-1})
        self.own_grads["model.embed_tokens.weight"] += embedding_backward(dh, c_emb)   # h_0 = E[tokens]

    # ---- decoding ------------------------------------------------------------------------------
    def kv_cache(self, batch, max_len, dtype=None):
        """One :class:`preln.LlamaKVCache` per layer, in a :class:`preln.nn.stack.StackKVCache`."""
        return StackKVCache(layer.kv_cache(batch, max_len, dtype) for layer in self.layers)

    def decode(self, tokens_new, kv):  # (B, n) int -> logits (B, n, V)
        """The logits of the next n positions given the cache of the ones before (eval mode);
        equal to ``forward`` of the whole sequence at those positions. RoPE has no table to run
        out of: the cache's max_len is the only limit on the length."""
        if not isinstance(kv, StackKVCache) or len(kv.layers) != len(self.layers):
            raise TypeError(f"kv: expected the StackKVCache of lm.kv_cache(batch, max_len); got "
                            f"{type(kv).__name__}")
        h, _ = self.embed(tokens_new, "tokens_new")                                   # (B, n, D)
        for layer, layer_kv in zip(self.layers, kv.layers):
            h = layer.decode(h, layer_kv)
        h, _ = rms_norm_forward(h, self.own["model.norm.weight"], self.config.eps)
        return self.logits(h)[0]                                                      # (B, n, V)
