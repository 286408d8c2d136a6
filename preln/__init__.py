"""preln: the Pre-LN Transformer residual block in numpy, for teaching.

    x: (B, S, D) -> LN -> Attn -> + x -> LN -> MLP -> + x -> y: (B, S, D)

Every op has a forward and a hand-written backward (``preln.ops``); :class:`TransformerBlock`
assembles them and matches ``torch.nn.TransformerEncoderLayer`` given the same weights.
``python -m preln`` prints this map, the version, and how to open the book and run its notebooks.

Which module serves which chapter (the chapters are the notebooks ``book/<chapter>.ipynb``)::

    preln.ops               derivation_ops, derivation_block, modern_block
        the ops, each a *_forward -> (out, cache) and *_backward(dout, cache) pair: linear,
        layer_norm, softmax, attention (plain, tiled, grouped-query), activations, dropout,
        batchnorm; rms_norm, swiglu, rope for the modern block
    preln.ops.fused         inference
        numba kernels for the memory-bound chains (bias + residual + LayerNorm, bias + GELU, softmax)
    preln.gradcheck         derivation_ops, derivation_block, modern_block, preln_vs_postln
        float64 central differences and the two error measures
    preln.block             derivation_block, every chapter
        TransformerBlock (Pre-LN and Post-LN), its backward, the KV cache
    preln.config            derivation_block, every chapter
        BlockConfig: the sizes and switches of one block
    preln.llama             modern_block
        LlamaBlock: RMSNorm, SwiGLU, RoPE and grouped-query attention, its backward, the KV cache
    preln.llama_lm          modern_block
        a tiny Llama-style character language model
    preln.shapes            shape_flow, inference
        shapes, FLOPs and bytes op by op; the timing and power-law fits
    preln.precision         precision, derivation_ops
        storage dtypes, the safe and naive policies, the overflow tracer
    preln.numerics          precision, preln_vs_postln
        format limits, overflow thresholds, the residual stream's growth, loss scaling
    preln.quant             int8
        INT8 quantisation: scales, rounding, clamping, exact int32 accumulation, outliers
    preln.groupquant        int8
        weight-only 4-bit and 8-bit quantisation in groups along the input axis (round to nearest)
    preln.gptq              int8
        GPTQ: column-by-column rounding that corrects the remaining columns with the inverse Hessian
    preln.awq               int8
        AWQ: per-channel scales chosen from activation magnitudes before rounding
    preln.qmatvec           int8, inference
        quantised matrix-vector kernels: why int8 and 4-bit weights decode faster
    preln.pretrained        int8, inference, modern_block
        reference_lm(): the small trained character LM
    preln.inference         inference
        the roofline, bytes per op, attention I/O (FlashAttention 1 and 2), prefill and decode costs
    preln.paged             inference
        a paged KV cache (block tables) and continuous batching
    preln.stack             preln_vs_postln, derivation_block, inference
        a stack of blocks (TransformerStack)
    preln.lm                preln_vs_postln
        a tiny character language model with cross-entropy
    preln.optim             preln_vs_postln
        Adam with bias correction, warm-up, gradient clipping
    preln.xiong             preln_vs_postln, precision, int8, modern_block
        Xiong et al. (2020)'s experiments; the synthetic corpus
    preln.figures           every chapter
        each chapter's figures: preln.figures.<chapter> (derivation: both derivation chapters)
    preln.viz               every chapter
        the figure style, deterministic PNGs, kernel-free explorables
    preln.nb                every chapter
        glue(): myst-nb's where the book's toolchain is installed, a plain display elsewhere
    preln.resources         every chapter
        data_path(): the data files shipped inside the package (preln/data/)
    preln.blas              inference, shape_flow
        BLAS threads (threadpoolctl) and the OpenBLAS kernel in use
    preln.checks            every chapter
        input validation: errors that name the argument, what was expected and what was received
    preln.course            assignments
        what the graded assignments' hidden tests use
    preln.bench             make bench
        the benchmark tables (python -m preln.bench)
"""
from .block import KVCache, PreLNTransformerBlock, TransformerBlock, default_heads, param_shapes
from .config import BlockConfig
from .llama import LlamaBlock, LlamaConfig, LlamaKVCache
from .precision import NAIVE, SAFE, Overflow, Policy, SUPPORTED_DTYPES, Watch
from .stack import StackKVCache, TransformerStack

__version__ = "0.2.0"
__all__ = ["BlockConfig", "TransformerBlock", "PreLNTransformerBlock", "Policy", "SAFE", "NAIVE",
           "Overflow", "Watch", "TransformerStack", "KVCache", "StackKVCache", "SUPPORTED_DTYPES",
           "default_heads", "param_shapes", "LlamaBlock", "LlamaConfig", "LlamaKVCache"]
