"""Inference costs of the block, one module per subject:

- :mod:`.roofline`: a machine's roofline (measured, or a published GPU's) and the bytes each op of
  the forward moves, unfused and fused, with their measured times;
- :mod:`.attention_io`: attention's traffic between slow and fast memory, standard and tiled
  (FlashAttention), counted as it runs and in closed form;
- :mod:`.decode`: one decoding step's FLOPs and bytes, the weights and the KV cache;
- :mod:`.generation`: published model shapes, their prefill and decode steps op by op on the
  roofline, and measured generation times.

The chapters use every public name from here::

    from preln import BlockConfig
    from preln.chapters import inference as inf

    roof, bw = inf.measure_roofline()                    # this machine: peak GEMM FLOP/s, bandwidth
    ops = inf.op_traffic(BlockConfig(512, 8, 2048), B=4, S=512, schedule="unfused")
    out, io = inf.tiled_attention_io(q, k, v, C=4096)    # FlashAttention, slow-memory accesses counted
    inf.decode_cost(cfg, n_layers=40, batch=8, context=2048, itemsize=2)
    llama = inf.PUBLISHED_MODELS["Llama 3 8B"]           # grouped-query attention, 8 KV heads
    inf.predict_generation(llama, inf.PUBLISHED["H100 SXM"], batch=1, prompt=512, n_new=128)
"""
from preln.chapters.inference.attention_io import (ORDERS, IOCount, attention_access_terms,
                                                   attention_accesses, flash_block_sizes,
                                                   reference_attention, standard_attention_io,
                                                   tiled_attention_io)
from preln.chapters.inference.decode import (DecodeCost, block_params, decode_cost, kv_cache_bytes,
                                             weight_bytes_per_value)
from preln.chapters.inference.generation import (PUBLISHED_MODELS, GenerationTimes, GenerationTiming,
                                                 ModelShape, compute_bound_batch, head_ops, model_shape,
                                                 predict_generation, step_ops, step_time, time_decode,
                                                 time_generation)
from preln.chapters.inference.roofline import (FUSED_KERNELS, PUBLISHED, SCHEDULES, FusionTiming, OpTraffic,
                                               Roofline, arithmetic_intensity, measure_bandwidth,
                                               measure_gemm, measure_roofline, op_traffic, time_fusion,
                                               time_ops)

__all__ = ["Roofline", "PUBLISHED", "measure_gemm", "measure_bandwidth", "measure_roofline",
           "OpTraffic", "arithmetic_intensity", "op_traffic", "SCHEDULES", "FUSED_KERNELS", "time_ops",
           "FusionTiming", "time_fusion",
           "IOCount", "standard_attention_io", "tiled_attention_io", "ORDERS", "attention_accesses",
           "attention_access_terms", "flash_block_sizes", "reference_attention",
           "kv_cache_bytes", "weight_bytes_per_value", "block_params", "DecodeCost", "decode_cost",
           "ModelShape", "PUBLISHED_MODELS", "model_shape", "step_ops", "head_ops", "step_time",
           "GenerationTimes", "predict_generation", "compute_bound_batch", "GenerationTiming",
           "time_generation", "time_decode"]
