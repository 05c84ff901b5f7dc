"""`bert-of eval squad-score` against the official evaluate-v1.1.py / evaluate-v2.0.py semantics.

Expected numbers are worked out by hand in the comments (not by calling the scorer twice).
"""

import json
import os

import pytest

from tests.conftest import ROOT
from bert_of.eval.errors import PredictionsError
from bert_of.eval.squad_data import load_squad
from bert_of.eval.squad_metrics import (exact_match_v1, exact_v2, f1_v1, f1_v2, normalize_answer, score_v1, score_v2,
                                squad_score)

D = os.path.join(ROOT, "tests", "data", "squad")
V11, P11 = os.path.join(D, "dev-v1.1-mini.json"), os.path.join(D, "predictions-v1.1.json")
V20, P20, NA20 = (os.path.join(D, n) for n in ("dev-v2.0-mini.json", "predictions-v2.0.json", "na-probs-v2.0.json"))




def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return str(path)


def squad_file(tmp_path, qas, version="1.1", name="data.json"):
    """A one-paragraph SQuAD file; answers given as texts found in the context."""
    context = "The quick brown fox jumped over the lazy dog near the river bank in the old town."
    out = []
    for qid, answers in qas:
        out.append({"id": qid, "question": f"Question {qid}?", "answers":
                    [{"text": a, "answer_start": context.index(a)} for a in answers]})
    return write_json(tmp_path / name, {"version": version, "data": [
        {"title": "Fox", "paragraphs": [{"context": context, "qas": out}]}]})


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize("raw, norm", [
    ("The Normans", "normans"),
    ("  the   quick,  brown FOX! ", "quick brown fox"),
    ("a", ""),
    ("An apple a day", "apple day"),
    ("the-end", "theend"),          # punctuation goes first, so "the" is no longer a word
    ("theatre", "theatre"),          # articles only as whole words
    ("Café, naïve", "café naïve"),   # no accent stripping, only ASCII punctuation
    ("rock ’n’ roll", "rock ’n’ roll"),  # curly quotes are not string.punctuation
    ("1,000.5 km", "10005 km"),
    ("\tline\nbreak ", "line break"),
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_token_f1_by_hand():
    # pred {denmark, and, norway} vs gold {denmark, iceland, and, norway}: P 3/3, R 3/4 -> 6/7
    assert f1_v1("Denmark and Norway", "Denmark, Iceland and Norway") == pytest.approx(6 / 7, abs=1e-15)
    # duplicates count by multiplicity (Counter intersection): pred "dog dog" vs gold "dog": P 1/2 R 1
    assert f1_v1("dog dog", "the dog") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_v1("cat", "dog") == 0


def test_article_only_answers_v1_vs_v2():
    # Both normalise to "": v1.1 says EM 1 but F1 0 (no overlapping token), v2.0 says F1 1.
    assert exact_match_v1("The", "a") is True
    assert f1_v1("The", "a") == 0
    assert exact_v2("a", "The") == 1
    assert f1_v2("a", "The") == 1
    # v2.0 no-answer: "" vs "" is right, anything else vs "" is wrong, and vice versa.
    assert f1_v2("", "") == 1 and exact_v2("", "") == 1
    assert f1_v2("", "Europe") == 0 and f1_v2("Europe", "") == 0


# --------------------------------------------------------------------------- v1.1


def test_v1_max_over_golds_and_missing(tmp_path):
    data = squad_file(tmp_path, [("x", ["quick brown fox", "fox"]), ("y", ["lazy dog"]), ("z", ["river bank"])])
    preds = write_json(tmp_path / "p.json", {"x": "fox", "y": "the lazy dog"})
    s = squad_score(data, preds)
    # x: max(EM "fox" vs "quick brown fox" = 0, vs "fox" = 1) = 1; y: 1; z missing: 0 of 3.
    assert s.result["exact_match"] == pytest.approx(200 / 3)
    assert s.result["f1"] == pytest.approx(200 / 3)
    assert s.missing == ["z"] and s.scored == 2 and s.questions == 3


def test_v1_empty_prediction_scores_zero(tmp_path):
    data = squad_file(tmp_path, [("x", ["fox"])])
    s = squad_score(data, write_json(tmp_path / "p.json", {"x": ""}))
    assert s.result == {"exact_match": 0.0, "f1": 0.0}


# --------------------------------------------------------------------------- v2.0


def test_v2_fixture_by_hand():
    # a1 "South America" (1, 1); a2 "seven million square km": vs gold 1 P=R=3/4 -> 0.75, vs
    # "seven million" P 2/4 R 1 -> 2/3; EM 0; a3 "" for a no-answer question (1, 1);
    # a4 "Europe" for a no-answer question (0, 0); a5 "" for an answerable one (0, 0).
    s = squad_score(V20, P20)
    r = s.result
    assert list(r) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                       "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert r["exact"] == pytest.approx(100 * 2 / 5)
    assert r["f1"] == pytest.approx(100 * (1 + 0.75 + 1) / 5)
    assert r["total"] == 5
    assert r["HasAns_exact"] == pytest.approx(100 / 3) and r["HasAns_f1"] == pytest.approx(100 * 1.75 / 3)
    assert r["HasAns_total"] == 3
    assert r["NoAns_exact"] == 50.0 and r["NoAns_f1"] == 50.0 and r["NoAns_total"] == 2


def test_v2_na_prob_threshold_and_best_thresholds():
    # na-probs a1 .1, a2 .3, a3 .9, a4 .6, a5 .8; threshold 0.5 forces "" for a3, a4, a5:
    # a3, a4 (no answer) become right (1.0), a5 (answerable) wrong (0.0).
    s = squad_score(V20, P20, NA20, 0.5)
    r = s.result
    assert r["exact"] == pytest.approx(100 * (1 + 0 + 1 + 1 + 0) / 5)
    assert r["f1"] == pytest.approx(100 * (1 + 0.75 + 1 + 1 + 0) / 5)
    # best_*: walk the questions by na-prob (a1, a2, a4, a5, a3) from "all null" = 2 right:
    # EM: +1 (a1) -> 3 at .1, +0, -1 (a4 answered "Europe"), +0, +0 -> best 3/5 at 0.1.
    # F1: +1 -> 3 at .1, +0.75 -> 3.75 at .3, -1, +0, +0 -> best 3.75/5 at 0.3.
    assert r["best_exact"] == pytest.approx(60.0) and r["best_exact_thresh"] == 0.1
    assert r["best_f1"] == pytest.approx(75.0) and r["best_f1_thresh"] == 0.3
    # the default threshold 1.0 changes nothing (na_prob > 1 never holds)
    assert squad_score(V20, P20, NA20).result["exact"] == pytest.approx(40.0)


def test_v2_gold_that_normalises_to_empty_is_dropped(tmp_path):
    # Gold answers "the" (-> "") are dropped; with none left the gold is [""], so "" is right.
    context = "the end of the story"
    data = write_json(tmp_path / "d.json", {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [
            {"id": "a", "question": "?", "answers": [{"text": "the", "answer_start": 0}]},
            {"id": "b", "question": "?", "answers": [{"text": "the", "answer_start": 0},
                                                     {"text": "end", "answer_start": 4}]}]}]}]})
    s = squad_score(data, write_json(tmp_path / "p.json", {"a": "", "b": "the end"}))
    # a: gold [""] vs "" -> 1/1 (but it still counts as HasAns: it has answers in the file);
    # b: gold ["end"] vs "the end" -> 1/1.
    assert s.result["exact"] == 100.0 and s.result["HasAns_total"] == 2 and "NoAns_total" not in s.result


def test_version_comes_from_the_data_file(tmp_path):
    # The same content scored as 1.1 and as 2.0 gives the two official key sets.
    obj = json.load(open(V11))
    obj["version"] = "v2.0"
    v2 = write_json(tmp_path / "as-v2.json", obj)
    preds = json.load(open(P11))
    preds["q5"] = "Vistula"
    p = write_json(tmp_path / "p.json", preds)
    assert list(squad_score(V11, p).result) == ["exact_match", "f1"]
    assert "HasAns_total" in squad_score(v2, p).result
    assert list(squad_score(v2, p, version="1.1").result) == ["exact_match", "f1"]


# --------------------------------------------------------------------------- bad input


def test_bad_predictions_and_na_probs(tmp_path):
    with pytest.raises(PredictionsError, match=r"prediction for 'q1' is int, expected a string"):
        squad_score(V11, write_json(tmp_path / "p.json", {"q1": 3}))
    with pytest.raises(PredictionsError, match="expected a JSON object"):
        squad_score(V11, write_json(tmp_path / "p.json", ["France"]))
    with pytest.raises(PredictionsError, match=r"na\.json: no entry for question id 'a5'"):
        na = json.load(open(NA20))
        del na["a5"]
        squad_score(V20, P20, write_json(tmp_path / "na.json", na))
    # unknown ids can be ignored on request, and are then reported
    s = squad_score(V11, os.path.join(D, "predictions-unknown-id.json"), ignore_unknown_ids=True)
    assert s.unknown == ["zz-not-a-question"]
    # a repeated id is scored as evaluate-v1.1.py scores it: twice, each against its own golds
    s = squad_score(squad_file(tmp_path, [("x", ["fox"]), ("x", ["dog"])]), write_json(tmp_path / "p.json", {"x": "fox"}))
    assert s.result == {"exact_match": 50.0, "f1": 50.0} and "1 repeated question id(s)" in s.notes[0]


def test_load_squad_counts():
    sd = load_squad(V20)
    assert sd.is_v2 and len(sd) == 5
    assert [q.has_answer for q in sd.questions] == [True, True, False, False, True]
    assert not load_squad(V11).is_v2


def test_score_functions_directly():
    sd = load_squad(V11)
    s = score_v1(sd, {"q7": "Warsaw"})
    assert s.result["exact_match"] == pytest.approx(100 / 7) and len(s.missing) == 6
    s2 = score_v2(load_squad(V20), {"a3": "", "a4": ""})
    assert s2.result == {"exact": 100.0, "f1": 100.0, "total": 2, "NoAns_exact": 100.0, "NoAns_f1": 100.0,
                         "NoAns_total": 2}
