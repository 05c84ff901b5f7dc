"""bert_of checkpoint directories: safetensors compatibility, atomic writes, bad files."""

import os
import re

import numpy as np
import pytest
import safetensors.numpy

from bert_of.checkpoint import SafetensorsFile, load_checkpoint, load_safetensors, save_safetensors, write_checkpoint
from bert_of.tensors import TensorSpec, expected_shapes
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError, OutputError
from tests.conftest import write_vocab

CFG = BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=5)


def _tensors():
    rng = np.random.default_rng(0)
    import ml_dtypes

    return {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "b.half": rng.standard_normal(7).astype(np.float16),
        "c.bf16": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
        "d.step": np.array(12345, np.int64),
        "e.i32": np.arange(6, dtype=np.int32).reshape(2, 3),
    }


def test_our_files_read_by_the_safetensors_library_and_back(tmp_path):
    t = {k: v for k, v in _tensors().items() if k != "c.bf16"}  # safetensors' numpy API lacks bf16
    ours = tmp_path / "ours.safetensors"
    save_safetensors(str(ours), t, metadata={"format": "bert_of"})
    lib = safetensors.numpy.load_file(str(ours))
    assert set(lib) == set(t)
    for k in t:
        assert lib[k].dtype == t[k].dtype and np.array_equal(lib[k], t[k])
    theirs = tmp_path / "theirs.safetensors"
    safetensors.numpy.save_file(t, str(theirs))
    back = load_safetensors(str(theirs))
    for k in t:
        assert back[k].dtype == t[k].dtype and np.array_equal(back[k], t[k])


def test_bf16_and_every_dtype_round_trip(tmp_path):
    t = _tensors()
    p = tmp_path / "x.safetensors"
    save_safetensors(str(p), t)
    with SafetensorsFile(str(p)) as f:
        assert f.dtype("c.bf16").name == "bfloat16"
        for k, v in t.items():
            assert f.get(k).tobytes() == v.tobytes() and f.shape(k) == v.shape


def _backbone(value):
    return [(k, np.full(s, value, np.float32)) for k, s in expected_shapes(CFG).items() if k.startswith("bert.")]


X = "bert.pooler.dense.bias"


def test_checkpoint_dir_is_atomic_on_crash(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", 11)
    dst = tmp_path / "ck"

    def boom():
        raise RuntimeError("disk on fire")

    items = [(TensorSpec(k, v.dtype, v.shape), lambda v=v: v) for k, v in _backbone(0.0)]
    items[-1] = (items[-1][0], boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_checkpoint(str(dst), items, CFG, vocab)
    assert os.listdir(tmp_path) == ["vocab.txt"]  # no dst, no temp dir left

    write_checkpoint(str(dst), _backbone(1.0), CFG, vocab)
    with pytest.raises(OutputError, match="already exists"):
        write_checkpoint(str(dst), _backbone(0.0), CFG, vocab)
    # A failed overwrite keeps the old checkpoint whole.
    with pytest.raises(RuntimeError):
        write_checkpoint(str(dst), items, CFG, vocab, overwrite=True)
    assert np.array_equal(load_checkpoint(str(dst)).tensors[X], np.ones(8, np.float32))
    write_checkpoint(str(dst), _backbone(0.0), CFG, vocab, overwrite=True)
    ck = load_checkpoint(str(dst))
    assert np.array_equal(ck.tensors[X], np.zeros(8)) and ck.config == CFG
    assert sorted(os.listdir(tmp_path)) == ["ck", "vocab.txt"]


def test_load_checkpoint_is_as_strict_as_the_cli(tmp_path):
    """The Python API refuses what `bert-of convert` refuses: tensors the config has no place for,
    integer weights, a missing backbone tensor."""
    vocab = write_vocab(tmp_path / "vocab.txt", 11)
    cases = {
        "extra layer": (_backbone(0.5) + [("bert.encoder.layer.1.output.dense.bias", np.zeros(8, np.float32))],
                        "is layer 1 but the config has num_hidden_layers 1"),
        "int weights": ([(k, v.astype(np.int32) if k == X else v) for k, v in _backbone(0.5)],
                        f"tensor {X} has dtype int32; BERT weights are floating point"),
        "missing": ([(k, v) for k, v in _backbone(0.5) if k != X], f"tensor {X} is missing"),
        "misshaped": ([(k, v[:4] if k == X else v) for k, v in _backbone(0.5)],
                      f"tensor {X} has shape [4] but the config implies [8]"),
    }
    for i, (items, needle) in enumerate(cases.values()):
        write_checkpoint(str(tmp_path / f"c{i}"), items, CFG, vocab)
        with pytest.raises(CheckpointError, match=re.escape(needle)):
            load_checkpoint(str(tmp_path / f"c{i}"))
    # optimizer state: checked against the weights it belongs to
    opt = ([(f"m/{X}", np.zeros(8, np.float32)), ("step", np.array(3, np.int64))], {"optimizer": "adamw"})
    write_checkpoint(str(tmp_path / "opt"), _backbone(0.5), CFG, vocab, optimizer=opt)
    ck = load_checkpoint(str(tmp_path / "opt"), with_optimizer=True)
    assert sorted(ck.optimizer) == [f"m/{X}", "step"] and ck.optimizer_meta == {"optimizer": "adamw"}
    for items, needle in (([(f"m/{X}", np.zeros(4, np.float32))], f"m/{X} has shape [4], but {X} implies [8]"),
                          ([("step", np.array(3.0))], "tensor step has dtype float64; a step counter is an integer"),
                          ([("m/bert.nothing", np.zeros(8, np.float32))], "is not state bert_of knows")):
        write_checkpoint(str(tmp_path / "bad"), _backbone(0.5), CFG, vocab, optimizer=(items, {}), overwrite=True)
        with pytest.raises(CheckpointError, match=re.escape(needle)):
            load_checkpoint(str(tmp_path / "bad"), with_optimizer=True)


def test_truncated_and_garbage_safetensors(tmp_path):
    p = tmp_path / "m.safetensors"
    save_safetensors(str(p), {"w": np.ones((64, 64), np.float32)})
    data = p.read_bytes()
    p.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=r"tensor w: data ends at byte 16384 but the file holds"):
        SafetensorsFile(str(p))
    p.write_bytes(os.urandom(64))
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        SafetensorsFile(str(p))


def test_load_checkpoint_refuses_non_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text(CFG.to_json_string())
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(str(tmp_path))


def test_streamed_checkpoint_reads_each_tensor_into_memory_the_caller_owns(tmp_path):
    """load_checkpoint(streamed=True) (what from_pretrained loads through) checks the whole file on
    opening, then reads one tensor at a time: into a fresh array, or into the caller's memory."""
    vocab = write_vocab(tmp_path / "vocab.txt", 11)
    rng = np.random.default_rng(3)
    items = [(k, rng.standard_normal(v.shape).astype(np.float32)) for k, v in _backbone(0.0)]
    write_checkpoint(str(tmp_path / "ck"), items, CFG, vocab)
    whole = load_checkpoint(str(tmp_path / "ck")).tensors
    ck = load_checkpoint(str(tmp_path / "ck"), streamed=True)
    try:
        assert sorted(ck.tensors) == sorted(whole) and len(ck.tensors) == len(whole)
        for k, v in whole.items():
            assert ck.tensors.spec(k).shape == tuple(v.shape) and np.array_equal(ck.tensors[k], v)
            out = np.full(v.shape, np.nan, np.float32)
            ck.tensors.read_into(k, out)
            assert np.array_equal(out, v)
        with pytest.raises(TypeError, match=re.escape(f"read_into('{X}'): needs writable C-contiguous float32 [8]")):
            ck.tensors.read_into(X, np.zeros(8, np.float64))
        with pytest.raises(TypeError, match=re.escape("got float32 [4]")):
            ck.tensors.read_into(X, np.zeros(8, np.float32)[::2])
    finally:
        ck.tensors.close()
    # bad files fail on opening, as an unstreamed load does, before any tensor is read
    write_checkpoint(str(tmp_path / "bad"), [(k, v[:4] if k == X else v) for k, v in items], CFG, vocab)
    with pytest.raises(CheckpointError, match=re.escape(f"tensor {X} has shape [4] but the config implies [8]")):
        load_checkpoint(str(tmp_path / "bad"), streamed=True)
