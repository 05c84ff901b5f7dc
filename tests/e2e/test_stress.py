"""One process that verifies and predicts many times, writing the environment between calls, does not
crash (issue 30). OneFlow's worker threads read the environment for every kernel; a bert_of call that
returned with kernels still running, or a write of bert_of's own while they ran, let a setenv
reallocate the environment array under them. The process runs on its own, so a crash is a failed
test (a signal exit), not a dead test session."""

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_cli
from tests.helpers.models import FAST, S_NEW, S_TRAIN, make_tf_dir, tiny_bert, user_vocab as _vocab

pytestmark = pytest.mark.oneflow


def test_graphs_built_and_dropped_beside_environment_writes_do_not_crash(tmp_path):
    tf_dir = make_tf_dir(tmp_path, "tiny3")
    vocab, n = _vocab(tmp_path / "vocab.txt")
    base = tiny_bert(tmp_path / "tiny", vocab, n, dropout=0.0)
    ft = tmp_path / "ft"
    run_cli("finetune", "classify", "--model", base, "--train", S_TRAIN, "-o", ft, "--steps", 2, *FAST)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=ROOT, BERT_OF_HOME=str(tmp_path / "home"), PYTHONFAULTHANDLER="1")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "scripts", "stress_graphs.py"), str(tmp_path),
                        str(tf_dir), str(ft), S_NEW, "6"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=900)
    died = f" (killed by {signal.Signals(-p.returncode).name})" if p.returncode < 0 else ""
    assert p.returncode == 0, f"exit {p.returncode}{died}:\n{p.stderr[-4000:]}"
    assert "stress: 12 calls, 30 graphs" in p.stdout, p.stdout
