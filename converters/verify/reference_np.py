"""verify's NumPy reference, its layouts: each codebase's BERT weights as its file stores them.

It shares no code with ``bert_of.modeling`` (nor with the readers' name tables): it is written
from the math of the BERT paper and of the codebases whose checkpoints it reads, and it takes a
checkpoint's tensors **as the file stores them**, in the file's own names and layout, with the
numerics the file's own code computes. A wrong name table, a missing transpose, the wrong GELU
or LayerNorm epsilon in a reader is then a difference, not a bug carried into both sides.

Layouts (one class each; a format's descriptor names its class, ``converters/registry.py``):

- ``tf``: google-research/bert. ``bert/encoder/layer_{i}/attention/self/query/kernel`` [in, out];
  the heads' ``output_weights`` [out, in] (multiplied with transpose_b). ``"gelu"`` is the tanh
  form; LayerNorm epsilon 1e-12 (tf.contrib's constant); mask adder ``(1 - mask) * -10000``.
  A ``bert_config.json`` bert_of wrote records the exact numerics (``bert_of_hidden_act``,
  ``layer_norm_eps``): they are honoured.
- ``hf``: transformers' PyTorch BERT. ``nn.Linear`` weights [out, in] (``y = x W^T + b``),
  optional ``bert.`` prefix, ``LayerNorm.weight`` (or the old ``gamma``); ``"gelu"`` is erf,
  ``"gelu_new"``/``"gelu_pytorch_tanh"``/``"gelu_fast"`` the tanh form; ``layer_norm_eps`` from
  config.json; mask adder ``(1 - mask) * finfo(float32).min``.
- ``of``: bert_of's own directory: the hf names and layout; its config names the exact
  activation (``gelu_erf``, ``gelu_tanh``, ...) and epsilon (and the MLM head's own, if any).
- ``onnx``: bert_of's ONNX graph: the of names, but dense weights [in, out] as ``<scope>.kernel``
  (what MatMul multiplies by); numerics from the bert_of config in the model's metadata.
- ``h5``: transformers' Keras BERT: Dense kernels [in, out] (``.../kernel:0``), embeddings
  ``.../weight:0`` and ``.../embeddings:0``, the MLM head under ``mlm___cls``, NSP under
  ``nsp___cls``; numerics from config.json as for hf; mask adder ``(1 - mask) * -10000``.
- ``tf2``: TensorFlow 2's Model Garden, by the names its object graph gives each variable;
  einsum attention kernels [H, heads, head_size] / [heads, head_size, H]; tanh GELU, epsilon
  1e-12, mask adder -1e9 (see :class:`ModelGarden`).
- ``lazy``: OneFlow-Benchmark's lazy BERT: dash-joined scopes, dense ``-weight`` [in, out],
  positions [1, P, H] ([P, H] in convert_tf_ckpt_to_of.py's output, with TF's head names).
  Numerics are those of the snapshot's provenance: a genuine lazy snapshot computes erf GELU
  with LayerNorm epsilon 1e-5, Google weights computed as Google does.

The forward maths that runs on a layout is ``converters/verify/reference_forward.py``.
"""

from __future__ import annotations

import json
import os

import numpy as np

from bert_of.converters.verify.reference_forward import ACTIVATIONS

# transformers' ACT2FN labels -> the function
HF_ACTS = {"gelu": "gelu_erf", "gelu_python": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
           "gelu_fast": "gelu_tanh", "relu": "relu", "tanh": "tanh", "silu": "silu", "swish": "silu",
           "linear": "linear"}
# google-research/bert's get_activation labels
GOOGLE_ACTS = {"gelu": "gelu_tanh", "relu": "relu", "tanh": "tanh", "linear": "linear"}


class Layout:
    """Weights of one codebase's BERT, by role, from the tensors as its file stores them.

    ``tensors``: stored name -> function returning the stored array (read when asked, so one
    layer's float64 weights are in memory at a time). Subclasses give ``NAMES``: role ->
    (stored name template, orientation) where orientation says how the file holds a dense weight
    ("in_out" as TF/Keras, "out_in" as nn.Linear and Google's output_weights).
    """

    name = "?"
    pre_ln = False
    placement = "bert"  # "libai": LiBai's own LayerNorm placement (reference_forward._forward_libai)
    mask_value = -10000.0
    NAMES: dict = {}

    def __init__(self, tensors: dict, config: dict, numerics: tuple):
        self.tensors, self.config = tensors, config
        self.act, self.eps = numerics

    @classmethod
    def numerics(cls, config: dict, provenance: str | None = None) -> tuple:
        """(activation, LayerNorm epsilon) the codebase computes, from its own config dict
        (transformers' reading by default)."""
        return HF_ACTS.get(config.get("hidden_act", "gelu")), _eps(config)

    @classmethod
    def from_source(cls, source) -> "Layout":
        """This layout on a ``Source``'s stored tensors, with the numerics its own config file says."""
        config = read_config(source.config_file) if source.config_file and os.path.isfile(source.config_file) else {}
        act, eps = cls.numerics(config, source.native_numerics or source.config.provenance)
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {config.get('hidden_act')!r} has no reference")
        return cls(source.stored, config, (act, eps))

    def stored(self, role: str, i: int = 0):
        """The stored name of a role, or None when the file has no such tensor."""
        for template, _ in self.NAMES.get(role, ()):
            name = self.spell(template.format(i=i))
            if name in self.tensors:
                return name
        return None

    def spell(self, name: str) -> str:
        return name

    def has(self, role: str) -> bool:
        return self.stored(role) is not None

    def token_classifier(self) -> bool:
        """Whether the file's own config says its classifier reads every position (a token
        classifier), not the pooled output."""
        return False

    def vector(self, role: str, i: int = 0):
        return np.asarray(self.tensors[self.stored(role, i)](), np.float64)

    def dense(self, role: str, i: int = 0):
        """(W [in, out], b) of a dense layer, whatever the file's orientation."""
        name = self.stored(role + ".w", i)
        orient = next(o for t, o in self.NAMES[role + ".w"] if self.spell(t.format(i=i)) == name)
        w = np.asarray(self.tensors[name](), np.float64)
        return (w if orient == "in_out" else w.T), self.vector(role + ".b", i)

    def ln(self, role: str, i: int = 0):
        return self.vector(role + ".g", i), self.vector(role + ".b", i)

    def positions(self):
        pos = self.vector("pos")
        return pos.reshape(pos.shape[-2:]) if pos.ndim == 3 else pos  # lazy: [1, P, H]

    def qkv(self, i: int):
        """((Wq, bq), (Wk, bk), (Wv, bv)), each W [in, out]."""
        return self.dense("q", i), self.dense("k", i), self.dense("v", i)

    def as_google(self) -> dict:
        """These weights under Google's names and in Google's orientation (float32), for running
        TensorFlow's graph of Google's modeling.py on a file of another layout."""
        out, layers = {}, 0
        while self.stored("q.w", layers) is not None:
            layers += 1
        for role, entries in Google.NAMES.items():
            if not self.has(role) and "{i}" not in entries[0][0]:
                continue
            for i in (range(layers) if "{i}" in entries[0][0] else (0,)):
                template, orient = entries[0]
                if role.endswith(".w") and orient is not None:
                    w = self.dense(role[:-2], i)[0]
                    value = w if orient == "in_out" else w.T
                else:
                    value = self.positions() if role == "pos" else self.vector(role, i)
                out[template.format(i=i)] = np.ascontiguousarray(value, np.float32)
        return out


def _dense(role, template, orient):
    return {role + ".w": [(template[0], orient)], role + ".b": [(template[1], None)]}


def roles(dense, vec, ln, emb, heads):
    """Role table from: a dense-scope speller, a [in, out] orientation, LN and embedding names."""
    names = {}
    for role, scope in emb.items():
        names[role] = [(n, None) for n in ([scope] if isinstance(scope, str) else scope)]
    for role, (g, b) in ln.items():
        names[role + ".g"], names[role + ".b"] = [(n, None) for n in g], [(n, None) for n in b]
    for role, scope in dense.items():
        names.update(_dense(role, vec(scope), "in_out"))
    for role, entries in heads.items():  # [(weight, bias, orientation)] alternatives
        names[role + ".w"] = [(w, o) for w, _, o in entries]
        names[role + ".b"] = [(b, None) for _, b, _ in entries]
    return names


class Google(Layout):
    name = "tf"

    @classmethod
    def numerics(cls, config, provenance=None):
        return _google_act(config), _eps(config)

    def token_classifier(self):  # the key bert_of writes beside Google's (Google's code has no token head)
        return self.config.get("bert_of_classifier_kind") == "token"
    _L = "bert/encoder/layer_{i}/"
    NAMES = roles(
        {"q": _L + "attention/self/query", "k": _L + "attention/self/key", "v": _L + "attention/self/value",
         "ao": _L + "attention/output/dense", "in": _L + "intermediate/dense", "out": _L + "output/dense",
         "pool": "bert/pooler/dense", "mlm": "cls/predictions/transform/dense"},
        lambda s: (s + "/kernel", s + "/bias"),
        {"emb_ln": (["bert/embeddings/LayerNorm/gamma"], ["bert/embeddings/LayerNorm/beta"]),
         "ao_ln": ([_L + "attention/output/LayerNorm/gamma"], [_L + "attention/output/LayerNorm/beta"]),
         "out_ln": ([_L + "output/LayerNorm/gamma"], [_L + "output/LayerNorm/beta"]),
         "mlm_ln": (["cls/predictions/transform/LayerNorm/gamma"], ["cls/predictions/transform/LayerNorm/beta"])},
        {"word": "bert/embeddings/word_embeddings", "type": "bert/embeddings/token_type_embeddings",
         "pos": "bert/embeddings/position_embeddings", "mlm_bias": "cls/predictions/output_bias"},
        {"nsp": [("cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias", "out_in")],
         "qa": [("cls/squad/output_weights", "cls/squad/output_bias", "out_in")],
         "clf": [("output_weights", "output_bias", "out_in")]})


class HuggingFace(Layout):
    name = "hf"
    mask_value = float(np.finfo(np.float32).min)  # transformers' extended attention mask
    _L = "bert.encoder.layer.{i}."
    NAMES = roles(
        {}, None,
        {"emb_ln": (["bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.gamma"],
                    ["bert.embeddings.LayerNorm.bias", "bert.embeddings.LayerNorm.beta"]),
         "ao_ln": ([_L + "attention.output.LayerNorm.weight", _L + "attention.output.LayerNorm.gamma"],
                   [_L + "attention.output.LayerNorm.bias", _L + "attention.output.LayerNorm.beta"]),
         "out_ln": ([_L + "output.LayerNorm.weight", _L + "output.LayerNorm.gamma"],
                    [_L + "output.LayerNorm.bias", _L + "output.LayerNorm.beta"]),
         "mlm_ln": (["cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.gamma"],
                    ["cls.predictions.transform.LayerNorm.bias", "cls.predictions.transform.LayerNorm.beta"])},
        {"word": "bert.embeddings.word_embeddings.weight", "type": "bert.embeddings.token_type_embeddings.weight",
         "pos": "bert.embeddings.position_embeddings.weight",
         "mlm_bias": ["cls.predictions.bias", "cls.predictions.decoder.bias"]},
        {role: [(s + ".weight", s + ".bias", "out_in")] for role, s in {
            "q": _L + "attention.self.query", "k": _L + "attention.self.key", "v": _L + "attention.self.value",
            "ao": _L + "attention.output.dense", "in": _L + "intermediate.dense", "out": _L + "output.dense",
            "pool": "bert.pooler.dense", "mlm": "cls.predictions.transform.dense", "nsp": "cls.seq_relationship",
            "qa": "qa_outputs", "clf": "classifier"}.items()})

    def __init__(self, tensors, config, numerics):
        super().__init__(tensors, config, numerics)
        self.bare = not any(n.startswith(("bert.", "cls.")) for n in tensors)  # a BertModel's own names

    def spell(self, name):
        return name[len("bert."):] if self.bare and name.startswith("bert.") else name

    def token_classifier(self):  # transformers' class, as config.json names it
        arch = self.config.get("architectures")
        return isinstance(arch, list) and bool(arch) and arch[0] in ("BertForTokenClassification",
                                                                   "TFBertForTokenClassification")


class BertOf(HuggingFace):
    name = "of"
    mask_value = -10000.0

    @classmethod
    def numerics(cls, config, provenance=None):  # bert_of's config names the exact function
        return config.get("hidden_act", "gelu_erf"), _eps(config)

    def token_classifier(self):  # bert_of's config.json: classifier_kind
        return self.config.get("classifier_kind") == "token"

    @property
    def head_eps(self):  # the MLM head's own LayerNorm epsilon, when bert_of's config.json has one
        return self.config.get("head_layer_norm_eps")


class Keras(Layout):
    name = "h5"
    _L = "bert/encoder/layer_._{i}/"
    NAMES = roles(
        {"q": _L + "attention/self/query", "k": _L + "attention/self/key", "v": _L + "attention/self/value",
         "ao": _L + "attention/output/dense", "in": _L + "intermediate/dense", "out": _L + "output/dense",
         "pool": "bert/pooler/dense", "mlm": "mlm___cls/predictions/transform/dense",
         "nsp": "nsp___cls/seq_relationship", "qa": "qa_outputs", "clf": "classifier"},
        lambda s: (s + "/kernel:0", s + "/bias:0"),
        {"emb_ln": (["bert/embeddings/LayerNorm/gamma:0"], ["bert/embeddings/LayerNorm/beta:0"]),
         "ao_ln": ([_L + "attention/output/LayerNorm/gamma:0"], [_L + "attention/output/LayerNorm/beta:0"]),
         "out_ln": ([_L + "output/LayerNorm/gamma:0"], [_L + "output/LayerNorm/beta:0"]),
         "mlm_ln": (["mlm___cls/predictions/transform/LayerNorm/gamma:0"],
                    ["mlm___cls/predictions/transform/LayerNorm/beta:0"])},
        {"word": "bert/embeddings/word_embeddings/weight:0",
         "type": "bert/embeddings/token_type_embeddings/embeddings:0",
         "pos": "bert/embeddings/position_embeddings/embeddings:0", "mlm_bias": "mlm___cls/predictions/bias:0"},
        {})
    token_classifier = HuggingFace.token_classifier

    def __init__(self, tensors, config, numerics):
        # datasets are <layer group>/<model scope>/<weight name>: the weight name is what Keras matches
        super().__init__({n.split("/", 2)[-1]: f for n, f in tensors.items()}, config, numerics)


def _dashed(names: dict) -> dict:
    """OneFlow-Benchmark's lazy BERT names its variables as Google does, scopes joined by "-" and
    dense kernels called "weight"."""
    return {role: [(n.replace("/", "-").replace("-kernel", "-weight"), o) for n, o in entries]
            for role, entries in names.items()}


class ModelGarden(Layout):
    """TensorFlow 2's Model Garden (official.nlp BertEncoder, BertPretrainerV2's MaskedLM, the legacy
    NSP and span-labeler heads), by the names its object graph gives each variable: the attribute
    paths of a tf.train.Checkpoint (``_transformer_layers/0/_attention_layer/_query_dense/kernel``)
    or a SavedModel's variable names (``transformer/layer_0/self_attention/query/kernel``). The
    attention is einsum: q/k/v kernels [H, heads, head_size] (biases [heads, head_size]), the
    output kernel [heads, head_size, H]; every other kernel [in, out]. Its "gelu" is the tanh form,
    LayerNorm epsilon 1e-12, masked scores get -1e9 (its MaskedSoftmax)."""
    name = "tf2"
    mask_value = -1e9
    numerics = Google.numerics  # Model Garden reads Google's bert_config.json: "gelu" is tanh
    token_classifier = Google.token_classifier
    _L, _S = "_transformer_layers/{i}/", "transformer/layer_{i}/"
    NAMES = roles(
        {}, None,
        {"emb_ln": (["_embedding_norm_layer/gamma", "embeddings/layer_norm/gamma"],
                    ["_embedding_norm_layer/beta", "embeddings/layer_norm/beta"]),
         "ao_ln": ([_L + "_attention_layer_norm/gamma", _S + "self_attention_layer_norm/gamma"],
                   [_L + "_attention_layer_norm/beta", _S + "self_attention_layer_norm/beta"]),
         "out_ln": ([_L + "_output_layer_norm/gamma", _S + "output_layer_norm/gamma"],
                    [_L + "_output_layer_norm/beta", _S + "output_layer_norm/beta"]),
         "mlm_ln": (["masked_lm/layer_norm/gamma", "cls/predictions/transform/LayerNorm/gamma"],
                    ["masked_lm/layer_norm/beta", "cls/predictions/transform/LayerNorm/beta"])},
        {"word": ["_embedding_layer/embeddings", "masked_lm/embedding_table", "word_embeddings/embeddings"],
         "type": ["_type_embedding_layer/embeddings", "type_embeddings/embeddings"],
         "pos": ["_position_embedding_layer/embeddings", "position_embedding/embeddings"],
         "mlm_bias": ["masked_lm/bias", "masked_lm/output_bias/bias", "cls/predictions/output_bias/bias"]},
        {role: [(a + "/kernel", a + "/bias", "in_out"), (b + "/kernel", b + "/bias", "in_out")] for role, (a, b) in {
            "q": (_L + "_attention_layer/_query_dense", _S + "self_attention/query"),
            "k": (_L + "_attention_layer/_key_dense", _S + "self_attention/key"),
            "v": (_L + "_attention_layer/_value_dense", _S + "self_attention/value"),
            "ao": (_L + "_attention_layer/_output_dense", _S + "self_attention/attention_output"),
            "in": (_L + "_intermediate_dense", _S + "intermediate"), "out": (_L + "_output_dense", _S + "output"),
            "pool": ("_pooler_layer", "pooler_transform"),
            "mlm": ("masked_lm/dense", "cls/predictions/transform/dense"),
            "nsp": ("classification/layer_with_weights-0", "classification/layer_with_weights-0"),
            "qa": ("span_labeling/layer_with_weights-0", "span_labeling/layer_with_weights-0")}.items()})

    def dense(self, role, i=0):
        """The einsum tensors flattened to a dense [in, out] as the einsums compute: "BTE,ENH->BTNH"
        for q/k/v (kernel [E, N, H] -> [E, N*H]), "BTNH,NHD->BTD" for the output ([N, H, D] -> [N*H, D])."""
        w, b = super().dense(role, i)
        if w.ndim == 3:
            w = w.reshape(-1, w.shape[-1]) if role == "ao" else w.reshape(w.shape[0], -1)
        return w, b

    def vector(self, role, i=0):
        v = super().vector(role, i)
        return v.reshape(-1) if role in ("q.b", "k.b", "v.b") else v  # [heads, head_size]


class Lazy(Layout):
    name = "lazy"

    @classmethod
    def numerics(cls, config, provenance=None):
        """The lazy kernels' GELU whatever the label says; epsilon by the snapshot's provenance."""
        gelu, eps = LAZY_PROVENANCE[provenance or "lazy"]
        act = _google_act(config)
        return (gelu if act and act.startswith("gelu") else act), eps
    token_classifier = Google.token_classifier
    NAMES = {**_dashed(Google.NAMES), **roles({}, None, {}, {}, {
        "qa": [("cls-squad-output-weight", "cls-squad-output-bias", "in_out"),  # lazy: a dense [H, 2]
               ("cls-squad-output_weights", "cls-squad-output_bias", "out_in")],  # Google's names
        "clf": [("classification-output_weights", "classification-output_bias", "out_in"),
                ("output_weight-output_weights", "output_bia-output_bias", "out_in"),  # the script's
                ("output_weights", "output_bias", "out_in")]})}  # off-by-one split, and Google's


def _native(cls, source, own: dict):
    """A flow.save folder holds no config: its numerics are what the reader found for it, from the
    config beside it (LiBai's config.yaml, the models repo's arguments, bert_of's config.json)."""
    c = source.config
    return cls(source.stored, own, (c.hidden_act, float(c.layer_norm_eps)))


class OfStateDict(BertOf):
    """bert_of's own module state dict saved with flow.save: the canonical names (bare for a BertModel)."""
    name = "ofsd"

    @classmethod
    def from_source(cls, source):
        return _native(cls, source, {"classifier_kind": source.config.classifier_kind,  # bert_of's config
                                     "head_layer_norm_eps": source.config.head_layer_norm_eps})


class OfModels(HuggingFace):
    """Oneflow-Inc/models NLP/BERT: original BERT's scopes; the MLM bias is ``output_bias`` (the
    decoder's weight and bias ARE the word embeddings and it); an older revision keeps bare
    Parameter embeddings; its SQuAD head is ``cls_squad``; its mask is ``(mask - 1) * 10000``."""
    name = "ofmodels"
    mask_value = -10000.0
    NAMES = {**HuggingFace.NAMES,
             "word": HuggingFace.NAMES["word"] + [("bert.embeddings.word_embeddings", None)],
             "type": HuggingFace.NAMES["type"] + [("bert.embeddings.tokentype_embeddings", None)],
             "pos": HuggingFace.NAMES["pos"] + [("bert.embeddings.position_embeddings", None)],
             "mlm_bias": [("cls.predictions.output_bias", None), ("output_bias", None)],
             **roles({}, None, {}, {}, {"qa": [("cls_squad.weight", "cls_squad.bias", "out_in")]})}

    @classmethod
    def from_source(cls, source):
        return _native(cls, source, {})


class Onnx(BertOf):
    """bert_of's ONNX graph (converters/formats/onnx/): the initializers MatMul multiplies by are dense
    weights [in, out] named ``<scope>.kernel``; the rest keep bert_of's names. The graph's mask
    adder is ``(1 - mask) * -10000``; its activation and epsilons (the MLM head's own, when the
    config has one) are the bert_of config's, which the model's metadata holds."""
    name = "onnx"
    _L = "bert.encoder.layer.{i}."
    NAMES = {**BertOf.NAMES, **roles({}, None, {}, {}, {role: [(s + ".kernel", s + ".bias", "in_out")] for role, s in {
        "q": _L + "attention.self.query", "k": _L + "attention.self.key", "v": _L + "attention.self.value",
        "ao": _L + "attention.output.dense", "in": _L + "intermediate.dense", "out": _L + "output.dense",
        "pool": "bert.pooler.dense", "mlm": "cls.predictions.transform.dense", "nsp": "cls.seq_relationship",
        "qa": "qa_outputs", "clf": "classifier"}.items()})}

    @classmethod
    def from_source(cls, source):  # the config is in the model's metadata, read into source.config
        c = source.config
        return cls(source.stored, c.to_dict(), (c.hidden_act, float(c.layer_norm_eps)))


class LiBai(Layout):
    """LiBai's BertModel in LiBai's own placement (libai/models/bert_model.py): no LayerNorm on the
    embeddings; each layer normalises its input (``input_layernorm``) and, before the MLP, its
    attention sum (``post_attention_layernorm``); ``final_layernorm`` closes the stack. Pre-LN
    (``apply_residual_post_layernorm=False``, LiBai's default): the residual is the sum before the
    norm; post-LN (True): the residual is the normed value. q, k, v are one fused [3H, H] weight,
    interleaved per head ([heads, 3, head_size, H]). The MLM head's LayerNorm is at eps 1e-5."""
    name = "libai"
    placement = "libai"
    _E = "bert.encoders.{i}."
    NAMES = roles({}, None,
                   {"in_ln": ([_E + "input_layernorm.weight"], [_E + "input_layernorm.bias"]),
                    "pa_ln": ([_E + "post_attention_layernorm.weight"], [_E + "post_attention_layernorm.bias"]),
                    "final_ln": (["bert.final_layernorm.weight"], ["bert.final_layernorm.bias"]),
                    "mlm_ln": (["cls_head.predictions.layernorm.weight"], ["cls_head.predictions.layernorm.bias"])},
                   {"word": "bert.embeddings.vocab_embeddings.weight",
                    "type": "bert.embeddings.tokentype_embeddings.weight",
                    "pos": "bert.embeddings.position_embeddings.weight", "mlm_bias": "cls_head.lm_logits.bias"},
                   {role: [(s_ + ".weight", s_ + ".bias", "out_in")] for role, s_ in {
                       "qkv": _E + "self_attention.query_key_value", "ao": _E + "self_attention.dense",
                       "in": _E + "mlp.dense_h_to_4h", "out": _E + "mlp.dense_4h_to_h", "pool": "bert.pooler.dense",
                       "mlm": "cls_head.predictions.dense", "nsp": "cls_head.seq_relationship",
                       "clf": "classifier"}.items()})

    def __init__(self, tensors, config, numerics, residual_post_ln: bool, head_eps: float = 1e-5):
        super().__init__(tensors, config, numerics)
        self.residual_post_ln, self.head_eps = residual_post_ln, head_eps
        self.bare = not any(n.startswith(("bert.", "cls_head.")) for n in tensors)  # a BertModel's own names

    @classmethod
    def from_source(cls, source):
        c = source.config  # bert_of's config holds LiBai's post-LN as the shifted post-LN BERT, its pre-LN as "pre"
        return cls(source.stored, {}, (c.hidden_act, float(c.layer_norm_eps)),
                   residual_post_ln=c.layernorm_placement != "pre",
                   head_eps=c.head_layer_norm_eps if c.head_layer_norm_eps is not None else 1e-5)

    def spell(self, name):
        return name[len("bert."):] if self.bare and name.startswith("bert.") else name

    def qkv(self, i: int, num_heads: int):
        w = np.asarray(self.tensors[self.stored("qkv.w", i)](), np.float64)  # [3H, H]
        b = np.asarray(self.tensors[self.stored("qkv.b", i)](), np.float64)  # [3H]
        H = w.shape[1]
        w, b = w.reshape(num_heads, 3, H // num_heads, H), b.reshape(num_heads, 3, H // num_heads)
        return [(w[:, j].reshape(H, H).T, b[:, j].reshape(H)) for j in range(3)]


# What the lazy BERT computes, by the snapshot's provenance: (GELU for "gelu", LayerNorm epsilon)
LAZY_PROVENANCE = {"lazy": ("gelu_erf", 1e-5), "tf1": ("gelu_tanh", 1e-12), "hf": ("gelu_erf", 1e-12)}


def _google_act(config: dict):
    """modeling.get_activation's reading of hidden_act (lower-cased; null or "" is linear), or the
    exact activation a bert_config.json written by bert_of records beside it."""
    if config.get("bert_of_hidden_act"):
        return config["bert_of_hidden_act"]
    label = config.get("hidden_act", "gelu")
    return "linear" if not label else GOOGLE_ACTS.get(str(label).lower())


def _eps(config: dict) -> float:
    eps = config.get("layer_norm_eps")
    return 1e-12 if eps is None else float(eps)


def read_config(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)
