"""OneFlow's own checkpoints: flow.save folders of bert_of's modules, the Oneflow-Inc/models BERT and
LiBai's BERT (post-LN and pre-LN), made here with OneFlow 0.9 from modules with those models'
names and math (tests/helpers/native_models.py), converted, verified against those modules' own forward,
written back and loaded by flow.load + load_state_dict(strict=True); hostile pickled_data refused."""

import json
import os
import pickle
from dataclasses import replace

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError
from bert_of.converters.containers import flow_save
from bert_of.converters.source import Options
from bert_of.converters.convert import convert, detect, read
from bert_of.errors import CheckpointError, ConfigError
from bert_of.converters.verify.compare import make_batch, max_abs_diff, run_bert_of, verify
from bert_of.heads import BertForPreTraining, BertForQuestionAnswering
from bert_of.modeling import BertModel
from tests.helpers import native_models as nm
from tests.conftest import TINY, error_lines, run_cli, write_vocab

pytestmark = pytest.mark.oneflow

MODELS_ARGS = dict(vocab_size=TINY["vocab_size"], seq_length=16, hidden_size=32, hidden_layers=3, atten_heads=4,
                   intermediate_size=37, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                   max_position_embeddings=40, type_vocab_size=3)
LIBAI_CFG = dict(vocab_size=TINY["vocab_size"], hidden_size=32, hidden_layers=3, num_attention_heads=4,
                 intermediate_size=37, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 max_position_embeddings=40, num_tokentypes=3, add_pooling_layer=True, initializer_range=0.02,
                 layernorm_eps=1e-5, bias_gelu_fusion=True, bias_dropout_fusion=True, scale_mask_softmax_fusion=True,
                 apply_query_key_layer_scaling=True, apply_residual_post_layernorm=False, add_binary_head=True,
                 amp_enabled=False)
OUTPUTS = ("sequence_output", "pooled_output", "prediction_logits", "seq_relationship_logits")


def _yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v < 1e-4:
        return f"{v:.1e}"  # yaml.dump writes 1.0e-05
    return str(v)


def write_libai_run(run, module, cfg, target="libai.models.BertForPreTraining", as_global=True):
    """A LiBai run directory: output_dir/config.yaml (yaml.dump's layout) + model_final/model/ (flow.save,
    global tensors with global_dst_rank=0, as LiBai saves)."""
    os.makedirs(run / "model_final", exist_ok=True)
    flat = ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in sorted(cfg.items()))
    (run / "config.yaml").write_text(
        "dataloader:\n  train:\n    _target_: libai.data.build_nlp_train_val_test_loader\n"
        "    dataset:\n    - _target_: libai.data.datasets.BertDataset\n      max_seq_length: 512\n"
        f"model:\n  _target_: {target}\n  cfg: {{{flat}}}\n"
        "train:\n  output_dir: ./output\n  train_iter: 10\n  amp: {enabled: false}\n  dist: {data_parallel_size: 1}\n")
    sd = module.state_dict()
    if as_global:
        module.to_global(placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast)
        sd = module.state_dict()
        flow.save(sd, str(run / "model_final" / "model"), global_dst_rank=0)
        module.to_local()
    else:
        flow.save(sd, str(run / "model_final" / "model"))
    write_vocab(run / "vocab.txt", cfg["vocab_size"])
    return str(run / "model_final" / "model")


@pytest.fixture(scope="module")
def batch():
    return make_batch(BertConfig.from_google_dict(dict(TINY)), batch_size=3, seq_len=16)


def _ours(path, batch, modes=("eager",)):
    return run_bert_of(read(path), batch, modes=modes)["eager"]


def _compare(ref, ours, names, rows=None):
    diffs = {}
    for k in names:
        a, b = ref[k], ours[k]
        if rows is not None and a.ndim >= 2 and a.shape[1] == rows.shape[1]:
            a, b = a[rows], b[rows]  # real tokens only (LiBai masks padded query rows too)
        diffs[k] = max_abs_diff(a, b)
    return diffs


def _bit_exact(a_path, b_path):
    a, b = read(a_path).load(), read(b_path).load()
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


# --------------------------------------------------------------------------- bert_of's own module


def test_bert_of_module_state_dict(tmp_path, batch, monkeypatch):
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    config = BertConfig.from_google_dict(dict(TINY))
    model = BertForPreTraining(config)
    model.init_weights(7)
    nm.randomize(model, 1)
    ckpt = tmp_path / "ckpt"
    flow.save(model.state_dict(), str(ckpt))
    (ckpt / "config.json").write_text(config.to_json_string())
    write_vocab(ckpt / "vocab.txt", TINY["vocab_size"])
    assert detect(str(ckpt)) == "ofsd"

    out = run_cli("inspect", str(ckpt), "--json")
    info = json.loads(out.stdout)
    assert info["format"] == "ofsd" and info["parameters"] == config.num_parameters()
    loaded = BertForPreTraining.from_pretrained(str(ckpt))
    ref = nm.run(model, batch)
    got = nm.run(loaded, batch)
    assert all(np.array_equal(ref[k], got[k]) for k in OUTPUTS)

    for fmt in ("of", "tf", "hf"):
        convert(f"ofsd2{fmt}", str(ckpt), str(tmp_path / fmt))
    for fmt in ("of", "hf", "tf"):
        report = verify(str(ckpt), str(tmp_path / fmt), modes=("eager",))
        assert report["ok"], (fmt, report["max_abs_diff"])
    convert("of2ofsd", str(tmp_path / "of"), str(tmp_path / "back"))
    convert("ofsd2of", str(tmp_path / "back"), str(tmp_path / "back-of"))
    _bit_exact(str(tmp_path / "of"), str(tmp_path / "back-of"))
    fresh = BertForPreTraining(config)
    fresh.load_state_dict(flow.load(str(tmp_path / "back")), strict=True)
    assert all(np.array_equal(ref[k], nm.run(fresh, batch)[k]) for k in OUTPUTS)


@pytest.mark.parametrize("cls", [BertForPreTraining, BertModel], ids=["pretraining", "bare"])
def test_pre_ln_module_state_dict_names_its_layer_norms_where_they_sit(tmp_path, batch, cls):
    """A pre-LN model's own state dict (input_layer_norm, post_attention_layer_norm,
    final_layer_norm) reads as ofsd, and of2ofsd writes what load_state_dict(strict=True) takes."""
    config = replace(BertConfig.from_google_dict(dict(TINY)), layernorm_placement="pre")
    model = cls(config)
    model.init_weights(5)
    nm.randomize(model, 2)
    ckpt = tmp_path / "ckpt"
    flow.save(model.state_dict(), str(ckpt))
    (ckpt / "config.json").write_text(config.to_json_string())
    write_vocab(ckpt / "vocab.txt", TINY["vocab_size"])
    assert any("input_layer_norm" in k for k in model.state_dict())
    convert("ofsd2of", str(ckpt), str(tmp_path / "of"))
    ref = model.canonical_state()
    got = read(str(tmp_path / "of")).load()
    assert set(got) == set(ref) and all(np.array_equal(got[k], ref[k]) for k in ref)
    convert("of2ofsd", str(tmp_path / "of"), str(tmp_path / "back"))
    fresh = cls(config)
    fresh.load_state_dict(flow.load(str(tmp_path / "back")), strict=True)
    assert all(np.array_equal(v, ref[k]) for k, v in fresh.canonical_state().items())


def test_writer_bytes_are_flow_saves(tmp_path):
    """pickled_data written by bert_of == what OneFlow 0.9's flow.save writes for the same state dict
    (buffers, parameters, a tied parameter under two keys, global tensors)."""
    module = nm.ModelsBertForPreTraining(MODELS_ARGS)
    flow.save(module.state_dict(), str(tmp_path / "local"))
    lin = flow.nn.Linear(3, 2).to_global(placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast)
    flow.save(lin.state_dict(), str(tmp_path / "global"), global_dst_rank=0)
    for d in ("local", "global"):
        raw = (tmp_path / d / "pickled_data").read_bytes()
        records = flow_save.parse_pickled_data(raw, d)
        assert flow_save.pickle_state_dict([(k, r.cls, r.folder) for k, r in records.items()]) == raw
    records = flow_save.parse_pickled_data((tmp_path / "local" / "pickled_data").read_bytes(), "local")
    assert records["cls.predictions.decoder.weight"].folder == records["bert.embeddings.word_embeddings.weight"].folder
    assert records["cls.predictions.decoder.bias"].folder == records["cls.predictions.output_bias"].folder
    assert records["bert.embeddings.position_ids"].cls == "oneflow.Tensor"


# --------------------------------------------------------------------------- Oneflow-Inc/models


@pytest.mark.parametrize("old", [False, True], ids=["current", "bare-parameter revision"])
def test_ofmodels_pretraining(tmp_path, batch, old):
    module = nm.randomize(nm.ModelsBertForPreTraining(MODELS_ARGS, old=old), 2)
    ckpt = tmp_path / "epoch_1_val_acc_0.5"
    flow.save(module.state_dict(), str(ckpt))
    args = tmp_path / "args.yaml"  # the constructor's arguments, as --config (YAML)
    args.write_text("".join(f"{k}: {v}\n" for k, v in MODELS_ARGS.items()))
    write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"])
    assert detect(str(ckpt)) == "ofmodels"
    out = run_cli("convert", "ofmodels2of", str(ckpt), "-o", str(tmp_path / "of"), "--config", str(args), "-v")
    # every tensor accounted for: 62 mapped; the current revision also has position_ids and the tied decoder
    assert out.stdout.startswith("62 source tensors: 62 mapped" if old else "65 source tensors: 3 dropped, 62 mapped")
    src = read(str(tmp_path / "of"))
    assert src.config.hidden_act == "gelu_erf" and src.config.layer_norm_eps == 1e-5
    diffs = _compare(nm.run(module, batch), _ours(str(tmp_path / "of"), batch), OUTPUTS)
    assert max(diffs.values()) <= 1e-5, diffs
    if old:
        return
    for fmt in ("tf", "hf"):
        convert(f"of2{fmt}", str(tmp_path / "of"), str(tmp_path / fmt))
        report = verify(str(tmp_path / "of"), str(tmp_path / fmt), modes=("eager",))
        assert report["ok"], (fmt, report["max_abs_diff"])
    convert("of2ofmodels", str(tmp_path / "of"), str(tmp_path / "back"))
    convert("ofmodels2of", str(tmp_path / "back"), str(tmp_path / "back-of"))
    _bit_exact(str(tmp_path / "of"), str(tmp_path / "back-of"))
    fresh = nm.ModelsBertForPreTraining(MODELS_ARGS)
    fresh.load_state_dict(flow.load(str(tmp_path / "back")), strict=True)
    got = nm.run(fresh, batch)
    assert all(np.array_equal(nm.run(module, batch)[k], got[k]) for k in OUTPUTS)
    assert np.array_equal(fresh.cls.predictions.decoder.weight.numpy(),
                          fresh.bert.embeddings.word_embeddings.weight.numpy())


def test_ofmodels_squad(tmp_path, batch, monkeypatch):
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    module = nm.randomize(nm.ModelsSQuAD(MODELS_ARGS), 3)
    ckpt = tmp_path / "snapshot_best"
    flow.save(module.state_dict(), str(ckpt))
    (tmp_path / "config.json").write_text(json.dumps(MODELS_ARGS))  # beside the snapshot
    write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"])
    convert("ofmodels2of", str(ckpt), str(tmp_path / "of"))
    diffs = _compare(nm.run(module, batch), _ours(str(tmp_path / "of"), batch),
                     ("sequence_output", "start_logits", "end_logits"))
    assert max(diffs.values()) <= 1e-5, diffs
    qa = BertForQuestionAnswering.from_pretrained(str(ckpt))  # through the resolver, config beside
    assert np.array_equal(nm.run(qa, batch)["start_logits"], _ours(str(tmp_path / "of"), batch)["start_logits"])
    convert("of2ofmodels", str(tmp_path / "of"), str(tmp_path / "back"))
    nm.ModelsSQuAD(MODELS_ARGS).load_state_dict(flow.load(str(tmp_path / "back")), strict=True)


# --------------------------------------------------------------------------- LiBai


@pytest.mark.parametrize("post", [True, False], ids=["post-LN", "pre-LN"])
def test_libai_pretraining(tmp_path, batch, post, monkeypatch):
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    cfg = dict(LIBAI_CFG, apply_residual_post_layernorm=post)
    module = nm.randomize(nm.LibaiBertForPreTraining(cfg), 4)
    ref = nm.run(module, batch)
    model_dir = write_libai_run(tmp_path / "run", module, cfg)
    assert detect(model_dir) == "libai"
    assert all(n.startswith("global_tensor_") for n in os.listdir(model_dir) if n != "pickled_data")
    convert("libai2of", model_dir, str(tmp_path / "of"))
    config = read(str(tmp_path / "of")).config
    assert config.pre_ln is (not post) and config.query_key_layer_scaling and config.head_layer_norm_eps == 1e-5
    real = batch["attention_mask"].astype(bool)
    diffs = _compare(ref, _ours(str(tmp_path / "of"), batch), OUTPUTS, rows=real)
    assert max(diffs.values()) <= 1e-5, diffs
    loaded = BertForPreTraining.from_pretrained(model_dir)  # the run's config.yaml found two levels up
    assert loaded.config.pre_ln is (not post)
    # the placement is what makes them equal: the other one is a different network
    other = BertForPreTraining.from_pretrained(str(tmp_path / "of"), layernorm_placement="pre" if post else "post")
    assert max(_compare(ref, nm.run(other, batch), OUTPUTS, rows=real).values()) > 1e-2

    if post:
        for fmt in ("tf", "hf"):
            out = run_cli("convert", f"of2{fmt}", str(tmp_path / "of"), "-o", str(tmp_path / fmt))
            assert "query-key layer scaling" in out.stdout
            assert verify(str(tmp_path / "of"), str(tmp_path / fmt), modes=("eager",))["ok"]
    else:
        for fmt in ("tf", "hf", "h5", "lazy", "ofmodels"):
            r = run_cli("convert", f"libai2{fmt}", model_dir, "-o", str(tmp_path / fmt), check=False)
            lines = error_lines(r.stderr)
            assert r.returncode == 1 and len(lines) == 1 and "pre-LN" in lines[0], (fmt, r.stderr)
            assert not os.path.exists(tmp_path / fmt)
    convert("of2libai", str(tmp_path / "of"), str(tmp_path / "back"))
    convert("libai2of", str(tmp_path / "back"), str(tmp_path / "back-of"))
    _bit_exact(str(tmp_path / "of"), str(tmp_path / "back-of"))
    fresh = nm.LibaiBertForPreTraining(cfg)
    fresh.load_state_dict(flow.load(str(tmp_path / "back")), strict=True)
    got = nm.run(fresh, batch)
    assert all(np.array_equal(ref[k], got[k]) for k in OUTPUTS)


def test_libai_qkv_layout_is_per_head(tmp_path):
    """The fused weight's rows are [heads, 3, head_size]: q of head h is rows 3*D*h .. 3*D*h+D."""
    cfg = dict(LIBAI_CFG, hidden_layers=1)
    module = nm.randomize(nm.LibaiBertForPreTraining(cfg), 5)
    model_dir = write_libai_run(tmp_path / "run", module, cfg, as_global=False)
    t = read(model_dir).load()
    W = module.bert.encoders[0].self_attention.query_key_value.weight.numpy()
    D = 32 // 4
    for h in range(4):
        for j, n in enumerate(("query", "key", "value")):
            got = t[f"bert.encoder.layer.0.attention.self.{n}.weight"][h * D:(h + 1) * D]
            assert np.array_equal(got, W[(3 * h + j) * D:(3 * h + j + 1) * D])


def test_libai_classification(tmp_path, batch):
    cfg = dict(LIBAI_CFG, apply_residual_post_layernorm=True, num_labels=3)
    module = nm.randomize(nm.LibaiBertForClassification(cfg), 6)
    model_dir = write_libai_run(tmp_path / "run", module, cfg, target="libai.models.BertForClassification")
    out = run_cli("inspect", model_dir, "--config", str(tmp_path / "run" / "config.yaml"))
    assert "format libai" in out.stdout
    convert("libai2of", model_dir, str(tmp_path / "of"))
    real = batch["attention_mask"].astype(bool)
    diffs = _compare(nm.run(module, batch), _ours(str(tmp_path / "of"), batch),
                     ("sequence_output", "pooled_output", "logits"), rows=real)
    assert max(diffs.values()) <= 1e-5, diffs
    convert("of2libai", str(tmp_path / "of"), str(tmp_path / "back"))
    nm.LibaiBertForClassification(cfg).load_state_dict(flow.load(str(tmp_path / "back")), strict=True)


def test_older_layout_one_folder_per_key(tmp_path, batch):
    """OneFlow 0.5-0.7 eager saves: no pickled_data, one folder per key (out + meta), snapshot_done."""
    module = nm.randomize(nm.ModelsBertForPreTraining(MODELS_ARGS), 8)
    old = tmp_path / "old"
    old.mkdir()
    for k, v in module.state_dict().items():
        flow_save.write_tensor(str(old / k), v.numpy())
    (old / "snapshot_done").write_text("")
    (old / "config.json").write_text(json.dumps(MODELS_ARGS))
    write_vocab(old / "vocab.txt", TINY["vocab_size"])
    assert detect(str(old)) == "ofmodels"
    convert("ofmodels2of", str(old), str(tmp_path / "of"))
    diffs = _compare(nm.run(module, batch), _ours(str(tmp_path / "of"), batch), OUTPUTS)
    assert max(diffs.values()) <= 1e-5, diffs
    fresh = nm.ModelsBertForPreTraining(MODELS_ARGS)  # OneFlow 0.9 reads this layout too
    with pytest.warns(UserWarning, match="does not have valid tensor data"):  # it skips config.json, vocab.txt
        state = flow.load(str(old))
    fresh.load_state_dict(state, strict=True)


# --------------------------------------------------------------------------- hostile pickled_data


class _Runs:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile_folder(tmp_path, name, raw=None, tensor_link=False):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(BertConfig.from_google_dict(dict(TINY)).to_json_string())
    flow_save.write_tensor(str(d / "tensor_0"), np.zeros((2, 2), np.float32))
    (d / "pickled_data").write_bytes(raw if raw is not None else flow_save.pickle_state_dict(
        [("bert.pooler.dense.bias", "oneflow.nn.Parameter", "tensor_0")]))
    if tensor_link:
        os.rename(d / "tensor_0", tmp_path / f"{name}-real")
        os.symlink(tmp_path / f"{name}-real", d / "tensor_0")
    return str(d)


def test_hostile_pickled_data_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    good = flow_save.pickle_state_dict([("bert.pooler.dense.bias", "oneflow.nn.Parameter", "tensor_0")])
    cases = {
        "foreign global": (pickle.dumps({"protocol_version": 1, "data": _Runs(marker)}, protocol=4),
                           "global posix.system"),
        "reduce of another callable": (
            good.replace(b")\x81", b")R", 1), "REDUCE of oneflow.nn.Parameter"),
        "truncated": (good[:len(good) // 2], "truncated stream"),
        "another opcode": (good.replace(b"K\x01", b"I01\n", 1), "pickle opcode b'I'"),  # INT: not flow.save's
        "outside the folder": (flow_save.pickle_state_dict(
            [("bert.pooler.dense.bias", "oneflow.nn.Parameter", "../outside")]), "not a folder inside"),
    }
    for name, (raw, want) in cases.items():
        d = _hostile_folder(tmp_path, name.replace(" ", "_"), raw)
        for args in (("inspect", d), ("convert", "ofsd2of", d, "-o", str(tmp_path / "out"))):
            r = run_cli(*args, check=False)
            lines = error_lines(r.stderr)
            assert r.returncode == 1 and len(lines) == 1 and want in lines[0], (name, r.stderr)
            assert lines[0].startswith("bert-of: error:") and "Traceback" not in r.stderr
    d = _hostile_folder(tmp_path, "symlink", tensor_link=True)
    old = tmp_path / "old-layout"  # no pickled_data: the key folder itself a symlink
    old.mkdir()
    (old / "config.json").write_text(BertConfig.from_google_dict(dict(TINY)).to_json_string())
    os.symlink(tmp_path / "symlink-real", old / "bert.pooler.dense.bias")
    for path in (d, str(old)):
        r = run_cli("inspect", path, check=False)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and "symlink" in lines[0], r.stderr
    assert not marker.exists() and not os.path.exists(tmp_path / "out")
    pickle.loads(cases["foreign global"][0])  # the same bytes, unpickled, do run: the test would see it
    assert marker.exists()


def test_pickled_data_reads_are_bounded_in_bytes_and_work(tmp_path):
    """A FIFO or a link to /dev/zero is refused before reading; pickles near the 64 MiB cap made of
    empty dicts or memo entries are refused after bounded work (not GBs of objects)."""
    import resource
    import time

    fifo = _hostile_folder(tmp_path, "fifo", raw=b"")
    os.remove(os.path.join(fifo, "pickled_data"))
    os.mkfifo(os.path.join(fifo, "pickled_data"))
    zero = _hostile_folder(tmp_path, "zero", raw=b"")
    os.remove(os.path.join(zero, "pickled_data"))
    os.symlink("/dev/zero", os.path.join(zero, "pickled_data"))
    n = (flow_save.MAX_PICKLE - 16) // 2
    dicts = _hostile_folder(tmp_path, "dicts", b"\x80\x04" + b"}\x94" * n + b".")
    memo = _hostile_folder(tmp_path, "memo", b"\x80\x04}" + b"\x94" * (2 * n) + b".")
    for d, want in ((fifo, "not a regular file"), (zero, "symlink"), (dicts, "refused"), (memo, "more objects")):
        t0 = time.monotonic()
        r = run_cli("inspect", d, check=False, process=True, timeout=120)  # a hang fails by the timeout
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and want in lines[0], (d, r.stderr)
        assert time.monotonic() - t0 < 60, d
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckpointError, match="more objects"):
        flow_save.parse_pickled_data(b"\x80\x04}" + b"\x94" * (2 * n) + b".", "memo")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 512, grown_mib  # was ~5 GB for such a pickle


def test_a_config_yaml_with_a_long_line_is_read_in_linear_time(tmp_path):
    from bert_of.converters.formats.oneflow_native.config import parse_yaml
    import time

    long_key = "model:\n  cfg: {a: 1}\n" + "k" + " " * 200_000 + "x\n"  # no colon: backtracked for minutes
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="not in the YAML subset"):
        parse_yaml(long_key, "c")
    with pytest.raises(ConfigError, match="nested over 64"):
        parse_yaml("a: " + "[" * 5000 + "]" * 5000 + "\n", "c")  # was a RecursionError
    assert parse_yaml("a" + " " * 200_000 + ": [" + "1, " * 50_000 + "1]\n", "c") == {"a": [1] * 50_001}
    assert time.monotonic() - t0 < 20


META_SPELLINGS = [  # (meta text, whether flow.load reads it): protobuf text format, as OneFlow 0.9 parses it
    ("shape {\n  dim: 2\n  dim: 2\n}\ndata_type: kFloat\n", True),  # what flow.save writes
    ("shape { dim: [2, 2] } data_type: kFloat", True),  # a repeated field as a list
    ("shape: < dim: 2; dim: 0x2 >, data_type: 2;", True),  # ':' before a message, <>, separators, hex, a number
    ("# a comment\nshape {dim: 02 dim: [2]} data_type: kFloat # another\n", True),  # C octal 02
    ("shape { dim: 2 dim: 2 } shape { dim: 2 dim: 2 } data_type: kFloat", False),  # a message field twice
    ("shape { dim: 2 dim: 2 } data_type: kFloat data_type: kFloat", False),  # a scalar twice
    ("shape { dim: 2 dim: 2 } data_type: 02", False),  # an enum number is int(text, 0): no C octal
    ("shape { dim 2 dim 2 } data_type: kFloat", False),  # a scalar needs its ':'
    ("shape { dim: [2 2] } data_type: kFloat", False),  # list items need ','
    ("shape { dim: 2 dim: 2 } data_type: 99", False),  # no such DataType
    ("shape [ dim: 2 ] data_type: kFloat", False),
]


@pytest.mark.parametrize("text,loads", META_SPELLINGS, ids=range(len(META_SPELLINGS)))
def test_meta_is_read_exactly_as_flow_load_reads_it(tmp_path, text, loads):
    d = _hostile_folder(tmp_path, "ck")
    with open(os.path.join(d, "tensor_0", "meta"), "w") as f:
        f.write(text)
    try:
        got = flow.load(d)["bert.pooler.dense.bias"].numpy()
        flow_reads = True
    except Exception:  # noqa: BLE001 - protobuf's ParseError and OneFlow's errors alike
        flow_reads = False
    assert flow_reads is loads  # the control: OneFlow itself
    if loads:
        (entry,) = flow_save.read_dir(d)
        assert entry.shape == got.shape == (2, 2) and entry.dtype == got.dtype
    else:
        with pytest.raises(CheckpointError, match="not a VariableMetaInfo"):
            flow_save.read_dir(d)


# --------------------------------------------------------------------------- configs


def test_yaml_subset_reads_what_yaml_dump_writes():
    """The layout LazyConfig.save's yaml.dump(default_flow_style=None) gives (checked by hand against
    PyYAML on a real LiBai run config: the same document)."""
    from bert_of.converters.formats.oneflow_native.config import parse_yaml

    text = ("dataloader:\n  train:\n    dataset:\n    - _target_: libai.data.datasets.BertDataset\n"
            "      data_prefix: /data/loss_compara_content_sentence\n      indexed_dataset: {_target_: x, skip_warmup: false}\n"
            "    num_workers: 4\n  test: []\n"
            "model:\n  _target_: libai.models.BertForPreTraining\n"
            "  cfg: {apply_residual_post_layernorm: false, layernorm_eps: 1.0e-05, name: 'it''s', vocab_size: 30522}\n"
            "train:\n  amp: {enabled: true}\n  load_weight: ''\n  seed: 1234\n  train_micro_batch_size: 16\n"
            "  rdma_enabled: ~\n  nested: [1, [2, 3.5], {a: null}]\n")
    assert parse_yaml(text, "c") == {
        "dataloader": {"train": {"dataset": [{"_target_": "libai.data.datasets.BertDataset",
                                              "data_prefix": "/data/loss_compara_content_sentence",
                                              "indexed_dataset": {"_target_": "x", "skip_warmup": False}}],
                                 "num_workers": 4}, "test": []},
        "model": {"_target_": "libai.models.BertForPreTraining",
                  "cfg": {"apply_residual_post_layernorm": False, "layernorm_eps": 1e-5, "name": "it's",
                          "vocab_size": 30522}},
        "train": {"amp": {"enabled": True}, "load_weight": "", "seed": 1234, "train_micro_batch_size": 16,
                  "rdma_enabled": None, "nested": [1, [2, 3.5], {"a": None}]}}


def test_config_errors_are_one_line(tmp_path):
    cfg = dict(LIBAI_CFG)
    module = nm.LibaiBertForPreTraining(cfg)
    model_dir = write_libai_run(tmp_path / "run", module, cfg, as_global=False)
    os.remove(tmp_path / "run" / "config.yaml")
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps({"model_type": "bert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 3,
                              "num_attention_heads": 4, "intermediate_size": 37}))
    anchors = tmp_path / "anchors.yaml"
    anchors.write_text("model:\n  cfg: &c {hidden_layers: 3}\n")
    for extra, want in (((), "pass --config"), (("--config", str(hf)), "LayerNorm placement is in its LiBai config"),
                        (("--config", str(anchors)), "give the config as JSON")):
        r = run_cli("inspect", model_dir, *extra, check=False)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and want in lines[0], r.stderr


@pytest.mark.parametrize("pooler", [True, False], ids=["pooler", "add_pooling_layer false"])
def test_libai_bare_bert_model(tmp_path, batch, pooler):
    """LiBai's BertModel alone: keys without the bert. prefix, read and written back so; without a
    pooler (zeros in between, left out again)."""
    cfg = dict(LIBAI_CFG, add_pooling_layer=pooler)
    module = nm.randomize(nm.LibaiBertModel(cfg), 9)
    model_dir = write_libai_run(tmp_path / "run", module, cfg, target="libai.models.BertModel", as_global=False)
    assert "encoders.0.self_attention.query_key_value.weight" in flow.load(model_dir)
    convert("libai2of", model_dir, str(tmp_path / "of"))
    ids, types, mask = (flow.tensor(batch[k], dtype=flow.int64) for k in ("input_ids", "token_type_ids",
                                                                          "attention_mask"))
    with flow.no_grad():
        seq, pooled = module(ids, mask, types)
    real = batch["attention_mask"].astype(bool)
    ours = _ours(str(tmp_path / "of"), batch)
    assert max_abs_diff(seq.numpy()[real], ours["sequence_output"][real]) <= 1e-5
    if pooler:
        assert max_abs_diff(pooled.numpy(), ours["pooled_output"]) <= 1e-5
    else:
        assert not read(str(tmp_path / "of")).load()["bert.pooler.dense.weight"].any()
    convert("of2libai", str(tmp_path / "of"), str(tmp_path / "back"))
    nm.LibaiBertModel(cfg).load_state_dict(flow.load(str(tmp_path / "back")), strict=True)


def _rewrite(src, dst, change):
    """The flow.save folder ``src`` rewritten to ``dst`` with ``change(items)`` applied to its
    [(key, array)] (each key its own tensor: tied copies stored apart), config and vocabulary kept."""
    import shutil

    items = [(e.key, flow_save.read_tensor(e)) for e in flow_save.read_dir(str(src))]
    os.makedirs(dst)
    flow_save.write_state_dict(str(dst), [(k, "oneflow.nn.Parameter", (lambda a=a: a)) for k, a in change(items)])
    for f in ("config.json", "vocab.txt"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return str(dst)


def test_flow_save_kinds_read_through_the_one_skeleton(tmp_path):
    """A flow.save folder's keys are the reader skeleton's one Hit: an unknown key, a tied copy that
    differs, a wrong buffer, a fused QKV that does not split are refused with the skeleton's lines."""
    write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"])
    cfg = dict(TINY, max_position_embeddings=40)
    google = tmp_path / "google"
    from bert_of.converters.verify import tf_reference_checkpoint as ref

    google.mkdir()
    ref.make_checkpoint(str(google / "bert_model.ckpt"), cfg, seed=3, heads=("pretraining",))
    (google / "bert_config.json").write_text(json.dumps(cfg))
    write_vocab(google / "vocab.txt", TINY["vocab_size"])
    convert("tf2ofmodels", str(google), str(tmp_path / "models"))
    convert("tf2libai", str(google), str(tmp_path / "libai"))
    ok = read(str(tmp_path / "models"), "ofmodels", Options())
    kinds = {r.source: (r.action, r.note) for r in ok.report}
    assert kinds["bert.embeddings.position_ids"][0] == "dropped" and "buffer" in kinds["bert.embeddings.position_ids"][1]
    assert kinds["cls.predictions.decoder.weight"] == ("dropped", "the MLM decoder's weight IS the word embeddings "
                                                                  "(clone_weights), equal")
    libai = read(str(tmp_path / "libai"), "libai", Options())
    fused = [r for r in libai.report if r.source.endswith("query_key_value.weight")]
    assert len(fused) == 3 and fused[0].target.count(",") == 2  # one stored tensor, three canonical names
    where = lambda d: os.path.join(d, "pickled_data")  # noqa: E731

    def extra(items):
        return items + [("bert.extra.weight", np.zeros(3, np.float32))]
    bad = _rewrite(tmp_path / "models", tmp_path / "unknown", extra)
    with pytest.raises(CheckpointError) as e:
        read(bad, "ofmodels", Options())
    assert str(e.value) == f"{where(bad)}: unknown tensor bert.extra.weight (not BERT; --skip-unknown drops them)"
    kept = read(bad, "ofmodels", Options(skip_unknown=True))
    assert ("bert.extra.weight", "dropped") in {(r.source, r.action) for r in kept.report}

    def untied(items):
        return [(k, a + 1 if k == "cls.predictions.decoder.weight" else a) for k, a in items]
    bad = _rewrite(tmp_path / "models", tmp_path / "untied", untied)
    with pytest.raises(CheckpointError, match="tensor cls.predictions.decoder.weight differs from "
                                         "bert.embeddings.word_embeddings.weight; the model ties them"):
        read(bad, "ofmodels", Options()).load()

    def positions(items):
        return [(k, a[:, ::-1].copy() if k == "bert.embeddings.position_ids" else a) for k, a in items]
    bad = _rewrite(tmp_path / "models", tmp_path / "positions", positions)
    with pytest.raises(CheckpointError, match=r"buffer bert.embeddings.position_ids is not 0..39 as int64 \[1, 40\]"):
        read(bad, "ofmodels", Options())

    def cut(items):
        return [(k, a[:-1] if k.endswith("encoders.0.self_attention.query_key_value.bias") else a) for k, a in items]
    bad = _rewrite(tmp_path / "libai", tmp_path / "cut", cut)
    with pytest.raises(CheckpointError, match=r"tensor bert.encoders.0.self_attention.query_key_value.bias has shape "
                                         r"\[95\], not 3 fused parts"):
        read(bad, "libai", Options())
