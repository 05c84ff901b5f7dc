"""The training kernels' dropout and softmax + dropout (bert_of/runtime/cpu_train_kernels.c through
train_kernels.py): forward and gradients equal OneFlow's ops given the same mask, the mask's rate and
its draws (repeatable from the generator's seed, new each call), used only for training steps on CPU,
off with BERT_OF_CPU_DROPOUT=0; and fine-tuning steps with them: without dropout the losses and
parameters of OneFlow's ops, with dropout repeatable and training."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.runtime import train_kernels as TK
from tests.conftest import ROOT, TINY
from tests.helpers.train_kernels import dropout_module, kernels_on

STEPS = os.path.join(ROOT, "tests", "scripts", "eager_finetune_steps.py")  # the steps, in a process of their own

pytestmark = pytest.mark.oneflow


@pytest.fixture(autouse=True, scope="module")
def _on():
    """The kernels on (their default) for this module's in-process tests even where the caller's
    environment turned them off, as before them afterwards."""
    with kernels_on(("BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_DROPOUT")):
        yield


@pytest.mark.parametrize("shape,p", [((3, 37), 0.1), ((2, 5, 384), 0.5), ((7,), 0.3)])
def test_dropout_keeps_scales_and_differentiates_as_oneflows_product(shape, p):
    """y = x * scale where kept, else 0 (scale OneFlow's 1 / (1 - p) in float); the gradient the same
    mask times scale; the rate near p over many elements."""
    rng = np.random.default_rng(1)
    x_np = (rng.standard_normal(shape) + 3).astype(np.float32)  # no zeros: kept = y != 0
    x = flow.tensor(x_np, requires_grad=True)
    g = rng.standard_normal(shape).astype(np.float32)
    calls = TK.train_status().get("calls", 0)
    y = TK.dropout(dropout_module(p), x)
    (y * flow.tensor(g)).sum().backward()
    assert TK.train_status()["calls"] == calls + 1 and "off" not in TK.train_status()
    kept = y.numpy() != 0
    scale = np.float32(1.0 / (1.0 - p))
    assert np.array_equal(y.numpy()[kept], x_np[kept] * scale)
    assert np.array_equal(x.grad.numpy(), np.where(kept, g * scale, np.float32(0)))
    big = TK.dropout(dropout_module(p), flow.ones(1 << 18, requires_grad=True)).numpy()
    assert abs((big == 0).mean() - p) < 6 * np.sqrt(p * (1 - p) / big.size)


def test_dropout_draws_repeat_from_the_generators_seed_and_change_each_call():
    """The n-th call since the model's generator was seeded draws the same mask (the trainer seeds it
    every step from (seed, step, rank)), the same seed again included; each call a new one. Another
    generator (OneFlow's own class) restarts at a new seed."""
    x = flow.ones(4096, requires_grad=True)
    d = dropout_module(0.2, seed=11)
    first, second = TK.dropout(d, x).numpy(), TK.dropout(d, x).numpy()
    d.generator.manual_seed(11)
    again = TK.dropout(d, x).numpy()
    d.generator.manual_seed(12)
    other = TK.dropout(d, x).numpy()
    assert np.array_equal(first, again)
    assert not np.array_equal(first, second) and not np.array_equal(first, other)
    plain = flow.nn.Dropout(0.2, generator=flow.Generator())
    plain.train()
    plain.generator.manual_seed(11)
    a, b = TK.dropout(plain, x).numpy(), TK.dropout(plain, x).numpy()
    plain.generator.manual_seed(12)
    c = TK.dropout(plain, x).numpy()
    plain.generator.manual_seed(11)
    assert np.array_equal(TK.dropout(plain, x).numpy(), a) and not np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_softmax_dropout_equals_oneflows_ops_with_the_same_mask(p):
    """dropout(softmax(scores + mask)) and the scores' gradient: OneFlow's softmax of scores + mask times
    the kernel's mask and scale, within float noise (a padded key column included)."""
    rng = np.random.default_rng(2)
    B, N, S = 2, 3, 19
    s_np = (rng.standard_normal((B, N, S, S)) * 3).astype(np.float32)
    m_np = np.zeros((B, 1, 1, S), np.float32)
    m_np[1, ..., 15:] = -10000.0
    g = rng.standard_normal((B, N, S, S)).astype(np.float32)
    scores = flow.tensor(s_np, requires_grad=True)
    y = TK.softmax_dropout(scores, flow.tensor(m_np), dropout_module(p))
    assert y is not None
    (y * flow.tensor(g)).sum().backward()
    ref_s = flow.tensor(s_np, requires_grad=True)
    probs = flow.softmax(ref_s + flow.tensor(m_np), dim=-1)
    live = np.broadcast_to(m_np == 0, probs.shape)  # P > 0: kept = y != 0
    kept = (y.numpy() != 0) | ~live
    keep = flow.tensor(np.where(kept & live, np.float32(1.0 / (1.0 - p)), np.float32(0)))
    (probs * keep * flow.tensor(g)).sum().backward()
    np.testing.assert_allclose(y.numpy(), (probs * keep).numpy(), rtol=2e-6, atol=1e-9)
    np.testing.assert_allclose(scores.grad.numpy(), ref_s.grad.numpy(), rtol=1e-5, atol=2e-7)
    if p:
        assert 0 < (~kept).mean() < 0.3


def test_the_dropout_kernels_serve_only_training_steps_on_cpu(monkeypatch):
    """No autograd, eval mode, p 0, float64, a per-query mask: OneFlow's path (the module, or None for
    the caller's ops); BERT_OF_CPU_DROPOUT=0 keeps OneFlow's dropout."""
    x = flow.tensor(np.ones((4, 8), np.float32), requires_grad=True)
    s = flow.tensor(np.zeros((1, 2, 3, 3), np.float32), requires_grad=True)
    d = dropout_module(0.5)
    calls = TK.train_status().get("calls", 0)
    with flow.no_grad():
        assert TK.softmax_dropout(s, None, d) is None
        TK.dropout(d, x)
    assert TK.softmax_dropout(s.double(), None, d) is None
    assert TK.softmax_dropout(s, flow.zeros(1, 1, 3, 3), d) is None  # [B, 1, S, S]: OneFlow's ops
    assert np.array_equal(TK.dropout(dropout_module(0.0), x).numpy(), x.numpy())
    d.eval()
    assert np.array_equal(TK.dropout(d, x).numpy(), x.numpy())
    monkeypatch.setenv("BERT_OF_CPU_DROPOUT", "0")
    d.train()
    assert TK.softmax_dropout(s, None, d) is None
    TK.dropout(d, x)
    assert TK.train_status()["calls"] == calls

def _steps(dropout: float, **env):
    cfg = dict(TINY, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_KERNELS", "BERT_OF_CPU_DROPOUT")}
    p = subprocess.run([sys.executable, STEPS, json.dumps(cfg)], env=dict(clean, PYTHONPATH=ROOT, **env), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fine_tuning_without_dropout_matches_oneflows_ops():
    """Four AdamW steps of a tiny QA model (a padded row), dropout 0: the attention's softmax in the
    kernel, the losses and every parameter as OneFlow's ops give them within float32 noise."""
    fast, plain = _steps(0.0, BERT_OF_CPU_TRAIN_KERNELS="1"), _steps(0.0, BERT_OF_CPU_TRAIN_KERNELS="0")
    assert fast["status"]["active"] and "off" not in fast["status"], fast["status"]
    np.testing.assert_allclose(fast["losses"], plain["losses"], rtol=1e-5, atol=0)
    assert fast["losses"][-1] < fast["losses"][0]
    for k, v in plain["params"].items():
        np.testing.assert_allclose(np.array(fast["params"][k]), np.array(v), rtol=0, atol=2e-5, err_msg=k)


def test_fine_tuning_with_the_kernels_dropout_repeats_and_trains():
    """Dropout 0.1 through the kernels: two runs give the same losses and parameters bit for bit (the
    masks follow the generator the trainer seeds each step), the loss falls, and the losses are those
    of a dropout (not of OneFlow's draws, nor of none)."""
    a, b = _steps(0.1, BERT_OF_CPU_TRAIN_KERNELS="1"), _steps(0.1, BERT_OF_CPU_TRAIN_KERNELS="1")
    oneflows = _steps(0.1, BERT_OF_CPU_TRAIN_KERNELS="1", BERT_OF_CPU_DROPOUT="0")
    none = _steps(0.0, BERT_OF_CPU_TRAIN_KERNELS="1")
    assert a["losses"] == b["losses"] and a["params"] == b["params"]
    assert a["losses"][-1] < a["losses"][0]
    assert a["losses"][0] != oneflows["losses"][0] and a["losses"][0] != none["losses"][0]
