"""GLUE / XNLI: readers on every official TSV layout, numpy metrics vs hand-computed values,
`bert-of eval glue-score`."""

import math
import os

import pytest

from tests.conftest import ROOT
from bert_of.eval.errors import EvalDataError, PredictionsError
from bert_of.eval.glue_data import convert_example_to_features, get_labels, read_examples, truncate_seq_pair
from bert_of.eval.glue_metrics import (accuracy, compute_metrics, f1_binary, glue_score, matthews_corrcoef, pearson,
                                       rankdata, read_predictions, spearman)

G = os.path.join(ROOT, "tests", "data", "glue")


def g(name):
    return os.path.join(G, name)




# --------------------------------------------------------------------------- readers


@pytest.mark.parametrize("task, name, n, first", [
    ("cola", "cola-dev.tsv", 6, ("Our friends won't buy this analysis, let alone the next one we propose.", None, "1")),
    ("cola", "cola-test.tsv", 2, ("Bill whistled past the house.", None, None)),
    ("sst-2", "sst-2-dev.tsv", 4, ("it 's a charming and often affecting journey . ", None, "1")),
    ("sst-2", "sst-2-test.tsv", 2, ("uneasy mishmash of styles and genres .", None, None)),
    ("mrpc", "mrpc-dev.tsv", 5, ("He said the foodservice pie business doesn 't fit the company 's long-term growth "
                                 "strategy .", "\" The foodservice pie business does not fit our long-term growth "
                                 "strategy .", "1")),
    ("mrpc", "mrpc-test.tsv", 2, ("PCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief "
                                  "financial officer , will report directly to Mr So .", "Current Chief Operating "
                                  "Officer Mike Butcher and Group Chief Financial Officer Alex Arena will report to "
                                  "So .", None)),
    ("sts-b", "sts-b-dev.tsv", 6, ("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)),
    ("sts-b", "sts-b-test.tsv", 2, ("A girl is styling her hair.", "A girl is brushing her hair.", None)),
    ("qqp", "qqp-dev.tsv", 4, ("Why are African-Americans so beautiful?", "Why are hispanics so beautiful?", "0")),
    ("qqp", "qqp-test.tsv", 2, ("Why do rockets look white?", "Why are rockets and boosters painted white?", None)),
    ("mnli", "mnli-dev_matched.tsv", 3, ("The new rights are nice enough", "Everyone really likes the newest "
                                         "benefits ", "neutral")),
    ("mnli-mm", "mnli-dev_mismatched.tsv", 2, ("Your contribution helped make it possible for us to provide our "
                                               "students with a quality education.", "Your contributions were of "
                                               "no help with our students' education.", "contradiction")),
    ("mnli", "mnli-test_matched.tsv", 2, ("Hierbas, ans seco, ans dulce, and frigola are just a few names worth "
                                          "keeping a look-out for.", "Hierbas is a name worth looking out for.", None)),
    ("qnli", "qnli-dev.tsv", 3, ("What came into force after the new constitution was herald?", "As of that day, "
                                 "the new constitution heralding the Second Republic came into force.", "entailment")),
    ("qnli", "qnli-test.tsv", 1, ("What organization is devoted to Jihad against Israel?", "For some decades prior "
                                  "to the First Palestine Intifada in 1987, the Muslim Brotherhood in Palestine took "
                                  "a quiescent stance towards Israel.", None)),
    ("rte", "rte-dev.tsv", 3, ("Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age "
                               "44, according to the Christopher Reeve Foundation.", "Christopher Reeve had an "
                               "accident.", "not_entailment")),
    ("rte", "rte-test.tsv", 1, ("Mangla was summoned after Madhumita's sister Nidhi Shukla, who was the first "
                                "witness in the case.", "Shukla is related to Mangla.", None)),
    ("xnli", "xnli-dev.tsv", 5, ("And he said, Mama, I'm home.", "He called his mom as soon as the school bus "
                                 "dropped him off.", "neutral")),
])
def test_readers_every_layout(task, name, n, first):
    ex = read_examples(task, g(name))
    assert len(ex) == n
    assert (ex[0].text_a, ex[0].text_b, ex[0].label) == first
    labels = get_labels(task)
    for e in ex:
        assert e.label is None or (e.label in labels if labels else isinstance(e.label, float))


def test_reader_details():
    # guids: the file's id column where there is one, else the data line index
    assert [e.guid for e in read_examples("qqp", g("qqp-dev.tsv"))][:2] == ["qqp-dev-201359", "qqp-dev-263843"]
    assert read_examples("cola", g("cola-dev.tsv"), set_type="dev")[2].guid == "dev-2"
    assert [e.label for e in read_examples("cola", g("cola-dev.tsv"))] == ["1", "1", "0", "1", "0", "1"]
    # MNLI: gold_label is the last column (dev files have label1..label5 before it)
    assert [e.label for e in read_examples("mnli", g("mnli-dev_matched.tsv"))] == \
        ["neutral", "contradiction", "entailment"]
    # XNLI: language filter; XNLI-MT train uses "contradictory" for contradiction
    en = read_examples("xnli", g("xnli-dev.tsv"), language="en")
    assert [e.label for e in en] == ["neutral", "contradiction", "entailment"]
    assert [e.text_b for e in read_examples("xnli", g("xnli-dev.tsv"), language="de")] == ["Er sagte kein Wort."]
    mt = read_examples("xnli", g("xnli-mt-train.tsv"))
    assert [e.label for e in mt] == ["neutral", "entailment", "contradiction"]
    assert get_labels("mnli") == ["contradiction", "entailment", "neutral"] and get_labels("sts-b") is None
    assert get_labels("qnli") == ["entailment", "not_entailment"] and get_labels("MRPC") == ["0", "1"]


def test_reader_errors(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tonly one sentence\n")
    with pytest.raises(EvalDataError, match=r"bad\.tsv: line 2: expected at least 5 tab-separated columns for MRPC, "
                                            r"found 4"):
        read_examples("mrpc", str(p))
    p.write_text("sentence\tlabel\na fine film .\tpositive\n")
    with pytest.raises(EvalDataError, match=r"line 2: label 'positive' is not a SST-2 label \(0, 1\)"):
        read_examples("sst-2", str(p))
    p.write_text("1\t1355540\t1355592\tHe said so .\tShe said so .\n")  # MRPC without its header
    with pytest.raises(EvalDataError, match="line 1: not a MRPC header"):
        read_examples("mrpc", str(p))
    p.write_text("")
    with pytest.raises(EvalDataError, match=r"bad\.tsv: empty file"):
        read_examples("rte", str(p))
    p.write_text("index\tsentence1\tsentence2\tlabel\n")
    with pytest.raises(EvalDataError, match="no examples"):
        read_examples("rte", str(p))
    with pytest.raises(EvalDataError, match="unknown task 'squad'"):
        read_examples("squad", str(p))
    p.write_text(open(g("sts-b-dev.tsv")).read().replace("5.000", "five", 1))
    with pytest.raises(EvalDataError, match="line 2: STS-B score 'five' is not a number"):
        read_examples("sts-b", str(p))
    q = tmp_path / "qqp.tsv"
    q.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n1\t2\t3\tWhy?\tWhy not?\t1\n4\t5\t6\tbroken\n")
    assert len(read_examples("qqp", str(q), skip_malformed=True)) == 1


# --------------------------------------------------------------------------- metrics


def test_matthews_by_hand():
    # tp 3, fn 1, fp 1, tn 1: (3*1 - 1*1) / sqrt(4 * 4 * 2 * 2) = 2 / 8
    assert matthews_corrcoef([1, 1, 0, 1, 0, 1], [1, 0, 0, 1, 1, 1]) == pytest.approx(0.25, abs=1e-15)
    assert matthews_corrcoef(["1", "0", "1", "0"], ["1", "0", "1", "0"]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    # a constant prediction makes MCC undefined: 0 (sklearn's convention)
    assert matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0
    # three classes: sklearn's multi-class form; C = [[2,0,0],[1,1,0],[0,1,1]] (rows true)
    # c=4, s=6, t=(2,2,2), p=(3,2,1): (4*6 - 12) / sqrt((36 - 14) * (36 - 12)) = 12 / sqrt(528)
    t, p = ["a", "a", "b", "b", "c", "c"], ["a", "a", "a", "b", "b", "c"]
    assert matthews_corrcoef(t, p) == pytest.approx(12 / math.sqrt(528), abs=1e-15)


def test_f1_and_accuracy_by_hand():
    # tp 2, fp 1, fn 1: 2*2 / (2*2 + 1 + 1)
    assert f1_binary(["1", "0", "0", "1", "1"], ["1", "1", "0", "1", "0"], positive="1") == pytest.approx(4 / 6)
    assert f1_binary([0, 0], [0, 0]) == 0.0  # no positives at all
    assert accuracy(["1", "0", "0", "1", "1"], ["1", "1", "0", "1", "0"]) == pytest.approx(0.6)


def test_pearson_spearman_with_ties_by_hand():
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 5.0, 9.0]
    # means 2.5 and 5; deviations (-1.5,-.5,.5,1.5) and (-3,-1,0,4): cov 4.5+.5+0+6 = 11,
    # sum sq 5 and 26 -> 11 / sqrt(130)
    assert pearson(x, y) == pytest.approx(11 / math.sqrt(130), abs=1e-15)
    # ties get average ranks: [5, 4.75, 5, 2.4, 0.5] -> [4.5, 3, 4.5, 2, 1]
    assert rankdata([5, 4.75, 5, 2.4, 0.5]).tolist() == [4.5, 3.0, 4.5, 2.0, 1.0]
    # vs preds ranked [4, 3, 5, 2, 1]: deviations (1.5,0,1.5,-1,-2), (1,0,2,-1,-2): 9.5 / sqrt(9.5 * 10)
    assert spearman([5, 4.75, 5, 2.4, 0.5], [4.8, 4.1, 4.9, 2.0, 1.0]) == pytest.approx(9.5 / math.sqrt(95),
                                                                                         abs=1e-15)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


def test_compute_metrics_per_task():
    assert set(compute_metrics("cola", ["1", "0"], ["1", "0"])) == {"mcc", "accuracy"}
    assert set(compute_metrics("mrpc", ["1", "0"], ["1", "0"])) == {"f1", "accuracy"}
    assert set(compute_metrics("qqp", ["1", "0"], ["1", "0"])) == {"f1", "accuracy"}
    assert set(compute_metrics("sts-b", [1.0, 2.0], [1.0, 2.5])) == {"pearson", "spearman"}
    for t in ("sst-2", "mnli", "qnli", "rte", "wnli", "xnli"):
        assert set(compute_metrics(t, ["x"], ["x"])) == {"accuracy"}
    with pytest.raises(PredictionsError, match="2 predictions for 3 examples"):
        compute_metrics("rte", ["a", "b", "c"], ["a", "b"])


# --------------------------------------------------------------------------- predictions + glue-score


def test_glue_score_fixtures_by_hand():
    cola = glue_score("cola", g("cola-dev.tsv"), g("cola-preds.txt"))
    assert cola["mcc"] == pytest.approx(25.0) and cola["accuracy"] == pytest.approx(100 * 4 / 6)
    # MRPC submission file (index order shuffled): preds [1, 1, 0, 1, 0] vs gold [1, 0, 0, 1, 1]
    mrpc = glue_score("mrpc", g("mrpc-dev.tsv"), g("mrpc-preds.tsv"))
    assert mrpc == pytest.approx({"f1": 100 * 4 / 6, "accuracy": 60.0})
    # STS-B: both sides rank [5.5, 4, 5.5, 2, 3, 1] (ties averaged): Spearman exactly 1
    sts = glue_score("sts-b", g("sts-b-dev.tsv"), g("sts-b-preds.txt"))
    gold, pred = [5.0, 4.75, 5.0, 2.4, 2.75, 0.5], [4.8, 4.1, 4.8, 2.0, 2.2, 1.0]
    mg, mp = sum(gold) / 6, sum(pred) / 6
    cov = sum((a - mg) * (b - mp) for a, b in zip(gold, pred))
    r = cov / math.sqrt(sum((a - mg) ** 2 for a in gold) * sum((b - mp) ** 2 for b in pred))
    assert sts["spearman"] == pytest.approx(100.0) and sts["pearson"] == pytest.approx(100 * r, abs=1e-12)
    assert glue_score("mnli", g("mnli-dev_matched.tsv"), g("mnli-m-preds.tsv")) == pytest.approx(
        {"accuracy": 100 * 2 / 3})
    assert glue_score("xnli", g("xnli-dev.tsv"), g("xnli-en-preds.txt"), language="en") == pytest.approx(
        {"accuracy": 100 * 2 / 3})


def test_prediction_formats(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("2\n0\n1\n")  # class ids into get_labels("mnli")
    assert read_predictions(str(p), "mnli", 3) == ["neutral", "contradiction", "entailment"]
    p.write_text("index\tprediction\n0\t1\n1\t0\n")
    with pytest.raises(PredictionsError, match="no prediction for index 2"):
        read_predictions(str(p), "rte", 3)
    p.write_text("index\tprediction\n0\t1\n0\t0\n")
    with pytest.raises(PredictionsError, match="line 3: index 0 predicted twice"):
        read_predictions(str(p), "cola", 2)
    p.write_text("index\tprediction\n0\t1\n5\t0\n")
    with pytest.raises(PredictionsError, match="line 3: index 5 is not an example"):
        read_predictions(str(p), "cola", 2)
    p.write_text("1\nmaybe\n")
    with pytest.raises(PredictionsError, match=r"line 2: 'maybe' is not a CoLA label \(0, 1\)"):
        read_predictions(str(p), "cola", 2)
    p.write_text("1\n0\n")
    with pytest.raises(PredictionsError, match="2 predictions for 3 examples"):
        read_predictions(str(p), "cola", 3)
    p.write_text("4.5\nnan\n")
    with pytest.raises(PredictionsError, match="line 2: 'nan' is not a finite number"):
        read_predictions(str(p), "sts-b", 2)


# --------------------------------------------------------------------------- features


class _WhitespaceTokenizer:
    def tokenize(self, text):
        return text.lower().split()

    def convert_tokens_to_ids(self, tokens):
        return [len(t) for t in tokens]


def test_classifier_features():
    ex = read_examples("rte", g("rte-dev.tsv"))[1]
    f = convert_example_to_features(ex, get_labels("rte"), 12, _WhitespaceTokenizer())
    # 13 + 7 tokens do not fit in 12 - 3: the longer side loses its last token until 9 remain
    # (a 13 -> 7, then b and a alternately: a 5, b 4)
    assert f["segment_ids"] == [0] * 7 + [1] * 5
    assert f["input_mask"] == [1] * 12 and f["label_id"] == 0
    a, b = ex.text_a.lower().split(), ex.text_b.lower().split()
    truncate_seq_pair(a, b, 9)
    assert (len(a), len(b)) == (5, 4)
    single = convert_example_to_features(read_examples("cola", g("cola-dev.tsv"))[2], ["0", "1"], 10,
                                         _WhitespaceTokenizer())
    assert single["segment_ids"] == [0] * 10 and single["input_mask"] == [1] * 6 + [0] * 4
    assert single["label_id"] == 0 and single["input_ids"][6:] == [0] * 4
    sts = convert_example_to_features(read_examples("sts-b", g("sts-b-dev.tsv"))[1], None, 32, _WhitespaceTokenizer())
    assert sts["label_id"] == 4.75
