"""The zoo's cache on disk: where published entries live, their manifests, locks, re-verification.

Layout (``BERT_OF_HOME``, default ``$XDG_CACHE_HOME/bert_of`` or ``~/.cache/bert_of``)::

    models/<name>/<format>/        published entries (a bert_of checkpoint for "of",
                                   Google's files for "tf"), each with zoo_manifest.json
    downloads/<name>/<file>.part   partial downloads (resumed by the next attempt)
    locks/<name>.lock              one flock per entry: concurrent downloads serialize
    tmp/<name>+XXXX/               private build folders; published by one rename
    registry.local.json            entries made by `bert-of zoo add`

A published folder appears by one ``os.rename`` of a finished folder, so a
reader sees either nothing or a complete, verified entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

from bert_of.fs import sha256_file
from bert_of.zoo.errors import ZooError

MANIFEST = "zoo_manifest.json"
FORMATS = ("of", "tf", "lazy", "hf")  # what `zoo download --format` can produce


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
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ZooError(f"{path}: unreadable {MANIFEST} ({e})") from None


@contextlib.contextmanager
def entry_lock(cache_dir: str, key: str, log):
    locks = os.path.join(cache_dir, "locks")
    os.makedirs(locks, exist_ok=True)
    path = os.path.join(locks, f"{key}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode().strip() or "?"
            except OSError:
                holder = "?"
            log(f"{key}: another process (pid {holder}) is working on it; waiting for its lock {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


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
