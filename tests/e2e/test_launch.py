"""Multi-rank jobs behave like one command (bert_of/launch.py), on real 2-rank OneFlow runs:

- 2 "nodes" x 1 rank on loopback (two `bert-of pretrain --nnodes 2 --node-rank R` processes) train
  exactly like 1 process on the same global batches;
- refusals happen once, in the parent, before any rank starts;
- a rank that fails or is killed ends the job quickly with one line naming it;
- SIGTERM / SIGINT of the parent stop the ranks and end the job by that signal (143 / 130, as one
  rank); SIGKILL of the parent stops them too (they watch it);
- ranks other than 0 join OneFlow's rendezvous only once rank 0 listens (no 10 s retry sleep).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data
from bert_of.data.ofrecord import OFRecordWriter, RecordFile
from bert_of.launch import free_port
from tests.conftest import ROOT, error_lines, run_cli

pytestmark = pytest.mark.oneflow

TEXT = os.path.join(ROOT, "tests", "data", "text")
VOCAB = os.path.join(TEXT, "vocab.txt")
CONFIG = {"vocab_size": 966, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu"}
GLOBAL_BATCH, STEPS = 8, 10


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One dataset read by one process (one part), and the same records split in two parts so that
    rank 0's 4 rows + rank 1's 4 rows of each step are that process's 8 rows."""
    root = tmp_path_factory.mktemp("launch")
    made = root / "made"
    create_pretraining_data([os.path.join(TEXT, "sample_text.txt")], VOCAB, str(made),
                            options=PretrainingOptions(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1),
                            num_parts=1, progress=False)
    parts = sorted(n for n in os.listdir(made) if n.startswith("part-"))
    assert len(parts) == 1
    one, two = root / "one", root / "two"
    half = GLOBAL_BATCH // 2
    with RecordFile(str(made / parts[0])) as src:
        n = len(src) - len(src) % GLOBAL_BATCH  # whole global batches: epochs wrap at the same step
        assert n >= 2 * GLOBAL_BATCH
        for d, shares in ((one, [range(GLOBAL_BATCH)]), (two, [range(half), range(half, GLOBAL_BATCH)])):
            d.mkdir()
            for p, rows in enumerate(shares):
                with OFRecordWriter(str(d / f"part-{p}")) as w:
                    for i in range(n):
                        if i % GLOBAL_BATCH in rows:
                            w.write(src.raw(i))
            for name in os.listdir(made):
                if not name.startswith("part-"):
                    (d / name).write_bytes((made / name).read_bytes())
    cfg = root / "bert_config.json"
    cfg.write_text(json.dumps(CONFIG))
    return {"one": str(one), "two": str(two), "config": str(cfg), "root": root}


def _args(setup, data, run, *extra):
    return ["pretrain", "--data", data, "--output", str(run), "--config", setup["config"], "--vocab", VOCAB,
            "--batch-size", str(GLOBAL_BATCH), "--log-every", "1", "--lr", "1e-3", "--mode", "eager",
            "--no-shuffle", "--no-dropout", "--quiet", *extra]


def _losses(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f if '"loss"' in line]


def _env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT
    return env


def _start(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "bert_of.cli", *map(str, args)], env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(d))
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _holding(path):
    """Live processes with a file under ``path`` open, or it as their working directory."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/cwd")]
            links += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(link == path or link.startswith(path + os.sep) for link in links):
            found.append(int(pid))
    return found


def _wait_training(run, proc, timeout=180):
    """Until the job has logged a step (both ranks are inside the training loop)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        if os.path.isfile(os.path.join(run, "metrics.jsonl")) and _losses(run):
            return
        time.sleep(0.2)
    raise AssertionError("the job never logged a step")


def _wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_two_nodes_on_loopback_train_like_one_process(setup, tmp_path):
    one = tmp_path / "one"
    run_cli(*_args(setup, setup["one"], one, "--steps", STEPS))
    two = tmp_path / "two"
    port = free_port()
    nodes = [_start(_args(setup, setup["two"], two, "--steps", STEPS, "--nproc", 1, "--nnodes", 2,
                          "--node-rank", r, "--master-addr", "127.0.0.1", "--master-port", port)) for r in (1, 0)]
    try:
        outs = [p.communicate(timeout=300) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], outs
    a, b = _losses(one), _losses(two)
    assert len(a) == len(b) == STEPS
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    assert worst < 1e-6, (worst, a, b)
    assert a[-1] < a[0]  # it trained
    with open(os.path.join(two, "metrics.jsonl")) as f:
        assert all(json.loads(line)["world"] == 2 for line in f if '"loss"' in line)


def test_refusals_are_made_once_before_ranks_start(setup, tmp_path):
    t0 = time.monotonic()
    missing_vocab = str(tmp_path / "missing-vocab.txt")
    args = [missing_vocab if a == VOCAB else a for a in _args(setup, setup["two"], tmp_path / "r")]
    r = run_cli(*args, "--steps", 2, "--nproc", 2, check=False)
    assert r.returncode == 1 and error_lines(r.stderr) == [f"bert-of: error: --vocab {missing_vocab}: no such file"], \
        r.stderr
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 30  # no OneFlow, no ranks
    r = run_cli(*_args(setup, setup["two"], tmp_path / "r"), "--nproc", 2, "--nnodes", 2, "--node-rank", 2,
                check=False)
    assert r.returncode == 1 and error_lines(r.stderr) == ["bert-of: error: --node-rank 2 is not in 0..1 (--nnodes 2)"]
    r = run_cli(*_args(setup, setup["two"], tmp_path / "r"), "--nnodes", 2, check=False)
    assert r.returncode == 1 and "--master-port" in error_lines(r.stderr)[0]
    # finetune: a missing file among repeated --eval-data is refused in the parent, once
    squad = os.path.join(ROOT, "tests", "data", "squad")
    missing = str(tmp_path / "no-dev.json")
    r = run_cli("finetune", "squad", "--model", setup["root"] / "no-model", "--train",
                os.path.join(squad, "train-v1.1-finetune.json"), "--output", tmp_path / "ft", "--eval-data",
                os.path.join(squad, "dev-v1.1-finetune.json"), "--eval-data", missing, "--nproc", 2, check=False)
    assert r.returncode == 1 and error_lines(r.stderr) == [f"bert-of: error: --eval-data {missing}: no such file"], \
        r.stderr


def test_a_failing_rank_ends_the_job_with_its_one_line(setup, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(setup["two"]):
        data = open(os.path.join(setup["two"], name), "rb").read()
        (bad / name).write_bytes(data[:-7] if name == "part-1" else data)  # only rank 1 reads part-1
    r = run_cli(*_args(setup, str(bad), tmp_path / "r"), "--steps", 2, "--nproc", 2, check=False, timeout=240)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("bert-of: error: rank 1: ") and "part-1" in lines[0], lines
    assert "Traceback" not in r.stderr


def test_a_killed_rank_ends_the_job_quickly_naming_it(setup, tmp_path):
    run = tmp_path / "r"
    proc = _start(_args(setup, setup["two"], run, "--steps", 100000, "--nproc", 2))
    try:
        _wait_training(str(run), proc)
        ranks = _children(proc.pid)
        assert len(ranks) == 2
        rank1 = next(p for p in ranks if b"RANK=1\0" in open(f"/proc/{p}/environ", "rb").read())
        os.kill(rank1, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 20
    finally:
        proc.kill()
    lines = error_lines(err)
    assert proc.returncode == 1 and lines == ["bert-of: error: rank 1: killed by SIGKILL"], err
    assert _wait_gone(ranks, 5) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_the_ranks_die_with_the_parent(setup, tmp_path, sig):
    """SIGTERM / SIGINT are forwarded and the job ends by the signal as one rank does (the shell sees
    143 / 130); SIGKILL: each rank watches its parent."""
    run = tmp_path / "r"
    proc = _start(_args(setup, setup["two"], run, "--steps", 100000, "--nproc", 2))
    try:
        _wait_training(str(run), proc)
        ranks = _children(proc.pid)
        assert len(ranks) == 2
        os.kill(proc.pid, sig)
        assert _wait_gone(ranks, 15) == []
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -sig, (proc.returncode, err)
    if sig != signal.SIGKILL:
        word = "terminated" if sig == signal.SIGTERM else "interrupted"
        assert error_lines(err) == [f"bert-of: error: {word}"], err
    assert _holding(str(run)) == []  # nobody can write into the run directory any more


def test_align_runs_its_two_rank_runs_over_two_nodes(tmp_path):
    """`bert-of align data-parallel --nnodes 2`: node 0 runs the suite, node 1 lends the second rank
    of its 2-rank runs (same OUT: the filesystem the nodes share)."""
    out, port = tmp_path / "align", free_port()
    nodes = [_start(["align", "data-parallel", "--size", "tiny", "--steps", 4, "-o", out, "--nnodes", 2,
                     "--node-rank", r, "--master-port", port]) for r in (1, 0)]
    try:
        (out1, err1), (out0, err0) = [p.communicate(timeout=400) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], (err0, err1)
    assert "over 2 nodes" in out0 + err0 and "node 1: 4 run(s) on ranks of a 2-rank launch" in out1 + err1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and summary["experiments"]["data-parallel"]["status"] == "pass"
    report = json.loads((out / "data-parallel.json").read_text())
    two_rank = [r for r in report["runs"].values() if r.get("world") == 2]
    assert len(two_rank) == 4 and all(len(r["loss"]) == 4 for r in two_rank)
    runs = next((out / "data" / "runs").iterdir())
    assert len(list(runs.glob("*-r1.json"))) == 4  # written by node 1's rank


def _listener(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    s.settimeout(0.5)
    return s


def _accepted(s) -> int:
    n = 0
    while True:
        try:
            s.accept()[0].close()
            n += 1
        except socket.timeout:
            return n


def test_a_rank_joins_only_once_rank_0_listens(monkeypatch):
    """OneFlow 0.9 puts a rank that reaches the rendezvous before rank 0 listens to sleep a fixed 10 s
    (RpcClient::LoadServer), which cost about every other launch 10 s: ranks other than 0 wait for
    rank 0's port before importing OneFlow (bert_of.runtime.process, in a set-up process); rank 0 and single
    processes never wait."""
    from bert_of.runtime import process

    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    opened = {}

    def open_later():
        time.sleep(0.5)
        opened["socket"] = _listener(port)
        opened["at"] = time.monotonic()

    t = threading.Thread(target=open_later)
    t.start()
    process.wait_for_rank0(timeout=60)
    returned = time.monotonic()
    t.join()
    s = opened["socket"]
    try:
        assert returned >= opened["at"] and _accepted(s) == 1  # it waited, then knocked once
        monkeypatch.setenv("RANK", "0")
        process.wait_for_rank0(timeout=60)
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "1")
        process.wait_for_rank0(timeout=60)
        assert _accepted(s) == 0  # rank 0 and a single process: no knock
    finally:
        s.close()
