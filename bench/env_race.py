"""Why bert_of writes os.environ only through bert_of.runtime.process.set_environ (issue 30).

OneFlow 0.9's worker threads call getenv for every kernel they launch (DNNL_DEFAULT_FPMATH_MODE,
ONEFLOW_ENABLE_ONEDNN_OPTS, ONEFLOW_KERNEL_*: counted with an LD_PRELOAD getenv logger, tens of
thousands of calls in 15 s of a small model's forward). setenv of a name that is not set yet
reallocates the C environment array and frees the old one, so a getenv running beside it can read
freed memory. This script puts a thread that sets and removes new names beside (a) a model running
kernels and (b) OneFlow idle, each in its own process, and reports how each process ended.

    .venv/bin/python bench/env_race.py [--seconds 20] [--out bench/results/env_race.json]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

CHILD = r"""
import os, sys, threading, time
from bert_of._flow import flow
from bert_of import BertConfig
from bert_of.modeling import BertModel
busy, seconds = sys.argv[1] == "busy", float(sys.argv[2])
m = BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=37, max_position_embeddings=40)).eval()
ids = flow.tensor([[1] * 9] * 2, dtype=flow.int64)
stop = False
def churn():
    i = 0
    while not stop:
        names = [f"ENV_RACE_{i}_{j}" for j in range(20)]
        for k in names:
            os.environ[k] = "v"
        for k in names:
            del os.environ[k]
        i += 1
threading.Thread(target=churn, daemon=True).start()
t0 = time.time()
while time.time() - t0 < seconds:
    if busy:
        with flow.no_grad():
            for _ in range(5):
                m(ids)
            m(ids).last_hidden_state.numpy()
    else:
        time.sleep(0.01)
stop = True
print("survived", flush=True)
"""


def run(mode: str, seconds: float) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(seconds)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=root), cwd=root, timeout=seconds + 300)
    end = f"killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0 else f"exit {p.returncode}"
    return {"mode": mode, "ended": end, "after_s": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [run(mode, a.seconds) for _ in range(a.runs) for mode in ("busy", "idle")]
    res = {"date": time.strftime("%Y-%m-%d"), "seconds": a.seconds, "runs": rows,
           "command": "bench/env_race.py " + " ".join(sys.argv[1:])}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
