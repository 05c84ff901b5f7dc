"""BertForMaskedLM: an MLM head and no next-sentence head (transformers' class of that name, a Model
Garden BertPretrainerV2 without classification heads). Its loss against a NumPy cross-entropy,
eager = graph, the class every format's MLM-only checkpoint loads as, and verify comparing its
``prediction_logits``. Checkpoints are tiny, written by bert_of's own writers."""

import json
import os

import numpy as np
import pytest

import bert_of
from bert_of.checkpoint import SafetensorsFile, write_checkpoint
from bert_of.config import BertConfig
from bert_of.errors import InputError
from bert_of.tensors import expected_shapes
from bert_of.converters.formats.hf import names as hf_names
from bert_of.converters.convert import convert, read
from bert_of.converters.source import Options
from bert_of.converters.verify.compare import verify
from tests.conftest import TINY, write_vocab

pytestmark = pytest.mark.oneflow

CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=40, type_vocab_size=2)


def _mlm_checkpoint(path, seed=0, pooler="random", provenance="hf"):
    """A bert_of checkpoint with bert.* and cls.predictions.* only, at trained-BERT magnitudes;
    ``pooler``: "random" or "zeros" (what a reader fills in for HF's pooler-less class)."""
    config = BertConfig(**CONFIG, hidden_act="gelu_erf", provenance=provenance)
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape in expected_shapes(config).items():
        if not name.startswith(("bert.", "cls.predictions.")):
            continue
        value = 1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("LayerNorm.weight") else \
            0.2 * rng.standard_normal(shape)
        if pooler == "zeros" and name.startswith("bert.pooler."):
            value = np.zeros(shape)
        tensors.append((name, value.astype(np.float32)))
    write_checkpoint(str(path), tensors, config, write_vocab(str(path) + "-vocab.txt", CONFIG["vocab_size"]))
    return str(path)


def _batch():
    ids = np.array([[1, 7, 3, 9, 11, 2, 0], [1, 20, 30, 3, 2, 0, 0]], np.int64)
    mask = (np.arange(7)[None] < np.array([[6], [5]])).astype(np.int64)
    labels = np.full_like(ids, -100)
    labels[0, 2], labels[0, 4], labels[1, 3] = 41, 11, 98
    return ids, mask, labels


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = bert_of.BertForMaskedLM.from_pretrained(_mlm_checkpoint(tmp_path_factory.mktemp("mlm") / "of", seed=1))
    m.eval()
    return m


def test_loss_is_transformers_mean_cross_entropy_over_labelled_positions(model):
    ids, mask, labels = _batch()
    out = model(ids, attention_mask=mask, labels=labels)
    logits = out.prediction_logits.numpy().astype(np.float64)  # [B, S, V]
    assert logits.shape == (2, 7, CONFIG["vocab_size"])
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = labels != -100
    want = -logp[keep, labels[keep]].mean()  # 3 positions: the mean over them, no +1e-5 (not pretraining's)
    assert abs(float(out.loss.numpy()) - want) <= 1e-5 * max(1.0, abs(want)), (float(out.loss.numpy()), want)
    # transformers' names and order: MaskedLMOutput(loss, logits, ...), logits the same tensor
    assert out.keys() == ["loss", "logits"] and out["logits"] is out.prediction_logits and out.logits is out[1]
    assert out.to_tuple()[0] is out.loss and len(out.to_tuple()) == 2
    assert "logits" not in out.to_dict() and "prediction_logits" in out.to_dict()
    # no labelled position: NaN, as transformers' CrossEntropyLoss (checked: torch gives nan too)
    assert np.isnan(float(model(ids, attention_mask=mask, labels=np.full_like(labels, -100)).loss.numpy()))
    # labels are checked by the one input gate: ids in [0, V) or -100, shaped [B, S]
    bad = labels.copy()
    bad[1, 1] = CONFIG["vocab_size"]
    with pytest.raises(InputError, match="labels"):
        model(ids, attention_mask=mask, labels=bad)
    with pytest.raises(InputError, match="labels"):
        model(ids, attention_mask=mask, labels=labels[:, :3])


def test_eager_equals_graph_and_the_logits_are_the_tied_mlm_head(model):
    from bert_of._flow import flow

    ids, mask, _ = _batch()
    args = [flow.tensor(x, dtype=flow.int64) for x in (ids, np.zeros_like(ids), mask)]
    with flow.no_grad():
        eager = model(*args)
        graph = bert_of.BertGraph(model)(*args)
    assert type(graph).__name__ == "MaskedLMOutput"
    for k in ("sequence_output", "pooled_output", "prediction_logits"):
        a, b = getattr(eager, k).numpy(), getattr(graph, k).numpy()
        assert np.abs(a - b).max() <= 1e-5, k
    # the head is the tied one: transform, then the word embeddings transposed, plus the bias
    w = model.bert.embeddings.word_embeddings.weight.numpy()
    with flow.no_grad():
        h = model.cls.predictions.transform(eager.sequence_output).numpy()
    want = h @ w.T + model.cls.predictions.bias.numpy()
    assert np.abs(want - eager.prediction_logits.numpy()).max() <= 1e-4


def test_model_class_for_an_mlm_only_checkpoint():
    from bert_of.heads import BertForMaskedLM, BertForPreTraining, model_class_for
    from bert_of.modeling import BertModel

    names = [n for n in expected_shapes(BertConfig(**CONFIG)) if n.startswith(("bert.", "cls."))]
    assert model_class_for(names) is BertForPreTraining
    assert model_class_for([n for n in names if not n.startswith("cls.seq_relationship.")]) is BertForMaskedLM
    assert model_class_for([n for n in names if n.startswith("bert.")]) is BertModel
    assert bert_of.BertForMaskedLM is BertForMaskedLM and "BertForMaskedLM" in bert_of.__all__


def _st_tensors(d):
    f = SafetensorsFile(os.path.join(d, hf_names.SAFETENSORS))
    return {k: f.get(k) for k in f.keys()}


def test_hf_of_hf_keeps_bert_for_masked_lm_bit_exact(tmp_path):
    of = _mlm_checkpoint(tmp_path / "of", seed=2, pooler="zeros")
    convert("of2hf", of, str(tmp_path / "hf"), Options())
    cfg = json.load(open(tmp_path / "hf" / "config.json"))
    assert cfg["architectures"] == ["BertForMaskedLM"]
    first = _st_tensors(tmp_path / "hf")
    assert not any(k.startswith("bert.pooler") for k in first) and "cls.predictions.bias" in first
    convert("hf2of", str(tmp_path / "hf"), str(tmp_path / "of2"), Options())
    report = verify(str(tmp_path / "hf"), str(tmp_path / "of2"), modes=("eager",))
    assert report["ok"] and "prediction_logits" in report["outputs"]
    convert("of2hf", str(tmp_path / "of2"), str(tmp_path / "hf2"), Options())
    assert json.load(open(tmp_path / "hf2" / "config.json"))["architectures"] == ["BertForMaskedLM"]
    second = _st_tensors(tmp_path / "hf2")
    assert sorted(first) == sorted(second)
    for k in first:
        assert first[k].dtype == second[k].dtype and first[k].tobytes() == second[k].tobytes(), k
    m = bert_of.BertForMaskedLM.from_pretrained(str(tmp_path / "of2"))
    assert type(m).__name__ == "BertForMaskedLM"


def test_tf2_mlm_only_pretrainer_verify_compares_prediction_logits(tmp_path):
    config = BertConfig.from_google_dict(dict(TINY))
    rng = np.random.default_rng(5)
    tensors = [(n, (0.2 * rng.standard_normal(s) + (n.endswith("LayerNorm.weight"))).astype(np.float32))
               for n, s in expected_shapes(config).items() if n.startswith(("bert.", "cls.predictions."))]
    of = str(tmp_path / "of")
    write_checkpoint(of, tensors, config, write_vocab(str(tmp_path / "vocab.txt"), TINY["vocab_size"]))
    convert("of2tf2", of, str(tmp_path / "t2"), Options())  # BertPretrainerV2: encoder/ + masked_lm/, no NSP
    src = read(str(tmp_path / "t2"), "tf2", Options())
    assert any(n.startswith("cls.predictions.") for n in src.names())
    assert not any(n.startswith("cls.seq_relationship.") for n in src.names())
    convert("tf22of", str(tmp_path / "t2"), str(tmp_path / "back"), Options())
    report = verify(str(tmp_path / "t2"), str(tmp_path / "back"), modes=("eager",))
    assert report["ok"] and report["worst"] <= 1e-5
    assert {"sequence_output", "pooled_output", "prediction_logits"} <= set(report["outputs"])
    eager = report["max_abs_diff"]["B:eager"]
    assert "prediction_logits" in eager and eager["prediction_logits"] <= 1e-5


def test_onnx_names_the_mlm_only_output_logits(tmp_path):
    pytest.importorskip("onnxruntime")
    from bert_of.converters.formats import onnx as onnx_format

    of = _mlm_checkpoint(tmp_path / "of", seed=3, pooler="zeros")
    convert("of2onnx", of, str(tmp_path / "onnx"), Options())
    ids, mask, _ = _batch()
    got = onnx_format.run_onnxruntime(str(tmp_path / "onnx"), {"input_ids": ids, "attention_mask": mask,
                                                                "token_type_ids": np.zeros_like(ids)})
    assert sorted(got) == ["prediction_logits", "sequence_output"]  # no pooler: transformers' class has none
    import onnxruntime

    session = onnxruntime.InferenceSession(onnx_format.model_path(str(tmp_path / "onnx")),
                                           providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state", "logits"]
    report = verify(of, str(tmp_path / "onnx"), modes=("eager",))
    assert report["ok"] and "prediction_logits" in report["max_abs_diff"]["B:onnxruntime-float32"]
    convert("onnx2of", str(tmp_path / "onnx"), str(tmp_path / "back"), Options())
    a = {s.name: p() for s, p in read(of, "of").tensors}
    b = {s.name: p() for s, p in read(str(tmp_path / "back"), "of").tensors}
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_h5_writes_and_reads_tf_bert_for_masked_lm(tmp_path):
    h5py = pytest.importorskip("h5py")
    of = _mlm_checkpoint(tmp_path / "of", seed=4, pooler="zeros")
    convert("of2h5", of, str(tmp_path / "h5"), Options())
    with h5py.File(tmp_path / "h5" / "tf_model.h5", "r") as f:  # transformers' TFBertForMaskedLM layers
        assert [x.decode() if isinstance(x, bytes) else x for x in f.attrs["layer_names"]] == ["bert", "mlm___cls"]
        names = [x.decode() if isinstance(x, bytes) else x for x in f["bert"].attrs["weight_names"]]
        assert names and all(n.startswith("tf_bert_for_masked_lm/") for n in names)
        assert not any("pooler" in n for n in names)
    assert json.load(open(tmp_path / "h5" / "config.json"))["architectures"] == ["BertForMaskedLM"]
    convert("h52of", str(tmp_path / "h5"), str(tmp_path / "back"), Options())
    a = {s.name: p() for s, p in read(of, "of").tensors}
    b = {s.name: p() for s, p in read(str(tmp_path / "back"), "of").tensors}
    assert sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)
    report = verify(str(tmp_path / "h5"), str(tmp_path / "back"), modes=("eager",))
    assert report["ok"] and "prediction_logits" in report["max_abs_diff"]["B:eager"]
