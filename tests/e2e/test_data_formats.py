"""Pretraining data in three formats: OFRecord, Google's TFRecord (tf.train.Example) and NVIDIA's HDF5
shards, read by one reader and written by `data create-pretraining --format` / `data convert`.

The files are made by our own writers; TensorFlow (when installed) parses our TFRecords with Google's
feature spec, and we parse what TensorFlow's own writer makes. Loss curves of `bert-of pretrain` are
the same, bit for bit, on the same records in each format."""

import gzip
import json
import os
import shutil
import struct

import h5py
import numpy as np
import pytest

from bert_of.data.create_pretraining import PretrainingOptions, create_pretraining_data
from bert_of.data.formats import TFRecordFile, TFRecordWriter, masked_crc
from bert_of.data.reader import FEATURES, PretrainingDataset, iter_dataset
from bert_of import protobuf as pb
from tests.conftest import ROOT, error_lines, run_cli

TEXT = os.path.join(ROOT, "tests", "data", "text")
VOCAB = os.path.join(TEXT, "vocab.txt")
SEQ, PRED = 64, 10
CONFIG = {"vocab_size": 966, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu"}
# google-research/bert run_pretraining.py's input_fn feature spec
GOOGLE_SPEC = {"input_ids": ("int64", SEQ), "input_mask": ("int64", SEQ), "segment_ids": ("int64", SEQ),
               "masked_lm_positions": ("int64", PRED), "masked_lm_ids": ("int64", PRED),
               "masked_lm_weights": ("float32", PRED), "next_sentence_labels": ("int64", 1)}


def _data(*args, check=True):
    r = run_cli("data", *args, check=False, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"bert-of data {args} failed:\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The same records as OFRecord (made directly), TFRecord (create-pretraining --format tfrecord),
    HDF5 (converted from the TFRecords), gzip TFRecord and OFRecord again (converted from HDF5)."""
    root = tmp_path_factory.mktemp("formats")
    d = {k: str(root / k) for k in ("of", "tf", "h5", "gz", "of2")}
    create_pretraining_data([os.path.join(TEXT, "sample_text.txt"), os.path.join(TEXT, "classics.txt")], VOCAB,
                            d["of"], options=PretrainingOptions(max_seq_length=SEQ, max_predictions_per_seq=PRED,
                                                                dupe_factor=2), num_parts=2, progress=False)
    r = _data("create-pretraining", "--input", os.path.join(TEXT, "sample_text.txt"),
              os.path.join(TEXT, "classics.txt"), "--vocab", VOCAB, "-o", d["tf"], "--num-parts", 2,
              "--max-seq-length", SEQ, "--max-predictions-per-seq", PRED, "--dupe-factor", 2, "--format", "tfrecord")
    assert "in 2 part file(s) (tfrecord)" in r.stdout
    _data("convert", d["tf"], "-o", d["h5"], "--format", "hdf5")
    _data("convert", d["h5"], "-o", d["gz"], "--format", "tfrecord", "--gzip")
    _data("convert", d["h5"], "-o", d["of2"], "--format", "ofrecord")
    cfg = root / "bert_config.json"
    cfg.write_text(json.dumps(CONFIG))
    d["config"], d["root"] = str(cfg), root
    d["tf_glob"] = os.path.join(d["tf"], "part-*.tfrecord")  # as Google's files come: no bert_of_data.json
    return d


def _records(path):
    return list(iter_dataset(path))


def _equal(a, b):
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert set(x) == set(y) == set(FEATURES)
        for k in FEATURES:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


def test_the_same_records_in_every_format_and_back_byte_for_byte(sets):
    base = _records(sets["of"])
    for k in ("tf", "h5", "gz", "of2"):
        _equal(base, _records(sets[k]))
    assert sorted(os.listdir(sets["tf"])) == ["bert_of_data.json", "part-00000.tfrecord", "part-00001.tfrecord",
                                             "vocab.txt"]
    for name in ("part-00000", "part-00001"):  # OFRecord -> TFRecord -> HDF5 -> OFRecord: the same bytes
        assert open(os.path.join(sets["of"], name), "rb").read() == open(os.path.join(sets["of2"], name), "rb").read()
    # a glob is a dataset too; reading order is the files' natural order
    _equal(base, _records(os.path.join(sets["tf"], "part-*.tfrecord")))
    info = json.loads(_data("inspect", sets["gz"], "--check", "--json").stdout)
    assert info["format"] == "tfrecord" and info["num_records"] == len(base) and info["values_checked"]
    # reshard keeps the format; a round-robin deal of the same records
    _data("reshard", sets["h5"], str(sets["root"] / "h5-3"), "--num-parts", 3)
    assert sorted(os.listdir(sets["root"] / "h5-3"))[:3] == ["bert_of_data.json", "part-00000.hdf5",
                                                             "part-00001.hdf5"]
    _data("reshard", sets["gz"], str(sets["root"] / "gz-3"), "--num-parts", 3)  # gzip stays gzip
    assert sorted(n for n in os.listdir(sets["root"] / "gz-3") if n.startswith("part-")) == \
        [f"part-0000{i}.tfrecord.gz" for i in range(3)]
    dealt = _records(str(sets["root"] / "h5-3"))
    key = lambda r: r["input_ids"].tobytes() + r["masked_lm_ids"].tobytes()  # noqa: E731
    assert sorted(map(key, dealt)) == sorted(map(key, base))


def test_batches_are_identical_across_formats_and_ranks_shard_files_alike(sets):
    for world in (1, 2):
        for rank in range(world):
            got = []
            for k in ("of", "tf", "h5", "gz"):
                with PretrainingDataset(sets[k], 5, SEQ, PRED, rank=rank, world_size=world, seed=3) as ds:
                    got.append([ds.next_batch() for _ in range(3)])
                    assert [os.path.basename(p).split(".")[0] for p in ds.part_files] == \
                        [f"part-{i:05d}" for i in ds.part_indices]
            for other in got[1:]:
                for a, b in zip(got[0], other):
                    assert all(np.array_equal(a[n], b[n]) and a[n].dtype == b[n].dtype for n in FEATURES)


def test_hdf5_is_nvidias_layout(sets):
    with h5py.File(os.path.join(sets["h5"], "part-00000.hdf5"), "r") as f:
        assert sorted(f) == sorted(["input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                    "masked_lm_ids", "next_sentence_labels"])
        dt = {k: f[k].dtype.str for k in f}
        assert dt == {"input_ids": "<i4", "input_mask": "|i1", "segment_ids": "|i1", "masked_lm_positions": "<i4",
                      "masked_lm_ids": "<i4", "next_sentence_labels": "|i1"}
        assert all(f[k].compression == "gzip" for k in f)
        n = f["input_ids"].shape[0]
        assert f["input_ids"].shape == (n, SEQ) and f["masked_lm_ids"].shape == (n, PRED)
        assert f["next_sentence_labels"].shape == (n,)


def test_data_inspect_of_hdf5_shows_what_the_shard_stores(sets):
    """The stored dtypes (int32/int8, not the int64 the reader widens to), and masked_lm_weights as
    rebuilt from masked_lm_positions: NVIDIA's shards do not hold it."""
    info = json.loads(_data("inspect", sets["h5"], "--json").stdout)
    with h5py.File(os.path.join(sets["h5"], "part-00000.hdf5"), "r") as f:
        stored = {k: str(f[k].dtype) for k in f}
    feats = info["features"]
    assert {k: v["dtype"] for k, v in feats.items() if v["stored"]} == stored
    assert stored["input_ids"] == "int32" and stored["segment_ids"] == "int8"
    assert feats["masked_lm_weights"] == {"dtype": "float32", "shape": [PRED], "stored": False,
                                          "rebuilt_from": "masked_lm_positions"}
    assert feats["input_ids"]["shape"] == [SEQ] and feats["next_sentence_labels"]["shape"] == [1]
    text = _data("inspect", sets["h5"]).stdout
    assert f"feature input_ids              int32    [{SEQ}]" in text
    assert f"feature masked_lm_weights      float32  [{PRED}] not stored: rebuilt from masked_lm_positions" in text


@pytest.mark.tf
def test_tensorflow_parses_our_tfrecords_and_we_parse_tensorflows(sets, tmp_path):
    tf = pytest.importorskip("tensorflow")
    spec = {k: tf.io.FixedLenFeature([n], getattr(tf, dt)) for k, (dt, n) in GOOGLE_SPEC.items()}
    ours = _records(sets["of"])
    for k, comp in (("tf", ""), ("gz", "GZIP")):
        files = sorted(os.path.join(sets[k], n) for n in os.listdir(sets[k]) if n.startswith("part-"))
        theirs = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files, compression_type=comp)]
        assert len(theirs) == len(ours)
        for a, b in zip(ours, theirs):
            for n in FEATURES:
                assert np.array_equal(a[n], b[n].numpy().astype(a[n].dtype)), n
    # TensorFlow's own writer (tf.train.Example), plain and gzip: our reader decodes the same values
    for comp in ("", "GZIP"):
        path = str(tmp_path / f"tf{comp}.tfrecord")
        with tf.io.TFRecordWriter(path, options=comp or None) as w:
            for rec in ours[:7]:
                feats = {n: tf.train.Feature(float_list=tf.train.FloatList(value=rec[n].tolist()))
                         if n == "masked_lm_weights" else
                         tf.train.Feature(int64_list=tf.train.Int64List(value=rec[n].tolist())) for n in FEATURES}
                w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
        _equal(ours[:7], _records(path))


# --------------------------------------------------------------------------- hostile files


def _frame(payload: bytes) -> bytes:
    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", masked_crc(head)) + payload + struct.pack("<I", masked_crc(payload))


def _one_line(path, needle):
    r = _data("inspect", path, "--check", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("bert-of: error: "), r.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    return lines[0]


def test_hostile_tfrecords_are_one_line_each(sets, tmp_path):
    good = open(os.path.join(sets["tf"], "part-00000.tfrecord"), "rb").read()
    n0 = struct.unpack_from("<Q", good)[0]
    second = 16 + n0  # record 1's frame

    def case(name, data):
        d = tmp_path / name
        d.mkdir()
        p = d / "x.tfrecord"
        p.write_bytes(data)
        return str(p)

    bad = bytearray(good)
    bad[second + 12 + 5] ^= 0xFF  # a byte of record 1's Example
    p = case("crc", bytes(bad))
    _one_line(p, f"{p}: record 1 (byte {second}) is corrupt: data CRC mismatch")

    bad = bytearray(good)
    bad[second + 8] ^= 1  # record 1's length CRC
    p = case("lencrc", bytes(bad))
    _one_line(p, f"{p}: record 1 (byte {second}) is corrupt: the length's CRC does not match")

    p = case("cut", good[:second + 30])
    _one_line(p, f"{p}: record 1 (byte {second}) is truncated")

    # valid frames around hostile protobuf: a huge length varint, a wrong wire type
    huge = pb.field_bytes(1, b"\x0a\xff\xff\xff\xff\x0f")
    p = case("huge", good + _frame(huge))
    n = len(_records(os.path.join(sets["tf"], "part-00000.tfrecord")))
    _one_line(p, f"{p}: record {n} is not a valid tf.train.Example (field 1: length 4294967295 runs past the end")
    wrong = pb.field_bytes(1, b"\x0b")  # field 1 with wire type 3 (a group)
    p = case("wire", good[:second] + _frame(wrong))
    _one_line(p, f"{p}: record 1 is not a valid tf.train.Example (field 1: unsupported wire type 3)")
    p = case("gz", gzip.compress(good)[:200] + b"garbage" * 10)
    _one_line(p, f"{p}: gzip stream is corrupt or truncated")
    p = case("notgz", b"\x1f\x8b" + os.urandom(64))
    _one_line(p, f"{p}: gzip stream is corrupt or truncated")


def test_hostile_values_and_shards_are_named_at_the_reader(sets, tmp_path):
    # a TFRecord whose ids are outside the vocabulary: the same check as OFRecord, at the same place
    src = TFRecordFile(os.path.join(sets["tf"], "part-00000.tfrecord"))
    try:
        raws = [src.raw(i) for i in range(len(src))]
    finally:
        src.close()
    rec = list(iter_dataset(os.path.join(sets["tf"], "part-00000.tfrecord")))[2]
    from bert_of.data.formats import encode_examples

    feats = {n: ("float" if n == "masked_lm_weights" else "int64", rec[n].reshape(1, -1)) for n in FEATURES}
    feats["input_ids"] = ("int64", np.where(np.arange(SEQ) == 3, 5000, rec["input_ids"]).reshape(1, -1))
    d = tmp_path / "vocab"
    d.mkdir()
    shutil.copy(os.path.join(sets["tf"], "bert_of_data.json"), d)  # says the vocabulary's size
    with TFRecordWriter(str(d / "a.tfrecord")) as w:
        for r in raws[:2] + encode_examples(feats):
            w.write(r)
    _one_line(str(d), f"{d / 'a.tfrecord'}: record 2: input_ids has id 5000 outside the model's vocabulary")
    # an HDF5 shard missing a dataset, and one whose lengths disagree
    h = tmp_path / "h5"
    h.mkdir()
    shutil.copy(os.path.join(sets["h5"], "part-00000.hdf5"), h / "a.hdf5")
    with h5py.File(h / "a.hdf5", "a") as f:
        del f["segment_ids"]
    _one_line(str(h), f"{h / 'a.hdf5'}: HDF5 shard has no dataset 'segment_ids'")
    with h5py.File(h / "a.hdf5", "a") as f:
        f.create_dataset("segment_ids", data=np.zeros((3, SEQ), dtype="i1"))
    _one_line(str(h), "dataset 'segment_ids' has 3 records, input_ids has")
    # two formats in one dataset
    m = tmp_path / "mixed"
    m.mkdir()
    shutil.copy(os.path.join(sets["h5"], "part-00000.hdf5"), m / "a.hdf5")
    shutil.copy(os.path.join(sets["tf"], "part-00001.tfrecord"), m / "b.tfrecord")
    _one_line(str(m), "files of different formats")
    # weights HDF5 cannot hold are refused, not changed
    w2 = tmp_path / "w"
    w2.mkdir()
    feats = {n: ("float" if n == "masked_lm_weights" else "int64", rec[n].reshape(1, -1)) for n in FEATURES}
    feats["masked_lm_weights"] = ("float", np.full((1, PRED), 0.5, dtype=np.float32))
    with TFRecordWriter(str(w2 / "a.tfrecord")) as w:
        w.write(encode_examples(feats)[0])
    r = _data("convert", w2, "-o", tmp_path / "w-h5", "--format", "hdf5", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "record 0: masked_lm_weights" in lines[0]
    assert not os.path.exists(tmp_path / "w-h5")


# --------------------------------------------------------------------------- training


def _losses(sets, fmt, run, *extra):
    # graph runs in their own process: OneFlow graphs built and torn down in the test process have
    # crashed it (the suite-crash issue)
    run_cli("pretrain", "--data", sets[fmt], "--output", run, "--config", sets["config"], "--vocab", VOCAB,
            "--steps", "3", "--batch-size", "4", "--log-every", "1", "--warmup-steps", "1", "--lr", "1e-3",
            "--save-every", "0", "-q", *extra, process="graph" in extra)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [(r["step"], r["loss"], r["mlm_loss"], r["nsp_loss"]) for r in map(json.loads, f)]


# graph on 2 ranks compiles for ~15 s a run: TFRecord against HDF5 there (OFRecord's batches equal
# TFRecord's on both ranks above, and its curve equals TFRecord's in the three other cases)
@pytest.mark.parametrize("mode, nproc, formats", [("eager", 1, ("tf_glob", "of", "h5")), ("graph", 1, ("tf", "of", "h5")),
                                                  ("eager", 2, ("tf", "of", "h5")), ("graph", 2, ("tf", "h5"))])
@pytest.mark.oneflow
def test_pretrain_losses_are_bit_identical_on_tfrecord_ofrecord_and_hdf5(sets, tmp_path, mode, nproc, formats):
    extra = ["--mode", mode, "--no-dropout"] + (["--nproc", str(nproc)] if nproc > 1 else [])
    curves = [_losses(sets, fmt, str(tmp_path / fmt), *extra) for fmt in formats]
    assert len(curves[0]) == 3 and all(c == curves[0] for c in curves[1:])
    assert len({c[1] for c in curves[0]}) == 3  # the loss moves: three different steps compared


def test_mutated_examples_are_read_or_refused_by_our_error_never_anything_else(sets, tmp_path):
    """Seeded byte mutations of tf.train.Example payloads, framed with valid CRCs (so the protobuf
    reader, not the CRC, meets them): each file reads, or fails with one bert_of error."""
    from bert_of.errors import BertOfError

    src = TFRecordFile(os.path.join(sets["tf"], "part-00000.tfrecord"))
    try:
        raws = [bytes(src.raw(i)) for i in range(4)]
    finally:
        src.close()
    rng = np.random.default_rng(7)
    outcomes = {"read": 0, "refused": 0}
    for case in range(200):
        payload = bytearray(raws[case % 4])
        for _ in range(int(rng.integers(1, 4))):
            kind = rng.integers(3)
            at = int(rng.integers(len(payload)))
            if kind == 0:
                payload[at] = int(rng.integers(256))
            elif kind == 1:
                del payload[at:at + int(rng.integers(1, 9))]
            else:
                payload[at:at] = bytes(rng.integers(256, size=int(rng.integers(1, 6)), dtype=np.uint8))
        d = tmp_path / f"c{case}"
        d.mkdir()
        (d / "x.tfrecord").write_bytes(_frame(bytes(payload)))
        try:
            list(iter_dataset(str(d)))
            with PretrainingDataset(str(d), 1, SEQ, PRED, vocab_size=CONFIG["vocab_size"], shuffle=False) as ds:
                ds.validate()
            outcomes["read"] += 1
        except BertOfError as e:
            assert "x.tfrecord" in str(e) and "\n" not in str(e), str(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and sum(outcomes.values()) == 200, outcomes
