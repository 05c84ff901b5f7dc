"""NVIDIA DeepLearningExamples' PyTorch BERT: ckpt_N.pt (model + FusedLAMBAMP state) and SQuAD
pytorch_model.bin + config.json, written by our torch zip writer, read as data, forward-equal to the
reference in NVIDIA's own names and numerics, round trips bit for bit; controls that must fail."""

import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from bert_of.converters.formats import nvidia
from bert_of.converters.verify import tf_reference_checkpoint as ref
from bert_of.converters.convert import convert, detect, read
from bert_of.converters.source import Options
from bert_of.converters.containers.torch_zip import TorchZipFile
from bert_of.converters.verify.compare import verify
from bert_of.errors import CheckpointError
from tests.conftest import TINY, error_lines, run_cli, write_vocab

pytestmark = pytest.mark.tf

PADDED = dict(TINY, vocab_size=104)  # a multiple of 8 beyond vocab.txt's 99 lines, as NVIDIA's configs


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """{"of": bert_of dir with LAMB-shaped optimizer state, "ckpt": its ckpt_7.pt folder, "squad": a QA
    pytorch_model.bin folder}."""
    root = tmp_path_factory.mktemp("nvidia")
    google = root / "google"
    google.mkdir()
    ref.make_checkpoint(str(google / "bert_model.ckpt"), PADDED, seed=4, heads=("pretraining",), realistic=True,
                        with_optimizer=True, global_step=7)
    (google / "bert_config.json").write_text(json.dumps(PADDED))
    write_vocab(google / "vocab.txt", TINY["vocab_size"])
    convert("tf2of", str(google), str(root / "of"), Options(with_optimizer=True))
    convert("of2nvidia", str(root / "of"), str(root / "ckpt"), Options(with_optimizer=True))
    squad = root / "google-squad"
    squad.mkdir()
    ref.make_checkpoint(str(squad / "bert_model.ckpt"), PADDED, seed=5, heads=("squad",), realistic=True)
    shutil.copy(google / "bert_config.json", squad)
    shutil.copy(google / "vocab.txt", squad)
    convert("tf2nvidia", str(squad), str(root / "squad"))
    return {"of": str(root / "of"), "ckpt": str(root / "ckpt"), "squad": str(root / "squad"),
            "google-squad": str(squad)}


def test_ckpt_is_run_pretrainings_layout(made):
    assert sorted(os.listdir(made["ckpt"])) == ["ckpt_7.pt", "config.json", "vocab.txt"]
    z = TorchZipFile(os.path.join(made["ckpt"], "ckpt_7.pt"), state_dict=False)
    assert sorted(z.obj) == ["epoch", "model", "optimizer"]
    model = z.obj["model"]
    assert "bert.encoder.layer.0.intermediate.dense_act.weight" in model and "bert.pooler.dense_act.bias" in model
    assert z.same_view("model/cls.predictions.decoder.weight", "model/bert.embeddings.word_embeddings.weight")
    groups = z.obj["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    no_decay = [n for n in model if any(x in n for x in nvidia.NO_DECAY)]
    assert len(groups[1]["params"]) == len(no_decay) and len(z.obj["optimizer"]["state"]) == len(model) - 1
    assert detect(made["ckpt"]) == "nvidia" and detect(os.path.join(made["ckpt"], "ckpt_7.pt")) == "nvidia"
    assert detect(made["squad"]) == "nvidia" and detect(made["of"]) == "of"


def test_read_reports_every_tensor_and_the_padded_vocabulary(made):
    src = read(made["ckpt"], "nvidia", Options(with_optimizer=True))
    lines = {r.source: r for r in src.report}
    assert lines["cls.predictions.decoder.weight"].action == "dropped"
    assert "5 padding rows kept" in lines["bert.embeddings.word_embeddings.weight"].note
    assert src.config.vocab_size == 104 and src.config.hidden_act == "gelu_tanh" and src.config.layer_norm_eps == 1e-12
    kinds = {r.action for r in src.report}
    assert kinds == {"mapped", "dropped", "optimizer"}
    opt = {s.name: p for s, p in src.optimizer}
    assert int(opt["step"]()) == 7 and sum(k.startswith("m/") for k in opt) == len(src.tensors)
    plain = read(made["ckpt"], "nvidia", Options())  # without --with-optimizer: said, not read
    assert not plain.optimizer and any("--with-optimizer" in r.note for r in plain.report)


def test_round_trips_are_bit_exact_with_the_lamb_state(made, tmp_path):
    convert("nvidia2of", made["ckpt"], str(tmp_path / "back"), Options(with_optimizer=True))
    a = read(made["of"], "of", Options(with_optimizer=True))
    b = read(str(tmp_path / "back"), "of", Options(with_optimizer=True))
    for x, y in ((a.tensors, b.tensors), (a.optimizer, b.optimizer)):
        want, got = {s.name: p() for s, p in x}, {s.name: p() for s, p in y}
        assert sorted(want) == sorted(got)
        for k in want:
            assert want[k].dtype == got[k].dtype and want[k].tobytes() == got[k].tobytes(), k
    convert("nvidia2of", made["squad"], str(tmp_path / "qa"))
    convert("of2nvidia", str(tmp_path / "qa"), str(tmp_path / "qa-nv"))
    one, two = (TorchZipFile(os.path.join(p, "pytorch_model.bin"), state_dict=False)
                for p in (made["squad"], tmp_path / "qa-nv"))
    assert sorted(one.obj) == ["model"] and sorted(one.keys()) == sorted(two.keys()) and "model/qa_outputs.weight" in one.keys()
    assert all(one.get(k).tobytes() == two.get(k).tobytes() for k in one.keys())


def test_nvidia2of_verify_and_the_controls_that_must_fail(made, tmp_path):
    r = run_cli("convert", "nvidia2of", made["squad"], "-o", tmp_path / "of", "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and report["reference"] == "numpy-float64 (nvidia layout)" and report["worst"] <= 1e-5
    assert {"start_logits", "end_logits"} <= set(report["outputs"])
    report = verify(made["google-squad"], made["squad"], modes=("eager",))  # Google's TF files vs ours
    assert report["ok"] and "B:numpy-float64 (nvidia layout)" in report["max_abs_diff"], report["max_abs_diff"]
    # controls: the erf GELU NVIDIA does not compute; a pooler transposed
    erf = shutil.copytree(made["squad"], tmp_path / "erf")
    cfg = json.loads((erf / "config.json").read_text())
    (erf / "config.json").write_text(json.dumps(dict(cfg, bert_of_hidden_act="gelu_erf")))
    assert not verify(made["google-squad"], str(erf), modes=("eager",))["ok"]
    flipped = tmp_path / "flipped"
    convert("nvidia2of", made["squad"], str(flipped))
    from safetensors.numpy import load_file, save_file
    t = load_file(flipped / "model.safetensors")
    k = "bert.pooler.dense.weight"
    t[k] = np.ascontiguousarray(t[k].T)
    save_file(t, flipped / "model.safetensors", metadata={"format": "pt"})
    assert not verify(made["squad"], str(flipped), modes=("eager",))["ok"]


def test_hostile_and_foreign_files_are_one_line(made, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(os.path.join(made["squad"], "config.json"), bad)
    with zipfile.ZipFile(os.path.join(made["squad"], "pytorch_model.bin")) as z, \
            zipfile.ZipFile(bad / "pytorch_model.bin", "w") as w:
        for info in z.infolist():
            data = z.read(info)
            if info.filename.endswith("data.pkl"):  # a foreign global among the data
                data = data.replace(b"ccollections\nOrderedDict\n", b"cos\nsystem\n", 1)
            w.writestr(info, data)
    r = run_cli("convert", "nvidia2of", bad, "-o", tmp_path / "out", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "refusing to unpickle global os.system" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
    untied = tmp_path / "untied"
    convert("of2nvidia", made["of"], str(untied))
    z = TorchZipFile(os.path.join(untied, "pytorch_model.bin"), state_dict=False)
    from bert_of.converters.containers.torch_zip import StateDict, Tensor, write_torch_zip
    sd = StateDict()
    for n in z.obj["model"]:
        arr = z.get(f"model/{n}")
        sd[n] = Tensor(str(len(sd)), arr.dtype, arr.shape, (lambda a=arr + (1 if n == nvidia.DECODER else 0): a))
    sd["bert.extra.weight"] = Tensor("x", np.dtype("<f4"), (2,), lambda: np.zeros(2, np.float32))
    write_torch_zip(os.path.join(untied, "pytorch_model.bin"), {"model": sd})
    with pytest.raises(CheckpointError, match="unknown tensor bert.extra.weight"):
        read(str(untied), "nvidia", Options())
    with pytest.raises(CheckpointError, match="tensor cls.predictions.decoder.weight differs from "
                                              "bert.embeddings.word_embeddings.weight"):
        read(str(untied), "nvidia", Options(skip_unknown=True)).load()


def test_older_checkpoints_master_params_are_reported(made, tmp_path):
    """An older run_pretraining.py (apex amp) also saved 'master params': fp32 copies, dropped and said."""
    from bert_of.converters.containers.torch_zip import StateDict, Tensor, write_torch_zip

    z = TorchZipFile(os.path.join(made["squad"], "pytorch_model.bin"), state_dict=False)
    sd = StateDict((n, Tensor(str(i), z.dtype(f"model/{n}"), z.shape(f"model/{n}"), (lambda n=n: z.get(f"model/{n}"))))
                   for i, n in enumerate(z.obj["model"]))
    master = [Tensor(f"m{i}", np.dtype("<f4"), (2,), lambda: np.ones(2, np.float32)) for i in range(2)]
    old = tmp_path / "old"
    old.mkdir()
    write_torch_zip(str(old / "ckpt_3.pt"), {"model": sd, "master params": master, "files": [0, "a.hdf5"], "epoch": 1})
    shutil.copy(os.path.join(made["squad"], "config.json"), old)
    src = read(str(old), "nvidia", Options())
    notes = [r.note for r in src.report if r.source.startswith("master params/")]
    assert len(notes) == 2 and all("master copy" in n for n in notes)
