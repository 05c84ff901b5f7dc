"""Hostile pretraining data (issue 44): each case as the reference tool (TensorFlow's Example
parser, h5py) reads it, or one `bert-of: error:` line, exit 1, nothing written.

The files are written here by bert_of's own framing (TFRecordWriter, encode_examples) with the
values an attacker or a buggy producer would put in them, and by h5py for HDF5."""

import gzip
import json
import os
import struct
import time
import zlib

import h5py
import numpy as np
import pytest

from bert_of import protobuf as pb
from bert_of.data.formats import (EXAMPLE_KINDS, GZIP_SNAPSHOT, TFRecordFile, TFRecordWriter, detect,
                                  encode_examples, masked_crc)
from bert_of.data.reader import FEATURES, PretrainingDataset, iter_dataset
from tests.conftest import error_lines, run_cli

R, S, P = 6, 16, 3


def _features(rng=None, r=R):
    rng = rng or np.random.default_rng(0)
    return {"input_ids": rng.integers(5, 50, (r, S)), "input_mask": np.ones((r, S), np.int64),
            "segment_ids": np.zeros((r, S), np.int64), "masked_lm_positions": np.tile([1, 2, 3], (r, 1)),
            "masked_lm_ids": rng.integers(5, 50, (r, P)), "masked_lm_weights": np.ones((r, P), np.float32),
            "next_sentence_labels": np.zeros((r, 1), np.int64)}


def _records(kinds=None, values=None, r=R, seed=0):
    feats = _features(np.random.default_rng(seed), r)
    kinds, values = kinds or {}, values or {}
    return encode_examples({k: (kinds.get(k, EXAMPLE_KINDS[k]), values.get(k, v)) for k, v in feats.items()})


def _write(d, records, name="part-00000.tfrecord", compress=False):
    os.makedirs(d, exist_ok=True)
    with TFRecordWriter(os.path.join(d, name), compress) as w:
        for rec in records:
            w.write(rec)
    return str(d)


def _one_line(r, needle):
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("bert-of: error: "), r.stderr
    assert "internal error" not in lines[0] and "Traceback" not in r.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


def _refused_everywhere(data, tmp_path, needle):
    """`data inspect --check`, `data convert` (every format) and `pretrain`: one line each, nothing written."""
    _one_line(run_cli("data", "inspect", data, "--check", check=False), needle)
    for fmt in ("ofrecord", "hdf5", "tfrecord"):
        out = tmp_path / f"out-{fmt}"
        _one_line(run_cli("data", "convert", data, "-o", out, "--format", fmt, check=False), needle)
        assert not out.exists()
    ds = pytest.raises(Exception, lambda: PretrainingDataset(data, 2, S, P, shuffle=False).validate())
    assert needle in str(ds.value)


def test_float_input_ids_are_refused_as_tensorflow_refuses_them(tmp_path):
    """7.7 in an input_ids float_list: TensorFlow's parser says "Data types don't match"; bert_of
    truncated it to 7 before."""
    ids = _features()["input_ids"].astype(np.float32) + 0.7
    data = _write(tmp_path / "d", _records({"input_ids": "float"}, {"input_ids": ids}))
    _refused_everywhere(data, tmp_path, "record 0: feature 'input_ids' is a float list, expected int64")


def test_integer_weights_and_a_feature_with_no_value_list_are_refused(tmp_path):
    data = _write(tmp_path / "w", _records({"masked_lm_weights": "int64"},
                                           {"masked_lm_weights": np.ones((R, P), np.int64)}))
    _refused_everywhere(data, tmp_path, "feature 'masked_lm_weights' is a int64 list, expected float")
    # a Feature message with no kind at all (written as width 0 before): the map entry for
    # segment_ids again, in a second Features message (protobuf merges them; the last entry wins)
    entry = b"\x0a\x0bsegment_ids\x12\x00"
    features = b"\x0a" + pb.varint(len(entry)) + entry
    data = _write(tmp_path / "e", [rec + b"\x0a" + pb.varint(len(features)) + features for rec in _records()])
    _refused_everywhere(data, tmp_path / "e2", "feature 'segment_ids' has no value list")


def test_bytes_ids_are_one_line_everywhere(tmp_path):
    """input_ids as a bytes_list (reached the internal-error fallback in data convert)."""
    values = b"".join(b"\x0a\x01" + bytes([65 + k]) for k in range(S))
    feature = b"\x0a" + pb.varint(len(values)) + values
    entry = b"\x0a\x09input_ids\x12" + pb.varint(len(feature)) + feature
    features = b"\x0a" + pb.varint(len(entry)) + entry
    data = _write(tmp_path / "b", [rec + b"\x0a" + pb.varint(len(features)) + features for rec in _records()])
    _refused_everywhere(data, tmp_path, "record 0: feature 'input_ids' is a bytes_list, expected numbers")


def test_a_uint64_id_is_not_wrapped_into_a_negative_one(tmp_path):
    """An int64 list holding 2^64 - 5 (a uint64 written by a producer): TensorFlow reads -5; data
    convert refused nothing and wrote -5 on; now the reader's value check refuses it everywhere."""
    recs = _records()
    big = 2 ** 64 - 5
    name = b"input_ids"
    values = pb.varint(big) * S
    int64_list = b"\x0a" + pb.varint(len(values)) + values
    feature = b"\x1a" + pb.varint(len(int64_list)) + int64_list
    entry = b"\x0a" + pb.varint(len(name)) + name + b"\x12" + pb.varint(len(feature)) + feature
    features = b"\x0a" + pb.varint(len(entry)) + entry
    data = _write(tmp_path / "u", [rec + b"\x0a" + pb.varint(len(features)) + features for rec in recs])
    _refused_everywhere(data, tmp_path, "input_ids has id -5 outside")


# --------------------------------------------------------------------------- gzip


def test_gzip_of_concatenated_members_reads_every_record_at_random(tmp_path):
    """`cat a.gz b.gz`: two members, more than two snapshots' worth of output; random and
    sequential reads give the records the plain file holds."""
    recs = _records(r=10000, seed=1)
    plain = _write(tmp_path / "plain", recs)
    half = len(recs) // 2
    d = tmp_path / "gz"
    d.mkdir()
    blobs = []
    for part in (recs[:half], recs[half:]):
        _write(tmp_path / "one", part, name="x.tfrecord", compress=True)
        blobs.append((tmp_path / "one" / "x.tfrecord").read_bytes())
    (d / "part-00000.tfrecord.gz").write_bytes(b"".join(blobs))
    with TFRecordFile(str(d / "part-00000.tfrecord.gz")) as g, \
            TFRecordFile(os.path.join(plain, "part-00000.tfrecord")) as f:
        assert len(g) == len(f) == 10000
        assert int(g.offsets[-1] + g.lengths[-1]) > 2 * GZIP_SNAPSHOT and len(g._gz.snaps) >= 3
        order = np.random.default_rng(0).permutation(len(f))
        assert all(g.raw(int(i)) == f.raw(int(i)) for i in order[:200])
        assert all(g.raw(i) == f.raw(i) for i in range(len(f)))
    a = [r["input_ids"] for r in iter_dataset(str(d))]
    b = [r["input_ids"] for r in iter_dataset(plain)]
    assert len(a) == len(b) == 10000 and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_gzip_bomb_fails_at_frame_0_without_inflating_it(tmp_path):
    """4 GiB of zeros (4.2 MB of gzip): frame 0's length CRC does not match; refused after the
    first piece, nothing staged anywhere (no temp file: tempfile is not used)."""
    d = tmp_path / "bomb"
    d.mkdir()
    member = gzip.compress(bytes(1 << 24), 9)  # 16 MiB of zeros; 256 members concatenated
    (d / "part-00000.tfrecord.gz").write_bytes(member * 256)
    assert os.path.getsize(d / "part-00000.tfrecord.gz") < 5_000_000
    t = time.perf_counter()
    _one_line(run_cli("data", "inspect", d, check=False), "record 0 (byte 0) is corrupt: the length's CRC")
    assert time.perf_counter() - t < 10  # the refusal does not inflate 4 GiB (a minute here)


def test_gzip_of_valid_tiny_frames_beyond_the_ratio_is_refused(tmp_path):
    """Well-framed empty records deflate ~1000x: output is bounded at 64x the file."""
    frame = struct.pack("<Q", 0) + struct.pack("<I", masked_crc(struct.pack("<Q", 0))) + struct.pack("<I", masked_crc(b""))
    d = tmp_path / "frames"
    d.mkdir()
    (d / "part-00000.tfrecord.gz").write_bytes(gzip.compress(frame * (1 << 20), 9))  # 16 MiB, ~50 KB
    _one_line(run_cli("data", "inspect", d, check=False), "inflates beyond 4,194,304 bytes (64x the file)")


def test_gzip_damage_is_one_line(tmp_path):
    recs = _records(r=50)
    good = _write(tmp_path / "g", recs, name="part-00000.tfrecord.gz", compress=True)
    blob = open(os.path.join(good, "part-00000.tfrecord.gz"), "rb").read()
    for name, bad, needle in (("cut", blob[:len(blob) // 2], "gzip stream is corrupt or truncated"),
                              ("tail", blob + b"garbage!", "are not a gzip member"),
                              ("flip", blob[:40] + bytes([blob[40] ^ 0xFF]) + blob[41:], "gzip")):
        d = tmp_path / name
        d.mkdir()
        (d / "part-00000.tfrecord.gz").write_bytes(bad)
        _one_line(run_cli("data", "inspect", d, check=False), needle)


# --------------------------------------------------------------------------- HDF5


def _h5(path, n=R, userblock=0, declared=None):
    feats = _features(r=n)
    with h5py.File(path, "w", userblock_size=userblock) as f:
        for k, dt in (("input_ids", "i4"), ("input_mask", "i1"), ("segment_ids", "i1"),
                      ("masked_lm_positions", "i4"), ("masked_lm_ids", "i4")):
            if declared:
                f.create_dataset(k, shape=(declared, feats[k].shape[1]), dtype=dt, chunks=(1024, feats[k].shape[1]),
                                 compression="gzip")
                f[k][:n] = feats[k]
            else:
                f.create_dataset(k, data=feats[k].astype(dt), compression="gzip")
        if declared:
            f.create_dataset("next_sentence_labels", shape=(declared,), dtype="i1", chunks=(1024,), compression="gzip")
        else:
            f.create_dataset("next_sentence_labels", data=feats["next_sentence_labels"][:, 0].astype("i1"))


def test_an_hdf5_shard_with_a_user_block_is_hdf5(tmp_path):
    """h5py reads a file whose superblock is after a 512-byte user block; so does bert_of (it took
    the file for an OFRecord)."""
    d = tmp_path / "ub"
    d.mkdir()
    _h5(d / "part-00000.hdf5", userblock=512)
    assert open(d / "part-00000.hdf5", "rb").read(8) != b"\x89HDF\r\n\x1a\n"
    assert detect(str(d / "part-00000.hdf5")) == "hdf5"
    info = json.loads(run_cli("data", "inspect", d, "--check", "--json").stdout)
    assert info["format"] == "hdf5" and info["num_records"] == R and info["values_checked"]


def test_an_hdf5_shard_declaring_more_records_than_it_stores_is_refused(tmp_path):
    """10^8 records declared, 6 stored (chunks never written read as zeros in h5py): memory
    followed the declared count (2.9 GB); now the shard is refused at once."""
    d = tmp_path / "big"
    d.mkdir()
    _h5(d / "part-00000.hdf5", declared=10 ** 8)
    assert os.path.getsize(d / "part-00000.hdf5") < 1_000_000
    t = time.perf_counter()
    line = _one_line(run_cli("data", "inspect", d, "--check", check=False), "declares 100,000,000 records")
    assert "stores" in line and time.perf_counter() - t < 20


def test_an_hdf5_shard_whose_datasets_were_never_written_is_refused(tmp_path):
    """Contiguous datasets declared [10^6, 128] and never written (no storage allocated): h5py
    reads 10^6 zero records from a file of a few KB; refused."""
    d = tmp_path / "unwritten"
    d.mkdir()
    with h5py.File(d / "part-00000.hdf5", "w") as f:
        for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
            f.create_dataset(k, shape=(10 ** 6, 128), dtype="i4")
        f.create_dataset("next_sentence_labels", shape=(10 ** 6,), dtype="i1")
    assert os.path.getsize(d / "part-00000.hdf5") < 100_000
    _one_line(run_cli("data", "inspect", d, check=False),
              "dataset 'input_ids' declares 1,000,000 records but stores nothing")
