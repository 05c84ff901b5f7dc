import json

import pytest

from bert_of.config import BertConfig
from bert_of.errors import ConfigError

GOOGLE_BASE = {  # bert-base-uncased's bert_config.json, plus keys some releases carry
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,
    "type_vocab_size": 2, "vocab_size": 30522,
}


def test_google_config_every_key_round_trips(tmp_path):
    src = dict(GOOGLE_BASE, directionality="bidi", pooler_fc_size=768, pooler_num_attention_heads=12)
    p = tmp_path / "bert_config.json"
    p.write_text(json.dumps(src))
    cfg = BertConfig.from_google_json_file(str(p))
    assert cfg.hidden_act == "gelu_tanh"  # Google's "gelu" is the tanh approximation
    assert cfg.layer_norm_eps == 1e-12 and cfg.provenance == "tf1"
    assert cfg.extra == {"directionality": "bidi", "pooler_fc_size": 768, "pooler_num_attention_heads": 12}
    assert cfg.to_google_dict() == src
    assert cfg.num_parameters() == 110106428  # bert-base with pretraining heads (tied decoder)


def test_exact_activation_travels_beside_googles_label():
    cfg = BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=37, vocab_size=99,
                     num_hidden_layers=2, hidden_act="gelu_erf", layer_norm_eps=1e-5)
    d = cfg.to_google_dict()
    assert d["hidden_act"] == "gelu" and d["bert_of_hidden_act"] == "gelu_erf" and d["layer_norm_eps"] == 1e-5
    back = BertConfig.from_google_dict(d)
    assert (back.hidden_act, back.layer_norm_eps) == ("gelu_erf", 1e-5)
    assert "gelu_erf" in cfg.google_mismatch()


def test_bert_of_json_round_trip(tmp_path):
    cfg = BertConfig.from_google_dict(dict(GOOGLE_BASE, hidden_act="relu", type_vocab_size=16))
    p = tmp_path / "config.json"
    p.write_text(cfg.to_json_string())
    assert BertConfig.from_json_file(str(p)) == cfg


@pytest.mark.parametrize("patch, needle", [
    ({"hidden_size": 100}, "not a multiple of num_attention_heads"),
    ({"hidden_act": "swishy"}, "hidden_act 'swishy'"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer"),
])
def test_bad_google_config_names_the_key(patch, needle):
    with pytest.raises(ConfigError, match=needle):
        BertConfig.from_google_dict(dict(GOOGLE_BASE, **patch))


def test_missing_and_malformed_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        BertConfig.from_google_json_file(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed JSON"):
        BertConfig.from_google_json_file(str(bad))
    no_vocab = tmp_path / "c.json"
    no_vocab.write_text(json.dumps({k: v for k, v in GOOGLE_BASE.items() if k != "vocab_size"}))
    with pytest.raises(ConfigError, match="missing key.*vocab_size"):
        BertConfig.from_google_json_file(str(no_vocab))


def test_classifier_task_fields_travel_and_are_checked():
    """classifier_kind, id2label (string ids in JSON, int ids in Python) and problem_type survive
    bert_of's json and Google's (where bert_of keeps the kind under its own key)."""
    c = BertConfig(num_labels=3, classifier_kind="token", id2label={"0": "O", "1": "B-X", "2": "I-X"},
                   problem_type="single_label_classification")
    assert c.id2label == {0: "O", 1: "B-X", 2: "I-X"} and c.label2id == {"O": 0, "B-X": 1, "I-X": 2}
    d = json.loads(c.to_json_string())
    assert d["id2label"] == {"0": "O", "1": "B-X", "2": "I-X"} and d["classifier_kind"] == "token"
    assert BertConfig.from_dict(d) == c
    g = c.to_google_dict()
    assert g["bert_of_classifier_kind"] == "token" and "classifier_kind" not in g
    back = BertConfig.from_google_dict(json.loads(json.dumps(g)))
    assert (back.classifier_kind, back.id2label, back.problem_type, back.num_labels, back.extra) == \
        (c.classifier_kind, c.id2label, c.problem_type, 3, {})
    assert "classifier_kind" not in BertConfig().to_dict() and "id2label" not in BertConfig().to_dict()
    for bad, msg in ((dict(id2label={"0": "a"}), "names 1 classes but num_labels is 2"),
                     (dict(id2label={"0": "a", "2": "b"}), "ids 0..n-1"),
                     (dict(id2label={"0": "a", "1": "a"}), "distinct"),
                     (dict(classifier_kind="pooled"), "classifier_kind 'pooled'"),
                     (dict(problem_type="ranking"), "problem_type 'ranking'")):
        with pytest.raises(ConfigError, match=msg):
            BertConfig(**bad)
    # a Google config whose id2label bert_of cannot hold keeps it as it was
    odd = BertConfig.from_google_dict({**g, "id2label": {"a": "x"}})
    assert odd.id2label is None and odd.extra["id2label"] == {"a": "x"}


# --------------------------------------------------------------------------- YAML 1.1 integers


# PyYAML 6's yaml.safe_load of "a: <text>" (YAML 1.1, what LiBai's LazyConfig reads), checked by hand
YAML11 = {"010": 8, "-010": -8, "0o10": "0o10", "0x1F": 31, "+0x10": 16, "0b101": 5, "0b1_0": 2, "1_000": 1000,
          "0_7": 7, "08": "08", "09.5": 9.5, "00": 0, "-0": 0, "1:30": 90, "-1:30": -90, "190:20:30": 685230,
          "1:60": "1:60", "1:30.5": 90.5, "0b": "0b", "0x": "0x", "_1": "_1", "1__2": 12, "1.0e+5": 1e5}


def test_yaml_integers_are_read_as_pyyaml_reads_them(tmp_path):
    from bert_of.converters.formats.oneflow_native.config import libai_config, model_cfg, parse_yaml, read_config_file

    for text, want in YAML11.items():
        got = parse_yaml(f"a: {text}\n", "c")["a"]
        assert got == want and type(got) is type(want), (text, got, want)
    for text in ("0b_", "0x_"):  # PyYAML's constructor fails on these too
        with pytest.raises(ConfigError, match="not an integer"):
            parse_yaml(f"a: {text}\n", "c")
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  _target_: libai.models.BertForPreTraining\n  cfg: {hidden_layers: 2, hidden_size: 32, "
                    "intermediate_size: 0x40, num_attention_heads: 010, vocab_size: 1_000, "
                    "max_position_embeddings: 0b1000000}\n")
    config = libai_config(model_cfg(read_config_file(str(path)), str(path)), str(path))
    assert (config.num_attention_heads, config.intermediate_size, config.vocab_size,
            config.max_position_embeddings) == (8, 64, 1000, 64)
