"""The block on many devices: ring collectives (:mod:`.comm`), tensor and sequence parallel
shards of the block (:mod:`.tensor`), and their check on torch.distributed (:mod:`.distributed`)."""
from preln.parallel.comm import COLLECTIVES, SimComm, TorchComm, Traffic, ring_bytes, run_simulated
from preln.parallel.tensor import MODES, ParallelBlock, check_parallel, predicted_traffic, replicated, shard_params

__all__ = ["COLLECTIVES", "SimComm", "TorchComm", "Traffic", "ring_bytes", "run_simulated",
           "MODES", "ParallelBlock", "check_parallel", "predicted_traffic", "replicated", "shard_params"]
