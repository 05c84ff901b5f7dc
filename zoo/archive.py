"""Archive extraction that cannot escape its folder, hashing every file as it is written.

Zip members are checked from the central directory before a byte is written;
tar members as they come (into a private temp folder that is deleted whole on
error). Rejected: absolute names, drive letters, ``..`` components,
backslashes, NUL, duplicate names, symlinks, hard links, devices, FIFOs.
Members are streamed one at a time (the archive is never held in memory); the
zip CRC-32 of each member is checked by ``zipfile`` as it is read.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tarfile
import zipfile
import zlib

from bert_of.zoo.errors import UnsafeArchiveError, ZooError

CHUNK = 1 << 20
ARCHIVE_KINDS = ("zip", "tar", "tar.gz", "none")


def check_member_name(name: str, archive: str) -> str:
    """The safe relative path of a member, or UnsafeArchiveError."""

    def bad(why):
        return UnsafeArchiveError(f"{archive}: unsafe member {name!r}: {why}; nothing was extracted")

    if "\x00" in name:
        raise bad("NUL in name")
    if "\\" in name:
        raise bad("backslash in name (a Windows path separator)")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise bad("absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise bad("'..' escapes the extraction folder")
    if not parts:
        raise bad("empty name")
    return "/".join(parts)


def _inside(root: str, rel: str) -> str:
    target = os.path.realpath(os.path.join(root, rel))
    real_root = os.path.realpath(root)
    if target != real_root and not target.startswith(real_root + os.sep):
        raise UnsafeArchiveError(f"member {rel!r} resolves outside the extraction folder")
    return target


def _copy_hashing(src, dst_path: str) -> tuple:
    h = hashlib.sha256()
    n = 0
    with open(dst_path, "xb") as out:
        buf = bytearray(CHUNK)
        mv = memoryview(buf)
        while True:
            k = src.readinto(buf)
            if not k:
                break
            out.write(mv[:k])
            h.update(mv[:k])
            n += k
    return h.hexdigest(), n


def zip_plan(path: str) -> list:
    """[(ZipInfo, safe relative name, is_dir)] after checking every member; raises on any unsafe one."""
    label = os.path.basename(path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise ZooError(f"{label}: not a valid zip archive ({e})") from None
    with zf:
        plan, seen = [], set()
        for info in zf.infolist():
            rel = check_member_name(info.filename, label)
            mode = info.external_attr >> 16
            ftype = stat.S_IFMT(mode)
            if ftype == stat.S_IFLNK:
                raise UnsafeArchiveError(f"{label}: unsafe member {info.filename!r}: symbolic link; "
                                         "nothing was extracted")
            if ftype not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise UnsafeArchiveError(f"{label}: unsafe member {info.filename!r}: special file (mode {oct(mode)}); "
                                         "nothing was extracted")
            if rel in seen:
                raise UnsafeArchiveError(f"{label}: member {rel!r} appears twice; nothing was extracted")
            seen.add(rel)
            plan.append((info, rel, info.is_dir() or ftype == stat.S_IFDIR))
        return plan


def uncompressed_size(path: str, kind: str) -> int:
    if kind == "zip":
        return sum(i.file_size for i, _, d in zip_plan(path) if not d)
    return os.path.getsize(path) * (4 if kind == "tar.gz" else 1)  # tar: estimate without a pass


def extract(path: str, kind: str, dest: str) -> dict:
    """Extract ``path`` into the empty or new directory ``dest``.

    Returns {relative path: {"sha256", "size"}} of every regular file written.
    On any error the caller deletes ``dest`` (it is private to one extraction).
    """
    os.makedirs(dest, exist_ok=True)
    if kind == "zip":
        return _extract_zip(path, dest)
    if kind in ("tar", "tar.gz"):
        return _extract_tar(path, dest)
    raise ZooError(f"{path}: unknown archive type {kind!r} (known: {', '.join(ARCHIVE_KINDS)})")


def _extract_zip(path, dest):
    label = os.path.basename(path)
    plan = zip_plan(path)  # every member checked before anything is written
    out = {}
    with zipfile.ZipFile(path) as zf:
        for info, rel, is_dir in plan:
            target = _inside(dest, rel)
            if is_dir:
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                with zf.open(info) as src:
                    digest, n = _copy_hashing(src, target)
            except zipfile.BadZipFile as e:  # CRC-32 mismatch, truncated member
                raise ZooError(f"{label}: member {rel!r} is corrupt ({e})") from None
            except FileExistsError:
                raise UnsafeArchiveError(f"{label}: member {rel!r} collides with another member") from None
            out[rel] = {"sha256": digest, "size": n}
    return out


def _extract_tar(path, dest):
    label = os.path.basename(path)
    out = {}
    try:
        tf = tarfile.open(path, mode="r:*")
    except tarfile.TarError as e:
        raise ZooError(f"{label}: not a valid tar archive ({e})") from None
    with tf:
        try:
            for m in tf:
                rel = check_member_name(m.name, label)
                if m.issym() or m.islnk():
                    raise UnsafeArchiveError(f"{label}: unsafe member {m.name!r}: link to {m.linkname!r}; "
                                             "nothing was kept")
                if m.isdir():
                    os.makedirs(_inside(dest, rel), exist_ok=True)
                    continue
                if not m.isfile():
                    raise UnsafeArchiveError(f"{label}: unsafe member {m.name!r}: special file; nothing was kept")
                if rel in out:
                    raise UnsafeArchiveError(f"{label}: member {rel!r} appears twice; nothing was kept")
                target = _inside(dest, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tf.extractfile(m)
                digest, n = _copy_hashing(src, target)
                out[rel] = {"sha256": digest, "size": n}
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise ZooError(f"{label}: corrupt tar archive ({e})") from None
    return out


def find_root(dest: str, marker_files: list) -> str:
    """The directory holding the checkpoint: ``dest`` itself or its single top folder.

    Google's 2018/2019 zips hold a folder named after the zip; the 2020
    miniatures put the files at the top. Whichever it is, the root is the
    shallowest directory holding the first marker file (e.g. bert_config.json).
    """
    for marker in marker_files:
        hits = []
        for d, dirs, files in os.walk(dest):
            dirs.sort()
            if marker in files:
                hits.append(d)
        if hits:
            hits.sort(key=lambda p: (p.count(os.sep), p))
            if len(hits) > 1 and hits[0].count(os.sep) == hits[1].count(os.sep):
                where = ", ".join(os.path.relpath(h, dest) for h in hits[:3])
                raise ZooError(f"archive holds several checkpoints ({where})")
            return hits[0]
    # no marker: a single top-level folder, or dest itself
    entries = [e for e in os.listdir(dest) if not e.startswith(".")]
    if len(entries) == 1 and os.path.isdir(os.path.join(dest, entries[0])):
        return os.path.join(dest, entries[0])
    return dest


def rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
