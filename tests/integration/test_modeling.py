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
from bert_of.converters.verify.compare import make_batch
from bert_of.runtime.kernels import gelu_erf, gelu_tanh
from tests.conftest import ROOT, TINY, run_ranks, write_vocab

pytestmark = pytest.mark.oneflow

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
    r = run_ranks(os.path.join(ROOT, "tests/scripts/dist_forward.py"), pretraining_ckpt, tmp_path / "batch.npz",
                  tmp_path / "out.json", tmp_path / "out.npz")
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
    from bert_of.runtime.kernels import LayerNorm

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


def test_cpu_inference_gelus_are_bounded_on_every_core():
    """For inference on CPU both GELUs run in bert_of's own kernel (cpu_kernels.c, gelu_vec.h: no libm):
    within GELU_ULPS float ulps of |x| of the float64 GELU, as near as OneFlow's own kernels are give or
    take a ulp, the specials (+-inf, NaN, +-0) as OneFlow gives them; the same bits on 1 or 2 threads,
    for a strided input and for a tail shorter than a vector; with autograd OneFlow's own ops run."""
    from bert_of.runtime.kernels import _ONEFLOW_GELU, GELU_ULPS, _native_lib, gelu_ulps, native_status

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(3 * 65536 + 7) * 4).astype(np.float32)
    x[:10] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-39, -3e38, 9.5, -9.5, -1e-45]
    t = flow.tensor(x)
    lib = _native_lib()
    assert lib is not None and native_status()["active"], native_status()

    def same(a, b):
        return np.array_equal(a.view(np.uint32)[~np.isnan(a)], b.view(np.uint32)[~np.isnan(b)]) and \
            np.array_equal(np.isnan(a), np.isnan(b))

    for op, fn in ((0, gelu_erf), (1, gelu_tanh)):
        theirs = _ONEFLOW_GELU[op](t).numpy()
        calls = native_status()["calls"]
        with flow.no_grad():
            got = fn(t).numpy()
            strided = fn(t[7:].reshape(3, 65536).transpose(0, 1)).numpy()
        assert native_status()["calls"] == calls + 2
        ours_ulps, oneflow_ulps = gelu_ulps(got, x, op), gelu_ulps(theirs, x, op)
        assert ours_ulps <= GELU_ULPS and ours_ulps <= oneflow_ulps + 1, (op, ours_ulps, oneflow_ulps)
        assert ours_ulps > 0  # not OneFlow's libm bits: the bound is what holds
        assert same(got[:5], theirs[:5]) and np.signbit(got[1]) and got[2] == np.inf and np.isnan(got[3])
        assert same(strided, got[7:].reshape(3, 65536).T)
        for threads in (1, 2):
            y = np.empty_like(x)
            lib.bert_of_gelu(x.ctypes.data, y.ctypes.data, x.size, threads, op)
            assert same(y, got), (op, threads)
        for n in (1, 5, 15, 17):  # shorter than a vector, and one past it: the padded tail, the same code
            y = np.empty(n, np.float32)
            lib.bert_of_gelu(x[7:].ctypes.data, y.ctypes.data, n, 1, op)
            assert same(y, got[7:7 + n]), (op, n)
        assert native_status()["gelu_ulps"][op]["bert_of"] <= GELU_ULPS
        xg = flow.tensor(x[10:], requires_grad=True)
        y = fn(xg)
        assert native_status()["calls"] == calls + 2  # autograd: OneFlow's ops
        y.sum().backward()
        assert np.isfinite(xg.grad.numpy()).all()


def test_cpu_gelu_kernels_can_be_turned_off():
    code = ("from bert_of._flow import flow\nfrom bert_of.runtime.kernels import gelu_erf, native_status\n"
            "with flow.no_grad():\n    y = gelu_erf(flow.tensor([1.0, -2.0])).numpy()\n"
            "print(native_status(), [round(float(v), 4) for v in y])")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, BERT_OF_CPU_KERNELS="0"), cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == \
        "{'active': False, 'why': 'off (BERT_OF_CPU_KERNELS=0)'} [0.8413, -0.0455]"


def _layer_kernel_probe(rng, *shape):
    """~N(0, 3^2) floats with signed zeros, subnormals and huge values mixed in."""
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:6] = [0.0, -0.0, 1e-39, -1e-39, 3e37, -3e37]
    return x


def test_cpu_inference_layer_kernels_match_oneflows_ops_on_every_core():
    """The rest of a layer's element-wise work for CPU inference (cpu_kernels.c): the heads' split
    (with the projection's bias add) and merge are OneFlow's bits (infinities and NaN in the bias
    included); LayerNorm(x + residual), whose sums OneFlow orders otherwise, stays within its
    documented bound of the float64 result and no further from OneFlow's own than that is; 1 and 2
    threads, and through the model layer's functions; with autograd OneFlow's ops run."""
    from bert_of.runtime import kernels as K

    rng = np.random.default_rng(7)
    lib = K._native_lib()
    assert lib is not None
    for name in ("heads", "layer_norm"):
        assert K._kernel(name) is lib, K.native_status()
    same = K._same_bits
    B, S, N, D = 3, 41, 4, 24
    H = N * D
    x, bias = _layer_kernel_probe(rng, B, S, H), _layer_kernel_probe(rng, H)
    bias[6:9] = [np.inf, -np.inf, np.nan]
    want_bias = (flow.tensor(x) + flow.tensor(bias)).numpy()
    want_split = flow.tensor(want_bias).reshape(B, S, N, D).permute(0, 2, 1, 3).contiguous().numpy()
    for threads in (1, 2):
        heads = np.empty_like(want_split)
        lib.bert_of_split_heads(x.ctypes.data, bias.ctypes.data, heads.ctypes.data, B, S, N, D, threads)
        assert same(heads, want_split), threads
        back = np.empty_like(x)
        lib.bert_of_merge_heads(want_split.ctypes.data, back.ctypes.data, B, N, S, D, threads)
        assert same(back, want_bias), threads

    lin = flow.nn.Linear(H, 2 * H)
    with flow.no_grad():
        lin.bias.copy_(flow.tensor(_layer_kernel_probe(rng, 2 * H)))
    want = lin(flow.tensor(x)).numpy()  # autograd on: OneFlow's GEMM + bias add
    with flow.no_grad():
        calls = K.native_status()["calls"]
        got_heads = K.split_heads(lin, flow.tensor(x), N).numpy()
        merged = K.merge_heads(flow.tensor(got_heads)).numpy()
        assert K.native_status()["calls"] == calls + 2
    assert same(merged, want) and same(got_heads, want.reshape(B, S, N, 2 * D).transpose(0, 2, 1, 3))

    ln = K.LayerNorm(H, eps=1e-12)
    w, b = rng.standard_normal(H).astype(np.float32), rng.standard_normal(H).astype(np.float32)
    with flow.no_grad():
        ln.weight.copy_(flow.tensor(w))
        ln.bias.copy_(flow.tensor(b))
    h, r = (rng.standard_normal((B, S, H)) * 3 + 1).astype(np.float32), rng.standard_normal((B, S, H)).astype(np.float32)
    h[0, 0] = 0.0  # a constant row
    summed = (flow.tensor(h) + flow.tensor(r)).numpy()
    ref, scale = K._layer_norm64(summed, w, b, 1e-12)
    theirs = ln._oneflow(flow.tensor(summed)).numpy()
    bound = K.LAYER_NORM_ULPS * K.F32_EPS * scale
    outs = []
    for threads in (1, 2):
        y = np.empty_like(h)
        lib.bert_of_layer_norm(h.ctypes.data, r.ctypes.data, w.ctypes.data, b.ctypes.data, y.ctypes.data, B * S, H,
                               1e-12, threads)
        outs.append(y)
    with flow.no_grad():
        outs.append(ln(flow.tensor(h), flow.tensor(r)).numpy())
        outs.append(ln(flow.tensor(summed)).numpy())
    for y in outs:
        assert (np.abs(y - ref) <= bound).all()
        assert (np.abs(y - theirs) <= np.abs(theirs - ref) + bound).all()

    calls = K.native_status()["calls"]
    hg = flow.tensor(h, requires_grad=True)
    ln(hg, flow.tensor(r)).sum().backward()
    assert K.native_status()["calls"] == calls and np.isfinite(hg.grad.numpy()).all()  # autograd: OneFlow's ops


@pytest.mark.parametrize("cls", [BertModel, BertForQuestionAnswering])
def test_inference_kernels_keep_eager_equal_to_graph_and_to_oneflows_ops(cls):
    """Under no_grad an eager forward runs the CPU kernels; it equals the graph (OneFlow's ops) and
    the same eager forward with autograd on (OneFlow's ops) to float rounding."""
    from bert_of.runtime.kernels import native_status

    model = cls(CFG)
    model.init_weights(seed=2)
    model.eval()
    args = _inputs(make_batch(CFG, batch_size=3, seq_len=13))
    plain = model(*args).to_dict()
    calls = native_status().get("calls", 0)  # none before the first kernel of this process
    with flow.no_grad():
        fast = model(*args).to_dict()
    assert native_status()["calls"] > calls
    graph = BertGraph(model)(*args).to_dict()
    for k in fast:
        np.testing.assert_allclose(fast[k].numpy(), graph[k].numpy(), rtol=0, atol=2e-6, err_msg=k)
        np.testing.assert_allclose(fast[k].numpy(), plain[k].numpy(), rtol=0, atol=2e-6, err_msg=k)


# --------------------------------------------------------------------------- heads compute their loss


def _logsoftmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _nll(logits, labels):
    return -np.take_along_axis(_logsoftmax(logits), labels[..., None], -1)[..., 0]


def test_pretraining_head_computes_googles_loss_in_both_spellings():
    """masked_lm_ids/weights (Google's) and labels=-100 (transformers') give the same loss, and it is
    sum(w * nll) / (sum(w) + 1e-5) + NSP cross-entropy, computed here in float64."""
    from bert_of.outputs import PreTrainingOutput

    model = BertForPreTraining(CFG)
    model.init_weights(seed=6)
    model.eval()
    b = make_batch(CFG, batch_size=3, seq_len=10)
    rng = np.random.default_rng(1)
    labels = np.full((3, 10), -100, np.int64)
    for row, cols in enumerate(([1, 4, 7], [2], [3, 5, 6, 8])):
        labels[row, cols] = rng.integers(5, CFG.vocab_size, len(cols))
    nsp = np.array([0, 1, 1])
    args = _inputs(b)
    hf = model(*args, labels=flow.tensor(labels), next_sentence_label=flow.tensor(nsp))
    keep = (labels != -100).astype(np.float32)
    google = model(*args, masked_lm_ids=flow.tensor(np.where(labels < 0, 0, labels)),
                   masked_lm_weights=flow.tensor(keep), next_sentence_labels=flow.tensor(nsp))
    assert isinstance(hf, PreTrainingOutput)
    for k in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc"):
        assert getattr(hf, k).item() == getattr(google, k).item(), k
    logits, nsp_logits = hf.prediction_logits.numpy(), hf.seq_relationship_logits.numpy()
    mlm = (keep * _nll(logits, np.where(labels < 0, 0, labels))).sum() / (keep.sum() + 1e-5)
    nsp_loss = _nll(nsp_logits, nsp).mean()
    assert abs(hf.mlm_loss.item() - mlm) < 1e-5 and abs(hf.nsp_loss.item() - nsp_loss) < 1e-5
    assert abs(hf.loss.item() - (mlm + nsp_loss)) < 1e-5
    # transformers' order: loss first, then the logits; names answer both ways
    assert hf[0] is hf.loss and hf[1] is hf.prediction_logits and hf[2] is hf.seq_relationship_logits
    loss, pred, rel = hf
    assert rel is hf.seq_relationship_logits and hf["loss"] is hf.loss
    assert hf.last_hidden_state is hf.sequence_output and hf.pooler_output is hf.pooled_output
    # no labels: no loss, and the tuple starts with the logits
    plain = model(*args)
    assert plain.loss is None and plain[0] is plain.prediction_logits and len(plain.to_tuple()) == 2
    with pytest.raises(KeyError):
        plain["loss"]
    # MLM labels alone: the loss is the MLM loss
    only = model(*args, labels=flow.tensor(labels))
    assert only.loss.item() == hf.mlm_loss.item() and only.nsp_loss is None


def test_qa_and_classifier_heads_compute_their_losses():
    b = make_batch(CFG, batch_size=4, seq_len=9)
    args = _inputs(b)
    qa = BertForQuestionAnswering(CFG)
    qa.init_weights(seed=7)
    qa.eval()
    start, end = np.array([0, 3, 8, 1]), np.array([0, 5, 8, 2])
    out = qa(*args, start_positions=flow.tensor(start), end_positions=flow.tensor(end))
    want = (_nll(out.start_logits.numpy(), start).mean() + _nll(out.end_logits.numpy(), end).mean()) / 2
    assert abs(out.loss.item() - want) < 1e-5
    assert out[0] is out.loss and out[1] is out.start_logits and out[2] is out.end_logits

    cfg3 = BertConfig.from_google_dict(dict(TINY, num_labels=3))
    cls = BertForSequenceClassification(cfg3)
    cls.init_weights(seed=8)
    cls.eval()
    y = np.array([2, 0, 1, 1])
    out = cls(*args, labels=flow.tensor(y))
    assert abs(out.loss.item() - _nll(out.logits.numpy(), y).mean()) < 1e-5
    assert out[0] is out.loss and out[1] is out.logits and out.logits is out["logits"]

    reg = BertForSequenceClassification(BertConfig.from_google_dict(dict(TINY, num_labels=1)))
    reg.init_weights(seed=9)
    reg.eval()
    target = np.array([0.5, 4.0, 2.25, 1.0], np.float32)
    out = reg(*args, labels=flow.tensor(target))
    assert abs(out.loss.item() - ((out.logits.numpy().reshape(-1) - target) ** 2).mean()) < 1e-5


def test_graph_outputs_keep_their_class_and_order():
    model = BertForQuestionAnswering(CFG)
    model.init_weights(seed=10)
    model.eval()
    args = _inputs(make_batch(CFG, batch_size=2, seq_len=6))
    eager, graph = model(*args), BertGraph(model)(*args)
    assert type(graph) is type(eager) and len(graph.to_tuple()) == 2
    np.testing.assert_allclose(graph[0].numpy(), eager[0].numpy(), atol=1e-6)
    bare = BertModel(CFG)
    bare.init_weights(seed=11)
    bare.eval()
    out = BertGraph(bare)(*args)
    assert out[0] is out.last_hidden_state and tuple(out[1].shape) == (2, 32)  # BaseModelOutputWithPooling's order
    only = BertGraph(model, outputs=("end_logits",))(*args)  # the graph returns just the named outputs
    assert only.start_logits is None and only.sequence_output is None
    np.testing.assert_allclose(only.end_logits.numpy(), eager.end_logits.numpy(), atol=1e-6)


def test_init_weights_of_named_heads_keeps_the_rest(pretraining_ckpt):
    """init_weights(names=...) (fine-tuning's new heads): Google's init for just those tensors, drawn
    from the seed's first numbers in name order; every other tensor keeps its loaded value."""
    model = BertForPreTraining.from_pretrained(pretraining_ckpt)
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    names = ["cls.predictions.transform.dense.weight", "cls.predictions.transform.LayerNorm.weight",
             "cls.predictions.transform.LayerNorm.bias", "cls.seq_relationship.weight"]
    model.init_weights(seed=5, names=names)
    after = {k: v.numpy() for k, v in model.state_dict().items()}
    assert all(np.array_equal(after[k], before[k]) for k in after if k not in names)
    assert np.array_equal(after[names[1]], np.ones(CFG.hidden_size)) and not after[names[2]].any()
    rng, std = np.random.default_rng(5), CFG.initializer_range
    for name in (names[0], names[3]):  # N(0, std^2) redrawn beyond 2 std, one draw after another
        w = rng.standard_normal(after[name].shape)
        while (np.abs(w) > 2).any():
            w[np.abs(w) > 2] = rng.standard_normal(int((np.abs(w) > 2).sum()))
        np.testing.assert_allclose(after[name], w * std, rtol=1e-6)
