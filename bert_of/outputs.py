"""What the models' forwards return, and the losses their heads compute.

Losses are Google's where Google defines them (modeling.py / run_pretraining.py / run_squad.py /
run_classifier.py) and are global-tensor safe: with parameters broadcast and a batch split(0)
they create no constant and slice nothing; a partial-sum / partial-sum division gets a
broadcast denominator.

Shapes: B batch, S sequence, P max predictions per sequence, H hidden, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Optional

from bert_of._flow import flow

# --------------------------------------------------------------------------- outputs


@dataclass
class BertModelOutput:
    """What a forward returns. Fields a model does not compute stay None.

    Attribute names are bert_of's (Google's) and, where they differ, also transformers'
    (``last_hidden_state``, ``pooler_output``). ``out[i]`` / ``out.to_tuple()`` follow
    transformers' order for the model's output class (loss first when there is one), skipping
    None as transformers does; ``out["name"]`` reads a field by either name, ``keys()`` /
    ``items()`` / ``in`` use transformers' names (iterating stays the tuple's values).
    """

    sequence_output: Optional[object] = None  # [B, S, H]
    pooled_output: Optional[object] = None  # [B, H]
    prediction_logits: Optional[object] = None  # [B, S, V] (or [B, P, V] at masked_lm_positions)
    seq_relationship_logits: Optional[object] = None  # [B, 2]
    start_logits: Optional[object] = None  # [B, S]
    end_logits: Optional[object] = None  # [B, S]
    logits: Optional[object] = None  # [B, num_labels]
    loss: Optional[object] = None  # scalar, when the labels were passed
    mlm_loss: Optional[object] = None  # pretraining: the parts of the loss, and accuracies
    nsp_loss: Optional[object] = None
    mlm_acc: Optional[object] = None
    nsp_acc: Optional[object] = None
    # with output_hidden_states: the embeddings' output and each layer's, L + 1 tensors [B, S, H]
    # (the last is sequence_output); with output_attentions: each layer's probabilities [B, N, S, S]
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None

    # transformers' BaseModelOutputWithPooling
    _order: ClassVar[tuple] = ("sequence_output", "pooled_output", "hidden_states", "attentions")

    @property
    def last_hidden_state(self):
        return self.sequence_output

    @property
    def pooler_output(self):
        return self.pooled_output

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to_tuple(self) -> tuple:
        return tuple(getattr(self, k) for k in self._order if getattr(self, k) is not None)

    def __getitem__(self, key):
        if isinstance(key, str):
            name = HF_NAMES.get(key, key)
            if name not in OUTPUT_NAMES or getattr(self, name) is None:
                raise KeyError(key)
            return getattr(self, name)
        return self.to_tuple()[key]

    def __contains__(self, key) -> bool:
        return key in self.keys() or key in self.to_dict()

    def keys(self) -> list:
        """transformers' names of the outputs present, in its order (``last_hidden_state``, ...)."""
        return [_HF_NAME.get(k, k) for k in self._order if getattr(self, k) is not None]

    def values(self) -> list:
        return list(self.to_tuple())

    def items(self) -> list:
        return list(zip(self.keys(), self.values()))


class PreTrainingOutput(BertModelOutput):
    _order = ("loss", "prediction_logits", "seq_relationship_logits", "hidden_states", "attentions")


class MaskedLMOutput(BertModelOutput):
    """transformers' MaskedLMOutput: its ``logits`` are bert_of's ``prediction_logits`` (the same
    tensor, under both names; ``to_dict`` lists it once, as ``prediction_logits``)."""

    _order = ("loss", "prediction_logits", "hidden_states", "attentions")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.logits is None:
            self.logits = self.prediction_logits

    def to_dict(self) -> dict:
        d = super().to_dict()
        if d.get("logits") is d.get("prediction_logits"):
            d.pop("logits", None)
        return d

    def keys(self) -> list:
        return ["logits" if k == "prediction_logits" else k for k in super().keys()]


class QuestionAnsweringOutput(BertModelOutput):
    _order = ("loss", "start_logits", "end_logits", "hidden_states", "attentions")


class SequenceClassifierOutput(BertModelOutput):
    _order = ("loss", "logits", "hidden_states", "attentions")


OUTPUT_NAMES = tuple(f.name for f in fields(BertModelOutput))
# transformers' names of the fields it names otherwise
HF_NAMES = {"last_hidden_state": "sequence_output", "pooler_output": "pooled_output"}
_HF_NAME = {v: k for k, v in HF_NAMES.items()}
# The scalars a training step reports, loss first.
SCALAR_OUTPUTS = ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc")


# --------------------------------------------------------------------------- losses


def masked_lm_loss(prediction_logits, masked_lm_ids, masked_lm_weights, ddp_world: int = 1) -> tuple:
    """Google's MLM loss and accuracy: sum(w * nll) / (sum(w) + 1e-5) over the masked positions.

    prediction_logits [B, P, V], masked_lm_ids int64 [B, P], masked_lm_weights float [B, P] ->
    (loss, accuracy) scalars. ddp_world > 1 (eager DDP, local tensors): the denominator is the
    weight sum over ALL ranks divided by the rank count, so the mean of the ranks' losses (and
    gradients) equals the loss over the global batch even when ranks hold different numbers of
    real predictions. With global tensors the denominator is made broadcast (a partial-sum /
    partial-sum division is not supported).
    """
    V = prediction_logits.shape[-1]
    nll = flow.nn.functional.cross_entropy(prediction_logits.reshape(-1, V), masked_lm_ids.reshape(-1),
                                           reduction="none")  # [B*P]
    w = masked_lm_weights.reshape(-1)
    if ddp_world > 1:
        total = w.sum().detach().clone()
        flow.comm.all_reduce(total)
        denom = (total + 1e-5) / ddp_world
    else:
        denom = w.sum() + 1e-5
    if denom.is_global:
        denom = denom.to_global(sbp=flow.sbp.broadcast)
    loss = (w * nll).sum() / denom
    hit = (prediction_logits.argmax(dim=-1).reshape(-1) == masked_lm_ids.reshape(-1)).to(w.dtype)
    return loss, (w * hit).sum() / denom


def next_sentence_loss(seq_relationship_logits, next_sentence_labels) -> tuple:
    """seq_relationship_logits [B, 2], next_sentence_labels int64 [B] (or [B, 1]) -> (mean nll, accuracy)."""
    labels = next_sentence_labels.reshape(-1)
    loss = flow.nn.functional.cross_entropy(seq_relationship_logits, labels)
    acc = (seq_relationship_logits.argmax(dim=-1) == labels).to(flow.float32).mean()
    return loss, acc


def pretraining_loss(prediction_logits, seq_relationship_logits, masked_lm_ids, masked_lm_weights,
                     next_sentence_labels, ddp_world: int = 1) -> dict:
    """Google's pretraining loss, MLM + NSP (see :func:`masked_lm_loss`) -> dict of scalars
    (loss, mlm_loss, nsp_loss, mlm_acc, nsp_acc)."""
    mlm, mlm_acc = masked_lm_loss(prediction_logits, masked_lm_ids, masked_lm_weights, ddp_world)
    nsp, nsp_acc = next_sentence_loss(seq_relationship_logits, next_sentence_labels)
    return {"loss": mlm + nsp, "mlm_loss": mlm, "nsp_loss": nsp, "mlm_acc": mlm_acc, "nsp_acc": nsp_acc}
