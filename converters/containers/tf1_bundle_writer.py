"""Write a TensorFlow "TensorBundle" checkpoint (``PREFIX.index`` + ``PREFIX.data-00000-of-00001``)
and the directory's ``checkpoint`` state file, without TensorFlow.

The index is the one TF writes for the same tensors, byte for byte (converters/containers/sstable.py lays out
the table, converters/containers/tf1_bundle_proto.py encodes the entries); converters/containers/tf1_bundle.py reads it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

import numpy as np

from bert_of.errors import CheckpointError
from bert_of.files.atomic import atomic_write, fsync_dir, writes_to
from bert_of.converters.containers import sstable
from bert_of.converters.containers.sstable import build_table
from bert_of.converters.containers.tf1_bundle import data_path
from bert_of.converters.containers.tf1_bundle_proto import DT_STRING, HEADER_ONE_SHARD, enc_entry, enum_of_dtype, string_entry

__all__ = ["write_bundle"]


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _write_state_file(d: str, name: str) -> None:
    atomic_write(os.path.join(d, "checkpoint"),
                 f"model_checkpoint_path: {_quote(name)}\nall_model_checkpoint_paths: {_quote(name)}\n")


def write_bundle(prefix, tensors, write_state_file: bool = True) -> None:
    """Write ``PREFIX.index`` + ``PREFIX.data-00000-of-00001`` that TensorFlow loads.

    ``tensors`` is a dict or an iterable of (name, array or bytes: a string scalar); each array is written
    and dropped before the next is requested, so a generator keeps peak memory at
    about one tensor.  Both files are built under temporary names and renamed
    (index last) only when complete; on failure nothing loadable is left behind.
    With ``write_state_file`` the directory's ``checkpoint`` file is pointed at
    this prefix so ``tf.train.latest_checkpoint(dir)`` finds it.
    """
    prefix = os.fspath(prefix)
    d = os.path.dirname(prefix) or "."
    base = os.path.basename(prefix)
    if not base:
        raise CheckpointError(f"{prefix}: checkpoint prefix must name a file, not a directory")
    os.makedirs(d, exist_ok=True)
    final_data = data_path(prefix, 0, 1)
    final_index = prefix + ".index"
    items = tensors.items() if isinstance(tensors, Mapping) else tensors

    temps: list[str] = []
    data_renamed = False
    try:
        with writes_to(final_data):
            fd, data_tmp = tempfile.mkstemp(dir=d, prefix=f".{base}.data.", suffix=".tmp")
        temps.append(data_tmp)
        records: dict[bytes, bytes] = {}
        offset = 0
        with writes_to(final_data), os.fdopen(fd, "wb") as f:
            for name, arr in items:
                if not isinstance(name, str) or not name or name[0] == "\x00":
                    raise CheckpointError(f"{final_index}: invalid tensor name {name!r} (must be a non-empty string)")
                key = name.encode("utf-8", "surrogateescape")
                if key in records:
                    raise CheckpointError(f"{final_index}: duplicate tensor name {name!r}")
                if isinstance(arr, bytes):  # a string scalar (a TF2 object graph)
                    raw, crc = string_entry(arr)
                    f.write(raw)
                    records[key] = enc_entry(DT_STRING, (), offset, len(raw), crc)
                    offset += len(raw)
                    continue
                arr = np.asarray(arr)
                dt_enum = enum_of_dtype(arr.dtype)
                if dt_enum is None:
                    raise CheckpointError(f"{final_index}: tensor {name!r} has unsupported dtype {arr.dtype}")
                if arr.dtype.byteorder == ">":
                    arr = arr.astype(arr.dtype.newbyteorder("<"))
                shape = arr.shape
                if not arr.flags.c_contiguous:
                    arr = arr.copy(order="C")
                raw = arr.reshape(-1).view(np.uint8)
                f.write(raw)
                records[key] = enc_entry(dt_enum, shape, offset, raw.nbytes, sstable.mask(sstable.crc(raw)))
                offset += raw.nbytes
                del arr, raw
            f.flush()
            os.fsync(f.fileno())

        table = build_table([(b"", HEADER_ONE_SHARD)] + sorted(records.items()))
        with writes_to(final_index):
            fd, index_tmp = tempfile.mkstemp(dir=d, prefix=f".{base}.index.", suffix=".tmp")
            temps.append(index_tmp)
            with os.fdopen(fd, "wb") as f:
                f.write(table)
                f.flush()
                os.fsync(f.fileno())

        # Drop any old index first: an old index next to new data must never load.
        if os.path.lexists(final_index):
            os.unlink(final_index)
        os.replace(data_tmp, final_data)
        data_renamed = True
        os.replace(index_tmp, final_index)
        data_renamed = False
        temps.clear()
        fsync_dir(d)
    except BaseException:
        for t in temps:
            if os.path.exists(t):
                os.unlink(t)
        if data_renamed and os.path.exists(final_data):
            os.unlink(final_data)
        raise
    if write_state_file:
        _write_state_file(d, base)
