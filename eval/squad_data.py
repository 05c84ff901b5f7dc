"""SQuAD data: reading the official JSON, building model features, and turning per-feature
start/end logits back into the official prediction files.

Semantics follow google-research/bert ``run_squad.py``:

* contexts are split into *doc tokens* on whitespace (space, tab, CR, LF and U+202F), each doc
  token is WordPiece-tokenized; the answer's character span is projected onto doc tokens and
  then tightened to the WordPiece tokens that spell the answer (``improve_answer_span``);
* a context longer than the window is covered by windows ``doc_stride`` tokens apart; a token
  counts only in the window where it has the most context (``check_is_max_context``);
* ``[CLS] question [SEP] window [SEP]``, segment ids 0/1, zero padding to ``max_seq_length``;
  training targets outside the window, and impossible (v2.0) questions, point at ``[CLS]`` (0);
* prediction takes the top ``n_best_size`` start and end logits of every window, keeps valid
  spans (inside the window's context, end >= start, length <= ``max_answer_length``, the start
  token at its max-context window), ranks them by start + end logit, projects the WordPiece
  text back onto the original context (``get_final_text``) and, for v2.0, predicts "" when
  ``null score - best non-null score > null_score_diff_threshold``.

The model is not needed here: features go in as lists/arrays, logits come back as numpy.
"""

from __future__ import annotations

import collections
import json
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from bert_of.eval.errors import EvalDataError
from bert_of.files.atomic import atomic_write
from bert_of.files.reading import read_json
from bert_of.progress import log, progress_iter
from bert_of.tokenization import BasicTokenizer

# --------------------------------------------------------------------------- reading the JSON


@dataclass
class SquadQuestion:
    """One question of a SQuAD file, as the scorers see it."""

    qid: str
    question: str
    answers: list  # gold answer texts, file order (may be empty for v2.0)
    has_answer: bool  # bool(qa["answers"]), the official has-answer test
    article: int  # index of the article in "data"
    paragraph: int  # index of the paragraph in the article


@dataclass
class SquadData:
    """A validated SQuAD file."""

    path: str
    version: str  # the file's "version" string ("1.1", "v2.0", ...) or ""
    is_v2: bool  # scored with evaluate-v2.0 semantics
    data: list  # the raw "data" list (articles), for feature reading
    questions: list = field(default_factory=list)  # SquadQuestion, file order
    warnings: list = field(default_factory=list)  # lenient reading: what was accepted though odd (one line each)

    def __len__(self):
        return len(self.questions)


def read_json_file(path: str, what: str = "JSON file"):
    return read_json(path, what, EvalDataError, expect=None)


def detect_version(version: str, data: list) -> bool:
    """True for SQuAD 2.0 semantics: the file says 2.x, or (no version) has ``is_impossible``."""
    v = str(version or "").lower().lstrip("v")
    if v.startswith("2"):
        return True
    if v.startswith("1"):
        return False
    for article in data:
        for p in article.get("paragraphs", []):
            for qa in p.get("qas", []):
                if isinstance(qa, dict) and "is_impossible" in qa:
                    return True
    return False


def load_squad(path: str, *, check_spans: bool = True, version: str | None = None,
               lenient: bool = False) -> SquadData:
    """Read and validate a SQuAD v1.1 / v2.0 json file.

    Every question needs a string ``id`` and a list of ``answers`` each with a string ``text``.
    Strict (reading for features): ids unique, a string ``question`` and ``context``, and with
    ``check_spans`` every answer's integer ``answer_start`` must point at its text (true for the
    official train/dev files). ``lenient`` (scoring): what the official evaluate scripts ignore is
    accepted -- a missing or wrong ``answer_start`` (with ``check_spans``, counted in
    ``warnings``), repeated ids, a missing question or context, ``is_impossible`` disagreeing with
    the answers (the scripts use the answers). ``version`` ("1.1" / "2.0") overrides the file's
    own ``version`` field.
    """
    obj = read_json_file(path, "SQuAD json file")
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise EvalDataError(f"{path}: not a SQuAD file (expected an object with a \"data\" list)")
    data = obj["data"]
    file_version = obj.get("version", "")
    if version is not None:
        is_v2 = detect_version(version, [])
    else:
        is_v2 = detect_version(file_version, data)
    out = SquadData(path=path, version=str(file_version), is_v2=is_v2, data=data)
    seen: dict = {}
    odd = collections.Counter()  # lenient: kind -> count
    first = {}  # lenient: kind -> where it was first seen

    def accept(kind, where):
        odd[kind] += 1
        first.setdefault(kind, where)

    for ai, article in enumerate(data):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise EvalDataError(f"{path}: data[{ai}]: expected an article with a \"paragraphs\" list")
        for pi, p in enumerate(article["paragraphs"]):
            where = f"{path}: data[{ai}].paragraphs[{pi}]"
            if not isinstance(p, dict) or not isinstance(p.get("qas"), list):
                raise EvalDataError(f"{where}: expected a paragraph with a \"qas\" list")
            context = p.get("context")
            if not isinstance(context, str):
                if not lenient:
                    raise EvalDataError(f"{where}: expected a paragraph with a string \"context\" and a \"qas\" list")
                context = None
            for qi, qa in enumerate(p["qas"]):
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise EvalDataError(f"{where}.qas[{qi}]: question without a string \"id\"")
                qid = qa["id"]
                if qid in seen:
                    if not lenient:
                        raise EvalDataError(f"{path}: question id {qid!r} appears twice")
                    accept("repeated id", f"question {qid!r}")
                seen[qid] = True
                question = qa.get("question")
                if not isinstance(question, str):
                    if not lenient:
                        raise EvalDataError(f"{path}: question {qid!r}: missing string \"question\"")
                    question = ""
                answers = qa.get("answers")
                if not isinstance(answers, list):
                    raise EvalDataError(f"{path}: question {qid!r}: missing \"answers\" list")
                texts = []
                for k, a in enumerate(answers):
                    if not isinstance(a, dict) or not isinstance(a.get("text"), str):
                        raise EvalDataError(f"{path}: question {qid!r} answer {k}: missing string \"text\"")
                    if check_spans:
                        problem = _span_problem(a, context)
                        if problem and not lenient:
                            raise EvalDataError(f"{path}: question {qid!r} answer {k}: {problem}")
                        if problem:
                            accept("answer_start", f"question {qid!r} answer {k}: {problem}")
                    texts.append(a["text"])
                imp = qa.get("is_impossible")
                if imp is not None and not isinstance(imp, bool):
                    if not lenient:
                        raise EvalDataError(f"{path}: question {qid!r}: \"is_impossible\" must be true or false")
                    accept("is_impossible", f"question {qid!r}")
                elif imp and answers:
                    if not lenient:
                        raise EvalDataError(f"{path}: question {qid!r}: is_impossible is true but it has answers")
                    accept("is_impossible", f"question {qid!r}")
                out.questions.append(SquadQuestion(qid, question, texts, bool(answers), ai, pi))
    if not out.questions:
        raise EvalDataError(f"{path}: no questions in the file")
    whats = {"answer_start": "answer(s) without an answer_start that points at their text (scoring reads "
                             "only the texts)",
             "repeated id": "repeated question id(s) (scored as the official script does)",
             "is_impossible": "question(s) whose is_impossible disagrees with their answers (the answers count, "
                              "as in the official script)"}
    for kind, n in odd.items():
        out.warnings.append(f"warning: {path}: {n} {whats[kind]}; first: {first[kind]}")
    return out


def _span_problem(answer: dict, context) -> str | None:
    """Why ``answer_start`` does not locate the answer's text in ``context`` (None if it does)."""
    start = answer.get("answer_start")
    if "answer_start" not in answer:
        return "no answer_start"
    if not isinstance(start, int) or isinstance(start, bool):
        return f"\"answer_start\" must be an integer, got {start!r}"
    if context is None:
        return "no context to check answer_start against"
    found = context[start:start + len(answer["text"])] if start >= 0 else None
    if found != answer["text"]:
        return (f"answer_start {start} does not match the context (expected {answer['text']!r}, "
                f"context has {found!r} there)")
    return None


# --------------------------------------------------------------------------- examples


_DOC_WHITESPACE = frozenset((" ", "\t", "\r", "\n", "\u202f"))


def split_doc_tokens(text: str):
    """run_squad's whitespace split: (doc_tokens, char_to_word_offset).

    ``char_to_word_offset[i]`` is the doc token holding character i (a whitespace character
    maps to the token before it, -1 before the first token).
    """
    doc_tokens: list[str] = []
    char_to_word_offset: list[int] = []
    prev_ws = True
    for c in text:
        if c in _DOC_WHITESPACE:
            prev_ws = True
        else:
            if prev_ws:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_ws = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


@dataclass
class SquadExample:
    """A question over a whitespace-tokenized context (run_squad's SquadExample)."""

    qas_id: str
    question_text: str
    doc_tokens: list
    orig_answer_text: str | None = None
    start_position: int | None = None  # doc-token index of the answer start (training)
    end_position: int | None = None
    is_impossible: bool = False


def read_squad_examples(source, is_training: bool, version_2_with_negative: bool | None = None,
                        warn: Callable[[str], None] | None = None) -> list:
    """SquadExample list from a path or a :class:`SquadData`, in file order.

    Training uses the first answer of an answerable question (as transformers does: dev-style
    files list several per question; one note says how many had several); an impossible question
    (v2.0: ``is_impossible``, or no answers when the flag is absent) gets positions -1 and answer "".
    As in run_squad, a training answer whose whitespace-token span does not spell the answer
    (odd Unicode) is skipped with a warning. ``version_2_with_negative`` defaults to the file's
    version.
    """
    sd = source if isinstance(source, SquadData) else load_squad(source)
    v2 = sd.is_v2 if version_2_with_negative is None else version_2_with_negative
    if warn is None:
        def warn(msg):
            log.warning(msg)
    examples, several = [], 0
    for article in sd.data:
        for p in article["paragraphs"]:
            context = p["context"]
            doc_tokens, char_to_word = split_doc_tokens(context)
            for qa in p["qas"]:
                qid = qa["id"]
                ex = SquadExample(qas_id=qid, question_text=qa["question"], doc_tokens=doc_tokens)
                if is_training:
                    answers = qa["answers"]
                    impossible = bool(qa.get("is_impossible", not answers)) if v2 else False
                    if not impossible and not answers:
                        raise EvalDataError(f"{sd.path}: question {qid!r}: training needs an answer, found none")
                    several += not impossible and len(answers) > 1
                    if impossible:
                        ex.is_impossible = True
                        ex.start_position = ex.end_position = -1
                        ex.orig_answer_text = ""
                    else:
                        a = answers[0]
                        text, start = a["text"], a.get("answer_start")
                        if not text or not isinstance(start, int) or not 0 <= start < len(context) \
                                or start + len(text) > len(context):
                            raise EvalDataError(f"{sd.path}: question {qid!r}: answer {text!r} at {start!r} "
                                                f"is not inside the context")
                        ex.orig_answer_text = text
                        ex.start_position = char_to_word[start]
                        ex.end_position = char_to_word[start + len(text) - 1]
                        actual = " ".join(doc_tokens[ex.start_position:ex.end_position + 1])
                        cleaned = " ".join(text.split())
                        if actual.find(cleaned) == -1:
                            warn(f"question {qid!r}: could not find answer {cleaned!r} in {actual!r}; skipped")
                            continue
                examples.append(ex)
    if several:
        log.info("%s: %d question(s) have several answers; training uses the first of each", sd.path, several)
    return examples


# --------------------------------------------------------------------------- features


@dataclass
class InputFeatures:
    """One window of one example (run_squad's InputFeatures)."""

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: list
    token_to_orig_map: dict  # feature position -> doc-token index (context positions only)
    token_is_max_context: dict  # feature position -> bool
    input_ids: list
    input_mask: list
    segment_ids: list
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False


DocSpan = collections.namedtuple("DocSpan", ["start", "length"])


def improve_answer_span(doc_tokens: Sequence[str], input_start: int, input_end: int, tokenizer,
                        orig_answer_text: str):
    """Tighten a WordPiece span to the sub-span spelling the tokenized answer, if any.

    E.g. the answer "1895" in the doc token "(1895-1943)." becomes the single WordPiece "1895".
    The first (leftmost start, then longest) matching sub-span wins; otherwise the span is kept.
    """
    target = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(input_start, input_end + 1):
        for new_end in range(input_end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start:new_end + 1]) == target:
                return new_start, new_end
    return input_start, input_end


def make_doc_spans(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list:
    """Windows over ``num_tokens`` WordPieces: starts 0, s, 2s, ... until the end is covered."""
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append(DocSpan(start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def check_is_max_context(doc_spans: Sequence[DocSpan], cur_span_index: int, position: int) -> bool:
    """Whether window ``cur_span_index`` gives token ``position`` its maximal context.

    Score = min(left context, right context) + 0.01 * window length; the first best window wins.
    """
    best_score = None
    best_index = None
    for i, span in enumerate(doc_spans):
        end = span.start + span.length - 1
        if position < span.start or position > end:
            continue
        score = min(position - span.start, end - position) + 0.01 * span.length
        if best_score is None or score > best_score:
            best_score, best_index = score, i
    return cur_span_index == best_index


def convert_examples_to_features(examples: Sequence[SquadExample], tokenizer, max_seq_length: int = 384,
                                 doc_stride: int = 128, max_query_length: int = 64, is_training: bool = False,
                                 unique_id_start: int = 1000000000) -> list:
    """Windows of every example, in order; ``unique_id`` counts up from 1000000000.

    ``tokenizer`` needs ``tokenize(text) -> list[str]`` and ``convert_tokens_to_ids(tokens)``
    (e.g. a FullTokenizer).
    """
    if max_seq_length <= max_query_length + 3:
        raise EvalDataError(f"max_seq_length ({max_seq_length}) must be greater than "
                            f"max_query_length ({max_query_length}) + 3")
    if doc_stride < 1:
        raise EvalDataError(f"doc_stride must be positive, got {doc_stride}")
    features = []
    unique_id = unique_id_start
    for example_index, ex in enumerate(progress_iter(examples, "SQuAD features", unit="question")):
        query_tokens = list(tokenizer.tokenize(ex.question_text))[:max_query_length]

        tok_to_orig_index = []
        orig_to_tok_index = []
        all_doc_tokens = []
        for i, token in enumerate(ex.doc_tokens):
            orig_to_tok_index.append(len(all_doc_tokens))
            for sub in tokenizer.tokenize(token):
                tok_to_orig_index.append(i)
                all_doc_tokens.append(sub)

        tok_start = tok_end = None
        if is_training and ex.is_impossible:
            tok_start = tok_end = -1
        if is_training and not ex.is_impossible:
            tok_start = orig_to_tok_index[ex.start_position]
            if ex.end_position < len(ex.doc_tokens) - 1:
                tok_end = orig_to_tok_index[ex.end_position + 1] - 1
            else:
                tok_end = len(all_doc_tokens) - 1
            tok_start, tok_end = improve_answer_span(all_doc_tokens, tok_start, tok_end, tokenizer,
                                                     ex.orig_answer_text)

        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3  # [CLS], [SEP], [SEP]
        doc_spans = make_doc_spans(len(all_doc_tokens), max_tokens_for_doc, doc_stride)

        for span_index, span in enumerate(doc_spans):
            tokens = ["[CLS]", *query_tokens, "[SEP]"]
            segment_ids = [0] * len(tokens)
            token_to_orig_map = {}
            token_is_max_context = {}
            for i in range(span.length):
                split_index = span.start + i
                token_to_orig_map[len(tokens)] = tok_to_orig_index[split_index]
                token_is_max_context[len(tokens)] = check_is_max_context(doc_spans, span_index, split_index)
                tokens.append(all_doc_tokens[split_index])
                segment_ids.append(1)
            tokens.append("[SEP]")
            segment_ids.append(1)

            input_ids = list(tokenizer.convert_tokens_to_ids(tokens))
            input_mask = [1] * len(input_ids)
            pad = max_seq_length - len(input_ids)
            input_ids += [0] * pad
            input_mask += [0] * pad
            segment_ids += [0] * pad

            start_position = end_position = None
            if is_training and not ex.is_impossible:
                doc_start = span.start
                doc_end = span.start + span.length - 1
                if tok_start >= doc_start and tok_end <= doc_end:
                    offset = len(query_tokens) + 2
                    start_position = tok_start - doc_start + offset
                    end_position = tok_end - doc_start + offset
                else:  # the answer is not (wholly) in this window: point at [CLS]
                    start_position = end_position = 0
            if is_training and ex.is_impossible:
                start_position = end_position = 0

            features.append(InputFeatures(
                unique_id=unique_id, example_index=example_index, doc_span_index=span_index, tokens=tokens,
                token_to_orig_map=token_to_orig_map, token_is_max_context=token_is_max_context,
                input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                start_position=start_position, end_position=end_position, is_impossible=ex.is_impossible))
            unique_id += 1
    return features


def features_to_arrays(features: Sequence[InputFeatures], is_training: bool = False) -> dict:
    """Stack features into int64 arrays: unique_ids [F], input_ids / input_mask / segment_ids [F, S],
    and for training start_positions / end_positions / is_impossible [F]."""
    out = {
        "unique_ids": np.array([f.unique_id for f in features], dtype=np.int64),
        "input_ids": np.array([f.input_ids for f in features], dtype=np.int64),
        "input_mask": np.array([f.input_mask for f in features], dtype=np.int64),
        "segment_ids": np.array([f.segment_ids for f in features], dtype=np.int64),
    }
    if is_training:
        out["start_positions"] = np.array([f.start_position for f in features], dtype=np.int64)
        out["end_positions"] = np.array([f.end_position for f in features], dtype=np.int64)
        out["is_impossible"] = np.array([int(bool(f.is_impossible)) for f in features], dtype=np.int64)
    return out


# --------------------------------------------------------------------------- predictions


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
