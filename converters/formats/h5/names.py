"""The names of HuggingFace's Keras h5 weights: file names, the name table (Keras weight names
without the model scope), and each transformers TF BERT class's layout (Keras scope, top-level
layers, weights in the order the class creates them).

The file layout is described in converters/formats/h5/.
"""

from __future__ import annotations

from bert_of.converters.mapping import Table, spell

NAME = "h5"
WEIGHTS_FILE = "tf_model.h5"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"


def _scope(canonical: str) -> str:
    scope = canonical
    if scope.startswith(("cls.predictions", "cls.seq_relationship")):  # the heads' Keras layers
        scope = ("mlm___" if scope.startswith("cls.predictions") else "nsp___") + scope
    return scope.replace(".", "/").replace("layer/{i}", "layer_._{i}")


# How HF's Keras layers name their weights (every Dense kernel [in, out]).
PARAMS = {
    "embedding": [("/weight:0", ".weight")],
    "table": [("/embeddings:0", ".weight")],
    "dense": [("/kernel:0", ".weight", "T"), ("/bias:0", ".bias")],
    "ln": [("/LayerNorm/gamma:0", ".LayerNorm.weight"), ("/LayerNorm/beta:0", ".LayerNorm.bias")],
    "bias": [("/bias:0", ".bias")],
}
_OWN = {"bert.embeddings.token_type_embeddings": ("bert/embeddings/token_type_embeddings", "table"),
        "bert.embeddings.position_embeddings": ("bert/embeddings/position_embeddings", "table")}


def _rows(*groups):
    return spell(_scope, PARAMS, _OWN, groups)


# Format names are the weight names without the model scope (what HF's own
# loader matches on); rows are in the order HF's classes create the weights.
EMBEDDINGS, LAYER, POOLER = _rows("embeddings"), _rows("layer"), _rows("pooler")
MLM = sorted(_rows("mlm"), key=lambda r: r[1] != "cls.predictions.bias")  # TFBertMLMHead creates its bias first
NSP, QA, CLASSIFIER = _rows("nsp"), _rows("qa"), _rows("classifier")
TABLE = Table([*EMBEDDINGS, *LAYER, *POOLER, *MLM, *NSP, *QA, *CLASSIFIER])
POOLER_NAMES = [r[1] for r in POOLER]


class Layout:
    """One transformers TF class: its Keras scope, top-level layers and weights."""

    def __init__(self, cls, scope, groups, pooler, heads):
        self.cls, self.scope, self.groups, self.pooler, self.heads = cls, scope, groups, pooler, heads

    @property
    def architecture(self):  # what HF's save_pretrained records in config.json
        return self.cls[2:]

    def weights(self, num_layers: int) -> list:
        """[(group, format name, canonical, transform)] in HF's order."""
        rows = [("bert", *_row(r)) for r in EMBEDDINGS]
        for i in range(num_layers):
            rows += [("bert", n.format(i=i), c.format(i=i), t) for n, c, t in map(_row, LAYER)]
        rows += [("bert", *_row(r)) for r in POOLER] if self.pooler else []
        for group, head in self.heads:
            rows += [(group, *_row(r)) for r in head]
        return rows


def _row(r):
    return (r[0], r[1], r[2] if len(r) > 2 else None)


LAYOUTS = {
    "pretraining": Layout("TFBertForPreTraining", "tf_bert_for_pre_training", ["bert", "nsp___cls", "mlm___cls"],
                          True, [("nsp___cls", NSP), ("mlm___cls", MLM + EMBEDDINGS)]),
    # the same MLM head without NSP, and no pooler (transformers' add_pooling_layer=False)
    "mlm": Layout("TFBertForMaskedLM", "tf_bert_for_masked_lm", ["bert", "mlm___cls"], False,
                  [("mlm___cls", MLM + EMBEDDINGS)]),
    "model": Layout("TFBertModel", "tf_bert_model", ["bert"], True, []),
    "qa": Layout("TFBertForQuestionAnswering", "tf_bert_for_question_answering", ["bert", "qa_outputs"], False,
                 [("qa_outputs", QA)]),
    "classifier": Layout("TFBertForSequenceClassification", "tf_bert_for_sequence_classification",
                         ["bert", "classifier"], True, [("classifier", CLASSIFIER)]),
    # the same classifier.* on every position (config.classifier_kind "token"), no pooler
    "token": Layout("TFBertForTokenClassification", "tf_bert_for_token_classification", ["bert", "classifier"],
                    False, [("classifier", CLASSIFIER)]),
}
# Keras scopes of transformers' TF BERT classes bert_of has no head for.
UNSUPPORTED = {
    "tf_bert_lm_head_model": "TFBertLMHeadModel",
    "tf_bert_for_next_sentence_prediction": "TFBertForNextSentencePrediction",
    "tf_bert_for_multiple_choice": "TFBertForMultipleChoice",
}
