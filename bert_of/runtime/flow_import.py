"""Import OneFlow on machines without CUDA libraries installed system-wide.

OneFlow 0.9's only wheel links libcublas.so.11 / libcudnn*.so.8, which pip's nvidia-* wheels ship
off the loader path. Remove the preloading when a OneFlow wheel imports on a machine without
system-wide CUDA libraries and no preload (a CPU wheel, or one that finds pip's CUDA wheels itself).

OneFlow 0.9's only wheel is a CUDA build whose core links libcublas.so.11 and
libcudnn*.so.8. The pip packages nvidia-cublas-cu11 / nvidia-cudnn-cu11 ship
them, but not on the loader path; loading them RTLD_GLOBAL first (in
dependency order) lets ``import oneflow`` resolve them, with or without a GPU.

Before it, :mod:`bert_of.runtime.oneflow_fix` loads the guard against OneFlow 0.9's graph-launch race and
:mod:`bert_of.runtime.blas` the BLAS its CPU kernels call (BERT_OF_BLAS).

This is the one module that imports OneFlow; the rest of bert_of reaches it (and the CPU kernels)
through :mod:`bert_of._flow`. OneFlow is the optional ``oneflow`` extra: without
it, importing this module raises :class:`bert_of.errors.NeedsOneFlow` (an ImportError and a
BertOfError), which a command line prints as one line naming the extra.
"""

import ctypes
import os
import sys

import bert_of.runtime.blas as blas
import bert_of.runtime.oneflow_fix as oneflow_fix
from bert_of.errors import NeedsOneFlow
from bert_of.runtime.process import oneflow_import, signals_blocked

_LIBS = (
    "nvidia/cublas/lib/libcublasLt.so.11",
    "nvidia/cublas/lib/libcublas.so.11",
    "nvidia/cudnn/lib/libcudnn_ops_infer.so.8",
    "nvidia/cudnn/lib/libcudnn_ops_train.so.8",
    "nvidia/cudnn/lib/libcudnn_cnn_infer.so.8",
    "nvidia/cudnn/lib/libcudnn_cnn_train.so.8",
)


def _preload():
    if "oneflow" in sys.modules:
        return
    for base in sys.path:
        if os.path.isfile(os.path.join(base, _LIBS[0])):
            for rel in _LIBS:
                ctypes.CDLL(os.path.join(base, rel), mode=ctypes.RTLD_GLOBAL)
            return
    # No pip-installed libs: hope they are on the system loader path.


def _load():
    try:
        import oneflow
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "oneflow":  # OneFlow there, one of its own imports missing: a bug
            raise
        raise NeedsOneFlow() from None
    except ImportError as e:  # Ctrl-C inside OneFlow's C++ start-up arrives as an ImportError
        if str(e).startswith("KeyboardInterrupt"):
            raise KeyboardInterrupt from None
        raise
    return oneflow


_preload()
oneflow_fix.install()  # before liboneflow loads: its graph-launch race guarded (bert_of/runtime/oneflow_fix.py)
with signals_blocked():  # the BLAS starts its threads now: they must never take SIGINT / SIGTERM
    blas.install()  # before liboneflow loads: its CBLAS calls go to a threaded BLAS (bert_of/runtime/blas.py)
def _first_stream(oneflow):
    """Create OneFlow's CPU compute stream now, while the import's environment holds: each stream
    reads ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD when created, and this thread keeps the value it read
    first (OneFlow 0.9's thread-local environment cache), so the streams this thread creates later
    follow it too (bert_of.runtime.process._import_environment says why it is set)."""
    oneflow.zeros(1).numpy()


with oneflow_import():  # leaves signals, fd 2 and os.environ as they were (bert_of.runtime.process)
    flow = _load()
    _first_stream(flow)
oneflow_fix.after_import()

__all__ = ["flow"]
