"""`bert-of predict|eval TASK --engine onnxruntime`: the same checkpoint, run by onnxruntime on the
ONNX graph `convert of2onnx` writes for it (built in memory), predicts what `--engine oneflow` does:
classes identical and probabilities within 1e-5 (classify, multi-label), regression values within
1e-5, the same tags, the same SQuAD answers, the same GLUE labels; the predictions files have the
same columns and rows.
Options only OneFlow honours are refused, one line each, before any work.

One tiny BERT per module (hidden 32, 2 layers), each task's checkpoint fine-tuned once for a few
steps (accuracy is not the point: the two engines' agreement is).
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import ROOT, error_lines, run_cli
from tests.helpers.blocked_imports import env_without
from tests.helpers.models import (DEV11, FAST, GL, LENGTHS, S_DEV, S_TRAIN, SST_TRAIN, TRAIN11, USER, build_vocab,
                                  tiny_bert, user_rows, user_vocab)

pytestmark = pytest.mark.oneflow
pytest.importorskip("onnxruntime")

R_TRAIN, R_DEV = (os.path.join(USER, f"ratings-{s}.csv") for s in ("train", "dev"))
T_TRAIN, T_DEV = (os.path.join(USER, f"topics-{s}.csv") for s in ("train", "dev"))
N_TRAIN, N_DEV = os.path.join(USER, "ner-train.conll"), os.path.join(USER, "ner-dev.conll")
ENGINES = ("oneflow", "onnxruntime")
ENGINE_LINE = "predict: engine onnxruntime"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    saved = os.environ.get("BERT_OF_HOME")
    os.environ["BERT_OF_HOME"] = str(root / "home")  # results store and eval folders inside the test
    try:
        vocab, n = user_vocab(root / "vocab.txt")
        yield SimpleNamespace(root=root, base=tiny_bert(root / "tiny", vocab, n, dropout=0.0), models={})
    finally:
        if saved is None:
            os.environ.pop("BERT_OF_HOME", None)
        else:
            os.environ["BERT_OF_HOME"] = saved


def finetuned(env, task: str, train: str, *extra, steps: int = 8) -> str:
    """The module's checkpoint of ``task`` on ``train`` (fine-tuned on first use, a few steps)."""
    key = (task, train, extra)
    if key not in env.models:
        run = env.root / f"{task}-{len(env.models)}"
        run_cli("finetune", task, "--model", env.base, "--train", train, "-o", run, "--steps", steps, "--lr", 3e-3,
                *FAST, "--no-record", *extra)
        env.models[key] = str(run)
    return env.models[key]


def both(folder, *args, name="predictions.csv"):
    """{engine: (its output file, stderr)} of the same command run by each engine."""
    out = {}
    for engine in ENGINES:
        target = folder / engine / name
        r = run_cli(*args, "-o", target, "--engine", engine, "--predict-batch-size", 4)
        out[engine] = (target, r.stderr)
    return out


def probabilities(rows, names):
    return np.array([[float(r[n]) for n in names] for r in rows])


def test_classify_engines_agree_and_the_file_is_the_same_columns_in_the_same_order(env, tmp_path):
    model = finetuned(env, "classify", S_TRAIN)
    got = both(tmp_path, "predict", "classify", "--model", model, "--data", S_DEV)
    flow_rows, ort_rows = (user_rows(got[e][0]) for e in ENGINES)
    assert list(flow_rows[0]) == list(ort_rows[0]) == list(user_rows(S_DEV)[0]) + \
        ["prediction", "p(negative)", "p(neutral)", "p(positive)"]
    assert [r["text"] for r in ort_rows] == [r["text"] for r in user_rows(S_DEV)]  # input order
    assert [r["prediction"] for r in ort_rows] == [r["prediction"] for r in flow_rows]
    p = [c for c in flow_rows[0] if c.startswith("p(")]
    np.testing.assert_allclose(probabilities(ort_rows, p), probabilities(flow_rows, p), rtol=0, atol=1e-5)
    assert ENGINE_LINE in got["onnxruntime"][1] and ENGINE_LINE not in got["oneflow"][1]
    assert sorted(os.listdir(tmp_path / "onnxruntime")) == ["predictions.csv"]  # nothing beside it
    assert "model.onnx" not in os.listdir(os.path.join(model, "final"))  # nor beside the model


def test_regression_values_agree_and_eval_records_the_engine(env, tmp_path):
    model = finetuned(env, "classify", R_TRAIN)
    scores, records = {}, {}
    for engine in ENGINES:
        store = tmp_path / f"{engine}.jsonl"
        r = run_cli("eval", "classify", "--model", model, "--data", R_DEV, "-o", tmp_path / engine,
                    "--engine", engine, "--results", store)
        scores[engine] = json.loads(r.stdout[r.stdout.index("{"):])
        records[engine] = json.loads(store.read_text().splitlines()[-1])
    rows = {e: user_rows(tmp_path / e / "predictions.csv") for e in ENGINES}
    assert list(rows["onnxruntime"][0]) == list(rows["oneflow"][0]) == list(user_rows(R_DEV)[0]) + ["score"]
    np.testing.assert_allclose(probabilities(rows["onnxruntime"], ["score"]), probabilities(rows["oneflow"], ["score"]),
                               rtol=0, atol=1e-5)
    assert scores["onnxruntime"]["problem"] == "regression"
    # MSE follows the values; a few steps leave them within ~1e-3 of each other, where Pearson and
    # Spearman are ruled by the 1e-6 differences, so only MSE is compared
    assert scores["onnxruntime"]["mse"] == pytest.approx(scores["oneflow"]["mse"], rel=1e-5)
    assert records["onnxruntime"]["settings"]["engine"] == "onnxruntime"
    assert records["oneflow"]["settings"]["engine"] == "oneflow"


def test_multi_label_sets_and_probabilities_agree(env, tmp_path):
    model = finetuned(env, "classify", T_TRAIN, "--problem", "multi_label")
    got = both(tmp_path, "predict", "classify", "--model", model, "--data", T_DEV)
    flow_rows, ort_rows = (user_rows(got[e][0]) for e in ENGINES)
    assert list(ort_rows[0]) == list(flow_rows[0])
    assert [r["prediction"] for r in ort_rows] == [r["prediction"] for r in flow_rows]
    p = [c for c in flow_rows[0] if c.startswith("p(")]
    assert len(p) > 2
    np.testing.assert_allclose(probabilities(ort_rows, p), probabilities(flow_rows, p), rtol=0, atol=1e-5)


def test_tags_agree(env, tmp_path):
    model = finetuned(env, "tag", N_TRAIN)
    got = both(tmp_path, "predict", "tag", "--model", model, "--data", N_DEV, name="predictions.conll")
    flow_text, ort_text = (open(got[e][0], encoding="utf-8").read() for e in ENGINES)
    assert ort_text == flow_text and ort_text.strip()
    # and eval's JSON Lines (tokens, gold tags, predicted tags) the same
    for engine in ENGINES:
        run_cli("eval", "tag", "--model", model, "--data", N_DEV, "-o", tmp_path / f"ev-{engine}", "--engine", engine,
                "--no-record")
    assert (tmp_path / "ev-onnxruntime" / "predictions.jsonl").read_text() == \
        (tmp_path / "ev-oneflow" / "predictions.jsonl").read_text()


@pytest.fixture(scope="module")
def fixture_base(tmp_path_factory):
    """A tiny BERT on the SQuAD and GLUE fixtures' vocabulary."""
    root = tmp_path_factory.mktemp("engines-fixtures")
    vocab, n = build_vocab(root / "vocab.txt")
    return SimpleNamespace(root=root, base=tiny_bert(root / "tiny", vocab, n, dropout=0.0))


@pytest.fixture(scope="module")
def squad_model(fixture_base):
    """The fixtures' tiny BERT fine-tuned a few steps on SQuAD v1.1."""
    ft = fixture_base.root / "squad"
    run_cli("finetune", "squad", "--model", fixture_base.base, "--train", TRAIN11, "-o", ft, *LENGTHS,
            "--batch-size", 16, "--steps", 8, "--lr", 3e-3, "--mode", "eager", "--no-record")
    return SimpleNamespace(ft=str(ft))


def test_squad_answers_agree_and_nbest_probabilities_within_1e_5(squad_model, tmp_path):
    got = both(tmp_path, "predict", "squad", "--model", squad_model.ft, "--data", DEV11, *LENGTHS,
               name="")
    preds = {e: json.load(open(tmp_path / e / "predictions.json")) for e in ENGINES}
    nbest = {e: json.load(open(tmp_path / e / "nbest_predictions.json")) for e in ENGINES}
    assert preds["onnxruntime"] == preds["oneflow"] and len(preds["oneflow"]) > 5
    for qid, flow_list in nbest["oneflow"].items():
        ort_list = nbest["onnxruntime"][qid]
        assert [x["text"] for x in ort_list] == [x["text"] for x in flow_list], qid
        np.testing.assert_allclose([x["probability"] for x in ort_list], [x["probability"] for x in flow_list],
                                   rtol=0, atol=1e-5)
    assert ENGINE_LINE in got["onnxruntime"][1]


def test_glue_predictions_and_accuracy_agree(fixture_base, tmp_path):
    ft = tmp_path / "sst"  # 20 sentences memorised: confident labels (not near-ties of 1e-6)
    run_cli("finetune", "glue", "--task", "sst-2", "--model", fixture_base.base, "--train", SST_TRAIN, "-o", ft,
            "--max-seq-length", 32, "--batch-size", 10, "--steps", 30, "--lr", 1e-3, "--mode", "eager", "--no-record")
    both(tmp_path / "test", "predict", "glue", "--model", ft, "--data", os.path.join(GL, "sst-2-test.tsv"), name="")
    flow, ort = ((tmp_path / "test" / e / "predictions.tsv").read_text() for e in ENGINES)
    assert ort == flow and flow.startswith("index\tprediction\n")
    scores = {}
    for engine in ENGINES:
        r = run_cli("eval", "glue", "--model", ft, "--data", SST_TRAIN, "-o", tmp_path / engine, "--engine", engine,
                    "--no-record")
        scores[engine] = json.loads(r.stdout[r.stdout.index("{"):])
    assert scores["onnxruntime"] == scores["oneflow"] and scores["oneflow"]["examples"] == 20
    flow, ort = ((tmp_path / e / "predictions.tsv").read_text() for e in ENGINES)
    assert ort == flow and len(flow.splitlines()) == 21


def _fails(*args):
    r = run_cli(*args, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("bert-of: error: "), r.stderr
    return lines[0][len("bert-of: error: "):]


@pytest.mark.parametrize("extra, line", [
    (["--mode", "graph"], "--mode graph is OneFlow's execution mode; --engine onnxruntime runs onnxruntime's own "
                          "session (leave --mode unset)"),
    (["--mode", "eager"], "--mode eager is OneFlow's execution mode; --engine onnxruntime runs onnxruntime's own "
                          "session (leave --mode unset)"),
    (["--device", "cuda"], "--device cuda: --engine onnxruntime runs on the CPU (onnxruntime's CPU provider); use "
                           "--engine oneflow for a GPU"),
    (["--nproc", "2"], "--engine onnxruntime runs in one process: --nproc / --nnodes (ranks) are OneFlow's; use "
                       "--engine oneflow for several ranks"),
])
def test_options_only_oneflow_honours_are_refused_in_one_line(env, tmp_path, extra, line):
    model = finetuned(env, "classify", S_TRAIN)
    out = tmp_path / "p.csv"
    assert _fails("predict", "classify", "--model", model, "--data", S_DEV, "-o", out, "--engine", "onnxruntime",
                  *extra) == line
    assert not out.exists()
    assert _fails("eval", "classify", "--model", model, "--data", S_DEV, "-o", tmp_path / "ev", "--engine",
                  "onnxruntime", "--no-record", *extra) == line
    assert not (tmp_path / "ev").exists()


def test_a_checkpoint_without_the_tasks_head_is_refused_not_initialised(env, tmp_path):
    """OneFlow initialises a missing head at random (with a warning); onnxruntime runs the checkpoint's
    own graph, which has no such head: one line."""
    assert _fails("predict", "squad", "--model", env.base, "--data", DEV11, *LENGTHS, "-o", tmp_path / "p",
                  "--engine", "onnxruntime") == \
        "tiny: no trained SQuAD (qa_outputs) head; --engine onnxruntime runs the checkpoint's own head (--engine " \
        "oneflow would initialise one at random)"
    assert not (tmp_path / "p").exists()


def test_a_pre_ln_checkpoint_is_refused_the_post_ln_graph(fixture_base, tmp_path):
    """of2onnx's graph is post-LN BERT's: a pre-LN checkpoint (LiBai's default) is refused, never run
    as another network."""
    from bert_of.config import BertConfig
    from bert_of.heads import BertForQuestionAnswering

    config = BertConfig.from_json_file(os.path.join(fixture_base.base, "config.json"))
    model = BertForQuestionAnswering(BertConfig.from_dict(dict(config.to_dict(), layernorm_placement="pre")))
    model.init_weights(seed=0)
    model.save_pretrained(str(tmp_path / "pre"), vocab_file=os.path.join(fixture_base.base, "vocab.txt"))
    line = _fails("predict", "squad", "--model", tmp_path / "pre", "--data", DEV11, *LENGTHS, "-o", tmp_path / "p",
                  "--engine", "onnxruntime")
    assert line.startswith(f"{tmp_path / 'pre'}: no ONNX graph: a pre-LN BERT (LayerNorm before attention"), line
    assert not (tmp_path / "p").exists()


def test_without_onnxruntime_the_engine_is_one_line_naming_the_extra(env, tmp_path):
    child = env_without("onnxruntime", tmp_path)
    r = subprocess.run([sys.executable, "-c", "import onnxruntime"], capture_output=True, text=True, env=child)
    assert r.returncode == 1 and "No module named 'onnxruntime'" in r.stderr  # the control
    out = tmp_path / "p.csv"
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "predict", "classify", "--model", str(env.base), "--data",
                        S_DEV, "-o", str(out), "--engine", "onnxruntime"], capture_output=True, text=True, env=child,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 1
    assert error_lines(r.stderr) == ["bert-of: error: --engine onnxruntime needs onnxruntime: pip install "
                                     "'bert_of[onnx]'"]
    assert not out.exists()
