"""Resume is "run it again": a run directory records its options (run.json), vocabulary and
config; `bert-of pretrain --data D -o RUN --resume` alone continues it, a larger --steps extends
it (the schedule re-planned from the current step, said in one line), --save-every / --keep /
--log-every may change, anything else given again must agree. Nothing a resumed run reads lives
in a checkpoint that --keep deletes. A soak: a run SIGKILLed at seeded random points and resumed
with the defaults each time ends bit-identical to an uninterrupted one.

Real `bert-of pretrain` runs (eager, a 2-layer model, dropout on) on real files."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_of.checkpoint import load_checkpoint
from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data
from tests.conftest import RANK_VARS, ROOT, error_lines, run_cli

pytestmark = pytest.mark.oneflow

TEXT = os.path.join(ROOT, "tests", "data", "text")
VOCAB = os.path.join(TEXT, "vocab.txt")
CONFIG = {"vocab_size": 966, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu"}
KEYS = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr")
LR, WARMUP = 1e-3, 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    create_pretraining_data([os.path.join(TEXT, "sample_text.txt")], VOCAB, str(root / "data"),
                            options=PretrainingOptions(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2),
                            progress=False)
    (root / "bert_config.json").write_text(json.dumps(CONFIG))
    return root


def _args(setup, run, *extra, steps=12):
    """A new run: every option written out (save every 2 steps, the default --keep 2)."""
    return ["pretrain", "--data", setup / "data", "-o", run, "--config", setup / "bert_config.json", "--vocab", VOCAB,
            "--mode", "eager", "--steps", steps, "--batch-size", 8, "--save-every", 2, "--log-every", 1,
            "--warmup-steps", WARMUP, "--lr", LR, "-q", *extra]


def _resume(setup, run, *extra):
    """The resume a user types: the data, the run, --resume (and what may change)."""
    return ["pretrain", "--data", setup / "data", "-o", run, "--resume", "-q", *extra]


def _metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: r[k] for k in KEYS} for r in map(json.loads, f)]


def _weights(run):
    return load_checkpoint(os.path.join(run, "final")).tensors


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert np.asarray(wa[name]).tobytes() == np.asarray(wb[name]).tobytes(), name


@pytest.fixture(scope="module")
def straight(setup):
    run = setup / "straight"
    run_cli(*_args(setup, run))
    return run


@pytest.fixture(scope="module")
def straight_process(setup):
    """The uninterrupted run as its own process, as the soak's runs are. Inside this test process
    the BLAS kernels are whichever OneFlow was imported with first: `pretrain` asks for OpenBLAS's
    Haswell kernels (BERT_OF_BLAS=auto -> OPENBLAS_CORETYPE), which apply only to an import after
    it, so after a full suite an in-process run differed from a fresh process in the 7th digit."""
    run = setup / "straight-process"
    run_cli(*_args(setup, run), process=True)
    return run


def test_resume_with_no_other_flag_continues_the_run_under_the_default_keep(setup, straight, tmp_path):
    """--save-every 2 with --keep 2: the checkpoint the run resumed from is deleted three saves
    later; the run still finishes, because it reads its own vocab.txt and config.json."""
    run = tmp_path / "run"
    run_cli(*_args(setup, run, "--stop-after", 4))
    assert sorted(os.listdir(run / "checkpoints")) == ["step-0000002", "step-0000004"]
    assert sorted(n for n in os.listdir(run) if not n.startswith(".")) == [
        "checkpoints", "config.json", "metrics.jsonl", "run.json", "vocab.txt"]
    recorded = json.load(open(run / "run.json"))
    assert recorded["lr"] == LR and recorded["steps"] == 12 and recorded["vocab"] == VOCAB
    assert recorded["max_seq_length"] == 64 and "resume" not in recorded and "output" not in recorded
    run_cli(*_resume(setup, run))
    assert sorted(os.listdir(run / "checkpoints")) == ["step-0000010", "step-0000012"]  # step-4 went long ago
    assert _metrics(run) == _metrics(straight)
    _same_weights(run, straight)
    assert open(run / "final" / "vocab.txt", "rb").read() == open(VOCAB, "rb").read()


def test_what_may_change_on_a_resume_and_what_may_not(setup, straight, tmp_path):
    run = tmp_path / "run"
    run_cli(*_args(setup, run, "--stop-after", 6))

    def refused(*extra, needle):
        r = run_cli(*_resume(setup, run, *extra), check=False)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and needle in lines[0], r.stderr
        assert "Traceback" not in r.stderr

    refused("--lr", 5e-4, needle="cannot resume exactly with a different setup (lr 0.001 -> 0.0005)")
    refused("--batch-size", 16, "--seed", 1, needle="different setup (batch_size 8 -> 16, seed 42 -> 1)")
    refused("--steps", 10, needle="steps 12 -> 10")  # shorter: refused
    refused("--mode", "graph", needle="mode 'eager' -> 'graph'")
    # given again with the recorded values, or changing only what may change: accepted
    run_cli(*_args(setup, run, "--resume", "--stop-after", 8))
    run_cli(*_resume(setup, run, "--save-every", 4, "--keep", 3, "--log-every", 2))
    recorded = json.load(open(run / "run.json"))
    assert (recorded["save_every"], recorded["keep"], recorded["log_every"]) == (4, 3, 2)
    assert sorted(os.listdir(run / "checkpoints")) == ["step-0000006", "step-0000008", "step-0000012"]
    assert [r["step"] for r in _metrics(run)] == list(range(1, 9)) + [10, 12]
    _same_weights(run, straight)  # the same steps on the same batches: logging and saving change no number


def test_a_larger_steps_extends_the_run_and_re_plans_the_schedule(setup, straight, tmp_path):
    run = tmp_path / "run"
    run_cli(*_args(setup, run))  # finished at step 12
    r = run_cli("pretrain", "--data", setup / "data", "-o", run, "--resume", "--steps", 16)
    notes = [ln for ln in r.stderr.splitlines() if "re-planned" in ln]
    assert notes == ["pretrain: 12 -> 16 steps: the learning-rate schedule is re-planned for 16 steps from step 12"]
    rows = _metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 17)) and rows[:12] == _metrics(straight)
    for row in rows[12:]:  # Google's schedule at the new horizon, a function of the step alone
        assert row["lr"] == pytest.approx(LR * (1 - (row["step"] - 1) / 16), rel=1e-6)
    assert json.load(open(run / "run.json"))["steps"] == 16
    assert load_checkpoint(os.path.join(run, "final")).metadata["pretrained_steps"] == "16"
    # and the extended run resumes exactly like any other: killed at 14, resumed with nothing else
    again = tmp_path / "again"
    run_cli(*_args(setup, again))
    run_cli(*_resume(setup, again, "--steps", 16, "--stop-after", 14))
    run_cli(*_resume(setup, again))
    assert _metrics(again) == rows
    _same_weights(again, run)


def test_nothing_to_resume_is_one_line(setup, tmp_path):
    r = run_cli(*_resume(setup, tmp_path / "none"), check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and lines == [f"bert-of: error: {tmp_path / 'none'}: nothing to resume (no run.json: "
                                           "not a run of bert-of pretrain)"], r.stderr


# --------------------------------------------------------------------------- soak


def _env():
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["PYTHONPATH"] = ROOT
    return env


def _lines(path) -> int:
    try:
        with open(path) as f:
            return len(f.read().splitlines())
    except OSError:
        return 0


def test_soak_killed_at_random_and_resumed_with_the_defaults_ends_bit_identical(setup, straight_process, tmp_path):
    """SIGKILL at seeded random steps (a kill may land in a step, a save, a resume's start or the
    final write), then `--resume` alone each time: the same losses, bit-identical weights."""
    rng = random.Random(2026)
    run = tmp_path / "soak"
    kills = sorted(rng.sample(range(3, 13), 6))  # metrics lines to wait for; the first checkpoint is at 2
    argv = [str(a) for a in _args(setup, run)]
    t0, killed = time.monotonic(), []
    for i in range(len(kills) + 1):
        cmd = argv if i == 0 else [str(a) for a in _resume(setup, run)]
        p = subprocess.Popen([sys.executable, "-m", "bert_of.cli", *cmd], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
        try:
            if i < len(kills):
                while p.poll() is None and _lines(run / "metrics.jsonl") < kills[i]:
                    time.sleep(0.01)  # polling what the run wrote; the kill point is the file's state
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    killed.append(kills[i])
            err = p.communicate(timeout=300)[1]
        finally:
            if p.poll() is None:
                p.kill()
        if i == len(kills):
            assert p.returncode == 0, err
    assert killed, "every run finished before it could be killed"
    assert _metrics(run) == _metrics(straight_process)
    _same_weights(run, straight_process)
    assert not [n for n in os.listdir(run / "checkpoints") if n.startswith(".")]  # no staging folder left
    print(f"\nsoak: killed at metrics lines {killed}, {time.monotonic() - t0:.1f} s")
