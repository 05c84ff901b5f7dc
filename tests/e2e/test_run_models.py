"""A run folder is a model wherever a model is taken (issue 44): a real small pretraining run
(`pretrain -o RUN --config ...`, which keeps the config.json it was given at RUN's top) and a real
fine-tuning run made from it are each taken by `finetune --model`, `predict`, `eval`, `zoo add`,
`inspect`, `convert`, `verify` and `from_pretrained`, through the one rule
(bert_of.checkpoint.run_final); a run stopped before its end stands for its newest checkpoint,
with a note."""

import json
import os

import numpy as np
import pytest

from tests.conftest import ROOT, error_lines, run_cli

pytestmark = pytest.mark.oneflow  # the runs are trained here

TEXT = os.path.join(ROOT, "tests", "data", "text")
VOCAB = os.path.join(TEXT, "vocab.txt")
SST = os.path.join(ROOT, "tests", "data", "glue", "sst-2-train.tsv")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    home = {"BERT_OF_HOME": str(root / "home")}
    run_cli("data", "create-pretraining", "--input", os.path.join(TEXT, "sample_text.txt"), "--vocab", VOCAB,
            "-o", root / "data", "--max-seq-length", 64, "--max-predictions-per-seq", 10, "--dupe-factor", 1, "-q")
    cfg = root / "bert_config.json"
    cfg.write_text(json.dumps({"vocab_size": sum(1 for _ in open(VOCAB, encoding="utf-8")), "hidden_size": 32,
                               "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 37,
                               "max_position_embeddings": 64, "type_vocab_size": 2}))
    pre, stopped, ft = root / "pre", root / "stopped", root / "ft"
    common = ["--data", root / "data", "--config", cfg, "--batch-size", 4, "--mode", "eager", "-q"]
    run_cli("pretrain", "-o", pre, "--steps", 3, *common, env=home)
    run_cli("pretrain", "-o", stopped, "--steps", 4, "--save-every", 2, "--stop-after", 4, *common, env=home)
    run_cli("finetune", "glue", "--task", "sst-2", "--model", pre, "--train", SST, "-o", ft, "--max-seq-length", 32,
            "--batch-size", 10, "--steps", 3, "--mode", "eager", "-q", env=home)
    return {"root": root, "home": home, "pre": pre, "stopped": stopped, "ft": ft}


def test_a_pretraining_run_keeps_its_config_at_its_top(runs):
    """The case the old rule missed: a config.json beside final/ made the run look like a model."""
    assert (runs["pre"] / "config.json").is_file() and (runs["pre"] / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("kind", ["pre", "ft"])
def test_a_run_is_its_final_model_for_inspect_convert_verify(runs, kind, tmp_path):
    run = runs[kind]
    info = json.loads(run_cli("inspect", run, "--json").stdout)
    assert info["path"] == str(run / "final") and info["format"] == "of" and info["parameters"] > 0
    assert ("classifier.weight" in {t["name"] for t in info["tensors"]}) == (kind == "ft")
    run_cli("convert", "of2hf", run, "-o", tmp_path / "hf", "--verify")
    r = run_cli("verify", run, tmp_path / "hf", "--modes", "eager")
    assert "verify: ok:" in r.stdout and str(run / "final") in r.stdout, r.stdout


@pytest.mark.parametrize("kind", ["pre", "ft"])
def test_a_run_in_zoo_add_and_from_pretrained(runs, kind, tmp_path):
    import bert_of
    from bert_of.checkpoint import load_checkpoint

    run = runs[kind]
    r = run_cli("zoo", "add", run, "--name", f"run-{kind}", env={"BERT_OF_HOME": str(tmp_path / "home")})
    assert f"-> {run / 'final'} (of," in r.stdout + r.stderr, r.stdout + r.stderr
    model = bert_of.BertModel.from_pretrained(str(run))
    want = load_checkpoint(str(run / "final")).tensors["bert.embeddings.word_embeddings.weight"]
    got = model.state_dict()["embeddings.word_embeddings.weight"].numpy()
    assert np.array_equal(got, want)


def test_runs_as_model_for_predict_and_eval(runs, tmp_path):
    """`finetune --model RUN` made runs["ft"] from the pretraining run; predict/eval take the fine-tuned run."""
    args = json.load(open(runs["ft"] / "final" / "train_args.json"))
    assert args["task"] == "sst-2"
    run_cli("predict", "glue", "--model", runs["ft"], "--data", os.path.join(ROOT, "tests", "data", "glue",
            "sst-2-test.tsv"), "-o", tmp_path / "preds", "--mode", "eager", env=runs["home"])
    assert (tmp_path / "preds" / "predictions.tsv").read_text().startswith("index\tprediction")
    r = run_cli("eval", "glue", "--model", runs["ft"], "--task", "sst-2", "--data", SST, "--mode", "eager",
                "--max-seq-length", 32, env=runs["home"])
    assert 0 <= json.loads(r.stdout[r.stdout.index("{"):])["accuracy"] <= 100


def test_a_stopped_run_stands_for_its_newest_checkpoint_with_a_note(runs, tmp_path):
    run = runs["stopped"]
    newest = run / "checkpoints" / "step-0000004"
    assert not (run / "final").exists() and newest.is_dir()
    r = run_cli("inspect", run, "--json")
    assert json.loads(r.stdout)["path"] == str(newest)
    notes = [l for l in error_lines(r.stderr) if l.startswith("note:")]
    assert notes == [f"note: {run}: a training run with no final/ checkpoint (stopped before its end?); "
                     f"using its newest checkpoint {newest}"]  # once per process: this is its first use
    run_cli("convert", "of2hf", run, "-o", tmp_path / "hf", "--verify")
    r = run_cli("zoo", "add", run, "--name", "stopped", env={"BERT_OF_HOME": str(tmp_path / "home")})
    assert f"-> {newest} (of," in r.stdout + r.stderr


def test_a_run_with_no_checkpoint_at_all_is_one_line(tmp_path):
    run = tmp_path / "empty-run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "config.json").write_text("{}")
    r = run_cli("inspect", run, check=False)
    assert r.returncode == 1 and error_lines(r.stderr) == [
        f"bert-of: error: {run}: a training run with no final/ checkpoint and no periodic checkpoint in "
        "checkpoints/ (stopped before its first save?)"]
