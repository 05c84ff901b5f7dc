"""The Zoo: its settings (cache, registries, offline, endpoint), registry lookups, and the
operations of ``bert-of zoo``, each implemented in the module of its concern:

- zoo.registry  registry files: schema, merge rule, endpoint rule
- zoo.build     one entry into the cache (zoo.download fetches, zoo.archive extracts)
- zoo.cache     the cache on disk: layout, manifests, locks, re-verification
- zoo.local     entries made by ``zoo add``
- zoo.listing   ``zoo list`` / ``zoo info``
- zoo.resolve   a name or a path (any format) -> a bert_of checkpoint folder
"""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse

from bert_of.files.home import bert_of_home
from bert_of.progress import log
import bert_of.zoo.build as _build
import bert_of.zoo.listing as _listing
import bert_of.zoo.local as _local
import bert_of.zoo.registry as _reg
import bert_of.zoo.resolve as _resolve
from bert_of.zoo.cache import (FORMATS, MANIFEST, cached_formats, check_local_hashes, dir_size, downloads_dir,
                               entry_lock, hash_tree, verify_published)
from bert_of.zoo.download import DownloadOptions
from bert_of.zoo.errors import NotCachedError, ZooError

TRUE = ("1", "true", "yes", "on")

default_cache_dir = bert_of_home


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in TRUE


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
            self._registry = _reg.merge(self.registry_paths(), lenient={self.local_registry_path})
        return self._registry

    @property
    def local_registry_path(self) -> str:
        return os.path.join(self.cache_dir, _reg.LOCAL_NAME)

    @property
    def results_path(self) -> str:
        """The results store beside the cache (``bert-of eval`` appends to it)."""
        return os.path.join(self.cache_dir, "results.jsonl")

    def entry(self, name: str) -> dict:
        return self.registry.get(name)

    def log(self, msg: str) -> None:
        """A progress note (the ``bert_of`` logger; ``quiet=True`` drops it)."""
        if not self.quiet:
            log.info(msg)

    # ------------------------------------------------------------------ cache
    def downloads_dir(self, name: str) -> str:
        return downloads_dir(self.cache_dir, name)

    def cached_formats(self, entry: dict) -> dict:
        return cached_formats(self.cache_dir, entry)

    def path(self, name: str, fmt: str = "of") -> str:
        """The cached folder of ``name`` in ``fmt`` (a local entry's own folder), or NotCachedError."""
        entry = self.entry(name)
        if "path" in entry and fmt == entry["source_format"]:
            return _build.local_dir(entry)
        p = self.cached_formats(entry).get(fmt)
        if p is None:
            raise NotCachedError(f"{entry['name']} ({fmt}) is not in the cache {self.cache_dir}; "
                                 f"`bert-of zoo download {entry['name']}"
                                 + (f" --format {fmt}" if fmt != "of" else "") + "` fetches it")
        return p

    def resolve(self, name_or_path, download: bool = True, vocab: str | None = None) -> str:
        """A bert_of checkpoint folder for a zoo name, a bert_of folder or a checkpoint in any format."""
        return _resolve.resolve_details(self, name_or_path, download=download, vocab=vocab).path

    def resolve_details(self, name_or_path, download: bool = True, vocab: str | None = None) -> _resolve.Resolved:
        """As :meth:`resolve`, with the display name, source format, conversion report and source path."""
        return _resolve.resolve_details(self, name_or_path, download=download, vocab=vocab)

    def download(self, name: str, fmt: str = "of", verify: bool = True, force: bool = False,
                 keep_archive: bool = False) -> str:
        """Download, check, extract and convert ``name`` into the cache; return the folder.

        Already cached: returns at once, without any network access.
        """
        return _build.download(self, name, fmt, verify=verify, force=force, keep_archive=keep_archive)

    def verify(self, name: str, fmt: str | None = None) -> list:
        """Re-hash the cached folders of ``name``: [(format, folder, [problems])]; NotCachedError if none."""
        entry = self.entry(name)
        results = []
        if "path" in entry and fmt in (None, entry["source_format"]):
            results.append((entry["source_format"] + " (local)", _build.local_dir(entry), check_local_hashes(entry)))
        cached = self.cached_formats(entry)
        for f, d in cached.items():
            if fmt in (None, f):
                results.append((f, d, verify_published(entry, f, d)))
        if not results:
            raise NotCachedError(f"{entry['name']}" + (f" ({fmt})" if fmt else "") + f" is not in the cache "
                                 f"{self.cache_dir}; nothing to verify")
        return results

    def remove(self, name: str, fmt: str | None = None) -> list:
        """Delete cached folders (and partial downloads); unregister a `zoo add` entry. Returns what went."""
        entry = self.entry(name)
        name = entry["name"]
        removed = []
        with entry_lock(self.cache_dir, name, self.log):
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
            _local.unregister(self, name)
            removed.append(f"registry entry {name} (its folder {entry['path']} is left untouched)")
            self._registry = None
        return removed

    # ------------------------------------------------------------------ the cache as a whole
    def cache_rows(self) -> list:
        """Everything in the cache, one dict each (id, kind, path, size, source, state): zoo entries
        (``NAME/FORMAT``), partial downloads (``downloads/NAME``), converted copies (their key)."""
        rows = []
        models = os.path.join(self.cache_dir, "models")
        for name in sorted(os.listdir(models)) if os.path.isdir(models) else ():
            for fmt in FORMATS:
                d = os.path.join(models, name, fmt)
                if os.path.isfile(os.path.join(d, MANIFEST)):
                    rows.append({"id": f"{name}/{fmt}", "kind": "zoo entry", "path": d, "size": dir_size(d),
                                 "source": name, "state": "current"})
        downloads = os.path.join(self.cache_dir, "downloads")
        for name in sorted(os.listdir(downloads)) if os.path.isdir(downloads) else ():
            d = os.path.join(downloads, name)
            rows.append({"id": f"downloads/{name}", "kind": "partial download", "path": d, "size": dir_size(d),
                         "source": name, "state": "resumable"})
        return rows + _resolve.converted_copies(self)

    def cache_remove(self, ident: str) -> list:
        """Remove what ``ident`` names: a converted copy (its key, a unique prefix of 6+ characters, or
        the source path it was converted from), or a zoo entry (``NAME``, ``NAME/FORMAT``: as ``zoo
        remove``). Returns the paths removed."""
        copies = _resolve.converted_copies(self)
        real = os.path.realpath(os.path.expanduser(ident))
        hit = [c for c in copies if c["id"] == ident or (len(ident) >= 6 and c["id"].startswith(ident))
               or (c["source"] and os.path.realpath(c["source"]) == real)
               or any(os.path.realpath(u) == real for u in c["used_by"])]
        if hit:
            for c in hit:
                _resolve.remove_copy(self, c)
            return [c["path"] for c in hit]
        name, _, fmt = ident.partition("/")
        if self.registry.lookup(name) is None:
            raise ZooError(f"{ident}: not in the cache {self.cache_dir} (`bert-of zoo cache list` shows what is)")
        return self.remove(name, fmt or None)

    def cache_prune(self, dry_run: bool = False) -> list:
        """Remove the converted copies whose sources are gone or hold other content now."""
        return _resolve.prune_copies(self, dry_run)

    # ------------------------------------------------------------------ add, list, info
    def add(self, directory: str, name: str, aliases=(), metadata: str | None = None,
            description: str | None = None, overwrite: bool = False) -> dict:
        """Register a local checkpoint folder (referenced in place, content-hashed) in registry.local.json."""
        return _local.add(self, directory, name, aliases, metadata, description, overwrite)

    def rows(self) -> list:
        """One dict per entry for `zoo list`."""
        return _listing.rows(self)

    def info(self, name: str) -> dict:
        return _listing.info(self, name)


__all__ = ["Zoo", "FORMATS", "MANIFEST", "default_cache_dir", "hash_tree"]
