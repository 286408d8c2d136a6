"""preln.blas: the kernel OpenBLAS runs can be read back, and OPENBLAS_CORETYPE forces it.

`make test-notebooks` runs every notebook under several forced kernels; this checks that forcing
one really changes what numpy runs, so that matrix tests what it claims to."""
import os
import subprocess
import sys

import pytest

from preln.blas import openblas_corenames

PROBE = "import numpy, scipy.linalg; from preln.blas import openblas_corenames as f; print(*f())"


def corenames_under(coretype):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return out.stdout.split()


def test_corenames_reports_the_loaded_openblas():
    import numpy  # noqa: F401  (loads numpy's OpenBLAS)
    names = openblas_corenames()
    if not names:
        pytest.skip("no OpenBLAS loaded in this process (numpy built against another BLAS)")
    assert all(isinstance(n, str) and n for n in names)


@pytest.mark.parametrize("coretype", ["Haswell", "SkylakeX"])
def test_openblas_coretype_forces_the_kernel(coretype):
    default = corenames_under(None)
    if not default:
        pytest.skip("no OpenBLAS loaded (numpy built against another BLAS)")
    if coretype == "SkylakeX" and "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX-512: OpenBLAS would not run SkylakeX kernels")
    assert set(corenames_under(coretype)) == {coretype}


def test_prescott_is_the_generic_kernel():
    # OpenBLAS reports its generic SSE3 kernel set, forced as "Prescott", under another name
    # (Katmai in 0.3.31): what matters is that it is neither of the AVX2/AVX-512 families.
    names = corenames_under("Prescott")
    if not names:
        pytest.skip("no OpenBLAS loaded (numpy built against another BLAS)")
    assert not {"Haswell", "SkylakeX", "Zen", "Cooperlake", "SapphireRapids"} & set(names)
