"""GLUE and XNLI data: TSV readers in the official layouts, classifier features (scores: glue_metrics).

Readers return :class:`InputExample` (guid, text_a, text_b, label) like google-research/bert's
``run_classifier.py`` processors (CoLA, MNLI, MRPC, XNLI) and the GLUE distribution's
layouts for SST-2, QNLI, QQP, RTE, STS-B and WNLI. Labeled (train/dev) and unlabeled (test)
files are told apart by their header, so one reader serves every split; test examples have
``label=None``.

Files are read as TSV without quoting (``csv`` with ``QUOTE_NONE``), as run_classifier does
(``quotechar=None``): GLUE sentences contain bare double quotes. Lines end at ``\n``, ``\r\n`` or
``\r`` only (as Python's csv over a file does), never at the other characters ``str.splitlines``
knows (U+2028, U+0085, form feed...), which occur inside real sentences; a UTF-8 BOM, blank lines and
extra columns are accepted.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass

from bert_of.eval.errors import EvalDataError
from bert_of.files.reading import MAX_TEXT, STDIN, read_input

# --------------------------------------------------------------------------- examples


@dataclass
class InputExample:
    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None  # None in test files; float for STS-B


@dataclass(frozen=True)
class _Layout:
    """Column indices of one TSV layout (negative = from the end)."""

    text_a: int
    text_b: int | None
    label: int | None  # None: unlabeled (test)
    guid: int | None  # column used in the guid, None: the data line number
    min_cols: int


@dataclass(frozen=True)
class TaskSpec:
    name: str
    labels: tuple | None  # None: regression (STS-B)
    metrics: tuple  # metric names compute_metrics reports, first is the headline
    label_header: str | None  # header column present only in labeled files (None: CoLA, no header)
    labeled: _Layout
    test: _Layout
    positive: str | None = None  # positive class for F1
    header_first: tuple = ("index",)  # what a header's first column may be (lower case)


_NLI3 = ("contradiction", "entailment", "neutral")
_ENT2 = ("entailment", "not_entailment")

TASKS = {
    # CoLA train/dev: no header; source, label, original label, sentence. Test: "index, sentence".
    "cola": TaskSpec("CoLA", ("0", "1"), ("mcc", "accuracy"), None,
                     _Layout(3, None, 1, None, 4), _Layout(1, None, None, 0, 2)),
    "sst-2": TaskSpec("SST-2", ("0", "1"), ("accuracy",), "label",
                      _Layout(0, None, 1, None, 2), _Layout(1, None, None, 0, 2), header_first=("sentence", "index")),
    # MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String (test: index instead of Quality).
    "mrpc": TaskSpec("MRPC", ("0", "1"), ("f1", "accuracy"), "quality",
                     _Layout(3, 4, 0, None, 5), _Layout(3, 4, None, 0, 5), positive="1",
                     header_first=("quality", "index")),
    # STS-B: index, genre, filename, year, old_index, source1, source2, sentence1, sentence2, score.
    "sts-b": TaskSpec("STS-B", None, ("pearson", "spearman"), "score",
                      _Layout(7, 8, -1, 0, 10), _Layout(7, 8, None, 0, 9)),
    # QQP: id, qid1, qid2, question1, question2, is_duplicate (test: id, question1, question2).
    "qqp": TaskSpec("QQP", ("0", "1"), ("accuracy", "f1"), "is_duplicate",
                    _Layout(3, 4, 5, 0, 6), _Layout(1, 2, None, 0, 3), positive="1",
                    header_first=("id",)),
    # MNLI: index, promptID, pairID, genre, 4 parses, sentence1 (8), sentence2 (9), label1.., gold_label.
    "mnli": TaskSpec("MNLI", _NLI3, ("accuracy",), "gold_label",
                     _Layout(8, 9, -1, 0, 11), _Layout(8, 9, None, 0, 10)),
    "qnli": TaskSpec("QNLI", _ENT2, ("accuracy",), "label",
                     _Layout(1, 2, -1, 0, 4), _Layout(1, 2, None, 0, 3)),
    "rte": TaskSpec("RTE", _ENT2, ("accuracy",), "label",
                    _Layout(1, 2, -1, 0, 4), _Layout(1, 2, None, 0, 3)),
    "wnli": TaskSpec("WNLI", ("0", "1"), ("accuracy",), "label",
                     _Layout(1, 2, -1, 0, 4), _Layout(1, 2, None, 0, 3)),
    # XNLI dev/test: language, gold_label, 4 parses, sentence1 (6), sentence2 (7), promptID, ...
    "xnli": TaskSpec("XNLI", _NLI3, ("accuracy",), "gold_label",
                     _Layout(6, 7, 1, None, 8), _Layout(6, 7, None, None, 8), header_first=("language", "premise")),
}
ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "sts": "sts-b", "mnli-m": "mnli", "mnli-matched": "mnli",
           "mnli-mm": "mnli", "mnli-mismatched": "mnli"}
# Task names for results: MNLI is scored per dev file (matched / mismatched).
TASK_CHOICES = ("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "mnli-m", "mnli-mm", "qnli", "rte", "wnli", "xnli")


def task_spec(task: str) -> TaskSpec:
    key = task.lower()
    key = ALIASES.get(key, key)
    if key not in TASKS:
        raise EvalDataError(f"unknown task {task!r} (known: {', '.join(TASK_CHOICES)})")
    return TASKS[key]


def result_task_name(task: str, data_path: str) -> str:
    """The task's name in the results store: MNLI splits into mnli-m / mnli-mm (by the data file's
    name when not said), aliases become their canonical name."""
    t = task.lower()
    if t in ("mnli-m", "mnli-mm"):
        return t
    if t.startswith("mnli"):
        name = os.path.basename(data_path).lower()
        if "mismatched" in name or t in ("mnli-mismatched",):
            return "mnli-mm"
        return "mnli-m"
    return ALIASES.get(t, t)


def get_labels(task: str):
    """Label strings in class-id order (run_classifier's get_labels), None for STS-B."""
    labels = task_spec(task).labels
    return list(labels) if labels is not None else None


def _read_text(path: str, error=EvalDataError) -> str:
    """A UTF-8 text file (BOM allowed), or standard input / a pipe (``-``, /dev/stdin, ``<(...)``:
    :func:`~bert_of.files.reading.read_input`); every failure one line naming the file."""
    if path not in STDIN and not os.path.exists(path):
        raise error(f"{path}: No such file or directory")
    raw = read_input(path, MAX_TEXT, "text file", error)  # a regular file's size known before reading
    if not raw.strip():
        raise error(f"{path}: empty file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise error(f"{path}: line {line}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None


def _lines(text: str):
    """Lines as a file iterates them (\\n, \\r\\n, \\r), not as str.splitlines cuts them."""
    return io.StringIO(text, newline="")


def refuse_nul(path: str, text: str, kind: str) -> None:
    """A NUL byte is not text: refused on every Python (csv raises on it before 3.11, reads it after)."""
    at = text.find("\0")
    if at >= 0:
        line = text.count("\n", 0, at) + 1
        raise EvalDataError(f"{path}: line {line}: not readable as {kind} (line contains NUL)")


def read_tsv(path: str) -> list:
    """(line number, fields) of every non-empty line; one-line errors for unreadable files."""
    text = _read_text(path)
    refuse_nul(path, text, "TSV")
    rows = []
    reader = csv.reader(_lines(text), delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        for row in reader:
            if row and any(c.strip() for c in row):
                rows.append((reader.line_num, row))
    except csv.Error as e:  # a NUL byte, a field over csv's size limit
        raise EvalDataError(f"{path}: line {reader.line_num}: not readable as TSV ({e})") from None
    return rows


def finite_number(text: str, where: str, error) -> float:
    """``float(text)``, else ``error("<where>'<text>' is not a (finite) number")``."""
    try:
        x = float(text)
    except ValueError:
        raise error(f"{where}{text!r} is not a number") from None
    if not math.isfinite(x):
        raise error(f"{where}{text!r} is not a finite number")
    return x


def _field(row, i):
    return row[i] if i >= 0 else row[len(row) + i]


def read_examples(task: str, path: str, *, language: str | None = None, set_type: str | None = None,
                  skip_malformed: bool = False) -> list:
    """Examples of a GLUE/XNLI TSV file in its official layout (labeled or test).

    ``language`` filters XNLI rows (e.g. "zh"; None keeps all). ``set_type`` prefixes guids
    (default: the file name without extension). ``skip_malformed`` drops lines with too few
    columns (QQP's train file has a few) instead of failing on the first one.
    """
    spec = task_spec(task)
    rows = read_tsv(path)
    set_type = set_type or os.path.splitext(os.path.basename(path))[0]
    header = [c.strip().lower() for c in rows[0][1]]
    if spec.label_header is None:  # CoLA: labeled files have no header; the test file does
        layout = spec.test if header[0] == "index" else spec.labeled
        if header[0] == "index":
            rows = rows[1:]
    elif spec.name == "XNLI" and header[:3] == ["premise", "hypo", "label"]:
        # XNLI-MT machine-translated MNLI train: premise, hypo, label ("contradictory").
        layout = _Layout(0, 1, 2, None, 3)
        rows = rows[1:]
    else:
        if header[0] not in spec.header_first:
            raise EvalDataError(f"{path}: line {rows[0][0]}: not a {spec.name} header (its first column "
                                f"should be {' or '.join(repr(h) for h in spec.header_first)}, found {header[0]!r})")
        layout = spec.labeled if spec.label_header in header else spec.test
        rows = rows[1:]
    if not rows:
        raise EvalDataError(f"{path}: no examples (only a header)")

    examples = []
    for n, (line_no, row) in enumerate(rows):
        if len(row) < layout.min_cols:
            if skip_malformed:
                continue
            raise EvalDataError(f"{path}: line {line_no}: expected at least {layout.min_cols} tab-separated "
                                f"columns for {spec.name}, found {len(row)}")
        if spec.name == "XNLI" and language is not None and layout.text_a == 6 and row[0] != language:
            continue
        text_a = _field(row, layout.text_a)
        text_b = _field(row, layout.text_b) if layout.text_b is not None else None
        guid = f"{set_type}-{row[layout.guid] if layout.guid is not None else n}"
        label = None
        if layout.label is not None:
            raw = _field(row, layout.label).strip()
            if spec.labels is None:
                label = finite_number(raw, f"{path}: line {line_no}: {spec.name} score ", EvalDataError)
            else:
                if spec.name == "XNLI" and raw == "contradictory":
                    raw = "contradiction"
                if raw not in spec.labels:
                    raise EvalDataError(f"{path}: line {line_no}: label {raw!r} is not a {spec.name} label "
                                        f"({', '.join(spec.labels)})")
                label = raw
        examples.append(InputExample(guid, text_a, text_b, label))
    if not examples:
        raise EvalDataError(f"{path}: no examples" + (f" for language {language!r}" if language else ""))
    return examples


# --------------------------------------------------------------------------- features


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Drop tokens from the end of the longer sequence until both fit (in place)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def convert_example_to_features(example: InputExample, label_list, max_seq_length: int, tokenizer) -> dict:
    """run_classifier's convert_single_example: ``[CLS] a [SEP] (b [SEP])``, zero padded.

    Returns input_ids, input_mask, segment_ids (lists of length max_seq_length) and label_id
    (class index; the float score for STS-B, i.e. ``label_list`` None; 0 for test examples).
    """
    tokens_a = list(tokenizer.tokenize(example.text_a))
    tokens_b = list(tokenizer.tokenize(example.text_b)) if example.text_b else None
    if tokens_b:
        truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    else:
        tokens_a = tokens_a[:max_seq_length - 2]
    tokens = ["[CLS]", *tokens_a, "[SEP]"]
    segment_ids = [0] * len(tokens)
    if tokens_b:
        tokens += [*tokens_b, "[SEP]"]
        segment_ids += [1] * (len(tokens_b) + 1)
    input_ids = list(tokenizer.convert_tokens_to_ids(tokens))
    input_mask = [1] * len(input_ids)
    pad = max_seq_length - len(input_ids)
    input_ids += [0] * pad
    input_mask += [0] * pad
    segment_ids += [0] * pad
    if example.label is None:
        label_id = 0.0 if label_list is None else 0
    elif label_list is None:
        label_id = float(example.label)
    else:
        label_id = list(label_list).index(example.label)
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids, "label_id": label_id}
