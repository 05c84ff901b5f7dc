"""The results store (JSON lines) and `bert-of results` tables; published rows are marked."""

import csv
import hashlib
import io
import json
import os

import pytest

from tests.conftest import ROOT
from bert_of.eval.errors import ResultsError
from bert_of.eval.results import (append_result, checkpoint_identity, default_results_path, format_table, load_published,
                          load_results, make_record)

D = os.path.join(ROOT, "tests", "data", "squad")
V11, P11 = os.path.join(D, "dev-v1.1-mini.json"), os.path.join(D, "predictions-v1.1.json")
V20, P20, NA20 = (os.path.join(D, n) for n in ("dev-v2.0-mini.json", "predictions-v2.0.json", "na-probs-v2.0.json"))
HW = {"cpu": "Test CPU", "cpus": 2, "machine": "x86_64", "os": "Linux", "python": "3.10", "gpus": []}




def test_default_location(monkeypatch, tmp_path):
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    assert default_results_path() == str(tmp_path / "home" / "results.jsonl")
    monkeypatch.delenv("BERT_OF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_results_path() == str(tmp_path / "xdg" / "bert_of" / "results.jsonl")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_results_path() == os.path.join(os.path.expanduser("~"), ".cache", "bert_of", "results.jsonl")


def test_append_load_and_tables(tmp_path):
    store = str(tmp_path / "sub" / "results.jsonl")
    assert load_results(store) == []
    r1 = make_record("squad-v1.1", {"exact_match": 80.5, "f1": 88.25}, split="dev-v1.1.json",
                     checkpoint={"name": "bert-base-of", "path": "/m", "format": "bert_of", "sha256": "ab" * 32},
                     hparams={"lr": 3e-5, "epochs": 2}, hardware=HW, date="2026-11-30T10:00:00+00:00", tool="t")
    r2 = make_record("mrpc", {"f1": 88.0, "accuracy": 84.0}, hardware=HW, date="2026-11-30T11:00:00+00:00")
    append_result(r1, store)
    append_result(r2, store)
    lines = open(store).read().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["hparams"] == {"lr": 3e-5, "epochs": 2}
    recs = load_results(store)
    assert [r["task"] for r in recs] == ["squad-v1.1", "mrpc"] and all(r["kind"] == "measured" for r in recs)

    rows = recs + load_published()
    md = format_table(rows, "markdown").splitlines()
    assert md[0].startswith("| task | split | model | metrics | kind |")
    squad = [l for l in md if l.startswith("| squad-v1.1 ")]
    # published rows first within a task, each marked; then the measured row
    assert "published (not measured)" in squad[0] and "80.72" in squad[0]
    assert squad[-1].startswith("| squad-v1.1 | dev-v1.1.json | bert-base-of | exact_match 80.50, f1 88.25 | measured |")
    assert "abababababab" in squad[-1] and "Test CPU (2 cpus)" in squad[-1]

    table = list(csv.reader(io.StringIO(format_table(rows, "csv"))))
    head = table[0]
    assert head[:4] == ["task", "split", "model", "kind"] and "exact_match" in head and "mcc" in head
    measured = [r for r in table[1:] if r[3] == "measured"]
    assert len(measured) == 2 and measured[0][head.index("f1")] == "88.25"
    assert measured[0][head.index("sha256")] == "ab" * 32
    published = [r for r in table[1:] if r[3] == "published"]
    assert len(published) == len(load_published())

    js = json.loads(format_table(rows, "json"))
    assert {r["kind"] for r in js} == {"measured", "published"}
    with pytest.raises(ResultsError, match="unknown format"):
        format_table(rows, "html")


def test_published_rows_are_the_reference_numbers():
    pub = load_published()
    assert all(r["kind"] == "published" and r["source"] for r in pub)
    by = {(r["task"], r["model"]): r["metrics"] for r in pub}
    assert by[("squad-v1.1", "BERT-base uncased, TF official run")] == {"exact_match": 80.72, "f1": 88.41}
    assert by[("squad-v1.1", "OneFlow graph BERT-base with TF weights")] == {"exact_match": 82.57, "f1": 89.63}
    assert by[("mrpc", "bert-base-cased (HF)")] == {"f1": 88.9, "accuracy": 84.1}
    assert by[("mnli-mm", "bert-base-cased (HF)")] == {"accuracy": 84.1}


def test_checkpoint_identity(tmp_path):
    ck = tmp_path / "bert-tiny-of"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"weights" * 100)
    ident = checkpoint_identity(str(ck))
    assert ident["name"] == "bert-tiny-of" and ident["format"] == "bert_of"
    assert ident["sha256"] == hashlib.sha256(b"weights" * 100).hexdigest()
    tf = tmp_path / "tf"
    tf.mkdir()
    (tf / "bert_model.ckpt.index").write_bytes(b"index")
    (tf / "bert_model.ckpt.data-00000-of-00001").write_bytes(b"data")
    a = checkpoint_identity(str(tf))
    b = checkpoint_identity(str(tf / "bert_model.ckpt.index"))
    assert a["format"] == "tf" and a["sha256"] == b["sha256"]
    (tf / "bert_model.ckpt.data-00000-of-00001").write_bytes(b"DATA")
    assert checkpoint_identity(str(tf))["sha256"] != a["sha256"]
    with pytest.raises(ResultsError, match="no checkpoint there"):
        checkpoint_identity(str(tmp_path / "nothing"))


