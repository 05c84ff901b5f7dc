"""Runs that never lie: a non-finite loss stops the run and publishes nothing; a run directory
has one writer, counts a checkpoint only when complete, falls back to the newest complete one,
refuses a resume with another setup, tidies what kills left and never logs a step twice.

Real `bert-of pretrain` processes (eager, a 2-layer model, a few steps) on real files; the AMP
tolerance on the trainer itself."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_of.checkpoint import write_checkpoint
from bert_of.tensors import expected_shapes
from bert_of.config import BertConfig
from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data
from tests.conftest import ROOT, dies_with_the_suite, error_lines, run_cli

pytestmark = pytest.mark.oneflow

TEXT = os.path.join(ROOT, "tests", "data", "text")
VOCAB = os.path.join(TEXT, "vocab.txt")
CONFIG = {"vocab_size": 966, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu"}
KEYS = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    create_pretraining_data([os.path.join(TEXT, "sample_text.txt")], VOCAB, str(root / "data"),
                            options=PretrainingOptions(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2),
                            progress=False)
    (root / "bert_config.json").write_text(json.dumps(CONFIG))
    (root / "bert_config_3.json").write_text(json.dumps(dict(CONFIG, num_hidden_layers=3)))
    return root


def _args(setup, run, *extra):
    return ["pretrain", "--data", setup / "data", "--output", run, "--config", setup / "bert_config.json",
            "--vocab", VOCAB, "--mode", "eager", "--steps", "8", "--batch-size", "8", "--save-every", "2",
            "--log-every", "1", "--warmup-steps", "2", "--lr", "1e-3", "--quiet", *extra]


def _metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]  # strict JSON: a bare NaN would fail here


def _fails(args, needle):
    r = run_cli(*args, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and needle in lines[0], (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def runs(setup):
    """A straight 8-step run, and one 'killed' after step 6 (checkpoints step-4 and step-6 kept)."""
    straight, stopped = setup / "straight", setup / "stopped"
    run_cli(*_args(setup, straight))
    run_cli(*_args(setup, stopped, "--stop-after", "6"))
    assert sorted(os.listdir(stopped / "checkpoints")) == ["step-0000004", "step-0000006"]
    return [{k: r[k] for k in KEYS} for r in _metrics(straight)], stopped


def test_a_damaged_latest_checkpoint_falls_back_and_resumes_exactly(setup, runs, tmp_path):
    straight, stopped = runs
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    os.remove(run / "checkpoints" / "step-0000006" / "optimizer.safetensors")  # no exact resume from step 6
    ck = run / "checkpoints"
    stale = ck / ".step-0000008.tmp-999999999-1-x1"  # a save killed by kill -9: its owner is gone
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)
    (ck / ".step-0000008.ranks").mkdir()
    r = run_cli(*_args(setup, run, "--resume"))
    assert (f"pretrain: passing over {ck / 'step-0000006'}: optimizer.safetensors is missing; "
            f"resuming from {ck / 'step-0000004'}") in r.stderr
    resumed = [{k: rec[k] for k in KEYS} for rec in _metrics(run)]
    assert resumed == straight  # steps 5 and 6 ran again: logged once, with the same numbers
    assert sorted(os.listdir(ck)) == ["step-0000006", "step-0000008"]  # stale staging and rank folders gone
    assert os.path.isdir(run / "final")


def test_no_complete_checkpoint_is_one_line(setup, runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[1], run)
    (run / "checkpoints" / "step-0000006" / "trainer_state.json").write_text('{"global_step": 6, garbage')
    (run / "checkpoints" / "step-0000004" / "trainer_state.json").write_text("")
    line = _fails(_args(setup, run, "--resume"), "no complete checkpoint to resume")
    assert "step-0000006/trainer_state.json: differs from the checkpoint's manifest" in line
    assert "step-0000004/trainer_state.json: differs" in line
    os.remove(run / "checkpoints" / "step-0000004" / "manifest.json")  # a save that never finished
    line = _fails(_args(setup, run, "--resume"), "no complete checkpoint to resume")
    assert "step-0000004: incomplete (no manifest.json" in line


def test_a_resume_with_another_setup_names_the_difference(setup, runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[1], run)
    _fails(_args(setup, run, "--resume", "--batch-size", "16"), "different setup (batch_size 8 -> 16)")
    args = _args(setup, run, "--resume")
    args[args.index("--config") + 1] = setup / "bert_config_3.json"
    _fails(args, f"different setup (config '{setup / 'bert_config.json'}' -> '{setup / 'bert_config_3.json'}')")
    _fails(_args(setup, run, "--resume", "--no-dropout"), "different setup (no_dropout False -> True)")
    _fails(_args(setup, run, "--overwrite", "--resume"), "pass one of them")
    _fails(_args(setup, run), "already holds a run (metrics.jsonl, checkpoints)")
    _fails(_args(setup, run, "--output", setup / "data"), "is the source")


def test_overwrite_removes_only_what_the_run_wrote(setup, runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[1], run)
    (run / "notes.txt").write_text("mine")
    run_cli(*_args(setup, run, "--overwrite", "--steps", "2", "--save-every", "0"))
    assert sorted(os.listdir(run)) == [".bert_of.lock", "config.json", "final", "metrics.jsonl", "notes.txt", "run.json",
                                       "vocab.txt"]
    assert [r["step"] for r in _metrics(run)] == [1, 2]


def _nan_checkpoint(path):
    cfg = BertConfig.from_google_dict(dict(CONFIG))
    rng = np.random.default_rng(0)
    tensors = {n: (rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in expected_shapes(cfg).items()}
    tensors["bert.encoder.layer.1.output.dense.weight"][3, 5] = np.nan  # one weight
    write_checkpoint(str(path), list(tensors.items()), cfg, VOCAB)


def test_non_finite_training_stops_and_publishes_nothing(setup, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("BERT_OF_HOME", str(home))
    init = tmp_path / "nan-init"
    _nan_checkpoint(init)
    run = tmp_path / "nan-run"
    args = _args(setup, run, "--init-checkpoint", init, "--zoo-name", "broken")
    args.remove("--config")
    args.remove(setup / "bert_config.json")
    _fails(args, "pretrain: the loss is not finite at step 1 (nan); training stopped, nothing published")
    assert not os.path.exists(run / "final") and not os.path.exists(home / "registry.local.json")
    assert "broken" not in run_cli("zoo", "list").stdout

    run = tmp_path / "lr-run"  # lr 1e30: steps 1-2 warm up from lr 0, then the weights blow up
    line = _fails(_args(setup, run, "--lr", "1e30", "--zoo-name", "broken"), "training stopped, nothing published")
    assert "not finite" in line and "(the last checkpoint," in line
    assert not os.path.exists(run / "final")
    steps = [r["step"] for r in _metrics(run)]  # valid JSON lines, one per finite step
    assert steps == list(range(1, len(steps) + 1)) and all(r["loss"] is not None for r in _metrics(run))
    for ck in os.listdir(run / "checkpoints"):  # every checkpoint kept holds finite tensors
        from bert_of.checkpoint import load_checkpoint

        c = load_checkpoint(str(run / "checkpoints" / ck), with_optimizer=True)
        assert all(np.isfinite(a).all() for a in list(c.tensors.values()) + list(c.optimizer.values()))
    assert "broken" not in run_cli("zoo", "list").stdout


def test_amp_skips_a_few_non_finite_losses_then_stops():
    from bert_of.heads import BertForPreTraining
    from bert_of.training import TrainConfig, Trainer
    from bert_of.training.state import NonFiniteError
    from tests.scripts.train_fixture import CONFIG as TINY, TRAIN, global_batch
    from bert_of.training.trainer import MAX_AMP_NONFINITE

    class Faulty(BertForPreTraining):
        """A model whose loss turns NaN on demand: the input gate refuses NaN in a batch (as the data
        readers do), so a non-finite step comes from the computation, as an fp16 overflow would."""
        poison = False

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if self.poison and out.loss is not None:
                out.loss = out.loss * float("nan")
            return out

    for amp in (False, True):
        model = Faulty(BertConfig(**TINY))
        model.init_weights(seed=0)
        trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode="eager", amp=amp, warmup_steps=0)))
        assert np.isfinite(trainer.step(global_batch(0))["loss"])
        before = {n: p.numpy().copy() for n, p in model.named_parameters()}
        model.poison = True
        skipped = 0
        with pytest.raises(NonFiniteError, match=r"the loss is not finite at step (\d+) \(nan\)") as e:
            for s in range(1, 2 + MAX_AMP_NONFINITE):
                out = trainer.step(global_batch(s))
                assert out["skipped"] == 1.0 and np.isnan(out["loss"])
                skipped += 1
        assert skipped == (MAX_AMP_NONFINITE if amp else 0)
        assert f"at step {2 + skipped} " in str(e.value)
        # no update from a non-finite step: the model is the one the last finite step left
        assert all(np.array_equal(before[n], p.numpy()) for n, p in model.named_parameters())


def _wait_for(pred, timeout=120, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _logged(run, n):
    try:
        return len(open(os.path.join(run, "metrics.jsonl")).read().splitlines()) >= n
    except OSError:
        return False


def test_one_writer_per_run_and_sigterm_then_resume(setup, tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT
    long = [str(a) for a in _args(setup, run, "--steps", "100000", "--save-every", "5")]
    first = subprocess.Popen(dies_with_the_suite([sys.executable, "-m", "bert_of.cli", *long]), stderr=subprocess.PIPE,
                             text=True, env=env, cwd=ROOT)
    try:
        _wait_for(lambda: _logged(run, 12), what="12 logged steps")
        t0 = time.monotonic()
        line = _fails(long, f"{run}: another bert_of process is writing it (pid {first.pid}: ")
        assert "bert_of.cli pretrain" in line and time.monotonic() - t0 < 60
        first.send_signal(signal.SIGTERM)
        err = first.communicate(timeout=60)[1]
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGTERM  # the shell sees 143
    assert "bert-of: error: terminated" in err and "Traceback" not in err
    logged = [r["step"] for r in _metrics(run)]
    last = max(int(n[5:]) for n in os.listdir(run / "checkpoints"))
    assert logged[-1] >= last >= 10 and not [n for n in os.listdir(run / "checkpoints") if n.startswith(".")]
    # resumed: the steps after the last checkpoint (if the signal came between saves) are logged once, not twice
    # (test_a_damaged_latest_checkpoint_falls_back_and_resumes_exactly pins that case deterministically)
    run_cli(*[a for a in long], "--resume", "--stop-after", str(last + 2))
    assert [r["step"] for r in _metrics(run)] == list(range(1, last + 3))
