"""Import OneFlow on machines without CUDA libraries installed system-wide.

OneFlow 0.9's only wheel is a CUDA build whose core links libcublas.so.11 and
libcudnn*.so.8. The pip packages nvidia-cublas-cu11 / nvidia-cudnn-cu11 ship
them, but not on the loader path; loading them RTLD_GLOBAL first (in
dependency order) lets ``import oneflow`` resolve them, with or without a GPU.
"""

import ctypes
import os
import signal
import socket
import sys
import tempfile
import threading
import time

from bert_of.fs import uninterrupted

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


def _has_avx2_fma() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split()
                    return "avx2" in flags and "fma" in flags
    except OSError:
        pass
    return False


def _choose_blas():
    """BERT_OF_BLAS=fast (set by `bert-of pretrain` / `finetune`): OneFlow 0.9's bundled
    DYNAMIC_ARCH OpenBLAS does not recognise recent Xeons and runs its SSE3 "Prescott"
    kernels; its Haswell (AVX2+FMA) kernels do the same GEMMs 3x faster. FMA rounds
    differently, so exact-by-default work (convert, verify) keeps the detected kernels.
    An OPENBLAS_CORETYPE the user set always wins."""
    if os.environ.get("BERT_OF_BLAS") == "fast" and "OPENBLAS_CORETYPE" not in os.environ and _has_avx2_fma():
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


_NOISE = (b"libibverbs not available, ibv_fork_init skipped",)


def _load():
    try:
        import oneflow
    except ImportError as e:  # Ctrl-C inside OneFlow's C++ start-up arrives as an ImportError
        if str(e).startswith("KeyboardInterrupt"):
            raise KeyboardInterrupt from None
        raise
    return oneflow


def _import_oneflow():
    """``import oneflow`` without the line its C++ start-up writes to stderr on every machine
    without RDMA ("libibverbs not available, ibv_fork_init skipped": OneFlow only uses InfiniBand
    for multi-node transfers, which this CPU/TCP setup never does). fd 2 goes to a temporary file
    during the import; everything else written there is passed on unchanged, errors included."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to filter
        return _load()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            return _load()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().splitlines(keepends=True) if not ln.strip().startswith(_NOISE)]
            if kept:
                os.write(2, b"".join(kept))


_preload()
_choose_blas()
# glog's "CUDA driver version is insufficient" on CPU-only machines is noise.
os.environ.setdefault("GLOG_minloglevel", "3")
def _import_keeping_sigint():
    """liboneflow's static initialiser installs a C handler for SIGINT that calls exit(-1): Ctrl-C
    would end the process with status 255, skipping Python's clean-up (staging folders, the
    one-line message, exit 130). SIGINT and SIGTERM stay blocked in this thread during the import
    (the threads OneFlow starts inherit that), Python's handler is set again (Python still
    reports it as current), and a signal that arrived meanwhile is delivered to it on unblocking.
    bert_of/__init__.py imports NumPy the same way, so no native thread takes a signal."""
    if threading.current_thread() is not threading.main_thread():
        return _import_oneflow()
    previous = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        with uninterrupted():  # a signal that reaches the handler anyway waits until fd 2 is back
            module = _import_oneflow()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return module


def _wait_for_rank0(timeout: float = 60.0) -> None:
    """In a rank other than 0: wait until rank 0 accepts connections on MASTER_ADDR:MASTER_PORT.
    ``import oneflow`` joins the ranks' rendezvous, and a rank that gets there before rank 0 listens
    is told "unavailable" and sleeps a fixed 10 s before asking again (OneFlow 0.9's
    RpcClient::LoadServer). Ranks start together, so about every other launch lost 10 s. Past
    ``timeout``, OneFlow's own retries take over (they give up after 10 minutes)."""
    try:
        rank, world = int(os.environ.get("RANK", "-1")), int(os.environ.get("WORLD_SIZE", "1"))
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        return
    if world <= 1 or rank <= 0:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.02)


if "oneflow" not in sys.modules:
    _wait_for_rank0()
flow = _import_keeping_sigint()

__all__ = ["flow"]
