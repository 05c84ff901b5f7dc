"""NVIDIA DeepLearningExamples' own runs (tests/data/nvidia_real/, made by make_fixtures.py there:
run_pretraining.py with its LAMB and with AdamW, run_squad.py, at 482fe9ac (erf GELU) and 729963dd
(tanh GELU)) read as their maker meant: optimizer state, the vocabulary padded to 8, the GELU read
from evidence and checked against the outputs NVIDIA's own modeling.py computed on them."""

import os

import numpy as np
import pytest

from bert_of.converters.convert import read
from bert_of.converters.formats import nvidia
from bert_of.converters.source import Options
from bert_of.converters.verify.reference_forward import forward
from bert_of.errors import CheckpointError
from tests.conftest import ROOT, error_lines, run_cli

DATA = os.path.join(ROOT, "tests", "data", "nvidia_real")
PRETRAIN = [f"pretrain_{era}_{opt}" for era in ("old", "new") for opt in ("lamb", "adamw")]
ERA_ACT = {"old": "gelu_erf", "new": "gelu_tanh"}


def _maker(name, act=None, numerics=None):
    """(the reference forward of the read checkpoint, NVIDIA's own outputs for the same inputs)."""
    source = read(os.path.join(DATA, name), "nvidia", Options(numerics=numerics))
    layout = nvidia.Reference.from_source(source)
    if act:
        layout.act = act
    saved = np.load(os.path.join(DATA, name, "nvidia_outputs.npz"))
    out = forward(layout, {k: saved[k] for k in ("input_ids", "token_type_ids", "attention_mask")},
                  source.config.num_attention_heads)
    return out["sequence_output"], saved["sequence_output"]


@pytest.mark.parametrize("name", PRETRAIN)
def test_pretraining_run_reads_with_its_eras_gelu(name):
    """The checkpoint's keys say its era; the GELU read from them gives NVIDIA's outputs (<= 1e-5),
    the other GELU does not (the control)."""
    era = name.split("_")[1]
    source = read(os.path.join(DATA, name), "nvidia", Options(with_optimizer=True))
    assert source.config.hidden_act == ERA_ACT[era]
    assert "a9e2c1d5" in source.numerics_from
    assert source.config.vocab_size == 112  # bert_config.json says 110: run time pads to 112
    names = {s.name for s, _ in source.optimizer}
    assert "step" in names and any(n.startswith("m/") for n in names) and any(n.startswith("v/") for n in names)
    assert source.optimizer_meta["optimizer"] == name.split("_")[2]
    ours, theirs = _maker(name)
    assert np.abs(ours - theirs).max() <= 1e-5
    wrong = {"gelu_erf": "gelu_tanh", "gelu_tanh": "gelu_erf"}[ERA_ACT[era]]
    ours, theirs = _maker(name, act=wrong)
    assert np.abs(ours - theirs).max() > 1e-5


@pytest.mark.parametrize("name", PRETRAIN)
def test_pretraining_run_inspects(name):
    r = run_cli("inspect", os.path.join(DATA, name))
    assert r.returncode == 0, r.stderr
    assert "numerics: " + ERA_ACT[name.split("_")[1]] in r.stdout


def test_squad_output_has_no_evidence_and_asks():
    """run_squad.py saves {'model': state_dict} only: nothing says the GELU, so bert_of asks; with
    --numerics the maker's GELU matches NVIDIA's outputs, the other fails."""
    for era in ("old", "new"):
        folder = os.path.join(DATA, f"squad_{era}")
        with pytest.raises(CheckpointError, match="--numerics hf .erf. or --numerics tf1"):
            read(folder, "nvidia", Options())
        r = run_cli("inspect", folder)
        assert r.returncode == 0 and "act=unknown" in r.stdout, r.stderr
        flag = {"old": "hf", "new": "tf1"}[era]
        ours, theirs = _maker(f"squad_{era}", numerics=flag)
        assert np.abs(ours - theirs).max() <= 1e-5
        ours, theirs = _maker(f"squad_{era}", numerics={"hf": "tf1", "tf1": "hf"}[flag])
        assert np.abs(ours - theirs).max() > 1e-5


def test_squad_vocab_passed_or_beside_same_answer(tmp_path):
    """bert_config.json says the padded 112, the run's vocab.txt has 110: --vocab and beside agree."""
    vocab = os.path.join(DATA, "vocab.txt")
    passed = read(os.path.join(DATA, "squad_old"), "nvidia", Options(vocab=vocab, numerics="hf"))
    beside = tmp_path / "squad"
    beside.mkdir()
    for n in os.listdir(os.path.join(DATA, "squad_old")):
        (beside / n).write_bytes(open(os.path.join(DATA, "squad_old", n), "rb").read())
    (beside / "vocab.txt").write_bytes(open(vocab, "rb").read())
    found = read(str(beside), "nvidia", Options(numerics="hf"))
    assert passed.config.vocab_size == found.config.vocab_size == 112
    assert [r.note for r in passed.report if r.target.endswith("word_embeddings.weight")] == \
        [r.note for r in found.report if r.target.endswith("word_embeddings.weight")]


def test_numerics_refused_where_contradicted_or_recorded(tmp_path):
    """--numerics never overrides evidence (the keys of an erf-era run) nor a named activation."""
    import json
    import shutil

    with pytest.raises(CheckpointError, match="contradicts"):
        read(os.path.join(DATA, "pretrain_old_lamb"), "nvidia", Options(numerics="tf1"))
    with pytest.raises(CheckpointError, match="does not apply to a nvidia"):
        read(os.path.join(DATA, "squad_old"), "nvidia", Options(numerics="lazy"))
    relu = tmp_path / "relu"
    shutil.copytree(os.path.join(DATA, "squad_old"), relu)
    cfg = json.loads((relu / "bert_config.json").read_text())
    cfg["hidden_act"] = "relu"
    (relu / "bert_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="records hidden_act 'relu'"):
        read(str(relu), "nvidia", Options(numerics="hf"))
    assert read(str(relu), "nvidia", Options()).config.hidden_act == "relu"


@pytest.mark.oneflow
@pytest.mark.parametrize("name", PRETRAIN + ["squad_old", "squad_new"])
def test_real_runs_convert_with_verify(name, tmp_path):
    extra = ["--numerics", "hf" if name.endswith("old") else "tf1"] if name.startswith("squad") else []
    if name.startswith("squad"):
        extra += ["--vocab", os.path.join(DATA, "vocab.txt")]
    r = run_cli("convert", "nvidia2of", os.path.join(DATA, name), "-o", tmp_path / "of", "--verify", *extra)
    assert r.returncode == 0, error_lines(r.stderr)
    if name.startswith("pretrain"):
        r = run_cli("convert", "nvidia2of", os.path.join(DATA, name), "-o", tmp_path / "of2", "--with-optimizer")
        assert r.returncode == 0, error_lines(r.stderr)


@pytest.mark.oneflow
def test_verify_checks_the_makers_gelu_not_an_assumption(tmp_path):
    """The control through `verify`: an erf run_squad.py output, converted with its maker's GELU, is
    verified when A is read as erf and fails when A is read as tanh."""
    src = os.path.join(DATA, "squad_old")
    vocab = os.path.join(DATA, "vocab.txt")
    run_cli("convert", "nvidia2of", src, "-o", tmp_path / "of", "--numerics", "hf", "--vocab", vocab)
    run_cli("verify", src, tmp_path / "of", "--numerics", "hf", "--vocab", vocab)
    r = run_cli("verify", src, tmp_path / "of", "--numerics", "tf1", "--vocab", vocab, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "forward outputs differ" in lines[0], r.stderr
    r = run_cli("verify", src, tmp_path / "of", "--vocab", vocab, check=False)  # nothing says: asked, not guessed
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "--numerics hf (erf) or --numerics tf1" in lines[0], r.stderr


@pytest.mark.oneflow
@pytest.mark.parametrize("name", ["pretrain_old_adamw", "pretrain_new_lamb"])
def test_real_runs_continue_pretraining_and_load(name, tmp_path):
    """pretrain --init-checkpoint on the HDF5 data the run trained on, with its 110-token vocabulary
    passed (the model has 112 rows); from_pretrained computes the era's GELU."""
    from bert_of import BertForPreTraining

    r = run_cli("pretrain", "--data", os.path.join(DATA, "hdf5"), "-o", tmp_path / "run", "--init-checkpoint",
                os.path.join(DATA, name), "--vocab", os.path.join(DATA, "vocab.txt"), "--steps", "2",
                "--batch-size", "8", "--mode", "eager")
    assert r.returncode == 0 and os.path.isdir(tmp_path / "run" / "final")
    model = BertForPreTraining.from_pretrained(os.path.join(DATA, name))
    assert model.config.hidden_act == ERA_ACT[name.split("_")[1]] and model.config.vocab_size == 112


def test_state_of_other_groupings_is_dropped_with_its_reason(tmp_path):
    """A ckpt_N.pt whose optimizer groups its parameters otherwise (one group, as a user's own loop
    would): its weights convert; its state, which no index names, is reported dropped with the
    reason, in inspect and convert alike (never "unknown tensor", never guessed)."""
    import shutil

    from bert_of.converters.containers.torch_zip import StateDict, Tensor, TorchZipFile, write_torch_zip

    z = TorchZipFile(os.path.join(DATA, "pretrain_new_adamw", "ckpt_6.pt"), state_dict=False)
    keys = list(z.obj["model"])
    sd = StateDict((k, Tensor(str(i), z.tensors["model/" + k].dtype, tuple(z.tensors["model/" + k].shape),
                              (lambda k=k: z.get("model/" + k)))) for i, k in enumerate(keys))
    n = len(keys) - 1  # named_parameters(): the tied decoder once
    state = {0: {"step": Tensor("s", np.dtype("<f4"), (), lambda: np.array(6, np.float32)),
                 "exp_avg": sd[keys[0]], "exp_avg_sq": sd[keys[0]]}}
    obj = {"model": sd, "optimizer": {"state": state, "param_groups": [
        {"params": list(range(n)), "lr": 0.01, "initial_lr": 0.01, "amsgrad": False}]}, "epoch": 0}
    d = tmp_path / "run"
    d.mkdir()
    write_torch_zip(str(d / "ckpt_6.pt"), obj)
    z.close()
    for f in ("bert_config.json", "vocab.txt"):
        shutil.copy(os.path.join(DATA, "pretrain_new_adamw", f), d)
    source = read(str(d), "nvidia", Options(with_optimizer=True, numerics="tf1"))
    dropped = {r.source: r.note for r in source.report if r.action == "dropped"}
    assert "not run_pretraining.py's" in dropped["optimizer/state/0/exp_avg"]
    assert [s.name for s, _ in source.optimizer] == ["step"] and len(source.tensors) == n
    r = run_cli("inspect", d, "--json")
    assert r.returncode == 0, r.stderr
