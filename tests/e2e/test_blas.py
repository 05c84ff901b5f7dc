"""The BLAS under OneFlow's CPU GEMMs (bert_of/runtime/blas.py, blas_shim.c): chosen by BERT_OF_BLAS before
OneFlow loads, each choice in a fresh process (the choice is made once per process)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.oneflow

# A fresh process: which BLAS runs, which kernels OneFlow's own OpenBLAS chose, whether OneFlow's
# matmul went through the shim and agrees with float64 NumPy, and whether os.environ came back as it was.
PROBE = r"""
import ctypes, json, os, sys
import numpy as np
before = dict(os.environ)
from bert_of._flow import flow
import bert_of.runtime.blas as blas
lib = ctypes.CDLL(next(l.split()[-1] for l in open('/proc/self/maps') if 'liboneflow' in l))
lib.gotoblas_corename.restype = ctypes.c_char_p
rng = np.random.default_rng(0)
a, b = rng.standard_normal((300, 500)).astype(np.float32), rng.standard_normal((500, 400)).astype(np.float32)
got = flow.matmul(flow.tensor(a), flow.tensor(b)).numpy()
want = a.astype(np.float64) @ b.astype(np.float64)
print(json.dumps({**blas.status(), "corename": lib.gotoblas_corename().decode(),
                  "rel": float(np.abs(got - want).max() / np.abs(want).max()),
                  "environ_kept": {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "KMP_BLOCKTIME")} == before}))
"""

# A small BERT's forward (eager and graph) and one training step's gradients, saved to an .npz.
FORWARD = r"""
import sys
import numpy as np
from bert_of._flow import flow
from bert_of.config import BertConfig
from bert_of.heads import BertForPreTraining
from bert_of.modeling import BertGraph
import bert_of.runtime.blas as blas
flow.manual_seed(0)
cfg = BertConfig(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=1024, max_position_embeddings=128, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
model = BertForPreTraining(cfg)
rng = np.random.default_rng(1)
ids = flow.tensor(rng.integers(0, 512, (4, 128)), dtype=flow.int64)
out = {}
model.eval()
out["eager"] = model.bert(ids)[0].numpy()
out["graph"] = BertGraph(model.bert)(ids)[0].numpy()
model.train()
mlm = flow.tensor(np.where(rng.random((4, 128)) < 0.15, rng.integers(0, 512, (4, 128)), -100), dtype=flow.int64)
loss = model(ids, labels=mlm, next_sentence_label=flow.tensor([0, 1, 0, 1], dtype=flow.int64)).loss
loss.backward()
out["grad"] = model.bert.encoder.layer[0].attention.self.query.weight.grad.numpy()
out["threads"] = np.array(blas.status()["threads"])
np.savez(sys.argv[1], **out)
"""


def _env(**kv):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "BERT_OF_BLAS", "BERT_OF_BLAS_THREADS",
                                                             "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update({k: v for k, v in kv.items() if v is not None}, PYTHONPATH=ROOT)
    return env


def _probe(**kv) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE], env=_env(**kv), capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def _avx2_fma() -> bool:
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    return {"avx2", "fma"} <= set(flags)


def test_each_choice_runs_onefows_gemms_where_it_says():
    import bert_of.runtime.blas as blas

    openblas = blas.find_openblas()
    assert openblas, "the oneflow extra installs scipy-openblas32"
    exact = _probe(BERT_OF_BLAS="exact")
    own = _probe(BERT_OF_BLAS="oneflow")
    auto = _probe()
    named = _probe(BERT_OF_BLAS="openblas", BERT_OF_BLAS_THREADS="1")
    path = _probe(BERT_OF_BLAS=openblas)
    for r in (exact, own, auto, named, path):
        assert r["rel"] < 1e-5 and r["environ_kept"], r
    # OneFlow's own OpenBLAS: the detected kernels, or its AVX2/FMA ones; no GEMM through the shim
    assert exact["blas"] == "exact" and "gemms" not in exact
    assert own["blas"] == "oneflow" and own["corename"] == ("Haswell" if _avx2_fma() else exact["corename"])
    # auto: MKL when the mkl wheel is installed, else scipy-openblas32, with the process's CPUs as threads
    want = "mkl" if blas.find_mkl() else "openblas"
    assert auto["blas"] == want and auto["gemms"] >= 1 and auto["threads"] == len(os.sched_getaffinity(0))
    assert named["blas"] == "openblas" and named["threads"] == 1 and named["gemms"] >= 1
    assert named["version"].startswith("OpenBLAS")
    assert path["blas"] == "library" and path["library"] == openblas and path["gemms"] >= 1


def test_results_do_not_depend_on_the_thread_count(tmp_path):
    """OpenBLAS splits a GEMM's rows and columns among its threads, never a sum: a forward (eager,
    graph) and a backward give the same bits with 1 and 2 threads; against OneFlow's own OpenBLAS,
    and eager against graph, they differ only by float rounding."""
    runs = {}
    for name, kv in {"1": dict(BERT_OF_BLAS="openblas", BERT_OF_BLAS_THREADS="1"),
                     "2": dict(BERT_OF_BLAS="openblas", BERT_OF_BLAS_THREADS="2"),
                     "own": dict(BERT_OF_BLAS="oneflow")}.items():
        out = tmp_path / f"{name}.npz"
        r = subprocess.run([sys.executable, "-c", FORWARD, str(out)], env=_env(**kv), capture_output=True, text=True,
                           cwd=ROOT, timeout=600)
        assert r.returncode == 0, r.stderr
        runs[name] = dict(np.load(out))
    assert int(runs["1"]["threads"]) == 1 and int(runs["2"]["threads"]) == 2
    for k in ("eager", "graph", "grad"):
        assert np.array_equal(runs["1"][k], runs["2"][k]), k
        scale = np.abs(runs["own"][k]).max()
        assert np.abs(runs["2"][k] - runs["own"][k]).max() <= 1e-5 * max(scale, 1.0), k
    # eager with autograd on runs bert_of's CPU training kernels (bounded, not OneFlow's bits), the graph
    # OneFlow's ops: equal within float rounding
    scale = np.abs(runs["2"]["graph"]).max()
    assert np.abs(runs["2"]["eager"] - runs["2"]["graph"]).max() <= 1e-5 * max(scale, 1.0)


def test_auto_with_a_broken_install_falls_back_to_onefows_own(tmp_path):
    """A scipy_openblas32 whose library is not a BLAS: auto says so once and OneFlow's own OpenBLAS
    does the GEMMs (the shim, already loaded, hands each call to the next definition: liboneflow's)."""
    lib = tmp_path / "fake" / "scipy_openblas32" / "lib"
    lib.mkdir(parents=True)
    (lib.parent / "__init__.py").write_text("")
    (tmp_path / "empty.c").write_text("int bert_of_not_a_blas;\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libscipy_openblas.so"), str(tmp_path / "empty.c")],
                   check=True)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(lib.parent.parent), ROOT])
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["blas"] == "oneflow" and out["rel"] < 1e-5 and out["environ_kept"]
    assert out["note"].startswith("threaded BLAS off (BERT_OF_BLAS: ") and "has no cblas_sgemm" in out["note"]


@pytest.mark.parametrize("value, line", [
    ("bogus", "bert-of: error: BERT_OF_BLAS='bogus': not one of auto, mkl, openblas, oneflow, exact or a library path"),
    ("/nonexistent/libcblas.so", "bert-of: error: BERT_OF_BLAS=/nonexistent/libcblas.so: no such file"),
])
def test_a_bad_choice_is_one_line(value, line):
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "selftest", "--quick"], env=_env(BERT_OF_BLAS=value),
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert (r.returncode, r.stdout, r.stderr.strip().splitlines()) == (1, "", [line])


def test_a_library_without_cblas_is_refused_by_name(tmp_path):
    not_blas = next(l.split()[-1] for l in open("/proc/self/maps") if "libc.so" in l or "libc-" in l)
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "selftest", "--quick"], env=_env(BERT_OF_BLAS=not_blas),
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"bert-of: error: BERT_OF_BLAS: {not_blas} has no cblas_sgemm / cblas_dgemm / cblas_sdot / cblas_ddot "
        "(a CBLAS library with 32-bit integers)"]
