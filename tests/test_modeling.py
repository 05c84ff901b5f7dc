"""The OneFlow model: public API, eager == nn.Graph, heads, loading rules, 2-rank global tensors."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_of import (BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                     BertGraph, BertModel, CheckpointError)
from bert_of._flow import flow
from bert_of.modeling import gelu_erf, gelu_tanh
from bert_of.converters.verify import make_batch
from tests.conftest import ROOT, TINY, write_vocab

CFG = BertConfig.from_google_dict(TINY)


@pytest.fixture(scope="module")
def pretraining_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ck")
    model = BertForPreTraining(CFG)
    model.init_weights(seed=3)
    path = str(d / "pretrain")
    model.save_pretrained(path, vocab_file=write_vocab(d / "vocab.txt", CFG.vocab_size))
    return path


def _inputs(batch):
    return [flow.tensor(batch[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids", "attention_mask")]


def test_public_api_shapes(pretraining_ckpt):
    model = BertForPreTraining.from_pretrained(pretraining_ckpt)
    b = make_batch(CFG, batch_size=2, seq_len=9)
    ids, tt, mask = _inputs(b)
    out = model(ids, token_type_ids=tt, attention_mask=mask)
    assert tuple(out.sequence_output.shape) == (2, 9, 32)
    assert tuple(out.pooled_output.shape) == (2, 32)
    assert tuple(out.prediction_logits.shape) == (2, 9, 99)
    assert tuple(out.seq_relationship_logits.shape) == (2, 2)
    bare = BertModel.from_pretrained(pretraining_ckpt)(ids, token_type_ids=tt, attention_mask=mask)
    assert np.array_equal(bare.sequence_output.numpy(), out.sequence_output.numpy())
    assert np.array_equal(bare.pooled_output.numpy(), out.pooled_output.numpy())
    assert bare.prediction_logits is None


@pytest.mark.parametrize("cls", [BertModel, BertForPreTraining, BertForQuestionAnswering,
                                 BertForSequenceClassification])
def test_eager_and_graph_agree(cls):
    model = cls(CFG)
    model.init_weights(seed=1)
    model.eval()
    args = _inputs(make_batch(CFG, batch_size=3, seq_len=11))
    eager = model(*args).to_dict()
    graph = BertGraph(model)(*args).to_dict()
    assert set(eager) == set(graph) and len(eager) >= 2
    for k in eager:
        np.testing.assert_allclose(graph[k].numpy(), eager[k].numpy(), rtol=0, atol=1e-6, err_msg=k)


def test_heads_newly_initialised_from_a_pretraining_checkpoint(pretraining_ckpt, capfd):
    qa = BertForQuestionAnswering.from_pretrained(pretraining_ckpt)
    assert sorted(qa.loading_info["missing"]) == ["qa_outputs.bias", "qa_outputs.weight"]
    assert "cls.seq_relationship.weight" in qa.loading_info["unexpected"]
    assert "newly initialised" in capfd.readouterr().err
    with pytest.raises(CheckpointError, match="qa_outputs"):
        BertForQuestionAnswering.from_pretrained(pretraining_ckpt, strict_heads=True)
    out = qa(*_inputs(make_batch(CFG, batch_size=2, seq_len=7)))
    assert tuple(out.start_logits.shape) == (2, 7) and tuple(out.end_logits.shape) == (2, 7)


def test_missing_or_misshaped_backbone_tensor_is_named():
    model = BertModel(CFG)
    state = BertForPreTraining(CFG).canonical_state()
    del state["bert.encoder.layer.2.output.dense.bias"]
    with pytest.raises(CheckpointError, match="bert.encoder.layer.2.output.dense.bias"):
        model.load_canonical(state)
    state = BertForPreTraining(CFG).canonical_state()
    state["bert.pooler.dense.weight"] = np.zeros((32, 31), np.float32)
    with pytest.raises(CheckpointError, match=r"bert.pooler.dense.weight: checkpoint shape \[32, 31\]"):
        model.load_canonical(state)


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(CFG)
    model.init_weights(seed=2)
    model.eval()
    names = model.canonical_state()
    assert not any("decoder" in n for n in names)
    args = _inputs(make_batch(CFG, batch_size=1, seq_len=5))
    before = model(*args).prediction_logits.numpy()
    state = model.canonical_state()
    state["bert.embeddings.word_embeddings.weight"][7] += np.linspace(0, 1, CFG.hidden_size)  # LN output sums to 0
    model.load_canonical(state)
    after = model(*args).prediction_logits.numpy()
    assert np.abs(after[..., 7] - before[..., 7]).max() > 1e-3


def test_padding_positions_do_not_leak():
    model = BertModel(CFG)
    model.init_weights(seed=4)
    model.eval()
    b = make_batch(CFG, batch_size=3, seq_len=12)
    out1 = model(*_inputs(b)).sequence_output.numpy()
    b2 = {k: v.copy() for k, v in b.items()}
    b2["input_ids"][b2["attention_mask"] == 0] = 42
    out2 = model(*_inputs(b2)).sequence_output.numpy()
    keep = b["attention_mask"].astype(bool)
    assert (~keep).any()
    np.testing.assert_allclose(out2[keep], out1[keep], atol=1e-6)


def test_activations_match_their_formulas():
    x = np.linspace(-6, 6, 1001).astype(np.float32)
    t = flow.tensor(x)
    x64 = x.astype(np.float64)
    tanh_ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    erf_ref = 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    np.testing.assert_allclose(gelu_tanh(t).numpy(), tanh_ref, atol=2e-6)
    np.testing.assert_allclose(gelu_erf(t).numpy(), erf_ref, atol=2e-6)
    assert np.abs(tanh_ref - erf_ref).max() > 1e-4  # they are different functions


def test_dropout_only_in_training():
    model = BertModel(CFG)
    model.init_weights(seed=5)
    args = _inputs(make_batch(CFG, batch_size=2, seq_len=8))
    model.train()
    a, b = model(*args).sequence_output.numpy(), model(*args).sequence_output.numpy()
    assert np.abs(a - b).max() > 1e-3
    model.eval()
    assert np.array_equal(model(*args).sequence_output.numpy(), model(*args).sequence_output.numpy())


def test_two_rank_global_tensors_match_single_process(pretraining_ckpt, tmp_path):
    """Parameters broadcast, batch split(0) over 2 CPU ranks: same numbers, outputs stay split(0)."""
    model = BertForPreTraining.from_pretrained(pretraining_ckpt)
    b = make_batch(CFG, batch_size=4, seq_len=12)
    ref = model(*_inputs(b)).to_dict()
    np.savez(tmp_path / "batch.npz", **b)
    cmd = [sys.executable, "-m", "oneflow.distributed.launch", "--nproc_per_node", "2", "--master_port", "29571",
           os.path.join(ROOT, "tests/scripts/dist_forward.py"), pretraining_ckpt, str(tmp_path / "batch.npz"),
           str(tmp_path / "out.json"), str(tmp_path / "out.npz")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["world"] == 2 and report["param_sbp"] == ["(oneflow.sbp.broadcast,)"]
    for mode in ("eager", "graph"):
        for name, sbp in report[mode].items():
            assert sbp == ["oneflow.sbp.split(dim=0)"], (mode, name, sbp)  # no S->B anywhere
    with np.load(tmp_path / "out.npz", allow_pickle=False) as z:
        for key in z.files:
            mode, name = key.split("/")
            np.testing.assert_allclose(z[key], ref[name].numpy(), atol=1e-6, err_msg=key)
        assert len(z.files) == 8


def test_cpu_layer_norm_and_gelu_equal_the_textbook_forms():
    """The CPU fast paths (ones-vector LayerNorm, sigmoid-form GELU) compute the same function,
    values and gradients, as OneFlow's nn.LayerNorm and Google's tanh expression."""
    import math

    from bert_of._flow import flow
    from bert_of.modeling import LayerNorm, gelu_tanh

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 24)).astype(np.float32) * 3 + 1
    w, b = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    ours, ref = LayerNorm(24, eps=1e-5), flow.nn.LayerNorm(24, eps=1e-5)
    for m in (ours, ref):
        m.weight.data.copy_(flow.tensor(w))
        m.bias.data.copy_(flow.tensor(b))
    assert set(ours.state_dict()) == {"weight", "bias"}  # the ones vectors are not checkpoint content
    xs = [flow.tensor(x, requires_grad=True) for _ in range(2)]
    ys = [ours(xs[0]), ref(xs[1])]
    g = flow.tensor(rng.standard_normal(x.shape).astype(np.float32))
    for y in ys:
        (y * g).sum().backward()
    np.testing.assert_allclose(ys[0].numpy(), ys[1].numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(xs[0].grad.numpy(), xs[1].grad.numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(ours.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-5, atol=1e-5)

    z = flow.tensor(np.linspace(-12, 12, 2001), dtype=flow.float64)
    google = 0.5 * z * (1.0 + flow.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * flow.pow(z, 3))))
    assert float((gelu_tanh(z) - google).abs().max()) < 1e-14


def test_fast_blas_is_asked_for_only_when_wanted():
    import subprocess
    import sys

    code = ("import os; import bert_of._flow; print(os.environ.get('OPENBLAS_CORETYPE', '-'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "BERT_OF_BLAS")}
    out = {}
    for mode in ("fast", "exact", None):
        e = dict(env, **({"BERT_OF_BLAS": mode} if mode else {}))
        out[mode] = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                                   check=True).stdout.split()[-1]
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    assert out["fast"] == ("Haswell" if {"avx2", "fma"} <= set(flags) else "-")
    assert out["exact"] == "-" and out[None] == "-"
    e = dict(env, BERT_OF_BLAS="fast", OPENBLAS_CORETYPE="Sandybridge")  # the user's choice wins
    assert subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          check=True).stdout.split()[-1] == "Sandybridge"
