"""The zoo: registries + a cache of verified, converted checkpoints.

Cache layout (``BERT_OF_HOME``, default ``$XDG_CACHE_HOME/bert_of`` or ``~/.cache/bert_of``)::

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
import glob
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.parse

from bert_of.fs import bert_of_home, publish_dir, sha256_file, utc_now
from bert_of.version import __version__
from bert_of.zoo import archive as _archive
from bert_of.zoo import registry as _reg
from bert_of.zoo.download import DownloadOptions, fetch, human_size
from bert_of.zoo.errors import (ChecksumError, DiskSpaceError, NotCachedError, OfflineError, UnsafeArchiveError, ZooError)

MANIFEST = "zoo_manifest.json"
FORMATS = ("of", "tf", "lazy", "hf")  # what `zoo download --format` can produce
TRUE = ("1", "true", "yes", "on")
MARKERS = {"tf": ["bert_config.json", "bert_model.ckpt.index"], "of": ["config.json"], "hf": ["config.json"],
           "h5": ["config.json"], "lazy": ["bert_config.json", "snapshot_done"]}
# Space needed beyond the download: extraction (~1x) and, when converting, the output (~1x).
DISK_MARGIN = 64 << 20


default_cache_dir = bert_of_home


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in TRUE


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


def config_summary(cfg) -> dict:
    """{L, H, A, I, V, P, T, hidden_act, layer_norm_eps} of a BertConfig."""
    return {"L": cfg.num_hidden_layers, "H": cfg.hidden_size, "A": cfg.num_attention_heads,
            "I": cfg.intermediate_size, "V": cfg.vocab_size, "P": cfg.max_position_embeddings,
            "T": cfg.type_vocab_size, "hidden_act": cfg.hidden_act, "layer_norm_eps": cfg.layer_norm_eps}


class Zoo:
    """Registry lookups, downloads and the cache, configured by arguments or the environment.

    cache_dir: ``BERT_OF_HOME`` by default. registries: extra registry files
    (after ``BERT_OF_REGISTRY``'s). offline: ``BERT_OF_OFFLINE`` by default.
    endpoint: ``BERT_OF_ENDPOINT`` by default (mirror of storage.googleapis.com).
    """

    def __init__(self, cache_dir=None, registries=(), offline=None, endpoint=None,
                 download_options: DownloadOptions | None = None, quiet: bool = False):
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else default_cache_dir()
        self.extra_registries = [os.path.abspath(os.path.expanduser(p)) for p in registries or ()]
        self.offline = env_flag("BERT_OF_OFFLINE") if offline is None else bool(offline)
        self.endpoint = endpoint if endpoint is not None else (os.environ.get("BERT_OF_ENDPOINT") or None)
        if self.endpoint:
            scheme = urllib.parse.urlsplit(self.endpoint).scheme
            if scheme not in ("http", "https", "file"):
                raise ZooError(f"endpoint {self.endpoint!r}: must be an http://, https:// or file:// URL prefix")
        self.download_options = download_options or DownloadOptions.from_env()
        self.quiet = quiet
        self._registry = None

    # ------------------------------------------------------------------ registry
    def registry_paths(self) -> list:
        paths = [_reg.SHIPPED]
        local = self.local_registry_path
        if os.path.isfile(local):
            paths.append(local)
        env = os.environ.get("BERT_OF_REGISTRY", "")
        paths += [os.path.abspath(os.path.expanduser(p)) for p in env.split(os.pathsep) if p.strip()]
        paths += self.extra_registries
        return paths

    @property
    def registry(self) -> _reg.Registry:
        if self._registry is None:
            self._registry = _reg.merge(self.registry_paths())
        return self._registry

    @property
    def local_registry_path(self) -> str:
        return os.path.join(self.cache_dir, _reg.LOCAL_NAME)

    def entry(self, name: str) -> dict:
        return self.registry.get(name)

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(f"bert-of: {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ cache paths
    def model_dir(self, name: str, fmt: str) -> str:
        return os.path.join(self.cache_dir, "models", name, fmt)

    def downloads_dir(self, name: str) -> str:
        return os.path.join(self.cache_dir, "downloads", name)

    def cached_formats(self, entry: dict) -> dict:
        """{format: published folder} for the formats of ``entry`` in the cache."""
        out = {}
        base = os.path.join(self.cache_dir, "models", entry["name"])
        for fmt in FORMATS:
            d = os.path.join(base, fmt)
            if os.path.isfile(os.path.join(d, MANIFEST)):
                out[fmt] = d
        return out

    def read_manifest(self, path: str) -> dict:
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise ZooError(f"{path}: unreadable {MANIFEST} ({e})") from None

    @contextlib.contextmanager
    def _lock(self, key: str):
        locks = os.path.join(self.cache_dir, "locks")
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
                self.log(f"{key}: another process (pid {holder}) is working on it; waiting for its lock {path}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # ------------------------------------------------------------------ resolve / path
    def path(self, name: str, fmt: str = "of") -> str:
        """The cached folder of ``name`` in ``fmt`` (a local entry's own folder), or NotCachedError."""
        entry = self.entry(name)
        if "path" in entry and fmt == entry["source_format"]:
            return self._local_dir(entry)
        p = self.cached_formats(entry).get(fmt)
        if p is None:
            raise NotCachedError(f"{entry['name']} ({fmt}) is not in the cache {self.cache_dir}; "
                                 f"`bert-of zoo download {entry['name']}"
                                 + (f" --format {fmt}" if fmt != "of" else "") + "` fetches it")
        return p

    def resolve(self, name_or_path: str, download: bool = True, fmt: str = "of") -> str:
        if os.path.isdir(name_or_path):
            return name_or_path
        entry = self.registry.lookup(name_or_path)
        if entry is None:
            raise _reg.UnknownEntryError(
                f"{name_or_path}: no such directory, and not a zoo name{self.registry._suggest(name_or_path)} "
                "(`bert-of zoo list` shows the names)")
        if download:
            return self.download(entry["name"], fmt)
        return self.path(entry["name"], fmt)

    def _local_dir(self, entry: dict) -> str:
        p = entry["path"]
        if not os.path.isdir(p):
            raise ZooError(f"{entry['name']}: its folder {p} (registered in {entry['_registry']}) no longer exists")
        return p

    # ------------------------------------------------------------------ download
    def download(self, name: str, fmt: str = "of", verify: bool = True, force: bool = False,
                 keep_archive: bool = False) -> str:
        """Download, check, extract and convert ``name`` into the cache; return the folder.

        Already cached: returns at once, without any network access.
        """
        entry = self.entry(name)
        name = entry["name"]
        if fmt not in FORMATS:
            raise ZooError(f"--format {fmt!r}: not one of {', '.join(FORMATS)}")
        if "path" in entry and fmt == entry["source_format"]:
            return self._local_dir(entry)
        if not force:
            p = self.cached_formats(entry).get(fmt)
            if p:
                return p
        source = self._source_plan(entry, fmt, force)
        if source == "network" and self.offline:
            urls = [u for u in self._urls(entry) if urllib.parse.urlsplit(u).scheme in ("http", "https")]
            raise OfflineError(
                f"{name} ({fmt}) is not in the cache {self.cache_dir} and offline mode (BERT_OF_OFFLINE=1 / --offline) "
                f"forbids "
                f"downloading it from {urls[0] if urls else 'the network'}; download it once with network access, "
                "or point BERT_OF_HOME at a cache that has it")
        with self._lock(name):
            if not force:  # another process may have published it while we waited
                p = self.cached_formats(entry).get(fmt)
                if p:
                    self.log(f"{name} ({fmt}): published by another process meanwhile")
                    return p
            return self._build(entry, fmt, verify, force, keep_archive)

    def _urls(self, entry: dict) -> list:
        return [_reg.effective_url(entry, f["url"], self.endpoint) for f in entry.get("files", [])]

    def _source_plan(self, entry: dict, fmt: str, force: bool) -> str:
        """'local' | 'cache' (a published tf folder) | 'kept' (complete archives on disk) | 'network' | 'file'."""
        if "path" in entry:
            return "local"
        if not force and entry["source_format"] != fmt and entry["source_format"] in self.cached_formats(entry):
            return "cache"
        dl = self.downloads_dir(entry["name"])
        if not force and all(os.path.isfile(os.path.join(dl, f["filename"])) for f in entry["files"]):
            return "kept"
        if all(urllib.parse.urlsplit(u).scheme == "file" for u in self._urls(entry)):
            return "file"
        return "network"

    def _build(self, entry, fmt, verify, force, keep_archive) -> str:
        name = entry["name"]
        tmp_root = os.path.join(self.cache_dir, "tmp")
        os.makedirs(tmp_root, exist_ok=True)
        for stale in glob.glob(os.path.join(tmp_root, glob.escape(name) + "+*")):  # crashed earlier runs
            shutil.rmtree(stale, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=name + "+", dir=tmp_root)
        t0 = time.perf_counter()
        state = {"unverified": []}  # complete downloads whose integrity the registry does not vouch for
        try:
            if force:
                shutil.rmtree(self.downloads_dir(name), ignore_errors=True)
            src_dir, src_fmt, source = self._obtain_source(entry, fmt, tmp, state, force)
            out = os.path.join(tmp, "out")
            conversion = verification = None
            if fmt == src_fmt:
                os.rename(src_dir, out)
                files = source.get("root_files") or hash_tree(out)
            else:
                conversion, verification = self._convert(entry, src_dir, src_fmt, out, fmt, verify)
                files = hash_tree(out)
            manifest = {
                "zoo_manifest": 1, "name": name, "format": fmt, "created": utc_now(),
                "bert_of_version": __version__, "registry": entry.get("_registry"),
                "source": {k: v for k, v in source.items() if k != "root_files"},
                "files": files, "conversion": conversion, "verification": verification,
                "seconds": round(time.perf_counter() - t0, 2),
            }
            with open(os.path.join(out, MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            final = self.model_dir(name, fmt)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            publish_dir(out, final, overwrite=True)
            if source.get("kind") == "download" and not keep_archive:
                shutil.rmtree(self.downloads_dir(name), ignore_errors=True)
            self.log(f"{name} ({fmt}): ready in {final} ({human_size(dir_size(final))}, "
                     f"{time.perf_counter() - t0:.1f} s)")
            return final
        except (ChecksumError, UnsafeArchiveError):
            shutil.rmtree(self.downloads_dir(name), ignore_errors=True)  # keep nothing of a bad download
            raise
        except BaseException:
            # A complete archive the registry cannot vouch for is not kept after a failure (it may be the
            # cause); partial downloads are kept so the next attempt resumes.
            for p in state["unverified"]:
                with contextlib.suppress(OSError):
                    os.remove(p)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):  # only if empty: a partial download stays for resuming
                os.rmdir(self.downloads_dir(name))

    def _check_disk(self, name: str, remaining: int, total: int, convert: bool) -> None:
        need = remaining + total * (2 if convert else 1) + DISK_MARGIN
        os.makedirs(self.cache_dir, exist_ok=True)
        free = shutil.disk_usage(self.cache_dir).free
        if free < need:
            raise DiskSpaceError(
                f"{name}: not enough disk space in {self.cache_dir}: need ~{human_size(need)} (download "
                f"{human_size(remaining)}, extraction{' and conversion' if convert else ''}), {human_size(free)} free; "
                "free some space or set BERT_OF_HOME / --cache-dir elsewhere")

    def _obtain_source(self, entry, fmt, tmp, state, force=False):
        """(folder, its format, provenance dict) of the entry's source checkpoint."""
        name, src_fmt = entry["name"], entry["source_format"]
        plan = self._source_plan(entry, fmt, force)
        if plan == "local":
            d = self._local_dir(entry)
            problems = self._check_local_hashes(entry)
            if problems:
                self.log(f"{name}: warning: {d} changed since `zoo add` ({problems[0]}); converting it as it is now")
            return d, src_fmt, {"kind": "local", "path": d}
        if plan == "cache":
            d = self.cached_formats(entry)[src_fmt]
            problems = self._verify_published(entry, src_fmt, d)
            if not problems:
                self.log(f"{name}: converting from the cached {src_fmt} folder {d}")
                origin = self.read_manifest(d).get("source") or {}
                return d, src_fmt, {"kind": "cache", "path": d, "format": src_fmt,
                                    "contents_verified": origin.get("contents_verified"),
                                    "archives": origin.get("archives")}
            self.log(f"{name}: cached {src_fmt} folder fails verification ({problems[0]}); downloading again")
        if self.offline and plan == "network":
            raise OfflineError(f"{name}: offline mode forbids downloading {self._urls(entry)[0]}")
        convert = fmt != src_fmt
        dl = self.downloads_dir(name)
        os.makedirs(dl, exist_ok=True)
        archives = []
        for f, url in zip(entry["files"], self._urls(entry)):
            dest = os.path.join(dl, f["filename"])
            if os.path.isfile(dest):
                self.log(f"{name}: using the downloaded {f['filename']}")
                digest = sha256_file(dest) if f.get("sha256") else None
                size = os.path.getsize(dest)
                if f.get("sha256") and digest != f["sha256"].lower():
                    raise ChecksumError(f"{name}: SHA-256 mismatch for {f['filename']} (kept from an earlier "
                                        f"download): expected {f['sha256'].lower()}, got {digest}; nothing was kept")
                archives.append({"filename": f["filename"], "url": url, "sha256": digest, "size": size,
                                 "sha256_verified": bool(f.get("sha256"))})
                state["unverified"].append(dest)
                continue
            if self.offline and urllib.parse.urlsplit(url).scheme in ("http", "https"):
                raise OfflineError(f"{name}: offline mode forbids downloading {url}")
            declared = f.get("size") or entry.get("size_estimate_bytes") or 0
            part = dest + ".part"
            have = os.path.getsize(part) if os.path.exists(part) else 0
            if declared:
                self._check_disk(name, max(0, declared - have), declared, convert)
            self.log(f"{name}: downloading {url}" + (f" (resuming at {human_size(have)})" if have else ""))
            res = fetch(url, dest, sha256=f.get("sha256"), size=f.get("size"), opts=self.download_options,
                        label=f["filename"],
                        on_size=lambda total, h, n=name: self._check_disk(n, total - h, total, convert))
            rate = (res.size - res.resumed_from) / max(res.seconds, 1e-9)
            self.log(f"{name}: {f['filename']}: {human_size(res.size)} in {res.seconds:.1f} s "
                     f"({human_size(rate)}/s)" + (f", resumed from {human_size(res.resumed_from)}" if res.resumed_from
                                                 else "") + (f", {res.attempts} attempts" if res.attempts > 1 else "")
                     + (", SHA-256 verified" if f.get("sha256") else ""))
            archives.append({"filename": f["filename"], "url": url, "sha256": res.sha256, "size": res.size,
                             "sha256_verified": bool(f.get("sha256"))})
            state["unverified"].append(dest)
        # unpack
        ext = os.path.join(tmp, "extract")
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
            self._check_disk(name, 0, need, convert)
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
            self.log(f"{name}: SHA-256 of {len(expected)} extracted file(s) match the registry")
        else:
            self.log(f"{name}: note: no published SHA-256 for these files; integrity rests on the archive's "
                     "CRC-32" + (" and the converter's per-tensor CRC32C" if convert and src_fmt == "tf" else "")
                     + ". Their hashes are recorded in the manifest (`bert-of zoo verify` re-checks them)")
        if verified == "registry" or all(a["sha256_verified"] for a in archives):
            state["unverified"] = []
        source = {"kind": "download", "archive": entry["archive"], "archives": archives,
                  "contents": root_files, "contents_verified": verified, "root_in_archive": prefix.rstrip("/"),
                  "root_files": root_files}
        return root, src_fmt, source

    def _convert(self, entry, src_dir, src_fmt, out, fmt, verify):
        from bert_of.errors import BertOfError
        from bert_of.converters.common import Options, summarize
        from bert_of.converters.convert import convert

        name = entry["name"]
        t0 = time.perf_counter()
        self.log(f"{name}: converting {src_fmt} -> {fmt}")
        try:
            source, notes = convert(f"{src_fmt}2{fmt}", src_dir, out, Options())
        except BertOfError as e:
            raise ZooError(f"{name}: cannot produce --format {fmt}: {e}") from None
        conversion = {"direction": f"{src_fmt}2{fmt}", "seconds": round(time.perf_counter() - t0, 2),
                      "report": summarize(source.report), "notes": list(notes or [])}
        if not verify:
            self.log(f"{name}: forward verification skipped (--no-verify)")
            return conversion, None
        from bert_of.converters.verify import verify as forward_verify

        self.log(f"{name}: verifying forward equality {src_fmt} vs {fmt} (TF reference vs bert_of eager + graph)")
        t1 = time.perf_counter()
        try:
            report = forward_verify(src_dir, out)
        except BertOfError as e:
            raise ZooError(f"{name}: cannot verify the {fmt} checkpoint: {e}") from None
        report["seconds"] = round(time.perf_counter() - t1, 2)
        if not report["ok"]:
            raise ZooError(f"{name}: forward verification of the {fmt} checkpoint failed: max |diff| "
                           f"{report['worst']:.3g} > {report['tolerance']:g}; nothing was published")
        self.log(f"{name}: forward outputs agree (max |diff| {report['worst']:.2g} <= {report['tolerance']:g})")
        return conversion, report

    # ------------------------------------------------------------------ verify / remove
    def _verify_published(self, entry: dict, fmt: str, d: str) -> list:
        """Problems (strings) found re-hashing a published folder; [] when intact."""
        man = self.read_manifest(d)
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

    def _check_local_hashes(self, entry: dict) -> list:
        want = entry.get("files_sha256") or {}
        problems = []
        for rel, sha in sorted(want.items()):
            p = os.path.join(entry["path"], rel)
            if not os.path.isfile(p):
                problems.append(f"{rel}: missing")
            elif sha256_file(p) != sha:
                problems.append(f"{rel}: SHA-256 differs from the one recorded by `zoo add`")
        return problems

    def verify(self, name: str, fmt: str | None = None) -> list:
        """Re-hash the cached folders of ``name``: [(format, folder, [problems])]; NotCachedError if none."""
        entry = self.entry(name)
        results = []
        if "path" in entry and fmt in (None, entry["source_format"]):
            results.append((entry["source_format"] + " (local)", self._local_dir(entry),
                            self._check_local_hashes(entry)))
        cached = self.cached_formats(entry)
        for f, d in cached.items():
            if fmt in (None, f):
                results.append((f, d, self._verify_published(entry, f, d)))
        if not results:
            raise NotCachedError(f"{entry['name']}" + (f" ({fmt})" if fmt else "") + f" is not in the cache "
                                 f"{self.cache_dir}; nothing to verify")
        return results

    def remove(self, name: str, fmt: str | None = None) -> list:
        """Delete cached folders (and partial downloads); unregister a `zoo add` entry. Returns what went."""
        entry = self.entry(name)
        name = entry["name"]
        removed = []
        with self._lock(name):
            for f, d in self.cached_formats(entry).items():
                if fmt in (None, f):
                    gone = f"{d}.removing-{os.getpid()}"
                    os.rename(d, gone)  # atomic: no half-deleted folder that still looks published
                    shutil.rmtree(gone, ignore_errors=True)
                    removed.append(d)
            if fmt is None:
                dl = self.downloads_dir(name)
                if os.path.isdir(dl):
                    shutil.rmtree(dl, ignore_errors=True)
                    removed.append(dl)
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(self.cache_dir, "models", name))
        if "path" in entry and fmt is None and entry.get("_registry") == self.local_registry_path:
            with self._lock(".registry.local"):
                entries = [e for e in _reg.load_file(self.local_registry_path) if e["name"] != name]
                _reg.write_file(self.local_registry_path, entries)
            removed.append(f"registry entry {name} (its folder {entry['path']} is left untouched)")
            self._registry = None
        return removed

    # ------------------------------------------------------------------ add
    def add(self, directory: str, name: str, aliases=(), metadata: str | None = None,
            description: str | None = None, force: bool = False) -> dict:
        """Register a local checkpoint folder (referenced in place, content-hashed) in registry.local.json."""
        from bert_of.converters.convert import detect

        directory = os.path.abspath(os.path.expanduser(directory))
        if not os.path.isdir(directory):
            raise ZooError(f"{directory}: not a directory")
        if not _reg.NAME_RE.match(name or ""):
            raise ZooError(f"--name {name!r}: must match {_reg.NAME_RE.pattern}")
        fmt = detect(directory)
        md = {}
        if metadata:
            try:
                with open(metadata) as f:
                    md = json.load(f)
            except OSError as e:
                raise ZooError(f"{metadata}: cannot read metadata ({e.strerror})") from None
            except ValueError as e:
                raise ZooError(f"{metadata}: not valid JSON ({e})") from None
            if not isinstance(md, dict):
                raise ZooError(f"{metadata}: metadata must be a JSON object")
        known = {"description", "aliases", "license", "training", "evaluation", "provenance"}
        evaluation = []
        for i, r in enumerate(md.get("evaluation") or []):
            if not isinstance(r, dict):
                raise ZooError(f"{metadata}: evaluation[{i}] must be an object")
            r = dict(r)
            r.setdefault("source", f"local: {os.path.abspath(metadata)}")
            evaluation.append(r)
        files = hash_tree(directory, skip=())
        cfg_summary, params = _describe_checkpoint(directory, fmt)
        entry = {
            "name": name,
            "aliases": list(aliases or []) + [a for a in md.get("aliases", []) if a not in (aliases or [])],
            "description": description or md.get("description") or f"local {fmt} checkpoint {directory}",
            "source_format": fmt,
            "path": directory,
            "files_sha256": {k: v["sha256"] for k, v in files.items()},
            "size_bytes": sum(v["size"] for v in files.values()),
            "config": cfg_summary,
            "params": params,
            "license": md.get("license", "unspecified"),
            "provenance": dict({"publisher": "local", "added": utc_now(), "by": _user()},
                               **({"metadata_file": os.path.abspath(metadata)} if metadata else {}),
                               **(md.get("provenance") or {})),
            "training": md.get("training"),
            "evaluation": evaluation,
        }
        extra = {k: v for k, v in md.items() if k not in known}
        if extra:
            entry["metadata"] = extra
        entry = _reg.validate_entry(entry, f"zoo add {name}")
        reg = self.registry
        for n in [name] + entry["aliases"]:
            other = reg.lookup(n)
            if other is not None and not force:
                raise ZooError(f"{n}: already names the entry {other['name']} (from {other['_registry']}); "
                               "choose another --name/--alias, or pass --force to replace it")
        if name in reg.entries and reg.entries[name]["_registry"] != self.local_registry_path:
            self.log(f"note: {name} now overrides the entry of {reg.entries[name]['_registry']} "
                     "(later registries win, whole entry)")
        with self._lock(".registry.local"):
            entries = _reg.load_file(self.local_registry_path) if os.path.isfile(self.local_registry_path) else []
            entries = [e for e in entries if e["name"] != name] + [entry]
            _reg.write_file(self.local_registry_path, entries)
        self._registry = None
        return self.entry(name)

    # ------------------------------------------------------------------ listing
    @property
    def results_path(self) -> str:
        """The results store beside the cache (``bert-of eval`` appends to it)."""
        return os.path.join(self.cache_dir, "results.jsonl")

    def measured_squad(self) -> dict:
        """{entry name: latest measured SQuAD v1.1 record} from the results store.

        A record counts for an entry when its checkpoint, or the checkpoint it was fine-tuned
        from, is one of the entry's folders (cached formats or a local entry's folder); records
        of an untrained (newly initialised) SQuAD head do not count.
        """
        from bert_of.errors import BertOfError

        try:
            from bert_of.eval.results import load_results

            records = load_results(self.results_path)
        except (ImportError, BertOfError) as e:
            self.log(f"note: results store not read ({e})")
            return {}
        if not records:
            return {}
        folders = {}
        for e in self.registry.entries.values():
            dirs = list(self.cached_formats(e).values()) + ([e["path"]] if "path" in e else [])
            for d in dirs:
                folders[os.path.realpath(d)] = e["name"]
        out = {}
        for r in records:  # file order is date order: later records win
            if r.get("task") != "squad-v1.1" or r.get("head_trained") is False:
                continue
            m = r.get("metrics") or {}
            if not isinstance(m.get("exact_match"), (int, float)) or not isinstance(m.get("f1"), (int, float)):
                continue
            for ident in (r.get("checkpoint"), r.get("base_checkpoint")):
                p = (ident or {}).get("path") if isinstance(ident, dict) else None
                name = folders.get(os.path.realpath(p)) if isinstance(p, str) else None
                if name:
                    out[name] = {"exact_match": m["exact_match"], "f1": m["f1"], "date": r.get("date"),
                                 "checkpoint": (r.get("checkpoint") or {}).get("name"),
                                 "finetuned_from": (r.get("base_checkpoint") or {}).get("name")}
                    break
        return out

    def rows(self) -> list:
        """One dict per entry for `zoo list`."""
        out = []
        measured = self.measured_squad()
        for e in self.registry.entries.values():
            cached = self.cached_formats(e)
            local = "path" in e
            if cached:
                size, exact = sum(dir_size(d) for d in cached.values()), True
            elif local:
                size, exact = e.get("size_bytes"), True
            else:
                declared = [f.get("size") for f in e.get("files", [])]
                if declared and all(declared):
                    size, exact = sum(declared), True
                else:
                    size, exact = e.get("size_estimate_bytes"), False
            sq = _reg.squad_v11(e)
            out.append({
                "name": e["name"], "aliases": e["aliases"], "params": e.get("params"),
                "size": size, "size_exact": exact, "source_format": e["source_format"],
                "downloaded": (["local"] if local else []) + list(cached),
                "squad_v11": {"exact_match": sq[0], "f1": sq[1], "source": sq[2]} if sq else None,
                "squad_v11_measured": measured.get(e["name"]),
                "registry": e["_registry"],
            })
        return out

    def info(self, name: str) -> dict:
        e = dict(self.entry(name))
        e["registry"] = e.pop("_registry")
        if self.endpoint and e.get("files"):
            e["effective_urls"] = self._urls(self.entry(name))
        cached = {}
        for f, d in self.cached_formats(self.entry(name)).items():
            m = self.read_manifest(d)
            ver = m.get("verification")
            cached[f] = {"path": d, "created": m.get("created"), "size": dir_size(d),
                         "contents_verified": (m.get("source") or {}).get("contents_verified"),
                         "forward_max_abs_diff": ver.get("worst") if ver else None}
        e["cache"] = cached
        return e


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "?"


def _describe_checkpoint(directory: str, fmt: str):
    """(config summary, parameter count) of a local checkpoint, as far as its format tells."""
    try:
        if fmt == "of":
            from bert_of.checkpoint import CONFIG_NAME, WEIGHTS_NAME, SafetensorsFile
            from bert_of.config import BertConfig

            cfg = BertConfig.from_json_file(os.path.join(directory, CONFIG_NAME))
            with SafetensorsFile(os.path.join(directory, WEIGHTS_NAME)) as f:
                params = 0
                for k in f.keys():
                    n = 1
                    for s in f.shape(k):
                        n *= int(s)
                    params += n
            return config_summary(cfg), params
        if fmt == "tf":
            from bert_of.config import BertConfig

            cfg = BertConfig.from_google_json_file(os.path.join(directory, "bert_config.json"))
            return config_summary(cfg), cfg.num_parameters("pretraining")
        from bert_of.converters.convert import read

        src = read(directory, fmt)
        return config_summary(src.config), sum(int(_numel(s.shape)) for s, _ in src.tensors)
    except (OSError, ValueError) as e:
        raise ZooError(f"{directory}: cannot read its config ({e})") from None


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


__all__ = ["Zoo", "FORMATS", "MANIFEST", "default_cache_dir", "hash_tree", "sha256_file"]
