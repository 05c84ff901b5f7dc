"""TF1 interop end to end through the real CLI: tf2of --verify, of2tf, round trips, bad input.

Checkpoints are made by the TF reference (Google's variable names and layout,
saved by TensorFlow's own Saver) with weights of realistic magnitude, so an
activation or epsilon mismatch would show far above the 1e-5 tolerance.
"""

import json
import os

import numpy as np
import pytest

from bert_of.converters.containers import tf1_bundle, tf1_bundle_writer
from bert_of.converters.verify import tf_reference as ref
from bert_of.converters.verify import tf_reference_checkpoint as ref_ckpt
from tests.conftest import TINY, error_lines, run_cli
from tests.helpers.models import CONFIGS, make_tf_dir

pytestmark = pytest.mark.tf

@pytest.fixture(scope="module")
def tf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf")
    return {name: make_tf_dir(root, name) for name in CONFIGS}


def _bundle(path):
    prefix = tf1_bundle.resolve_prefix(str(path))
    return {n: tf1_bundle.read_tensor(prefix, e) for n, e in tf1_bundle.read_index(prefix).items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tf2of_verify_within_1e5_eager_and_graph(tf_dirs, tmp_path, name):
    dst = tmp_path / "of"
    r = run_cli("convert", "tf2of", tf_dirs[name], "-o", dst, "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and report["reference"] == "numpy-float64 (tf layout)"
    assert set(report["max_abs_diff"]) == {"B:eager", "B:graph"}
    # Google's own graph in TensorFlow (float64) computes what the NumPy reference computes
    tf_diffs = report["ecosystem"]["A:tf-float64"]
    assert tf_diffs.keys() == report["max_abs_diff"]["B:eager"].keys() and max(tf_diffs.values()) <= 1e-9, tf_diffs
    assert report["batches"]["tokens"]["masked"] > 0 and report["batches"]["random"]["size"] == 3
    heads = CONFIGS[name][1]
    expected = {"sequence_output", "pooled_output"}
    expected |= {"prediction_logits", "seq_relationship_logits"} if "pretraining" in heads else set()
    expected |= {"start_logits", "end_logits"} if "squad" in heads else set()
    expected |= {"logits"} if "classifier" in heads else set()
    for mode, diffs in report["max_abs_diff"].items():
        assert set(diffs) == expected, mode
        assert max(diffs.values()) <= 1e-5, (mode, diffs)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["hidden_act"] == {"gelu": "gelu_tanh", "relu": "relu"}[CONFIGS[name][0]["hidden_act"]]
    assert cfg["layer_norm_eps"] == 1e-12 and cfg["provenance"] == "tf1"


def test_verify_catches_an_activation_mismatch(tf_dirs, tmp_path):
    """Realistic weights make erf vs tanh GELU visible: the check has teeth."""
    dst = tmp_path / "of"
    run_cli("convert", "tf2of", tf_dirs["tiny3"], "-o", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["hidden_act"] = "gelu_erf"
    (dst / "config.json").write_text(json.dumps(cfg))
    r = run_cli("verify", tf_dirs["tiny3"], dst, "-o", tmp_path / "report.json", check=False)
    assert r.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["ok"] and report["worst"] > 1e-4
    assert error_lines(r.stderr)[-1].startswith("bert-of: error: forward outputs differ")


def test_round_trip_tf_of_tf_is_bit_exact_with_optimizer(tf_dirs, tmp_path):
    src = tf_dirs["tiny3"]
    r = run_cli("convert", "tf2of", src, "-o", tmp_path / "of", "--with-optimizer")
    n_src = len(_bundle(src))
    assert f"{n_src} source tensors:" in r.stdout and "optimizer" in r.stdout
    run_cli("convert", "of2tf", tmp_path / "of", "-o", tmp_path / "tf", "--with-optimizer")
    a, b = _bundle(src), _bundle(tmp_path / "tf")
    assert list(a) == list(b) and "global_step" in b and int(b["global_step"]) == 1234
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k
    assert json.loads((tmp_path / "tf" / "bert_config.json").read_text()) == \
        json.loads((src / "bert_config.json").read_text())
    assert (tmp_path / "tf" / "vocab.txt").read_bytes() == (src / "vocab.txt").read_bytes()
    # TensorFlow itself restores what we wrote, and computes what the source computed.
    batch = ref.make_batch(CONFIGS["tiny3"][0], batch_size=2, seed=3)
    out_src = ref.run_reference(str(src / "bert_model.ckpt"), CONFIGS["tiny3"][0], batch)
    out_back = ref.run_reference(str(tmp_path / "tf" / "bert_model.ckpt"), CONFIGS["tiny3"][0], batch)
    for k in out_src:
        assert np.array_equal(out_src[k], out_back[k]), k


def test_optimizer_state_dropped_by_default_and_reported(tf_dirs, tmp_path):
    r = run_cli("convert", "tf2of", tf_dirs["tiny3"], "-o", tmp_path / "of")
    n = len(_bundle(tf_dirs["tiny3"]))
    n_model = sum(1 for k in _bundle(tf_dirs["tiny3"]) if not k.endswith(("adam_m", "adam_v")) and k != "global_step")
    assert f"{n} source tensors: {n - n_model} dropped, {n_model} mapped" in r.stdout
    assert "--with-optimizer" in r.stdout
    assert not (tmp_path / "of" / "optimizer.safetensors").exists()
    # of2tf of a checkpoint with no optimizer state writes exactly the model tensors
    run_cli("convert", "of2tf", tmp_path / "of", "-o", tmp_path / "tf")
    assert len(_bundle(tmp_path / "tf")) == n_model


def test_inspect_counts_parameters(tf_dirs, tmp_path):
    from bert_of.config import BertConfig

    r = run_cli("inspect", tf_dirs["tiny3"], "--json")
    info = json.loads(r.stdout)
    cfg = BertConfig.from_google_dict(CONFIGS["tiny3"][0])
    assert info["format"] == "tf" and info["parameters"] == cfg.num_parameters()
    assert {t["kind"] for t in info["tensors"]} == {"model", "optimizer", "step"}
    run_cli("convert", "tf2of", tf_dirs["tiny3"], "-o", tmp_path / "of")
    info = json.loads(run_cli("inspect", tmp_path / "of", "--json").stdout)
    assert info["format"] == "of" and info["parameters"] == cfg.num_parameters()
    text = run_cli("inspect", tmp_path / "of").stdout
    assert "format of" in text and f"{cfg.num_parameters():,} model parameters" in text


# --------------------------------------------------------------------------- bad input


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _truncate(d):
    p = d / "bert_model.ckpt.data-00000-of-00001"
    p.write_bytes(p.read_bytes()[:-1000])


def _flip(d):
    p = d / "bert_model.ckpt.data-00000-of-00001"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _swap_data(d):  # index and data from two different checkpoints
    other = d.parent / (d.name + "-other")
    other.mkdir()
    ref_ckpt.make_checkpoint(str(other / "bert_model.ckpt"), dict(TINY, num_hidden_layers=1), seed=1)
    (d / "bert_model.ckpt.data-00000-of-00001").write_bytes(
        (other / "bert_model.ckpt.data-00000-of-00001").read_bytes())


def _bad_config(d):
    cfg = json.loads((d / "bert_config.json").read_text())
    cfg["intermediate_size"] = 40
    (d / "bert_config.json").write_text(json.dumps(cfg))


def _bad_vocab_size(d):  # config vocab_size disagrees with the embedding table
    cfg = json.loads((d / "bert_config.json").read_text())
    cfg["vocab_size"] = 100
    (d / "bert_config.json").write_text(json.dumps(cfg))
    (d / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(100)) + "\n")


def _fewer_layers(d):
    cfg = json.loads((d / "bert_config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (d / "bert_config.json").write_text(json.dumps(cfg))


def _no_vocab(d):
    (d / "vocab.txt").unlink()


def _not_bert(d):
    for p in d.glob("bert_model.ckpt*"):
        p.unlink()
    tf1_bundle_writer.write_bundle(str(d / "bert_model.ckpt"), {"dense/kernel": np.zeros((3, 4), np.float32),
                                                         "dense/bias": np.zeros(4, np.float32)})


def _garbage_index(d):
    (d / "bert_model.ckpt.index").write_bytes(os.urandom(300))


BAD = {
    "truncated shard": (_truncate, "bert_model.ckpt.data-00000-of-00001"),
    "crc mismatch": (_flip, "CRC"),
    "index/data mismatch": (_swap_data, "bert_model.ckpt"),
    "config misfit": (_bad_config, "intermediate/dense/bias has shape [37] but the config implies [40]"),
    "vocab misfit": (_bad_vocab_size, "word_embeddings has shape [99, 32] but the config implies [100, 32]"),
    "extra layers": (_fewer_layers, "layer 2 but the config has num_hidden_layers 2"),
    "missing vocab": (_no_vocab, "vocab file not found"),
    "not bert": (_not_bert, "not a BERT checkpoint"),
    "garbage index": (_garbage_index, "bert_model.ckpt.index"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_one_line_nonzero_no_output(tf_dirs, tmp_path, case):
    breaker, needle = BAD[case]
    src = _copy(tf_dirs["tiny3"], tmp_path / "src")
    breaker(src)
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", "tf2of", src, "-o", out / "of", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("bert-of: error: "), lines
    assert needle in lines[0], lines[0]
    assert os.listdir(out) == []  # no partial output, no temp leftovers


def test_shape_errors_show_tf_layout():
    """Kernels are [in, out] on disk; the message must show them that way, not transposed."""
    from bert_of.tensors import expected_shapes
    from bert_of.config import BertConfig
    from bert_of.errors import CheckpointError
    from bert_of.converters.reader import check, zeros
    from bert_of.converters.formats.tf1 import TABLE

    cfg = BertConfig.from_google_dict(TINY)
    shapes = expected_shapes(cfg)
    shapes["bert.encoder.layer.1.intermediate.dense.weight"] = (36, 32)  # canonical [out, in]
    with pytest.raises(CheckpointError, match=r"layer_1/intermediate/dense/kernel has shape \[32, 36\] "
                                              r"but the config implies \[32, 37\]"):
        check([], cfg, "ckpt", TABLE, fill=zeros(shapes.items(), "float32"))


def test_inspect_prints_the_steps_value_not_its_size(tmp_path):
    """A checkpoint TensorFlow's Saver wrote at global_step 3: inspect says step 3 (it said "step 1",
    the scalar's element count)."""
    d = tmp_path / "tf3"
    d.mkdir()
    ref_ckpt.make_checkpoint(str(d / "bert_model.ckpt"), dict(TINY), seed=3, heads=("pretraining",),
                             with_optimizer=True, global_step=3)
    (d / "bert_config.json").write_text(json.dumps(TINY))
    out = run_cli("inspect", d).stdout.splitlines()
    assert out[-1].endswith("; step 3") and "step 1" not in out[-1], out[-1]
    info = json.loads(run_cli("inspect", d, "--json").stdout)
    assert info["step"] == 3 and "step" not in info["elements_by_kind"]
