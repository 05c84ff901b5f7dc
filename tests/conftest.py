"""Shared fixtures: small configs in Google's bert_config.json form, and a CLI runner."""

import os
import subprocess
import sys

import pytest

from bert_of.progress import setup_logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Odd sizes on purpose: a transposed or mislabelled dimension cannot hide.
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=37, hidden_act="gelu", hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1, max_position_embeddings=40, type_vocab_size=3,
            initializer_range=0.02)


@pytest.fixture(autouse=True)
def notes_on_stderr():
    """Library notes go to the bert_of logger; tests see them on stderr as a `bert-of` command shows
    them (capsys), at the default level whatever an earlier in-process command set."""
    setup_logging(0)


@pytest.fixture
def tiny_google_config():
    return dict(TINY)


def write_vocab(path, n):
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    words = specials + [f"tok{i}" for i in range(n - len(specials))]
    with open(path, "w") as f:
        f.write("\n".join(words[:n]) + "\n")
    return str(path)


def run_cli(*args, check=True, timeout=600):
    """Run the real `bert-of` entry point in a subprocess."""
    # OneFlow puts WORLD_SIZE/RANK/... into os.environ of processes that import it: a child
    # must not inherit them as if it had been launched as a rank.
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=timeout, cwd=ROOT)
    if check and r.returncode != 0:
        raise AssertionError(f"bert-of {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def error_lines(stderr):
    """The lines a user sees, minus OneFlow/TF start-up chatter."""
    noise = ("W2026", "I2026", "E2026", "libibverbs", "WARNING:tensorflow", "oneDNN", "To enable", "cpu_feature_guard")
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith(noise) and "tensorflow/core" not in l]
