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
"""

from __future__ import annotations

import hashlib
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


def _compile(cc: str, source: str, lib: str) -> None:
    tmp = f"{lib}.{os.getpid()}.tmp"
    try:
        run = subprocess.run([cc, *FLAGS, "-o", tmp, source, "-ldl", "-lpthread", "-lm"],
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
    tag = hashlib.sha256(_source_bytes(source) + platform.machine().encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
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
            _compile(cc, source, lib)
            return lib
        except CompileError:
            raise
        except OSError as e:  # this folder is not writable: the next one
            last = f"{folder}: {e.strerror or e}"
    raise OSError(last)
