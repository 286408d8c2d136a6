"""preln.blas (on threadpoolctl): the thread count of every loaded BLAS is set and restored, the
kernel OpenBLAS runs can be read back, and OPENBLAS_CORETYPE forces it.

`make test-notebooks` runs every notebook under several forced kernels; the coretype tests check
that forcing one really changes what numpy runs, so that matrix tests what it claims to. Each probe
runs in a fresh interpreter: OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS once, when
it loads."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from preln.blas import blas_libraries, blas_threads, openblas_corenames, openblas_thread_functions

HAVE_AVX512 = os.path.exists("/proc/cpuinfo") and "avx512f" in open("/proc/cpuinfo").read()


def probe(code, **env_vars):
    """Run ``code`` (after importing numpy and scipy.linalg, which load their OpenBLAS builds) in a
    fresh interpreter with OPENBLAS_* set as given (None: unset); return its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env.update({k: v for k, v in env_vars.items() if v is not None})
    out = subprocess.run([sys.executable, "-c", "import numpy, scipy.linalg\n" + code], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return out.stdout


def corenames_under(coretype):
    return probe("from preln.blas import openblas_corenames as f; print(*f())",
                 OPENBLAS_CORETYPE=coretype).split()


def test_finds_numpys_blas():
    libs = blas_libraries()
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    if not libs:
        pytest.skip(f"numpy's BLAS ({blas}) is not one threadpoolctl knows")
    assert {lib["internal_api"] for lib in libs} <= {"openblas", "mkl", "blis", "flexiblas"}
    # numpy's bundled OpenBLAS is among them (its wheels on Linux, Windows and Intel macOS)
    if "openblas" in blas:
        assert any("numpy" in lib["filepath"] for lib in libs if lib["internal_api"] == "openblas")


def test_blas_threads_sets_and_restores_every_library():
    import scipy.linalg  # noqa: F401  (loads scipy's own OpenBLAS: both must be controlled)
    before = [lib["num_threads"] for lib in blas_libraries()]
    if not before:
        pytest.skip("no BLAS that threadpoolctl can control is loaded")
    target = 3 if before != [3] * len(before) else 2
    with blas_threads(target) as n:
        assert n == len(before)
        assert [lib["num_threads"] for lib in blas_libraries()] == [target] * n
        a = np.ones((64, 64))
        assert np.array_equal(a @ a, np.full((64, 64), 64.0))   # BLAS still computes
    assert [lib["num_threads"] for lib in blas_libraries()] == before


def test_restores_the_count_after_an_exception():
    before = [get() for get, _ in openblas_thread_functions()]
    if not before:
        pytest.skip("no OpenBLAS loaded")
    with pytest.raises(KeyError):
        with blas_threads(1):
            assert [get() for get, _ in openblas_thread_functions()] == [1] * len(before)
            raise KeyError("inside")
    assert [get() for get, _ in openblas_thread_functions()] == before


def test_overrides_openblas_num_threads_from_the_environment():
    # OPENBLAS_NUM_THREADS=2 is read at load; only the library's setter changes it afterwards
    code = ("from preln.blas import blas_threads, blas_libraries as libs\n"
            "import json\n"
            "out = [[l['num_threads'] for l in libs()]]\n"
            "with blas_threads(1):\n    out.append([l['num_threads'] for l in libs()])\n"
            "out.append([l['num_threads'] for l in libs()])\n"
            "print(json.dumps(out))")
    before, inside, after = json.loads(probe(code, OPENBLAS_NUM_THREADS="2"))
    if not before:
        pytest.skip("no BLAS that threadpoolctl can control is loaded")
    assert before == after == [2] * len(before) and inside == [1] * len(before)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None, True])
def test_rejects_a_thread_count_that_is_not_a_positive_integer(bad):
    with pytest.raises(ValueError, match="n: expected a positive integer number of BLAS threads"):
        with blas_threads(bad):
            pass


def test_corenames_reports_the_loaded_openblas():
    names = openblas_corenames()
    if not openblas_thread_functions():
        pytest.skip("no OpenBLAS loaded in this process (numpy built against another BLAS)")
    assert names and all(isinstance(n, str) and n for n in names)


@pytest.mark.parametrize("coretype", ["Haswell", "SkylakeX"])
def test_openblas_coretype_forces_the_kernel(coretype):
    default = corenames_under(None)
    if not default:
        pytest.skip("no OpenBLAS loaded (numpy built against another BLAS)")
    if coretype == "SkylakeX" and not HAVE_AVX512:
        pytest.skip("this CPU has no AVX-512: OpenBLAS would not run SkylakeX kernels")
    assert set(corenames_under(coretype)) == {coretype}


def test_prescott_is_the_generic_kernel():
    # OpenBLAS reports its generic SSE3 kernel set, forced as "Prescott", under another name
    # (Katmai in 0.3.31): what matters is that it is neither of the AVX2/AVX-512 families.
    names = corenames_under("Prescott")
    if not names:
        pytest.skip("no OpenBLAS loaded (numpy built against another BLAS)")
    assert not {"Haswell", "SkylakeX", "Zen", "Cooperlake", "SapphireRapids"} & set(names)
