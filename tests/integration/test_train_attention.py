"""The training kernels' attention core and heads' split and merge (bert_of/runtime/train_kernels.py:
the BLAS's batched GEMM around cpu_train_kernels.c's softmax + dropout, the heads' passes): forward
and gradients equal OneFlow's ops given the same dropout mask, used only for training steps on CPU,
off with BERT_OF_CPU_TRAIN_ATTENTION=0 / BERT_OF_CPU_HEADS=0; and fine-tuning steps with them equal
the same steps without them (the softmax kernel's own masks: the same seeds in the same order)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.runtime import blas
from bert_of.runtime import train_kernels as TK
from tests.conftest import ROOT, TINY
from tests.helpers.train_kernels import dropout_module, kernels_on

STEPS = os.path.join(ROOT, "tests", "scripts", "eager_finetune_steps.py")  # the steps, in a process of their own
SWITCHES = ("BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_KERNELS", "BERT_OF_CPU_DROPOUT", "BERT_OF_CPU_TRAIN_ATTENTION",
            "BERT_OF_CPU_HEADS", "BERT_OF_CPU_TRAIN_ATTENTION_TOKENS")
ALWAYS = {"BERT_OF_CPU_TRAIN_ATTENTION_TOKENS": "1"}  # the kernels at these tests' few tokens too

pytestmark = pytest.mark.oneflow


@pytest.fixture(autouse=True, scope="module")
def _on():
    """The kernels on (their default) for this module's in-process tests even where the caller's
    environment turned them off, as before them afterwards."""
    with kernels_on(SWITCHES, ALWAYS):
        yield


def _needs_batched_gemm():
    if blas.batched_sgemm() is None:
        pytest.skip(f"the BLAS has no cblas_sgemm_batch_strided ({blas.describe()})")


@pytest.mark.parametrize("p,S", [(0.0, 19), (0.1, 19), (0.1, 5)])
def test_attention_core_equals_oneflows_ops_with_the_same_mask(p, S):
    """q, k, v [2, 3, S, 8] (S 19, and 5: fewer tokens than the head size), a padded row: the context
    [2, S, 24] and q's, k's, v's gradients as OneFlow's matmul / softmax / product with the kernel's
    dropout mask / permute give them, within float32 rounding; the heads' split of a Linear's output
    likewise, its bias's gradient included."""
    _needs_batched_gemm()
    rng = np.random.default_rng(3)
    B, N, D = 2, 3, 8
    x_np = rng.standard_normal((B, S, N * D)).astype(np.float32)
    lin = flow.nn.Linear(N * D, N * D)
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., S - 3:] = -10000.0
    g = flow.tensor(rng.standard_normal((B, S, N * D)).astype(np.float32))
    d = dropout_module(p)
    x = flow.tensor(x_np, requires_grad=True)
    qkv = [TK.split_heads(lin, x, N) for _ in range(3)]  # one Linear three times: its gradients add up
    out = TK.dropout_attention(*qkv, flow.tensor(mask), 0.35, d)
    assert out is not None and tuple(out.shape) == (B, S, N * D)
    (out * g).sum().backward()
    assert {"attention", "heads"} <= set(TK.train_status()["on"])
    # OneFlow's ops: the kernel's mask from the same seed (the dropout kernel's draws, as its test shows)
    d2 = dropout_module(p)
    seed = TK._seed(d2.generator) if p else (0, 0)
    thr, scale = TK._dropout_consts(p)
    km = (TK._run_dropout(TK._state["lib"], np.ones(B * N * S * S, np.float32), seed, thr, scale, 1)
          .reshape(B, N, S, S)) if p else np.ones((B, N, S, S), np.float32)
    lin2 = flow.nn.Linear(N * D, N * D)
    lin2.load_state_dict(lin.state_dict())
    x2 = flow.tensor(x_np, requires_grad=True)
    with TK.off():
        q, k, v = (lin2(x2).reshape(B, S, N, D).permute(0, 2, 1, 3) for _ in range(3))
        probs = flow.softmax(flow.matmul(q, k, transpose_b=True, alpha=0.35) + flow.tensor(mask), dim=-1)
        ref = flow.matmul(probs * flow.tensor(km), v).permute(0, 2, 1, 3).reshape(B, S, N * D)
        (ref * g).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=2e-6)
    for got, want in ((x.grad, x2.grad), (lin.weight.grad, lin2.weight.grad), (lin.bias.grad, lin2.bias.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=2e-5)
    if p:
        assert (km == 0).any()  # a dropout ran


def test_the_attention_kernels_serve_only_training_steps_on_cpu(monkeypatch):
    """No autograd, float64, a per-query mask, fewer tokens than BERT_OF_CPU_TRAIN_ATTENTION_TOKENS, the
    switches: None (the caller's ops) and no call; the
    heads' split and merge fall back to the inference path with OneFlow's bits."""
    _needs_batched_gemm()
    q = flow.tensor(np.ones((1, 2, 5, 4), np.float32), requires_grad=True)
    d = dropout_module(0.1)
    TK.dropout_attention(q, q, q, None, 0.5, d)  # the checks run (their calls are not counted)
    calls = TK.train_status()["calls"]
    with flow.no_grad():
        assert TK.dropout_attention(q, q, q, None, 0.5, d) is None
    assert TK.dropout_attention(q.double(), q.double(), q.double(), None, 0.5, d) is None
    assert TK.dropout_attention(q, q, q, flow.zeros(1, 1, 5, 5), 0.5, d) is None  # [B, 1, S, S]
    lin = flow.nn.Linear(8, 8)
    x = flow.tensor(np.arange(24, dtype=np.float32).reshape(1, 3, 8))
    with flow.no_grad():
        split = TK.split_heads(lin, x, 2)
        merged = TK.merge_heads(split)
    assert TK.train_status()["calls"] == calls
    assert np.array_equal(split.numpy(), lin(x).reshape(1, 3, 2, 4).permute(0, 2, 1, 3).numpy())
    assert np.array_equal(merged.numpy(), lin(x).numpy())
    monkeypatch.setenv("BERT_OF_CPU_TRAIN_ATTENTION_TOKENS", "6")  # 5 tokens: fewer than the threshold
    assert TK.dropout_attention(q, q, q, None, 0.5, d) is None
    monkeypatch.setenv("BERT_OF_CPU_TRAIN_ATTENTION_TOKENS", "1")
    monkeypatch.setenv("BERT_OF_CPU_TRAIN_ATTENTION", "0")
    monkeypatch.setenv("BERT_OF_CPU_HEADS", "0")
    assert TK.dropout_attention(q, q, q, None, 0.5, d) is None
    TK.merge_heads(q)
    assert TK.train_status()["calls"] == calls


def _steps(**env):
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    p = subprocess.run([sys.executable, STEPS, json.dumps(TINY)], env=dict(clean, PYTHONPATH=ROOT, **ALWAYS, **env),
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fine_tuning_with_the_attention_core_matches_the_softmax_kernels_steps():
    """Four AdamW steps of a tiny QA model (dropout 0.1, a padded row): with the attention core and the
    heads' kernels (the default) the losses and every parameter equal the same steps with both off
    (OneFlow's batched matmuls and permutes around the softmax kernel, the same masks) within float32
    noise; the switches turn them off."""
    if blas.batched_sgemm() is None:
        pytest.skip("the BLAS has no cblas_sgemm_batch_strided")
    fast = _steps()
    plain = _steps(BERT_OF_CPU_TRAIN_ATTENTION="0", BERT_OF_CPU_HEADS="0")
    assert {"attention", "heads"} <= set(fast["status"]["on"]) and "off" not in fast["status"], fast["status"]
    assert not {"attention", "heads"} & set(plain["status"]["on"]), plain["status"]
    np.testing.assert_allclose(fast["losses"], plain["losses"], rtol=1e-5, atol=0)
    assert fast["losses"][-1] < fast["losses"][0]
    for k, v in plain["params"].items():
        np.testing.assert_allclose(np.array(fast["params"][k]), np.array(v), rtol=0, atol=2e-5, err_msg=k)
