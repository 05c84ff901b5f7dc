"""Build, run and drop OneFlow graphs many times in one process while the environment is written
between calls, as a long-lived user process or a test harness does (tests/e2e/test_stress.py).

Each round: ``bert-of convert tf2of --verify`` (eager, nn.Graph and TensorFlow in this process),
``bert-of predict classify --mode graph``, and BertGraph built, run and dropped through the Python
API; after every call new variables are set and removed. OneFlow's worker threads call getenv for
every kernel, and setenv of a new name reallocates the C environment array: a call that returned
with kernels still running behind it crashed such processes (a segfault within minutes before
bert_of drained OneFlow at the end of every command and before its own environment writes).

usage: stress_graphs.py WORK TF_DIR MODEL DATA ROUNDS -> prints "stress: N calls, M graphs" and exits 0
"""

import contextlib
import io
import os
import sys

import numpy as np


def churn(round_no: int, n: int = 64) -> None:
    """What a harness does between calls: names that did not exist (each one reallocates)."""
    names = [f"BERT_OF_STRESS_{round_no}_{i}" for i in range(n)]
    for i, k in enumerate(names):
        os.environ[k] = "x" * (1 + i % 97)
    for k in names:
        del os.environ[k]


def main(work, tf_dir, model_dir, data, rounds) -> int:
    from bert_of import cli
    from bert_of._flow import flow
    from bert_of.modeling import BertGraph, BertModel
    from bert_of.config import BertConfig

    calls = graphs = 0
    model = BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, max_position_embeddings=40)).eval()
    for r in range(int(rounds)):
        for args in (["convert", "tf2of", tf_dir, "-o", os.path.join(work, f"of{r}"), "--verify", "-q"],
                     ["predict", "classify", "--model", model_dir, "--data", data, "-o",
                      os.path.join(work, f"p{r}.jsonl"), "--mode", "graph", "--max-seq-length", "32", "-q"]):
            with contextlib.redirect_stdout(io.StringIO()):
                code = cli.main(args)
            assert code == 0, (args, code)
            calls += 1
            graphs += 1
            churn(r)
        for S in (5, 9, 5 + r % 7):
            ids = flow.tensor(np.full((2, S), 7), dtype=flow.int64)
            with flow.no_grad():
                out = BertGraph(model)(ids)  # built, run, dropped at once: its teardown runs here
            del out
            graphs += 1
            churn(r)
    print(f"stress: {calls} calls, {graphs} graphs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
