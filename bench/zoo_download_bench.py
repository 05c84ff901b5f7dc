"""Download throughput of the zoo's downloader vs curl, from the same loopback server.

    .venv/bin/python bench/zoo_download_bench.py [--size-mb 300] [--runs 3]

Generates a random file (incompressible, like model weights), serves it with
tests/zoo_support/serve.py's MirrorServer (sendfile, so the server is not the bottleneck) on
127.0.0.1, and alternates three clients for --runs rounds (rotating who goes
first), each into a fresh file:

- curl:        `curl -s -f -o FILE URL`
- ours:        zoo.download.fetch as `bert-of zoo download` runs it for Google's
               zips (resumable .part, retries, timeouts; no hash of the zip
               itself: Google publishes hashes of the files inside, checked
               while extracting)
- ours_sha256: the same with a SHA-256 computed while streaming and checked
               (registry entries that publish the archive's hash)

Prints JSON: MB/s per run, medians, ratio = ours/curl (target >= 0.8) and
ratio_with_sha256. Not a timed test; loopback numbers move with machine load.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_of.zoo.download import DownloadOptions, fetch  # noqa: E402
from tests.zoo_support.serve import MirrorServer  # noqa: E402


def make_file(path: str, size: int) -> str:
    h = hashlib.sha256()
    block = 8 << 20
    with open(path, "wb") as f:
        left = size
        while left:
            data = os.urandom(min(block, left))
            f.write(data)
            h.update(data)
            left -= len(data)
    return h.hexdigest()


def run_curl(url: str, dest: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["curl", "-s", "-f", "-o", dest, url], check=True)
    return time.perf_counter() - t0


def run_ours(url: str, dest: str, sha) -> float:
    t0 = time.perf_counter()
    fetch(url, dest, sha256=sha, opts=DownloadOptions(progress=False))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", help="where to put the file (default: a temp dir, removed at the end)")
    args = ap.parse_args(argv)
    curl = shutil.which("curl")
    if not curl:
        print(json.dumps({"error": "curl not found (apt-get install -y curl)"}))
        return 1
    work = args.workdir or tempfile.mkdtemp(prefix="zoo-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        size = args.size_mb * 1_000_000
        src_dir = os.path.join(work, "srv")
        os.makedirs(src_dir, exist_ok=True)
        sha = make_file(os.path.join(src_dir, "blob.bin"), size)
        out_dir = os.path.join(work, "out")
        os.makedirs(out_dir, exist_ok=True)
        curl_version = subprocess.run([curl, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        clients = {
            "curl": lambda url, dest: run_curl(url, dest),
            # what `bert-of zoo download` does for Google's zips: they publish no hash of the zip itself
            # (the SHA-256 of the files inside are checked during extraction), so nothing is hashed here
            "ours": lambda url, dest: run_ours(url, dest, None),
            # a registry entry with the archive's SHA-256: hashed while streaming (helper thread), then checked
            "ours_sha256": lambda url, dest: run_ours(url, dest, sha),
        }
        times = {k: [] for k in clients}
        with MirrorServer(src_dir) as srv:
            url = srv.url + "blob.bin"
            for fn in clients.values():  # warm-up (page cache, code paths): not counted
                fn(url, os.path.join(out_dir, "warm"))
                os.remove(os.path.join(out_dir, "warm"))
            order = list(clients)
            for i in range(args.runs):
                for who in order[i % len(order):] + order[:i % len(order)]:  # rotate who goes first
                    dest = os.path.join(out_dir, f"{who}-{i}")
                    times[who].append(clients[who](url, dest))
                    os.remove(dest)
        mb = size / 1e6
        rates = {k: [mb / t for t in v] for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in rates.items()}
        load = os.getloadavg()
        result = {
            "bench": "zoo download throughput vs curl (loopback, same sendfile server)",
            "file_mb": mb, "runs": args.runs, "cpus": os.cpu_count(), "loadavg_1m": round(load[0], 2),
            "curl": curl_version,
            "mb_s": {k: [round(r, 1) for r in v] for k, v in rates.items()},
            "median_mb_s": {k: round(v, 1) for k, v in med.items()},
            "ratio": round(med["ours"] / med["curl"], 3),
            "ratio_with_sha256": round(med["ours_sha256"] / med["curl"], 3),
            "target": "ratio >= 0.8",
        }
        result["met"] = result["ratio"] >= 0.8
        print(json.dumps(result, indent=1))
        return 0
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
