"""SQuAD scoring equal to the official evaluate-v1.1.py / evaluate-v2.0.py.

Same answer normalisation, same per-question scores, same summation order, so the printed
JSON matches the official scripts' output digit for digit. Where the official scripts crash
or are silent, this module says what it did instead:

* v1.1: a question without a prediction scores 0 and stays in the total (as official; it is
  reported on stderr with the official "Unanswered question ... will receive score 0." line).
* v2.0: a question without a prediction is left out of every total (the official script
  prints "Missing prediction for ..." to *stdout* and then stops with a KeyError when it
  builds the HasAns/NoAns breakdown); here the breakdowns cover the scored questions only
  and the omission is reported on stderr.
* prediction ids that are not questions in the data are an error (the official scripts
  ignore them silently) unless ``ignore_unknown_ids``.
* the data file is read leniently, as the official scripts read it: scoring needs the ids and the
  answer texts only, so answers without an ``answer_start`` (or one that does not point at the
  text), repeated ids and a missing question or context are accepted, with one warning line per
  kind on stderr.
"""

from __future__ import annotations

import collections
import math
import re
import string
from dataclasses import dataclass, field
from typing import Mapping

from bert_of.eval.errors import PredictionsError
from bert_of.eval.squad_data import SquadData, load_squad, read_json_file

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    Order matters and is the official one: punctuation goes before articles are matched, so
    "the-end" -> "theend" keeps its article while "the end" -> "end".
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


# --------------------------------------------------------------------------- v1.1


def exact_match_v1(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_v1(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1; 0 when nothing overlaps -- including when both normalise to ""
    (v1.1 quirk: a prediction "the" for gold "a" has EM 1 but F1 0)."""
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(ground_truth).split()
    same = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(pred)
    recall = 1.0 * same / len(gold)
    return (2 * precision * recall) / (precision + recall)


# --------------------------------------------------------------------------- v2.0


def _tokens_v2(s: str) -> list:
    if not s:
        return []
    return normalize_answer(s).split()


def exact_v2(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_v2(gold: str, pred: str) -> float:
    """As v1.1 except that an empty side (no-answer) scores 1 iff both are empty."""
    g, p = _tokens_v2(gold), _tokens_v2(pred)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if not g or not p:
        return int(g == p)
    if same == 0:
        return 0
    precision = 1.0 * same / len(p)
    recall = 1.0 * same / len(g)
    return (2 * precision * recall) / (precision + recall)


# --------------------------------------------------------------------------- scoring


@dataclass
class SquadScore:
    """What the official script prints (``result``) plus what it did not say."""

    version: str  # "1.1" or "2.0": which official script this equals
    result: "collections.OrderedDict"
    questions: int  # questions in the data
    scored: int  # questions with a prediction
    missing: list = field(default_factory=list)  # question ids without a prediction
    unknown: list = field(default_factory=list)  # prediction ids not in the data (ignored)
    notes: list = field(default_factory=list)  # lines for stderr


def _check_predictions(sd: SquadData, preds, path: str, ignore_unknown_ids: bool):
    if not isinstance(preds, Mapping):
        raise PredictionsError(f"{path}: expected a JSON object mapping question id -> answer text")
    if not preds:
        raise PredictionsError(f"{path}: no predictions (empty object)")
    for qid, text in preds.items():
        if not isinstance(text, str):
            raise PredictionsError(f"{path}: prediction for {qid!r} is {type(text).__name__}, expected a string")
    known = {q.qid for q in sd.questions}
    unknown = [k for k in preds if k not in known]
    if unknown and not ignore_unknown_ids:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise PredictionsError(f"{path}: prediction id {unknown[0]!r} is not a question in {sd.path}{more}")
    return unknown


def score_v1(sd: SquadData, preds: Mapping[str, str]) -> SquadScore:
    """evaluate-v1.1.py: {"exact_match", "f1"}, missing predictions count as 0."""
    exact_match = f1 = total = 0
    missing = []
    notes = []
    for q in sd.questions:
        total += 1
        if q.qid not in preds:
            missing.append(q.qid)
            notes.append(f"Unanswered question {q.qid} will receive score 0.")
            continue
        pred = preds[q.qid]
        # An answerable question always has golds in v1.1; max() over none is the official crash.
        golds = q.answers or [""]
        exact_match += max(exact_match_v1(pred, g) for g in golds)
        f1 += max(f1_v1(pred, g) for g in golds)
    result = collections.OrderedDict()
    result["exact_match"] = 100.0 * exact_match / total
    result["f1"] = 100.0 * f1 / total
    if missing:
        notes.append(f"{len(missing)} of {total} questions have no prediction and scored 0")
    return SquadScore("1.1", result, total, total - len(missing), missing, [], notes)


def _find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    cur = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    best = cur
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur += diff
        if cur > best:
            best = cur
            best_thresh = na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def score_v2(sd: SquadData, preds: Mapping[str, str], na_probs: Mapping[str, float] | None = None,
             na_prob_thresh: float = 1.0, na_prob_path: str = "na-prob file") -> SquadScore:
    """evaluate-v2.0.py: exact/f1/total, HasAns_*/NoAns_*, and best_* with ``na_probs``."""
    qid_to_has_ans = collections.OrderedDict((q.qid, q.has_answer) for q in sd.questions)
    exact_raw = collections.OrderedDict()
    f1_raw = collections.OrderedDict()
    missing = []
    notes = []
    for q in sd.questions:
        golds = [a for a in q.answers if normalize_answer(a)] or [""]
        if q.qid not in preds:
            missing.append(q.qid)
            notes.append(f"Missing prediction for {q.qid}")
            continue
        pred = preds[q.qid]
        exact_raw[q.qid] = max(exact_v2(g, pred) for g in golds)
        f1_raw[q.qid] = max(f1_v2(g, pred) for g in golds)
    if not exact_raw:
        raise PredictionsError(f"no prediction matches a question in {sd.path}")

    have_file = na_probs is not None
    if not have_file:
        na_probs = {k: 0.0 for k in preds}
    else:
        for qid, v in na_probs.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise PredictionsError(f"{na_prob_path}: value for {qid!r} is {v!r}, expected a number")
            if not math.isfinite(v):  # NaN sorts nowhere: the best thresholds would be NaN, not JSON
                raise PredictionsError(f"{na_prob_path}: value for {qid!r} is {v!r}, expected a finite number")
        for qid in exact_raw:
            if qid not in na_probs:
                raise PredictionsError(f"{na_prob_path}: no entry for question id {qid!r}")

    def apply_thresh(scores):
        out = collections.OrderedDict()
        for qid, s in scores.items():
            out[qid] = float(not qid_to_has_ans[qid]) if na_probs[qid] > na_prob_thresh else s
        return out

    exact_t = apply_thresh(exact_raw)
    f1_t = apply_thresh(f1_raw)

    def eval_dict(qids):
        total = len(qids)
        d = collections.OrderedDict()
        d["exact"] = 100.0 * sum(exact_t[k] for k in qids) / total
        d["f1"] = 100.0 * sum(f1_t[k] for k in qids) / total
        d["total"] = total
        return d

    result = collections.OrderedDict()
    total = len(exact_t)
    result["exact"] = 100.0 * sum(exact_t.values()) / total
    result["f1"] = 100.0 * sum(f1_t.values()) / total
    result["total"] = total
    # Breakdowns over the scored questions (official: all questions, KeyError if any is missing).
    has_ans = [k for k, v in qid_to_has_ans.items() if v and k in exact_t]
    no_ans = [k for k, v in qid_to_has_ans.items() if not v and k in exact_t]
    if has_ans:
        for k, v in eval_dict(has_ans).items():
            result[f"HasAns_{k}"] = v
    if no_ans:
        for k, v in eval_dict(no_ans).items():
            result[f"NoAns_{k}"] = v
    if have_file:
        # Official: over all questions. With predictions missing, over the scored ones only
        # (else unscored no-answer questions would count as right and best_* could pass 100).
        has = qid_to_has_ans if not missing else {k: v for k, v in qid_to_has_ans.items() if k in exact_raw}
        best_exact, exact_thresh = _find_best_thresh(preds, exact_raw, na_probs, has)
        best_f1, f1_thresh = _find_best_thresh(preds, f1_raw, na_probs, has)
        result["best_exact"] = best_exact
        result["best_exact_thresh"] = exact_thresh
        result["best_f1"] = best_f1
        result["best_f1_thresh"] = f1_thresh
    if missing:
        notes.append(f"{len(missing)} of {len(sd.questions)} questions have no prediction and are not scored "
                     f"(total {total}); the official evaluate-v2.0.py stops with a KeyError here")
    return SquadScore("2.0", result, len(sd.questions), total, missing, [], notes)


def squad_score(data_path: str, pred_path: str, na_prob_file: str | None = None, na_prob_thresh: float = 1.0,
                *, version: str | None = None, ignore_unknown_ids: bool = False,
                check_spans: bool = True) -> SquadScore:
    """Score a predictions.json against a SQuAD data file; the version comes from the data file
    (its "version" field; "1.1" or "2.0" in ``version`` overrides). The data file is read
    leniently (see the module doc); ``check_spans`` only decides whether answers whose
    ``answer_start`` does not locate their text are counted in a warning."""
    sd = load_squad(data_path, check_spans=check_spans, version=version, lenient=True)
    preds = read_json_file(pred_path, "predictions JSON object")
    unknown = _check_predictions(sd, preds, pred_path, ignore_unknown_ids)
    if not sd.is_v2:
        if na_prob_file:
            raise PredictionsError(f"--na-prob-file applies to SQuAD v2.0 data; {data_path} is "
                                   f"version {sd.version or '1.x'}")
        score = score_v1(sd, preds)
    else:
        if not math.isfinite(na_prob_thresh):
            raise PredictionsError(f"--na-prob-thresh {na_prob_thresh!r}: expected a finite number")
        na_probs = None
        if na_prob_file:
            na_probs = read_json_file(na_prob_file, "na-prob JSON object")
            if not isinstance(na_probs, Mapping):
                raise PredictionsError(f"{na_prob_file}: expected a JSON object mapping question id -> probability")
        score = score_v2(sd, preds, na_probs, na_prob_thresh, na_prob_path=na_prob_file or "")
    score.unknown = unknown
    score.notes[:0] = sd.warnings
    if unknown:
        score.notes.append(f"ignored {len(unknown)} prediction ids that are not questions in {data_path}")
    return score
