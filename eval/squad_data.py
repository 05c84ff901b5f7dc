"""SQuAD data: reading the official JSON and building model features (turning the model's
start/end logits back into the official prediction files is :mod:`bert_of.eval.squad_predictions`).

Semantics follow google-research/bert ``run_squad.py``:

* contexts are split into *doc tokens* on whitespace (space, tab, CR, LF and U+202F), each doc
  token is WordPiece-tokenized; the answer's character span is projected onto doc tokens and
  then tightened to the WordPiece tokens that spell the answer (``improve_answer_span``);
* a context longer than the window is covered by windows ``doc_stride`` tokens apart; a token
  counts only in the window where it has the most context (``check_is_max_context``);
* ``[CLS] question [SEP] window [SEP]``, segment ids 0/1, zero padding to ``max_seq_length``;
  training targets outside the window, and impossible (v2.0) questions, point at ``[CLS]`` (0).

The model is not needed here: features go out as lists/arrays.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from bert_of.eval.errors import EvalDataError
from bert_of.files.reading import read_json
from bert_of.progress import log, progress_iter

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
