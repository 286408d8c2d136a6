"""How many threads numpy's BLAS uses, set from inside the process, and which kernels it runs.

``OPENBLAS_NUM_THREADS`` is read once, when numpy loads its OpenBLAS; afterwards only the
library's own ``openblas_set_num_threads`` changes it. threadpoolctl finds every BLAS loaded in the
process (numpy and scipy each bundle an OpenBLAS; another build may bring MKL or BLIS) and calls
those functions, on Linux, macOS and Windows alike; this module is the book's small interface to it.

The book uses one thread for two reasons: timings on a shared machine measure the algorithm rather
than threads waiting for busy cores, and small matmuls skip the cost of waking the other threads.
OpenBLAS splits a product's output, not its sums, so the results are the same on any number of
threads.
"""
import contextlib
import numbers

from threadpoolctl import ThreadpoolController

__all__ = ["blas_threads", "blas_libraries", "openblas_corenames", "openblas_thread_functions"]


def _controllers(internal_api=None):
    """threadpoolctl's controllers of the BLAS libraries loaded now (libraries load when numpy or
    scipy.linalg is imported, so the list is read anew on every call). ``internal_api="openblas"``
    keeps only OpenBLAS."""
    selected = ThreadpoolController().select(user_api="blas")
    if internal_api is not None:
        selected = selected.select(internal_api=internal_api)
    return selected.lib_controllers


def blas_libraries():
    """One dict per BLAS library loaded in this process: ``internal_api`` ("openblas", "mkl",
    "blis"), ``version``, ``num_threads``, ``architecture`` (the kernel family, where the library
    reports one) and ``filepath``. [] where numpy uses a BLAS threadpoolctl does not know (e.g.
    Apple's Accelerate)."""
    return [lib.info() for lib in _controllers()]


def openblas_thread_functions():
    """[(get, set), ...]: the thread-count getter and setter of each OpenBLAS loaded in this process
    (``get()`` returns the count, ``set(n)`` changes it); [] where numpy uses another BLAS."""
    return [(lib.get_num_threads, lib.set_num_threads) for lib in _controllers("openblas")]


@contextlib.contextmanager
def blas_threads(n=1):
    """Run the enclosed code with ``n`` BLAS threads in every BLAS library loaded (OpenBLAS, MKL or
    BLIS), then restore each library's previous count.

    Yields how many libraries it controlled: 0 where numpy's BLAS is one threadpoolctl cannot
    control (then the code runs with the library's own threads).
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n: expected a positive integer number of BLAS threads; got {n!r}")
    libs = _controllers()
    previous = [lib.get_num_threads() for lib in libs]
    for lib in libs:
        lib.set_num_threads(int(n))
    try:
        yield len(libs)
    finally:
        for lib, count in zip(libs, previous):
            lib.set_num_threads(count)


def openblas_corenames():
    """The kernel family each loaded OpenBLAS runs ("Haswell", "SkylakeX", "Zen", ...), as the
    library reports it. OpenBLAS picks it from the CPU at load time unless ``OPENBLAS_CORETYPE``
    forces one; the book's stored outputs must not depend on it (see ``make test-notebooks``).
    [] where no OpenBLAS is loaded."""
    return [lib.architecture for lib in _controllers("openblas") if lib.architecture]
