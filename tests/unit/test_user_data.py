"""eval.user_data: a user's CSV/TSV/JSON Lines and CoNLL files, and their metrics checked against
formulas written out here from their definitions (and seqeval's published example)."""

import json
import math
import os

import numpy as np
import pytest

from bert_of.eval.errors import EvalDataError
from bert_of.eval.user_data import (chunks, class_key, classification_metrics, encode_labels, entity_scores,
                                    label_list, multi_label_metrics, problem_of, read_table, read_tagged,
                                    regression_metrics)


def test_csv_as_pythons_csv_module_reads_it(tmp_path):
    p = tmp_path / "reviews.csv"
    p.write_bytes('\ufefftext,label\n"Great, really great",positive\n"two\nlines ""quoted""",negative\n'
                  'meh,neutral\n\n'.encode("utf-8"))
    t = read_table(str(p))
    assert (t.text_column, t.text_pair_column, t.label_column) == ("text", None, "label")
    assert [(r.line, r.text, r.label) for r in t.rows] == [
        (2, "Great, really great", "positive"), (3, 'two\nlines "quoted"', "negative"), (5, "meh", "neutral")]
    assert problem_of(t) == "single_label" and label_list(t, "single_label") == ["negative", "neutral", "positive"]
    assert encode_labels(t, "single_label", label_list(t, "single_label")).tolist() == [2, 0, 1]


def test_tsv_pairs_jsonl_and_the_default_columns(tmp_path):
    p = tmp_path / "nli.tsv"
    p.write_text("premise\thypothesis\tgold\nA man eats.\tSomeone eats.\t1\nA dog.\tA cat.\t0\n")
    t = read_table(str(p))
    assert (t.text_column, t.text_pair_column, t.label_column) == ("premise", "hypothesis", "gold")
    assert [r.label for r in t.rows] == [1, 0] and label_list(t, problem_of(t)) == ["0", "1"]
    j = tmp_path / "scores.jsonl"
    j.write_text('{"sentence1": "a", "sentence2": "b", "label": 3.5}\n{"sentence1": "c", "sentence2": "d", '
                 '"label": 1}\n')
    t = read_table(str(j))
    assert problem_of(t) == "regression" and encode_labels(t, "regression", []).tolist() == [3.5, 1.0]
    m = tmp_path / "tags.jsonl"
    m.write_text('{"text": "x", "labels": ["sports", "news"]}\n{"text": "y", "labels": "news"}\n')
    t = read_table(str(m), problem="multi_label")
    assert label_list(t, "multi_label") == ["news", "sports"]
    assert encode_labels(t, "multi_label", ["news", "sports"]).tolist() == [[1, 1], [1, 0]]
    assert class_key(3.0) == "3"


@pytest.mark.parametrize("content,message", [
    ("text,label\n,positive\n", "line 2: column 'text': empty"),
    ("text,label\nfine,\n", "line 2: column 'label': no label"),
    ("text,label\nfine,positive,extra\n", "line 2: 3 fields, the header has 2"),
    ("words,label\nfine,positive\n", "no text column: name it with --text-column"),
    ("text,text\na,b\n", "column 'text' appears twice"),
    ("text,label\n", "no rows after the header"),
    ("text,label\nfine,inf\n", "line 2: column 'label': label 'inf' is not a finite number"),
])
def test_bad_rows_are_one_line_naming_file_row_and_column(tmp_path, content, message):
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(EvalDataError) as e:
        read_table(str(p))
    assert str(e.value).startswith(f"{p}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_bad_json_lines_and_unknown_extensions(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"text": "a", "label": 1}\n[1, 2]\n')
    with pytest.raises(EvalDataError, match="line 2: expected a JSON object, found list"):
        read_table(str(p))
    q = tmp_path / "x.txt"  # no known extension: the content tells (a header of comma-separated names: CSV)
    q.write_text("text,label\ngood,1\nbad,0\n")
    assert read_table(str(q)).kind == "csv" and len(read_table(str(q)).rows) == 2
    q.write_text("just some words\nmore words\n")  # neither a JSON object nor a header of names
    with pytest.raises(EvalDataError, match="expected a .csv, .tsv or .jsonl file .*--format"):
        read_table(str(q))
    assert read_table(str(q), text_column="just some words", need_labels=False, fmt="tsv").kind == "tsv"
    r = tmp_path / "x.csv"
    r.write_text("text,label\na,1.5\nb,cat\n")
    with pytest.raises(EvalDataError, match="line 2: label 1.5 is a number among class names"):
        problem_of(read_table(str(r)))


def _f1(t, p, c):
    tp = sum(a == c and b == c for a, b in zip(t, p))
    fp = sum(a != c and b == c for a, b in zip(t, p))
    fn = sum(a == c and b != c for a, b in zip(t, p))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def _mcc(t, p, k):
    """Matthews' definition: the correlation of the one-hot true and predicted matrices."""
    x, y = np.eye(k)[t], np.eye(k)[p]
    xc, yc = x - x.mean(0), y - y.mean(0)
    return (xc * yc).sum() / math.sqrt((xc * xc).sum() * (yc * yc).sum())


def test_classification_and_regression_metrics_equal_their_definitions():
    rng = np.random.default_rng(0)
    t = rng.integers(0, 3, 200)
    p = np.where(rng.random(200) < 0.6, t, rng.integers(0, 3, 200))
    m = classification_metrics(t, p, 3)
    assert m["accuracy"] == pytest.approx(np.mean(t == p))
    assert m["macro_f1"] == pytest.approx(np.mean([_f1(t, p, c) for c in range(3)]))
    assert m["mcc"] == pytest.approx(_mcc(t, p, 3))
    x = rng.normal(size=50)
    y = x + rng.normal(scale=0.5, size=50)
    r = regression_metrics(x, y)
    assert r["pearson"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    rank = lambda a: np.argsort(np.argsort(a))  # no ties in continuous draws
    assert r["spearman"] == pytest.approx(np.corrcoef(rank(x), rank(y))[0, 1])
    assert r["mse"] == pytest.approx(np.mean((x - y) ** 2))
    tl = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]])
    pl = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 1]])
    ml = multi_label_metrics(tl, pl)
    assert ml["subset_accuracy"] == pytest.approx(1 / 3)
    assert ml["micro_f1"] == pytest.approx(2 * 4 / (2 * 4 + 1 + 1))


def test_entity_scores_as_seqeval_and_conlleval_define_them():
    # seqeval's README example: precision = recall = f1 = 0.5
    true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    s = entity_scores(true, pred)
    assert (s["precision"], s["recall"], s["f1"]) == (0.5, 0.5, 0.5)
    assert s["accuracy"] == pytest.approx(8 / 10)  # two tokens differ (seqeval: 0.80)
    assert chunks(["I-PER", "I-PER", "O", "I-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}  # IOB1
    assert chunks(["B-PER", "I-LOC", "E-LOC", "S-ORG"]) == {("PER", 0, 0), ("LOC", 1, 2), ("ORG", 3, 3)}
    assert chunks(["B-PER", "B-PER"]) == {("PER", 0, 0), ("PER", 1, 1)}


def test_conll_and_json_lines_tagging_files(tmp_path):
    c = tmp_path / "ner.conll"
    c.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")
    s = read_tagged(str(c))
    assert [(x.line, x.tokens, x.tags) for x in s] == [(3, ["EU", "rejects"], ["B-ORG", "O"]),
                                                       (6, ["Peter"], ["B-PER"])]
    j = tmp_path / "ner.jsonl"
    j.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["O"]}) + "\n")
    with pytest.raises(EvalDataError, match="line 1: 2 tokens but 1 tags"):
        read_tagged(str(j))
    bad = tmp_path / "bad.conll"
    bad.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(EvalDataError, match="line 2: 'rejects' is not 'TOKEN ... TAG'; the file is neither clearly CoNLL"):
        read_tagged(str(bad))


def test_a_wide_header_with_a_duplicate_at_its_end_is_found_in_linear_time(tmp_path):
    import time

    wide = tmp_path / "wide.csv"
    names = [f"c{i}" for i in range(100_000)] + ["c5"]
    wide.write_text(",".join(names) + "\n" + ",".join("x" for _ in names) + "\n", encoding="utf-8")
    t0 = time.monotonic()
    with pytest.raises(EvalDataError, match="column 'c5' appears twice in the header"):
        read_table(str(wide))
    names[-1] = "c100000"
    wide.write_text(",".join(names) + "\n" + ",".join("x" for _ in names) + "\n", encoding="utf-8")
    with pytest.raises(EvalDataError, match=r"the columns are c0, c1, .*\.\.\. \(100001 columns\)") as e:
        read_table(str(wide))
    assert len(str(e.value)) < 500 and time.monotonic() - t0 < 10  # 20k columns took 5 s before


def test_a_table_from_a_fifo_is_read_once_and_a_device_is_refused_before_reading(tmp_path):
    """A FIFO (what `<(...)` gives) is read as its writer writes it, and kept: asked again in the
    same process (data checked, then read), the same rows. A device is no table: refused unread."""
    import subprocess

    fifo = tmp_path / "t.csv"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"printf 'text,label\\na,1\\nb,0\\n' > '{fifo}'"])
    try:
        first = read_table(str(fifo))
    finally:
        writer.wait(timeout=60)
    assert [(r.text, r.label) for r in first.rows] == [("a", 1), ("b", 0)] and first.kind == "csv"
    assert [r.record for r in read_table(str(fifo)).rows] == [r.record for r in first.rows]
    with pytest.raises(EvalDataError, match="/dev/zero: not a regular file"):
        read_table("/dev/zero")
