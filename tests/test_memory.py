"""Memory: eval mode never holds the (B, H, S, S) scores, so its extra memory grows linearly in S;
training mode keeps P for its backward and says how much (``block.cache_nbytes()``), unless
attention="tiled", whose training step (FlashAttention-2's backward) grows O(S) too.

Peaks are measured with tracemalloc, which sees numpy's array allocations: the peak of traced
memory during one eval forward, minus what was traced before it (x and the parameters exist
already). They are measured in a fresh interpreter, so that nothing the other tests left alive
counts, and with one BLAS thread: the tiled forward makes thousands of small matmuls, and on a
busy machine multi-threaded OpenBLAS spends most of its time spinning (measured 8 s -> 100 s).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from preln import BlockConfig, TransformerBlock

MiB = 2 ** 20
CFG = BlockConfig(d_model=128, n_heads=4, d_ff=512)
#: at S = 8192 one float32 (B, H, S, S) score tensor is 1 GiB; the tiled forward must stay far below
EVAL_PEAK_LIMIT_8192 = 256 * MiB
#: peak(2S) / peak(S): about 2 if memory is O(S), about 4 if it is O(S^2)
LINEAR_GROWTH_LIMIT = 2.5
SEQUENCE_LENGTHS = (1024, 2048, 4096, 8192)

MEASURE = """
import json, sys, tracemalloc
import numpy as np
from preln import BlockConfig, TransformerBlock
cfg = BlockConfig(d_model=128, n_heads=4, d_ff=512)
peaks = {}
# one small forward first: it loads (or compiles) the fused kernels, whose Python-side allocations
# tracemalloc would otherwise count in the first measurement
TransformerBlock(cfg, dtype=np.float32, seed=0).eval()(np.zeros((1, 8, cfg.d_model), np.float32))
for S in map(int, sys.argv[1:]):
    block = TransformerBlock(cfg, dtype=np.float32, seed=0).eval()
    x = np.random.default_rng(0).standard_normal((1, S, cfg.d_model)).astype(np.float32)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    y = block(x)
    peaks[S] = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert y.shape == x.shape and np.isfinite(y).all()
    del block, x, y
print(json.dumps(peaks))
"""


@pytest.fixture(scope="module")
def eval_peaks():
    """{S: peak extra bytes of one float32 eval forward at B=1, D=128, H=4, F=512}."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, *map(str, SEQUENCE_LENGTHS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {int(S): peak for S, peak in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.slow
def test_eval_peak_at_8192_is_far_below_one_score_tensor(eval_peaks):
    B, S, H = 1, 8192, CFG.n_heads
    scores = B * H * S * S * 4                            # one float32 (B, H, S, S): 1 GiB
    assert scores == 1024 * MiB
    assert eval_peaks[S] < EVAL_PEAK_LIMIT_8192, f"{eval_peaks[S] / MiB:.1f} MiB"   # measured 96 MiB


@pytest.mark.slow
def test_eval_peak_grows_linearly_in_S(eval_peaks):
    peaks_mib = {S: round(p / MiB, 1) for S, p in eval_peaks.items()}   # measured 12, 24, 48, 96
    for S in (1024, 2048, 4096):
        ratio = eval_peaks[2 * S] / eval_peaks[S]
        assert 1.5 < ratio < LINEAR_GROWTH_LIMIT, peaks_mib


def test_training_cache_holds_the_probabilities_and_is_reported():
    B, S, H = 2, 256, CFG.n_heads
    block = TransformerBlock(CFG, dtype=np.float32, seed=0)
    x = np.random.default_rng(0).standard_normal((B, S, CFG.d_model)).astype(np.float32)
    block(x)
    probs = B * H * S * S * 4                             # float32 (B, H, S, S) P
    nbytes = block.cache_nbytes()
    assert nbytes >= probs
    assert block.cache.attn.sdpa.p.nbytes == probs
    block.eval()
    block(x)
    assert block.cache.attn.sdpa.p is None
    assert block.cache_nbytes() == nbytes - probs         # the eval cache is the same minus P


#: peak(4S) / peak(S) of one training step (forward + backward): measured 2.1 tiled, 10.6 plain
TILED_TRAIN_GROWTH_LIMIT = 6.0
#: the plain path keeps (B, H, S, S) P and its gradients: quadratic, well above the tiled limit
PLAIN_TRAIN_GROWTH_FLOOR = 8.0

TRAIN_MEASURE = """
import json, sys, tracemalloc
import numpy as np
from preln import BlockConfig, TransformerBlock
cfg = BlockConfig(d_model=128, n_heads=4, d_ff=512, dropout=0.1)
TransformerBlock(cfg, dtype=np.float32, seed=0)(np.zeros((1, 8, cfg.d_model), np.float32))
peaks = {}
for att in ("plain", "tiled"):
    for S in (512, 2048):
        block = TransformerBlock(cfg, dtype=np.float32, seed=0, attention=att)
        x = np.random.default_rng(0).standard_normal((1, S, cfg.d_model)).astype(np.float32)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        block(x)
        dx = block.backward(x)
        peaks[f"{att} {S}"] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        assert np.isfinite(dx).all()
print(json.dumps(peaks))
"""


def test_tiled_training_step_memory_grows_linearly():
    """Training step (forward + backward, dropout on) at S = 512 and 4 S = 2048: the tiled path
    keeps O and the log-sum-exp, so its peak grows ~4x at most; the plain path's ~16x term shows."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TRAIN_MEASURE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    tiled, plain = peaks["tiled 2048"] / peaks["tiled 512"], peaks["plain 2048"] / peaks["plain 512"]
    assert tiled <= TILED_TRAIN_GROWTH_LIMIT, peaks
    assert plain >= PLAIN_TRAIN_GROWTH_FLOOR, peaks
