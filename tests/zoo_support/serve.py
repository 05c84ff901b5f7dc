"""A small Range-capable HTTP server for a local mirror folder, with fault injection.

    python -m tests.zoo_support.serve MIRROR_DIR [--port 8000] [--bind 127.0.0.1]   # from the repository

(a test and benchmark tool: it is not part of the installed package)

serves ``MIRROR_DIR`` laid out like storage.googleapis.com
(``bert_models/2018_10_18/uncased_L-12_H-768_A-12.zip``), so that
``BERT_OF_ENDPOINT=http://127.0.0.1:8000/ bert-of zoo download bert-base`` works
on an air-gapped network. Bodies go out with ``sendfile`` (zero copy).

The tests and the download benchmark use :class:`MirrorServer` in a thread;
``faults`` makes a path misbehave on purpose::

    srv.faults["/x.zip"] = {"status": 404}                 # answer 404 (every time)
    srv.faults["/x.zip"] = {"drop_after": 4096, "times": 1} # send 4096 body bytes, then cut the connection
    srv.faults["/x.zip"] = {"delay": 5}                     # wait 5 s before answering
    srv.faults["/x.zip"] = {"stall_after": 1000, "stall": 5} # send 1000 body bytes, go silent for 5 s
    srv.faults["/x.zip"] = {"rate": 2_000_000}              # throttle the body to ~2 MB/s
    srv.faults["/x.zip"] = {"no_range": True}               # ignore Range (always 200)

``requests`` records [method, path, Range header, status] of every request as it
arrives (status None until it is answered).
"""

from __future__ import annotations

import argparse
import email.utils
import os
import posixpath
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "bert_of-mirror/1"

    def log_message(self, fmt, *args):  # quiet
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _fault(self, path):
        srv = self.server
        with srv.lock:
            f = srv.faults.get(path)
            if not f:
                return {}
            times = f.get("times")
            if times is not None:
                if times <= 0:
                    return {}
                f["times"] = times - 1
            return dict(f)

    def _arrived(self, path):
        """Log the request as it arrives (status None until answered: a delayed answer is still seen)."""
        self._rec = [self.command, path, self.headers.get("Range"), None]
        with self.server.lock:
            self.server.requests.append(self._rec)

    def _record(self, path, status):
        with self.server.lock:
            self._rec[3] = status

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _send_error(self, path, code):
        self._record(path, code)
        body = f"{code} {self.responses.get(code, ('',))[0]}\n".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self, head):
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        self._arrived(path)
        fault = self._fault(path)
        if fault.get("delay"):
            time.sleep(fault["delay"])
        if fault.get("status"):
            return self._send_error(path, fault["status"])
        rel = posixpath.normpath(path).lstrip("/")
        if rel.startswith("..") or rel in ("", "."):
            return self._send_error(path, 404)
        full = os.path.join(self.server.root, *rel.split("/"))
        if not os.path.isfile(full):
            return self._send_error(path, 404)
        st = os.stat(full)
        size = st.st_size
        etag = f'"{st.st_size:x}-{int(st.st_mtime_ns):x}"'
        last_mod = email.utils.formatdate(st.st_mtime, usegmt=True)
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and not fault.get("no_range"):
            if_range = self.headers.get("If-Range")
            if if_range is None or if_range in (etag, last_mod):
                try:
                    unit, _, spec = rng.partition("=")
                    a, _, b = spec.split(",")[0].strip().partition("-")
                    if unit.strip() != "bytes":
                        raise ValueError
                    if a == "":
                        start, end = max(0, size - int(b)), size - 1
                    else:
                        start = int(a)
                        end = min(int(b), size - 1) if b else size - 1
                    if start >= size or start > end:
                        self._record(path, 416)
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                except ValueError:
                    start, end, status = 0, size - 1, 200
        length = end - start + 1
        self._record(path, status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", last_mod)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head:
            return
        drop = fault.get("drop_after")
        rate = fault.get("rate")
        with open(full, "rb") as f:
            if drop is not None:
                f.seek(start)
                self.wfile.write(f.read(min(drop, length)))
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if fault.get("hold") is not None:  # half the body, then wait for the test's Event
                f.seek(start)
                half = length // 2
                self.wfile.write(f.read(half))
                self.wfile.flush()
                fault["hold"].wait(120)
                try:
                    self.wfile.write(f.read(length - half))
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                return
            if fault.get("stall_after") is not None:
                f.seek(start)
                self.wfile.write(f.read(min(fault["stall_after"], length)))
                time.sleep(fault.get("stall", 5))
                try:
                    self.wfile.write(f.read(max(0, length - fault["stall_after"])))
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                return
            if rate:
                f.seek(start)
                left, block = length, max(1024, int(rate) // 20)
                try:
                    while left > 0:
                        data = f.read(min(block, left))
                        if not data:
                            break
                        self.wfile.write(data)
                        left -= len(data)
                        time.sleep(len(data) / rate)
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    self.close_connection = True
                return
            try:
                self.connection.sendfile(f, offset=start, count=length)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True


class MirrorServer(ThreadingHTTPServer):
    """``MirrorServer(root)``: serve ``root`` on 127.0.0.1 (port 0 = any free port) in a daemon thread."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0, verbose: bool = False):
        super().__init__((host, port), _Handler)
        self.root = os.path.abspath(root)
        self.faults: dict = {}
        self.requests: list = []
        self.lock = threading.Lock()
        self.verbose = verbose
        self._thread = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> "MirrorServer":
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def gets(self, path: str) -> list:
        """The GET requests for ``path``: [(Range header, status)]."""
        with self.lock:
            return [(r, s) for m, p, r, s in self.requests if m == "GET" and p == path]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.zoo_support.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="mirror folder (bert_models/<date>/<name>.zip ...)")
    ap.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    srv = MirrorServer(args.root, args.bind, args.port, verbose=args.verbose)
    print(f"serving {srv.root} at {srv.url} (Ctrl-C stops)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
