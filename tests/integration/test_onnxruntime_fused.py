"""`--engine onnxruntime` runs the checkpoint's graph in onnxruntime's fused ops (contrib Attention,
SkipLayerNormalization, BiasGelu / FastGelu, LayerNormalization: graph.py's ``build_graph(fused=True)``),
and it computes what of2onnx's own graph computes: every output within 1e-5 of BERT in float64
(converters/verify/reference_forward.py) for erf GELU, tanh GELU (Google's: FastGelu is its formula)
and ReLU checkpoints with each head, rows padded (the mask applied inside the fused Attention), and
on the real MiniLM within 1e-5 of of2onnx's graph on onnxruntime (``BERT_OF_ORT_FUSED=0``).

No OneFlow: the checkpoints are written from NumPy arrays by bert_of's own writer.
"""

import json

import numpy as np
import pytest

from bert_of.checkpoint import write_checkpoint
from bert_of.config import BertConfig
from bert_of.converters import registry
from bert_of.converters.containers.onnx_proto import Message
from bert_of.converters.convert import read
from bert_of.converters.formats.onnx import model_bytes
from bert_of.converters.verify import reference_forward
from bert_of.tensors import expected_shapes
from bert_of.training.onnxruntime_engine import FUSED_SWITCH, SPIN_SWITCH, OnnxModel
from tests.conftest import error_lines, run_cli
from tests.helpers.models import S_DEV, build_vocab, minilm_dir, random_checkpoint, user_rows, user_vocab

pytest.importorskip("onnxruntime")

# graph output -> reference_forward's name for it
REFERENCE = {"last_hidden_state": "sequence_output", "pooler_output": "pooled_output"}
PER_POSITION = ("last_hidden_state", "prediction_logits", "start_logits", "end_logits")
HEADS = {  # canonical name prefixes of each checkpoint's heads -> the outputs its graph has
    "qa": (("bert.pooler.", "qa_outputs."), ("last_hidden_state", "pooler_output", "start_logits", "end_logits")),
    "classifier": (("bert.pooler.", "classifier."), ("last_hidden_state", "pooler_output", "logits")),
    "pretraining": (("bert.pooler.", "cls."), ("last_hidden_state", "pooler_output", "prediction_logits",
                                               "seq_relationship_logits")),
}


def checkpoint(path, act: str, heads: tuple, seed: int = 0) -> str:
    """A tiny BERT checkpoint (hidden 32, 4 heads, 2 layers) of random weights, ``act`` its activation."""
    vocab, n = build_vocab(path.parent / f"vocab-{path.name}.txt")
    return random_checkpoint(path, vocab, n, heads, seed, max_position_embeddings=64, hidden_act=act, num_labels=3)


def rows(n: int, seq: int, vocab_size: int, seed: int = 1) -> list:
    """input_ids, token_type_ids, attention_mask [n, seq]: rows of different lengths, padded with 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, seq + 1, n)
    lengths[0] = seq
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(1, vocab_size, (n, seq)) * mask
    types = (np.arange(seq)[None] >= lengths[:, None] // 2).astype(np.int64) * mask
    return [ids, types, mask]


def ops_of(data: bytes) -> list:
    """The op_type of every node of a ModelProto's graph (field 7; its nodes: field 1, op_type: 4)."""
    model = Message(data, 0, len(data), "model", "ModelProto")
    g = model.fields[7][-1]
    graph = Message(data, g[0], g[1], "model", "GraphProto")
    return [Message(data, a, b, "model", "NodeProto").text(4) for a, b in graph.fields[1]]


@pytest.mark.parametrize("act", ["gelu_erf", "gelu_tanh", "relu"])
@pytest.mark.parametrize("kind", sorted(HEADS))
def test_the_fused_graph_computes_what_bert_computes_in_float64(tmp_path, act, kind, monkeypatch):
    monkeypatch.delenv(FUSED_SWITCH, raising=False)
    prefixes, names = HEADS[kind]
    path = checkpoint(tmp_path / f"{kind}-{act}", act, prefixes)
    model = OnnxModel(path, threads=1)
    assert model.fused and model.outputs == names
    source = read(path, "of")
    ops = ops_of(model_bytes(source, fused=True)[0])
    assert ops.count("Attention") == 2 and ops.count("SkipLayerNormalization") == 4
    gelu = {"gelu_erf": "BiasGelu", "gelu_tanh": "FastGelu"}.get(act)
    assert ops.count(gelu) == (2 + (kind == "pretraining") if gelu else 0) and "ReduceMean" not in ops
    inputs = rows(6, 24, source.config.vocab_size)
    got = model.infer(inputs, names, 4, positions=tuple(n for n in names if n in PER_POSITION))
    batch = dict(zip(("input_ids", "token_type_ids", "attention_mask"), inputs))
    want = reference_forward.forward(registry.reference_layout(source), batch, 4)
    real = inputs[2].astype(bool)
    for name, value in zip(names, got):
        expected = want[REFERENCE.get(name, name)]
        if name in PER_POSITION:  # padding positions are free
            value, expected = value[real], expected[real]
        assert np.abs(expected).max() > 0.1, name  # not a constant compared
        np.testing.assert_allclose(value, expected, rtol=0, atol=1e-5, err_msg=name)


def test_on_the_real_minilm_the_fused_graph_equals_of2onnx_graph_within_1e_5(tmp_path, monkeypatch):
    of = tmp_path / "minilm-of"
    run_cli("convert", "hf2of", minilm_dir(), "-o", of, "-q")
    monkeypatch.delenv(FUSED_SWITCH, raising=False)
    fused = OnnxModel(str(of))
    monkeypatch.setenv(FUSED_SWITCH, "0")
    plain = OnnxModel(str(of))
    assert fused.fused and not plain.fused
    assert not any("refused" in n for n in plain.notes + fused.notes)  # switched off, not a fallback
    assert "Attention" not in ops_of(model_bytes(read(str(of), "of"))[0])  # of2onnx's file: its own graph
    inputs = rows(5, 40, fused.config.vocab_size, seed=2)
    names = ("last_hidden_state", "pooler_output")
    a, b = (m.infer(inputs, names, 8, positions=names[:1]) for m in (fused, plain))
    real = inputs[2].astype(bool)
    np.testing.assert_allclose(a[0][real], b[0][real], rtol=0, atol=1e-5)
    np.testing.assert_allclose(a[1], b[1], rtol=0, atol=1e-5)
    assert float(np.abs(b[0][real]).max()) > 0.1


def test_predict_says_which_graph_runs_and_both_give_the_same_classes(tmp_path, monkeypatch):
    vocab, n = user_vocab(tmp_path / "vocab.txt")
    cfg = dict(vocab_size=n, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
               max_position_embeddings=128, hidden_act="gelu_erf", num_labels=3)
    rng = np.random.default_rng(3)
    tensors = [(k, (0.3 * rng.standard_normal(s)).astype(np.float32))
               for k, s in expected_shapes(BertConfig(**cfg)).items() if k.startswith(("bert.", "classifier."))
               and not k.startswith("cls.")]
    model = tmp_path / "cls"
    write_checkpoint(str(model), tensors, BertConfig(**cfg), vocab)
    (model / "train_args.json").write_text(json.dumps({"task": "classify", "problem": "single_label",
                                                       "labels": ["negative", "neutral", "positive"],
                                                       "do_lower_case": True}))
    r = run_cli("predict", "classify", "--model", model, "--data", S_DEV, "-o", tmp_path / "x.csv", "--engine",
                "onnxruntime", check=False, env={SPIN_SWITCH: "yes"})
    assert r.returncode == 1 and error_lines(r.stderr) == ["bert-of: error: BERT_OF_ORT_SPIN='yes': not 0 or 1"]
    assert not (tmp_path / "x.csv").exists()
    out = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(FUSED_SWITCH, switch)
        monkeypatch.setenv(SPIN_SWITCH, switch)  # both settings of the pool's spinning: the same answers
        target = tmp_path / f"p{switch}.csv"
        r = run_cli("predict", "classify", "--model", model, "--data", S_DEV, "-o", target, "--engine", "onnxruntime",
                    "--max-seq-length", 32)
        assert ("in onnxruntime's fused ops" in r.stderr) == (switch == "1"), r.stderr
        out[switch] = user_rows(target)
    assert [r["prediction"] for r in out["1"]] == [r["prediction"] for r in out["0"]] and len(out["1"]) == 24
    names = [f"p({k})" for k in ("negative", "neutral", "positive")]
    p1, p0 = (np.array([[float(r[k]) for k in names] for r in out[s]]) for s in ("1", "0"))
    np.testing.assert_allclose(p1, p0, rtol=0, atol=1e-5)
    assert float(np.ptp(p0, axis=0).max()) > 1e-3  # the rows' probabilities differ
