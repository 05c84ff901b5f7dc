"""The training kernels for CPU (bert_of/runtime/cpu_train_kernels.c through train_kernels.py's autograd
Functions): LayerNorm(x + residual) and GELU(a + bias), forward and gradients within their bounds of
float64 and of OneFlow's own ops on odd shapes, used only where they apply, and a few fine-tuning
steps with them giving the losses and parameters of the same steps on OneFlow's ops."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.runtime import kernels as K
from bert_of.runtime import train_kernels as TK
from tests.conftest import ROOT, TINY

STEPS = os.path.join(ROOT, "tests", "scripts", "eager_finetune_steps.py")  # the steps, in a process of their own

pytestmark = pytest.mark.oneflow


@pytest.fixture(autouse=True, scope="module")
def _on():
    """The kernels on (their default) for this module's in-process tests even where the caller's
    environment turned them off (BERT_OF_CPU_TRAIN_KERNELS=0), as before them afterwards."""
    before, state = os.environ.get("BERT_OF_CPU_TRAIN_KERNELS"), dict(TK._state)
    os.environ.pop("BERT_OF_CPU_TRAIN_KERNELS", None)
    TK._state.update(checked=False, lib=None, kernels={}, calls=0)  # calls: this module's, from 0
    yield
    if before is not None:
        os.environ["BERT_OF_CPU_TRAIN_KERNELS"] = before
    TK._state.clear()
    TK._state.update(state)


def _oneflow_layer_norm(x, r, w, b, eps):
    """Output and gradients (x, r, w, b) of sum(LayerNorm(x + r) * g) in bert_of's OneFlow ops."""
    ln = K.LayerNorm(x.shape[-1], eps=eps)
    return lambda g: TK._grads(lambda x_, r_, w_, b_: K._layer_norm(TK._Params(w_, b_, eps, ln), x_ + r_),
                               (x, r, w, b), g)


@pytest.mark.parametrize("T,H", [(1, 8), (3, 37), (50, 384), (9, 768)])
def test_layer_norm_module_within_its_bounds(T, H):
    """Through the model's LayerNorm (autograd on): the output within LAYER_NORM_ULPS, the four
    gradients within GRAD_ULPS of their float64 magnitudes, each as near OneFlow's as OneFlow's is to
    float64 plus that; one kernel call per forward, with a residual and without."""
    rng = np.random.default_rng(T * H)
    x = (rng.standard_normal((T, H)) * 2 + 0.5).astype(np.float32)
    r = rng.standard_normal((T, H)).astype(np.float32)
    x[0, : H // 2] *= 300.0
    w = (rng.standard_normal(H) * 0.3 + 1).astype(np.float32)
    b = (rng.standard_normal(H) * 0.2).astype(np.float32)
    g = rng.standard_normal((T, H)).astype(np.float32)
    eps = 1e-12
    ln = TK.LayerNorm(H, eps=eps)
    with flow.no_grad():
        ln.weight.copy_(flow.tensor(w))
        ln.bias.copy_(flow.tensor(b))
    of = _oneflow_layer_norm(x, r, w, b, eps)(g)
    refs = TK._ln_ref(x + r, w, b, g, eps)  # x + r: one float add, as both take it
    for residual in (True, False):
        xt = flow.tensor(x + (0 if residual else r), requires_grad=True)
        rt = flow.tensor(r, requires_grad=True)
        ln.weight.grad = ln.bias.grad = None
        calls = TK.train_status().get("calls", 0)
        y = ln(xt.reshape(1, T, H), rt.reshape(1, T, H)) if residual else ln(xt)
        (y.reshape(T, H) * flow.tensor(g)).sum().backward()
        assert TK.train_status()["calls"] == calls + 1, TK.train_status()
        got = [y.numpy().reshape(T, H), xt.grad.numpy(), ln.weight.grad.numpy(), ln.bias.grad.numpy()]
        if residual:
            got.append(rt.grad.numpy())
        for i, (mine, theirs, (ref, mag), ulps) in enumerate(zip(
                got, [of[0], of[1], of[3], of[4], of[2]], [refs[0], refs[1], refs[2], refs[3], refs[1]],
                [TK.LAYER_NORM_ULPS] + [TK.GRAD_ULPS] * 4)):
            bound = ulps * TK.F32_EPS * mag
            assert (np.abs(theirs - ref) <= bound + np.abs(theirs - ref)).all()
            assert (np.abs(mine - ref) <= bound).all(), (i, np.max(np.abs(mine - ref) / (TK.F32_EPS * mag)))
            assert (np.abs(mine - theirs) <= np.abs(theirs - ref) + bound).all(), i


@pytest.mark.parametrize("op", [0, 1])
@pytest.mark.parametrize("T,C", [(1, 5), (13, 37), (64, 1536)])
def test_dense_gelu_within_its_bounds(op, T, C):
    """act(dense(x)) for a training step: the output within GELU_ULPS of |dense(x)| of the float64 GELU
    and of OneFlow's (bias add, then GELU in OneFlow's ops), the gradients of x, the weight and the
    bias within GRAD_ULPS-derived bounds of OneFlow's."""
    rng = np.random.default_rng(T + C + op)
    act = (K.gelu_erf, K.gelu_tanh)[op]
    dense = flow.nn.Linear(11, C)
    x = flow.tensor((rng.standard_normal((2, T, 11)) * 2).astype(np.float32), requires_grad=True)
    g = flow.tensor(rng.standard_normal((2, T, C)).astype(np.float32))
    calls = TK.train_status().get("calls", 0)
    y = TK.dense_act(dense, x, act)
    assert TK.train_status()["calls"] == calls + 1
    (y * g).sum().backward()
    mine = [y.numpy(), x.grad.numpy(), dense.weight.grad.numpy(), dense.bias.grad.numpy()]
    x.grad = dense.weight.grad = dense.bias.grad = None
    y2 = K._ONEFLOW_GELU[op](dense(x))
    (y2 * g).sum().backward()
    theirs = [y2.numpy(), x.grad.numpy(), dense.weight.grad.numpy(), dense.bias.grad.numpy()]
    # float64 gradient of the pre-activation, carried through the dense layer's sums by magnitude
    a = (flow.matmul(x, dense.weight, transpose_b=True) + dense.bias).numpy()
    ref = TK._gelu64(a, op)
    bound = TK.GELU_ULPS * TK.F32_EPS * np.abs(a)
    assert (np.abs(mine[0] - ref) <= bound).all() and (np.abs(mine[0] - theirs[0]) <= np.abs(theirs[0] - ref) + bound).all()
    da, mag = TK._gelu_ref(a, g.numpy(), op)
    xs = np.abs(x.numpy().astype(np.float64))
    refs = [(da @ dense.weight.numpy().astype(np.float64), mag @ np.abs(dense.weight.numpy().astype(np.float64))),
            (np.einsum("btc,bti->ci", da, x.numpy().astype(np.float64)), np.einsum("btc,bti->ci", mag, xs)),
            (da.sum((0, 1)), mag.sum((0, 1)))]
    for i, (m, t, (ref, mg)) in enumerate(zip(mine[1:], theirs[1:], refs)):
        bound = TK.GRAD_ULPS * TK.F32_EPS * mg
        assert (np.abs(m - ref) <= bound + np.abs(t - ref)).all(), i
        assert (np.abs(m - t) <= 2 * bound + np.abs(t - ref)).all(), i


def test_the_kernels_serve_only_training_steps_on_cpu():
    """No autograd, nothing requiring grad, float64: the parent's paths (no training kernel call) with
    the same output; a relu is OneFlow's Linear then relu."""
    ln = TK.LayerNorm(16)
    x = flow.tensor(np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32))
    calls = TK.train_status().get("calls", 0)
    with flow.no_grad():
        a = ln(x).numpy()
    b = ln(x.detach()).numpy()  # parameters require grad: the kernel
    assert TK.train_status()["calls"] == calls + 1
    ln.weight.requires_grad = ln.bias.requires_grad = False
    c = ln(x).numpy()  # nothing requires grad
    assert TK.gelu_bias(x, None, 0) is None and TK.gelu_bias(x.double().requires_grad_(), None, 0) is None
    dense = flow.nn.Linear(16, 4)
    r = TK.dense_act(dense, flow.tensor(x.numpy(), requires_grad=True), flow.relu)
    assert TK.train_status()["calls"] == calls + 1
    assert np.array_equal(r.numpy(), flow.relu(dense(x)).numpy())
    np.testing.assert_allclose(b, a, rtol=0, atol=4e-6)
    assert np.array_equal(a, c)

def _env(**env):
    """This process's environment without the kernels' switches, plus ``env``."""
    out = {k: v for k, v in os.environ.items()
           if k not in ("BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_KERNELS", "BERT_OF_CPU_DROPOUT")}
    return dict(out, **env)


def _steps(act, **env):
    p = subprocess.run([sys.executable, STEPS, json.dumps(TINY), act, "LayerNorm,intermediate"],
                       env=_env(PYTHONPATH=ROOT, **env), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("act", ["gelu_erf", "gelu_tanh"])
def test_fine_tuning_steps_match_oneflows_ops(act):
    """Four AdamW steps of a tiny QA model (dropout 0.1, a padded row): with the training kernels the
    losses and the LayerNorm and intermediate parameters equal the same steps with
    the kernels off within float32 noise (OneFlow's dropout draws are the same: BERT_OF_CPU_DROPOUT=0
    keeps OneFlow's dropout; test_train_dropout.py has the kernels' own); on by default, the switch turns
    them off with its reason."""
    fast, plain = _steps(act, BERT_OF_CPU_DROPOUT="0"), _steps(act, BERT_OF_CPU_TRAIN_KERNELS="0")
    assert fast["status"]["active"] and "off" not in fast["status"] and fast["status"]["calls"] > 0, fast["status"]
    assert not plain["status"]["active"] and "BERT_OF_CPU_TRAIN_KERNELS=0" in plain["status"]["why"]
    np.testing.assert_allclose(fast["losses"], plain["losses"], rtol=1e-5, atol=0)
    assert fast["losses"][-1] < fast["losses"][0]  # it trains
    for k, v in plain["params"].items():
        np.testing.assert_allclose(np.array(fast["params"][k]), np.array(v), rtol=0, atol=2e-5, err_msg=k)


# A training step whose loss turned NaN, its error kept (as pytest.raises keeps it: the traceback
# holds the step's graph, so the Functions' ctxs), then more work: create_pretraining_data with a
# worker pool, the error dropped, the interpreter's exit. While the Functions kept their saved arrays
# as an attribute of ctx (OneFlow 0.9 reads one as a borrowed reference: train_kernels' docstring),
# this segfaulted at the latest at exit, and PYTHONMALLOC=debug reported the heap corrupt.
_NAN_THEN_WORK = """
import gc, json, os, sys
import numpy as np
from bert_of.config import BertConfig
from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data
from bert_of.heads import BertForPreTraining
from bert_of.runtime.train_kernels import train_status
from bert_of.training import TrainConfig, Trainer
from bert_of.training.state import NonFiniteError
from tests.scripts.train_fixture import CONFIG, TRAIN, global_batch
text, out = sys.argv[1], sys.argv[2]


class Faulty(BertForPreTraining):
    poison = False

    def forward(self, *args, **kwargs):
        o = super().forward(*args, **kwargs)
        if self.poison:
            o.loss = o.loss * float("nan")
        return o


kept = []
for amp in (False, True):
    model = Faulty(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode="eager", amp=amp, warmup_steps=0)))
    finite = trainer.step(global_batch(0))["loss"]
    model.poison = True
    try:
        for s in range(1, 13):
            trainer.step(global_batch(s))
    except NonFiniteError as e:
        kept.append(e)
status, stopped = train_status(), len(kept)
for w in (1, 2):
    create_pretraining_data([os.path.join(text, "sample_text.txt")], os.path.join(text, "vocab.txt"),
                            os.path.join(out, f"w{w}"), options=PretrainingOptions(dupe_factor=2), num_parts=2,
                            workers=w, progress=False)
    if w == 1:
        kept.clear()
        gc.collect()
print(json.dumps({"status": status, "stopped": stopped, "finite": finite}))
"""


def test_a_non_finite_step_then_more_work_leaves_the_heap_whole(tmp_path):
    """Eager and AMP steps stopped by a NaN loss with the kernels on (their default), the errors
    kept, then data creation with and without workers and the exit, under PYTHONMALLOC=debug (a
    write to a freed block is reported at once): the process ends cleanly, having used the kernels."""
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _NAN_THEN_WORK,
                        os.path.join(ROOT, "tests", "data", "text"), str(tmp_path)],
                       env=_env(PYTHONMALLOC="debug"), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["status"]["active"] and res["status"]["calls"] > 0 and "off" not in res["status"], res
    assert res["stopped"] == 2 and np.isfinite(res["finite"])
    assert sorted(os.listdir(tmp_path / "w1")) == sorted(os.listdir(tmp_path / "w2"))


_KEPT_SCRIPT = """
import json
import numpy as np
from bert_of._flow import flow
from bert_of.runtime import train_kernels as TK
ln = TK.LayerNorm(37, eps=1e-12)
x = flow.tensor(np.random.default_rng(0).standard_normal((3, 37)).astype(np.float32), requires_grad=True)
y = ln(x)
y.sum().backward()
print(json.dumps({"status": TK.train_status(), "y": y.numpy().tolist(), "dx": x.grad.numpy().tolist()}))
"""


def test_the_checks_verdicts_are_kept_and_their_calls_are_not_the_callers():
    """The training kernels' first-use checks are kept beside their library (native.Verdicts): a process
    after the first reads them (same kernels, same bits), BERT_OF_CPU_KERNELS_RECHECK=1 runs them again;
    either way ``calls`` counts the caller's forward calls only, not the check's."""
    base = {k: v for k, v in os.environ.items() if k != "BERT_OF_CPU_KERNELS_RECHECK"}

    def run(**env):
        p = subprocess.run([sys.executable, "-c", _KEPT_SCRIPT], env=dict(base, **env), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    env = {k: v for k, v in base.items() if k.startswith("BERT_OF_CPU")}
    assert not env or env == {"BERT_OF_CPU_TRAIN_KERNELS": "1"}, env  # the kernels on, as by default
    fresh, kept = run(BERT_OF_CPU_KERNELS_RECHECK="1"), run()
    assert fresh["status"]["verdicts_kept"] == 0 and kept["status"]["verdicts_kept"] == 1, (fresh, kept)
    for res in (fresh, kept):
        assert res["status"]["active"] and res["status"]["calls"] == 1 and "off" not in res["status"], res
    assert fresh["y"] == kept["y"] and fresh["dx"] == kept["dx"]
