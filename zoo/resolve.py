"""The one way from "a name or a path" to a bert_of checkpoint folder.

- a zoo name or alias (``bert-base``): its cached bert_of folder, downloaded, verified and
  converted on first use (zoo.build);
- a bert_of checkpoint folder: returned as it is;
- a checkpoint in any other format bert_of reads (a Google TF folder or ``model.ckpt-N`` prefix,
  an HF or Keras directory, a lazy OneFlow snapshot): converted once into
  ``<cache>/converted/<key>/`` with a manifest holding the conversion report, and reused.

A converted copy is keyed by the source's content: its format, the SHA-256 of every source file
(with their names), of the ``vocab`` given, and bert_of's version. A source that changes is
converted again; a copied or touched one is not. Reading every file on every call would be slow,
so ``converted/.refs/<stat key>`` remembers the content key of a source as it was last seen (its
real path, the name, size and mtime of each file): an unchanged source is found without reading a
file. Conversions are published atomically (bert_of.files.publish.publishing) under one lock per stat key, so
concurrent callers wait for one conversion and share it. ``bert-of zoo cache`` lists, sizes, removes
and prunes the copies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from typing import NamedTuple, Optional

from bert_of.checkpoint import run_final
from bert_of.progress import log
from bert_of.converters.source import Options
from bert_of.converters.convert import detect
from bert_of.converters.reader import ATTEMPTS
from bert_of.errors import BertOfError, CheckpointError, SourceChanged
from bert_of.files.atomic import atomic_write
from bert_of.files.home import utc_now
from bert_of.files.publish import publishing
from bert_of.files.reading import sha256_file
from bert_of.version import __version__
from bert_of.zoo.cache import MANIFEST, convert_record, dir_size, entry_lock, lift, read_manifest, write_manifest
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
        model = run_final(path)  # a training run's folder: the checkpoint it published
        if model != path:
            log.debug(f"{given}: a training run; using its final checkpoint {model}")  # the common case: -v
            return _from_path(z, model, vocab)._replace(name=os.path.basename(os.path.normpath(path)))  # the run's
        return _from_path(z, model, vocab)
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
    """The bert_of copy of the ``fmt`` checkpoint ``src`` in ``<cache>/converted/``, made if needed.
    A source replaced while it was converted (``--overwrite`` of it meanwhile) is converted again,
    up to ATTEMPTS times."""
    for attempt in range(ATTEMPTS):
        try:
            return _converted(z, src, fmt, vocab)
        except SourceChanged:
            if attempt == ATTEMPTS - 1:
                raise
            z.log(f"{src}: changed while it was being converted; converting it again")


def _converted(z, src: str, fmt: str, vocab: Optional[str] = None) -> str:
    skey, listing = source_key(src, fmt, vocab)
    ref = os.path.join(z.cache_dir, "converted", REFS, skey)
    found = _referenced(z, ref)
    if found:
        return found
    with entry_lock(z.cache_dir, f"converted-{skey}", z.log):
        found = _referenced(z, ref)  # converted by another process while we waited
        if found:
            return found
        ckey = content_key(src, fmt, vocab)
        dst = os.path.join(z.cache_dir, "converted", ckey)
        with entry_lock(z.cache_dir, f"converted-{ckey}", z.log):  # another path, same content
            _convert_into(z, dst, src, fmt, vocab, skey, listing, ckey)
        atomic_write(ref, json.dumps({"key": ckey, "source": src, "format": fmt, "vocab": vocab}))
    return dst


def _convert_into(z, dst, src, fmt, vocab, skey, listing, ckey) -> None:
    if os.path.isfile(os.path.join(dst, MANIFEST)):
        z.log(f"{src}: same content as a copy converted before; using {dst}")
        return
    z.log(f"{src}: a {fmt} checkpoint; converting it to bert_of ({fmt}2of) into {dst}")
    with publishing(dst, overwrite=True) as stage:
        out = os.path.join(stage, ".out")
        conversion = convert_record(src, fmt, out, "of", Options(vocab=vocab))
        if source_key(src, fmt, vocab)[0] != skey:
            raise SourceChanged(f"{src}: changed while it was being converted (still being written?); "
                                  "nothing was kept")
        lift(out, stage)
        write_manifest(stage, {"zoo_manifest": 1, "kind": "converted", "created": utc_now(),
                               "bert_of_version": __version__, "conversion": conversion,
                               "source": {"path": src, "format": fmt, "vocab": vocab, "files": listing,
                                          "content_key": ckey}})


REFS = ".refs"  # converted/.refs/<stat key>: {"key": content key, "source", "format", "vocab"} as last seen


def _read_ref(ref: str) -> Optional[dict]:
    try:
        with open(ref, encoding="utf-8") as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(r, dict) and isinstance(r.get("key"), str) and len(r["key"]) == 32 and r["key"].isalnum()
    return r if ok else None


def _referenced(z, ref: str) -> Optional[str]:
    """The converted copy a ref names, when both are there."""
    r = _read_ref(ref)
    dst = os.path.join(z.cache_dir, "converted", r["key"]) if r else None
    return dst if dst and os.path.isfile(os.path.join(dst, MANIFEST)) else None


def _source_files(src: str) -> tuple:
    """(root, [relative names]): a folder's files, or those of a file's or TF prefix's folder."""
    root = src if os.path.isdir(src) else os.path.dirname(src)
    names = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        names += [os.path.relpath(os.path.join(d, f), root) for f in sorted(files)]
        if root != src:
            break  # not the subfolders of a prefix's folder
    return root, names


def content_key(src: str, fmt: str, vocab: Optional[str] = None) -> str:
    """The key of ``src``'s converted copy: a hash of what its files hold (reads every file)."""
    root, names = _source_files(src)
    ident = {"format": fmt, "files": [[n, _sha256(src, os.path.join(root, n))] for n in names],
             "vocab": sha256_file(vocab) if vocab else None, "bert_of": __version__}
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def _sha256(src: str, path: str) -> str:
    if not os.path.lexists(path):  # listed a moment ago: the folder was replaced meanwhile
        raise SourceChanged(f"{src}: changed while it was being read ({os.path.basename(path)} is gone)")
    try:
        return sha256_file(path)
    except BertOfError:
        if not os.path.lexists(path):
            raise SourceChanged(f"{src}: changed while it was being read ({os.path.basename(path)} is gone)") from None
        raise


def source_key(src: str, fmt: str, vocab: Optional[str] = None) -> tuple:
    """(stat key, [[relative name, size, mtime_ns], ...]) of a source checkpoint's files: found
    without reading them. A folder: every file under it. A file or TF prefix: the files of its folder.
    """
    root, names = _source_files(src)
    listing = []
    for n in names:
        try:
            st = os.stat(os.path.join(root, n))
        except FileNotFoundError:  # listed a moment ago: the folder was replaced meanwhile
            raise SourceChanged(f"{src}: changed while it was being read ({n} is gone)") from None
        listing.append([n, st.st_size, st.st_mtime_ns])
    voc = None
    if vocab:
        if not os.path.isfile(vocab):
            raise CheckpointError(f"{vocab}: vocab file not found")
        st = os.stat(vocab)
        voc = [os.path.realpath(vocab), st.st_size, st.st_mtime_ns]
    ident = {"source": os.path.realpath(src), "format": fmt, "files": listing, "vocab": voc,
             "bert_of": __version__}
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32], listing


# --------------------------------------------------------------------------- the converted copies


def _refs(z) -> dict:
    """{stat key: ref} of every readable ref."""
    d = os.path.join(z.cache_dir, "converted", REFS)
    out = {}
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else ():
        r = _read_ref(os.path.join(d, n))
        if r is not None:
            out[n] = r
    return out


def _current(skey: str, r: dict) -> bool:
    try:
        return source_key(r["source"], r["format"], r.get("vocab"))[0] == skey
    except (OSError, CheckpointError, KeyError, TypeError):
        return False


def converted_copies(z) -> list:
    """One dict per converted copy: id (its key), path, size, the source that made it (path,
    format, vocab), every path known to use it, and its state: "current" (a source that uses it has
    the files it had when last seen), "source changed" (the sources are there but their names,
    sizes or mtimes differ: the content may or may not), "source gone", or "unreadable" (no manifest)."""
    base = os.path.join(z.cache_dir, "converted")
    refs = _refs(z)
    out = []
    for key in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        d = os.path.join(base, key)
        if key.startswith(".") or ".removing-" in key or not os.path.isdir(d):
            continue
        mine = [(k, r) for k, r in refs.items() if r["key"] == key]
        row = {"id": key, "kind": "converted", "path": d, "size": dir_size(d), "source": None, "format": None,
               "vocab": None, "used_by": sorted({r.get("source") for _, r in mine if r.get("source")}),
               "state": "unreadable"}
        try:
            src = read_manifest(d)["source"]
            row.update(source=src["path"], format=src["format"], vocab=src.get("vocab"))
        except (BertOfError, KeyError, TypeError):
            out.append(row)
            continue
        if any(_current(k, r) for k, r in mine):
            row["state"] = "current"
        elif any(_exists(p) for p in row["used_by"] + [row["source"]]):
            row["state"] = "source changed"
        else:
            row["state"] = "source gone"
        out.append(row)
    return out


def _exists(path: str) -> bool:
    return os.path.exists(path) or os.path.exists(path + ".index")


def remove_copy(z, row: dict) -> None:
    """Delete one converted copy (renamed aside first, so it never looks half there) and its refs."""
    with entry_lock(z.cache_dir, f"converted-{row['id']}", z.log):
        gone = f"{row['path']}.removing-{os.getpid()}"
        os.rename(row["path"], gone)
        shutil.rmtree(gone, ignore_errors=True)
    for k, r in _refs(z).items():
        if r["key"] == row["id"]:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(z.cache_dir, "converted", REFS, k))


def prune_copies(z, dry_run: bool = False) -> list:
    """Remove the converted copies no source needs any more: every source that used one is gone,
    or holds other content than was converted (the files of a "source changed" copy's sources are
    read to find out: a touched source keeps its copy). Returns the rows removed (or that would be,
    with ``dry_run``)."""
    stale = []
    for row in converted_copies(z):
        if row["state"] == "current":
            continue
        if row["state"] == "source changed":
            users = {(r["source"], r["format"], r.get("vocab")) for r in _refs(z).values() if r["key"] == row["id"]}
            users.add((row["source"], row["format"], row["vocab"]))
            if any(_exists(p) and _same_content(p, f, v, row["id"]) for p, f, v in users):
                continue  # touched or copied, not changed
        stale.append(row)
    if not dry_run:
        for row in stale:
            remove_copy(z, row)
        base = os.path.join(z.cache_dir, "converted")
        for n in os.listdir(base) if os.path.isdir(base) else ():  # removals cut short by a kill
            pid = n.rpartition(".removing-")[2]
            if ".removing-" in n and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(os.path.join(base, n), ignore_errors=True)
    return stale


def _same_content(src, fmt, vocab, key) -> bool:
    try:
        return content_key(src, fmt, vocab) == key
    except OSError:
        return False
