"""Model zoo on loopback: a real HTTP server (tests/zoo_support/serve.py: MirrorServer on 127.0.0.1) serves Google-layout
zips built here (a tiny model saved by TensorFlow's own Saver, in Google's folder and file names).

Covered: the shipped registry; a clean download; `bert-of zoo download bert-base` against a mirror of
the real URL layout (download -> verify -> extract -> tf2of -> forward verification -> cache), then
list/path/verify/remove and from_pretrained("bert-base") offline; a connection dropped mid-file and
resumed (and a .part left by an earlier run, and a file changed on the server); a wrong checksum (of
a file inside and of the archive); 404; a server too slow (timeout); archives with path-escape
members (.., absolute, symlink; zip and tar); two concurrent downloads of one entry; offline mode
with and without a cached copy; user registries (merge rule); `zoo add`; disk-space check; file://
and the endpoint rule. No external host is ever contacted.
"""

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import time
import zipfile

import pytest

from tests.conftest import ROOT, TINY, run_cli
from tests.zoo_support.release import (RELEASE_FILES, make_release_dir, registry_entry, sha256, write_registry,
                                       zip_release)
from bert_of.errors import CheckpointError
from bert_of.zoo import registry as zreg
from bert_of.zoo.core import MANIFEST, Zoo
from bert_of.zoo.download import DownloadOptions, fetch
from bert_of.zoo.errors import (ChecksumError, DiskSpaceError, DownloadError, NotCachedError, OfflineError,
                        UnknownEntryError, UnsafeArchiveError, ZooError)
from tests.zoo_support.serve import MirrorServer

pytestmark = pytest.mark.tf

GOOGLE = "https://storage.googleapis.com/"
REAL_PATH = "bert_models/2018_10_18/uncased_L-12_H-768_A-12.zip"
FOLDER = "uncased_L-2_H-32_A-4"
FAST = DownloadOptions(timeout=5, retries=2, backoff=0.01, progress=False)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Google's five files for a 2-layer model (TF Saver), and its zips."""
    root = tmp_path_factory.mktemp("release")
    files = make_release_dir(str(root / "files"), dict(TINY, num_hidden_layers=2))
    zips = root / "zips"
    hashes = zip_release(files, str(zips / "tiny.zip"), FOLDER)
    zip_release(files, str(zips / "real.zip"), "uncased_L-12_H-768_A-12")
    zip_release(files, str(zips / "flat.zip"), None)  # the 2020 miniatures' layout: no top folder
    return {"files": files, "hashes": hashes, "zips": zips}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    srv = MirrorServer(str(root)).start()
    yield srv
    srv.stop()


@pytest.fixture
def serve(server, release, request):
    """serve(zip name, path=None) -> URL of a copy of that zip under a path unique to this test."""

    def put(zip_name="tiny.zip", path=None, src=None):
        path = path or f"t/{request.node.name}/{zip_name}"
        dst = os.path.join(server.root, *path.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src or str(release["zips"] / zip_name), dst)
        return server.url + path

    return put


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private cache; no zoo environment leaking in from outside."""
    for k in ("BERT_OF_OFFLINE", "BERT_OF_ENDPOINT", "BERT_OF_REGISTRY", "BERT_OF_DOWNLOAD_TIMEOUT",
              "BERT_OF_DOWNLOAD_RETRIES", "BERT_OF_DOWNLOAD_BACKOFF"):
        monkeypatch.delenv(k, raising=False)
    h = tmp_path / "home"
    monkeypatch.setenv("BERT_OF_HOME", str(h))
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    return h


def zoo_with(home, tmp_path, entries, **kw):
    reg = write_registry(tmp_path / "reg.json", entries)
    kw.setdefault("download_options", FAST)
    return Zoo(cache_dir=str(home), registries=[reg], **kw), reg


def run_zoo(*args, env=None, timeout=120):
    """``bert-of zoo ARGS``."""
    return run_cli("zoo", *args, check=False, timeout=timeout, env={"no_proxy": "127.0.0.1,localhost", **(env or {})})


def zoo_lines(stderr):
    """stderr without OneFlow/TF start-up chatter."""
    noise = ("W2026", "I2026", "E2026", "libibverbs", "WARNING:tensorflow", "oneDNN", "To enable",
             "cpu_feature_guard")
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(noise) and "tensorflow/core" not in ln]


def leftovers(home, name):
    """Everything the cache holds for ``name`` besides its lock file."""
    out = []
    for sub in ("models", "downloads"):
        d = os.path.join(home, sub, name)
        if os.path.exists(d):
            out += [os.path.join(d, x) for x in os.listdir(d)] or [d]
    tmp = os.path.join(home, "tmp")
    if os.path.isdir(tmp):
        out += [os.path.join(tmp, x) for x in os.listdir(tmp)]
    return out


# --------------------------------------------------------------------------- the shipped registry


def test_shipped_registry_has_every_google_release_with_facts():
    reg = zreg.merge([zreg.SHIPPED])
    entries = reg.entries
    assert len(entries) == 33  # 7 originals + 2 whole-word-masking + 24 miniatures
    hashed = [e for e in entries.values() if e["contents_sha256"]]
    assert len(hashed) == 7 and all(set(e["contents_sha256"]) == set(RELEASE_FILES) for e in hashed)
    assert reg.get("bert-base")["name"] == "bert-base-uncased"
    assert reg.get("bert-large")["name"] == "bert-large-uncased"
    assert reg.get("bert-mini")["name"] == "bert-uncased-L-4-H-256-A-4"
    assert reg.get("bert-tiny")["config"]["H"] == 128
    base = entries["bert-base-uncased"]
    assert base["files"][0]["url"] == GOOGLE + REAL_PATH
    assert base["contents_sha256"]["vocab.txt"] == "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
    assert base["config"] == dict(base["config"], L=12, H=768, A=12, I=3072, V=30522)
    assert 109e6 < base["params"] < 111e6
    assert zreg.squad_v11(base)[:2] == (80.72, 88.41)
    # the multilingual naming caveat is carried into the entry
    mu = entries["bert-base-multilingual-uncased"]
    assert mu["files"][0]["filename"] == "multilingual_L-12_H-768_A-12.zip" and mu["config"]["L"] == 12
    assert "UNCASED" in mu["provenance"]["note"]
    for e in entries.values():
        assert e["license"] == "Apache-2.0" and e["files"][0]["url"].startswith(GOOGLE)
        assert all(r["source"] for r in e["evaluation"])
        assert e["expected_files"] == list(RELEASE_FILES)
    # the reference sheet the registry was generated from (a copy in tests/data/zoo)
    with open(os.path.join(ROOT, "tests", "data", "zoo", "google_checkpoints.json")) as f:
        for c in json.load(f)["checkpoints"]:
            assert entries[c["name"]]["files"][0]["url"] == c["url"]
            assert entries[c["name"]]["contents_sha256"] == c["sha256_of_extracted_files"]


def test_cli_list_info_and_bert_of_entry_point(home):
    r = run_zoo("list")
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0].split()
    assert head == ["NAME", "ALIAS", "PARAMS", "SIZE", "FORMAT", "DOWNLOADED", "SQuAD1.1", "EM/F1"]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("bert-base-uncased "))
    assert row.split() == ["bert-base-uncased", "bert-base", "110.1M", "~420.0", "MiB", "tf", "-", "80.72/88.41"]
    r = run_zoo("info", "bert-base")
    assert r.returncode == 0 and "registry:" in r.stdout and zreg.SHIPPED in r.stdout
    assert "source: google-research/bert README" in r.stdout
    # the same command through `bert-of zoo`
    e = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "zoo", "info", "bert-large", "--json"], env=e,
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "bert-large-uncased"
    r = run_zoo("info", "bert-bsae")
    assert r.returncode == 1 and zoo_lines(r.stderr) == [
        "bert-of: error: bert-bsae: not a zoo entry; did you mean bert-base, bert-small, bert-large? "
        "(`bert-of zoo list` shows them all)"]


# --------------------------------------------------------------------------- downloads


def test_clean_download_tf_format(home, tmp_path, serve, server, release):
    url = serve()
    z, _ = zoo_with(home, tmp_path, [registry_entry("tiny", url, release["hashes"], aliases=["tiny-alias"])])
    path = z.download("tiny-alias", "tf")
    assert path == str(home / "models" / "tiny" / "tf")
    assert sorted(os.listdir(path)) == sorted(list(RELEASE_FILES) + [MANIFEST])
    for f in RELEASE_FILES:
        assert sha256(os.path.join(path, f)) == release["hashes"][f]
    man = json.load(open(os.path.join(path, MANIFEST)))
    assert man["source"]["contents_verified"] == "registry" and man["source"]["root_in_archive"] == FOLDER
    assert server.gets(url[len(server.url) - 1:]) == [(None, 200)]
    assert leftovers(home, "tiny") == [path]  # archive removed after publishing; no tmp folders
    assert z.verify("tiny") == [("tf", path, [])]
    # cached: returned at once, no request
    assert z.download("tiny", "tf") == path and len(server.gets(url[len(server.url) - 1:])) == 1


def test_download_bert_base_from_a_mirror_of_the_real_layout(home, tmp_path, serve, server, release):
    """`bert-of zoo download bert-base` with BERT_OF_ENDPOINT pointing at a loopback mirror that serves the
    real URL path and folder name (a tiny model inside: the real hashes belong to the real 440 MB files, so
    a test registry overrides bert-base-uncased with this zip's hashes)."""
    serve("real.zip", path=REAL_PATH)
    shipped = zreg.merge([zreg.SHIPPED]).entries["bert-base-uncased"]
    override = {k: v for k, v in shipped.items() if not k.startswith("_")}
    override["contents_sha256"] = release["hashes"]  # the real URL stays: the endpoint rewrites it
    reg = write_registry(tmp_path / "override.json", [override])
    env = {"BERT_OF_HOME": str(home), "BERT_OF_ENDPOINT": server.url, "BERT_OF_REGISTRY": reg}
    r = run_zoo("download", "bert-base", env=env)
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    assert path == str(home / "models" / "bert-base-uncased" / "of")
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors", "vocab.txt", MANIFEST]
    log = "\n".join(zoo_lines(r.stderr))
    assert f"downloading {server.url}{REAL_PATH}" in log
    assert "SHA-256 of 5 extracted file(s) match the registry" in log and "forward outputs agree" in log
    man = json.load(open(os.path.join(path, MANIFEST)))
    assert man["verification"]["ok"] and man["verification"]["worst"] <= 1e-5
    assert set(man["verification"]["max_abs_diff"]) == {"B:eager", "B:graph"}
    assert man["conversion"]["direction"] == "tf2of" and man["source"]["archives"][0]["url"] == server.url + REAL_PATH
    assert server.gets("/" + REAL_PATH) == [(None, 200)]
    assert leftovers(home, "bert-base-uncased") == [path]
    # list / path / verify see it; the Python API loads it by name, offline, without the network
    r = run_zoo("list", "--downloaded", env=env)
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("bert-base-uncased"))
    assert row.split()[-3:] == ["tf", "of", "80.72/88.41"]
    assert run_zoo("path", "bert-base", env=env).stdout.strip() == path
    assert run_zoo("verify", "bert-base", env=env).stdout.split()[:2] == ["ok", "of"]
    code = ("from bert_of import zoo; from bert_of import BertForQuestionAnswering as Q; p = zoo.resolve('bert-base');"
            "m = Q.from_pretrained('bert-base'); print(p); print(m.config.num_hidden_layers)")
    e = dict(os.environ, PYTHONPATH=ROOT, BERT_OF_OFFLINE="1", **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [path, "2"]
    assert len(server.gets("/" + REAL_PATH)) == 1  # nothing fetched again
    # tampering is caught by `zoo verify`, which names the file
    with open(os.path.join(path, "vocab.txt"), "a") as f:
        f.write("extra\n")
    r = run_zoo("verify", "bert-base", env=env)
    assert r.returncode == 1 and "FAIL  of" in r.stdout
    assert zoo_lines(r.stderr) == [
        "bert-of: error: bert-base-uncased (of): vocab.txt: SHA-256 differs from the manifest (modified or corrupt); "
        "`bert-of zoo download bert-base-uncased --force` fetches a fresh copy"]
    r = run_zoo("remove", "bert-base", env=env)
    assert r.returncode == 0 and f"removed {path}" in r.stdout and not os.path.exists(path)


def test_connection_dropped_mid_file_then_resumed(home, tmp_path, serve, server, release, capsys):
    url = serve()
    path_on_server = url[len(server.url) - 1:]
    size = os.path.getsize(release["zips"] / "tiny.zip")
    server.faults[path_on_server] = {"drop_after": size // 3, "times": 1}
    z, _ = zoo_with(home, tmp_path, [registry_entry("tiny", url, release["hashes"])])
    path = z.download("tiny", "tf")
    assert server.gets(path_on_server) == [(None, 200), (f"bytes={size // 3}-", 206)]
    assert "retrying" in capsys.readouterr().err
    for f in RELEASE_FILES:
        assert sha256(os.path.join(path, f)) == release["hashes"][f]


def test_partial_file_from_an_earlier_run_is_resumed_or_restarted_if_changed(home, tmp_path, serve, server,
                                                                             release):
    url = serve()
    path_on_server = url[len(server.url) - 1:]
    data = (release["zips"] / "tiny.zip").read_bytes()
    half = len(data) // 2
    z, _ = zoo_with(home, tmp_path, [registry_entry("tiny", url, release["hashes"])])
    dl = home / "downloads" / "tiny"
    dl.mkdir(parents=True)
    # 1) an interrupted earlier run: the part and the validators it recorded
    etag = f'"{len(data):x}-{os.stat(os.path.join(server.root, *path_on_server.split("/"))).st_mtime_ns:x}"'
    (dl / "tiny.zip.part").write_bytes(data[:half])
    (dl / "tiny.zip.part.json").write_text(json.dumps({"url": url, "etag": etag}))
    z.download("tiny", "tf")
    assert server.gets(path_on_server) == [(f"bytes={half}-", 206)]
    # 2) the file changed on the server since (ETag differs): If-Range makes it send the whole file
    z.remove("tiny")
    dl.mkdir(parents=True)
    (dl / "tiny.zip.part").write_bytes(b"x" * half)
    (dl / "tiny.zip.part.json").write_text(json.dumps({"url": url, "etag": '"stale"'}))
    path = z.download("tiny", "tf")
    assert server.gets(path_on_server)[-1] == (f"bytes={half}-", 200)
    assert sha256(os.path.join(path, "bert_model.ckpt.index")) == release["hashes"]["bert_model.ckpt.index"]


def test_killed_download_resumes_in_the_next_process(home, tmp_path, serve, server, release):
    url = serve()
    path_on_server = url[len(server.url) - 1:]
    size = os.path.getsize(release["zips"] / "tiny.zip")
    server.faults[path_on_server] = {"rate": size / 4, "times": 1}  # the first request trickles in (~4 s)
    reg = write_registry(tmp_path / "reg.json", [registry_entry("tiny", url, release["hashes"])])
    env = {"BERT_OF_HOME": str(home), "BERT_OF_REGISTRY": reg}
    proc = subprocess.Popen([sys.executable, "-m", "bert_of.cli", "zoo", "download", "tiny", "--format", "tf"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT, no_proxy="127.0.0.1,localhost", **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    part = home / "downloads" / "tiny" / "tiny.zip.part"
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size >= size // 4):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.kill()  # no clean-up handlers run: like a power cut or kill -9
    proc.wait()
    have = part.stat().st_size
    assert 0 < have < size
    r = run_zoo("download", "tiny", "--format", "tf", env=env)
    assert r.returncode == 0, r.stderr
    assert server.gets(path_on_server) == [(None, 200), (f"bytes={have}-", 206)]
    for f in RELEASE_FILES:
        assert sha256(os.path.join(r.stdout.strip(), f)) == release["hashes"][f]
    assert leftovers(home, "tiny") == [r.stdout.strip()]


def test_wrong_checksum_keeps_nothing_and_names_the_file(home, tmp_path, serve, release):
    url = serve()
    bad = dict(release["hashes"], **{"bert_model.ckpt.index": "0" * 64})
    z, _ = zoo_with(home, tmp_path, [registry_entry("tiny", url, bad)])
    with pytest.raises(ChecksumError) as ei:
        z.download("tiny", "tf")
    msg = str(ei.value)
    assert msg.startswith("tiny: SHA-256 mismatch for bert_model.ckpt.index in tiny.zip: expected 0000")
    assert release["hashes"]["bert_model.ckpt.index"] in msg and msg.endswith("nothing was kept")
    assert leftovers(home, "tiny") == []
    # a hash of the archive itself (when a registry has one) is checked while streaming
    z2, _ = zoo_with(home, tmp_path, [registry_entry("tiny2", url, release["hashes"],
                                                     files=[{"url": url, "sha256": "f" * 64}])])
    with pytest.raises(ChecksumError, match=r"^tiny.zip: SHA-256 mismatch for tiny.zip from http://127.0.0.1:\d+/"):
        z2.download("tiny2", "tf")
    assert leftovers(home, "tiny2") == []


def test_404_is_one_line_no_retry_nothing_kept(home, tmp_path, server, release):
    url = server.url + "t/missing/nothing.zip"
    reg = write_registry(tmp_path / "reg.json", [registry_entry("gone", url, release["hashes"])])
    r = run_zoo("download", "gone", "--format", "tf", "--registry", reg, env={"BERT_OF_HOME": str(home)})
    assert r.returncode == 1
    assert zoo_lines(r.stderr)[-1] == f"bert-of: error: {url}: not found on the server (HTTP 404 Not Found)"
    assert server.gets("/t/missing/nothing.zip") == [(None, 404)]
    assert leftovers(home, "gone") == []


def test_unreachable_hosts_fail_at_once_and_passing_errors_are_retried(home, tmp_path, serve, server, release,
                                                                      capsys):
    """No DNS answer, nothing listening, a TLS handshake that fails: one line at once (the default retry
    budget would wait ~30 s for nothing). A 503 is worth retrying, and is."""
    hint = "; offline? BERT_OF_OFFLINE=1 uses the cache only, BERT_OF_ENDPOINT=<URL> downloads from a mirror"
    z, _ = zoo_with(home, tmp_path, [registry_entry("far", "https://bert-of-test.invalid/bert/far.zip",
                                                    release["hashes"])],
                    download_options=DownloadOptions(progress=False))  # the defaults: 5 retries, backoff from 1 s
    t0 = time.perf_counter()
    with pytest.raises(DownloadError) as ei:
        z.download("far", "tf")
    assert time.perf_counter() - t0 < 2
    assert str(ei.value).startswith("https://bert-of-test.invalid/bert/far.zip: cannot resolve the host "
                                    "bert-of-test.invalid (") and str(ei.value).endswith(hint)
    assert leftovers(home, "far") == []
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path_on_server = serve()[len(server.url) - 1:]
    tls = f"https://127.0.0.1:{server.server_address[1]}{path_on_server}"  # TLS to a plain-HTTP server
    for url, why in ((f"http://127.0.0.1:{port}/x.zip", f"127.0.0.1:{port} refused the connection"),
                     (tls, f"TLS handshake with 127.0.0.1:{server.server_address[1]} failed (")):
        t0 = time.perf_counter()
        with pytest.raises(DownloadError) as ei:
            fetch(url, str(tmp_path / "dl" / "x.zip"), opts=DownloadOptions(progress=False))
        assert time.perf_counter() - t0 < 2 and str(ei.value).startswith(f"{url}: {why}"), str(ei.value)
        assert str(ei.value).endswith(hint)
    assert server.gets(path_on_server) == [] and "retrying" not in capsys.readouterr().err
    # the same through the CLI: one line, exit 1
    reg = write_registry(tmp_path / "far.json", [registry_entry("far", f"http://127.0.0.1:{port}/far.zip",
                                                                release["hashes"])])
    r = run_zoo("download", "far", "--format", "tf", "--registry", reg, env={"BERT_OF_HOME": str(home)})
    assert r.returncode == 1 and zoo_lines(r.stderr)[-1] == (
        f"bert-of: error: http://127.0.0.1:{port}/far.zip: 127.0.0.1:{port} refused the connection{hint}")
    # 503 then 200: retried, with backoff, and it lands
    server.faults[path_on_server] = {"status": 503, "times": 1}
    res = fetch(server.url + path_on_server[1:], str(tmp_path / "ok" / "tiny.zip"),
                opts=DownloadOptions(backoff=0.05, progress=False))
    assert server.gets(path_on_server) == [(None, 503), (None, 200)] and res.attempts == 2
    assert "HTTP 503 Service Unavailable; retrying in" in capsys.readouterr().err
    assert sha256(res.path) == sha256(str(release["zips"] / "tiny.zip"))


def test_server_too_slow_times_out(home, tmp_path, serve, server, release):
    url = serve("tiny.zip", path="t/slow/slow.zip")
    path_on_server = url[len(server.url) - 1:]
    server.faults[path_on_server] = {"delay": 3}
    opts = DownloadOptions(timeout=0.5, retries=1, backoff=0.01, progress=False)
    z, _ = zoo_with(home, tmp_path, [registry_entry("slow", url, release["hashes"])], download_options=opts)
    t0 = time.perf_counter()
    with pytest.raises(DownloadError, match=r"timed out .*gave up after 2 attempt\(s\) \(timeout 0.5 s\)"):
        z.download("slow", "tf")
    assert time.perf_counter() - t0 < 2.5  # two 0.5 s timeouts, not the server's 3 s
    assert len(server.gets(path_on_server)) == 2 and leftovers(home, "slow") == []
    # a server that goes silent in the middle of the body: read timeout; what arrived is kept for a resume
    server.faults[path_on_server] = {"stall_after": 1000, "stall": 3}
    with pytest.raises(DownloadError, match=r"timed out reading .*gave up after 2 attempt\(s\) \(timeout 0.5 s\); "
                                            r"2000 bytes kept in .*slow.zip.part to resume later"):
        z.download("slow", "tf")
    assert [r for r, _ in server.gets(path_on_server)[2:]] == [None, "bytes=1000-"]
    assert os.path.getsize(home / "downloads" / "slow" / "slow.zip.part") == 2000
    assert not os.path.exists(home / "models" / "slow")


def _evil_zip(path, files, member, data, symlink=False):
    with zipfile.ZipFile(path, "w") as zf:
        for name, blob in files:
            zf.writestr(f"{FOLDER}/{name}", blob)
        info = zipfile.ZipInfo(member)
        if symlink:
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, data)


@pytest.mark.parametrize("kind,member", [
    ("zip", "../escaped.txt"),
    ("zip", f"{FOLDER}/../../escaped.txt"),
    ("zip", "/tmp/escaped-absolute.txt"),
    ("zip-symlink", f"{FOLDER}/link"),
    ("tar.gz", "../escaped.txt"),
    ("tar.gz-symlink", f"{FOLDER}/link"),
])
def test_archive_with_path_escape_is_rejected_with_nothing_left(home, tmp_path, serve, release, kind, member):
    files = [(n, open(os.path.join(release["files"], n), "rb").read()) for n in RELEASE_FILES]
    evil = tmp_path / "evil.bin"
    if kind.startswith("zip"):
        _evil_zip(evil, files, member, data=b"/etc/passwd" if "symlink" in kind else b"pwned\n",
                  symlink="symlink" in kind)
        archive = "zip"
    else:
        archive = "tar.gz"
        with tarfile.open(evil, "w:gz") as tf:
            for name, blob in files:
                ti = tarfile.TarInfo(f"{FOLDER}/{name}")
                ti.size = len(blob)
                tf.addfile(ti, io.BytesIO(blob))
            ti = tarfile.TarInfo(member)
            if "symlink" in kind:
                ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tf.addfile(ti)
            else:
                ti.size = 6
                tf.addfile(ti, io.BytesIO(b"pwned\n"))
    url = serve(src=str(evil), zip_name="evil." + archive)
    z, _ = zoo_with(home, tmp_path, [registry_entry("evil", url, release["hashes"], archive=archive)])
    with pytest.raises(UnsafeArchiveError) as ei:
        z.download("evil", "tf")
    msg = str(ei.value)
    assert f"unsafe member {member!r}" in msg
    assert ("symbolic link" in msg or "link to" in msg) if "symlink" in kind else \
        ("escapes" in msg or "absolute" in msg)
    assert leftovers(home, "evil") == []
    for _d, _, files in os.walk(tmp_path):
        assert "escaped.txt" not in files and "link" not in files
    assert not os.path.exists("/tmp/escaped-absolute.txt")


def test_two_concurrent_downloads_of_one_entry(home, tmp_path, serve, server, release):
    url = serve()
    path_on_server = url[len(server.url) - 1:]
    size = os.path.getsize(release["zips"] / "tiny.zip")
    hold = threading.Event()  # the first download stays half done until the second waits for its lock
    server.faults[path_on_server] = {"hold": hold}
    watchdog = threading.Timer(120, hold.set)  # a broken lock must fail the test, not hang it
    watchdog.start()
    reg = write_registry(tmp_path / "reg.json", [registry_entry("tiny", url, release["hashes"])])
    env = dict(os.environ, PYTHONPATH=ROOT, BERT_OF_HOME=str(home), BERT_OF_REGISTRY=reg,
               no_proxy="127.0.0.1,localhost")
    cmd = [sys.executable, "-m", "bert_of.cli", "zoo", "download", "tiny", "--format", "tf"]
    try:
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        deadline = time.monotonic() + 120
        while not server.gets(path_on_server) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the first process's request
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        said = []
        for line in second.stderr:  # it says it waits, then blocks on the lock the first one holds
            said.append(line)
            if "waiting for its lock" in line:
                break
        hold.set()
        outs = [first.communicate(timeout=60)]
        out2, err2 = second.communicate(timeout=60)
        outs.append((out2, "".join(said) + err2))
        procs = [first, second]
    finally:
        hold.set()
        watchdog.cancel()
    assert [p.returncode for p in procs] == [0, 0], outs
    path = str(home / "models" / "tiny" / "tf")
    assert [o[0].strip() for o in outs] == [path, path]
    assert server.gets(path_on_server) == [(None, 200)]  # one download
    waited = [o[1] for o in outs if "waiting for its lock" in o[1]]
    assert len(waited) == 1 and "published by another process meanwhile" in waited[0]
    assert sum("downloading http://" in o[1] for o in outs) == 1
    z = Zoo(cache_dir=str(home), registries=[reg])
    assert z.verify("tiny") == [("tf", path, [])]
    assert leftovers(home, "tiny") == [path]


def test_offline_mode_with_and_without_a_cached_copy(home, tmp_path, serve, server, release):
    url = serve()
    path_on_server = url[len(server.url) - 1:]
    reg = write_registry(tmp_path / "reg.json", [registry_entry("tiny", url, release["hashes"])])
    env = {"BERT_OF_HOME": str(home), "BERT_OF_REGISTRY": reg, "BERT_OF_OFFLINE": "1"}
    r = run_zoo("download", "tiny", "--format", "tf", env=env)
    assert r.returncode == 1
    assert zoo_lines(r.stderr) == [
        f"bert-of: error: tiny (tf) is not in the cache {home} and offline mode (BERT_OF_OFFLINE=1 / --offline) "
        f"forbids "
        f"downloading it from {url}; download it once with network access, or point BERT_OF_HOME at a cache "
        "that has it"]
    assert server.gets(path_on_server) == [] and leftovers(home, "tiny") == []
    z = Zoo(cache_dir=str(home), registries=[reg], offline=True)
    with pytest.raises(OfflineError):
        z.resolve("tiny")
    # cache it (online), then offline finds it without touching the network
    path = Zoo(cache_dir=str(home), registries=[reg], download_options=FAST).download("tiny", "tf")
    assert len(server.gets(path_on_server)) == 1
    r = run_zoo("download", "tiny", "--format", "tf", env=env)
    assert r.returncode == 0 and r.stdout.strip() == path
    assert z.download("tiny", "tf") == path and len(server.gets(path_on_server)) == 1
    # offline, another format is converted from the cached tf folder (no network needed) ...
    flag = {"BERT_OF_HOME": str(home)}
    r = run_zoo("download", "tiny", "--offline", "--no-verify", "--registry", reg, env=flag)
    assert r.returncode == 0 and r.stdout.strip() == str(home / "models" / "tiny" / "of")
    assert "converting from the cached tf folder" in r.stderr and len(server.gets(path_on_server)) == 1
    # ... and the --offline flag refuses the network like the variable does
    assert run_zoo("remove", "tiny", "--registry", reg, env=flag).returncode == 0
    r = run_zoo("download", "tiny", "--offline", "--registry", reg, env=flag)
    assert r.returncode == 1 and "offline mode" in r.stderr and len(server.gets(path_on_server)) == 1


def test_user_registries_merge_by_name_later_wins(home, tmp_path, serve, release, monkeypatch):
    url = serve()
    lab = write_registry(tmp_path / "lab.json", [
        registry_entry("lab-bert", url, release["hashes"], aliases=["lab"], description="our lab's BERT v1"),
        dict(registry_entry("bert-base-uncased", url, release["hashes"], aliases=["bert-base"]),
             description="lab mirror of bert-base"),
    ])
    lab2 = write_registry(tmp_path / "lab2.json", [
        registry_entry("lab-bert", url, release["hashes"], description="our lab's BERT v2"),
        registry_entry("other", url, release["hashes"], aliases=["lab"]),
    ])
    monkeypatch.setenv("BERT_OF_REGISTRY", lab)
    z = Zoo(cache_dir=str(home), registries=[lab2])
    assert z.registry.sources == [zreg.SHIPPED, os.path.abspath(lab), os.path.abspath(lab2)]
    assert z.entry("lab-bert")["description"] == "our lab's BERT v2"  # whole entry from the later file
    assert z.entry("lab-bert")["aliases"] == []  # ... its aliases too
    assert z.entry("lab")["name"] == "other"
    assert z.entry("bert-base")["description"] == "lab mirror of bert-base"
    assert z.entry("bert-large")["_registry"] == zreg.SHIPPED
    r = run_zoo("info", "bert-base", "--registry", lab, env={"BERT_OF_HOME": str(home)})
    assert r.returncode == 0 and f"registry:      {os.path.abspath(lab)}" in r.stdout
    path = z.download("lab-bert", "tf")
    assert os.path.isfile(os.path.join(path, "bert_model.ckpt.index"))
    r = run_zoo("list", "--registry", lab, env={"BERT_OF_HOME": str(home)})
    assert any(ln.startswith("lab-bert ") for ln in r.stdout.splitlines())
    # a registry that breaks the schema is one clear line
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": [{"name": "x/../y", "files": [{"url": url}]}]}))
    r = run_zoo("list", "--registry", bad, env={"BERT_OF_HOME": str(home)})
    assert r.returncode == 1 and zoo_lines(r.stderr)[0].startswith(f"bert-of: error: {bad}: entries[0]: entry name")


def test_zoo_add_registers_a_local_checkpoint(home, tmp_path, release):
    from bert_of.converters.convert import convert

    ckpt = tmp_path / "pretrain-out"
    convert("tf2of", release["files"], str(ckpt))
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({
        "description": "BERT-tiny pretrained on wiki sample, 1000 steps",
        "training": {"steps": 1000, "batch": 32, "lr": 1e-3, "mlm_accuracy": 0.31},
        "evaluation": [{"task": "SQuAD v1.1 dev", "metrics": {"exact_match": 12.5, "f1": 20.25}}],
    }))
    env = {"BERT_OF_HOME": str(home)}
    r = run_zoo("add", ckpt, "--name", "my-pretrain", "--alias", "mine", "--metadata", meta, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"registered my-pretrain -> {ckpt} (of, ")
    r = run_zoo("list", env=env)
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("my-pretrain "))
    assert row.split()[1] == "mine" and row.split()[-3:] == ["of", "local", "12.50/20.25"]
    r = run_zoo("info", "mine", env=env)
    assert '"mlm_accuracy": 0.31' in r.stdout and f"source: local: {meta}" in r.stdout
    assert f"registry:      {home / 'registry.local.json'}" in r.stdout
    z = Zoo(cache_dir=str(home))
    assert z.resolve("my-pretrain") == str(ckpt) and z.path("mine") == str(ckpt)
    assert run_zoo("verify", "mine", env=env).returncode == 0
    # a name that is taken needs --overwrite
    r = run_zoo("add", ckpt, "--name", "bert-base", env=env)
    assert r.returncode == 1 and "already names the entry bert-base-uncased" in r.stderr
    # modified after registering: verify says which file
    with open(ckpt / "config.json", "a") as f:
        f.write(" ")
    r = run_zoo("verify", "my-pretrain", env=env)
    assert r.returncode == 1 and "config.json: SHA-256 differs from the one recorded by `zoo add`" in r.stderr
    # other formats of a local entry are converted into the cache
    with open(ckpt / "config.json", "rb+") as f:
        f.truncate(os.path.getsize(ckpt / "config.json") - 1)
    tf_dir = Zoo(cache_dir=str(home)).download("mine", "tf", verify=False)
    man = json.load(open(os.path.join(tf_dir, MANIFEST)))
    assert man["conversion"]["direction"] == "of2tf" and man["source"] == {"kind": "local", "path": str(ckpt)}
    assert os.path.isfile(os.path.join(tf_dir, "bert_model.ckpt.index"))
    r = run_zoo("remove", "my-pretrain", env=env)
    assert r.returncode == 0 and "left untouched" in r.stdout and not os.path.exists(tf_dir)
    assert os.path.isdir(ckpt) and Zoo(cache_dir=str(home)).registry.lookup("my-pretrain") is None


@pytest.fixture(scope="module")
def local_ckpt(release, tmp_path_factory):
    from bert_of.converters.convert import convert

    ckpt = tmp_path_factory.mktemp("local") / "ckpt"
    convert("tf2of", release["files"], str(ckpt))
    return ckpt


def test_damaged_local_registry_never_disables_the_zoo(home, local_ckpt):
    env = {"BERT_OF_HOME": str(home)}
    for n in ("first", "second"):
        assert run_zoo("add", local_ckpt, "--name", n, env=env).returncode == 0
    local = home / "registry.local.json"
    whole = local.read_text()
    cut = whole[:whole.index('"name": "second"') + 30]  # a copy cut short inside the second entry

    def listed(r):
        assert r.returncode == 0, r.stderr
        table = r.stdout.split("\n\n")[0].splitlines()[1:]
        names = [ln.split()[0] for ln in table]
        ours = [n for n in names if n in ("first", "second", "third")]
        assert len(names) - len(ours) == 33 and "bert-base-uncased" in names  # the shipped registry, all of it
        return ours

    local.write_text(cut)
    r = run_zoo("list", env=env)
    assert listed(r) == ["first"] and zoo_lines(r.stderr) == [
        f"warning: {local}: damaged (not a whole registry); using the 1 entry readable before the damage (the next "
        "`bert-of zoo add` or `remove` rewrites it, keeping a copy)"]
    assert run_zoo("info", "first", env=env).returncode == 0 and run_zoo("info", "bert-base", env=env).returncode == 0
    local.write_bytes(b"\x00\xff\xfe garbage \x00")
    r = run_zoo("list", env=env)
    assert listed(r) == [] and "using the 0 entries readable" in r.stderr
    # an entry that breaks the schema is skipped; the others are kept
    good = json.loads(whole)["entries"]
    local.write_text(json.dumps({"schema_version": 1, "entries": [good[0], dict(good[1], name="x/../y")]}))
    r = run_zoo("list", env=env)
    assert listed(r) == ["first"] and zoo_lines(r.stderr) == [
        f"warning: {local}: entries[1]: entry name 'x/../y' must match {zreg.NAME_RE.pattern} (it becomes a directory "
        "name); entry skipped"]
    # the next `zoo add` keeps a copy of the damaged file and rewrites a whole registry
    local.write_text(cut)
    r = run_zoo("add", local_ckpt, "--name", "third", env=env)
    assert r.returncode == 0, r.stderr
    copies = [f for f in os.listdir(home) if f.startswith("registry.local.json.damaged-")]
    assert len(copies) == 1 and (home / copies[0]).read_text() == cut
    assert [e["name"] for e in json.loads(local.read_text())["entries"]] == ["first", "third"]
    r = run_zoo("list", env=env)
    assert listed(r) == ["first", "third"] and zoo_lines(r.stderr) == []


def test_zoo_add_refuses_non_finite_tensors(home, local_ckpt, tmp_path):
    """A diverged run (NaN or inf in a weight) can never be registered, in any format."""
    import numpy as np

    from bert_of.checkpoint import load_checkpoint, write_checkpoint
    from bert_of.converters.convert import convert

    ck = load_checkpoint(str(local_ckpt))
    nan, inf = dict(ck.tensors), dict(ck.tensors)
    nan["bert.encoder.layer.1.attention.self.key.weight"] = nan["bert.encoder.layer.1.attention.self.key.weight"].copy()
    nan["bert.encoder.layer.1.attention.self.key.weight"][3, :2] = np.nan
    inf["cls.predictions.bias"] = inf["cls.predictions.bias"].copy()
    inf["cls.predictions.bias"][0] = -np.inf
    write_checkpoint(str(tmp_path / "nan"), list(nan.items()), ck.config, ck.vocab_file)
    write_checkpoint(str(tmp_path / "inf-of"), list(inf.items()), ck.config, ck.vocab_file)
    convert("of2tf", str(tmp_path / "inf-of"), str(tmp_path / "inf-tf"))
    env = {"BERT_OF_HOME": str(home)}
    for d, tensor, n in (("nan", "bert.encoder.layer.1.attention.self.key.weight", 2),
                         ("inf-tf", "cls.predictions.bias", 1)):
        r = run_zoo("add", tmp_path / d, "--name", "diverged", env=env)
        assert r.returncode == 1 and zoo_lines(r.stderr) == [
            f"bert-of: error: {tmp_path / d}: tensor {tensor} holds {n} non-finite value(s) (NaN or inf): "
            "a diverged run? not registering it"]
    assert not (home / "registry.local.json").exists()
    assert run_zoo("add", local_ckpt, "--name", "finite", env=env).returncode == 0


def test_concurrent_zoo_adds_all_land(home, local_ckpt):
    """Four `zoo add`s at once: the registry is rewritten whole under one lock, so every one lands."""
    from bert_of.files.locks import locked

    env = dict(os.environ, PYTHONPATH=ROOT, BERT_OF_HOME=str(home))
    names = [f"run-{i}" for i in range(4)]
    logs = [home.parent / f"add-{n}.txt" for n in names]
    with locked(str(home / "locks" / ".registry.local.lock"), "test", wait=True):  # all four queue up
        procs = [subprocess.Popen([sys.executable, "-m", "bert_of.cli", "zoo", "add", str(local_ckpt), "--name", n],
                                  stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env, cwd=ROOT)
                 for n, log in zip(names, logs)]
        deadline = time.monotonic() + 120
        while not all(log.exists() and "waiting for its lock" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.1)
    assert [p.wait(timeout=120) for p in procs] == [0] * 4, [log.read_text() for log in logs]
    entries = json.loads((home / "registry.local.json").read_text())["entries"]
    assert sorted(e["name"] for e in entries) == names
    assert all(e["path"] == str(local_ckpt) for e in entries)


# --------------------------------------------------------------------------- smaller rules


def test_disk_space_is_checked_before_downloading(home, tmp_path, serve, server, release):
    url = serve()
    z, _ = zoo_with(home, tmp_path, [registry_entry("huge", url, release["hashes"],
                                                    files=[{"url": url, "size": 10 ** 18}])])
    with pytest.raises(DiskSpaceError, match=r"^huge: not enough disk space in .*: need ~.* free"):
        z.download("huge", "tf")
    assert server.gets(url[len(server.url) - 1:]) == []


def test_a_size_estimate_gives_way_to_the_servers_length(home, tmp_path, serve, server, release):
    # `size_estimate_bytes` is a hint (a mirror may serve another build): the response's length decides
    url = serve()
    z, _ = zoo_with(home, tmp_path, [registry_entry("hinted", url, release["hashes"], size_estimate_bytes=10 ** 18)])
    path = z.download("hinted", "tf")
    assert sorted(os.listdir(path)) == sorted(list(RELEASE_FILES) + [MANIFEST])
    assert server.gets(url[len(server.url) - 1:]) == [(None, 200)]


def test_flat_archive_without_published_hashes_and_file_urls(home, tmp_path, release, capsys):
    # the 2020 miniatures put the files at the top of the zip and have no published hashes
    flat = release["zips"] / "flat.zip"
    z, _ = zoo_with(home, tmp_path, [registry_entry("mini", flat.as_uri(), None)], offline=True)
    path = z.download("mini", "tf")  # file:// touches no network: allowed offline
    assert "no published SHA-256" in capsys.readouterr().err
    man = json.load(open(os.path.join(path, MANIFEST)))
    assert man["source"]["contents_verified"] == "none" and man["source"]["root_in_archive"] == ""
    assert man["files"]["vocab.txt"]["sha256"] == release["hashes"]["vocab.txt"]  # recorded for `zoo verify`
    # a missing file that Google's zips always hold is caught
    z2, _ = zoo_with(home, tmp_path, [registry_entry("mini2", flat.as_uri(), None,
                                                     expected_files=list(RELEASE_FILES) + ["extra.txt"])])
    with pytest.raises(ChecksumError, match="extra.txt is missing from flat.zip"):
        z2.download("mini2", "tf")


def test_endpoint_rule_and_resolve(home):
    e = {"name": "x"}
    u = GOOGLE + REAL_PATH
    assert zreg.effective_url(e, u, None) == u
    assert zreg.effective_url(e, u, "http://mirror.lan:8080/google") == "http://mirror.lan:8080/google/" + REAL_PATH
    assert zreg.effective_url(e, u, "file:///mnt/mirror/") == "file:///mnt/mirror/" + REAL_PATH
    assert zreg.effective_url(e, "https://lab.example/x.zip", "http://m/") == "https://lab.example/x.zip"
    assert zreg.effective_url({"endpoint_prefix": "https://lab.example/"}, "https://lab.example/x.zip",
                              "http://m/") == "http://m/x.zip"
    from bert_of import zoo
    with pytest.raises(CheckpointError, match="not a checkpoint in any known format"):
        zoo.resolve(ROOT)  # a directory, but no checkpoint (tests/integration/test_resolve.py: the ones that are)
    with pytest.raises(UnknownEntryError, match="no such file or directory, and not a zoo name"):
        zoo.resolve("no/such/dir-or-name")


def test_other_formats_convert_from_the_cached_tf_folder_or_fail_cleanly(home, tmp_path, serve, server, release):
    url = serve()
    z, _ = zoo_with(home, tmp_path, [registry_entry("tiny", url, release["hashes"])])
    z.download("tiny", "tf")
    for fmt in ("lazy", "hf"):
        try:
            p = z.download("tiny", fmt, verify=False)
        except ZooError as e:  # the format module may not be implemented yet
            assert str(e).startswith(f"tiny: cannot produce --format {fmt}: ")
            assert not os.path.exists(home / "models" / "tiny" / fmt)
        else:
            man = json.load(open(os.path.join(p, MANIFEST)))
            assert man["conversion"]["direction"] == f"tf2{fmt}" and man["source"]["kind"] == "cache"
    assert len(server.gets(url[len(server.url) - 1:])) == 1  # converted from the cache, not downloaded again
    with pytest.raises(NotCachedError):
        Zoo(cache_dir=str(home / "empty"), registries=[tmp_path / "reg.json"]).path("tiny")
