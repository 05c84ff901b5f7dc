"""HuggingFace ``config.json`` <-> BertConfig (shared by the safetensors/torch directories, the
Keras h5 format and the flow.save config finder).

Numerics: HF's ``"gelu"`` is exact erf GELU, ``"gelu_new"``/``"gelu_pytorch_tanh"``
the tanh form (``bert_of.config.HF_ACT``); ``layer_norm_eps`` defaults to 1e-12.
"""

from __future__ import annotations

from dataclasses import replace

from bert_of.config import HF_ACT, BertConfig, pop_task_fields
from bert_of.errors import ConfigError
from bert_of.files.reading import read_json

# bert_of activation -> the label HF's config.json uses for it.
HF_ACT_LABEL = {"gelu_erf": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "tanh": "tanh", "silu": "silu",
                "linear": "linear"}
# Other HF spellings of the same function are remembered here (in config.extra) for the round trip.
ACT_SPELLING_KEY = "bert_of_hf_hidden_act"

# HF config keys that are BertConfig fields (HF's BertConfig defaults equal bert_of's, except "gelu").
_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
           "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
           "initializer_range", "layer_norm_eps")


def config_from_hf(d: dict, where: str, numerics=None) -> BertConfig:
    """HF config.json -> BertConfig; keys bert_of does not use are kept in ``extra``."""
    d = dict(d)
    model_type = d.pop("model_type", None) or "bert"  # absent or null: transformers' BertConfig does not ask
    if model_type != "bert":
        raise ConfigError(f"{where}: model_type {model_type!r} is not BERT")
    if d.get("position_embedding_type", "absolute") != "absolute":
        null = " (null: transformers then adds no position embeddings at all)" \
            if d["position_embedding_type"] is None else ""
        raise ConfigError(f"{where}: position_embedding_type {d['position_embedding_type']!r}{null}: bert_of "
                          f"computes absolute position embeddings only")
    if d.get("is_decoder"):
        raise ConfigError(f"{where}: is_decoder is true (causal attention); bert_of computes the BERT encoder only")
    label = d.pop("hidden_act", "gelu")
    if not isinstance(label, str) or label not in HF_ACT:
        raise ConfigError(f"{where}: hidden_act {label!r} is not one bert_of computes "
                          f"(known HF labels: {', '.join(HF_ACT)})")
    act = HF_ACT[label]
    remembered = d.pop(ACT_SPELLING_KEY, None)
    kw = {k: d.pop(k) for k in _FIELDS if k in d}
    if "layer_norm_eps" not in kw:
        kw["layer_norm_eps"] = 1e-12
    num_labels = 2
    if isinstance(d.get("id2label"), dict) and d["id2label"]:
        num_labels = len(d["id2label"])
    if isinstance(d.get("num_labels"), int):
        num_labels = d["num_labels"]
    kw.update(pop_task_fields(d))
    if numerics and label != "gelu":  # only Google's label, kept by a conversion, is open to question
        raise ConfigError(f"--numerics {numerics}: {where} says hidden_act {label!r}, which transformers computes "
                          f"one way only (--numerics reads a \"gelu\" as the weights' maker computed it)")
    if numerics == "tf1":
        act, kw["layer_norm_eps"] = "gelu_tanh", 1e-12
    elif numerics == "lazy":
        act, kw["layer_norm_eps"] = "gelu_erf", 1e-5
    spelling = label if label != HF_ACT_LABEL.get(act) else remembered
    if spelling is not None and HF_ACT.get(spelling) == act and spelling != HF_ACT_LABEL.get(act):
        d[ACT_SPELLING_KEY] = spelling
    try:
        return BertConfig(hidden_act=act, num_labels=num_labels, provenance="hf", extra=d, **kw)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('config: ')}") from None


# config.json keys that describe a classifier's labels
_LABEL_KEYS = ("num_labels", "id2label", "label2id", "problem_type")


def config_to_hf(config: BertConfig, architectures: list, float_dtype=None) -> dict:
    """BertConfig -> HF config.json dict (sorted on write, as transformers writes it).

    For a question-answering class the label fields describe its span head, whatever the config
    carried: transformers builds ``qa_outputs`` with ``num_labels`` outputs, and the head has 2
    (start, end)."""
    if architectures and str(architectures[0]).endswith("ForQuestionAnswering"):
        config = replace(config, num_labels=2, id2label=None, problem_type=None,
                         extra={k: v for k, v in config.extra.items() if k not in _LABEL_KEYS})
    d = {k: v for k, v in config.extra.items() if k != ACT_SPELLING_KEY}
    for k in _FIELDS:
        d[k] = getattr(config, k)
    label = HF_ACT_LABEL[config.hidden_act]
    spelling = config.extra.get(ACT_SPELLING_KEY)
    if isinstance(spelling, str) and HF_ACT.get(spelling) == config.hidden_act:
        label = spelling
    d["hidden_act"] = label
    d["model_type"] = "bert"
    d.setdefault("architectures", architectures)
    if config.id2label is not None:
        d["id2label"] = {str(i): v for i, v in sorted(config.id2label.items())}
        d.setdefault("label2id", config.label2id)
    if config.problem_type is not None:
        d["problem_type"] = config.problem_type
    if config.num_labels != 2 and "id2label" not in d and "num_labels" not in d:
        d["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_labels)}
        d["label2id"] = {f"LABEL_{i}": i for i in range(config.num_labels)}
    if float_dtype is not None:
        for key in ("dtype", "torch_dtype"):  # keep what the file says true after a --dtype cast
            if key in d:
                d[key] = float_dtype
    return d


def read_hf_json(path: str, what: str) -> dict:
    return read_json(path, what, ConfigError)
