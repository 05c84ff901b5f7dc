"""OneFlow 0.9's graph-launch race, with and without bert_of's guard (bert_of/runtime/oneflow_fix.py).

Each trial is a fresh process that runs one small CPU nn.Graph (a Linear layer) LAUNCHES times,
reading each output, as inference's layer-by-layer graph and a training loop do. Without the guard
a trial ends in a segfault (rc -11/139) or a hang (killed at the time limit) when a run ends before
its launch queued it; with the guard such a run is counted ("reordered") and the trial finishes.

    python bench/graph_launch_race.py [--trials 5] [--launches 20000] [--hog]

--hog runs a busy loop beside the trials (CI's condition). Writes bench/results/graph_launch_race.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, numpy as np
from bert_of._flow import flow
import bert_of.runtime.oneflow_fix as fix
class G(flow.nn.Graph):
    def __init__(self, m): super().__init__(); self.m = m
    def build(self, x): return self.m(x)
g = G(flow.nn.Linear(8, 8).eval())
x = flow.tensor(np.ones((2, 8), np.float32))
first = g(x).numpy()
n = int(sys.argv[1])
for i in range(n):
    assert np.array_equal(g(x).numpy(), first)
    if i % 1000 == 999:
        print("launched", i + 1, flush=True)
print("guard", json.dumps(fix.status()), flush=True)
"""


def trial(guard: bool, launches: int, limit: float) -> dict:
    env = dict(os.environ, BERT_OF_ONEFLOW_FIX="1" if guard else "0", PYTHONPATH=ROOT)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(launches)], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = p.communicate(timeout=limit)
        end = "ok" if p.returncode == 0 else f"crash (rc {p.returncode})"
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        end = f"hang (killed after {limit:.0f} s)"
    done = [int(l.split()[1]) for l in out.splitlines() if l.startswith("launched")]
    guard_line = [l for l in out.splitlines() if l.startswith("guard")]
    row = {"guard": guard, "end": end, "launches_done": done[-1] if done else 0,
           "seconds": round(time.perf_counter() - t0, 1)}
    if guard_line:
        row["guard_status"] = json.loads(guard_line[0][len("guard "):])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--launches", type=int, default=20000)
    ap.add_argument("--limit", type=float, default=300.0, help="seconds before a trial counts as hung")
    ap.add_argument("--hog", action="store_true", help="a busy loop beside the trials")
    ap.add_argument("-o", default=os.path.join(ROOT, "bench", "results", "graph_launch_race.json"))
    a = ap.parse_args()
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if a.hog else None
    try:
        rows = []
        for i in range(a.trials):  # interleaved: the same machine state for both
            for guard in (False, True):
                rows.append(trial(guard, a.launches, a.limit))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if hog:
            hog.kill()
    summary = {}
    for guard in (False, True):
        rs = [r for r in rows if r["guard"] is guard]
        summary["with guard" if guard else "without guard"] = {
            "trials": len(rs), "finished": sum(r["end"] == "ok" for r in rs),
            "crashed": sum(r["end"].startswith("crash") for r in rs), "hung": sum(r["end"].startswith("hang") for r in rs),
            "launches": sum(r["launches_done"] for r in rs),
            "reordered_runs_absorbed": sum(r.get("guard_status", {}).get("reordered", 0) for r in rs)}
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(["python"] + sys.argv),
              "load_before": os.getloadavg()[0], "hog": a.hog, "summary": summary, "trials": rows}
    with open(a.o, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
