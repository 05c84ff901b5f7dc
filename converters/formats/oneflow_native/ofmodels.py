"""The eager/graph BERT of Oneflow-Inc/models (``NLP/BERT``) saved with ``flow.save(module.state_dict(), dir)``.

Its ``utils/checkpoint.py`` / ``run_squad.py`` save exactly the module's state dict (global tensors
with ``global_dst_rank`` 0: ``global_tensor_N/`` folders). Keys of ``modeling.py``'s
``BertForPreTraining`` are original BERT's scopes, plus:

- ``bert.embeddings.position_ids``: a buffer, int64 [1, max_position_embeddings] = 0..P-1 (its
  forward slices it to ``seq_length``): checked and dropped, written back;
- ``cls.predictions.output_bias`` [V]: the MLM bias (canonical ``cls.predictions.bias``). Its forward
  computes ``decoder(transform(x))`` where ``decoder.weight`` IS the word embedding Parameter
  (``clone_weights``) and ``decoder.bias`` IS ``output_bias`` (``self.decoder.bias = self.output_bias``):
  both keys are in the state dict, pickled as the same tensor (one folder); read as tied, checked
  equal, dropped, and written back tied;
- the SQuAD model (``squad.py``) keeps the backbone as ``bert.*`` and its head as ``cls_squad.*``
  (canonical ``qa_outputs``).

An older revision keeps the embeddings as bare Parameters (``bert.embeddings.word_embeddings``,
``bert.embeddings.position_embeddings``, ``bert.embeddings.tokentype_embeddings``, no ``.weight``)
and a top-level ``output_bias``: read too (written in the current layout).

Numerics by provenance: ``nn.GELU()`` (erf) in the encoder and, hard-wired, in the MLM head;
``nn.LayerNorm(hidden)`` everywhere, eps 1e-5; the mask ``(mask - 1) * 10000`` added to the
scores (bert_of's). Post-LN only: a pre-LN config is refused on write. The config is the
constructor's arguments (``vocab_size, seq_length, hidden_size, hidden_layers, atten_heads,
intermediate_size, ...``) as JSON/YAML, or any config bert_of reads (its numerics then replaced by
the models repo's); written folders get those arguments as ``config.json``.
"""

from __future__ import annotations

from bert_of.tensors import expected_shapes
from bert_of.converters.formats.oneflow_native import steps as native
from bert_of.converters.source import Source
from bert_of.converters.formats.oneflow_native.steps import BUFFER, PARAM, Layout
from bert_of.converters.reader import Hit
from bert_of.converters.descriptor import Format
from bert_of.converters.verify import reference_np
from bert_of.converters.formats.oneflow_native.config import ofmodels_args_of

NAME = "ofmodels"

WORD = "bert.embeddings.word_embeddings.weight"
MLM_BIAS = "cls.predictions.bias"
POSITION_IDS = "bert.embeddings.position_ids"
OUTPUT_BIAS = "cls.predictions.output_bias"
DECODER_W, DECODER_B = "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"
RENAMED = {OUTPUT_BIAS: MLM_BIAS, "cls_squad.weight": "qa_outputs.weight", "cls_squad.bias": "qa_outputs.bias",
           # the older revision's bare Parameters (read only)
           "bert.embeddings.word_embeddings": WORD,
           "bert.embeddings.position_embeddings": "bert.embeddings.position_embeddings.weight",
           "bert.embeddings.tokentype_embeddings": "bert.embeddings.token_type_embeddings.weight",
           "output_bias": MLM_BIAS}
_WRITE = {MLM_BIAS: OUTPUT_BIAS, "qa_outputs.weight": "cls_squad.weight", "qa_outputs.bias": "cls_squad.bias"}
_NOT_HERE = (MLM_BIAS, "qa_outputs.weight", "qa_outputs.bias", "classifier.weight", "classifier.bias")


def _classify(name, config):
    if name in RENAMED:
        return Hit(RENAMED[name])
    if name == POSITION_IDS:
        return Hit(kind="buffer", check=native.arange_check(config), note="buffer: position ids 0..P-1 (bert_of computes them)")
    if name == DECODER_W:
        return Hit(WORD, kind="tied", note="the MLM decoder's weight IS the word embeddings (clone_weights), equal")
    if name == DECODER_B:
        return Hit(MLM_BIAS, kind="tied", note="the MLM decoder's bias IS cls.predictions.output_bias, equal")
    if name in expected_shapes(config) and name not in _NOT_HERE:
        return Hit(name)
    return None


def _items(names, config, bare):
    canonical = [n for n in expected_shapes(config) if n != MLM_BIAS]
    # the models repo's BertLMPredictionHead registers output_bias before its transform
    canonical.insert(canonical.index("cls.predictions.transform.dense.weight"), MLM_BIAS)
    order = {n: i for i, n in enumerate(canonical)}
    have = sorted(names, key=lambda n: order.get(n, len(order)))
    pre = "" if bare else "bert."
    out = [(pre + "embeddings.position_ids", BUFFER, ("buffer", native.arange_buffer(config)))]
    for n in have:
        key = _WRITE.get(n, n)
        if bare:
            key = key[len("bert."):]
        out.append((key, PARAM, ("canonical", n, None)))
        if n == "cls.predictions.transform.LayerNorm.bias" and MLM_BIAS in names:
            # decoder.weight / decoder.bias come after the transform in the module's state dict
            out.append((DECODER_W, PARAM, ("tied", pre + "embeddings.word_embeddings.weight")))
            out.append((DECODER_B, PARAM, ("tied", OUTPUT_BIAS)))
    return out


def _write_notes(source: Source) -> list:
    """Where the models repo's BERT computes otherwise than this checkpoint."""
    notes = []
    c = source.config
    if c.hidden_act != "gelu_erf" or c.layer_norm_eps != 1e-5:
        notes.append(f"note: the models repo's BERT computes gelu_erf with LayerNorm eps 1e-05 (this checkpoint: "
                     f"{c.hidden_act}, eps {c.layer_norm_eps:g}); reading the folder back records its numerics")
    return notes + c.numerics_notes()


LAYOUT = Layout(NAME, ("embeddings", "encoder", "pooler"), _classify, _items, ofmodels_args_of,
                "Oneflow-Inc/models BERT (BertForPreTraining / BertModel / SQuAD)", write_notes=_write_notes)
detect, read, write_files = native.format_functions(LAYOUT)


FORMAT = Format(NAME, "Oneflow-Inc/models NLP/BERT state dict saved by flow.save (pickled_data + tensor_N/)",
                detect, read, write_files, reference_np.OfModels, owns=native.OWNS,
                records_numerics=True,  # the models repo's arguments, written beside
                dtypes=native.DTYPES)
