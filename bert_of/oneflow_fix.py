"""The guard against OneFlow 0.9's graph-launch race, built and loaded before OneFlow.

OneFlow 0.9 hands an ``nn.Graph`` run to its actors before it queues the run in its lazy-job
queue, and the run's end takes it off that queue: when the launching thread is descheduled between
the two, a short run ends first and pops an empty ``std::queue``. The process then segfaults or hangs at
random: 4 of 5 processes launching a small CPU graph 20,000 times crashed within 3,000 launches
(``bench/graph_launch_race.py``; the suite's crashes in ``infer``). ``oneflow_fix.c`` takes
the place of the two queue methods (liboneflow calls them through its PLT) and keeps the queue in
order; this module compiles it once with the system's C compiler into bert_of's cache and loads it
RTLD_GLOBAL before ``import oneflow`` (:mod:`bert_of._flow`).

``BERT_OF_ONEFLOW_FIX=0`` leaves OneFlow as it is (to see the race). Without a C compiler the guard
is off and :func:`status` says why; ``bert-of selftest`` reports it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oneflow_fix.c")
_lib = None
_why_off = "not loaded (OneFlow not imported yet)"


def _cache_dirs() -> list:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "bert_of", "native"),
            os.path.join(tempfile.gettempdir(), f"bert_of-native-{os.getuid()}")]


class _CompileError(OSError):
    pass


def _compile(cc: str, lib: str) -> None:
    tmp = f"{lib}.{os.getpid()}.tmp"
    try:
        run = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, SOURCE, "-ldl", "-lpthread"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise _CompileError(f"{cc}: {e}") from None
    if run.returncode != 0:
        raise _CompileError(f"{cc} failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    os.replace(tmp, lib)  # ranks building at once: each renames a whole file


def _build(source: bytes) -> str:
    """The shared library for ``source`` (compiled once per source and machine, then reused)."""
    tag = hashlib.sha256(source + platform.machine().encode()).hexdigest()[:16]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    last = "no writable cache folder"
    for folder in _cache_dirs():
        lib = os.path.join(folder, f"oneflow_fix-{tag}.so")
        if os.path.isfile(lib):
            return lib
        if not cc:
            raise OSError("no C compiler (cc) to build it")
        try:
            os.makedirs(folder, exist_ok=True)
            _compile(cc, lib)
            return lib
        except _CompileError:
            raise
        except OSError as e:  # this folder is not writable: the next one
            last = f"{folder}: {e.strerror or e}"
    raise OSError(last)


def install() -> None:
    """Load the guard (before OneFlow; a no-op once OneFlow is loaded or with BERT_OF_ONEFLOW_FIX=0)."""
    global _lib, _why_off
    if _lib is not None or "oneflow" in sys.modules:
        return
    if os.environ.get("BERT_OF_ONEFLOW_FIX", "1") == "0":
        _why_off = "off (BERT_OF_ONEFLOW_FIX=0)"
        return
    try:
        with open(SOURCE, "rb") as f:
            _lib = ctypes.CDLL(_build(f.read()), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as e:
        _why_off = f"off: {e}"
        return
    _lib.bert_of_oneflow_fix_launches.restype = ctypes.c_long
    _lib.bert_of_oneflow_fix_reordered.restype = ctypes.c_long


def after_import() -> None:
    """Bind the guard to liboneflow's own methods now (OneFlow is loaded), not in a graph's thread."""
    global _lib, _why_off
    if _lib is not None and not _lib.bert_of_oneflow_fix_ready():
        _lib, _why_off = None, "off: liboneflow's lazy-job queue methods not found (not OneFlow 0.9?)"


def status() -> dict:
    """{"active": bool, "launches": graph runs queued through it, "reordered": runs that ended
    before their launch queued them (each a crash without the guard), "why": when off}."""
    if _lib is None:
        return {"active": False, "why": _why_off}
    return {"active": True, "launches": int(_lib.bert_of_oneflow_fix_launches()),
            "reordered": int(_lib.bert_of_oneflow_fix_reordered())}
