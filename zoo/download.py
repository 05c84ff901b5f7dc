"""One file from a URL onto disk: resumable, retried, timed out, optionally hashed while streaming.

``fetch(url, dest, ...)`` streams ``http(s)://`` (stdlib ``urllib``) or
``file://`` sources into ``dest + ".part"`` and renames it to ``dest`` only
when it is complete and, if a SHA-256 is given, matches it.

- **Resume**: an existing ``.part`` is continued with ``Range: bytes=N-``
  (``If-Range`` with the ETag/Last-Modified recorded beside it, so a file that
  changed on the server restarts instead of being spliced). ``206`` appends;
  ``200`` (no range support, or the file changed) restarts from zero; ``416``
  with a complete part is success.
- **Fail fast**: a host name that does not resolve, a connection refused, a
  TLS handshake that fails or an unreachable network end the download at
  once, in one line naming the host and suggesting ``BERT_OF_OFFLINE=1`` (use
  the cache only) or ``BERT_OF_ENDPOINT`` (a mirror): retrying cannot help,
  and an offline machine should not wait half a minute to be told.
- **Retries**: errors that can pass (timeouts, connections reset or dropped
  mid-body, truncated bodies, HTTP 408/425/429/5xx) are retried with exponential backoff (``backoff * 2**k`` + jitter, capped at
  30 s); ``retries`` consecutive attempts without progress end it (an attempt
  that received >= 64 KiB resets the count: a flaky link that keeps making
  progress is not given up on; at most 100 attempts in all). Other 4xx errors
  are final.
- **Timeouts**: ``timeout`` seconds for the connection and for every read.
- **Hash while streaming** (when a SHA-256 is expected, or ``hashing=True``):
  a helper thread hashes each chunk while the next one is received (hashlib
  releases the GIL), so checking costs no second read and little time; a
  resumed part is hashed first. Google's zips have no published hash of their
  own (their *contents* are hashed, during extraction), so for them nothing is
  hashed here.
- **Progress**: :class:`bert_of.progress.Progress`: a bar on stderr (size, rate,
  ETA) when stderr is a terminal, else a log line every few seconds of a long
  download; none with ``progress=False``.
- **Proxies**: the usual ``http(s)_proxy``/``no_proxy`` variables apply, except
  for loopback hosts, which are always reached directly.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import queue
import random
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Callable, Optional

from bert_of.errors import BertOfError
from bert_of.files.atomic import atomic_write
from bert_of.files.reading import read_json
from bert_of.progress import Progress, log
from bert_of.zoo.errors import ChecksumError, DiskSpaceError, DownloadError

USER_AGENT = "bert_of-zoo/0.1"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
MAX_BACKOFF = 30.0
PROGRESS_BYTES = 64 << 10
MAX_ATTEMPTS = 100


@dataclass
class DownloadOptions:
    timeout: float = 30.0  # seconds, connect and each read
    retries: int = 5  # consecutive attempts without progress allowed after the first
    backoff: float = 1.0  # first wait between attempts; doubles each time
    progress: Optional[bool] = None  # False: none; else bert_of.progress decides (a bar on a terminal)
    chunk_size: int = 512 << 10

    @classmethod
    def from_env(cls, **overrides) -> "DownloadOptions":
        """Defaults, then BERT_OF_DOWNLOAD_{TIMEOUT,RETRIES,BACKOFF}, then explicit (non-None) values."""
        o = cls()
        for key, conv in (("timeout", float), ("retries", int), ("backoff", float)):
            v = os.environ.get(f"BERT_OF_DOWNLOAD_{key.upper()}")
            if v:
                try:
                    setattr(o, key, conv(v))
                except ValueError:
                    raise DownloadError(f"BERT_OF_DOWNLOAD_{key.upper()}={v!r} is not a number") from None
        for k, v in overrides.items():
            if v is not None:
                setattr(o, k, v)
        return o


@dataclass
class FetchResult:
    path: str
    sha256: Optional[str]  # None when not hashed
    size: int
    resumed_from: int  # bytes already on disk when this call started
    attempts: int
    seconds: float
    url: str


class _Transient(Exception):
    """An attempt failed in a way worth retrying."""


def human_size(n) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _progress_bar(total, initial, label, enabled):
    return Progress(label, total=total, unit="B", unit_scale=True, initial=initial, enabled=enabled is not False)


def _opener(url: str):
    host = urllib.parse.urlsplit(url).hostname or ""
    if host in LOOPBACK:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def _read_meta(path):
    """The validators recorded beside a part; {} when missing or unreadable (then no resume is spliced)."""
    try:
        return read_json(path, "download state")
    except BertOfError:
        return {}


def _remove(*paths):
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def _raise_disk(e: OSError, part: str):
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskSpaceError(f"{part}: disk full while downloading ({e.strerror}); the partial file is kept "
                             "and the download resumes once space is freed") from None


def _write_all(f, data: bytes) -> None:
    """An unbuffered write may be short: write until all of ``data`` is in the file."""
    mv = memoryview(data)
    while mv:
        n = f.write(mv)
        mv = mv[n:]


def _total_from_content_range(value: Optional[str]):
    """'bytes 100-199/1000' -> (100, 1000); 'bytes */1000' -> (None, 1000)."""
    if not value or not value.startswith("bytes "):
        return None, None
    rng, _, total = value[6:].partition("/")
    start = None
    if rng.strip() != "*":
        try:
            start = int(rng.split("-")[0])
        except ValueError:
            return None, None
    try:
        return start, int(total)
    except ValueError:
        return start, None


class _Hasher:
    """SHA-256 of the chunks written, computed by a helper thread while the next chunk is received."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        if not enabled:
            return
        self.h = hashlib.sha256()
        self._q: queue.Queue = queue.Queue(maxsize=16)  # bounded: a slow hasher slows the reader down
        self._thread = threading.Thread(target=self._run, name="zoo-sha256", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            data = self._q.get()
            if data is None:
                return
            self.h.update(data)  # releases the GIL

    def update(self, data: bytes) -> None:
        if self.enabled:
            self._q.put(data)

    def hash_file(self, path: str, chunk: int) -> None:
        """Hash an existing part (before appending to it)."""
        if not self.enabled:
            return
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(chunk), b""):
                self.update(block)

    def hexdigest(self):
        if not self.enabled:
            return None
        self.close()
        return self.h.hexdigest()

    def close(self) -> None:
        if self.enabled and self._thread.is_alive():
            self._q.put(None)
            self._thread.join()


def fetch(url: str, dest: str, *, sha256: Optional[str] = None, size: Optional[int] = None,
          hashing: Optional[bool] = None, opts: Optional[DownloadOptions] = None, label: Optional[str] = None,
          on_size: Optional[Callable[[int, int], None]] = None) -> FetchResult:
    """Download ``url`` to ``dest`` (resuming ``dest.part``); verify ``sha256``/``size`` if given.

    hashing: compute the SHA-256 while streaming (default: only when
    ``sha256`` is given). ``on_size(total, have)`` is called once the response
    arrives, before any new byte is written (e.g. a disk-space check; ``total``
    is None when the server sends no length); it may raise. On a checksum or size mismatch nothing is kept.
    """
    opts = opts or DownloadOptions()
    label = label or os.path.basename(dest)
    hashing = bool(sha256) if hashing is None else (hashing or bool(sha256))
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    part, meta_path = dest + ".part", dest + ".part.json"
    t0 = time.perf_counter()
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "file":
        digest, total, resumed_from, attempts = _fetch_file(url, part, hashing, opts, label, on_size)
    elif scheme in ("http", "https"):
        digest, total, resumed_from, attempts = _Http(url, part, meta_path, hashing, opts, label, on_size).run()
    else:
        raise DownloadError(f"{url}: unsupported URL scheme {scheme!r} (http, https, file)")
    if size is not None and total != size:
        _remove(part, meta_path)
        raise ChecksumError(f"{label}: size mismatch for {os.path.basename(dest)} from {url}: expected {size} bytes, "
                            f"got {total}; nothing was kept")
    if sha256 is not None and digest != sha256.lower():
        _remove(part, meta_path)
        raise ChecksumError(f"{label}: SHA-256 mismatch for {os.path.basename(dest)} from {url}: expected "
                            f"{sha256.lower()}, got {digest}; nothing was kept")
    os.replace(part, dest)
    _remove(meta_path)
    return FetchResult(dest, digest, total, resumed_from, attempts, time.perf_counter() - t0, url)


# ----------------------------------------------------------------------------- file://


def _fetch_file(url, part, hashing, opts, label, on_size):
    src = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
    if not os.path.isfile(src):
        raise DownloadError(f"{url}: no such file ({src})")
    total = os.path.getsize(src)
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if have > total:
        _remove(part)
        have = 0
    resumed = have
    hasher = _Hasher(hashing)
    bar = None
    try:
        if have:
            hasher.hash_file(part, opts.chunk_size)
        if on_size:
            on_size(total, have)
        bar = _progress_bar(total, have, label, opts.progress)
        with open(src, "rb") as fin, open(part, "ab") as fout:
            fin.seek(have)
            for block in iter(lambda: fin.read(opts.chunk_size), b""):
                try:
                    fout.write(block)
                except OSError as e:
                    _raise_disk(e, part)
                    raise
                hasher.update(block)
                have += len(block)
                if bar is not None:
                    bar.update(len(block))
        return hasher.hexdigest(), have, resumed, 1
    finally:
        hasher.close()
        if bar is not None:
            bar.close()


# ----------------------------------------------------------------------------- http(s)


def _fail_if_unreachable(url: str, reason) -> None:
    """Raise DownloadError for a connection failure no retry can fix: no DNS answer, nothing
    listening, a TLS handshake refused, no route to the network."""
    host = urllib.parse.urlsplit(url).netloc
    if isinstance(reason, socket.gaierror):
        why = f"cannot resolve the host {host} ({reason.strerror or reason})"
    elif isinstance(reason, ConnectionRefusedError):
        why = f"{host} refused the connection"
    elif isinstance(reason, ssl.SSLError):
        why = f"TLS handshake with {host} failed ({reason.reason or reason})"
    elif isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        why = f"no route to {host} ({reason.strerror})"
    else:
        return
    raise DownloadError(f"{url}: {why}; offline? BERT_OF_OFFLINE=1 uses the cache only, "
                        "BERT_OF_ENDPOINT=<URL> downloads from a mirror") from None



class _Http:
    """One HTTP download: the part file, its hash so far, the server's validators."""

    def __init__(self, url, part, meta_path, hashing, opts, label, on_size):
        self.url, self.part, self.meta_path = url, part, meta_path
        self.hashing, self.opts, self.label, self.on_size = hashing, opts, label, on_size
        self.opener = _opener(url)
        self.size_checked = False
        self.have = os.path.getsize(part) if os.path.exists(part) else 0
        self.meta = _read_meta(meta_path) if self.have else {}
        if self.have and self.meta.get("url") not in (None, url):
            _remove(part, meta_path)  # a part from another URL: never splice
            self.have, self.meta = 0, {}
        elif not self.have:
            _remove(part)
        self.hasher = _Hasher(hashing)
        if self.have:
            self.hasher.hash_file(part, opts.chunk_size)

    def _reset(self):
        _remove(self.part, self.meta_path)
        self.have, self.meta = 0, {}
        self.hasher.close()
        self.hasher = _Hasher(self.hashing)

    def run(self):
        try:
            return self._run()
        finally:
            self.hasher.close()

    def _run(self):
        resumed_from = self.have
        failures = attempts = 0
        while True:
            attempts += 1
            before = self.have
            try:
                total = self._attempt()
                if total is None or self.have == total:
                    return self.hasher.hexdigest(), self.have, resumed_from, attempts
                raise _Transient(f"connection closed at {self.have} of {total} bytes")
            except _Transient as e:
                # an attempt that moved the download on by >= 64 KiB restarts the count: a link that keeps
                # dropping but keeps making progress is not given up on (a trickle is not progress)
                failures = 0 if self.have - before >= PROGRESS_BYTES else failures + 1
                if failures > self.opts.retries or attempts >= MAX_ATTEMPTS:
                    msg = f"{self.url}: {e}; gave up after {attempts} attempt(s)"
                    if "timed out" in str(e):
                        msg += f" (timeout {self.opts.timeout:g} s)"
                    if self.have:
                        msg += f"; {self.have} bytes kept in {self.part} to resume later"
                    raise DownloadError(msg) from None
                wait = min(MAX_BACKOFF, self.opts.backoff * 2 ** max(0, failures - 1))
                wait *= 1 + 0.1 * random.random()  # jitter: concurrent clients do not retry in lockstep
                log.warning(f"{self.label}: {e}; retrying in {wait:.1f} s (resuming at {self.have} bytes)")
                time.sleep(wait)

    def _attempt(self):
        """One request, appending to the part. Returns the total size (None if the server did not say)."""
        headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if self.have:
            headers["Range"] = f"bytes={self.have}-"
            validator = self.meta.get("etag") or self.meta.get("last_modified")
            if validator:
                headers["If-Range"] = validator
        try:
            resp = self.opener.open(urllib.request.Request(self.url, headers=headers), timeout=self.opts.timeout)
        except urllib.error.HTTPError as e:
            return self._http_error(e)
        except (socket.timeout, TimeoutError) as e:
            raise _Transient(f"timed out waiting for the server ({e})") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (socket.timeout, TimeoutError)):
                raise _Transient(f"timed out waiting for the server ({e.reason})") from None
            _fail_if_unreachable(self.url, e.reason)
            raise _Transient(f"cannot connect: {e.reason}") from None
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            _fail_if_unreachable(self.url, e)
            raise _Transient(f"connection failed: {e.__class__.__name__}: {e}") from None
        with resp:
            if resp.status == 206:
                start, total = _total_from_content_range(resp.headers.get("Content-Range"))
                if start != self.have:  # not the range we asked for: start over cleanly
                    self._reset()
                    raise _Transient(f"server answered range {start}- instead of {self.have}-")
            elif resp.status == 200:
                if self.have:  # Range ignored, or the file changed (If-Range): restart from zero
                    log.warning(f"{self.label}: the server sent the whole file; restarting from 0")
                    self._reset()
                length = resp.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
            else:
                raise DownloadError(f"{self.url}: unexpected HTTP status {resp.status}")
            meta = {"url": self.url, "etag": resp.headers.get("ETag"),
                    "last_modified": resp.headers.get("Last-Modified")}
            if meta != self.meta:
                atomic_write(self.meta_path, json.dumps(meta))
                self.meta = meta
            if not self.size_checked and self.on_size:
                self.on_size(total, self.have)  # total None: the server did not say
                self.size_checked = True
            self._stream(resp, total)
            return total

    def _http_error(self, e):
        code = e.code
        content_range = e.headers.get("Content-Range") if e.headers else None
        e.close()
        if code == 416 and self.have:
            _, total = _total_from_content_range(content_range)
            if total == self.have:
                return total  # the part is already complete
            self._reset()
            raise _Transient("range not satisfiable; restarting from 0")
        if code in TRANSIENT_HTTP:
            raise _Transient(f"HTTP {code} {e.reason}")
        self._reset()
        what = {404: "not found on the server", 410: "gone from the server", 403: "access denied",
                401: "authentication required"}.get(code, "refused by the server")
        raise DownloadError(f"{self.url}: {what} (HTTP {code} {e.reason})")

    def _stream(self, resp, total):
        bar = _progress_bar(total, self.have, self.label, self.opts.progress)
        hasher, chunk = self.hasher, self.opts.chunk_size
        try:
            with open(self.part, "ab", buffering=0) as f:
                while True:
                    try:
                        # read1: whatever has arrived (up to chunk), so the part grows as data comes in;
                        # b"" when the peer closes (early or not: run() compares with the total)
                        data = resp.read1(chunk)
                    except (socket.timeout, TimeoutError) as e:
                        raise _Transient(f"timed out reading ({e})") from None
                    except (ConnectionError, http.client.HTTPException) as e:
                        raise _Transient(f"connection dropped at {self.have} of {total} bytes "
                                         f"({e.__class__.__name__})") from None
                    if not data:
                        break
                    try:
                        _write_all(f, data)
                    except OSError as e:
                        _raise_disk(e, self.part)
                        raise
                    hasher.update(data)
                    self.have += len(data)
                    if bar is not None:
                        bar.update(len(data))
        finally:
            if bar is not None:
                bar.close()
