"""The INT8 chapters' figures carry their own alt text and description (issue 24), computed from
the data they are given: on small made-up data here, each fits ALT_MAX uncut and quotes that data."""
import numpy as np
import pytest

from tests.figure_checks import own_words
from preln.chapters import inference as inf
from preln.chapters.figures import int8 as figs
from preln.quant.qmatvec import MatvecTiming


def _figures():
    bits = np.arange(2, 13)
    yield "bits", figs.plot_bits_error(bits, {"per tensor": 2.0 ** -bits, "per channel": 2.0 ** -bits / 2,
                                              "per tensor, one outlier": 20 * 2.0 ** -bits}), ["20×"]
    Ks = 2 ** np.arange(5, 9)
    yield "accumulators", figs.plot_accumulators(Ks, [0.1, 0.3, 0.6, 0.8], [0, 0.2, 0.5, 0.9], [0] * 4), \
        ["int16 80 %", "float32 is exact"]
    yield "ops", figs.plot_op_errors(["ln1", "in_proj", "y"], {"a": [1e-7, 1e-2, 2e-2], "b": [1e-7, 1e-3, 3e-3]}), \
        ["jumps at the Q, K, V projection", "a highest, b lowest"]
    before, after = np.full(8, 2.0), np.full(8, 2.0)
    after[[1, 5]] = 64.0
    yield "outliers", figs.plot_outlier_channels(before, after, [1, 5]), ["channels 1, 5 reach 64;", "at most 2."]
    yield "sweeps", figs.plot_sweeps([1, 8, 64], [2.0, 2.01, 3.0], [0.5, 0.1, 0], [0, 1], [2.0, 2.02], 2.0, 4.0), \
        ["up to threshold 8", "per-tensor W8A8 4."]
    clips = np.arange(1, 201) / 200
    yield "calibration", figs.plot_calibration(clips, {"4-bit": (clips - 0.5) ** 2 + 0.1},
                                               {"absmax": (1.0, 0.35), "mse": (0.5, 0.1)}, 4), \
        ["lowest at 50 % (4-bit)", "mse clips at 50 %"]
    llama = inf.PUBLISHED_MODELS["Llama 3 8B"]
    yield "decode", figs.plot_weight_bits_decode(llama, {"H100": inf.PUBLISHED["H100 SXM"]}, [1, 1024], 1024), \
        ["8-bit 1.9", "4-bit 3."]
    rows = [MatvecTiming("float32, BLAS sgemv", 256 * 2**20, 0.020, 0.0),
            MatvecTiming("int8, per-row scales", 64 * 2**20, 0.010, 0.0)]
    yield "matvec", figs.plot_matvec(rows, 16e9), ["int8 2×", "the 4× their bytes allow"]
    ppl = {(m, b, g): 3.0 / b - 0.1 * (m == "gptq") for m in ("rtn", "gptq", "awq") for b in (2, 4)
           for g in (8, "row")}
    yield "weight_only", figs.plot_weight_only((2, 4), (8, "row"), ppl, 0.7), ["GPTQ beats round to nearest in 4 of 4"]


@pytest.mark.parametrize("name, fig, says", list(_figures()), ids=lambda v: v if isinstance(v, str) else "")
def test_alt_fits_uncut_and_quotes_the_data(name, fig, says):
    alt, description = own_words(fig)
    for words in says:
        assert words in alt, (words, alt)
