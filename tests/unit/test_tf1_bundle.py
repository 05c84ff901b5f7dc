"""TensorBundle reader/writer against real TensorFlow files, both directions.

TensorFlow is imported once (module fixture) and only by tests that need it;
the corruption tests run on files we write ourselves.
"""

import os
import weakref

import numpy as np
import pytest

from bert_of.errors import CheckpointError
from bert_of.converters.containers import sstable, tf1_bundle_proto
from bert_of.converters.containers.tf1_bundle import (
    iter_tensors,
    read_index,
    read_tensor,
    resolve_prefix,
)
from bert_of.converters.containers.tf1_bundle_proto import TensorEntry
from bert_of.converters.containers.tf1_bundle_writer import write_bundle

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _bf16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return ml_dtypes.bfloat16


def _bert_like(rng):
    """Small tensors with BERT names and every dtype we care about."""
    return {
        "bert/embeddings/word_embeddings": rng.standard_normal((50, 16)).astype(np.float32),
        "bert/embeddings/LayerNorm/gamma": np.ones(16, np.float32),
        "bert/encoder/layer_0/attention/self/query/kernel": rng.standard_normal((16, 16)).astype(np.float32),
        "bert/encoder/layer_0/attention/self/query/bias": rng.standard_normal(16).astype(np.float32),
        "bert/encoder/layer_0/output/dense/kernel_fp16": rng.standard_normal((16, 8)).astype(np.float16),
        "bert/pooler/dense/kernel_bf16": rng.standard_normal((8, 4)).astype(_bf16()),
        "cls/predictions/output_bias_f64": rng.standard_normal(5),
        "global_step": np.array(12345, np.int64),
    }


def _assert_same(a, b, name=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
    assert a.shape == b.shape, (name, a.shape, b.shape)
    assert a.tobytes() == b.tobytes(), name


def _one_line_error(excinfo, *needles):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ---------------------------------------------------------------- TF writes, we read


@pytest.fixture(scope="module")
def tf1_ckpt(tf, tmp_path_factory):
    values = _bert_like(np.random.default_rng(0))
    prefix = str(tmp_path_factory.mktemp("tf1") / "bert_model.ckpt")
    with tf.Graph().as_default():
        for name, v in values.items():
            tf.compat.v1.get_variable(name, initializer=tf.constant(v))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, prefix)
    return prefix, values


@pytest.mark.tf
def test_read_tf1_saver_checkpoint(tf, tf1_ckpt):
    prefix, values = tf1_ckpt
    entries = read_index(prefix)
    assert list(entries) == sorted(entries)
    assert sorted((n, list(s)) for n, s in tf.train.list_variables(prefix)) == sorted(
        (n, list(e.shape)) for n, e in entries.items()
    )
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    assert set(dtypes) == set(entries) == set(values)
    for name, e in entries.items():
        assert e.dtype == np.dtype(dtypes[name].as_numpy_dtype), name
        ours = read_tensor(prefix, e)
        assert ours.flags.c_contiguous and ours.flags.writeable
        _assert_same(ours, reader.get_tensor(name), name)
        _assert_same(ours, values[name], name)
    got = dict(iter_tensors(prefix))
    assert set(got) == set(values)
    for name, arr in got.items():
        _assert_same(arr, values[name], name)


@pytest.mark.tf
def test_resolve_prefix_forms(tf1_ckpt, tmp_path):
    prefix, _ = tf1_ckpt
    d = os.path.dirname(prefix)
    assert resolve_prefix(prefix) == prefix
    assert resolve_prefix(prefix + ".index") == prefix
    assert resolve_prefix(prefix + ".data-00000-of-00001") == prefix
    assert os.path.samefile(resolve_prefix(d) + ".index", prefix + ".index")  # via TF's `checkpoint` file
    # Directory without a state file but with one checkpoint.
    write_bundle(tmp_path / "only.ckpt", {"a": np.zeros(2, np.float32)}, write_state_file=False)
    assert resolve_prefix(tmp_path) == str(tmp_path / "only.ckpt")
    # Two checkpoints, no state file: ambiguous.
    write_bundle(tmp_path / "other.ckpt", {"a": np.zeros(2, np.float32)}, write_state_file=False)
    with pytest.raises(CheckpointError) as ei:
        resolve_prefix(tmp_path)
    _one_line_error(ei, str(tmp_path), "only.ckpt.index", "other.ckpt.index")
    # A state file disambiguates, even with a stale absolute path from another machine.
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "/gone/elsewhere/other.ckpt"\n')
    assert resolve_prefix(tmp_path) == str(tmp_path / "other.ckpt")
    # Empty directory.
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError) as ei:
        resolve_prefix(empty)
    _one_line_error(ei, str(empty), "no TensorFlow checkpoint")


@pytest.mark.tf
def test_read_tf2_object_checkpoint(tf, tmp_path):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    h = rng.standard_normal(7).astype(np.float16)
    module = tf.Module()
    module.w = tf.Variable(w)
    module.h = tf.Variable(h)
    module.step = tf.Variable(np.int64(9))
    prefix = tf.train.Checkpoint(model=module).write(str(tmp_path / "obj"))
    entries = read_index(prefix)
    assert sorted((n, list(s)) for n, s in tf.train.list_variables(prefix)) == sorted(
        (n, list(e.shape)) for n, e in entries.items()
    )
    graph = entries["_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert graph.dtype == "string"
    with pytest.raises(CheckpointError) as ei:
        read_tensor(prefix, graph)
    _one_line_error(ei, "_CHECKPOINTABLE_OBJECT_GRAPH", "string")
    reader = tf.train.load_checkpoint(prefix)
    numeric = {n: e for n, e in entries.items() if isinstance(e.dtype, np.dtype)}
    assert len(numeric) == 3
    for name, e in numeric.items():
        _assert_same(read_tensor(prefix, e), reader.get_tensor(name), name)
    # Default iteration skips the string bookkeeping tensor instead of failing.
    assert set(dict(iter_tensors(prefix))) == set(numeric)
    _assert_same(read_tensor(prefix, entries["model/w/.ATTRIBUTES/VARIABLE_VALUE"]), w)


# ---------------------------------------------------------------- we write, TF reads


def _our_tensors():
    rng = np.random.default_rng(2)
    # Deliberately unsorted, with scalars, 1-element and zero-element tensors.
    return [
        ("zeta/kernel", rng.standard_normal((3, 4)).astype(np.float32)),
        ("alpha/scalar_f32", np.array(3.5, np.float32)),
        ("global_step", np.array(7, np.int64)),
        ("mid/one_elem", np.array([42], np.int32)),
        ("mid/empty", np.zeros((0, 3), np.float32)),
        ("h/fp16", rng.standard_normal((2, 5)).astype(np.float16)),
        ("h/bf16", rng.standard_normal((5, 2)).astype(_bf16())),
        ("d/f64", rng.standard_normal((2, 2, 2))),
        ("i/int8", np.array([-128, 0, 127], np.int8)),
        ("i/int16", np.array([[-32768, 32767]], np.int16)),
        ("i/uint8", np.arange(256, dtype=np.uint8).reshape(16, 16)),
        ("b/bool", np.array([True, False, True])),
        ("t/transposed", np.arange(12, dtype=np.float32).reshape(3, 4).T),  # non-contiguous input
    ]


@pytest.mark.tf
def test_write_then_tf_reads(tf, tmp_path):
    items = _our_tensors()
    prefix = str(tmp_path / "out" / "model.ckpt")
    write_bundle(prefix, iter(items))
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    assert set(dtypes) == {n for n, _ in items}
    for name, arr in items:
        assert np.dtype(dtypes[name].as_numpy_dtype) == arr.dtype, name
        _assert_same(reader.get_tensor(name), arr.copy(order="C"), name)
    assert tf.train.latest_checkpoint(str(tmp_path / "out")) == prefix  # state file written


@pytest.mark.tf
def test_write_then_tf1_saver_restores(tf, tmp_path):
    items = dict(_our_tensors())
    prefix = str(tmp_path / "restore.ckpt")
    write_bundle(prefix, items, write_state_file=False)
    with tf.Graph().as_default():
        var_list = {
            name: tf.compat.v1.get_variable(
                f"v{i}", shape=arr.shape, dtype=tf.as_dtype(arr.dtype), initializer=tf.compat.v1.zeros_initializer()
            )
            for i, (name, arr) in enumerate(items.items())
        }
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            for name, var in var_list.items():
                _assert_same(sess.run(var), items[name].copy(order="C"), name)


@pytest.mark.tf
def test_write_matches_tf_bytes_and_crc(tf, tmp_path):
    """Same tensors through TF's SaveV2 and our writer: identical files, so identical masked CRCs."""
    items = [(n, a.copy(order="C")) for n, a in _our_tensors()]
    names = [n for n, _ in items]
    tf_prefix, our_prefix = str(tmp_path / "tf"), str(tmp_path / "ours")
    tf.raw_ops.SaveV2(
        prefix=tf_prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=[tf.constant(a) for _, a in items]
    )
    write_bundle(our_prefix, items, write_state_file=False)
    theirs, ours = read_index(tf_prefix), read_index(our_prefix)
    assert list(theirs) == list(ours) == sorted(names)
    for name in names:
        assert ours[name].crc32c == theirs[name].crc32c, name
        assert (ours[name].offset, ours[name].size, ours[name].shape) == (
            theirs[name].offset,
            theirs[name].size,
            theirs[name].shape,
        )
    for ext in (".index", ".data-00000-of-00001"):
        with open(tf_prefix + ext, "rb") as a, open(our_prefix + ext, "rb") as b:
            assert a.read() == b.read(), ext


def test_stored_crc_is_masked(tmp_path):
    import crc32c

    data = np.arange(10, dtype=np.float32)
    write_bundle(tmp_path / "m", {"x": data}, write_state_file=False)
    e = read_index(tmp_path / "m")["x"]
    raw = crc32c.crc32c(data.tobytes())
    assert e.crc32c == ((((raw >> 15) | (raw << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert e.crc32c != raw


# ---------------------------------------------------------------- our own round trip


def test_roundtrip_bit_exact_and_multiblock_index(tmp_path):
    items = _our_tensors()
    # Enough names to spill the index over more than one 256 KiB data blocks.
    many = [(f"bert/encoder/layer_{i}/attention/self/query/kernel_{j:04d}", np.array([i, j], np.int32)) for i in range(4) for j in range(3000)]
    prefix = tmp_path / "rt.ckpt"
    write_bundle(prefix, items + many)
    assert os.path.getsize(str(prefix) + ".index") > sstable._BLOCK_SIZE
    entries = read_index(prefix)
    assert list(entries) == sorted(n for n, _ in items + many)
    expected = dict(items + many)
    for name, arr in iter_tensors(prefix, entries):
        _assert_same(arr, expected[name].copy(order="C"), name)
    e = entries["alpha/scalar_f32"]
    assert isinstance(e, TensorEntry) and e.shape == () and e.shard == 0 and e.dtype == np.float32
    assert entries["mid/empty"].size == 0 and read_tensor(prefix, entries["mid/empty"]).shape == (0, 3)
    # iter_tensors by name, in data-file order
    got = list(iter_tensors(prefix, ["zeta/kernel", "global_step"]))
    assert [n for n, _ in got] == ["zeta/kernel", "global_step"]


def test_write_is_lazy_one_tensor_at_a_time(tmp_path):
    refs = []

    def gen():
        for i in range(5):
            # By the time we are asked for the next tensor, the previous must be gone.
            assert all(r() is None for r in refs), "writer kept a reference to an earlier tensor"
            arr = np.full((100, 100), i, np.float32)
            refs.append(weakref.ref(arr))
            yield f"t{i}", arr
            del arr

    write_bundle(tmp_path / "lazy", gen(), write_state_file=False)
    assert len(read_index(tmp_path / "lazy")) == 5


def test_failed_write_leaves_nothing_and_keeps_old(tmp_path):
    prefix = tmp_path / "model.ckpt"
    write_bundle(prefix, {"a": np.arange(3, dtype=np.float32)})
    before = sorted(os.listdir(tmp_path))

    def boom():
        yield "a", np.zeros(5, np.float32)
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError):
        write_bundle(prefix, boom())
    assert sorted(os.listdir(tmp_path)) == before  # no temp files
    _assert_same(read_tensor(prefix, read_index(prefix)["a"]), np.arange(3, dtype=np.float32))

    fresh = tmp_path / "fresh"
    with pytest.raises(CheckpointError) as ei:
        write_bundle(fresh / "x.ckpt", [("ok", np.zeros(2)), ("bad", np.array(["s"], object))])
    _one_line_error(ei, "x.ckpt.index", "'bad'", "dtype")
    assert os.listdir(fresh) == []
    with pytest.raises(CheckpointError, match="duplicate"):
        write_bundle(fresh / "x.ckpt", [("a", np.zeros(2)), ("a", np.zeros(2))])
    assert os.listdir(fresh) == []


# ---------------------------------------------------------------- bad inputs


@pytest.fixture
def good(tmp_path):
    prefix = str(tmp_path / "good.ckpt")
    write_bundle(
        prefix,
        {"bert/a": np.arange(100, dtype=np.float32).reshape(10, 10), "bert/b": np.arange(7, dtype=np.int64)},
        write_state_file=False,
    )
    return prefix


def _patch(path, pos, fn):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([fn(b[0])]))


def test_missing_index(tmp_path):
    with pytest.raises(CheckpointError) as ei:
        read_index(tmp_path / "nope.ckpt")
    _one_line_error(ei, "nope.ckpt.index", "not found")


def test_truncated_data_shard(good):
    data = good + ".data-00000-of-00001"
    entries = read_index(good)
    size = os.path.getsize(data)
    os.truncate(data, size - 10)
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, data, "truncated", "'bert/b'", str(size), str(size - 10))
    with pytest.raises(CheckpointError) as ei:  # truncated after the index was read
        read_tensor(good, entries["bert/b"])
    _one_line_error(ei, data, "truncated", "'bert/b'")


def test_shard_file_missing(good):
    data = good + ".data-00000-of-00001"
    os.unlink(data)
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, data, "missing")


def test_index_data_size_mismatch(good):
    """An index whose entry size disagrees with shape*dtype (hand-built with the module's own encoder)."""
    raw = np.arange(100, dtype=np.float32).tobytes()
    import crc32c

    entry = tf1_bundle_proto.enc_entry(1, (10, 12), 0, len(raw), sstable.mask(crc32c.crc32c(raw)))
    with open(good + ".index", "wb") as f:
        f.write(sstable.build_table([(b"", tf1_bundle_proto.HEADER_ONE_SHARD), (b"bert/a", entry)]))
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, good + ".index", "'bert/a'", "(10, 12)", "480", "400")


def test_crc_mismatch(good):
    data = good + ".data-00000-of-00001"
    e = read_index(good)["bert/a"]
    _patch(data, e.offset + 17, lambda b: b ^ 0x01)
    with pytest.raises(CheckpointError) as ei:
        read_tensor(good, e)
    _one_line_error(ei, data, "'bert/a'", "CRC32C")
    with pytest.raises(CheckpointError):
        list(iter_tensors(good))
    assert read_tensor(good, e, verify_crc=False).shape == (10, 10)


def test_bad_magic(good):
    idx = good + ".index"
    _patch(idx, os.path.getsize(idx) - 1, lambda b: b ^ 0xFF)
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, idx, "magic")


def test_truncated_index(good):
    idx = good + ".index"
    os.truncate(idx, os.path.getsize(idx) - 20)
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, idx)
    os.truncate(idx, 10)
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, idx, "too short")


def test_bad_block_crc(good):
    idx = good + ".index"
    _patch(idx, 12, lambda b: b ^ 0x20)  # inside the first data block
    with pytest.raises(CheckpointError) as ei:
        read_index(good)
    _one_line_error(ei, idx, "CRC")


def test_random_bytes(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(np.random.default_rng(3).bytes(4096))
    with pytest.raises(CheckpointError) as ei:
        resolve_prefix(junk)
    _one_line_error(ei, str(junk), "not a TensorFlow checkpoint")
    with pytest.raises(CheckpointError) as ei:
        read_index(junk)
    _one_line_error(ei, str(junk))
    (tmp_path / "junk.index").write_bytes(junk.read_bytes())
    with pytest.raises(CheckpointError) as ei:
        read_index(tmp_path / "junk")
    _one_line_error(ei, str(tmp_path / "junk.index"), "magic")


@pytest.mark.tf
def test_multi_shard_and_partitioned(tf, tmp_path):
    a, b = np.arange(6, dtype=np.float32), np.arange(4, dtype=np.int64)
    p1, p2, merged = (str(tmp_path / n) for n in ("s1", "s2", "merged"))
    tf.raw_ops.SaveV2(prefix=p1, tensor_names=["a"], shape_and_slices=[""], tensors=[a])
    tf.raw_ops.SaveV2(prefix=p2, tensor_names=["b", "c"], shape_and_slices=["", ""], tensors=[b, a[:2]])
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[p1, p2], destination_prefix=merged)
    entries = read_index(merged)
    assert {n: e.shard for n, e in entries.items()} == {"a": 0, "b": 1, "c": 1}
    got = dict(iter_tensors(merged))
    _assert_same(got["a"], a), _assert_same(got["b"], b), _assert_same(got["c"], a[:2])
    _assert_same(read_tensor(merged, entries["c"]), a[:2])
    os.unlink(merged + ".data-00001-of-00002")
    with pytest.raises(CheckpointError) as ei:
        read_index(merged)
    _one_line_error(ei, merged + ".data-00001-of-00002", "missing")

    # Partitioned variables: listed with their full shape like TF does, refused on load.
    prefix = str(tmp_path / "part" / "p")
    with tf.Graph().as_default():
        tf.compat.v1.get_variable(
            "part", shape=[10, 4], partitioner=tf.compat.v1.fixed_size_partitioner(2),
            initializer=tf.compat.v1.ones_initializer(),
        )
        tf.compat.v1.get_variable("plain", initializer=tf.constant(np.float32(2)))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().save(sess, prefix)
    entries = read_index(prefix)
    assert sorted((n, list(s)) for n, s in tf.train.list_variables(prefix)) == sorted(
        (n, list(e.shape)) for n, e in entries.items()
    )
    assert entries["part"].slices == 2
    assert resolve_prefix(prefix + ".meta") == prefix
    with pytest.raises(CheckpointError) as ei:
        read_tensor(prefix, entries["part"])
    _one_line_error(ei, prefix + ".index", "'part'", "partitioned")
    _assert_same(read_tensor(prefix, entries["plain"]), np.array(2, np.float32))
