"""OneFlow 0.9's graph-launch race and bert_of's guard (bert_of/runtime/oneflow_fix.py).

OneFlow 0.9 hands a graph run to its actors before queueing it, and the run's end dequeues it: a
run that ends first pops an empty queue (a segfault or a hang within a few thousand launches of a
small CPU graph on a busy machine; bench/graph_launch_race.py measures it with the guard off and on). The
guard is built with the system's C compiler and loaded before OneFlow by bert_of._flow; each test
runs a fresh interpreter, since a process decides once, when it imports OneFlow."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.oneflow

CHILD = r"""
import json, sys, numpy as np
from bert_of._flow import flow
import bert_of.runtime.oneflow_fix as fix
class G(flow.nn.Graph):
    def __init__(self, m): super().__init__(); self.m = m
    def build(self, x): return self.m(x)
g = G(flow.nn.Linear(8, 8).eval())
x = flow.tensor(np.arange(16, dtype=np.float32).reshape(2, 8))
first = g(x).numpy()
same = all(np.array_equal(g(x).numpy(), first) for _ in range(int(sys.argv[1])))
print(json.dumps({"same": same, "guard": fix.status()}))
"""


def _child(launches, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("BERT_OF_ONEFLOW_FIX", "CC")}
    e.update(env, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", CHILD, str(launches)], capture_output=True, text=True, env=e,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_graphs_launch_through_the_guard_and_give_the_same_output_each_time():
    out = _child(3000)
    assert out["same"] is True
    guard = out["guard"]
    assert guard["active"] is True
    assert guard["launches"] == 3001  # every run went through it (the first compiles)
    assert 0 <= guard["reordered"] < 3001  # runs that ended before their launch queued them: each a crash without it


def test_the_switch_turns_it_off_and_says_so():
    out = _child(3, BERT_OF_ONEFLOW_FIX="0")
    assert out == {"same": True, "guard": {"active": False, "why": "off (BERT_OF_ONEFLOW_FIX=0)"}}


def test_without_a_compiler_oneflow_still_runs_and_the_status_says_why(tmp_path):
    # an empty cache, so the guard would have to be compiled, and a compiler that is not there
    out = _child(3, CC=str(tmp_path / "no-such-cc"), XDG_CACHE_HOME=str(tmp_path / "cache"),
                 TMPDIR=str(tmp_path / "tmp"))
    assert out["same"] is True and out["guard"]["active"] is False
    assert out["guard"]["why"].startswith(f"off: {tmp_path / 'no-such-cc'}: ")
