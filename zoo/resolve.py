"""The one way from "a name or a path" to a bert_of checkpoint folder.

- a zoo name or alias (``bert-base``): its cached bert_of folder, downloaded, verified and
  converted on first use (zoo.build);
- a bert_of checkpoint folder: returned as it is;
- a checkpoint in any other format bert_of reads (a Google TF folder or ``model.ckpt-N`` prefix,
  an HF or Keras directory, a lazy OneFlow snapshot): converted once into
  ``<cache>/converted/<key>/`` with a manifest holding the conversion report, and reused.

The key of a converted copy is a hash of the source's real path, its format, the name, size and
mtime of every source file, the ``vocab`` given and bert_of's version: a source that changes is
converted again, an unchanged one never is, and no file is read to find out. Conversions are
published atomically (bert_of.fs.publishing) under one lock per key, so concurrent callers wait
for one conversion and share it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import NamedTuple, Optional

from bert_of.converters.common import Options
from bert_of.converters.convert import detect
from bert_of.errors import CheckpointError
from bert_of.fs import publishing, utc_now
from bert_of.version import __version__
from bert_of.zoo.cache import MANIFEST, convert_record, entry_lock, lift, read_manifest, write_manifest
from bert_of.zoo.errors import UnknownEntryError


class Resolved(NamedTuple):
    path: str  # a bert_of checkpoint folder
    name: str  # display name: the zoo entry's name, else the source's folder (or prefix) name
    source_format: str  # the format the checkpoint came in: of, tf, lazy, hf, h5
    conversion: Optional[dict]  # the conversion that made ``path`` (direction, report, notes); None if none did
    source_path: str  # where the original files are: the path given, a `zoo add` folder, else ``path``


def resolve_details(z, name_or_path, *, download: bool = True, vocab: Optional[str] = None) -> Resolved:
    """Resolve ``name_or_path`` with the Zoo ``z`` (its cache, registries, offline mode).

    A path that exists wins over a zoo name of the same spelling. ``download=False``: a zoo entry
    not in the cache is a NotCachedError instead of a download. ``vocab``: the vocabulary for a
    source that has none beside it (part of the converted copy's key).
    """
    given = os.fspath(name_or_path)
    path = os.path.expanduser(given)
    if path and (os.path.exists(path) or os.path.exists(path + ".index")):
        return _from_path(z, path, vocab)
    entry = z.registry.lookup(given) if given else None
    if entry is None:
        raise UnknownEntryError(f"{given or repr(given)}: no such file or directory, and not a zoo name"
                                f"{z.registry._suggest(given)} (`bert-of zoo list` shows the names)")
    name = entry["name"]
    out = z.download(name, "of") if download else z.path(name, "of")
    if "path" in entry and entry["source_format"] == "of":  # a `zoo add` folder, used in place
        return Resolved(out, name, "of", None, out)
    return Resolved(out, name, entry["source_format"], read_manifest(out).get("conversion"),
                    entry.get("path") or out)


def _from_path(z, path: str, vocab) -> Resolved:
    fmt = detect(path)
    name = os.path.basename(os.path.normpath(path))
    if fmt == "of":
        return Resolved(path, name, "of", None, path)
    src = os.path.abspath(path)
    out = converted(z, src, fmt, vocab)
    return Resolved(out, name, fmt, read_manifest(out).get("conversion"), src)


def converted(z, src: str, fmt: str, vocab: Optional[str] = None) -> str:
    """The bert_of copy of the ``fmt`` checkpoint ``src`` in ``<cache>/converted/``, made if needed."""
    key, listing = source_key(src, fmt, vocab)
    dst = os.path.join(z.cache_dir, "converted", key)
    if os.path.isfile(os.path.join(dst, MANIFEST)):
        return dst
    with entry_lock(z.cache_dir, f"converted-{key}", z.log):
        if os.path.isfile(os.path.join(dst, MANIFEST)):  # converted by another process while we waited
            return dst
        z.log(f"{src}: a {fmt} checkpoint; converting it to bert_of ({fmt}2of) into {dst}")
        with publishing(dst, overwrite=True) as stage:
            out = os.path.join(stage, ".out")
            conversion = convert_record(src, fmt, out, "of", Options(vocab=vocab))
            if source_key(src, fmt, vocab)[0] != key:
                raise CheckpointError(f"{src}: changed while it was being converted (still being written?); "
                                      "nothing was kept")
            lift(out, stage)
            write_manifest(stage, {"zoo_manifest": 1, "kind": "converted", "created": utc_now(),
                                   "bert_of_version": __version__, "conversion": conversion,
                                   "source": {"path": src, "format": fmt, "vocab": vocab, "files": listing}})
    return dst


def source_key(src: str, fmt: str, vocab: Optional[str] = None) -> tuple:
    """(key, [[relative name, size, mtime_ns], ...]) of a source checkpoint's files.

    A folder: every file under it. A file or TF prefix: the files of its folder.
    """
    root = src if os.path.isdir(src) else os.path.dirname(src)
    listing = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            st = os.stat(os.path.join(d, f))
            listing.append([os.path.relpath(os.path.join(d, f), root), st.st_size, st.st_mtime_ns])
        if root != src:
            break  # not the subfolders of a prefix's folder
    voc = None
    if vocab:
        if not os.path.isfile(vocab):
            raise CheckpointError(f"{vocab}: vocab file not found")
        st = os.stat(vocab)
        voc = [os.path.realpath(vocab), st.st_size, st.st_mtime_ns]
    ident = {"source": os.path.realpath(src), "format": fmt, "files": listing, "vocab": voc,
             "bert_of": __version__}
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32], listing
