"""Fuzz smoke: seeded random byte and field mutations of a small checkpoint in every format.

Each mutated checkpoint is converted by the real ``bert-of convert`` (tests/scripts/fuzz_worker.py,
one worker process per format, two at a time) and must end either in exit 0 with output that
``verify`` accepts against the mutated source, or in exactly one ``bert-of: error:`` line (not an
internal error) and exit 1: never a traceback, a crash, a hang or a file left behind. The seed is
fixed, so a failure replays: ``python tests/scripts/fuzz_worker.py FMT SRC WORK SEED CASE:1 OUT.json``.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import hostile_inputs as hi
from tests.conftest import ROOT, dies_with_the_suite

pytestmark = pytest.mark.oneflow

SEED = 12
# 300 cases, weighted by what a case costs (h5: a probe process per read; tf: TF's reference in verify)
COUNTS = {"of": 60, "hf": 60, "bin": 60, "lazy": 50, "tf": 40, "h5": 30}
PARALLEL = 2
TIMEOUT = 900


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    sources = hi.make_sources(str(root / "sources"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = ROOT
    env.pop("BERT_OF_DEBUG", None)
    todo, running, done = list(COUNTS), {}, {}
    deadline = time.time() + TIMEOUT
    while todo or running:
        while todo and len(running) < PARALLEL:
            fmt = todo.pop(0)
            out = str(root / f"{fmt}.json")
            cmd = [sys.executable, os.path.join(ROOT, "tests", "scripts", "fuzz_worker.py"), fmt, sources[fmt],
                   str(root / f"work-{fmt}"), str(SEED), str(COUNTS[fmt]), out]
            running[fmt] = (subprocess.Popen(dies_with_the_suite(cmd), env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.PIPE, text=True), out)
        for fmt, (p, out) in list(running.items()):
            if p.poll() is None and time.time() < deadline:
                continue
            if p.poll() is None:
                p.kill()
            err = p.communicate()[1]
            del running[fmt]
            report = json.load(open(out)) if p.returncode == 0 and os.path.exists(out) else None
            progress = json.load(open(out + ".progress")) if os.path.exists(out + ".progress") else None
            done[fmt] = {"rc": p.returncode, "report": report, "progress": progress, "stderr": err[-3000:],
                         "work": str(root / f"work-{fmt}")}
        time.sleep(0.2)
    return done


@pytest.mark.parametrize("fmt", list(COUNTS))
def test_fuzz_smoke(reports, fmt):
    r = reports[fmt]
    assert r["rc"] == 0, (f"the worker died (exit {r['rc']}) at {r['progress']}: a crash, or a hang past "
                          f"{TIMEOUT} s; replay with the seed and case above\n{r['stderr']}")
    report = r["report"]
    assert report["count"] == COUNTS[fmt] == len(report["results"])
    failures = [f"case {f['case']} ({f.get('mutation')}): {'; '.join(f['problems'])[:500]}" for f in report["failures"]]
    assert not failures, "\n".join(failures)
    assert report["exit0"] + report["exit1"] == COUNTS[fmt]
    assert os.listdir(r["work"]) == []  # every case cleaned up: nothing stray left anywhere in it


def test_fuzz_smoke_has_teeth(reports):
    """The mutations reach both outcomes: many are refused, some still convert (and verify)."""
    reps = [r["report"] for r in reports.values() if r["report"]]
    assert sum(r["exit1"] for r in reps) > 150 and sum(r["exit0"] for r in reps) > 20
    assert sum(1 for r in reps for x in r["results"] if x.get("rc") == 0 and "worst" in x) == sum(r["exit0"] for r in reps)
