"""TensorFlow is the optional `tf` extra: without it, conversions (tf2of, hf2of, of2tf) work, and a
verification runs the NumPy reference and says in one line that TensorFlow's run was skipped.

Real processes in which ``import tensorflow`` fails as it does where the package is not installed:
a ``sitecustomize`` on PYTHONPATH puts a finder first on ``sys.meta_path`` that raises
ModuleNotFoundError for tensorflow (and its submodules)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, error_lines
from tests.helpers.blocked_imports import env_without

HF_TINY = os.path.join(ROOT, "tests", "data", "hf", "tiny_pt")

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("no_tf")
    return env_without("tensorflow", d)


def _bert_of(env, *args):
    return subprocess.run([sys.executable, "-m", "bert_of.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_without_tensorflow_conversions_work_and_verify_says_in_one_line_that_tf_was_skipped(env, tmp_path):
    r = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "ModuleNotFoundError: No module named 'tensorflow'" in r.stderr  # the control
    of, tf, back = tmp_path / "of", tmp_path / "tf", tmp_path / "of2"
    for args in (("hf2of", HF_TINY, "-o", of), ("of2tf", of, "-o", tf), ("tf2of", tf, "-o", back)):
        r = _bert_of(env, "convert", *args)
        assert r.returncode == 0 and "wrote" in r.stdout, (args, r.stderr)
    assert _bert_of(env, "verify", of, back).returncode == 0  # bert_of against bert_of needs no TF

    # The proof is the NumPy reference: it needs no TensorFlow; TensorFlow's run beside it is
    # skipped, said in one line (and in the report).
    note = "verify: A:tf-float64 not run: TensorFlow is not installed (the tf extra: pip install 'bert_of[tf]')"
    r = _bert_of(env, "verify", tf, back, "--json")
    assert r.returncode == 0 and sum(note in line for line in r.stderr.splitlines()) == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["reference"] == "numpy-float64 (tf layout)"
    assert report["ecosystem"]["A:tf-float64"].startswith("not run: TensorFlow is not installed")
    r = _bert_of(env, "convert", "tf2of", tf, "-o", tmp_path / "checked", "--verify")
    assert r.returncode == 0 and note in r.stderr and (tmp_path / "checked" / "model.safetensors").exists(), r.stderr


@pytest.mark.oneflow
def test_without_tensorflow_data_and_pretraining_run(env, tmp_path):
    """Training needs no TensorFlow either: pretraining data from text, then a short pretraining run."""
    text = os.path.join(ROOT, "tests", "data", "text")
    data, run = tmp_path / "data", tmp_path / "run"
    r = _bert_of(env, "data", "create-pretraining", "--input", os.path.join(text, "sample_text.txt"), "--vocab",
                 os.path.join(text, "vocab.txt"), "-o", data, "--max-seq-length", 64, "--max-predictions-per-seq",
                 10, "--dupe-factor", 1, "-q")
    assert r.returncode == 0, r.stderr
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(json.dumps({"vocab_size": sum(1 for _ in open(os.path.join(text, "vocab.txt"), encoding="utf-8")),
                               "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                               "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2}))
    r = _bert_of(env, "pretrain", "--data", data, "-o", run, "--config", cfg, "--steps", 3, "--batch-size", 4,
                 "--log-every", 1, "--mode", "eager", "-q")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [row["step"] for row in rows] == [1, 2, 3] and all(row["loss"] > 0 for row in rows), rows
    assert (run / "final" / "model.safetensors").exists()
