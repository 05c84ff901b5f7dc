"""The BLAS under OneFlow's CPU kernels: chosen once, before OneFlow loads.

OneFlow 0.9 calls a bundled single-threaded OpenBLAS that misdetects recent Xeons (SSE3 kernels)
for every CPU GEMM. Remove this module when ``bench/blas_bench.py`` on a new OneFlow shows
``BERT_OF_BLAS=exact`` (its own BLAS as it detects the CPU) as fast as ``auto``.

OneFlow 0.9 carries a single-threaded OpenBLAS whose CPU detection predates recent Xeons (it runs
SSE3 kernels there), and its matmuls spend most of a BERT layer's CPU time in it. liboneflow calls
four CBLAS routines through its PLT (``blas_shim.c``), so a shim loaded RTLD_GLOBAL before it hands
them to a threaded library. ``BERT_OF_BLAS`` chooses:

    auto       MKL if the ``mkl`` wheel is installed, else OpenBLAS from ``scipy-openblas32`` (the
               ``oneflow`` extra installs it), else ``oneflow`` with a note (the default)
    mkl        MKL (``pip install mkl``), run-to-run reproducible (MKL_CBWR=AUTO unless set)
    openblas   OpenBLAS from the ``scipy-openblas32`` wheel (pthreads, current CPU kernels)
    oneflow    OneFlow's own OpenBLAS, single-threaded, with its AVX2/FMA kernels where the CPU has them
    exact      OneFlow's own OpenBLAS as it detects the CPU (no FMA on recent Xeons)
    PATH       a shared library exporting ``cblas_sgemm`` (or ``scipy_cblas_sgemm``) and friends

Threads: ``BERT_OF_BLAS_THREADS``, else the CPUs this process may run on (a rank the launcher
pinned gets its share; an unpinned rank an equal part). Results do not depend on the thread count:
both libraries split a GEMM's rows and columns, never its sums (tests/e2e/test_blas.py checks 1 vs 2
threads bit for bit). :func:`status` says what runs; ``bert-of selftest`` reports it with a GEMM rate.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys

import bert_of.runtime.native as native
import bert_of.runtime.process as process
from bert_of.errors import ConfigError

CHOICES = ("auto", "mkl", "openblas", "oneflow", "exact")
ALIASES = {"": "auto"}
_ROUTINES = ("cblas_sgemm", "cblas_dgemm", "cblas_sdot", "cblas_ddot")
_state = {"choice": None, "name": "oneflow", "library": None, "threads": 1, "note": None,
          "version": None, "shim": None, "handle": None, "prefix": ""}
_keep = []  # loaded libraries stay referenced


# A BLAS's idle threads spin for a while after each call by default (OpenBLAS ~0.1 s, Intel OpenMP
# 200 ms). Beside OneFlow's own busy threads that takes the cores from the next kernel: a forward is
# slower with spinning threads than on OneFlow's own BLAS (bench/blas_bench.py; docs/benchmarks.md
# has the figures). The user's own setting wins.
SPIN = {"OPENBLAS_THREAD_TIMEOUT": "4"}  # the minimum: 2^4 cycles


class BlasError(ConfigError):
    """BERT_OF_BLAS names a library that is not installed or cannot serve OneFlow."""


def choice() -> str:
    """BERT_OF_BLAS as a choice in CHOICES, or a library path."""
    raw = os.environ.get("BERT_OF_BLAS", "auto").strip()
    value = ALIASES.get(raw.lower(), raw.lower())
    if value in CHOICES:
        return value
    if os.sep in raw or raw.endswith(".so") or ".so." in raw:
        return raw
    raise BlasError(f"BERT_OF_BLAS={raw!r}: not one of {', '.join(CHOICES)} or a library path")


def uses_oneflow_kernels() -> bool:
    """True when OneFlow's own OpenBLAS does the GEMMs (``oneflow`` / ``exact``, or no other found)."""
    return _state["name"] in ("oneflow", "exact")


def _site_lib_dirs() -> list:
    """Where pip puts wheels' shared libraries (the ``mkl`` and ``intel-openmp`` wheels' data files)."""
    dirs = [os.path.join(sys.prefix, "lib")]
    if sys.base_prefix != sys.prefix:
        dirs.append(os.path.join(sys.base_prefix, "lib"))
    return [d for d in dirs if os.path.isdir(d)]


def find_mkl() -> str | None:
    for d in _site_lib_dirs():
        hits = sorted(glob.glob(os.path.join(d, "libmkl_rt.so*")))
        if hits:
            return hits[-1]
    return None


def find_openblas() -> str | None:
    spec = importlib.util.find_spec("scipy_openblas32")
    for d in (spec.submodule_search_locations or []) if spec else []:
        hits = sorted(glob.glob(os.path.join(d, "lib", "libscipy_openblas*.so*")))
        if hits:
            return hits[0]
    return None


def default_threads() -> int:
    if os.environ.get("BERT_OF_BLAS_THREADS"):
        try:
            n = int(os.environ["BERT_OF_BLAS_THREADS"])
        except ValueError:
            n = 0
        if n < 1:
            raise BlasError(f"BERT_OF_BLAS_THREADS={os.environ['BERT_OF_BLAS_THREADS']!r}: not a positive integer")
        return n
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    world = int(os.environ.get("WORLD_SIZE") or 1)
    if world > 1 and not os.environ.get("BERT_OF_RANK_CPUS"):  # unpinned ranks share the cores
        cpus //= world
    return max(1, cpus)


def _symbols(lib, prefixes) -> tuple:
    for p in prefixes:
        try:
            return p, [ctypes.cast(getattr(lib, p + r), ctypes.c_void_p).value for r in _ROUTINES]
        except AttributeError:
            continue
    return None, None


def _open(kind: str, path: str):
    """(library, symbol prefix, version text) for ``path``; raises OSError / BlasError."""
    if kind == "mkl":
        # Read when MKL / its OpenMP runtime start, so they stay set: reproducible run to run, and
        # threads that sleep as soon as a GEMM ends (see SPIN below).
        process.set_environ({"MKL_CBWR": "AUTO", "KMP_BLOCKTIME": "0"}, keep_existing=True)
        for omp in glob.glob(os.path.join(os.path.dirname(path), "libiomp5.so")):  # intel-openmp's runtime
            _keep.append(ctypes.CDLL(omp, mode=os.RTLD_GLOBAL))
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    else:  # OpenBLAS reads its settings while it loads: set for the load only
        added = {k: v for k, v in SPIN.items() if k not in os.environ}
        process.set_environ(added)
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        finally:
            process.set_environ({k: None for k in added})
    prefix, _ = _symbols(lib, ("", "scipy_"))
    if prefix is None:
        raise BlasError(f"BERT_OF_BLAS: {path} has no {' / '.join(_ROUTINES)} (a CBLAS library with 32-bit integers)")
    version = None
    for fn in (f"{prefix}openblas_get_config", "openblas_get_config"):
        if hasattr(lib, fn):
            getattr(lib, fn).restype = ctypes.c_char_p
            version = getattr(lib, fn)().decode(errors="replace").strip()
            break
    if version is None and hasattr(lib, "mkl_get_version_string"):
        buf = ctypes.create_string_buffer(256)
        lib.mkl_get_version_string(buf, 256)
        version = buf.value.decode(errors="replace").strip()
    return lib, prefix, version


def _set_threads(lib, prefix: str, n: int) -> None:
    if "MKL_NUM_THREADS" in os.environ or "OPENBLAS_NUM_THREADS" in os.environ:
        return  # the user's own setting, read by the library itself
    for fn in (f"{prefix}openblas_set_num_threads", "openblas_set_num_threads", "MKL_Set_Num_Threads"):
        if hasattr(lib, fn):
            getattr(lib, fn)(ctypes.c_int(n))
            return


def _get_threads(lib, prefix: str) -> int | None:
    for fn in (f"{prefix}openblas_get_num_threads", "openblas_get_num_threads", "MKL_Get_Max_Threads"):
        if hasattr(lib, fn):
            return int(getattr(lib, fn)())
    return None


def install() -> None:
    """Load the chosen BLAS and the shim before liboneflow (idempotent; a no-op once OneFlow is
    loaded). Call with SIGINT/SIGTERM blocked: the library starts its threads now."""
    if _state["choice"] is not None or "oneflow" in sys.modules:
        return
    want = choice()
    _state["choice"] = want
    if want in ("oneflow", "exact"):
        _state["name"] = want
        return
    candidates = {"mkl": [("mkl", find_mkl())], "openblas": [("openblas", find_openblas())],
                  "auto": [("mkl", find_mkl()), ("openblas", find_openblas())]}.get(want, [("library", want)])
    found = [(k, p) for k, p in candidates if p]
    if not found:
        if want == "auto":
            _state.update(name="oneflow", note="no threaded BLAS installed (pip install scipy-openblas32): "
                                               "OneFlow's own single-threaded OpenBLAS")
            return
        raise BlasError(f"BERT_OF_BLAS={want}: not installed (pip install "
                        f"{'mkl' if want == 'mkl' else 'scipy-openblas32'})")
    kind, path = found[0]
    if kind == "library" and not os.path.isfile(path):
        raise BlasError(f"BERT_OF_BLAS={path}: no such file")
    if kind == "library" and os.path.basename(path).startswith("libmkl_rt"):
        kind = "mkl"  # MKL named by path: its OpenMP runtime beside it, reproducible mode
    try:  # the shim first: MKL loads its own CBLAS layer RTLD_GLOBAL, which must not come before it
        shim = ctypes.CDLL(native.build("blas_shim"), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
        lib, prefix, version = _open(kind, path)
    except (OSError, BlasError) as e:
        if want == "auto":  # a broken install or no compiler: OneFlow's own BLAS, said once
            _state.update(name="oneflow", note=f"threaded BLAS off ({e}): OneFlow's own OpenBLAS")
            return
        raise e if isinstance(e, BlasError) else BlasError(f"BERT_OF_BLAS={want}: {e}") from None
    _, ptrs = _symbols(lib, (prefix,))
    shim.bert_of_blas_bind(*[ctypes.c_void_p(p) for p in ptrs])
    shim.bert_of_blas_gemms.restype = ctypes.c_long
    threads = default_threads()
    _set_threads(lib, prefix, threads)
    _keep.extend([lib, shim])
    _state.update(name=kind, library=path, version=version, shim=shim, handle=lib, prefix=prefix,
                  threads=_get_threads(lib, prefix) or threads)


def batched_sgemm():
    """The loaded library's ``cblas_sgemm_batch_strided`` (MKL's signature, OpenBLAS >= 0.3.30 too:
    layout, transa, transb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
    batch; 32-bit integers) as a ctypes function, or None (OneFlow's own BLAS, or a library without it).

    Why: OneFlow 0.9's CPU batched matmul calls ``cblas_sgemm`` once per matrix, each call splitting
    one small GEMM over the threads and waiting for them (the attention's 96 [S, S] x [S, 32] products
    of a MiniLM layer at batch 8: ~0.4-1 s at 384 tokens on a shared 2-core machine); the batched
    routine runs the same GEMMs (the same bits: each matrix's own sums) in one call."""
    lib = _state["handle"]
    fn = getattr(lib, _state["prefix"] + "cblas_sgemm_batch_strided", None) if lib is not None else None
    if fn is not None and not getattr(fn, "argtypes", None):
        i, p = ctypes.c_int, ctypes.c_void_p
        fn.argtypes = [i] * 6 + [ctypes.c_float, p, i, i, p, i, i, ctypes.c_float, p, i, i, i]
        fn.restype = None
    return fn


def status() -> dict:
    """{"blas": name, "threads", "library", "version", "gemms": calls routed so far, "note"}."""
    s = {"blas": _state["name"], "threads": _state["threads"], "choice": _state["choice"] or choice()}
    if _state["library"]:
        s.update(library=_state["library"], version=_state["version"],
                 gemms=int(_state["shim"].bert_of_blas_gemms()))
    if _state["note"]:
        s["note"] = _state["note"]
    return s


def describe() -> str:
    """One line: which BLAS runs OneFlow's CPU GEMMs."""
    s = status()
    if s["blas"] in ("oneflow", "exact"):
        kernels = "detected kernels" if s["blas"] == "exact" else "AVX2/FMA kernels where the CPU has them"
        return f"OneFlow's own OpenBLAS (1 thread, {kernels})" + (f"; {s['note']}" if s.get("note") else "")
    name = {"mkl": "MKL", "openblas": "OpenBLAS (scipy-openblas32)"}.get(s["blas"], s.get("library"))
    return f"{name}, {s['threads']} thread{'s' if s['threads'] != 1 else ''}" + (
        f" ({s['version']})" if s.get("version") else "")
