"""What a transformers user types: config overrides in from_pretrained, BertConfig.from_pretrained,
outputs by name, model.device, num_parameters, save_pretrained in HF's layout, and an HF folder of
a question-answering model that transformers can build (its span head has 2 outputs)."""

import json
from dataclasses import replace

import numpy as np
import pytest
from safetensors.numpy import load_file

from bert_of import BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification, BertModel
from bert_of._flow import flow
from bert_of.converters.formats.hf import read as hf_read
from bert_of.converters.source import Options
from tests.conftest import TINY, run_cli, write_vocab

pytestmark = pytest.mark.oneflow

CFG = BertConfig.from_google_dict(TINY)  # vocab 99, hidden 32, 3 layers, 4 heads


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A bert_of pretraining checkpoint folder with its vocabulary."""
    root = tmp_path_factory.mktemp("api")
    vocab = write_vocab(root / "vocab.txt", CFG.vocab_size)
    m = BertForPreTraining(CFG)
    m.init_weights(seed=5)
    m.save_pretrained(str(root / "ckpt"), vocab_file=vocab)
    return str(root / "ckpt")


IDS = np.array([[2, 7, 9, 11, 1], [2, 8, 1, 0, 0]])


def test_from_pretrained_takes_transformers_config_keywords(ckpt):
    model = BertModel.from_pretrained(ckpt, output_hidden_states=True, output_attentions=True)
    out = model(IDS)
    assert len(out.hidden_states) == CFG.num_hidden_layers + 1 and len(out.attentions) == CFG.num_hidden_layers
    assert model(IDS, output_hidden_states=False).hidden_states is None  # the call still decides
    clf = BertForSequenceClassification.from_pretrained(ckpt, num_labels=3, label2id={"a": 0, "b": 1, "c": 2})
    assert clf.config.num_labels == 3 and clf.config.id2label == {0: "a", 1: "b", 2: "c"}
    assert tuple(clf(IDS).logits.shape) == (2, 3)
    with pytest.raises(TypeError, match="output_hiden_states \\(did you mean output_hidden_states\\?\\)"):
        BertModel.from_pretrained(ckpt, output_hiden_states=True)


def test_bert_config_from_pretrained(ckpt):
    config = BertConfig.from_pretrained(ckpt)
    assert config == CFG
    assert BertConfig.from_pretrained(ckpt, num_labels=5).num_labels == 5
    with_states = BertConfig.from_pretrained(ckpt, output_hidden_states=True)
    assert with_states.to_dict()["output_hidden_states"] is True and "output_hidden_states" not in config.to_dict()
    assert BertConfig.from_dict(json.loads(with_states.to_json_string())) == with_states
    model = BertModel(with_states)  # as transformers: a config's flags are the forward's defaults
    model.init_weights(seed=1)
    assert len(model.eval()(IDS).hidden_states) == CFG.num_hidden_layers + 1
    with pytest.raises(TypeError, match="nmu_labels \\(did you mean num_labels\\?\\)"):
        BertConfig.from_pretrained(ckpt, nmu_labels=5)


def test_outputs_by_name_attribute_and_index(ckpt):
    out = BertModel.from_pretrained(ckpt)(IDS)
    assert out["last_hidden_state"] is out.last_hidden_state is out.sequence_output is out[0]
    assert out["pooler_output"] is out.pooler_output is out[1]
    assert out.keys() == ["last_hidden_state", "pooler_output"] and "last_hidden_state" in out
    assert "hidden_states" not in out and [k for k, _ in out.items()] == out.keys()
    with pytest.raises(KeyError):
        out["hidden_states"]  # absent, as in transformers' ModelOutput
    qa = BertForQuestionAnswering.from_pretrained(ckpt)(IDS, start_positions=[0, 1], end_positions=[1, 2])
    assert qa.keys() == ["loss", "start_logits", "end_logits"] and qa["start_logits"] is qa[1]


def test_device_and_num_parameters_count_as_transformers(ckpt):
    model = BertForPreTraining.from_pretrained(ckpt)
    assert model.device == flow.device("cpu")
    state = load_file(f"{ckpt}/model.safetensors")  # the canonical tensors: the tied decoder once
    assert model.num_parameters() == sum(a.size for a in state.values())
    H = CFG.hidden_size
    tables = (CFG.vocab_size + CFG.max_position_embeddings + CFG.type_vocab_size) * H
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - tables
    model.bert.embeddings.requires_grad_(False)
    assert model.num_parameters(only_trainable=True) == model.num_parameters() - tables - 2 * H  # + its LayerNorm


def test_save_pretrained_in_hf_layout_is_what_of2hf_writes(ckpt, tmp_path):
    model = BertForPreTraining.from_pretrained(ckpt)
    model.save_pretrained(str(tmp_path / "hf"), format="hf")
    run_cli("convert", "of2hf", ckpt, "-o", tmp_path / "cli")
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        assert (tmp_path / "hf" / name).read_text() == (tmp_path / "cli" / name).read_text(), name
    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "cli" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    back = BertForPreTraining.from_pretrained(str(tmp_path / "hf"))  # read back as any HF folder
    np.testing.assert_array_equal(back(IDS).prediction_logits.numpy(), model(IDS).prediction_logits.numpy())
    (tmp_path / "hf" / "README.md").write_text("mine")
    model.save_pretrained(str(tmp_path / "hf"), format="hf")  # into the existing folder: others kept
    assert (tmp_path / "hf" / "README.md").read_text() == "mine"


def test_of2hf_of_a_qa_model_writes_the_span_head_transformers_builds(ckpt, tmp_path):
    """transformers' BertForQuestionAnswering is Linear(hidden, config.num_labels): a config.json
    with num_labels 3 over a [2, H] qa_outputs cannot be loaded."""
    qa = BertForQuestionAnswering.from_pretrained(ckpt, num_labels=3, id2label={0: "x", 1: "y", 2: "z"})
    qa.save_pretrained(str(tmp_path / "qa"))
    assert json.loads((tmp_path / "qa" / "config.json").read_text())["num_labels"] == 3
    r = run_cli("convert", "of2hf", tmp_path / "qa", "-o", tmp_path / "hf")
    assert "num_labels 3 written as 2" in r.stderr + r.stdout
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForQuestionAnswering"]
    assert "num_labels" not in cfg and "id2label" not in cfg and "label2id" not in cfg  # transformers' default 2
    assert load_file(tmp_path / "hf" / "model.safetensors")["qa_outputs.weight"].shape == (2, CFG.hidden_size)
    source = hf_read(str(tmp_path / "hf"), Options())
    assert source.config.num_labels == 2
    qa.save_pretrained(str(tmp_path / "hf2"), format="hf")  # the same writer
    assert json.loads((tmp_path / "hf2" / "config.json").read_text()) == cfg


def test_save_pretrained_refuses_a_layout_that_cannot_hold_the_model(tmp_path):
    model = BertModel(replace(CFG, layernorm_placement="pre"))
    model.init_weights(seed=0)
    with pytest.raises(Exception, match="cannot save as hf: a pre-LN BERT"):
        model.save_pretrained(str(tmp_path / "x"), format="hf")
    assert not (tmp_path / "x").exists()
