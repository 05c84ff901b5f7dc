"""Which files are bert_of's, and the rules every destination obeys (``check_destination``)."""

from __future__ import annotations

import json
import os
import re

from bert_of.errors import OutputError
from bert_of.files.atomic import atomic_write

# What bert_of writes into the folders it publishes. ``overwrite`` replaces a folder only when
# everything in it is bert_of's (or it holds nothing), so a mistyped destination never takes the
# user's own files with it. The standard files of every format, of pretraining data and of runs are
# known by name (a published folder then holds exactly its format's files, what other tools, content
# hashes and zoo manifests expect): each layer that writes them declares them here with
# ``register_own_files`` (a format in its descriptor, converters/registry.py; the data and the runs
# where their names are defined), so this layer lists none of theirs. Anything else bert_of writes
# (tokenizer files beside an HF checkpoint, sidecars) is listed in FILES_MANIFEST in the published folder.

_OWN_NAMES: set = set()
_OWN_PATTERNS: list = [re.compile(r"\.bert_of.*", re.DOTALL)]  # this layer's own sidecars (FILES_MANIFEST, staging)
ZOO_MANIFEST = "zoo_manifest.json"  # a zoo cache entry is the zoo's, whatever its archive held
FILES_MANIFEST = ".bert_of-files.json"  # {"files": [relative paths]}: what else bert_of wrote here


def register_own_files(names=(), patterns=()) -> None:
    """Declare file names (and full-match regexes) that bert_of writes into the folders it publishes."""
    _OWN_NAMES.update(names)
    for p in patterns:
        if p not in (x.pattern for x in _OWN_PATTERNS):
            _OWN_PATTERNS.append(re.compile(p, re.DOTALL))  # a name may hold a newline


def own_files() -> frozenset:
    """The file names registered so far (patterns aside)."""
    return frozenset(_OWN_NAMES)


def own_by_name(name: str) -> bool:
    return name in _OWN_NAMES or any(p.fullmatch(name) for p in _OWN_PATTERNS)


def record_files(folder: str) -> None:
    """List in ``folder``'s FILES_MANIFEST the files under it that are not bert_of's by name (none:
    no manifest). Called on every staged folder just before it is published. A zoo cache entry is
    the zoo's as a whole (its ZOO_MANIFEST says so): nothing to list."""
    if os.path.isfile(os.path.join(folder, ZOO_MANIFEST)):
        return
    extra = []
    for d, dirs, files in os.walk(folder):
        dirs.sort()
        for n in sorted(files):
            if not own_by_name(n):
                extra.append(os.path.relpath(os.path.join(d, n), folder).replace(os.sep, "/"))
    if extra:
        atomic_write(os.path.join(folder, FILES_MANIFEST), json.dumps({"files": extra}, indent=1) + "\n")


def _listed(d: str) -> set:
    """The relative paths the FILES_MANIFEST in ``d`` lists (nothing when absent or not ours)."""
    try:
        with open(os.path.join(d, FILES_MANIFEST), encoding="utf-8") as f:
            files = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str)} if isinstance(files, list) else set()


def foreign_entry(path: str):
    """The first file under the folder ``path`` that bert_of did not write (its path relative
    to ``path``), or None when there is none."""
    if os.path.isfile(os.path.join(path, ZOO_MANIFEST)):
        return None
    listed = set()  # relative to ``path``, from every published folder's manifest under it
    for d, dirs, files in os.walk(path):
        dirs.sort()
        here = os.path.relpath(d, path)
        listed |= {os.path.normpath(os.path.join(here, f)) for f in _listed(d)}
        links = [n for n in dirs if os.path.islink(os.path.join(d, n))]  # removed, never followed
        for n in sorted(files) + links:
            rel = os.path.normpath(os.path.join(here, n))
            if not own_by_name(n) and rel not in listed:
                return rel
    return None


def _source_path(src: str):
    """The path a source occupies: itself, or the .index file of a TF prefix; None if absent."""
    if os.path.lexists(src):
        return src
    return src + ".index" if os.path.exists(src + ".index") else None


def check_sources(dst, sources) -> None:
    """Refuse a destination that is one of ``sources`` (files, folders or TF prefixes), holds one,
    or lies inside a source folder (symlinks resolved on both sides)."""
    real = os.path.realpath(dst)
    for src in sources:
        found = _source_path(os.fspath(src)) if src else None
        if found is None:
            continue
        rs = os.path.realpath(found)
        if rs == real:
            raise OutputError(f"{dst}: is the source {src}; choose another destination")
        if rs.startswith(real.rstrip(os.sep) + os.sep):
            raise OutputError(f"{dst}: holds the source {src}; writing there would destroy it")
        if os.path.isdir(rs) and real.startswith(rs.rstrip(os.sep) + os.sep):
            raise OutputError(f"{dst}: lies inside the source {src}; choose a destination outside it")


def check_destination(dst, overwrite: bool = False, sources=()) -> str:
    """Check the rules every destination obeys and return ``dst`` as it will be written (a
    symlink resolved to its target):

    - it is not one of ``sources`` (files, folders or TF prefixes), holds none, and does not lie
      inside a source folder;
    - it exists only with ``overwrite``, and then it is a folder of nothing but what bert_of writes.
    """
    dst = os.fspath(dst)
    target = os.path.realpath(dst) if os.path.islink(dst) else os.path.abspath(dst)
    check_sources(dst, sources)
    if os.path.lexists(target):
        if not overwrite:
            raise OutputError(f"{dst}: already exists (use --overwrite to replace it)")
        if not os.path.isdir(target):
            raise OutputError(f"{dst}: exists and is not a directory; not replacing it")
        foreign = foreign_entry(target)
        if foreign:
            raise OutputError(f"{dst}: holds {foreign}, which bert_of did not write; not replacing it "
                              "(move it away, or choose another destination)")
    return target
