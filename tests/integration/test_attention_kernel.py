"""The attention core for CPU inference (bert_of/runtime/cpu_kernels.c's bert_of_attention): within
its documented bound of float64 and of OneFlow's own ops on odd shapes, used only where it applies,
and a whole model's forward with it equal to the same forward on OneFlow's ops."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of import BertConfig, BertForQuestionAnswering, BertModel
from bert_of._flow import flow
from bert_of.converters.verify.compare import make_batch
from bert_of.runtime import kernels as K
from tests.conftest import ROOT, TINY

pytestmark = pytest.mark.oneflow


def _case(rng, B, N, S, D, rows):
    """q, k, v [B, N, S, D] with scores of a trained layer's range (|s| up to ~15) and a few large
    values, and an additive mask [B, 1, rows, S]: row 0 padded after S/2, row 1 (if any) all masked
    (what a batch row of only padding gives), per-query holes where the mask has query rows."""
    q, k, v = (rng.standard_normal((B, N, S, D)).astype(np.float32) * 2 for _ in range(3))
    v *= np.where(rng.random((B, N, S, 1)) < 0.05, 30.0, 1.0).astype(np.float32)
    mask = np.zeros((B, 1, rows, S), np.float32)
    mask[0, ..., S // 2 + 1:] = -10000.0
    if B > 1:
        mask[1] = -10000.0
    if rows > 1:
        mask[-1, 0, ::3, : S // 3] = -10000.0
    return q, k, v, mask


# (B, N, S, D, mask rows, LiBai's coeff): S not a multiple of 8, S = 1, B = 1, N = 1, head sizes
# below, at and off the micro-kernel's 8 and 16 columns, a block of query rows plus a tail (S > 32)
SHAPES = [(1, 1, 1, 8, 1, None), (1, 1, 5, 20, 1, None), (2, 3, 37, 24, 1, None), (3, 2, 9, 8, 9, 2.0),
          (2, 1, 70, 64, 1, None), (2, 4, 33, 4, 33, None), (1, 2, 130, 64, 1, 12.0)]


@pytest.mark.parametrize("B,N,S,D,rows,coeff", SHAPES)
def test_attention_kernel_within_its_bound_of_float64_and_oneflows_ops(B, N, S, D, rows, coeff):
    lib = K._kernel("attention")
    assert lib is not None, K.native_status()
    q, k, v, mask = _case(np.random.default_rng(S * 7 + D), B, N, S, D, rows)
    scale = 1.0 / math.sqrt(D)
    ref, mag = K.attention_magnitude(q, k, v, mask, scale)
    bound = K.ATTENTION_ULPS * K.F32_EPS * mag
    theirs = K._attention_oneflow(*(flow.tensor(t) for t in (q, k, v, mask)), scale, coeff).numpy()
    assert (np.abs(theirs - ref) <= bound).all()  # the bound holds OneFlow's own ops too
    one, two = (K._run_attention(lib, q, k, v, mask, scale, coeff, t) for t in (1, 2))
    assert K._same_bits(one, two)  # work split by (batch, head): threads change no sum
    with flow.no_grad():
        calls = K.native_status()["calls"]
        through_model_layer = K.attention(*(flow.tensor(t) for t in (q, k, v, mask)), scale, coeff).numpy()
        assert K.native_status()["calls"] == calls + 1
    for y in (one, through_model_layer):
        assert y.shape == (B, S, N * D)
        assert (np.abs(y - ref) <= bound).all(), np.max(np.abs(y - ref) / (K.F32_EPS * mag))
        assert (np.abs(y - theirs) <= np.abs(theirs - ref) + bound).all()


def test_attention_kernel_without_a_mask():
    lib = K._kernel("attention")
    q, k, v, _ = _case(np.random.default_rng(3), 2, 3, 11, 16, 1)
    ref, mag = K.attention_magnitude(q, k, v, None, 0.25)
    y = K._run_attention(lib, q, k, v, None, 0.25, None, 2)
    assert (np.abs(y - ref) <= K.ATTENTION_ULPS * K.F32_EPS * mag).all()


def test_attention_kernel_serves_only_inference_without_probabilities():
    """Autograd, the probabilities asked for, a head_mask silencing a head and active dropout: OneFlow's
    ops (no kernel call), with the same context as the kernel's within its bound; a head_mask of ones
    is the kernel's path."""
    cfg = BertConfig.from_google_dict(TINY)
    model = BertModel(cfg)
    model.init_weights(seed=4)
    model.eval()
    b = make_batch(cfg, batch_size=3, seq_len=11)
    args = [flow.tensor(b[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids", "attention_mask")]
    q = flow.tensor(np.ones((1, 1, 3, 8), np.float32), requires_grad=True)
    assert K.attention(q, q, q, None, 0.5) is None  # autograd on
    used = lambda: K._native["attention_calls"]  # noqa: E731
    with flow.no_grad():
        calls = used()
        fast = model(*args).sequence_output.numpy()
        assert used() == calls + cfg.num_hidden_layers and K._native["kernels"]["attention"] is None
        probs = model(*args, output_attentions=True)
        silenced = model(*args, head_mask=flow.tensor([1.0] * (cfg.num_attention_heads - 1) + [0.0]))
        model.train()  # dropout 0.1 on the probabilities
        model(*args)
        assert used() == calls + cfg.num_hidden_layers  # none of the three ran the kernel
        model.eval()  # a head_mask of ones changes nothing (p * 1 == p): the kernel, the same bits
        ones = model(*args, head_mask=flow.ones(cfg.num_attention_heads)).sequence_output.numpy()
        assert used() == calls + 2 * cfg.num_hidden_layers
    np.testing.assert_allclose(probs.sequence_output.numpy(), fast, rtol=0, atol=1e-5)
    assert np.array_equal(ones, fast)
    assert not np.allclose(silenced.sequence_output.numpy(), fast, atol=1e-3)  # the head_mask was applied


_FORWARD = """
import json, sys
import numpy as np
from bert_of import BertConfig, BertForQuestionAnswering, BertModel
from bert_of._flow import flow
from bert_of.converters.verify.compare import make_batch
from bert_of.runtime import kernels
cfg = BertConfig.from_google_dict(json.loads(sys.argv[1]))
out = {}
for cls in (BertModel, BertForQuestionAnswering):
    model = cls(cfg)
    model.init_weights(seed=5)
    model.eval()
    b = make_batch(cfg, batch_size=4, seq_len=19)
    b["attention_mask"][3] = 0  # a row of nothing but padding
    with flow.no_grad():
        res = model(*[flow.tensor(b[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids", "attention_mask")])
    out.update({f"{cls.__name__}.{k}": v.numpy().tolist() for k, v in res.to_dict().items()})
print(json.dumps({"status": kernels.native_status(), "attention": kernels._native["kernels"].get("attention", "unused"),
                  "attention_calls": kernels._native["attention_calls"], "out": out}))
"""


def _forward(**env):
    p = subprocess.run([sys.executable, "-c", _FORWARD, json.dumps(TINY)], env=dict(os.environ, **env), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_whole_model_forward_equals_oneflows_ops():
    """A tiny BertModel and QA model, a padded batch with a row of only padding: with the kernels on
    (the attention core among them) the outputs equal the same forward with BERT_OF_CPU_KERNELS=0
    within 1e-5, and BERT_OF_CPU_ATTENTION=0 turns off only the attention core."""
    fast, plain, no_attn = _forward(), _forward(BERT_OF_CPU_KERNELS="0"), _forward(BERT_OF_CPU_ATTENTION="0")
    assert fast["attention"] is None and fast["status"]["active"], fast["status"]
    assert plain["status"] == {"active": False, "why": "off (BERT_OF_CPU_KERNELS=0)"}
    assert no_attn["status"]["off"] == {"attention": "off (BERT_OF_CPU_ATTENTION=0)",  # the whole-layer kernel with it
                                        "layer": "off: needs the attention kernel (off (BERT_OF_CPU_ATTENTION=0))"}
    assert fast["attention_calls"] == 2 * TINY["num_hidden_layers"] and no_attn["attention_calls"] == 0
    assert no_attn["status"]["calls"] > 0  # the other kernels ran
    for key, want in plain["out"].items():
        for other in (fast, no_attn):
            np.testing.assert_allclose(np.array(other["out"][key]), np.array(want), rtol=0, atol=1e-5, err_msg=key)
