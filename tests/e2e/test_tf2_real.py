"""Model Garden's own trainers' files (tests/data/tf2_real/, made by make_fixtures.py there:
`official.nlp.train --experiment=bert/pretraining` and `--experiment=bert/squad`, tf-models-official
2.15.0 on CPU, plus the pretrained encoder export fine-tuning starts from) read as their maker meant:
the trainer's global_step, Adam slots, BertPretrainerV2's classification head accounted for, and the
float64 reference on what was read equal to what Model Garden's own model computed."""

import os

import numpy as np
import pytest

from bert_of.converters.convert import read
from bert_of.converters.source import Options
from bert_of.converters.verify import reference_np
from bert_of.converters.verify.reference_forward import forward
from bert_of.converters.containers import tf1_bundle
from tests.conftest import ROOT, error_lines, run_cli

DATA = os.path.join(ROOT, "tests", "data", "tf2_real")
RUNS = ["pretrain", "pretrained", "squad"]
# recorded output -> the reference's name for it
OUTPUTS = {"sequence_output": "sequence_output", "pooled_output": "pooled_output",
           "mlm_logits": "prediction_logits", "start_logits": "start_logits", "end_logits": "end_logits"}


def _compare(name, act=None):
    """{output: max |reference - Model Garden|} on the recorded batch."""
    source = read(os.path.join(DATA, name), "tf2", Options())
    layout = reference_np.ModelGarden.from_source(source)
    if act:
        layout.act = act
    saved = np.load(os.path.join(DATA, name, "garden_outputs.npz"))
    out = forward(layout, {k: saved[k] for k in ("input_ids", "token_type_ids", "attention_mask")},
                  source.config.num_attention_heads)
    return {k: float(np.abs(out[ours] - saved[k]).max()) for k, ours in OUTPUTS.items() if k in saved}


@pytest.mark.parametrize("name", RUNS)
def test_reference_equals_model_gardens_outputs(name):
    """Model Garden's "gelu" is the tanh form: read so, every recorded output within 1e-5; the erf
    GELU on the same weights is not (the control)."""
    diffs = _compare(name)
    want = {"pretrain": {"sequence_output", "pooled_output", "mlm_logits"},
            "pretrained": {"sequence_output", "pooled_output", "mlm_logits"},
            "squad": {"sequence_output", "pooled_output", "start_logits", "end_logits"}}[name]
    assert set(diffs) == want
    assert max(diffs.values()) <= 1e-5, diffs
    assert _compare(name, act="gelu_erf")["sequence_output"] > 1e-4


def test_trainer_checkpoint_is_accounted_for():
    """The trainer's ckpt-6: model/ (BertPretrainerV2), optimizer/ (AdamWeightDecay with slots in the
    graph), global_step beside the optimizer's iter; every stored tensor has a line."""
    path = os.path.join(DATA, "pretrain")
    source = read(path, "tf2", Options(with_optimizer=True))
    index = tf1_bundle.read_index(tf1_bundle.resolve_prefix(path))
    assert sorted(r.source for r in source.report) == sorted(index)
    assert source.path.endswith("ckpt-6")  # the `checkpoint` state file's newest
    by_source = {r.source: r for r in source.report}
    step = by_source["global_step/.ATTRIBUTES/VARIABLE_VALUE"]
    assert step.action == "optimizer" and step.target == "step"
    assert by_source["optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"].action == "dropped"
    opt = {s.name: p() for s, p in source.optimizer}
    assert int(opt["step"]) == 6
    names = {s.name for s, _ in source.tensors}
    assert "cls.predictions.bias" in names and not any(n.startswith("cls.seq_relationship") for n in names)
    slots = {n for n in opt if n.startswith(("m/", "v/"))}
    # one m and one v per weight the loss reached: the encoder's own pooler is not (the next_sentence
    # head pools [CLS] with its own dense layer), so the trainer kept no slots for it
    trained = {n for n in names if not n.startswith("bert.pooler.")}
    assert slots == {f"{p}/{n}" for p in ("m", "v") for n in trained}
    heads = [r for r in source.report if "classification_heads/0/" in r.source or "pooler_dense" in r.source]
    assert len(heads) == 12 and all(r.action == "dropped" and "classification head" in r.note for r in heads)


def test_squad_trainer_checkpoint_has_the_span_head():
    source = read(os.path.join(DATA, "squad"), "tf2", Options(with_optimizer=True))
    names = {s.name for s, _ in source.tensors}
    assert {"qa_outputs.weight", "qa_outputs.bias"} <= names and not any(n.startswith("cls.") for n in names)
    assert int({s.name: p() for s, p in source.optimizer}["step"]) == 4
    assert [s.name for s, _ in source.optimizer].count("step") == 1


@pytest.mark.parametrize("name", RUNS)
def test_inspect_tells_the_truth(name):
    r = run_cli("inspect", os.path.join(DATA, name))
    assert r.returncode == 0, r.stderr
    assert "format tf2" in r.stdout
    assert "L=2 H=32 A=2 I=64 V=100 P=64 T=2 act=gelu_tanh ln_eps=1e-12" in r.stdout
    if name == "squad":
        assert "qa_outputs.weight" in r.stdout and "cls.predictions" not in r.stdout
    else:
        assert "cls.predictions.bias" in r.stdout and "cls.seq_relationship" not in r.stdout
    step = {"pretrain": "; step 6", "squad": "; step 4", "pretrained": None}[name]  # the trainer's global_step
    assert (step in r.stdout) if step else ("; step" not in r.stdout)  # the export holds no optimizer
    if name == "pretrain":
        import json
        info = json.loads(run_cli("inspect", os.path.join(DATA, name), "--json").stdout)
        assert info["step"] == 6
        assert sum("classification_heads/0/" in k or "pooler_dense" in k for k in info["dropped"]) == 12


@pytest.mark.oneflow
@pytest.mark.parametrize("name", RUNS)
def test_convert_with_verify(name, tmp_path):
    vocab = ["--vocab", os.path.join(DATA, "vocab.txt")]
    r = run_cli("convert", "tf22of", os.path.join(DATA, name), "-o", tmp_path / "of", "--verify", *vocab)
    assert r.returncode == 0, error_lines(r.stderr)
    if name != "pretrained":
        r = run_cli("convert", "tf22of", os.path.join(DATA, name), "-o", tmp_path / "of2", "--with-optimizer", *vocab)
        assert r.returncode == 0, error_lines(r.stderr)


def test_numerics_are_recorded_so_a_guess_is_refused(tmp_path):
    """Model Garden's numerics are known (the outputs above confirm tanh GELU, eps 1e-12): an erf
    reading asked for by --numerics is refused in one line, nothing written."""
    r = run_cli("convert", "tf22of", os.path.join(DATA, "squad"), "-o", tmp_path / "of", "--numerics", "hf",
                check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "does not apply to a tf2" in lines[0], r.stderr
    assert not os.path.exists(tmp_path / "of")
