"""One registry entry into the cache: fetch, check, extract, convert, verify, publish.

``download(zoo, name, fmt)`` is what ``bert-of zoo download`` runs: the files come from the network
(zoo.download.fetch, resumable), a ``file://`` source, archives kept from an earlier attempt, the
entry's cached source folder, or a ``zoo add`` folder; they are checked against the registry,
extracted safely (zoo.archive), converted and forward-verified when another format is asked for,
and published into the cache with a manifest (zoo.cache).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import urllib.parse

from bert_of.converters.verify.compare import verify as forward_verify
from bert_of.errors import BertOfError
from bert_of.files.home import utc_now
from bert_of.files.publish import publishing
from bert_of.files.reading import sha256_file
from bert_of.version import __version__
import bert_of.zoo.archive as _archive
import bert_of.zoo.registry as _reg
from bert_of.zoo.cache import (FORMATS, cached_formats, check_local_hashes, convert_record, dir_size, downloads_dir,
                               entry_lock, lift, model_dir, read_manifest, verify_published, write_manifest)
from bert_of.zoo.download import fetch, human_size
from bert_of.zoo.errors import ChecksumError, DiskSpaceError, OfflineError, UnsafeArchiveError, ZooError

MARKERS = {"tf": ["bert_config.json", "bert_model.ckpt.index"], "of": ["config.json"], "hf": ["config.json"],
           "h5": ["config.json"], "lazy": ["bert_config.json", "snapshot_done"]}
EXTRACT = ".extract"  # inside the staging folder
# Space needed beyond the download: extraction (~1x) and, when converting, the output (~1x).
DISK_MARGIN = 64 << 20


def local_dir(entry: dict) -> str:
    p = entry["path"]
    if not os.path.isdir(p):
        raise ZooError(f"{entry['name']}: its folder {p} (registered in {entry['_registry']}) no longer exists")
    return p


def download(z, name: str, fmt: str = "of", verify: bool = True, force: bool = False,
             keep_archive: bool = False) -> str:
    """Download, check, extract and convert ``name`` into the cache; return the folder.

    Already cached: returns at once, without any network access.
    """
    entry = z.entry(name)
    name = entry["name"]
    if fmt not in FORMATS:
        raise ZooError(f"--format {fmt!r}: not one of {', '.join(FORMATS)}")
    if "path" in entry and fmt == entry["source_format"]:
        return local_dir(entry)
    if not force:
        p = cached_formats(z.cache_dir, entry).get(fmt)
        if p:
            return p
    source = _source_plan(z, entry, fmt, force)
    if source == "network" and z.offline:
        urls = [u for u in _urls(z, entry) if urllib.parse.urlsplit(u).scheme in ("http", "https")]
        raise OfflineError(
            f"{name} ({fmt}) is not in the cache {z.cache_dir} and offline mode (BERT_OF_OFFLINE=1 / --offline) "
            f"forbids "
            f"downloading it from {urls[0] if urls else 'the network'}; download it once with network access, "
            "or point BERT_OF_HOME at a cache that has it")
    with entry_lock(z.cache_dir, name, z.log):
        if not force:  # another process may have published it while we waited
            p = cached_formats(z.cache_dir, entry).get(fmt)
            if p:
                z.log(f"{name} ({fmt}): published by another process meanwhile")
                return p
        return _build(z, entry, fmt, verify, force, keep_archive)


def _urls(z, entry: dict) -> list:
    return [_reg.effective_url(entry, f["url"], z.endpoint) for f in entry.get("files", [])]


def _source_plan(z, entry: dict, fmt: str, force: bool) -> str:
    """'local' | 'cache' (a published tf folder) | 'kept' (complete archives on disk) | 'network' | 'file'."""
    if "path" in entry:
        return "local"
    if not force and entry["source_format"] != fmt and entry["source_format"] in cached_formats(z.cache_dir, entry):
        return "cache"
    dl = downloads_dir(z.cache_dir, entry["name"])
    if not force and all(os.path.isfile(os.path.join(dl, f["filename"])) for f in entry["files"]):
        return "kept"
    if all(urllib.parse.urlsplit(u).scheme == "file" for u in _urls(z, entry)):
        return "file"
    return "network"


def _build(z, entry, fmt, verify, force, keep_archive) -> str:
    name = entry["name"]
    final = model_dir(z.cache_dir, name, fmt)
    t0 = time.perf_counter()
    state = {"unverified": []}  # complete downloads whose integrity the registry does not vouch for
    try:
        if force:
            shutil.rmtree(downloads_dir(z.cache_dir, name), ignore_errors=True)
        with publishing(final, overwrite=True) as stage:
            src_dir, src_fmt, source = _obtain_source(z, entry, fmt, stage, state, force)
            conversion = verification = None
            files = None
            if fmt == src_fmt:  # Google's files as extracted
                lift(src_dir, stage)
                files = source.get("root_files")
            else:
                out = os.path.join(stage, ".out")
                conversion, verification = _convert(z, entry, src_dir, src_fmt, out, fmt, verify)
                lift(out, stage)
            shutil.rmtree(os.path.join(stage, EXTRACT), ignore_errors=True)
            manifest = {
                "zoo_manifest": 1, "name": name, "format": fmt, "created": utc_now(),
                "bert_of_version": __version__, "registry": entry.get("_registry"),
                "source": {k: v for k, v in source.items() if k != "root_files"},
                "conversion": conversion, "verification": verification,
                "seconds": round(time.perf_counter() - t0, 2),
            }
            if files is not None:
                manifest["files"] = files
            write_manifest(stage, manifest)
        if source.get("kind") == "download" and not keep_archive:
            shutil.rmtree(downloads_dir(z.cache_dir, name), ignore_errors=True)
        z.log(f"{name} ({fmt}): ready in {final} ({human_size(dir_size(final))}, "
              f"{time.perf_counter() - t0:.1f} s)")
        return final
    except (ChecksumError, UnsafeArchiveError):
        shutil.rmtree(downloads_dir(z.cache_dir, name), ignore_errors=True)  # keep nothing of a bad download
        raise
    except BaseException:
        # A complete archive the registry cannot vouch for is not kept after a failure (it may be the
        # cause); partial downloads are kept so the next attempt resumes.
        for p in state["unverified"]:
            with contextlib.suppress(OSError):
                os.remove(p)
        raise
    finally:
        for d in (downloads_dir(z.cache_dir, name), os.path.dirname(final)):
            with contextlib.suppress(OSError):  # only if empty: a partial download stays for resuming
                os.rmdir(d)


def _check_disk(z, name: str, remaining: int, total: int, convert: bool) -> None:
    need = remaining + total * (2 if convert else 1) + DISK_MARGIN
    os.makedirs(z.cache_dir, exist_ok=True)
    free = shutil.disk_usage(z.cache_dir).free
    if free < need:
        raise DiskSpaceError(
            f"{name}: not enough disk space in {z.cache_dir}: need ~{human_size(need)} (download "
            f"{human_size(remaining)}, extraction{' and conversion' if convert else ''}), {human_size(free)} free; "
            "free some space or set BERT_OF_HOME / --cache-dir elsewhere")


def _obtain_source(z, entry, fmt, stage, state, force=False):
    """(folder, its format, provenance dict) of the entry's source checkpoint; an archive is
    extracted into ``stage``/.extract."""
    name, src_fmt = entry["name"], entry["source_format"]
    plan = _source_plan(z, entry, fmt, force)
    if plan == "local":
        d = local_dir(entry)
        problems = check_local_hashes(entry)
        if problems:
            z.log(f"{name}: warning: {d} changed since `zoo add` ({problems[0]}); converting it as it is now")
        return d, src_fmt, {"kind": "local", "path": d}
    if plan == "cache":
        d = cached_formats(z.cache_dir, entry)[src_fmt]
        problems = verify_published(entry, src_fmt, d)
        if not problems:
            z.log(f"{name}: converting from the cached {src_fmt} folder {d}")
            origin = read_manifest(d).get("source") or {}
            return d, src_fmt, {"kind": "cache", "path": d, "format": src_fmt,
                                "contents_verified": origin.get("contents_verified"),
                                "archives": origin.get("archives")}
        z.log(f"{name}: cached {src_fmt} folder fails verification ({problems[0]}); downloading again")
    if z.offline and plan == "network":
        raise OfflineError(f"{name}: offline mode forbids downloading {_urls(z, entry)[0]}")
    convert = fmt != src_fmt
    dl = downloads_dir(z.cache_dir, name)
    os.makedirs(dl, exist_ok=True)
    archives = []
    for f, url in zip(entry["files"], _urls(z, entry)):
        dest = os.path.join(dl, f["filename"])
        if os.path.isfile(dest):
            z.log(f"{name}: using the downloaded {f['filename']}")
            digest = sha256_file(dest) if f.get("sha256") else None
            size = os.path.getsize(dest)
            if f.get("sha256") and digest != f["sha256"].lower():
                raise ChecksumError(f"{name}: SHA-256 mismatch for {f['filename']} (kept from an earlier "
                                    f"download): expected {f['sha256'].lower()}, got {digest}; nothing was kept")
            archives.append({"filename": f["filename"], "url": url, "sha256": digest, "size": size,
                             "sha256_verified": bool(f.get("sha256"))})
            state["unverified"].append(dest)
            continue
        if z.offline and urllib.parse.urlsplit(url).scheme in ("http", "https"):
            raise OfflineError(f"{name}: offline mode forbids downloading {url}")
        # An exact registry size is checked before connecting; an estimate only stands in when the
        # server does not say the length (a mirror may serve a different build of the same name).
        declared = f.get("size") or 0
        part = dest + ".part"
        have = os.path.getsize(part) if os.path.exists(part) else 0
        if declared:
            _check_disk(z, name, max(0, declared - have), declared, convert)
        estimate = entry.get("size_estimate_bytes") or 0
        z.log(f"{name}: downloading {url}" + (f" (resuming at {human_size(have)})" if have else ""))
        res = fetch(url, dest, sha256=f.get("sha256"), size=f.get("size"), opts=z.download_options,
                    label=f["filename"],
                    on_size=lambda total, h, n=name: _check_disk(z, n, (total or estimate) - h, total or estimate,
                                                                 convert) if (total or estimate) else None)
        rate = (res.size - res.resumed_from) / max(res.seconds, 1e-9)
        z.log(f"{name}: {f['filename']}: {human_size(res.size)} in {res.seconds:.1f} s "
              f"({human_size(rate)}/s)" + (f", resumed from {human_size(res.resumed_from)}" if res.resumed_from
                                          else "") + (f", {res.attempts} attempts" if res.attempts > 1 else "")
              + (", SHA-256 verified" if f.get("sha256") else ""))
        archives.append({"filename": f["filename"], "url": url, "sha256": res.sha256, "size": res.size,
                         "sha256_verified": bool(f.get("sha256"))})
        state["unverified"].append(dest)
    # unpack
    ext = os.path.join(stage, EXTRACT)
    os.makedirs(ext)
    contents = {}
    if entry["archive"] == "none":
        for f in entry["files"]:  # plain files: a hard link (or copy) keeps the download for a retry
            src, dst = os.path.join(dl, f["filename"]), os.path.join(ext, f["filename"])
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
        contents = {a["filename"]: {"sha256": a["sha256"], "size": a["size"]} for a in archives}
    else:
        a = os.path.join(dl, entry["files"][0]["filename"])
        need = _archive.uncompressed_size(a, entry["archive"])
        _check_disk(z, name, 0, need, convert)
        contents = _archive.extract(a, entry["archive"], ext)
    root = _archive.find_root(ext, MARKERS.get(src_fmt, []))
    prefix = os.path.relpath(root, ext).replace(os.sep, "/")
    prefix = "" if prefix == "." else prefix + "/"
    root_files = {k[len(prefix):]: v for k, v in contents.items() if k.startswith(prefix)}
    missing = [f for f in entry.get("expected_files") or [] if f not in root_files]
    if missing:
        raise ChecksumError(f"{name}: {missing[0]} is missing from {entry['files'][0]['filename']} "
                            f"(expected {', '.join(entry['expected_files'])}); nothing was kept")
    expected = entry.get("contents_sha256") or {}
    for rel, want in sorted(expected.items()):
        got = root_files.get(rel)
        if got is None:
            raise ChecksumError(f"{name}: {rel} is missing from {entry['files'][0]['filename']}; nothing was kept")
        if got["sha256"] != want.lower():
            raise ChecksumError(f"{name}: SHA-256 mismatch for {rel} in {entry['files'][0]['filename']}: "
                                f"expected {want.lower()}, got {got['sha256']}; nothing was kept")
    verified = "registry" if expected and set(expected) >= set(entry.get("expected_files") or expected) else \
        ("partial" if expected else "none")
    if expected:
        z.log(f"{name}: SHA-256 of {len(expected)} extracted file(s) match the registry")
    else:
        z.log(f"{name}: note: no published SHA-256 for these files; integrity rests on the archive's "
              "CRC-32" + (" and the converter's per-tensor CRC32C" if convert and src_fmt == "tf" else "")
              + ". Their hashes are recorded in the manifest (`bert-of zoo verify` re-checks them)")
    if verified == "registry" or all(a["sha256_verified"] for a in archives):
        state["unverified"] = []
    source = {"kind": "download", "archive": entry["archive"], "archives": archives,
              "contents": root_files, "contents_verified": verified, "root_in_archive": prefix.rstrip("/"),
              "root_files": root_files}
    return root, src_fmt, source


def _convert(z, entry, src_dir, src_fmt, out, fmt, verify):
    name = entry["name"]
    z.log(f"{name}: converting {src_fmt} -> {fmt}")
    try:
        conversion = convert_record(src_dir, src_fmt, out, fmt)
    except BertOfError as e:
        raise ZooError(f"{name}: cannot produce --format {fmt}: {e}") from None
    if not verify:
        z.log(f"{name}: forward verification skipped (--no-verify)")
        return conversion, None
    z.log(f"{name}: verifying forward equality {src_fmt} vs {fmt} (TF reference vs bert_of eager + graph)")
    t1 = time.perf_counter()
    try:
        report = forward_verify(src_dir, out)
    except BertOfError as e:
        raise ZooError(f"{name}: cannot verify the {fmt} checkpoint: {e}") from None
    report["seconds"] = round(time.perf_counter() - t1, 2)
    if not report["ok"]:
        raise ZooError(f"{name}: forward verification of the {fmt} checkpoint failed: max |diff| "
                       f"{report['worst']:.3g} > {report['tolerance']:g}; nothing was published")
    z.log(f"{name}: forward outputs agree (max |diff| {report['worst']:.2g} <= {report['tolerance']:g})")
    return conversion, report

