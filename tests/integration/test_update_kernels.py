"""The step's update on CPU in native passes (bert_of/runtime/update_kernels.py over
cpu_train_kernels.c): the gradients' global norm and clip equal to the float64 norm and to
clip_by_global_norm's OneFlow formula within float rounding, clipped or not; AdamW bit for bit
flow.optim.AdamW's, with its state_dict and a resume unchanged; each only where it applies, each with
its switch; and a few fine-tuning steps with them equal to the same steps without."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.options import TrainConfig
from bert_of.runtime import train_kernels as TK
from bert_of.runtime import update_kernels as UK
from bert_of.training.optim import build_optimizer, clip_by_global_norm
from tests.conftest import ROOT, TINY

STEPS = os.path.join(ROOT, "tests", "scripts", "eager_finetune_steps.py")
SWITCHES = ("BERT_OF_CPU_CLIP", "BERT_OF_CPU_ADAMW")

pytestmark = pytest.mark.oneflow


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    """The kernels on (their default) whatever the caller's environment says."""
    for name in (*SWITCHES, "BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_KERNELS"):
        monkeypatch.delenv(name, raising=False)
    if TK._state["lib"] is None and TK._state["checked"]:
        TK._state.update(checked=False, kernels={})


class _Net(flow.nn.Module):
    """Parameters of a few shapes (one over two of the kernels' 65,536-element chunks), all trained."""

    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.emb = flow.nn.Parameter(flow.tensor(rng.standard_normal((300, 500)).astype(np.float32) * 0.02))
        self.w = flow.nn.Parameter(flow.tensor(rng.standard_normal((37, 11)).astype(np.float32)))
        self.bias = flow.nn.Parameter(flow.tensor(rng.standard_normal(11).astype(np.float32)))
        self.LayerNorm = flow.nn.Parameter(flow.tensor(np.ones(7, np.float32)))

    def backward_with(self, seed, scale):
        """Gradients = scale * fixed random arrays (by backward of sum(p * g))."""
        rng = np.random.default_rng(seed)
        loss = sum((p * flow.tensor((rng.standard_normal(tuple(p.shape)) * scale).astype(np.float32))).sum()
                   for p in self.parameters())
        loss.backward()


def _grads(net):
    return [p.grad.numpy().copy() for p in net.parameters()]


def _norm64(grads):
    return float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads)))


@pytest.mark.parametrize("scale", [1e-4, 0.05])  # the norm within 1.0 (no scaling), and over it
def test_clip_equals_the_formula_within_rounding(scale, monkeypatch):
    """The norm: the float64 norm rounded to float (OneFlow's float32 sums within 1e-5 of it); the
    clipped gradients: the float64 factor's within 2 float ulps, OneFlow's formula's within 1e-5;
    within the limit the gradients are untouched, bit for bit."""
    nets = [_Net(0), _Net(0)]
    for net in nets:
        net.backward_with(1, scale)
    before = _grads(nets[0])
    exact = _norm64(before)
    calls = UK.update_status()["clip"]
    mine = float(clip_by_global_norm(list(nets[0].parameters()), 1.0, UK.Views()).numpy())
    assert UK.update_status()["clip"] == calls + 1
    monkeypatch.setenv("BERT_OF_CPU_CLIP", "0")
    theirs = float(clip_by_global_norm(list(nets[1].parameters()), 1.0).numpy())
    assert UK.update_status()["clip"] == calls + 1
    assert mine == float(np.float32(exact)) and abs(theirs - exact) <= 1e-5 * exact
    got, want = _grads(nets[0]), _grads(nets[1])
    if exact <= 1.0:
        assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got, before))
        assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(want, before))
    else:
        for a, b, g in zip(got, want, before):
            ref = g.astype(np.float64) / exact
            np.testing.assert_allclose(a, ref, rtol=2 * 2.0 ** -23, atol=0)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=0)


def test_the_norm_takes_every_gradient_and_keeps_memory_between_steps():
    """Views: a tensor seen before is not read again, a new one is (a gradient replaced between steps
    counts), and the kernel sees what OneFlow's ops wrote since; a gradient sharing memory with
    another, a float64 one or none at all leave it to OneFlow's ops."""
    net = _Net(2)
    net.backward_with(3, 0.01)
    views = UK.Views()
    grads = [p.grad for p in net.parameters()]
    first = UK.global_norm(grads, views)
    assert first == np.float32(_norm64([g.numpy() for g in grads]))
    net.w.grad = flow.tensor(np.full((37, 11), 2.0, np.float32))  # a new tensor: read anew
    grads = [p.grad for p in net.parameters()]
    assert UK.global_norm(grads, views) == np.float32(_norm64([g.numpy() for g in grads]))
    flow.optim.SGD(net.parameters(), lr=0.1).zero_grad()  # OneFlow's fill, pending in its VM
    assert UK.global_norm(grads, views) == 0.0
    base = flow.tensor(np.ones(20, np.float32))
    assert not UK.scale([base, base[5:15]], np.float32(0.5))  # overlapping memory: not the kernel's
    assert UK.global_norm([flow.tensor(np.ones(3))]) is None  # float64
    assert UK.global_norm([]) is None


def _adamw(model, wd=0.01, bias_correction=True):
    cfg = TrainConfig(mode="eager", optimizer="adamw", lr=1e-3, steps=10, weight_decay=wd, adam_eps=1e-6,
                      bias_correction=bias_correction, no_decay=["bias", "LayerNorm"])
    return build_optimizer(model, cfg, for_graph=False)


def _bits(tensors):
    return [t.numpy().copy().view(np.uint32) for t in tensors]


@pytest.mark.parametrize("bias_correction", [True, False])
def test_adamw_is_oneflows_bit_for_bit_and_its_state_resumes(bias_correction, monkeypatch, tmp_path):
    """Three steps (two groups: decay and none; the lr changing) with the kernel and with
    BERT_OF_CPU_ADAMW=0: the same parameter and state bits; state_dict's keys and shapes are
    flow.optim.AdamW's; the parameters and the state saved after two steps (flow.save) and loaded
    into a new model and optimizer, the third step gives the same bits."""
    nets = [_Net(4) for _ in range(3)]
    opts = [_adamw(n, bias_correction=bias_correction) for n in nets[:2]]
    assert [len(g.parameters) for g in opts[0].param_groups] == [2, 2]

    def step(i, net, opt):
        net.backward_with(10 + i, 0.1)
        for g in opt.param_groups:
            g["lr"] = 1e-3 * (1 - 0.1 * i)
        opt.step()
        opt.zero_grad()

    calls = UK.update_status()["adamw"]
    for i in range(2):
        step(i, nets[0], opts[0])
    assert UK.update_status()["adamw"] == calls + 4  # two groups, two steps
    flow.save(opts[0].state_dict(), str(tmp_path / "opt"))
    at_two = [p.numpy().copy() for p in nets[0].parameters()]
    step(2, nets[0], opts[0])
    monkeypatch.setenv("BERT_OF_CPU_ADAMW", "0")
    for i in range(3):
        step(i, nets[1], opts[1])
    assert UK.update_status()["adamw"] == calls + 6
    for a, b in zip(_bits(nets[0].parameters()), _bits(nets[1].parameters())):
        assert np.array_equal(a, b)
    mine, theirs = opts[0].state_dict(), opts[1].state_dict()
    plain = flow.optim.AdamW(nets[2].parameters(), lr=1e-3)
    nets[2].backward_with(0, 0.1)
    plain.step()
    assert set(mine["state"]) == set(theirs["state"]) and mine["state"]["step"] == theirs["state"]["step"] == 3
    for k, slots in mine["state"].items():
        if k == "step":
            continue
        assert set(slots) == set(theirs["state"][k]) == set(plain.state_dict()["state"][k]) == {"exp_avg", "exp_avg_sq"}
        for name, t in slots.items():
            assert tuple(t.shape) == tuple(theirs["state"][k][name].shape)
            assert np.array_equal(t.numpy().view(np.uint32), theirs["state"][k][name].numpy().view(np.uint32)), (k, name)
    assert [sorted(g) for g in mine["param_groups"]] == [sorted(g) for g in theirs["param_groups"]]
    monkeypatch.delenv("BERT_OF_CPU_ADAMW")
    resumed = _Net(4)
    with flow.no_grad():
        for p, a in zip(resumed.parameters(), at_two):
            p.copy_(flow.tensor(a))
    opt = _adamw(resumed, bias_correction=bias_correction)
    opt.load_state_dict(flow.load(str(tmp_path / "opt")))
    step(2, resumed, opt)
    assert UK.update_status()["adamw"] == calls + 8
    for a, b in zip(_bits(resumed.parameters()), _bits(nets[0].parameters())):
        assert np.array_equal(a, b)


def test_the_update_kernels_leave_amsgrad_and_other_optimizers_to_oneflow():
    """amsgrad (not the kernel's) steps through OneFlow's update; LAMB and SGD are OneFlow's classes."""
    net = _Net(5)
    opt = _adamw(net)
    for g in opt.param_groups:
        g["amsgrad"] = True
    calls = UK.update_status()["adamw"]
    net.backward_with(1, 0.1)
    opt.step()
    assert UK.update_status()["adamw"] == calls
    assert "max_exp_avg_sq" in opt.state_dict()["state"][0]
    for kind in ("lamb", "sgd"):
        cfg = TrainConfig(mode="eager", optimizer=kind, lr=1e-3, steps=10)
        assert type(build_optimizer(net, cfg, for_graph=False)) in (flow.optim.LAMB, flow.optim.SGD)


def _steps(**env):
    base = {k: v for k, v in os.environ.items()
            if k not in (*SWITCHES, "BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_KERNELS", "BERT_OF_CPU_DROPOUT")}
    p = subprocess.run([sys.executable, STEPS, json.dumps(TINY), "", "LayerNorm,intermediate,embeddings"],
                       env=dict(base, PYTHONPATH=ROOT, **env), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fine_tuning_steps_with_and_without_the_update_kernels():
    """Four eager AdamW steps of a tiny QA model (clip 1.0): with the update kernels (their default)
    and with their three switches off, the losses, the gradient norms and the parameters agree
    within float rounding; the kernels ran (the clip and AdamW's two groups every step), and not when
    switched off."""
    on, off = _steps(), _steps(**dict.fromkeys(SWITCHES, "0"))
    assert on["update"] == {"clip": 4, "adamw": 8}, on["update"]
    assert off["update"] == {"clip": 0, "adamw": 0}, off["update"]
    np.testing.assert_allclose(on["grad_norms"], off["grad_norms"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(on["losses"], off["losses"], rtol=1e-5, atol=0)
    assert on["losses"][-1] < on["losses"][0]
    for k, v in off["params"].items():
        np.testing.assert_allclose(np.array(on["params"][k]), np.array(v), rtol=0, atol=2e-5, err_msg=k)
