"""The process a bert_of command runs in: its set-up, and every signal rule of bert_of.

OneFlow 0.9's ``import oneflow`` installs a C SIGINT handler over Python's, adds WORLD_SIZE, RANK,
MASTER_* (and more) to os.environ, writes a start-up line on fd 2, and a rank reaching the rendezvous
before rank 0 listens sleeps 10 s; :func:`oneflow_import` and :func:`wait_for_rank0` undo that.
Remove those two when ``python -c 'import os; e = set(os.environ); import oneflow; print(set(os.environ) - e)'``
prints ``set()`` with nothing on stderr and Ctrl-C in a bare ``import oneflow`` script raises
KeyboardInterrupt (the signal rules below are bert_of's own and stay).

Importing bert_of changes nothing in the process. A command line (``bert-of``, ``python -m
bert_of.cli``, the sub-CLIs) and every rank the launcher starts call :func:`setup` once, first:

- SIGINT and SIGTERM get the command's handler: inside a command (:func:`command`) the signal
  raises KeyboardInterrupt / :class:`~bert_of.errors.Terminated` in the main thread, which unwinds
  every ``with publishing(...)`` (no staging folder stays behind); outside one (start-up,
  shutdown), in a forked worker, at a second signal, or while OneFlow's C++ may be on the stack,
  the process prints one line and ends BY the signal at once (the shell sees 130 / 143; only a
  death by the signal stops a shell loop: bash takes a child's normal exit 130 as handled);
- NumPy is imported with SIGINT / SIGTERM blocked, so the threads its BLAS starts never take one
  (see :func:`oneflow_import` for why that matters);
- OneFlow's import, whenever it comes, is prepared for a command: a rank other than 0 first waits
  for rank 0's port (OneFlow's start-up line on fd 2 is dropped in every process).

:func:`oneflow_import` wraps ``import oneflow`` in every process, set up or not: signals blocked
around it, Python's SIGINT handler put back over the C one liboneflow installs, the environment
variables it adds removed (WORLD_SIZE, RANK, MASTER_*, ...), its own OpenBLAS given its AVX2/FMA
kernels unless BERT_OF_BLAS=exact (:mod:`bert_of.runtime.blas` chooses the BLAS its GEMMs call). Only this module handles, blocks or sends signals (:func:`uninterrupted` keeps short
steps whole; :func:`stop_groups` stops child process groups, :func:`as_worker` and
:func:`die_with_parent` set up children).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

# ctypes, socket, tempfile and threading are imported where used: this module is the first a command
# line imports, and until setup() has run a Ctrl-C is Python's (a traceback), so it loads little

from bert_of.errors import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
ERROR_PREFIX = "bert-of: error: "

# pid: the process set up (a fork is not); depth: commands running (they nest: pretrain registers
# its checkpoint through the zoo's command); stopping: the signal that is ending this command.
_STATE = {"pid": None, "depth": 0, "stopping": None}
_DEFER = {"depth": 0, "pending": None}
_NOTE = {"text": ""}  # what the one line of a stopped command adds (interrupt_note)
_AT_ABRUPT_END = []  # callables run before the process ends at once (bert_of.files.atomic: unfinished writes)


# --------------------------------------------------------------------------- set-up


def setup() -> None:
    """Make this process a bert_of command's (see the module doc). Main thread; idempotent."""
    if _STATE["pid"] != os.getpid():
        _STATE.update(pid=os.getpid(), depth=0, stopping=None)
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not _on_signal:
            signal.signal(sig, _on_signal)
    if "numpy" not in sys.modules:
        with signals_blocked():
            import numpy  # noqa: F401 - its BLAS threads start now, with the signals blocked


def is_set_up() -> bool:
    return _STATE["pid"] == os.getpid()


def as_worker() -> None:
    """In a worker process a command forked: Ctrl-C is the parent's (it stops the workers), SIGTERM
    ends the worker at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def die_with_parent(parent: int) -> None:
    """Be killed when process ``parent`` (the one that started this one) dies, even by SIGKILL (Linux;
    elsewhere a no-op). Exits at once if it is already gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


@contextlib.contextmanager
def signals_blocked():
    """SIGINT and SIGTERM blocked in this thread for the block (threads started inside inherit that);
    one that arrives meanwhile is delivered when it ends."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


# --------------------------------------------------------------------------- a command's signals


@contextlib.contextmanager
def command():
    """A command runs: a signal now raises KeyboardInterrupt / Terminated in the main thread. The
    outermost command returns with OneFlow drained (:func:`drain_oneflow`): what the caller does next
    (a test harness, a library user's loop) meets no native work still running."""
    if _STATE["depth"] == 0:
        _STATE["stopping"] = None
        _NOTE["text"] = ""
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if _STATE["depth"] == 0:
            drain_oneflow()


# --------------------------------------------------------------------------- the environment


def drain_oneflow() -> None:
    """Wait until OneFlow, if this process loaded it, has run every instruction it was given: its
    worker threads are then idle. Eager OneFlow is asynchronous, so a call that returned may still
    have kernels (and a dropped graph's teardown) running behind it."""
    flow = sys.modules.get("oneflow")
    internal = getattr(flow, "_oneflow_internal", None)
    if internal is None or not hasattr(internal, "eager"):  # not loaded, or half-imported
        return
    try:
        internal.eager.Sync()
    except Exception:  # noqa: BLE001 - shutting down / a failed run: nothing left to drain
        pass


def set_environ(values: dict, keep_existing: bool = False) -> None:
    """The one way bert_of changes ``os.environ`` (a value None removes the variable).

    OneFlow's worker threads call getenv for every kernel they launch (DNNL_DEFAULT_FPMATH_MODE,
    ONEFLOW_KERNEL_*), and setenv of a new name reallocates the C environment array under them: a
    segfault within seconds when a thread writes the environment while kernels run, none in 20 s of
    the same writes with OneFlow idle (tests/e2e/test_stress.py). So OneFlow is drained first.
    ``keep_existing``: only names not set yet are written (``os.environ.setdefault``)."""
    todo = {k: v for k, v in values.items()
            if os.environ.get(k) != v and not (keep_existing and k in os.environ)}
    if not todo:
        return
    drain_oneflow()
    for k, v in todo.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def interrupt_note(text) -> None:
    """While a command runs, the words its one line adds if a signal stops it now (a training run:
    the ``--resume`` command and the step it continues from); "" for none. A callable is asked when
    the signal comes (what is on disk then)."""
    _NOTE["text"] = text


def _note() -> str:
    text = _NOTE["text"]
    if callable(text):
        try:
            return text()
        except Exception:  # noqa: BLE001 - the line is said anyway, without the note
            return ""
    return text


def stopped(e: KeyboardInterrupt, note: str = "") -> int:
    """One line for a command stopped by Ctrl-C or SIGTERM; its exit status (130 / 143)."""
    signum = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
    _STATE["stopping"] = signum
    _say(WORDS[signum] + (note or _note()))
    return 128 + signum


def end_if_stopped(code: int) -> int:
    """A command line's last step: a command stopped by a signal ends the process by that signal
    (it does not return); any other status is returned."""
    if _STATE["stopping"] and code == 128 + _STATE["stopping"]:
        die(_STATE["stopping"])
    return code


def at_abrupt_end(fn) -> None:
    """Run ``fn()`` before the process ends at once on a signal (no unwinding then)."""
    _AT_ABRUPT_END.append(fn)


def _say(msg: str) -> None:
    print(ERROR_PREFIX + msg, file=sys.stderr)


def _on_signal(signum, frame):
    if os.getpid() != _STATE["pid"]:  # a forked worker: its parent unwinds and reports
        die(signum)
    if _DEFER["depth"]:  # inside a step a signal must not split: raised again at its end
        _DEFER["pending"] = _DEFER["pending"] or signum
        return
    if not _STATE["depth"] or _STATE["stopping"]:
        _say(WORDS[signum])
        die(signum)
    _STATE["stopping"] = signum
    if "oneflow" in sys.modules:
        # An exception raised now may unwind through OneFlow's C++ (a pybind11 call, a graph run)
        # and abort the process (SIGABRT/SIGSEGV, half-written output): clean up and end here.
        _say(WORDS[signum] + _note())
        for fn in _AT_ABRUPT_END:
            fn()
        die(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def die(signum: int) -> None:
    """End this process by ``signum`` (default action), with stdout/stderr flushed."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass
    import threading

    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    # Sent to THIS thread, it is delivered before the call returns. Sent to the process, another
    # thread with the signal unblocked (a reader's pool) could take it while this one reaches _exit
    # first: a normal exit 130, which a shell loop takes as handled.
    signal.pthread_kill(threading.get_ident(), signum)
    os._exit(128 + signum)  # not reached


def how_it_ended(returncode: int) -> str:
    """A child's exit status in words: "killed by SIGKILL", "exited with status 1"."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def stop_groups(procs, grace: float) -> None:
    """SIGTERM the process group each live ``subprocess.Popen`` of ``procs`` leads, SIGKILL what is
    left after ``grace`` seconds, and reap them all."""
    def send(sig):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    send(signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    send(signal.SIGKILL)
    for p in procs:
        p.wait()


@contextlib.contextmanager
def uninterrupted():
    """A step Ctrl-C / SIGTERM must not split (creating a staging folder or temp file and taking
    charge of it, swapping a tree in): a signal that arrives inside waits for the end of the block."""
    _DEFER["depth"] += 1
    try:
        yield
    finally:
        _DEFER["depth"] -= 1
        if not _DEFER["depth"] and _DEFER["pending"]:
            sig, _DEFER["pending"] = _DEFER["pending"], None
            signal.raise_signal(sig)


# --------------------------------------------------------------------------- OneFlow's import


# What OneFlow 0.9's import writes to stderr on every machine without RDMA (it uses InfiniBand only
# for multi-node transfers, which this CPU/TCP setup never does).
_NOISE = (b"libibverbs not available, ibv_fork_init skipped",)


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


def _import_environment() -> dict:
    """Variables OneFlow's start-up reads, for its import only. glog's "CUDA driver version is
    insufficient" on CPU-only machines is noise. OneFlow 0.9's bundled DYNAMIC_ARCH OpenBLAS does not
    recognise recent Xeons and runs its SSE3 "Prescott" kernels; its Haswell (AVX2+FMA) kernels do the
    same GEMMs faster (bench/blas_bench.py: ``exact`` vs ``oneflow``), so they run unless BERT_OF_BLAS=exact (they serve the GEMMs only with
    BERT_OF_BLAS=oneflow, or when no threaded BLAS is installed: bert_of.runtime.blas). An OPENBLAS_CORETYPE
    the user set always wins; the threaded BLAS has loaded by now and detected the CPU itself.
    ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD=0 (without a CUDA driver, unless the user set it): OneFlow's VM
    scheduler runs CPU kernels itself instead of spinning beside a worker thread that runs them
    (docs/ranks.md); :mod:`bert_of.runtime.flow_import` makes OneFlow read it during the import."""
    extra = {}
    if "ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD" not in os.environ and not os.path.exists("/proc/driver/nvidia"):
        extra["ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD"] = "0"  # read while the import lasts: flow_import.py
    if "GLOG_minloglevel" not in os.environ:
        extra["GLOG_minloglevel"] = "3"
    if os.environ.get("BERT_OF_BLAS", "").lower() != "exact" and "OPENBLAS_CORETYPE" not in os.environ \
            and _has_avx2_fma():
        extra["OPENBLAS_CORETYPE"] = "Haswell"
    return extra


def wait_for_rank0(timeout: float = 60.0) -> None:
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
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.02)


@contextlib.contextmanager
def _stderr_filtered():
    """fd 2 goes to a temporary file for the block; everything written there except OneFlow's
    start-up line is passed on unchanged afterwards, errors included."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to filter
        yield
        return
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        with uninterrupted():  # a signal that reaches the handler anyway waits until fd 2 is back
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                kept = [ln for ln in tmp.read().splitlines(keepends=True) if not ln.strip().startswith(_NOISE)]
                if kept:
                    os.write(2, b"".join(kept))


@contextlib.contextmanager
def oneflow_import():
    """``with oneflow_import(): import oneflow``, leaving the process as it was: liboneflow's static
    initialiser installs a C handler for SIGINT that calls exit(-1) (Ctrl-C would end the process
    with status 255, skipping Python's clean-up and its handler), and its start-up puts MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK and CUDA_MODULE_LOADING into os.environ (read once,
    while it starts). SIGINT and SIGTERM stay blocked in this thread during the import (the threads
    OneFlow starts inherit that; :func:`setup` imports NumPy the same way, so no native thread takes
    a signal while OneFlow's handler is in place), Python's handler is set again, a signal that
    arrived meanwhile is delivered to it, and os.environ is put back as it was. OneFlow's start-up
    line is dropped (in a command and in a Python program alike); in a process that was
    :func:`setup`, a rank first waits for rank 0."""
    if "oneflow" in sys.modules:
        yield
        return
    if is_set_up():
        wait_for_rank0()
    import threading

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    with signals_blocked() if main else contextlib.nullcontext():  # a signal waits until all is put back
        before = dict(os.environ)
        try:
            set_environ(_import_environment())
            with _stderr_filtered():  # a Python program using bert_of gets no OneFlow noise either
                yield
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            set_environ({**{k: None for k in set(os.environ) - set(before)}, **before})
