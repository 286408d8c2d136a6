"""How many threads numpy's BLAS uses, set from inside the process.

``OPENBLAS_NUM_THREADS`` is read once, when numpy loads its OpenBLAS; afterwards only the
library's own ``openblas_set_num_threads`` changes it (what threadpoolctl calls). The book uses
one thread for two reasons: timings on a shared machine measure the algorithm rather than threads
waiting for busy cores, and small matmuls skip the cost of waking the other threads. OpenBLAS
splits a product's output, not its sums, so the results are the same on any number of threads.
"""
import contextlib
import ctypes
import functools


def _openblas_libraries():
    """Every OpenBLAS shared library loaded in this process (numpy and scipy each bundle one);
    [] where none is found (another BLAS, or no /proc to list the loaded libraries)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return []
    libs = []
    for path in paths:
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libs


@functools.lru_cache(maxsize=None)
def openblas_thread_functions():
    """[(get, set), ...] for each OpenBLAS library loaded in this process; [] where none is
    found (another BLAS, or no /proc to list the loaded libraries)."""
    found = []
    for lib in _openblas_libraries():
        for name in ("scipy_openblas64_", "scipy_openblas", "openblas64_", "openblas"):
            # numpy's wheels prefix the symbols (scipy_openblas*) and may suffix them (64_)
            prefix, suffix = (name[:-3], "64_") if name.endswith("64_") else (name, "")
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                found.append((get, set_))
                break
    return found


@contextlib.contextmanager
def blas_threads(n=1):
    """Run the enclosed code with ``n`` OpenBLAS threads, then restore the previous counts.

    Yields how many BLAS libraries it controlled (0 where none was found: then it does nothing).
    """
    controlled = []
    for get, set_ in openblas_thread_functions():
        controlled.append((set_, int(get())))
        set_(int(n))
    try:
        yield len(controlled)
    finally:
        for set_, previous in controlled:
            set_(previous)


def openblas_corenames():
    """The kernel family each loaded OpenBLAS runs ("Haswell", "SkylakeX", "Zen", ...), as the
    library reports it. OpenBLAS picks it from the CPU at load time unless ``OPENBLAS_CORETYPE``
    forces one; the book's stored outputs must not depend on it (see ``make test-notebooks``).
    [] where no OpenBLAS is found."""
    names = []
    for lib in _openblas_libraries():
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                       "openblas_get_corename64_", "openblas_get_corename"):
            get = getattr(lib, symbol, None)
            if get is not None:
                get.restype = ctypes.c_char_p
                names.append(get().decode())
                break
    return names
