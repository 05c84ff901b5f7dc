"""BertConfig: the architecture plus the numerics a checkpoint was trained with.

Google's ``bert_config.json`` says ``"hidden_act": "gelu"`` and means the tanh
approximation; HuggingFace's ``config.json`` says the same word and means erf.
bert_of keeps an unambiguous name in its own ``config.json`` (``gelu_tanh`` or
``gelu_erf``) and translates at the boundary, so a converted model computes
what its source computed.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Optional

import bert_of.resolver as _resolver
from bert_of.errors import ConfigError
from bert_of.files.reading import read_json

# Activations bert_of computes. Each name means exactly one function.
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "relu", "tanh", "silu", "linear")

# What each ecosystem's activation label means.
GOOGLE_ACT = {"gelu": "gelu_tanh", "relu": "relu", "tanh": "tanh", "linear": "linear"}
HF_ACT = {
    "gelu": "gelu_erf",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "tanh": "tanh",
    "silu": "silu",
    "swish": "silu",
    "linear": "linear",
}

# Layer-norm epsilon each source computes with (docs/formats.md, "Numerics travel with the checkpoint"):
# Google TF1 1e-12, legacy lazy OneFlow 1e-5, HF 1e-12 unless its config says otherwise.
PROVENANCE_LN_EPS = {"tf1": 1e-12, "lazy": 1e-5, "hf": 1e-12, "bert_of": 1e-12}

_GOOGLE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)
# Sanity bounds: a config beyond them is a corrupt or hostile file, not a BERT (and checking tensors
# against it would loop over billions of layers).
_MAX_SIZE = 2 ** 31 - 1  # token ids and sizes are int32 everywhere
_MAX_LAYERS = 1000
_MAX_LABELS = 1 << 20
_MAX_PARAMETERS = 2 ** 40

LAYERNORM_PLACEMENTS = ("post", "pre")
# Fields written to config.json only when set (every original-BERT config leaves them out).
_OPTIONAL_NUMERICS = ("layernorm_placement", "query_key_layer_scaling", "head_layer_norm_eps")
# The classifier head's task, written only when set.
_OPTIONAL_TASK = ("classifier_kind", "id2label", "problem_type")
# What a forward returns by default (transformers' config flags of the same names), written when set.
_OPTIONAL_OUTPUTS = ("output_hidden_states", "output_attentions")

# What a ``classifier.*`` head reads (the tensors are named alike in both): "sequence" the pooled
# [CLS] output (BertForSequenceClassification), "token" every position (BertForTokenClassification).
CLASSIFIER_KINDS = ("sequence", "token")
# transformers' config.problem_type values (BertForSequenceClassification's loss).
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")

# The classifier's kind in a Google bert_config.json (bert_of's key; Google's code ignores it, and
# id2label / problem_type, which to_google_dict writes as HF spells them).
_GOOGLE_KIND_KEY = "bert_of_classifier_kind"

# Keys without which no architecture can be built; the rest have Google's defaults.
_REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu_tanh"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    num_labels: int = 2
    provenance: str = "bert_of"
    # LayerNorm placement: "post" (original BERT) or "pre" (Megatron/LiBai: each layer normalises
    # its input and the attention output, a final LayerNorm closes the stack; see modeling.py).
    layernorm_placement: str = "post"
    # LiBai's apply_query_key_layer_scaling: scores scaled by 1/(sqrt(D) * (i+1)), then the softmax
    # input multiplied by (i+1) for layer i: the same function, LiBai's fp32 rounding.
    query_key_layer_scaling: bool = False
    # LayerNorm eps of the MLM head's transform when it differs from layer_norm_eps (LiBai: 1e-5).
    head_layer_norm_eps: Optional[float] = None
    # The classifier head's task (CLASSIFIER_KINDS), its class names by id (HF's id2label; label2id
    # is the inverse) and HF's problem_type (PROBLEM_TYPES, or None: from num_labels as HF infers it).
    classifier_kind: str = "sequence"
    id2label: Optional[dict] = None
    problem_type: Optional[str] = None
    # Outputs a forward returns when its call does not say (transformers' config flags).
    output_hidden_states: bool = False
    output_attentions: bool = False
    # Keys of the source config that bert_of does not use, kept for the round trip.
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.id2label, dict):  # JSON keys are strings: "0" -> 0
            self.id2label = {(int(k) if isinstance(k, str) and k.isdigit() and k.isascii() else k): v
                             for k, v in self.id2label.items()}
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"config: hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}"
            )
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"config: {name} must be a positive integer, got {v!r}")
            if v > _MAX_SIZE:
                raise ConfigError(f"config: {name} {v} is beyond any BERT (at most {_MAX_SIZE})")
        if self.num_hidden_layers > _MAX_LAYERS:
            raise ConfigError(f"config: num_hidden_layers {self.num_hidden_layers} is beyond any BERT "
                              f"(at most {_MAX_LAYERS})")
        if self.num_parameters() > _MAX_PARAMETERS:
            raise ConfigError(f"config: describes a model of {self.num_parameters():,} parameters, beyond any BERT")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"config: hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if not (_number(self.layer_norm_eps) and 0 < self.layer_norm_eps < 1):
            raise ConfigError(f"config: layer_norm_eps must be in (0, 1), got {self.layer_norm_eps!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            v = getattr(self, name)
            if not (_number(v) and 0 <= v < 1):
                raise ConfigError(f"config: {name} must be in [0, 1), got {v!r}")
        if not (_number(self.initializer_range) and 0 <= self.initializer_range < math.inf):
            raise ConfigError(f"config: initializer_range must be a non-negative number, got {self.initializer_range!r}")
        if not isinstance(self.num_labels, int) or isinstance(self.num_labels, bool) or self.num_labels <= 0:
            raise ConfigError(f"config: num_labels must be a positive integer, got {self.num_labels!r}")
        if self.num_labels > _MAX_LABELS:
            raise ConfigError(f"config: num_labels {self.num_labels} is beyond any classifier (at most {_MAX_LABELS})")
        if self.layernorm_placement not in LAYERNORM_PLACEMENTS:
            raise ConfigError(f"config: layernorm_placement {self.layernorm_placement!r} is not one of "
                              f"{', '.join(LAYERNORM_PLACEMENTS)}")
        if not isinstance(self.query_key_layer_scaling, bool):
            raise ConfigError(f"config: query_key_layer_scaling must be true or false, got "
                              f"{self.query_key_layer_scaling!r}")
        if self.head_layer_norm_eps is not None and not (_number(self.head_layer_norm_eps) and
                                                         0 < self.head_layer_norm_eps < 1):
            raise ConfigError(f"config: head_layer_norm_eps must be in (0, 1), got {self.head_layer_norm_eps!r}")
        if self.classifier_kind not in CLASSIFIER_KINDS:
            raise ConfigError(f"config: classifier_kind {self.classifier_kind!r} is not one of "
                              f"{', '.join(CLASSIFIER_KINDS)}")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"config: problem_type {self.problem_type!r} is not one of {', '.join(PROBLEM_TYPES)}")
        if self.id2label is not None:
            names = self.id2label
            if not isinstance(names, dict) or any(isinstance(k, bool) for k in names) or \
                    set(names) != set(range(len(names))):
                raise ConfigError("config: id2label must map the ids 0..n-1 to class names")
            if any(not isinstance(v, str) or not v for v in names.values()) or len(set(names.values())) < len(names):
                raise ConfigError("config: id2label's class names must be distinct non-empty strings")
            if len(names) != self.num_labels:
                raise ConfigError(f"config: id2label names {len(names)} classes but num_labels is {self.num_labels}")
        for name in _OPTIONAL_OUTPUTS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config: {name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.extra, dict):
            raise ConfigError(f"config: extra must be an object, got {type(self.extra).__name__}")

    @property
    def pre_ln(self) -> bool:
        return self.layernorm_placement == "pre"

    @property
    def head_eps(self) -> float:
        return self.layer_norm_eps if self.head_layer_norm_eps is None else self.head_layer_norm_eps

    def original_bert_mismatch(self) -> str | None:
        """Why a format holding original (post-LN) BERT could not hold this network, or None."""
        if self.pre_ln:
            return ("a pre-LN BERT (LayerNorm before attention and MLP, a final LayerNorm: LiBai's default "
                    "apply_residual_post_layernorm=False) is a different network; only the of, ofsd and libai "
                    "formats hold it")
        return None

    def numerics_notes(self) -> list:
        """What an original-BERT format drops of this config's numerics (rounding-level only)."""
        notes = []
        if self.query_key_layer_scaling:
            notes.append("note: query-key layer scaling not recorded (the same function; LiBai's fp32 "
                         "rounding differs by ~1e-7)")
        if self.head_layer_norm_eps is not None and self.head_layer_norm_eps != self.layer_norm_eps:
            notes.append(f"note: the MLM head's LayerNorm eps {self.head_layer_norm_eps:g} is not recorded "
                         f"(this format has one eps, {self.layer_norm_eps:g})")
        return notes

    @property
    def label2id(self) -> Optional[dict]:
        """Class name -> id (the inverse of ``id2label``), or None."""
        return None if self.id2label is None else {v: k for k, v in sorted(self.id2label.items())}

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def num_parameters(self, heads: str = "pretraining") -> int:
        """Parameter count of BertModel (+ pretraining heads), tied decoder counted once."""
        H, I, V, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        emb = (V + self.max_position_embeddings + self.type_vocab_size) * H + 2 * H
        layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
        n = emb + L * layer + H * H + H
        if heads == "pretraining":
            n += H * H + H + 2 * H + V + 2 * H + 2
        return n

    # ------------------------------------------------------------- bert_of json
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"
             and not (f.name in _OPTIONAL_NUMERICS + _OPTIONAL_TASK + _OPTIONAL_OUTPUTS
                      and getattr(self, f.name) == f.default)}
        if self.id2label is not None:
            d["id2label"] = {str(k): v for k, v in sorted(self.id2label.items())}
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "BertConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {', '.join(unknown)}")
        try:
            return cls(**d)
        except TypeError as e:  # wrong types surface here
            raise ConfigError(f"{where}: {e}") from None
        except ConfigError as e:
            raise ConfigError(f"{where}: {str(e).removeprefix('config: ')}") from None

    def updated(self, who: str = "BertConfig", **overrides) -> "BertConfig":
        """A new, validated config with ``overrides`` (BertConfig fields; transformers' ``label2id``
        too, as the inverse of ``id2label``). Any other keyword is a TypeError naming it, with the
        field it may mean (transformers' configs take unknown keywords silently as attributes)."""
        overrides = dict(overrides)
        if "label2id" in overrides:
            names = overrides.pop("label2id")
            try:
                inverse = {int(i): n for n, i in names.items()}
            except (AttributeError, TypeError, ValueError):
                inverse = None
            if inverse is None or overrides.get("id2label", inverse) != inverse:
                raise ConfigError(f"{who}: label2id must be the inverse of id2label")
            overrides["id2label"] = inverse
        if "id2label" in overrides and "num_labels" not in overrides and isinstance(overrides["id2label"], dict):
            overrides["num_labels"] = len(overrides["id2label"])  # as transformers' num_labels follows id2label
        check_override_names(who, overrides)
        return replace(self, **overrides)

    @classmethod
    def from_pretrained(cls, name_or_path, **overrides) -> "BertConfig":
        """The config of a checkpoint, as transformers' ``BertConfig.from_pretrained``: a bert_of
        checkpoint folder read in place; a zoo name or a checkpoint in another format through the
        resolver ``import bert_of`` registers (as a model's ``from_pretrained``: converted once and
        cached). ``overrides``: fields to set (see :meth:`updated`)."""
        path = os.fspath(name_or_path)
        own = os.path.join(path, "config.json")
        if not (os.path.isfile(own) and "provenance" in _read_json(own)):
            if _resolver.resolver is None:
                raise ConfigError(f"{path}: not a bert_of checkpoint directory (zoo names and other formats "
                                  "resolve once bert_of registers its resolver: import bert_of)")
            own = os.path.join(_resolver.resolver(path), "config.json")
        return cls.from_json_file(own).updated("BertConfig.from_pretrained()", **overrides)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json_file(cls, path: str, raw: bytes | None = None) -> "BertConfig":
        """bert_of's config.json (``raw``: its bytes, already read)."""
        return cls.from_dict(_read_json(path, raw), where=path)

    # ------------------------------------------------------- Google's json
    @classmethod
    def from_google_dict(cls, d: dict, where: str = "bert_config.json") -> "BertConfig":
        """Read Google's bert_config.json: every key kept, "gelu" means tanh."""
        missing = [k for k in _REQUIRED_KEYS if k not in d]
        if missing:
            raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")
        d = dict(d)
        # bert_of writes its exact activation beside Google's label (see to_google_dict).
        act_label = d.pop("hidden_act", "gelu")
        exact = d.pop("bert_of_hidden_act", None)
        if exact is not None:
            act = exact
        elif not act_label:  # modeling.get_activation: null or "" means no activation
            act = "linear"
        elif isinstance(act_label, str) and act_label.lower() in GOOGLE_ACT:  # it lower-cases the name
            act = GOOGLE_ACT[act_label.lower()]
        else:
            raise ConfigError(f"{where}: hidden_act {act_label!r} is not one Google's modeling.py knows")
        eps = d.pop("layer_norm_eps", None)
        eps = PROVENANCE_LN_EPS["tf1"] if eps is None else eps
        num_labels = d.pop("num_labels", None)
        num_labels = 2 if num_labels is None else num_labels
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if k in d and d[k] is None:  # modeling.dropout: None means no dropout
                d[k] = 0.0
        kw = {k: d.pop(k) for k in _GOOGLE_KEYS if k in d}
        # the classifier's task, as to_google_dict records it (Google's code reads none of it)
        kw.update(pop_task_fields(d))
        if _GOOGLE_KIND_KEY in d:
            kw["classifier_kind"] = d.pop(_GOOGLE_KIND_KEY)
        if isinstance(kw.get("id2label"), dict) and num_labels == 2:  # Google's configs hold no label count
            num_labels = len(kw["id2label"]) or 2
        try:
            return cls(hidden_act=act, layer_norm_eps=eps, num_labels=num_labels, provenance="tf1", extra=d, **kw)
        except ConfigError as e:
            raise ConfigError(f"{where}: {str(e).removeprefix('config: ')}") from None

    def to_google_dict(self) -> dict:
        """Google's bert_config.json. Its code only knows tanh-GELU under "gelu"."""
        d = {k: getattr(self, k) for k in _GOOGLE_KEYS}
        d["hidden_act"] = {"gelu_tanh": "gelu", "gelu_erf": "gelu"}.get(self.hidden_act, self.hidden_act)
        if self.hidden_act != d["hidden_act"] and self.hidden_act != "gelu_tanh":
            d["bert_of_hidden_act"] = self.hidden_act
        if self.hidden_act == "silu":
            d["hidden_act"] = "gelu"  # no silu in Google's code; the exact name travels beside it
        if self.layer_norm_eps != PROVENANCE_LN_EPS["tf1"]:
            d["layer_norm_eps"] = self.layer_norm_eps
        task = self.to_dict()
        d.update({k: task[k] for k in ("id2label", "problem_type") if k in task})
        if self.classifier_kind != "sequence":
            d[_GOOGLE_KIND_KEY] = self.classifier_kind
        d.update(self.extra)
        return d

    @classmethod
    def from_google_json_file(cls, path: str, raw: bytes | None = None) -> "BertConfig":
        """Google's bert_config.json (``raw``: its bytes, already read)."""
        return cls.from_google_dict(_read_json(path, raw), where=path)

    @classmethod
    def from_model_json_file(cls, path: str, raw: bytes | None = None) -> "BertConfig":
        """A model's config given as a file: bert_of's config.json (it records its ``provenance``),
        else Google's bert_config.json. (HF's and OneFlow's configs are the converters'.)"""
        d = _read_json(path, raw)
        return cls.from_dict(d, where=path) if "provenance" in d else cls.from_google_dict(d, where=path)

    def google_mismatch(self) -> str | None:
        """Why Google's own modeling.py would not compute what this config does, or None."""
        reasons = []
        if self.hidden_act not in ("gelu_tanh", "relu", "tanh", "linear"):
            reasons.append(f"activation {self.hidden_act} (Google's code computes gelu_tanh)")
        if not math.isclose(self.layer_norm_eps, 1e-12, rel_tol=1e-9):
            reasons.append(f"layer_norm_eps {self.layer_norm_eps:g} (Google's code uses 1e-12)")
        return "; ".join(reasons) or None


def check_override_names(who: str, overrides) -> None:
    """A TypeError naming any keyword that is not a BertConfig field (nor ``label2id``), with the
    field it may mean."""
    known = sorted(f.name for f in fields(BertConfig) if f.name != "extra") + ["label2id"]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        hints = [f"{k} (did you mean {close[0]}?)" if close else k
                 for k in unknown for close in [difflib.get_close_matches(k, known, n=1)]]
        raise TypeError(f"{who} got unexpected keyword argument(s) {', '.join(hints)}; "
                        f"keywords set BertConfig fields: {', '.join(known)}")


def pop_task_fields(d: dict) -> dict:
    """BertConfig's ``id2label`` / ``problem_type`` popped from a config dict spelled as HF's
    config.json spells them, when BertConfig can hold them (ids "0".."n-1" to distinct names;
    ``label2id`` popped too when it is their inverse). Any other value stays in ``d`` (kept in
    ``extra``, written back as it was)."""
    kw = {}
    names = d.get("id2label")
    if isinstance(names, dict) and names and all(isinstance(v, str) and v for v in names.values()) \
            and sorted(names) == sorted(str(i) for i in range(len(names))) and len(set(names.values())) == len(names):
        kw["id2label"] = d.pop("id2label")
        if d.get("label2id") == {v: int(k) for k, v in names.items()}:
            del d["label2id"]
    if d.get("problem_type") in PROBLEM_TYPES:
        kw["problem_type"] = d.pop("problem_type")
    return kw


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _read_json(path: str, raw: bytes | None = None) -> dict:
    return read_json(path, "config file", ConfigError, raw=raw)
