"""Hostile checkpoints for the newest readers (issue 44): each read the way the reference tool
(torch.load, transformers) reads it, or one `bert-of: error:` line, exit 1, nothing written.

The files are made by hand (tests/helpers/hostile_inputs.py: torch.save's zip layout and pickle opcodes,
safetensors shards) from the small model bert_of's writers produce."""

import json
import os
import subprocess
import sys
import warnings
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers import hostile_inputs as hi
from tests.conftest import ROOT, error_lines, run_cli

POOLER = "bert.pooler.dense.weight"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return hi.make_sources(str(tmp_path_factory.mktemp("small")))


def _one_line(r, needle, out=None):
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("bert-of: error: "), r.stderr
    assert "internal error" not in lines[0] and "Traceback" not in r.stderr
    assert needle in lines[0], lines[0]
    if out is not None:
        assert not os.path.exists(out)
    return lines[0]


def _hf_dir(src, tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    for f in ("config.json", "vocab.txt"):
        (d / f).write_bytes(open(os.path.join(src["hf"], f), "rb").read())
    return d, load_file(os.path.join(src["hf"], "model.safetensors"))


def _converted(d, tmp_path):
    run_cli("convert", "hf2of", d, "-o", tmp_path / "of")
    return load_file(str(tmp_path / "of" / "model.safetensors"))


# --------------------------------------------------------------------------- torch zips


def test_a_duplicated_storage_member_is_read_from_its_first_copy_as_torch_load_does(src, tmp_path):
    d, tensors = _hf_dir(src, tmp_path, "dup")
    records, storages = hi.contiguous_records(tensors)
    key = str(list(tensors).index(POOLER))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name it writes
        with zipfile.ZipFile(d / "pytorch_model.bin", "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", hi.state_dict_pickle(records))
            z.writestr("archive/byteorder", "little")
            for k, raw in storages.items():
                z.writestr(f"archive/data/{k}", raw)
            z.writestr(f"archive/data/{key}", bytes(len(storages[key])))  # a second copy: zeros
            z.writestr("archive/version", "3\n")
    assert zipfile.ZipFile(d / "pytorch_model.bin").read(f"archive/data/{key}") == bytes(len(storages[key]))
    got = _converted(d, tmp_path)  # zipfile's own lookup gives the last copy; torch.load the first
    assert np.array_equal(got[POOLER], tensors[POOLER]) and np.abs(got[POOLER]).sum() > 0


def test_a_duplicated_pickle_member_is_read_from_its_first_copy(src, tmp_path):
    d, tensors = _hf_dir(src, tmp_path, "dup-pkl")
    records, storages = hi.contiguous_records(tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(d / "pytorch_model.bin", "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", hi.state_dict_pickle(records))
            z.writestr("archive/data.pkl", b"\x80\x02" + hi._global("os", "system") + b".")  # never read
            z.writestr("archive/byteorder", "little")
            for k, raw in storages.items():
                z.writestr(f"archive/data/{k}", raw)
    got = _converted(d, tmp_path)
    assert all(np.array_equal(got[k], tensors[k]) for k in tensors if k in got)


def test_nn_parameter_state_dicts_are_read_as_weights_only_load_reads_them(src, tmp_path):
    """torch.save({name: nn.Parameter}) pickles torch._utils._rebuild_parameter(data, requires_grad,
    OrderedDict()) (or _rebuild_parameter_with_state when the parameter carries Python state)."""
    d, tensors = _hf_dir(src, tmp_path, "param")
    records, storages = hi.contiguous_records(tensors)
    wrapped = []
    for i, (name, t) in enumerate(records):
        if i % 2:
            rec = (hi._global("torch._utils", "_rebuild_parameter") + b"(" + t + b"\x88"
                   + hi._global("collections", "OrderedDict") + b")R" + b"tR")
        else:
            rec = (hi._global("torch._utils", "_rebuild_parameter_with_state") + b"(" + t + b"\x88"
                   + hi._global("collections", "OrderedDict") + b")R" + hi._value({"note": "x"}) + b"tR")
        wrapped.append((name, rec))
    hi.write_torch_zip(d / "pytorch_model.bin", (wrapped, storages))
    got = _converted(d, tmp_path)
    assert sorted(got) and all(np.array_equal(got[k], v) for k, v in tensors.items() if k in got)
    # a parameter record of the wrong shape is refused in one line, not the internal-error fallback
    bad = [(records[0][0], hi._global("torch._utils", "_rebuild_parameter") + b"(" + records[0][1] + b"tR")]
    hi.write_torch_zip(d / "pytorch_model.bin", (bad + records[1:], storages))
    _one_line(run_cli("convert", "hf2of", d, "-o", tmp_path / "o2", check=False), "malformed parameter record",
              tmp_path / "o2")


# --------------------------------------------------------------------------- HF shards


def _shards(d, tensors, layout, weight_map=None):
    for fn, names in layout.items():
        save_file({k: tensors[k] for k in names}, str(d / fn))
    wm = weight_map or {k: fn for fn, names in layout.items() for k in names}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))


def test_a_tensor_in_two_shards_is_refused(src, tmp_path):
    """transformers loads every shard whole, so the last shard's copy wins whatever the index says;
    bert_of read the index's: refused instead of guessing."""
    d, tensors = _hf_dir(src, tmp_path, "twice")
    names = list(tensors)
    a, b = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    _shards(d, tensors, {a: names[:5], b: names[5:] + [names[0]]},
            weight_map={**{k: a for k in names[:5]}, **{k: b for k in names[5:]}})
    _one_line(run_cli("convert", "hf2of", d, "-o", tmp_path / "o", check=False),
              f"tensor {names[0]} is also in", tmp_path / "o")
    # the control: the same shards without the second copy read fine
    _shards(d, tensors, {a: names[:5], b: names[5:]})
    got = _converted(d, tmp_path)
    assert all(np.array_equal(got[k], tensors[k]) for k in names if k in got)


@pytest.mark.parametrize("value", [5, None, ["x"], {"a": 1}])
def test_a_shard_name_that_is_no_string_is_one_line(src, tmp_path, value):
    d, tensors = _hf_dir(src, tmp_path, "names")
    names = list(tensors)
    _shards(d, tensors, {"model-00001-of-00001.safetensors": names},
            weight_map={**{k: "model-00001-of-00001.safetensors" for k in names}, names[3]: value})
    _one_line(run_cli("convert", "hf2of", d, "-o", tmp_path / "o", check=False),
              f"shard name {value!r} (of {names[3]}) is not a file in this directory", tmp_path / "o")


# --------------------------------------------------------------------------- FIFOs


@pytest.mark.parametrize("layout", ["folder", "file"])
def test_onnx2of_refuses_a_fifo_without_blocking(src, tmp_path, layout):
    onnx = tmp_path / "onnx"
    run_cli("convert", "of2onnx", src["of"], "-o", onnx)
    os.remove(onnx / "model.onnx")
    os.mkfifo(onnx / "model.onnx")
    target = onnx if layout == "folder" else onnx / "model.onnx"
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "convert", "onnx2of", str(target), "-o",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
    _one_line(r, "model.onnx: not a regular file", tmp_path / "o")


# --------------------------------------------------------------------------- TF2 object graphs


def test_object_graph_paths_are_bounded_in_all_and_cycles_are_cut():
    """A chain of 30,000 nodes each holding a variable: its paths would be 10^9 characters; the
    walk stops at MAX_PATH_CHARS in about a second. A node that is its own child, or a child
    pointing back at the root, adds no path."""
    import time

    from bert_of.converters.formats.tf2 import object_graph as og
    from bert_of.errors import CheckpointError

    nodes = [og.Node(children=[(1, "root")])] + [
        og.Node(children=[(k + 2, f"node{k}")], attributes=[("VARIABLE_VALUE", "x", "")]) for k in range(30_000)]
    nodes[-1].children = []
    t = time.perf_counter()
    with pytest.raises(CheckpointError, match="longer than 16,777,216 characters in all"):
        og.aliases(nodes, "x")
    assert time.perf_counter() - t < 10
    nodes = [og.Node(children=[(1, "a")]), og.Node(children=[(1, "self"), (0, "up"), (2, "v")]),
             og.Node(attributes=[("VARIABLE_VALUE", "v", "")])]
    assert og.aliases(nodes, "x") == {2: ["a/v"]}
