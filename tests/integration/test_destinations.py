"""Destinations and signals: one writer per destination, inputs and foreign files never destroyed,
Ctrl-C / SIGTERM clean up and end the process by the signal (the shell sees 130 / 143, and a
shell loop stops), repeated list flags add up. Real `bert-of` processes, real signals."""

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_of.checkpoint import write_checkpoint
from bert_of.tensors import expected_shapes
from bert_of.cli import build_parser
from bert_of.config import BertConfig
from tests.conftest import ROOT, dies_with_the_suite, error_lines, run_cli

TEXT = os.path.join(ROOT, "tests", "data", "text")


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT
    return env


def _start(*args, **kw):
    """`bert-of ARGS` in its own process group (as a shell job: a terminal's Ctrl-C reaches all of it)."""
    return subprocess.Popen(dies_with_the_suite([sys.executable, "-m", "bert_of.cli", *args]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT, start_new_session=True, **kw)


def _checkpoint(path, vocab=99, hidden=32):
    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=2 * hidden, max_position_embeddings=16)
    rng = np.random.default_rng(vocab)
    tensors = {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(cfg).items()
               if n.startswith("bert.")}
    write_checkpoint(str(path), list(tensors.items()), cfg)
    return str(path)


def _tree(path):
    """{relative path: sha256} of every file under ``path``."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, path)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _leftovers(folder):
    return [n for n in os.listdir(folder) if ".tmp-" in n or ".old-" in n]


def _one_line(r, needle):
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and needle in lines[0], (r.stdout, r.stderr)
    return lines[0]


# --------------------------------------------------------------------------- one writer per destination


def test_two_conversions_into_one_new_destination_one_wins(tmp_path):
    src = _checkpoint(tmp_path / "src", vocab=20000, hidden=64)  # ~7 MB: the two overlap
    dst = tmp_path / "dst"
    procs = [_start("convert", "of2hf", src, "-o", dst) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    loser = outs[[p.returncode for p in procs].index(1)][1]
    line = error_lines(loser)[-1]
    assert any(s in line for s in ("another bert_of process is writing it (pid ", "already exists",
                                   "created by another process meanwhile")), line
    assert sum("wrote" in o for o, _ in outs) == 1
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]
    run_cli("inspect", dst)  # the winner's files, whole


# --------------------------------------------------------------------------- never destroy inputs


def test_a_destination_that_is_holds_or_lies_inside_the_source_is_refused(tmp_path):
    a = tmp_path / "A"
    src = _checkpoint(a / "ck")
    (a / "notes.txt").write_text("the user's own")
    before = _tree(a)
    for dst, needle in ((src, "is the source"), (a, "holds the source"), (a / "ck" / "out", "lies inside the source")):
        r = run_cli("convert", "of2hf", src, "-o", dst, "--overwrite", check=False)
        _one_line(r, f"{dst}: {needle}")
    link = tmp_path / "alias"
    os.symlink(src, link)  # the source under another name
    _one_line(run_cli("convert", "of2hf", src, "-o", link, "--overwrite", check=False), "is the source")
    assert _tree(a) == before and sorted(os.listdir(a)) == ["ck", "notes.txt"]


def test_a_destination_name_with_a_newline_is_written_read_back_and_replaced(tmp_path):
    src = _checkpoint(tmp_path / "ck")
    dst = tmp_path / "a\nb"  # any character but "/" and NUL may be in a name
    run_cli("convert", "of2hf", src, "-o", dst)
    assert _leftovers(tmp_path) == [] and os.path.isfile(dst / "config.json")
    run_cli("convert", "of2hf", src, "-o", dst, "--overwrite")
    back = run_cli("inspect", dst, "--json")
    assert json.loads(back.stdout)["format"] == "hf" and _leftovers(tmp_path) == []


def test_overwrite_replaces_only_what_bert_of_wrote(tmp_path):
    src = _checkpoint(tmp_path / "src")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    _one_line(run_cli("convert", "of2tf", src, "-o", mine, "--overwrite", check=False),
              f"{mine}: holds thesis.tex, which bert_of did not write; not replacing it")
    assert os.listdir(mine) == ["thesis.tex"]
    out = tmp_path / "out"
    run_cli("convert", "of2tf", src, "-o", out)
    (out / "sub").mkdir()
    (out / "sub" / "photo.jpg").write_bytes(b"\xff\xd8")
    _one_line(run_cli("convert", "of2hf", src, "-o", out, "--overwrite", check=False), "holds sub/photo.jpg")
    os.remove(out / "sub" / "photo.jpg")
    run_cli("convert", "of2hf", src, "-o", out, "--overwrite")  # a TF folder becomes an HF one
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    run_cli("convert", "of2hf", src, "-o", empty, "--overwrite")  # nothing to lose
    assert sorted(os.listdir(empty)) == ["config.json", "model.safetensors"]


def test_a_rerun_with_overwrite_replaces_what_bert_of_wrote_beyond_its_standard_files(tmp_path):
    """of2hf writes transformers' tokenizer files too: they are listed in the folder's manifest, so
    the same conversion run again with --overwrite works; a file that bert_of did not write still
    stops it."""
    src = _checkpoint(tmp_path / "src")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(99)))
    out = tmp_path / "out"
    run_cli("convert", "of2hf", src, "-o", out, "--vocab", vocab)
    written = sorted(os.listdir(out))
    assert "special_tokens_map.json" in written and "tokenizer_config.json" in written
    listed = json.loads((out / ".bert_of-files.json").read_text())["files"]
    assert sorted(listed) == sorted(n for n in written if n not in ("config.json", "model.safetensors", "vocab.txt",
                                                                  ".bert_of-files.json"))
    run_cli("convert", "of2hf", src, "-o", out, "--vocab", vocab, "--overwrite")  # the same command again
    assert sorted(os.listdir(out)) == written
    (out / "tokenizer.json").write_text("{}")  # the user's (not listed)
    _one_line(run_cli("convert", "of2hf", src, "-o", out, "--vocab", vocab, "--overwrite", check=False),
              f"{out}: holds tokenizer.json, which bert_of did not write; not replacing it")
    assert (out / "tokenizer.json").read_text() == "{}"


def test_a_symlinked_destination_is_replaced_at_its_target(tmp_path):
    src = _checkpoint(tmp_path / "src")
    real = tmp_path / "store" / "real"
    run_cli("convert", "of2tf", src, "-o", real)
    link = tmp_path / "link"
    os.symlink(real, link)
    run_cli("convert", "of2hf", src, "-o", link, "--overwrite")
    assert os.path.islink(link) and os.readlink(link) == str(real)
    assert sorted(os.listdir(real)) == ["config.json", "model.safetensors"]
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "store") == []


# --------------------------------------------------------------------------- signals


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A checkpoint whose conversion takes a moment (~130 MB)."""
    return _checkpoint(tmp_path_factory.mktemp("big") / "src", vocab=120000, hidden=256)


def _wait_for_staging(folder, proc, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _leftovers(folder):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError("no staging folder appeared")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_conversion_removes_the_staging_folder_and_ends_by_it(tmp_path, big, sig):
    out = tmp_path / "out"
    p = _start("convert", "of2tf", big, "-o", out / "dst")
    _wait_dir(out, p)
    _wait_for_staging(out, p)
    os.killpg(p.pid, sig)  # as a terminal's Ctrl-C (the whole job), or as `timeout` / a scheduler
    _, err = p.communicate(timeout=120)
    assert p.returncode == -sig, err  # the shell sees 128 + sig: 130 / 143
    word = "interrupted" if sig == signal.SIGINT else "terminated"
    assert error_lines(err) == [f"bert-of: error: {word}"], err
    assert os.listdir(out) == []  # no staging folder, no destination


def _wait_dir(folder, proc, timeout=120):
    end = time.monotonic() + timeout
    while not os.path.isdir(folder):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.005)
    return True


def _mapped(pid, needle):
    try:
        return needle in open(f"/proc/{pid}/maps").read()
    except OSError:
        return False


def test_ctrl_c_at_any_moment_of_start_up_prints_no_traceback(tmp_path):
    """From bert_of's first line on (Python's own start-up before it, ~50 ms, is Python's)."""
    src = _checkpoint(tmp_path / "src")
    for i, delay in enumerate((0.0, 0.05, 0.1, 0.2, 0.4, 0.8)):
        p = _start("convert", "of2tf", src, "-o", tmp_path / f"dst{i}")
        end = time.monotonic() + 60
        while not _mapped(p.pid, "numpy") and p.poll() is None and time.monotonic() < end:
            time.sleep(0.001)  # bert_of.cli is importing its modules
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (delay, err)
        if p.returncode != 0:  # not finished before the signal
            assert p.returncode == -signal.SIGINT and len(error_lines(err)) <= 1, (delay, p.returncode, err)
        assert _leftovers(tmp_path) == []


def test_ctrl_c_stops_a_shell_loop(tmp_path, big):
    """bash runs the next command of a loop when a child exits normally with 130: ending by the
    signal is what stops it."""
    out = tmp_path / "out"
    script = (f"for i in 1 2; do {sys.executable} -m bert_of.cli convert of2tf {big} -o {out}/dst$i; "
              f"echo status=$?; done; echo loop-finished")
    # bash as a terminal starts it: SIGINT at its default, whatever this process inherited (a shell
    # without job control starts `cmd &` with SIGINT ignored, and bash cannot undo an ignore it inherits)
    reset = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp('bash', sys.argv[1:])"
    p = subprocess.Popen([sys.executable, "-c", reset, "bash", "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT, start_new_session=True)
    _wait_dir(out, p)
    _wait_for_staging(out, p)
    os.killpg(p.pid, signal.SIGINT)
    stdout, err = p.communicate(timeout=120)
    assert "loop-finished" not in stdout and "status=" not in stdout, (stdout, err)
    assert os.listdir(out) == []


def _two_workers_at_work(tmp_path, inputs=2, copies=40):
    """`data create-pretraining` on ``inputs`` inputs with 2 workers, started and past its staging folder."""
    paths = []
    text = open(os.path.join(TEXT, "classics.txt")).read()
    for i in range(inputs):
        paths.append(tmp_path / f"in{i}.txt")
        paths[-1].write_text(text * copies)
    out = tmp_path / "data"
    p = _start("data", "create-pretraining", "--input", *paths, "--vocab", os.path.join(TEXT, "vocab.txt"),
               "--output", out, "--workers", "2")
    _wait_for_staging(tmp_path, p)
    return p, out


def test_ctrl_c_to_a_worker_pool_stops_quietly(tmp_path):
    p, out = _two_workers_at_work(tmp_path)
    pid, _, _ = _catch_worker(p, _reading)  # a worker is at work (caught reading its input) ...
    os.killpg(p.pid, signal.SIGINT)  # ... when Ctrl-C reaches the whole group
    os.kill(pid, signal.SIGCONT)
    _, err = p.communicate(timeout=120)
    lines = [l for l in error_lines(err) if "%|" not in l]  # the progress bar's own line
    assert lines == ["bert-of: error: interrupted"], (err, p.returncode)
    assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (p.returncode, err)
    assert _leftovers(tmp_path) == [] and not out.exists()


def _reading(pid):
    """The input file (in*.txt) process ``pid`` has open, or None."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if os.path.basename(target).startswith("in") and target.endswith(".txt"):
                return os.path.basename(target)
    except OSError:
        pass
    return None


def _fresh(pid):
    """``pid`` has written no records yet (so it has finished no job: a job writes its records, MBs
    here, before it reports; a new process's I/O counters start at 0), or None."""
    try:
        wchar = int(next(l for l in open(f"/proc/{pid}/io") if l.startswith("wchar:")).split()[1])
    except (OSError, StopIteration):
        return None
    return "fresh" if wchar < 65536 else None


def _catch_worker(p, state):
    """A worker of ``p`` stopped (SIGSTOP) in ``state`` (``state(pid)`` is true): each worker is frozen
    in turn, looked at, and let go if it is not in that state."""
    end = time.monotonic() + 120
    while time.monotonic() < end and p.poll() is None:
        try:
            workers = [int(c) for c in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()]
        except OSError:
            workers = []
        for pid in workers:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            what = state(pid)
            if what:
                return pid, what, workers
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)
    raise AssertionError(f"no worker was caught in that state: {p.communicate()}")


@pytest.mark.parametrize("when", ["reading its input", "before its first records"])
def test_a_worker_killed_mid_run_ends_the_job_with_one_line(tmp_path, when):
    """A worker that dies (OOM killer, kill -9) is reported at once as that worker's death, naming its
    input, never as an error writing the output (its pipe breaks as it dies: EPIPE / ECONNRESET for
    the job the parent hands it); the other worker is stopped and nothing is left behind. The worker
    is caught in the act, so the test knows it has work: frozen while it has its job's input open (a
    job reads its input as it goes), or at first sight, before it has written any records (killed
    that early, before it has read the job sent to it, it made the pool report "DST: cannot write
    (Connection reset by peer / Broken pipe)"). multiprocessing.Pool hung here: its workers share a
    queue lock, and one that died holding it left the other waiting."""
    p, out = _two_workers_at_work(tmp_path, inputs=4, copies=200)
    state = _reading if when == "reading its input" else _fresh
    victim, name, workers = _catch_worker(p, state)
    os.kill(victim, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    lines = [l for l in error_lines(err) if "%|" not in l]
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, err)
    assert "the worker process making its records died (exit status -9)" in lines[0], lines
    named = [f"in{i}.txt" for i in range(4) if f"in{i}.txt: the worker" in lines[0]]
    assert named == ([name] if name != "fresh" else named) and len(named) == 1, lines
    assert _leftovers(tmp_path) == [] and not out.exists()
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]


# --------------------------------------------------------------------------- flags


def _actions(parser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _actions(sub, path + (name,))
        else:
            yield path, a


def test_every_repeated_list_flag_adds_up(tmp_path):
    from bert_of.cli import parse

    parser = build_parser()
    parse(parser, ["inspect", "x"])  # the command line as `bert-of` parses it
    lists = [(path, a) for path, a in _actions(parser) if a.option_strings and
             (a.nargs in ("+", "*") or isinstance(a, argparse._AppendAction))]
    assert len(lists) >= 5
    for path, a in lists:
        assert isinstance(a, argparse._AppendAction), f"bert-of {' '.join(path)} {a.option_strings[0]} drops values"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(open(os.path.join(TEXT, "sample_text.txt")).read())
    b.write_text(open(os.path.join(TEXT, "classics.txt")).read())
    run_cli("data", "create-pretraining", "--input", a, "--input", b, "--vocab", os.path.join(TEXT, "vocab.txt"),
            "--output", tmp_path / "data", "--dupe-factor", "1")
    meta = json.load(open(tmp_path / "data" / "bert_of_data.json"))
    assert [i["file"] for i in meta["inputs"]] == ["a.txt", "b.txt"]
