"""BERT pretraining data: text -> OFRecord part files -> per-rank batches.

* :mod:`bert_of.data.create_pretraining` — google-research/bert's ``create_pretraining_data.py``
  semantics (documents, sentence pairs, 50% random next, masking 80/10/10, whole-word
  masking), parallel over input files, deterministic for any number of workers.
* :mod:`bert_of.data.ofrecord` — OFRecord files read and written in pure Python + NumPy
  (byte-identical to protobuf's serialization; no OneFlow import).
* :mod:`bert_of.data.reader` — :class:`PretrainingDataset`: each data-parallel rank reads
  its own parts, shuffled from ``(seed, epoch, rank)``, resumable with ``state_dict``;
  :class:`OneFlowPretrainingReader` reads the same files through ``flow.nn.OFRecordReader``.
* :mod:`bert_of.data.cli` — ``bert-of data create-pretraining | inspect | reshard``.

Nothing here imports OneFlow except :class:`OneFlowPretrainingReader`.
"""

_LAZY = {
    "PretrainingDataset": "bert_of.data.reader",
    "OneFlowPretrainingReader": "bert_of.data.reader",
    "create_pretraining_data": "bert_of.data.create_pretraining",
    "PretrainingOptions": "bert_of.data.create_pretraining",
    "iter_records": "bert_of.data.ofrecord",
    "encode_record": "bert_of.data.ofrecord",
    "decode_record": "bert_of.data.ofrecord",
    "OFRecordWriter": "bert_of.data.ofrecord",
    "OFRecordError": "bert_of.data.ofrecord",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bert_of.data' has no attribute {name!r}")
