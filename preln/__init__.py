"""preln: the Pre-LN Transformer residual block in numpy, for teaching.

    x: (B, S, D) -> LN -> Attn -> + x -> LN -> MLP -> + x -> y: (B, S, D)

Every op has a forward and a hand-written backward (``preln.ops``); :class:`TransformerBlock`
assembles them and matches ``torch.nn.TransformerEncoderLayer`` given the same weights.
``python -m preln`` prints this map, the version, and how to open the book and run its notebooks.

Which module serves which chapter (the chapters are the notebooks ``book/<chapter>.ipynb``); the
layers, each importing only itself and the layers before it (tests/test_layout.py states and checks it):
foundation (blas, gradcheck, measure, precision, resources, validation) <- ops <- nn <- gguf <- models <- quant, serve, parallel <- chapters (with nb) <- course, bench (with gguf.bench), __main__, __init__ <- grade::

    preln.precision         precision, precision_fixes, derivation_ops
        foundation: storage dtypes, the safe and naive policies, the overflow tracer
    preln.validation        every chapter
        foundation: input validation, errors that name the argument, what was expected and what was received
    preln.gradcheck         derivation_ops, derivation_ops_attention, derivation_ops_mlp, derivation_block, modern_block, modern_block_lm, preln_vs_postln
        foundation: float64 central differences and the error measures
    preln.blas              inference, inference_serving, shape_flow
        foundation: BLAS threads (threadpoolctl) and the OpenBLAS kernel in use
    preln.resources         every chapter
        foundation: data_path(), the data files shipped inside the package (preln/data/)
    preln.measure           inference, shape_flow, precision, many_devices
        foundation: timing (interleaved rounds, best of repeats) and peak memory (tracemalloc)
    preln.nb                every chapter
        presentation (the chapters' layer): glue(), myst-nb's where the book's toolchain is installed, a plain display elsewhere
    preln.ops               derivation_ops, derivation_ops_attention, derivation_ops_mlp, derivation_block, modern_block, modern_block_lm
        the ops, each a *_forward -> (out, cache) and *_backward(dout, cache) pair: linear,
        layer_norm, softmax, attention (plain, tiled, grouped-query), activations, dropout,
        batchnorm; rms_norm, swiglu, rope for the modern block
    preln.ops.fused         inference, modern_block
        numba kernels for the memory-bound chains: .transformer (bias + residual + LayerNorm,
        bias + GELU, softmax) and .llama (RMSNorm, RoPE, SwiGLU)
    preln.nn                build_and_train, derivation_block, every chapter
        the blocks: config (BlockConfig, LlamaConfig), block (TransformerBlock, Pre-LN and Post-LN),
        llama (LlamaBlock: RMSNorm, SwiGLU, RoPE, grouped-query attention), their KV caches, stack
    preln.models            build_and_train, preln_vs_postln, int8, int8_weight_only, inference_serving, modern_block, modern_block_lm
        models built from blocks: lm (a tiny character LM with cross-entropy), llama_lm, optim
        (Adam, warm-up, clipping), corpus, pretrained (reference_lm(), the small trained LM)
    preln.quant             int8, int8_weight_only
        quantisation: int8 (scales, rounding, clamping, int32 accumulation, outliers), groups
        (weight-only group grids), gptq, awq, weight_only (quantised LMs), qmatvec (kernels)
    preln.gguf              real_model, make bench
        real models from GGUF files: load(path), smollm2_path(); file (Q8_0/Q4_0/Q4_1 blocks, the
        q/k row permutation), tokenizer (byte-level BPE, chat template), model, bench (decode speed)
    preln.serve             inference_serving
        serving: paged (a paged KV cache with block tables, continuous batching)
    preln.parallel          many_devices, python -m preln.parallel
        many devices: comm (ring collectives, simulated ranks or torch.distributed), tensor (Megatron
        tensor and sequence parallel shards of both blocks), distributed (python -m preln.parallel)
    preln.chapters          every chapter
        what only the book computes: shapes, numerics, xiong (Xiong et al. 2020), inference
        (roofline, bytes per op, FlashAttention I/O, prefill and decode costs), viz (the figure
        style, kernel-free explorables), real_model (a GGUF header and its blocks by hand, the
        grids and calibrated runs of SmolLM2), figures.<chapter>
    preln.grade             assignments
        the course edition's grader: python -m preln.grade SUBMISSIONS (sandboxed autograde to CSV),
        release (student notebooks), mutate (mutation score); see book/running.md
    preln.course            assignments
        what the graded assignments' hidden tests use
    preln.bench             make bench
        the benchmark tables (python -m preln.bench)
"""
from preln.nn.block import KVCache, PreLNTransformerBlock, TransformerBlock, default_heads, param_shapes
from preln.nn.config import BlockConfig
from preln.nn.llama import LlamaBlock, LlamaConfig, LlamaKVCache
from preln.precision import NAIVE, SAFE, Overflow, Policy, SUPPORTED_DTYPES, Watch
from preln.nn.stack import StackKVCache, TransformerStack

__version__ = "0.2.0"
__all__ = ["BlockConfig", "TransformerBlock", "PreLNTransformerBlock", "Policy", "SAFE", "NAIVE",
           "Overflow", "Watch", "TransformerStack", "KVCache", "StackKVCache", "SUPPORTED_DTYPES",
           "default_heads", "param_shapes", "LlamaBlock", "LlamaConfig", "LlamaKVCache"]
