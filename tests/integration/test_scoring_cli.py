"""The scoring commands as a user runs them: `bert-of eval squad-score`, `eval glue-score` and the
results store they append to, through the real command line (in process) on the fixture files."""

import csv
import hashlib
import io
import json
import os

import pytest

from bert_of.eval.results import append_result, load_results, make_record
from tests.conftest import ROOT, run_cli

D = os.path.join(ROOT, "tests", "data", "squad")
V11, P11 = os.path.join(D, "dev-v1.1-mini.json"), os.path.join(D, "predictions-v1.1.json")
V20, P20, NA20 = (os.path.join(D, n) for n in ("dev-v2.0-mini.json", "predictions-v2.0.json", "na-probs-v2.0.json"))
G = os.path.join(ROOT, "tests", "data", "glue")
HW = {"cpu": "Test CPU", "cpus": 2, "machine": "x86_64", "os": "Linux", "python": "3.10", "gpus": []}


def g(name):
    return os.path.join(G, name)


def run_eval(*args, env=None):
    """``bert-of ARGS``: its exit status, stdout and stderr."""
    return run_cli(*args, check=False, env=env)


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return str(path)


def test_glue_score_cli(tmp_path):
    res = tmp_path / "results.jsonl"
    r = run_eval("eval", "glue-score", "--task", "mnli", "--data", g("mnli-dev_matched.tsv"),
                 "--predictions", g("mnli-m-preds.tsv"), "--results", res, "--model", "bert-mini-test")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["task"] == "mnli-m" and out["examples"] == 3 and out["accuracy"] == pytest.approx(100 * 2 / 3)
    rec = json.loads(res.read_text())
    assert rec["task"] == "mnli-m" and rec["checkpoint"]["name"] == "bert-mini-test"
    assert rec["metrics"] == {"accuracy": out["accuracy"]}


@pytest.mark.parametrize("args, message", [
    (["--task", "cola", "--data", "cola-test.tsv", "--predictions", "cola-preds.txt"],
     "cola-test.tsv: has no labels (a test file?)"),
    (["--task", "cola", "--data", "cola-dev.tsv", "--predictions", "mrpc-preds.tsv"],
     "mrpc-preds.tsv: no prediction for index 5"),
    (["--task", "mrpc", "--data", "mrpc-dev.tsv", "--predictions", "cola-preds.txt"],
     "cola-preds.txt: 6 predictions for 5 examples"),
    (["--task", "nope", "--data", "mrpc-dev.tsv", "--predictions", "cola-preds.txt"], "unknown task 'nope'"),
    (["--task", "rte", "--data", "missing.tsv", "--predictions", "cola-preds.txt"], "missing.tsv: No such file"),
])
def test_glue_score_cli_errors(args, message):
    args = [g(a) if a.endswith((".tsv", ".txt")) else a for a in args]
    r = run_eval("eval", "glue-score", *args, "--no-record")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bert-of: error: ") and message in lines[0], r.stderr


def test_v1_fixture_by_hand(capsys):
    # q1 "france." = France (EM 1, F1 1); q2 "the 10th and 11th centuries" = gold 1 after
    # normalisation (1, 1); q3 F1 6/7; q4 "The" -> "" (0, 0); q5 no prediction (0, 0, still
    # counted); q6 "about 260 km": vs "roughly 260 kilometres" F1 1/3, vs "260 kilometres"
    # P 1/3 R 1/2 F1 0.4 -> max 0.4; q7 "  WARSAW  " (1, 1).
    r = run_eval("eval", "squad-score", "--data", V11, "--predictions", P11, "--no-record")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert list(out) == ["exact_match", "f1"]
    assert out["exact_match"] == pytest.approx(100 * 3 / 7, abs=1e-12)
    assert out["f1"] == pytest.approx(100 * (1 + 1 + 6 / 7 + 0 + 0 + 0.4 + 1) / 7, abs=1e-12)
    # stdout is exactly the official one-line JSON; the missing question is reported on stderr.
    assert r.stdout == json.dumps(out) + "\n"
    assert "Unanswered question q5 will receive score 0." in r.stderr
    assert "1 of 7 questions have no prediction" in r.stderr


def test_v2_cli_output_format():
    r = run_eval("eval", "squad-score", "--data", V20, "--predictions", P20, "--na-prob-file", NA20, "--no-record")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert r.stdout == json.dumps(out, indent=2) + "\n"  # evaluate-v2.0.py prints indent=2
    assert out["best_f1_thresh"] == 0.3


def test_v2_missing_predictions_are_skipped_and_reported(tmp_path):
    preds = json.load(open(P20))
    del preds["a4"]
    p = write_json(tmp_path / "p.json", preds)
    r = run_eval("eval", "squad-score", "--data", V20, "--predictions", p, "--no-record")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # a4 leaves every total: exact (a1 + a3) / 4, NoAns over a3 only.
    assert out["total"] == 4 and out["exact"] == 50.0 and out["NoAns_total"] == 1 and out["NoAns_exact"] == 100.0
    assert "Missing prediction for a4" in r.stderr
    assert "1 of 5 questions have no prediction and are not scored" in r.stderr


@pytest.mark.parametrize("data, preds, extra, message", [
    ("malformed.json", "predictions-v1.1.json", [], "malformed.json: malformed JSON at line 7 column 1"),
    ("empty.json", "predictions-v1.1.json", [], "empty.json: empty file"),
    ("dev-v1.1-mini.json", "predictions-unknown-id.json", [],
     "prediction id 'zz-not-a-question' is not a question in"),
    ("dev-v1.1-mini.json", "empty.json", [], "empty.json: empty file (expected a predictions JSON object)"),
    ("dev-v1.1-mini.json", "missing-file.json", [], "missing-file.json: predictions JSON object not found"),
    ("dev-v1.1-mini.json", "predictions-v1.1.json", ["--na-prob-file", "na-probs-v2.0.json"],
     "--na-prob-file applies to SQuAD v2.0 data"),
])
def test_bad_input_one_line_error(data, preds, extra, message):
    extra = [os.path.join(D, x) if x.endswith(".json") else x for x in extra]
    r = run_eval("eval", "squad-score", "--data", os.path.join(D, data), "--predictions", os.path.join(D, preds), *extra, "--no-record")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bert-of: error: ") and message in lines[0], lines[0]
    assert r.stdout == ""


def test_damaged_store_degrades_not_dies(tmp_path, caplog):
    """Garbage, a non-record and a torn tail (a crash or a full disk mid-append) are skipped with a warning
    naming the file; every good record is still read; the next append cuts the torn tail and lands whole."""
    store = tmp_path / "results.jsonl"
    rte, mrpc = ({"task": "rte", "metrics": {"accuracy": 65.0}}, {"task": "mrpc", "metrics": {"f1": 88.0}})
    torn = json.dumps({"task": "sst-2", "metrics": {"accuracy": 91.0}})[:25]
    store.write_text(json.dumps(rte) + "\n{not json\n" + json.dumps({"task": "qnli"}) + "\n" + json.dumps(mrpc) + "\n"
                     + torn)
    with caplog.at_level("WARNING", logger="bert_of"):
        recs = load_results(str(store))
    assert [(r["task"], r["metrics"]) for r in recs] == [("rte", rte["metrics"]), ("mrpc", mrpc["metrics"])]
    assert [r.getMessage() for r in caplog.records] == [
        f"{store}: skipped 2 unreadable line(s) (line 2, ...)",
        f'{store}: skipped 1 line(s) that are not result records (no "task" and "metrics")']
    # the command shows the good records and says what it skipped, one line each, exit 0
    said = ["warning: " + l.getMessage() for l in caplog.records]
    r = run_eval("results", "--results", store, "--measured-only", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert [row[0] for row in csv.reader(io.StringIO(r.stdout))] == ["task", "rte", "mrpc"]
    assert r.stderr.splitlines() == said
    # appending after the torn tail: the fragment is cut (with a warning), the new record is whole
    caplog.clear()
    with caplog.at_level("WARNING", logger="bert_of"):
        append_result(make_record("sst-2", {"accuracy": 92.0}, hardware=HW), str(store))
    assert caplog.records[0].getMessage().startswith(f"{store}: its last line was cut short")
    raw = store.read_bytes()
    assert raw.endswith(b"\n") and torn.encode() not in raw
    assert json.loads(raw.splitlines()[-1])["metrics"] == {"accuracy": 92.0}
    assert [x["task"] for x in load_results(str(store))] == ["rte", "mrpc", "sst-2"]


def test_every_evaluation_appends_a_record(tmp_path):
    home = tmp_path / "home"
    ck = tmp_path / "bert-tiny-of"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"\x00" * 64)
    env = {"BERT_OF_HOME": str(home)}
    # the official scripts' flags, with the model that made the predictions
    r = run_eval("eval", "squad-score", "--data", V11, "--predictions", P11, "--model", ck, "--hparam", "learning_rate=3e-5",
                 "--hparam", "note=first run", env=env)
    assert r.returncode == 0, r.stderr
    assert f"recorded in {home / 'results.jsonl'}" in r.stderr
    r = run_eval("eval", "squad-score", "--data", V20, "--predictions", P20, "--na-prob-file", NA20,
                 "--na-prob-thresh", "0.5", "--name", "my-v2-model", env=env)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in (home / "results.jsonl").read_text().splitlines()]
    assert [x["task"] for x in recs] == ["squad-v1.1", "squad-v2.0"]
    v1, v2 = recs
    assert v1["checkpoint"]["sha256"] == hashlib.sha256(b"\x00" * 64).hexdigest()
    assert v1["checkpoint"]["name"] == "bert-tiny-of"
    assert v1["hparams"] == {"learning_rate": 3e-5, "note": "first run"}
    assert v1["metrics"]["exact_match"] == pytest.approx(300 / 7) and v1["settings"]["missing_predictions"] == 1
    assert v1["data"]["sha256"] == hashlib.sha256(open(V11, "rb").read()).hexdigest()
    assert v1["hardware"]["cpus"] == os.cpu_count() and v1["date"][:2] == "20"
    assert v2["metrics"]["exact"] == pytest.approx(60.0) and v2["settings"]["na_prob_thresh"] == 0.5
    assert v2["checkpoint"] == {"name": "my-v2-model", "path": None, "format": None, "sha256": None}

    # `bert-of results`: markdown by default, measured and published rows, filters, formats
    r = run_eval("results", env=env)
    assert r.returncode == 0, r.stderr
    md = r.stdout.splitlines()
    assert any("bert-tiny-of" in l and "| measured |" in l for l in md)
    assert any("my-v2-model" in l and "exact 60.00, f1 75.00" in l for l in md)
    assert any("published (not measured)" in l for l in md)
    r = run_eval("results", "--task", "squad-v2.0", "--format", "json", env=env)
    rows = json.loads(r.stdout)
    assert [x["checkpoint"]["name"] for x in rows] == ["my-v2-model"]
    r = run_eval("results", "--measured-only", "--format", "csv", env=env)
    assert len(r.stdout.strip().splitlines()) == 3  # header + 2 measured rows
    r = run_eval("results", "--published-only", "--results", tmp_path / "none.jsonl")
    assert r.returncode == 0 and "| measured |" not in r.stdout
    # --no-record leaves the store alone
    run_eval("eval", "squad-score", "--data", V11, "--predictions", P11, "--no-record", env=env)
    assert len((home / "results.jsonl").read_text().splitlines()) == 2
