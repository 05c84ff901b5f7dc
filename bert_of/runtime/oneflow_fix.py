"""The guard against OneFlow 0.9's graph-launch race, built and loaded before OneFlow.

OneFlow 0.9 queues an ``nn.Graph`` run only after handing it to its actors, so a short run can end
first and pop an empty queue: a random segfault or hang. Remove this guard when
``bench/graph_launch_race.py`` on a new OneFlow shows every "without guard" trial finished (none
crashed or hung; bench/results/graph_launch_race.json holds OneFlow 0.9's count).

OneFlow 0.9 hands an ``nn.Graph`` run to its actors before it queues the run in its lazy-job
queue, and the run's end takes it off that queue: when the launching thread is descheduled between
the two, a short run ends first and pops an empty ``std::queue``. The process then segfaults or hangs at
random (``bench/graph_launch_race.py``; the suite's crashes in ``infer``). ``oneflow_fix.c`` takes
the place of the two queue methods (liboneflow calls them through its PLT) and keeps the queue in
order; this module builds it once (:func:`bert_of.runtime.native.build`) and loads it
RTLD_GLOBAL before ``import oneflow`` (:mod:`bert_of._flow`).

``BERT_OF_ONEFLOW_FIX=0`` leaves OneFlow as it is (to see the race). Without a C compiler the guard
is off and :func:`status` says why; ``bert-of selftest`` reports it.
"""

from __future__ import annotations

import ctypes
import os
import sys

import bert_of.runtime.native as native

_lib = None
_why_off = "not loaded (OneFlow not imported yet)"


def install() -> None:
    """Load the guard (before OneFlow; a no-op once OneFlow is loaded or with BERT_OF_ONEFLOW_FIX=0)."""
    global _lib, _why_off
    if _lib is not None or "oneflow" in sys.modules:
        return
    if os.environ.get("BERT_OF_ONEFLOW_FIX", "1") == "0":
        _why_off = "off (BERT_OF_ONEFLOW_FIX=0)"
        return
    try:
        _lib = ctypes.CDLL(native.build("oneflow_fix"), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
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
