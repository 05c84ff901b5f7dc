"""`bert-of selftest` on a machine without CUDA: it runs its CPU parts (verify of a Google TF1
checkpoint against TF's reference in eager and graph mode, the model's LayerNorm and GELU against
float64 formulas), says CUDA was not available, skips the CUDA parts with that reason and exits 0."""

import json
import os

import pytest

from tests.conftest import error_lines, run_cli

pytestmark = pytest.mark.oneflow


def test_selftest_without_cuda_runs_the_cpu_parts_and_exits_0(tmp_path):
    report = tmp_path / "selftest.json"
    r = run_cli("selftest", "-o", report, timeout=300)
    summary = json.loads(r.stdout)
    assert summary == json.loads(report.read_text())
    assert summary["cuda"] is False and summary["gpus"] == 0 and summary["ok"] is True
    checks = summary["checks"]
    verify = checks["verify"]
    assert verify["status"] == "pass" and list(k for k in verify if k in ("cpu", "cuda")) == ["cpu"]
    assert verify["cpu"]["reference"] == "numpy-float64 (tf layout)" and verify["cpu"]["runs"] == ["B:eager", "B:graph"]
    assert 0 < verify["cpu"]["worst"] <= 1e-5
    kernels = checks["kernels"]["max_abs_diff"]["cpu"]
    assert checks["kernels"]["status"] == "pass" and 0 < kernels["layer_norm"] < 1e-4 and 0 < kernels["gelu_tanh"] < 1e-4
    gelu = checks["kernels"]["cpu_gelu"]  # bert_of's CPU kernels: checked here, not read from a kept verdict
    assert gelu["active"] is True and gelu["verdicts_kept"] == 0 and set(gelu["gelu_ulps"]) == {"0", "1"}
    launch = checks["graph_launch"]  # OneFlow 0.9's graph-launch race guarded (bert_of/runtime/oneflow_fix.py)
    assert launch["status"] == "pass" and launch["guard"]["active"] is True
    assert launch["guard"]["launches"] >= launch["launches"] == 2000
    blas = checks["blas"]  # the BLAS under OneFlow's CPU GEMMs (bert_of/runtime/blas.py): its rate and its result
    assert blas["status"] == "pass" and blas["gflops"] > 0 and blas["max_rel_diff"] <= 1e-5
    if os.environ.get("BERT_OF_BLAS", "auto") == "auto":  # the suite also runs with BERT_OF_BLAS=oneflow
        assert blas["choice"] == "auto" and blas["blas"] in ("mkl", "openblas") and blas["gemms"] >= 5
    else:
        assert blas["choice"] == blas["blas"] == os.environ["BERT_OF_BLAS"]
    for name in ("amp", "throughput"):
        assert checks[name] == {"status": "skipped", "reason": "CUDA is not available"}
    assert "CUDA is not available: ran the CPU parts only" in r.stderr
    assert not [l for l in error_lines(r.stderr) if "error" in l]
