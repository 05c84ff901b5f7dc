"""SQuAD features (run_squad.py semantics) and logits -> predictions postprocessing."""

import json
import math
import os
import unicodedata

import numpy as np
import pytest

from tests.conftest import ROOT

from bert_of.eval.errors import EvalDataError
from bert_of.eval.squad_data import (DocSpan, check_is_max_context, convert_examples_to_features, features_to_arrays,
                                     load_squad, make_doc_spans, read_squad_examples, split_doc_tokens)
from bert_of.eval.squad_predictions import get_final_text, postprocess_predictions, write_prediction_files



class TinyWordPiece:
    """A small WordPiece tokenizer for the tests: lower-case, strip accents, split punctuation,
    then greedy longest-match-first sub-words ("##" continuation) over a given vocabulary."""

    def __init__(self, words):
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        self.vocab = {t: i for i, t in enumerate(dict.fromkeys(specials + list(words)))}

    @staticmethod
    def basic(text):
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
        out = []
        for word in text.split():
            cur = ""
            for ch in word:
                if unicodedata.category(ch).startswith("P") or ch in "$+<=>^`|~":
                    out += [cur, ch] if cur else [ch]
                    cur = ""
                else:
                    cur += ch
            if cur:
                out.append(cur)
        return out

    def tokenize(self, text):
        pieces = []
        for word in self.basic(text):
            start, sub = 0, []
            while start < len(word):
                end, cur = len(word), None
                while start < end:
                    cand = word[start:end] if start == 0 else "##" + word[start:end]
                    if cand in self.vocab:
                        cur = cand
                        break
                    end -= 1
                if cur is None:
                    sub = ["[UNK]"]
                    break
                sub.append(cur)
                start = end
            pieces += sub
        return pieces

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab[t] for t in tokens]


def vocab_for(*texts, split=()):
    """Every basic token of the texts, except the words in ``split`` (given as their pieces)."""
    words = [w for t in texts for w in TinyWordPiece.basic(t)]
    drop = {"".join(p.replace("##", "") for p in pieces) for pieces in split}
    return [w for w in words if w not in drop] + [p for pieces in split for p in pieces]


def squad_json(tmp_path, paragraphs, version="v2.0", name="train.json"):
    """paragraphs: [(context, [(qid, question, answer_text or None, occurrence)])]."""
    data = []
    for context, qas in paragraphs:
        out = []
        for qid, question, answer, occ in qas:
            if answer is None:
                out.append({"id": qid, "question": question, "answers": [], "is_impossible": True})
                continue
            start = -1
            for _ in range(occ + 1):
                start = context.index(answer, start + 1)
            out.append({"id": qid, "question": question, "answers": [{"text": answer, "answer_start": start}],
                        "is_impossible": False})
        data.append({"title": "t", "paragraphs": [{"context": context, "qas": out}]})
    p = tmp_path / name
    p.write_text(json.dumps({"version": version, "data": data}))
    return str(p)


SMITH = "The leader was John Smith (1895-1943)."
SMITH_Q = "What year was John Smith born?"
JAPAN = "The Japanese electronics industry is the largest in the world."
JAPAN_Q = "What country is the top exporter of electronics?"
LONG = "The city of Warsaw lies on the Vistula River roughly 260 kilometres from the sea"
LONG_Q = "Where Warsaw"


# --------------------------------------------------------------------------- doc tokens


def test_split_doc_tokens_whitespace_and_offsets():
    tokens, offsets = split_doc_tokens(" Ab  c\td\u202fe\n")
    assert tokens == ["Ab", "c", "d", "e"]
    #                 " "  A  b  " " " " c  \t d  \u202f e  \n
    assert offsets == [-1, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3]
    # a no-break space (U+00A0) is *not* a separator for run_squad's whitespace split
    assert split_doc_tokens("a\u00a0b")[0] == ["a\u00a0b"]


# --------------------------------------------------------------------------- examples + features


def test_answer_span_improvement_1895(tmp_path):
    path = squad_json(tmp_path, [(SMITH, [("s1", SMITH_Q, "1895", 0)])])
    ex, = read_squad_examples(path, is_training=True)
    # whitespace tokens: The leader was John Smith (1895-1943). -> the answer lies in token 5
    assert ex.doc_tokens[5] == "(1895-1943)." and ex.start_position == ex.end_position == 5
    tok = TinyWordPiece(vocab_for(SMITH, SMITH_Q, split=[["19", "##43"]]))
    f, = convert_examples_to_features([ex], tok, max_seq_length=32, doc_stride=8, max_query_length=16,
                                      is_training=True)
    q = tok.tokenize(SMITH_Q)  # what year was john smith born ?  (7 tokens)
    assert f.tokens == ["[CLS]", *q, "[SEP]", "the", "leader", "was", "john", "smith",
                        "(", "1895", "-", "19", "##43", ")", ".", "[SEP]"]
    # without the improvement the target would be "( 1895 - 19 ##43 ) ."; with it, just "1895"
    assert f.tokens[f.start_position] == "1895" and f.end_position == f.start_position
    assert f.start_position == len(q) + 2 + 6
    # every WordPiece of "(1895-1943)." maps back to whitespace token 5
    assert [f.token_to_orig_map[i] for i in range(len(q) + 2 + 5, len(q) + 2 + 12)] == [5] * 7
    assert f.segment_ids[:len(q) + 2] == [0] * (len(q) + 2) and f.segment_ids[len(q) + 2:len(f.tokens)] == [1] * 13
    assert len(f.input_ids) == 32 and f.input_mask == [1] * len(f.tokens) + [0] * (32 - len(f.tokens))
    assert f.input_ids[len(f.tokens):] == [0] * (32 - len(f.tokens))


def test_answer_inside_a_wordpiece_keeps_the_whole_token(tmp_path):
    # "Japan" is a character sub-span of "Japanese", which WordPiece does not split: keep "japanese".
    path = squad_json(tmp_path, [(JAPAN, [("j1", JAPAN_Q, "Japan", 0)])])
    ex, = read_squad_examples(path, is_training=True)
    tok = TinyWordPiece(vocab_for(JAPAN, JAPAN_Q))
    f, = convert_examples_to_features([ex], tok, max_seq_length=40, max_query_length=16, is_training=True)
    assert f.tokens[f.start_position] == "japanese" and f.end_position == f.start_position


def test_windows_doc_stride_and_max_context(tmp_path):
    words = LONG.split()[:10]
    context = " ".join(words)
    path = squad_json(tmp_path, [(context, [("w1", LONG_Q, words[8], 0)])])
    ex, = read_squad_examples(path, is_training=True)
    tok = TinyWordPiece(vocab_for(context, LONG_Q))
    # 2 query tokens + 3 specials + 6 context tokens per window; stride 2 -> windows 0-5, 2-7, 4-9
    feats = convert_examples_to_features([ex], tok, max_seq_length=11, doc_stride=2, max_query_length=4,
                                         is_training=True)
    assert [f.doc_span_index for f in feats] == [0, 1, 2]
    assert [f.unique_id for f in feats] == [1000000000, 1000000001, 1000000002]
    assert [[f.token_to_orig_map[p] for p in range(4, 10)] for f in feats] == [
        [0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7], [4, 5, 6, 7, 8, 9]]
    # max context = max over windows of min(left, right) (+0.01 * length): tokens 0-3 -> window 0,
    # 4-5 -> window 1 (token 5: min(3, 2)=2 beats window 2's min(1, 4)=1), 6-9 -> window 2.
    flags = [[f.token_is_max_context[p] for p in range(4, 10)] for f in feats]
    assert flags == [[True, True, True, True, False, False],
                     [False, False, True, True, False, False],
                     [False, False, True, True, True, True]]
    # training targets: the answer (doc token 8) is only inside window 2; elsewhere [CLS]
    assert [(f.start_position, f.end_position) for f in feats] == [(0, 0), (0, 0), (8, 8)]
    assert feats[2].tokens[8] == words[8].lower()


def test_max_context_tie_breaks():
    spans = [DocSpan(0, 6), DocSpan(3, 6), DocSpan(6, 4)]
    # token 7: window 1 min(4, 1)=1 + 0.06, window 2 min(1, 2)=1 + 0.04 -> the longer window 1
    assert check_is_max_context(spans, 1, 7) and not check_is_max_context(spans, 2, 7)
    # exact tie (same length, same min context): the first window wins
    spans = [DocSpan(0, 5), DocSpan(2, 5)]
    assert check_is_max_context(spans, 0, 3) and not check_is_max_context(spans, 1, 3)
    # windows: starts advance by min(length, stride) until the end is covered
    assert make_doc_spans(10, 6, 3) == [DocSpan(0, 6), DocSpan(3, 6), DocSpan(6, 4)]
    assert make_doc_spans(4, 6, 3) == [DocSpan(0, 4)]
    assert make_doc_spans(0, 6, 3) == []


def test_impossible_questions_point_at_cls(tmp_path):
    path = squad_json(tmp_path, [(JAPAN, [("j0", "Who founded the industry?", None, 0),
                                          ("j1", JAPAN_Q, "Japanese", 0)])])
    ex0, ex1 = read_squad_examples(path, is_training=True)
    assert ex0.is_impossible and ex0.start_position == ex0.end_position == -1 and ex0.orig_answer_text == ""
    assert not ex1.is_impossible
    tok = TinyWordPiece(vocab_for(JAPAN, JAPAN_Q, "Who founded the industry?"))
    feats = convert_examples_to_features([ex0, ex1], tok, max_seq_length=16, doc_stride=3, max_query_length=8,
                                         is_training=True)
    imp = [f for f in feats if f.example_index == 0]
    assert len(imp) > 1 and all(f.is_impossible and f.start_position == f.end_position == 0 for f in imp)
    arrays = features_to_arrays(feats, is_training=True)
    assert arrays["input_ids"].shape == (len(feats), 16) and arrays["input_ids"].dtype == np.int64
    assert arrays["is_impossible"].tolist() == [int(f.is_impossible) for f in feats]
    assert arrays["start_positions"].tolist() == [f.start_position for f in feats]


def test_prediction_examples_need_no_answers_and_query_is_truncated(tmp_path):
    path = squad_json(tmp_path, [(SMITH, [("s1", SMITH_Q, "1895", 0)])])
    ex, = read_squad_examples(path, is_training=False)
    assert ex.start_position is None and ex.orig_answer_text is None
    tok = TinyWordPiece(vocab_for(SMITH, SMITH_Q))
    f, = convert_examples_to_features([ex], tok, max_seq_length=40, max_query_length=3)
    assert f.tokens[:5] == ["[CLS]", "what", "year", "was", "[SEP]"] and f.start_position is None
    with pytest.raises(EvalDataError, match="must be greater than max_query_length"):
        convert_examples_to_features([ex], tok, max_seq_length=10, max_query_length=7)


def test_training_takes_the_first_of_several_answers_with_one_note(tmp_path, caplog):
    p = tmp_path / "two.json"
    p.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": JAPAN, "qas": [
        {"id": "x", "question": "?", "answers": [{"text": "Japanese", "answer_start": 4},
                                                 {"text": "electronics", "answer_start": 13}]}]}]}]}))
    ex, = read_squad_examples(str(p), is_training=True)
    assert (ex.orig_answer_text, ex.start_position, ex.end_position) == ("Japanese", 1, 1)
    notes = [r.getMessage() for r in caplog.records if "several answers" in r.getMessage()]
    assert notes == [f"{p}: 1 question(s) have several answers; training uses the first of each"]
    assert len(read_squad_examples(str(p), is_training=False)) == 1
    assert load_squad(str(p)).questions[0].answers == ["Japanese", "electronics"]


# --------------------------------------------------------------------------- get_final_text


@pytest.mark.parametrize("pred, orig, lower, want", [
    ("steve smith", "Steve Smith's", True, "Steve Smith"),
    ("jose muller", "José Müller,", True, "José Müller"),         # accents stripped by the tokenizer
    ("1895", "(1895-1943).", True, "1895"),
    ("zurich", "Café Zürich.", True, "Zürich"),
    ("Smith", "Smith's", False, "Smith"),                         # cased model
    ("smith", "Smith's", False, "Smith's"),                       # cased: "smith" not found -> whole text
    ("xyz", "Steve Smith", True, "Steve Smith"),                  # not found -> whole text
    ("stevesmith", "Steve\u200bSmith", True, "Steve\u200bSmith"),  # zero-width space: lengths differ
])
def test_get_final_text(pred, orig, lower, want):
    assert get_final_text(pred, orig, lower) == want


# --------------------------------------------------------------------------- postprocessing


def _features(tmp_path, paragraphs, version="1.1", **kw):
    path = squad_json(tmp_path, paragraphs, version=version, name="pred.json")
    examples = read_squad_examples(path, is_training=False)
    texts = [c for c, _ in paragraphs] + [q for _, qas in paragraphs for _, q, _, _ in qas]
    tok = TinyWordPiece(vocab_for(*texts, split=kw.pop("split", ())))
    kw.setdefault("max_query_length", 6)
    return examples, convert_examples_to_features(examples, tok, **kw)


STEVE = "Steve Smith's team won the cup in 1895."
STEVE_Q = "Who led the team?"


def test_postprocess_best_span_and_nbest(tmp_path):
    examples, feats = _features(tmp_path, [(STEVE, [("t1", STEVE_Q, "Steve Smith", 0)])], max_seq_length=32)
    f, = feats
    pos = {f.tokens[i]: i for i in sorted(f.token_to_orig_map, reverse=True)}  # context positions
    start = np.full(32, -10.0, dtype=np.float32)
    end = np.full(32, -10.0, dtype=np.float32)
    start[pos["steve"]], start[pos["team"]] = 5.0, 2.0
    end[pos["smith"]], end[pos["team"]] = 4.0, 3.0
    out = postprocess_predictions(examples, feats, start[None], end[None], n_best_size=3, max_answer_length=30)
    # top-3 starts: steve, team, [CLS]; top-3 ends: smith, team, [CLS]. Valid: (steve, smith) 9,
    # (steve, team) 8, (team, team) 5; (team, smith) ends before it starts; [CLS] is not context.
    assert out.predictions == {"t1": "Steve Smith"}  # "'s" is cut: get_final_text aligns characters
    nb = out.nbest["t1"]
    assert [e["text"] for e in nb] == ["Steve Smith", "Steve Smith's team", "team"]
    assert [(e["start_logit"], e["end_logit"]) for e in nb] == [(5.0, 4.0), (5.0, 3.0), (2.0, 3.0)]
    z = 1 + math.exp(-1) + math.exp(-4)
    assert [e["probability"] for e in nb] == pytest.approx([1 / z, math.exp(-1) / z, math.exp(-4) / z], abs=1e-15)
    assert list(nb[0]) == ["text", "probability", "start_logit", "end_logit"]
    assert out.null_odds is None
    # max_answer_length 2 drops "Steve Smith's team" (5 WordPieces)
    out2 = postprocess_predictions(examples, feats, start[None], end[None], n_best_size=3, max_answer_length=2)
    assert [e["text"] for e in out2.nbest["t1"]] == ["Steve Smith", "team"]


def test_postprocess_wordpieces_and_accents(tmp_path):
    ctx = "José Müller founded the Café Zürich in 1895."
    examples, feats = _features(tmp_path, [(ctx, [("c1", "Who founded the cafe?", "José Müller", 0)])],
                                max_seq_length=40, split=[["mul", "##ler"], ["zur", "##ich"]])
    f, = feats
    assert "##ler" in f.tokens and "##ich" in f.tokens
    i_jose, i_ler = f.tokens.index("jose"), f.tokens.index("##ler")
    i_zur, i_ich = f.tokens.index("zur"), f.tokens.index("##ich")
    start, end = np.zeros((1, 40), np.float32), np.zeros((1, 40), np.float32)
    start[0, i_jose], end[0, i_ler] = 6.0, 6.0
    start[0, i_zur], end[0, i_ich] = 5.0, 5.0
    out = postprocess_predictions(examples, feats, start, end, n_best_size=20)
    # "jose mul ##ler" -> "jose muller" -> projected back onto "José Müller" (original accents)
    assert out.predictions["c1"] == "José Müller"
    texts = [e["text"] for e in out.nbest["c1"]]
    assert texts[0] == "José Müller" and "Zürich" in texts and len(texts) == len(set(texts)) == 20


def test_postprocess_uses_max_context_window_only(tmp_path):
    words = LONG.split()[:10]
    context = " ".join(words)
    examples, feats = _features(tmp_path, [(context, [("w1", LONG_Q, words[3], 0)])],
                                max_seq_length=11, doc_stride=2)
    assert len(feats) == 3
    start, end = np.full((3, 11), -5.0, np.float32), np.full((3, 11), -5.0, np.float32)
    # doc token 3 ("Warsaw") is position 7 in window 0 (its max-context window) and 5 in window 1.
    start[1, 5], end[1, 5] = 9.0, 9.0   # strong, but window 1 is not token 3's max context
    start[0, 7], end[0, 7] = 1.0, 1.0
    out = postprocess_predictions(examples, feats, start, end, n_best_size=2)
    assert out.predictions["w1"] == "Warsaw"
    assert (out.nbest["w1"][0]["start_logit"], out.nbest["w1"][0]["end_logit"]) == (1.0, 1.0)
    # logits may also come as a mapping unique_id -> row
    by_id = {f.unique_id: start[i] for i, f in enumerate(feats)}
    by_id_end = {f.unique_id: end[i] for i, f in enumerate(feats)}
    assert postprocess_predictions(examples, feats, by_id, by_id_end, n_best_size=2).predictions == out.predictions
    with pytest.raises(EvalDataError, match="2 rows of logits for 3 features"):
        postprocess_predictions(examples, feats, start[:2], end[:2])


def test_postprocess_v2_null_odds_and_threshold(tmp_path):
    examples, feats = _features(tmp_path, [(STEVE, [("t1", STEVE_Q, "Steve Smith", 0)])], version="v2.0",
                                max_seq_length=32)
    f, = feats
    start, end = np.full((1, 32), -10.0, np.float32), np.full((1, 32), -10.0, np.float32)
    start[0, 0], end[0, 0] = 3.0, 2.0                                   # null score 5
    start[0, f.tokens.index("steve")], end[0, f.tokens.index("smith")] = 2.0, 1.5   # best span 3.5
    out = postprocess_predictions(examples, feats, start, end, n_best_size=3, version_2_with_negative=True)
    assert out.null_odds == {"t1": 1.5}            # 5 - 2 - 1.5
    assert out.predictions == {"t1": ""}           # 1.5 > threshold 0.0
    texts = [e["text"] for e in out.nbest["t1"]]
    assert texts[0] == "" and "Steve Smith" in texts
    out2 = postprocess_predictions(examples, feats, start, end, n_best_size=3, version_2_with_negative=True,
                                   null_score_diff_threshold=2.0)
    assert out2.predictions == {"t1": "Steve Smith"} and out2.null_odds == {"t1": 1.5}


def test_postprocess_v2_null_score_is_min_over_windows(tmp_path):
    words = LONG.split()[:10]
    examples, feats = _features(tmp_path, [(" ".join(words), [("w1", LONG_Q, words[8], 0)])], version="v2.0",
                                max_seq_length=11, doc_stride=2)
    start, end = np.zeros((3, 11), np.float32), np.zeros((3, 11), np.float32)
    start[:, 0] = [4.0, 1.0, 6.0]
    end[:, 0] = [4.0, 0.5, 6.0]       # null scores 8, 1.5, 12 -> min 1.5 (window 1)
    start[2, 8], end[2, 8] = 3.0, 3.0  # "River" (doc token 8) in window 2: span score 6
    out = postprocess_predictions(examples, feats, start, end, n_best_size=3, version_2_with_negative=True)
    assert out.null_odds["w1"] == pytest.approx(1.5 - 6.0)
    assert out.predictions["w1"] == words[8]
    null_entry = [e for e in out.nbest["w1"] if e["text"] == ""][0]
    assert (null_entry["start_logit"], null_entry["end_logit"]) == (1.0, 0.5)


def test_postprocess_without_valid_spans(tmp_path):
    examples, feats = _features(tmp_path, [(STEVE, [("t1", STEVE_Q, "Steve Smith", 0)])], max_seq_length=32)
    start, end = np.zeros((1, 32), np.float32), np.zeros((1, 32), np.float32)
    # every top start is after every top end: no valid span -> run_squad's nonce "empty"
    start[0, 20:23] = 9.0
    end[0, 8:11] = 9.0
    out = postprocess_predictions(examples, feats, start, end, n_best_size=3)
    assert out.predictions == {"t1": "empty"} and out.nbest["t1"][0]["probability"] == 1.0
    # v2.0: only the null answer is valid; the nonce keeps null odds defined (run_squad crashes here)
    out2 = postprocess_predictions(examples, feats, start, end, n_best_size=3, version_2_with_negative=True)
    assert out2.predictions == {"t1": ""} and out2.null_odds == {"t1": 0.0}
    assert [e["text"] for e in out2.nbest["t1"]] == ["", "empty"]


def test_write_prediction_files(tmp_path):
    examples, feats = _features(tmp_path, [(STEVE, [("t1", STEVE_Q, "Steve Smith", 0)])], max_seq_length=32)
    start, end = np.zeros((1, 32), np.float32), np.zeros((1, 32), np.float32)
    start[0, feats[0].tokens.index("steve")] = end[0, feats[0].tokens.index("smith")] = 4.0
    out = postprocess_predictions(examples, feats, start, end, version_2_with_negative=True)
    paths = write_prediction_files(str(tmp_path / "out"), out)
    assert sorted(os.listdir(tmp_path / "out")) == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
    text = open(paths["predictions"]).read()
    assert text == json.dumps({"t1": "Steve Smith"}, indent=4) + "\n"
    assert json.load(open(paths["null_odds"])) == out.null_odds
    out_v1 = postprocess_predictions(examples, feats, start, end)
    write_prediction_files(str(tmp_path / "v1"), out_v1)
    assert sorted(os.listdir(tmp_path / "v1")) == ["nbest_predictions.json", "predictions.json"]
