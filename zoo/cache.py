"""The zoo's cache on disk: where published entries live, their manifests, locks, re-verification.

Layout (``BERT_OF_HOME``, default ``$XDG_CACHE_HOME/bert_of`` or ``~/.cache/bert_of``)::

    models/<name>/<format>/        published entries (a bert_of checkpoint for "of",
                                   Google's files for "tf"), each with zoo_manifest.json
    downloads/<name>/<file>.part   partial downloads (resumed by the next attempt)
    converted/<key>/               checkpoints in other formats, converted by zoo.resolve
    locks/<name>.lock              one flock per entry (or conversion): concurrent builds serialize
    registry.local.json            entries made by `bert-of zoo add`
    results.jsonl                  the results store (bert_of.eval.results)

An entry is built in a staging folder beside its destination and swapped in by one rename
(``bert_of.files.publish.publishing``), so a reader sees either nothing or a complete, verified entry; the
staging folder of a process that died is removed by the next build.
"""

from __future__ import annotations

import contextlib
import os
import time

from bert_of.converters.source import Options, summarize
from bert_of.converters import registry
from bert_of.converters.convert import convert
from bert_of.errors import OutputError
from bert_of.files.atomic import write_json
from bert_of.files.locks import locked
from bert_of.files.reading import read_json, sha256_file
from bert_of.zoo.errors import ZooError

MANIFEST = "zoo_manifest.json"
FORMATS = registry.names(writable=True)  # what `zoo download --format` can produce: every format bert_of writes


def hash_tree(root: str, skip=(MANIFEST,)) -> dict:
    """{relative path: {"sha256", "size"}} of every regular file under ``root``."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root).replace(os.sep, "/")
            if rel in skip or os.path.islink(p):
                continue
            out[rel] = {"sha256": sha256_file(p), "size": os.path.getsize(p)}
    return out


def dir_size(root: str) -> int:
    n = 0
    for d, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                n += os.path.getsize(os.path.join(d, f))
    return n


def model_dir(cache_dir: str, name: str, fmt: str) -> str:
    return os.path.join(cache_dir, "models", name, fmt)


def downloads_dir(cache_dir: str, name: str) -> str:
    return os.path.join(cache_dir, "downloads", name)


def cached_formats(cache_dir: str, entry: dict) -> dict:
    """{format: published folder} for the formats of ``entry`` in the cache."""
    out = {}
    base = os.path.join(cache_dir, "models", entry["name"])
    for fmt in FORMATS:
        d = os.path.join(base, fmt)
        if os.path.isfile(os.path.join(d, MANIFEST)):
            out[fmt] = d
    return out


def read_manifest(path: str) -> dict:
    return read_json(os.path.join(path, MANIFEST), "zoo manifest", error=ZooError)


def write_manifest(stage: str, manifest: dict) -> dict:
    """The manifest of a staged entry, with the SHA-256 and size of its files unless given."""
    manifest.setdefault("files", hash_tree(stage))
    write_json(os.path.join(stage, MANIFEST), manifest, indent=1)
    return manifest


@contextlib.contextmanager
def entry_lock(cache_dir: str, key: str, log):
    """Hold ``<cache>/locks/<key>.lock`` for the block; when another process holds it, say so
    (``log``) and wait for it."""
    path = os.path.join(cache_dir, "locks", f"{key}.lock")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(locked(path, key))
        except OutputError as e:
            log(f"{e}; waiting for its lock {path}")
            stack.enter_context(locked(path, key, wait=True))
        yield


def lift(folder: str, into: str) -> None:
    """Move what ``folder`` holds up into ``into`` (same filesystem), then remove ``folder``.

    Converters and extraction create their output folder themselves; an entry is that folder's
    content at the top of its staging folder."""
    for n in os.listdir(folder):
        dst = os.path.join(into, n)
        if os.path.lexists(dst):
            raise ZooError(f"{os.path.join(folder, n)}: collides with {dst} of the entry being built")
        os.rename(os.path.join(folder, n), dst)
    os.rmdir(folder)


def convert_record(src: str, src_fmt: str, out: str, fmt: str, opts: Options | None = None) -> dict:
    """Convert ``src`` (in ``src_fmt``) into the new folder ``out``; the conversion's record for a manifest."""
    t0 = time.perf_counter()
    source, notes = convert(f"{src_fmt}2{fmt}", src, out, opts or Options())
    return {"direction": f"{src_fmt}2{fmt}", "seconds": round(time.perf_counter() - t0, 2),
            "report": summarize(source.report), "notes": list(notes or [])}


def verify_published(entry: dict, fmt: str, d: str) -> list:
    """Problems (strings) found re-hashing a published folder; [] when intact."""
    man = read_manifest(d)
    want = man.get("files") or {}
    have = hash_tree(d)
    problems = []
    for rel, info in sorted(want.items()):
        got = have.get(rel)
        if got is None:
            problems.append(f"{rel}: missing")
        elif got["sha256"] != info["sha256"]:
            problems.append(f"{rel}: SHA-256 differs from the manifest (modified or corrupt)")
    for rel in sorted(set(have) - set(want)):
        problems.append(f"{rel}: not in the manifest (added after publishing)")
    if fmt == entry.get("source_format") and entry.get("contents_sha256"):
        for rel, sha in sorted(entry["contents_sha256"].items()):
            if rel in have and have[rel]["sha256"] != sha.lower():
                problems.append(f"{rel}: SHA-256 differs from the registry's")
    return problems


def check_local_hashes(entry: dict) -> list:
    want = entry.get("files_sha256") or {}
    problems = []
    for rel, sha in sorted(want.items()):
        p = os.path.join(entry["path"], rel)
        if not os.path.isfile(p):
            problems.append(f"{rel}: missing")
        elif sha256_file(p) != sha:
            problems.append(f"{rel}: SHA-256 differs from the one recorded by `zoo add`")
    return problems
