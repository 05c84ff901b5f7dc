"""Small C shims that bert_of compiles once per machine and loads before OneFlow.

OneFlow 0.9 is a binary wheel bert_of cannot patch or rebuild, so its fixes go in as C functions
that take the place of liboneflow's own. Remove this module when its users are gone:
:mod:`~bert_of.runtime.oneflow_fix`, :mod:`~bert_of.runtime.blas` and :mod:`~bert_of.runtime.kernels`
(each says when).

OneFlow 0.9 is a binary wheel; where it needs a fix or a faster library, bert_of puts a few C
functions in front of liboneflow's own (its calls go through the PLT, so a definition loaded
RTLD_GLOBAL first wins): :mod:`bert_of.runtime.oneflow_fix` (its graph-launch race) and
:mod:`bert_of.runtime.blas` (a threaded BLAS); :mod:`bert_of.runtime.kernels` loads one more, its own
(inference kernels; their GELU is the header gelu_vec.h, included from the same folder), and
:mod:`bert_of.runtime.train_kernels` another (training steps). :func:`build` compiles a source with the
system's C compiler into bert_of's cache (``~/.cache/bert_of/native``, else the temp folder) and reuses it.
:class:`Verdicts` keeps the kernels' first-use checks beside the library they checked, so a process
after the first on the same machine, library and OneFlow does not run them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _cache_dirs() -> list:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "bert_of", "native"),
            os.path.join(tempfile.gettempdir(), f"bert_of-native-{os.getuid()}")]


class CompileError(OSError):
    pass


# no contraction: cpu_kernels.c must round each multiply and add as OneFlow's separate kernels do
FLAGS = ("-O2", "-ffp-contract=off", "-shared", "-fPIC")
# per library: cpu_train_kernels.c's AdamW takes square roots in its loop, which GCC vectorises only when
# sqrtf need not set errno (an ``optimize`` attribute does not lift that; the results are the same)
EXTRA_FLAGS = {"cpu_train_kernels": ("-fno-math-errno",)}


def _compile(cc: str, source: str, lib: str, flags: tuple = FLAGS) -> None:
    tmp = f"{lib}.{os.getpid()}.tmp"
    try:
        run = subprocess.run([cc, *flags, "-o", tmp, source, "-ldl", "-lpthread", "-lm"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"{cc}: {e}") from None
    if run.returncode != 0:
        raise CompileError(f"{cc} failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    os.replace(tmp, lib)  # ranks building at once: each renames a whole file


def _source_bytes(source: str) -> bytes:
    """The C file and the headers it includes from this folder (``#include "x.h"``, one level: the
    headers here include none of their own), so a changed header builds a new library."""
    with open(source, "rb") as f:
        text = f.read()
    parts = [text]
    for header in re.findall(rb'^\s*#\s*include\s+"([^"/]+)"', text, re.M):
        with open(os.path.join(HERE, header.decode()), "rb") as f:
            parts.append(f.read())
    return b"\0".join(parts)


def build(name: str) -> str:
    """The shared library built from ``bert_of/<name>.c`` and the headers it includes from this folder
    (compiled once per source and machine, then reused). Raises OSError (no compiler, no writable cache,
    a failed compile)."""
    source = os.path.join(HERE, f"{name}.c")
    flags = FLAGS + EXTRA_FLAGS.get(name, ())
    tag = hashlib.sha256(_source_bytes(source) + platform.machine().encode() + " ".join(flags).encode()).hexdigest()[:16]
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    last = "no writable cache folder"
    for folder in _cache_dirs():
        lib = os.path.join(folder, f"{name}-{tag}.so")
        if os.path.isfile(lib):
            return lib
        if not cc:
            raise OSError("no C compiler (cc) to build it")
        try:
            os.makedirs(folder, exist_ok=True)
            _compile(cc, source, lib, flags)
            return lib
        except CompileError:
            raise
        except OSError as e:  # this folder is not writable: the next one
            last = f"{folder}: {e.strerror or e}"
    raise OSError(last)


KEEP_KEYS = 8
RECHECK = "BERT_OF_CPU_KERNELS_RECHECK"  # =1: run every first-use check again (and keep the new verdicts)


def _cpu() -> str:
    """This CPU as its kernels see it: the machine, the first processor's model name and flags."""
    seen = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "flags", "Features") and key not in seen:
                    seen[key] = value.strip()
                if not line.strip() and seen:
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{seen.get('model name', '')}|{seen.get('flags', seen.get('Features', ''))}"


class Verdicts:
    """The first-use checks' verdicts of one built library, in ``<library>.checks.json`` beside it.

    A check's verdict depends on the library's bytes, this CPU and what ``context`` names (the caller's
    OneFlow and NumPy versions, BLAS, thread count); the file keeps one entry per such key, so a
    changed library, CPU, OneFlow or BLAS runs the checks again. Verdicts are JSON values (None: the
    kernel passed; a string: why it is off; with what the check measured). A file that is missing,
    unreadable or not what this writes reads as empty; writes are whole-file renames (ranks starting
    at once each write a whole file; the last one wins, the others' checks run again next time).
    ``BERT_OF_CPU_KERNELS_RECHECK=1`` (or ``recheck``) ignores what is kept and writes what the checks find now.
    """

    def __init__(self, library: str, context: dict, recheck: bool = False):
        self.path = library + ".checks.json"
        try:
            with open(library, "rb") as f:
                lib_hash = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            lib_hash = "?"
        blob = json.dumps({"library": lib_hash, "cpu": _cpu(), **context}, sort_keys=True, default=str)
        self.key = hashlib.sha256(blob.encode()).hexdigest()[:24]
        self.recheck = recheck or os.environ.get(RECHECK, "0") == "1"
        self.hits = 0  # verdicts read from the file (the checks not run) in this process
        self._entry = None  # this key's verdicts as read, once (a check run since is put, and kept here)

    def _load(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                kept = json.load(f)
        except (OSError, ValueError):
            return {}
        return kept if isinstance(kept, dict) else {}

    def get(self, name: str):
        """(True, verdict) when kept for this key, else (False, None)."""
        if self.recheck:
            return False, None
        if self._entry is None:
            entry = self._load().get(self.key)
            self._entry = entry if isinstance(entry, dict) else {}
        entry = self._entry
        if name in entry:
            self.hits += 1
            return True, entry[name]
        return False, None

    def put(self, name: str, verdict) -> None:
        """Keep ``verdict`` (JSON) for ``name``; a folder that is not writable keeps nothing."""
        kept = self._load()
        entry = kept.pop(self.key, None)
        kept[self.key] = {**(entry if isinstance(entry, dict) else {}), name: verdict}
        kept = dict(list(kept.items())[-KEEP_KEYS:])  # the newest keys (venvs sharing the cache take turns)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(kept, f)
            os.replace(tmp, self.path)
            self._entry = kept[self.key]  # what the file now holds for this key
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def check(self, name: str, run):
        """``run()``'s verdict for ``name``, kept: read from the file when there, else run and kept."""
        found, verdict = self.get(name)
        if not found:
            verdict = run()
            self.put(name, verdict)
        return verdict
