"""The task heads on :class:`~bert_of.modeling.BertModel`, as Google's and transformers' scopes.

One class per checkpoint scope, as in :mod:`bert_of.modeling`: ``cls.predictions.*`` (the MLM
head, its decoder the word embedding matrix, tied), ``cls.seq_relationship.*`` (next sentence),
``qa_outputs.*`` (SQuAD spans), ``classifier.*`` (a sequence or token classifier). Given labels,
a head also computes its loss (transformers-style; the losses and output classes are in
:mod:`bert_of.outputs`), so one trainer serves every task. :func:`model_class_for` picks the
class a checkpoint's canonical names describe.

Shapes: B batch, S sequence, H hidden, V vocab, P predicted positions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from bert_of._flow import LayerNorm, flow
from bert_of.config import BertConfig
from bert_of.errors import ConfigError
from bert_of.inputs import (IGNORE_INDEX, as_input, check_classifier_targets, check_pretraining_targets,
                            check_span_targets)
from bert_of.model_io import PreTrained, placed_like, to_local_full
from bert_of.modeling import ACT_FN, BertModel
from bert_of.outputs import (MaskedLMOutput, PreTrainingOutput, QuestionAnsweringOutput, SequenceClassifierOutput,
                             masked_lm_loss, next_sentence_loss)

nn = flow.nn


class _WithBert(PreTrained):
    _ckpt_prefix = ""
    state_name = BertModel.state_name  # pre-LN's LayerNorms spelled as BertModel spells them

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)

    @property
    def base_model(self) -> BertModel:
        """The BertModel under the head (transformers' name)."""
        return self.bert

    @property
    def dropout_generator(self):
        """The generator of every dropout, the heads' too (see :class:`BertModel`)."""
        return self.bert.dropout_generator


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT_FN[config.hidden_act]
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.head_eps)

    def forward(self, hidden):
        return self.LayerNorm(self.act(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    """MLM head; its decoder is the word embedding matrix (tied, not a copy)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(flow.zeros(config.vocab_size))

    def resize_vocab(self, n: int, mean_resizing: bool = True) -> None:
        """The bias [n] for a word table of ``n`` rows (:meth:`PreTrained.resize_token_embeddings`):
        its first entries kept; new ones the old bias' mean with ``mean_resizing`` (transformers
        draws them from N(mean, (1e-9 std)^2): the mean itself in float32), else 0 (its init)."""
        keep = to_local_full(self.bias.detach()).numpy()[:n]
        if n > keep.shape[0]:
            fill = keep.mean(dtype=np.float64) if mean_resizing else 0.0
            keep = np.concatenate([keep, np.full(n - keep.shape[0], fill, keep.dtype)])
        self.bias = nn.Parameter(placed_like(keep, self.bias), requires_grad=self.bias.requires_grad)

    def forward(self, hidden, word_embeddings):
        """hidden [B, S, H] (or [M, H]), word_embeddings [V, H] -> logits [..., V]."""
        h = self.transform(hidden)
        return flow.matmul(h, word_embeddings, transpose_b=True) + self.bias


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output, word_embeddings):
        return self.predictions(sequence_output, word_embeddings), self.seq_relationship(pooled_output)


class BertForPreTraining(_WithBert):
    """BertModel + MLM head (tied to word embeddings) + next-sentence head."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.cls = BertPreTrainingHeads(config)

    def forward(self, input_ids=None, token_type_ids=None, attention_mask=None, masked_lm_positions=None,
                masked_lm_ids=None, masked_lm_weights=None, next_sentence_labels=None, labels=None,
                next_sentence_label=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, ddp_world: int = 1, *, position_ids=None,
                head_mask=None, inputs_embeds=None) -> PreTrainingOutput:
        """int64 [B, S] inputs -> sequence [B,S,H], pooled [B,H], MLM logits, NSP logits [B,2].

        MLM logits are [B, S, V], or [B, P, V] at ``masked_lm_positions`` (int64 [B, P]) as in
        pretraining, where the V-wide head runs on P << S rows. Labels make it compute Google's
        loss (:func:`pretraining_loss`): ``masked_lm_ids`` int64 and ``masked_lm_weights`` float
        (default all 1), shaped like the logits' rows ([B, P] or [B, S]); ``next_sentence_labels``
        int64 [B]. transformers' spellings work too: ``labels`` (-100 = not predicted, i.e.
        weight 0) and ``next_sentence_label``. ``loss`` is MLM + NSP (or the one given).
        ``ddp_world``: under eager DDP over N ranks with local tensors, N: the MLM denominator is
        the weight sum over all ranks / N, so the mean of the ranks' losses is the global-batch loss.
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        position_ids=position_ids, head_mask=head_mask, inputs_embeds=inputs_embeds)
        like = self.bert.embeddings.word_embeddings.weight
        masked_lm_positions, masked_lm_ids, labels, next_sentence_labels, next_sentence_label = (
            as_input(x, n, like, ids=False) for x, n in ((masked_lm_positions, "masked_lm_positions"),
                                                         (masked_lm_ids, "masked_lm_ids"), (labels, "labels"),
                                                         (next_sentence_labels, "next_sentence_labels"),
                                                         (next_sentence_label, "next_sentence_label")))
        if masked_lm_weights is not None and not isinstance(masked_lm_weights, flow.Tensor):
            masked_lm_weights = as_input(np.asarray(masked_lm_weights, np.float32), "masked_lm_weights", like,
                                         ids=False)  # float even when written as 1s and 0s
        check_pretraining_targets(self.config, *out.sequence_output.shape[:2], masked_lm_positions, masked_lm_ids,
                                  masked_lm_weights, labels, next_sentence_labels if next_sentence_label is None
                                  else next_sentence_label)
        hidden = out.sequence_output
        if masked_lm_positions is not None:
            hidden = flow.batch_gather(hidden, masked_lm_positions)  # [B, P, H], keeps split(0)
        pred, nsp = self.cls(hidden, out.pooled_output, self.bert.embeddings.word_embeddings.weight)
        res = PreTrainingOutput(sequence_output=out.sequence_output, pooled_output=out.pooled_output,
                                prediction_logits=pred, seq_relationship_logits=nsp,
                                hidden_states=out.hidden_states, attentions=out.attentions)
        if labels is not None:
            if masked_lm_ids is not None:
                raise ConfigError("pass masked_lm_ids (+ masked_lm_weights) or labels, not both")
            keep = labels.ne(-100)
            masked_lm_ids, masked_lm_weights = labels * keep.to(labels.dtype), keep.to(flow.float32)
        if next_sentence_label is not None:
            next_sentence_labels = next_sentence_label
        if masked_lm_ids is not None:
            if masked_lm_weights is None:
                masked_lm_weights = flow.ones_like(masked_lm_ids).to(flow.float32)
            res.mlm_loss, res.mlm_acc = masked_lm_loss(pred, masked_lm_ids, masked_lm_weights, ddp_world)
        if next_sentence_labels is not None:
            res.nsp_loss, res.nsp_acc = next_sentence_loss(nsp, next_sentence_labels)
        if res.mlm_loss is not None and res.nsp_loss is not None:
            res.loss = res.mlm_loss + res.nsp_loss
        else:
            res.loss = res.mlm_loss if res.mlm_loss is not None else res.nsp_loss
        return res if return_dict is None or return_dict else res.to_tuple()


class BertOnlyMLMHead(nn.Module):
    """``cls`` with the MLM head only (HF's ``BertOnlyMLMHead``: ``cls.predictions.*``)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, sequence_output, word_embeddings):
        return self.predictions(sequence_output, word_embeddings)


class BertForMaskedLM(_WithBert):
    """BertModel + MLM head (tied to word embeddings), no next-sentence head: transformers'
    ``BertForMaskedLM``, a Model Garden ``BertPretrainerV2`` with no classification heads.

    transformers builds this class without a pooler; bert_of's BertModel keeps one (a source
    without it is read with a zero pooler, which the MLM head never reads), so ``pooled_output``
    is what the checkpoint's pooler computes, or tanh(0) = 0.
    """

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.cls = BertOnlyMLMHead(config)

    def forward(self, input_ids=None, token_type_ids=None, attention_mask=None, labels=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, *, position_ids=None, head_mask=None,
                inputs_embeds=None) -> MaskedLMOutput:
        """int64 [B, S] inputs -> prediction_logits [B, S, V] (transformers' ``logits``, the same
        tensor) plus sequence [B, S, H] / pooled [B, H].

        With ``labels`` (int64 [B, S], token ids in [0, V), IGNORE_INDEX -100 where not predicted)
        also transformers' loss: the mean cross-entropy over the labelled positions (no +1e-5 in
        the denominator, unlike pretraining's; no labelled position gives NaN, as in transformers).
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        position_ids=position_ids, head_mask=head_mask, inputs_embeds=inputs_embeds)
        word = self.bert.embeddings.word_embeddings.weight
        labels = as_input(labels, "labels", word, ids=False)
        check_pretraining_targets(self.config, *out.sequence_output.shape[:2], labels=labels)
        pred = self.cls(out.sequence_output, word)
        res = MaskedLMOutput(sequence_output=out.sequence_output, pooled_output=out.pooled_output,
                             prediction_logits=pred, hidden_states=out.hidden_states, attentions=out.attentions)
        if labels is not None:
            V = self.config.vocab_size
            res.loss = flow.nn.functional.cross_entropy(pred.reshape(-1, V), labels.reshape(-1),
                                                        ignore_index=IGNORE_INDEX)
        return res if return_dict is None or return_dict else res.to_tuple()


class BertForQuestionAnswering(_WithBert):
    """SQuAD span head on the sequence output (Google's ``cls/squad``)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids=None, token_type_ids=None, attention_mask=None, start_positions=None,
                end_positions=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, *, position_ids=None, head_mask=None,
                inputs_embeds=None) -> QuestionAnsweringOutput:
        """-> start_logits, end_logits [B, S] (plus sequence/pooled).

        With ``start_positions`` and ``end_positions`` (int64 [B]) also run_squad's loss
        (CE(start) + CE(end)) / 2 over all S positions.
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        position_ids=position_ids, head_mask=head_mask, inputs_embeds=inputs_embeds)
        like = self.qa_outputs.weight
        start_positions = as_input(start_positions, "start_positions", like, ids=False)
        end_positions = as_input(end_positions, "end_positions", like, ids=False)
        check_span_targets(*out.sequence_output.shape[:2], start_positions, end_positions)
        logits = self.qa_outputs(out.sequence_output)  # [B, S, 2]
        res = QuestionAnsweringOutput(sequence_output=out.sequence_output, pooled_output=out.pooled_output,
                                      start_logits=logits.narrow(2, 0, 1).squeeze(2),
                                      end_logits=logits.narrow(2, 1, 1).squeeze(2),
                                      hidden_states=out.hidden_states, attentions=out.attentions)
        if start_positions is not None and end_positions is not None:
            ce = flow.nn.functional.cross_entropy
            res.loss = (ce(res.start_logits, start_positions) + ce(res.end_logits, end_positions)) / 2.0
        return res if return_dict is None or return_dict else res.to_tuple()


class BertForSequenceClassification(_WithBert):
    """Classifier on the pooled output (Google's run_classifier ``output_weights``)."""

    def __init__(self, config: BertConfig):
        super().__init__(replace(config, classifier_kind="sequence") if config.classifier_kind != "sequence" else config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob, generator=self.bert.dropout_generator)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids=None, token_type_ids=None, attention_mask=None, labels=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, *, position_ids=None, head_mask=None,
                inputs_embeds=None) -> SequenceClassifierOutput:
        """-> logits [B, num_labels] (plus sequence/pooled).

        With ``labels`` also the loss: cross-entropy over int64 class ids [B]; for a one-output
        (regression, STS-B) head, the mean squared error to float targets [B]; with
        ``config.problem_type`` "multi_label_classification", the mean binary cross-entropy of the
        sigmoid to 0/1 targets [B, num_labels] (transformers' BCEWithLogitsLoss).
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        position_ids=position_ids, head_mask=head_mask, inputs_embeds=inputs_embeds)
        labels = as_input(labels, "labels", self.classifier.weight, ids=False)
        check_classifier_targets(self.config, "sequence", *out.sequence_output.shape[:2], labels)
        res = SequenceClassifierOutput(sequence_output=out.sequence_output, pooled_output=out.pooled_output,
                                       logits=self.classifier(self.dropout(out.pooled_output)),
                                       hidden_states=out.hidden_states, attentions=out.attentions)
        if labels is not None:
            if self.config.num_labels == 1:
                target = labels if labels.dtype == res.logits.dtype else labels.to(res.logits.dtype)
                diff = res.logits.reshape(-1) - target
                res.loss = (diff * diff).mean()
            elif self.config.problem_type == "multi_label_classification":
                target = labels if labels.dtype == res.logits.dtype else labels.to(res.logits.dtype)
                res.loss = flow.nn.functional.binary_cross_entropy_with_logits(res.logits, target)
            else:
                res.loss = flow.nn.functional.cross_entropy(res.logits, labels)
        return res if return_dict is None or return_dict else res.to_tuple()


class BertForTokenClassification(_WithBert):
    """A tag per token on the sequence output (HF's ``BertForTokenClassification``, same names)."""

    def __init__(self, config: BertConfig):
        super().__init__(replace(config, classifier_kind="token") if config.classifier_kind != "token" else config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob, generator=self.bert.dropout_generator)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids=None, token_type_ids=None, attention_mask=None, labels=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, *, position_ids=None, head_mask=None,
                inputs_embeds=None) -> SequenceClassifierOutput:
        """-> logits [B, S, num_labels] (plus sequence/pooled).

        With ``labels`` [B, S] (int64 tag ids, IGNORE_INDEX where no loss) also the mean
        cross-entropy over the labelled positions.
        """
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, output_attentions,
                        position_ids=position_ids, head_mask=head_mask, inputs_embeds=inputs_embeds)
        labels = as_input(labels, "labels", self.classifier.weight, ids=False)
        check_classifier_targets(self.config, "token", *out.sequence_output.shape[:2], labels)
        res = SequenceClassifierOutput(sequence_output=out.sequence_output, pooled_output=out.pooled_output,
                                       logits=self.classifier(self.dropout(out.sequence_output)),
                                       hidden_states=out.hidden_states, attentions=out.attentions)
        if labels is not None:
            k = self.config.num_labels
            res.loss = flow.nn.functional.cross_entropy(res.logits.reshape(-1, k), labels.reshape(-1),
                                                        ignore_index=IGNORE_INDEX)
        return res if return_dict is None or return_dict else res.to_tuple()


def model_class_for(names, config: Optional[BertConfig] = None) -> type:
    """The class whose parameters a checkpoint's canonical names describe; a ``classifier.*`` head
    is a token classifier when ``config.classifier_kind`` says so (the same names)."""
    names = set(names)
    mlm = any(n.startswith("cls.predictions.") for n in names)
    if mlm and any(n.startswith("cls.seq_relationship.") for n in names):
        return BertForPreTraining
    if mlm:
        return BertForMaskedLM
    if any(n.startswith("qa_outputs.") for n in names):
        return BertForQuestionAnswering
    if any(n.startswith("classifier.") for n in names):
        if config is not None and config.classifier_kind == "token":
            return BertForTokenClassification
        return BertForSequenceClassification
    return BertModel
