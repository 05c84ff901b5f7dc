"""BERT pretraining data: text -> OFRecord part files -> per-rank batches.

* :mod:`bert_of.data.create_pretraining` — google-research/bert's ``create_pretraining_data.py``
  semantics (documents, sentence pairs, 50% random next, masking 80/10/10, whole-word
  masking), parallel over input files, deterministic for any number of workers; built on
  :mod:`bert_of.data.text` (text -> token-id corpus, bounded lines) and
  :mod:`bert_of.data.instances` (Google's instances as corpus ranges, assembled with NumPy) and
  :mod:`bert_of.data.pool` (the jobs on worker processes, results in order).
* :mod:`bert_of.data.ofrecord` — OFRecord files read and written in pure Python + NumPy
  (byte-identical to protobuf's serialization; no OneFlow import), many records at a time.
* :mod:`bert_of.data.layout` — a dataset's files in order, each rank's parts (OneFlow's
  sharding), its ``bert_of_data.json``; :func:`dataset_vocab` is the vocab.txt the data was made with.
* :mod:`bert_of.data.reader` — :class:`PretrainingDataset`: each data-parallel rank reads
  its own parts, shuffled from ``(seed, epoch, rank)``, resumable with ``state_dict``, every
  batch range-checked.
* :mod:`bert_of.data.oneflow_reader` — :class:`OneFlowPretrainingReader` reads the same files
  through ``flow.nn.OFRecordReader``.
* :mod:`bert_of.data.formats` — Google's TFRecord (``tf.train.Example``, plain/gzip, no TensorFlow)
  and NVIDIA's HDF5 shards beside OFRecord: detection by content, per-file readers and writers;
  :func:`iter_dataset` iterates any of the three as dicts of NumPy arrays (docs/data.md).
* :mod:`bert_of.data.cli` — ``bert-of data create-pretraining | inspect | reshard | convert``.

Nothing here imports OneFlow except :class:`OneFlowPretrainingReader`.
"""

_LAZY = {
    "PretrainingDataset": "bert_of.data.reader",
    "OneFlowPretrainingReader": "bert_of.data.oneflow_reader",
    "dataset_vocab": "bert_of.data.layout",
    "check_batch": "bert_of.data.reader",
    "create_pretraining_data": "bert_of.data.create_pretraining",
    "PretrainingOptions": "bert_of.data.create_pretraining",
    "iter_records": "bert_of.data.ofrecord",
    "encode_record": "bert_of.data.ofrecord",
    "encode_records": "bert_of.data.ofrecord",
    "decode_record": "bert_of.data.ofrecord",
    "OFRecordWriter": "bert_of.data.ofrecord",
    "OFRecordError": "bert_of.data.ofrecord",
    "iter_dataset": "bert_of.data.reader",
    "TFRecordFile": "bert_of.data.formats",
    "TFRecordWriter": "bert_of.data.formats",
    "HDF5File": "bert_of.data.formats",
    "HDF5Writer": "bert_of.data.formats",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bert_of.data' has no attribute {name!r}")
