"""A whole post-LN layer in one native call for CPU inference (cpu_kernels.c's bert_of_layer through
bert_of.runtime.kernels.layer_stack): a model's outputs with it equal, bit for bit, the same model run
layer by layer with the per-op kernels, on a tiny model and the real MiniLM, over batch and length
shapes, padded and per-query masks, both GELUs and LiBai's coeff; every case it does not cover runs the
layers op by op; BERT_OF_CPU_LAYER=0 and BERT_OF_CPU_KERNELS=0 turn it off."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of import BertConfig, BertModel
from bert_of._flow import flow
from bert_of.runtime import kernels as K
from tests.conftest import ROOT, TINY
from tests.helpers.models import minilm_dir

pytestmark = pytest.mark.oneflow


def _op_by_op(layers, hidden, mask_adder):
    """The encoder's layers each run by its own forward (the per-op path the layer kernel replaces)."""
    for layer in layers:
        hidden = layer(hidden, mask_adder)
    return hidden


def _batch(cfg, rng, B, S, per_query=False):
    """input_ids, token_type_ids, attention_mask for B rows of S tokens: row 0 full, the others
    padded to shorter lengths (one row of a single token); per_query: a [B, S, S] mask with holes."""
    ids = rng.integers(1, cfg.vocab_size, (B, S))
    types = (np.arange(S)[None, :] >= S // 2).astype(np.int64).repeat(B, 0)
    mask = np.ones((B, S), np.int64)
    for b in range(1, B):
        mask[b, max(1, S - 1 - b * S // (B + 1)):] = 0
    if B > 2:
        mask[2, 1:] = 0
    if per_query:
        mask = mask[:, None, :].repeat(S, 1)
        mask[0, ::3, : S // 3] = 0
    return [flow.tensor(a, dtype=flow.int64) for a in (ids, types, mask)]


def _both(model, args, **kw):
    """(sequence output with the layer kernel, the same with the layers op by op, layer kernel calls)."""
    with flow.no_grad():
        calls = K._native["layer_calls"]
        fast = model(*args, **kw).sequence_output.numpy()
        ran = K._native["layer_calls"] - calls
        with model.encoder.layers_run_by(_op_by_op):
            slow = model(*args, **kw).sequence_output.numpy()
    return fast, slow, ran


def _tiny(seed=3, **changes):
    cfg = dataclasses.replace(BertConfig.from_google_dict(TINY), **changes)
    model = BertModel(cfg)
    model.init_weights(seed=seed)
    model.eval()
    return model


@pytest.mark.parametrize("act", ["gelu_tanh", "gelu_erf"])
@pytest.mark.parametrize("B,S,per_query,coeff", [(1, 1, False, False), (3, 17, False, False), (4, 40, False, True),
                                                 (2, 9, True, False), (5, 33, True, True)])
def test_tiny_model_with_the_layer_kernel_equals_its_layers_op_by_op(act, B, S, per_query, coeff):
    model = _tiny(hidden_act=act, query_key_layer_scaling=coeff)
    fast, slow, ran = _both(model, _batch(model.config, np.random.default_rng(B * 100 + S), B, S, per_query))
    assert ran == model.config.num_hidden_layers, K.native_status()
    assert K._native["kernels"]["layer"] is None
    assert K._same_bits(fast, slow)


@pytest.mark.parametrize("B,S", [(2, 128), (3, 57), (1, 384)])
def test_minilm_with_the_layer_kernel_equals_its_layers_op_by_op(B, S):
    model = BertModel.from_pretrained(minilm_dir())
    model.eval()
    fast, slow, ran = _both(model, _batch(model.config, np.random.default_rng(S), B, S))
    assert ran == model.config.num_hidden_layers == 6
    assert K._same_bits(fast, slow)
    assert np.isfinite(fast).all() and np.abs(fast).max() > 0.1


def test_the_layer_kernel_leaves_what_it_does_not_cover_to_the_layers_op_by_op():
    """Autograd, the hidden states, the attention probabilities, a head_mask silencing a head, active
    dropout, an activation other than the GELUs and pre-LN layers: no layer kernel call; with the
    states asked for the same bits as the layer kernel's (the per-op kernels)."""
    model = _tiny(seed=5)
    args = _batch(model.config, np.random.default_rng(1), 3, 11)
    used = lambda: K._native["layer_calls"]  # noqa: E731
    with flow.no_grad():
        want = model(*args).sequence_output.numpy()
    calls = used()
    model(*args)  # autograd on (parameters require grad)
    with flow.no_grad():
        states = model(*args, output_hidden_states=True)
        probs = model(*args, output_attentions=True)
        silenced = model(*args, head_mask=flow.tensor([1.0] * (model.config.num_attention_heads - 1) + [0.0]))
        model.train()
        model(*args)  # dropout 0.1
        model.eval()
    assert used() == calls
    assert K._same_bits(states.sequence_output.numpy(), want)  # the same kernels op by op: the same bits
    # the probabilities asked for: OneFlow's attention ops (not the attention core's kernel)
    np.testing.assert_allclose(probs.sequence_output.numpy(), want, rtol=0, atol=1e-5)
    assert not np.allclose(silenced.sequence_output.numpy(), want, atol=1e-3)  # the head_mask was applied
    for other in (_tiny(hidden_act="relu"), _tiny(layernorm_placement="pre")):
        with flow.no_grad():
            other(*args)
        assert used() == calls


_STATUS_SCRIPT = """
import json, sys
import numpy as np
from bert_of import BertConfig, BertModel
from bert_of._flow import flow
from bert_of.runtime import kernels
cfg = BertConfig.from_google_dict(json.loads(sys.argv[1]))
model = BertModel(cfg)
model.init_weights(seed=7)
model.eval()
rng = np.random.default_rng(0)
mask = np.ones((3, 21), np.int64)
mask[1, 12:] = 0
with flow.no_grad():
    out = model(flow.tensor(rng.integers(1, 99, (3, 21))), attention_mask=flow.tensor(mask)).sequence_output
print(json.dumps({"status": kernels.native_status(), "layer_calls": kernels._native["layer_calls"],
                  "out": out.numpy().tolist()}))
"""



def _run_status(**env):
    """The tiny model's forward in a new process with ``env`` (over the caller's, less any
    BERT_OF_CPU_KERNELS_RECHECK): {"status": native_status(), "layer_calls", "out"}."""
    base = {k: v for k, v in os.environ.items() if k != "BERT_OF_CPU_KERNELS_RECHECK"}
    p = subprocess.run([sys.executable, "-c", _STATUS_SCRIPT, json.dumps(TINY)], env=dict(base, **env), cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_layer_kernel_reports_its_state_and_turns_off():
    """native_status: active with the layer checked; BERT_OF_CPU_LAYER=0 turns off only it (the other
    kernels run), BERT_OF_CPU_KERNELS=0 everything, BERT_OF_CPU_ATTENTION=0 it with the attention core;
    the outputs are the same bits in all but the last two (OneFlow's own ops there, to 1e-5)."""
    on, off, none, no_attn = (_run_status(), _run_status(BERT_OF_CPU_LAYER="0"), _run_status(BERT_OF_CPU_KERNELS="0"),
                              _run_status(BERT_OF_CPU_ATTENTION="0"))
    layers = TINY["num_hidden_layers"]
    assert on["status"]["active"] and "off" not in on["status"] and on["layer_calls"] == layers, on["status"]
    assert off["status"]["off"] == {"layer": "off (BERT_OF_CPU_LAYER=0)"} and off["layer_calls"] == 0
    assert off["status"]["calls"] > 0  # the per-op kernels ran
    assert none["status"] == {"active": False, "why": "off (BERT_OF_CPU_KERNELS=0)"} and none["layer_calls"] == 0
    assert no_attn["status"]["off"] == {"attention": "off (BERT_OF_CPU_ATTENTION=0)",
                                        "layer": "off: needs the attention kernel (off (BERT_OF_CPU_ATTENTION=0))"}
    assert no_attn["layer_calls"] == 0
    assert K._same_bits(np.array(on["out"], np.float32), np.array(off["out"], np.float32))
    for other in (none, no_attn):
        np.testing.assert_allclose(np.array(other["out"]), np.array(on["out"]), rtol=0, atol=1e-5)


def test_the_kernels_checks_run_once_then_their_verdicts_are_kept():
    """The first-use checks' verdicts are kept beside the built library (native.Verdicts): a process
    after the first reads them instead of checking again, with the same kernels on and the same bits;
    BERT_OF_CPU_KERNELS_RECHECK=1 runs every check again. A kernel switched off is not a kept verdict:
    BERT_OF_CPU_ATTENTION=0 still turns the layer off after the layer's verdict was kept."""
    fresh = _run_status(BERT_OF_CPU_KERNELS_RECHECK="1")
    kept = _run_status()
    assert fresh["status"]["verdicts_kept"] == 0 and kept["status"]["verdicts_kept"] >= 2, kept["status"]
    assert {k: v for k, v in kept["status"].items() if k != "verdicts_kept"} == \
        {k: v for k, v in fresh["status"].items() if k != "verdicts_kept"}
    assert kept["layer_calls"] == fresh["layer_calls"] == TINY["num_hidden_layers"]
    assert K._same_bits(np.array(kept["out"], np.float32), np.array(fresh["out"], np.float32))
    no_attn = _run_status(BERT_OF_CPU_ATTENTION="0")
    assert no_attn["layer_calls"] == 0 and no_attn["status"]["off"]["attention"] == "off (BERT_OF_CPU_ATTENTION=0)"
