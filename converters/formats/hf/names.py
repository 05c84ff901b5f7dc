"""The names of a HuggingFace BERT directory: its file names, the name table (HF's names are the
canonical ones), the tensors HF files hold that bert_of does not, and which transformers class a set
of head tensors is.

The layout is described in converters/formats/hf/.
"""

from __future__ import annotations

from bert_of.config import BertConfig
from bert_of.converters.mapping import Table, spell

NAME = "hf"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_BIN = "pytorch_model.bin"
PT_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PT_BIN, PT_BIN_INDEX)

# HF's names are the canonical ones: every scope spelled as it is, Linear weights [out, in].
PARAMS = {"embedding": [(".weight", ".weight")], "dense": [(".weight", ".weight"), (".bias", ".bias")],
          "ln": [(".LayerNorm.weight", ".LayerNorm.weight"), (".LayerNorm.bias", ".LayerNorm.bias")],
          "bias": [(".bias", ".bias")]}
# pytorch-pretrained-bert's LayerNorm spelling; read only (rows after the modern ones)
OLD_PARAMS = {"embedding": [], "dense": [], "bias": [],
              "ln": [(".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias")]}
TABLE = Table(spell(str, PARAMS) + spell(str, OLD_PARAMS))

# Tensors HF files hold that bert_of does not: name -> what they are.
DECODER_W = "cls.predictions.decoder.weight"  # tied to the word embeddings
DECODER_B = "cls.predictions.decoder.bias"  # the same Parameter as cls.predictions.bias
POSITION_IDS = "bert.embeddings.position_ids"  # buffer: arange(max_position_embeddings)[None]
TOKEN_TYPE_IDS = "bert.embeddings.token_type_ids"  # buffer: zeros
MLM_BIAS = "cls.predictions.bias"
BARE_ROOTS = ("embeddings.", "encoder.", "pooler.")

# HF classes bert_of computes, by the head tensors present (canonical prefixes); pooler or not.
ARCH = {
    "pretraining": ("BertForPreTraining", True),
    "mlm": ("BertForMaskedLM", False),
    "nsp": ("BertForNextSentencePrediction", True),
    "qa": ("BertForQuestionAnswering", False),
    "classifier": ("BertForSequenceClassification", True),
    "token": ("BertForTokenClassification", False),  # classifier.* on every position (config.classifier_kind)
    "bare": ("BertModel", True),
}
# HF class -> bert_of's config.classifier_kind, for the classes whose classifier.* bert_of computes.
CLASSIFIER_KIND = {"BertForSequenceClassification": "sequence", "BertForTokenClassification": "token"}


def head_kind(names, config: BertConfig | None = None) -> str:
    names = set(names)
    mlm = any(n.startswith("cls.predictions.") for n in names)
    nsp = any(n.startswith("cls.seq_relationship.") for n in names)
    if mlm and nsp:
        return "pretraining"
    if mlm:
        return "mlm"
    if nsp:
        return "nsp"
    if any(n.startswith("qa_outputs.") for n in names):
        return "qa"
    if any(n.startswith("classifier.") for n in names):
        return "token" if config is not None and config.classifier_kind == "token" else "classifier"
    return "bare"
