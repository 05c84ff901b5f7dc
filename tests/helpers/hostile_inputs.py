"""Small checkpoints in every format and the tools to break them, for test_hostile and the fuzz smoke.

Everything is generated with NumPy and bert_of's own writers (no TensorFlow, no torch): a tiny
BERT (2 layers, hidden 8) written as a bert_of directory, then converted to Google TF1, legacy lazy
OneFlow, HuggingFace safetensors and Keras h5; a ``pytorch_model.bin`` is assembled by hand
(``torch_zip``: the zip layout and pickle opcodes torch.save writes), so tests can also write the
pickles an attacker would.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zipfile

import numpy as np

from bert_of.checkpoint import write_checkpoint
from bert_of.tensors import expected_shapes
from bert_of.config import BertConfig
from bert_of.converters.containers import sstable, tf1_bundle, tf1_bundle_proto
from bert_of.converters.source import Options
from bert_of.converters.convert import convert

SMALL = BertConfig(vocab_size=13, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=6,
                   max_position_embeddings=10, type_vocab_size=2, hidden_act="gelu_erf", provenance="hf")
FORMATS = ("of", "tf", "lazy", "hf", "h5", "bin")


def write_vocab(path, n):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(n)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(words[:n]) + "\n")
    return str(path)


def small_state(config: BertConfig = SMALL, seed: int = 0, heads=("cls.",)) -> dict:
    """Canonical tensors of a BertForPreTraining of ``config`` (weights of realistic magnitude)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(config).items():
        if name.startswith("bert.") or name.startswith(heads):
            out[name] = (0.9 + 0.2 * rng.standard_normal(shape) if "LayerNorm.weight" in name
                         else 0.3 * rng.standard_normal(shape)).astype(np.float32)
    return out


def make_sources(root: str, config: BertConfig = SMALL) -> dict:
    """{format: path} of one small model in every format (``bin``: an HF dir with pytorch_model.bin)."""
    os.makedirs(root, exist_ok=True)
    vocab = write_vocab(os.path.join(root, "vocab.txt"), config.vocab_size)
    paths = {"of": os.path.join(root, "of")}
    write_checkpoint(paths["of"], list(small_state(config).items()), config, vocab)
    for fmt in ("tf", "lazy", "hf", "h5"):
        paths[fmt] = os.path.join(root, fmt)
        convert(f"of2{fmt}", paths["of"], paths[fmt], Options())
    for fmt in ("h5",):
        shutil.copy(vocab, os.path.join(paths[fmt], "vocab.txt"))
    paths["bin"] = os.path.join(root, "bin")
    os.makedirs(paths["bin"])
    shutil.copy(os.path.join(paths["hf"], "config.json"), paths["bin"])
    shutil.copy(vocab, paths["bin"])
    from safetensors.numpy import load_file

    hf = load_file(os.path.join(paths["hf"], "model.safetensors"))
    write_torch_zip(os.path.join(paths["bin"], "pytorch_model.bin"), contiguous_records(hf))
    return paths


# --------------------------------------------------------------------------- torch.save zips, by hand

_STORAGE = {np.dtype("<f4"): "FloatStorage", np.dtype("<i8"): "LongStorage", np.dtype("<i4"): "IntStorage",
            np.dtype("<f2"): "HalfStorage", np.dtype("<f8"): "DoubleStorage"}


def _global(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _str(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _int(n):
    if -2 ** 31 <= n < 2 ** 31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _tuple(items):
    return b"(" + b"".join(_int(i) if isinstance(i, int) else i for i in items) + b"t"


def _value(v):
    """A pickle of a plain value: int, str, None, tuple/list of those, dict of str to those."""
    if v is None:
        return b"N"
    if isinstance(v, bool):
        return b"\x88" if v else b"\x89"
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (tuple, list)):
        return b"(" + b"".join(_value(x) for x in v) + (b"t" if isinstance(v, tuple) else b"l")
    if isinstance(v, dict):
        return b"}(" + b"".join(_value(k) + _value(x) for k, x in v.items()) + b"u"
    raise TypeError(type(v))


def tensor_pickle(storage_type, key, numel, offset, size, stride, build=None) -> bytes:
    """``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`` as
    torch pickles it; ``build``: a state applied afterwards with a BUILD opcode (an attack)."""
    storage = b"(" + _str("storage") + _global("torch", storage_type) + _str(key) + _str("cpu") + _int(numel) + b"tQ"
    out = (_global("torch._utils", "_rebuild_tensor_v2") + b"(" + storage + _int(offset) + _tuple(size)
           + _tuple(stride) + b"\x89" + _global("collections", "OrderedDict") + b")R" + b"tR")
    if build is not None:
        out += _value(build) + b"b"
    return out


def state_dict_pickle(records) -> bytes:
    """records: [(name, tensor pickle bytes)] -> the pickle of an OrderedDict of them."""
    body = b"".join(_str(name) + t for name, t in records)
    return b"\x80\x02" + _global("collections", "OrderedDict") + b")R(" + body + b"u."


def contiguous_records(tensors: dict):
    """(pickle records, storages) of C-contiguous tensors, one storage each, as torch.save writes them."""
    records, storages = [], {}
    for i, (name, arr) in enumerate(tensors.items()):
        arr = np.ascontiguousarray(arr)
        stride = tuple(int(np.prod(arr.shape[k + 1:])) for k in range(arr.ndim))
        records.append((name, tensor_pickle(_STORAGE[arr.dtype], str(i), arr.size, 0, arr.shape, stride)))
        storages[str(i)] = arr.tobytes()
    return records, storages


def write_torch_zip(path, records_and_storages, pkl: bytes | None = None):
    records, storages = records_and_storages
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl if pkl is not None else state_dict_pickle(records))
        z.writestr("archive/byteorder", "little")
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
        z.writestr("archive/version", "3\n")


# --------------------------------------------------------------------------- editing files in place


def st_header(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return raw[8:8 + n].decode(), raw[8 + n:]


def st_write(path, header_text: str, data: bytes):
    h = header_text.encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


def st_edit(path, edit):
    """Rewrite a safetensors header: ``edit(dict) -> dict`` (or a str, written verbatim)."""
    text, data = st_header(path)
    new = edit(json.loads(text))
    st_write(path, new if isinstance(new, str) else json.dumps(new), data)


def tf_rewrite_index(prefix, edit):
    """Re-encode a TF checkpoint index with every block CRC valid: ``edit(name, fields) -> fields``,
    fields = dict(dtype_enum, shape, offset, size, crc), so only the entry's meaning changes."""
    entries = tf1_bundle._read_index_uncached(prefix)[0]
    enum = {v: k for k, v in tf1_bundle_proto._NUMERIC_DT.items()}
    items = []
    for name, e in entries.items():
        fields = dict(dtype_enum=enum.get(e.dtype, 1), shape=tuple(e.shape), offset=e.offset, size=e.size,
                      crc=e.crc32c or 0)
        fields = edit(name, fields)
        items.append((name.encode(), tf1_bundle_proto.enc_entry(fields["dtype_enum"], fields["shape"], fields["offset"],
                                                                  fields["size"], fields["crc"])))
    table = sstable.build_table([(b"", tf1_bundle_proto.HEADER_ONE_SHARD)] + sorted(items))
    with open(prefix + ".index", "wb") as f:
        f.write(table)


def copy_source(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return str(dst)
