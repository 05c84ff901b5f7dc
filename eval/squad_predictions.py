"""SQuAD predictions: per-feature start/end logits back to the official prediction files.

Semantics follow google-research/bert ``run_squad.py``: prediction takes the top ``n_best_size``
start and end logits of every window, keeps valid spans (inside the window's context,
end >= start, length <= ``max_answer_length``, the start token at its max-context window), ranks
them by start + end logit, projects the WordPiece text back onto the original context
(``get_final_text``) and, for v2.0, predicts "" when
``null score - best non-null score > null_score_diff_threshold``. The examples and windows
(features) are :mod:`bert_of.eval.squad_data`'s.

The model is not needed here: logits come in as numpy.
"""

from __future__ import annotations

import collections
import json
import math
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from bert_of.eval.errors import EvalDataError
from bert_of.eval.squad_data import InputFeatures, SquadExample
from bert_of.files.atomic import atomic_write
from bert_of.tokenization import BasicTokenizer


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool = True, basic_tokenizer=None) -> str:
    """Project normalized WordPiece text back onto the original words.

    ``pred_text`` ("steve smith") was lower-cased / accent-stripped / punctuation-split by the
    tokenizer; ``orig_text`` ("Steve Smith's") is the whitespace-joined original doc tokens the
    span came from. Both are aligned character by character after removing spaces (the original
    re-tokenized with the basic tokenizer); when that alignment fails (lengths differ, not found)
    the whole ``orig_text`` is returned, as run_squad does.
    """
    tokenizer = basic_tokenizer or BasicTokenizer(do_lower_case=do_lower_case)
    tok_text = " ".join(tokenizer.tokenize(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1

    def strip_spaces(text):
        ns_to_s = {}
        chars = []
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s[len(chars)] = i
            chars.append(c)
        return "".join(chars), ns_to_s

    orig_ns, orig_ns_to_s = strip_spaces(orig_text)
    tok_ns, tok_ns_to_s = strip_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
    orig_start = orig_ns_to_s.get(tok_s_to_ns[start]) if start in tok_s_to_ns else None
    if orig_start is None:
        return orig_text
    orig_end = orig_ns_to_s.get(tok_s_to_ns[end]) if end in tok_s_to_ns else None
    if orig_end is None:
        return orig_text
    return orig_text[orig_start:orig_end + 1]


def best_indexes(logits: Sequence[float], n_best_size: int) -> list:
    """Indices of the ``n_best_size`` largest logits, largest first; ties keep the lower index."""
    order = sorted(range(len(logits)), key=lambda i: logits[i], reverse=True)
    return order[:n_best_size]


def compute_softmax(scores: Sequence[float]) -> list:
    if not scores:
        return []
    m = max(scores)
    exps = [math.exp(s - m) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


@dataclass
class SquadPredictions:
    """The contents of predictions.json, nbest_predictions.json and (v2.0) null_odds.json."""

    predictions: "collections.OrderedDict[str, str]"
    nbest: "collections.OrderedDict[str, list]"
    null_odds: "collections.OrderedDict[str, float] | None" = None


def _logit_rows(logits, features, name):
    if isinstance(logits, Mapping):
        try:
            rows = [logits[f.unique_id] for f in features]
        except KeyError as e:
            raise EvalDataError(f"{name}: no logits for feature unique_id {e.args[0]}") from None
    else:
        rows = list(logits)
        if len(rows) != len(features):
            raise EvalDataError(f"{name}: {len(rows)} rows of logits for {len(features)} features")
    out = []
    for f, row in zip(features, rows):
        vals = np.asarray(row).ravel().tolist()  # Python floats, exactly the array's values
        if len(vals) < len(f.tokens):
            raise EvalDataError(f"{name}: feature {f.unique_id} has {len(f.tokens)} tokens but "
                                f"{len(vals)} logits")
        out.append(vals)
    return out


def postprocess_predictions(examples: Sequence[SquadExample], features: Sequence[InputFeatures],
                            start_logits, end_logits, *, n_best_size: int = 20, max_answer_length: int = 30,
                            do_lower_case: bool = True, version_2_with_negative: bool = False,
                            null_score_diff_threshold: float = 0.0, basic_tokenizer=None) -> SquadPredictions:
    """Model logits -> the official prediction files' contents (run_squad's write_predictions).

    ``start_logits`` / ``end_logits``: one row per feature, in ``features`` order (an array
    [num_features, max_seq_length] or a list of 1-D arrays), or a mapping unique_id -> row.
    Pass the model's float32 logits unchanged: they are compared and summed as Python floats,
    as run_squad does, so the files match TensorFlow's byte for byte given equal logits.

    No valid span: v1.1 predicts the nonce "empty" (logits 0), exactly as run_squad. For v2.0
    (where run_squad raises AttributeError) the n-best gets the same nonce after "", the null
    odds are computed against it (null score - 0), and the prediction is "".
    """
    starts = _logit_rows(start_logits, features, "start_logits")
    ends = _logit_rows(end_logits, features, "end_logits")
    by_example = collections.defaultdict(list)
    for fi, f in enumerate(features):
        by_example[f.example_index].append(fi)
    basic = basic_tokenizer or BasicTokenizer(do_lower_case=do_lower_case)

    predictions = collections.OrderedDict()
    nbest_all = collections.OrderedDict()
    null_odds = collections.OrderedDict() if version_2_with_negative else None

    for example_index, ex in enumerate(examples):
        feat_ids = by_example.get(example_index, [])
        prelim = []  # (feature_id, start_index, end_index, start_logit, end_logit)
        score_null = 1000000.0
        null_fid = feat_ids[0] if feat_ids else None
        null_start = null_end = 0.0
        for fid in feat_ids:
            f = features[fid]
            s_log, e_log = starts[fid], ends[fid]
            if version_2_with_negative:
                null_score = s_log[0] + e_log[0]
                if null_score < score_null:
                    score_null, null_fid = null_score, fid
                    null_start, null_end = s_log[0], e_log[0]
            n_tokens = len(f.tokens)
            end_candidates = best_indexes(e_log, n_best_size)
            for si in best_indexes(s_log, n_best_size):
                for ei in end_candidates:
                    if si >= n_tokens or ei >= n_tokens:
                        continue
                    if si not in f.token_to_orig_map or ei not in f.token_to_orig_map:
                        continue
                    if not f.token_is_max_context.get(si, False):
                        continue
                    if ei < si or ei - si + 1 > max_answer_length:
                        continue
                    prelim.append((fid, si, ei, s_log[si], e_log[ei]))
        if version_2_with_negative and null_fid is not None:
            prelim.append((null_fid, 0, 0, null_start, null_end))
        prelim.sort(key=lambda p: p[3] + p[4], reverse=True)

        seen = set()
        nbest = []  # (text, start_logit, end_logit)
        for fid, si, ei, sl, el in prelim:
            if len(nbest) >= n_best_size:
                break
            f = features[fid]
            if si > 0:
                tok_text = " ".join(f.tokens[si:ei + 1]).replace(" ##", "").replace("##", "")
                tok_text = " ".join(tok_text.strip().split())
                orig_text = " ".join(ex.doc_tokens[f.token_to_orig_map[si]:f.token_to_orig_map[ei] + 1])
                text = get_final_text(tok_text, orig_text, do_lower_case, basic)
                if text in seen:
                    continue
            else:
                text = ""
            seen.add(text)
            nbest.append((text, sl, el))
        if version_2_with_negative and "" not in seen:
            nbest.append(("", null_start, null_end))
        no_span = not any(t for t, _, _ in nbest)
        if not nbest or (version_2_with_negative and no_span):
            nbest.append(("empty", 0.0, 0.0))

        probs = compute_softmax([sl + el for _, sl, el in nbest])
        entries = []
        for (text, sl, el), prob in zip(nbest, probs):
            entry = collections.OrderedDict()
            entry["text"] = text
            entry["probability"] = prob
            entry["start_logit"] = sl
            entry["end_logit"] = el
            entries.append(entry)

        if not version_2_with_negative:
            predictions[ex.qas_id] = entries[0]["text"]
        else:
            best_non_null = next(e for e in nbest if e[0])
            diff = score_null - best_non_null[1] - best_non_null[2]
            null_odds[ex.qas_id] = diff
            if no_span:  # only the nonce: there is no answer to give
                predictions[ex.qas_id] = ""
            else:
                predictions[ex.qas_id] = "" if diff > null_score_diff_threshold else best_non_null[0]
        nbest_all[ex.qas_id] = entries
    return SquadPredictions(predictions, nbest_all, null_odds)


def write_prediction_files(output_dir: str, preds: SquadPredictions) -> dict:
    """Write predictions.json, nbest_predictions.json and (v2.0) null_odds.json as run_squad does
    (``json.dumps(obj, indent=4) + "\\n"``). Returns {kind: path}."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"predictions": os.path.join(output_dir, "predictions.json"),
             "nbest": os.path.join(output_dir, "nbest_predictions.json")}
    atomic_write(paths["predictions"], json.dumps(preds.predictions, indent=4) + "\n")
    atomic_write(paths["nbest"], json.dumps(preds.nbest, indent=4) + "\n")
    if preds.null_odds is not None:
        paths["null_odds"] = os.path.join(output_dir, "null_odds.json")
        atomic_write(paths["null_odds"], json.dumps(preds.null_odds, indent=4) + "\n")
    return paths
