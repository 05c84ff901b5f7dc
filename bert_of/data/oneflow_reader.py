"""A pretraining dataset of OFRecord parts read through OneFlow's own ``nn.OFRecordReader``
(the same shard and, unshuffled, the same records as :class:`bert_of.data.reader.PretrainingDataset`),
every batch range-checked by :func:`bert_of.data.reader.check_batch` before OneFlow's kernels see it.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .layout import list_part_files, read_meta, shard_parts
from .ofrecord import OFRecordError
from .reader import DEFAULT_TYPE_VOCAB_SIZE, FEATURES, check_batch

__all__ = ["OneFlowPretrainingReader"]


class OneFlowPretrainingReader:
    """The same dataset through OneFlow's own ``nn.OFRecordReader`` + ``nn.OFRecordRawDecoder``.

    In a multi-process run (``world_size > 1``) or with a ``placement``, the reader is
    global (``sbp=split(0)``, global batch = ``batch_size`` x ranks): OneFlow gives each
    rank a contiguous block of parts, the same shard as :class:`PretrainingDataset`'s
    default. With ``shuffle=False`` both yield the same records in the same order.
    With ``shuffle=True`` OneFlow shuffles with its own buffer (not reproducible by
    the NumPy reader, and not resumable).
    """

    def __init__(self, data_dir: str, batch_size: int, seq_length: int, max_predictions: int,
                 shuffle: bool = False, seed: int = 0, placement=None, *, vocab_size: Optional[int] = None,
                 type_vocab_size: Optional[int] = None):
        from bert_of._flow import flow

        paths, suffix = list_part_files(data_dir)
        meta_vocab = ((read_meta(data_dir) or {}).get("vocab") or {}).get("size")
        self.data_dir, self.seq_length = data_dir, seq_length
        self.vocab_size = vocab_size or (meta_vocab if isinstance(meta_vocab, int) else None)
        self.type_vocab_size = type_vocab_size or DEFAULT_TYPE_VOCAB_SIZE
        self.flow = flow
        world = flow.env.get_world_size()
        if placement is None and world > 1:
            placement = flow.placement("cpu", ranks=list(range(world)))
        self.placement = placement
        kw = {}
        n_ranks = 1
        if placement is not None:
            n_ranks = len(placement.ranks)
            shard_parts(len(paths), 0, n_ranks)  # the same "not enough parts" error
            kw = dict(placement=placement, sbp=flow.sbp.split(0))
        self.reader = flow.nn.OFRecordReader(
            data_dir, batch_size=batch_size * n_ranks, data_part_num=len(paths), part_name_prefix="part-",
            part_name_suffix_length=suffix, random_shuffle=shuffle, shuffle_after_epoch=shuffle,
            random_seed=seed if shuffle else -1, **kw)
        self.decoders = {}
        for name, (dtype, length) in FEATURES.items():
            n = seq_length if length == "seq" else max_predictions if length == "pred" else 1
            fdtype = flow.float32 if dtype == np.float32 else flow.int32
            self.decoders[name] = flow.nn.OFRecordRawDecoder(name, shape=(n,), dtype=fdtype)

    def next_tensors(self) -> dict:
        """The next batch as OneFlow tensors (global split(0) when placed), int32/float32, after
        this rank's rows passed :func:`check_batch` (a bad value never reaches a OneFlow kernel)."""
        records = self.reader()
        tensors = {name: dec(records) for name, dec in self.decoders.items()}
        local = {name: (t.to_local() if t.is_global else t).numpy() for name, t in tensors.items()}
        bad = check_batch(local, self.seq_length, self.vocab_size, self.type_vocab_size)
        if bad is not None:  # OneFlow's reader does not say which record this was
            raise OFRecordError(f"{self.data_dir}: a record read by OneFlow's reader: {bad[1]} "
                                f"(`bert-of data inspect --check {self.data_dir}` names it)")
        return tensors

    def next_batch(self) -> Dict[str, np.ndarray]:
        """This rank's rows of the next batch, as :meth:`PretrainingDataset.next_batch` returns them."""
        out = {}
        for name, t in self.next_tensors().items():
            arr = (t.to_local() if t.is_global else t).numpy()
            out[name] = arr.astype(FEATURES[name][0], copy=False)
        out["next_sentence_labels"] = out["next_sentence_labels"].reshape(-1)
        return out
