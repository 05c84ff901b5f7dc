"""Your own data: CSV, TSV and JSON Lines files with named columns, for classification,
regression and multi-label problems, and CoNLL / JSON Lines files for token tagging.

Tables (``read_table``)
- The format follows the extension: ``.csv`` (comma), ``.tsv``/``.tab`` (tab), ``.jsonl``/``.ndjson``
  (one JSON object a line; ``.json`` holding one object a line is read the same way). CSV and TSV
  are read as Python's csv module reads them (``newline=""``: quoted fields may hold commas, tabs and
  newlines; ``""`` is a quote), UTF-8 with or without a BOM; the first row names the columns.
- Columns: ``text_column`` (default: the first of text, sentence, sentence1, premise, question,
  review, content), ``text_pair_column`` (default: the first of text_pair, sentence2, hypothesis,
  passage, when present), ``label_column`` (default: label, labels, target, or the only other
  column). A prediction file needs no label column.
- Labels: integers or strings are classes; real numbers (or ``problem="regression"``) are a
  regression target; ``problem="multi_label"`` reads a JSON list (JSON Lines) or a
  ``label_separator``-separated string (default :data:`LABEL_SEPARATOR`) of classes per row. Classes are ordered as
  transformers' run_glue orders them (sorted: numbers numerically, strings by code point) unless a
  model's ``id2label`` gives the order.

Tagging (``read_tagged``): CoNLL-2003 style (one token a line, the tag in the last column, blank
lines between sentences, ``-DOCSTART-`` lines skipped) or JSON Lines with ``tokens`` and ``tags``
lists. Entity-level scores (``entity_scores``) follow conlleval / seqeval's default definition:
IOB1, IOB2 (BIO), IOE and IOBES chunks, a chunk counts when its type and both ends match.

Every bad row is one :class:`EvalDataError` line naming the file, the row (line) and the column.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from bert_of.eval.errors import EvalDataError
from bert_of.eval.glue_data import _read_text, refuse_nul
from bert_of.files.reading import refuse_surrogates
from bert_of.eval.glue_metrics import accuracy, matthews_corrcoef, pearson, spearman

TEXT_COLUMNS = ("text", "sentence", "sentence1", "premise", "question", "review", "content")
PAIR_COLUMNS = ("text_pair", "sentence2", "hypothesis", "passage")
LABEL_COLUMNS = ("label", "labels", "target")
PROBLEMS = ("auto", "single_label", "regression", "multi_label")


@dataclass
class Row:
    line: int  # where the row starts in the file (1-based; the header is line 1 of a CSV)
    text: str
    text_pair: str | None = None
    label: object = None  # as read: str, int, float, list (multi-label), or None
    record: dict = field(default_factory=dict)  # every column of the row as read (written back beside predictions)


@dataclass
class Table:
    path: str
    rows: list
    text_column: str
    text_pair_column: str | None
    label_column: str | None
    columns: list = field(default_factory=list)
    kind: str = "csv"  # the format read: csv, tsv or jsonl


FORMATS = ("csv", "tsv", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


def file_kind(path: str, text: str | None = None, fmt: str | None = None) -> str:
    """``csv``, ``tsv`` or ``jsonl``: ``fmt`` when given (--format), else the extension, else (``-``,
    /dev/stdin, ``<(...)``, a name without one) the content: a first line opening a JSON object is
    JSON Lines, a header with tabs and no commas TSV, one with commas CSV."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise EvalDataError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
        return fmt
    ext = os.path.splitext(path)[1].lower() if path != "-" else ""
    kind = _EXTENSIONS.get(ext)
    if kind is not None:
        return kind
    first = next((ln for ln in io.StringIO(text or "", newline="") if ln.strip()), "")
    if first.lstrip().startswith("{"):
        return "jsonl"
    if "\t" in first and "," not in first:
        return "tsv"
    if "," in first:
        return "csv"
    if "\t" in first:
        return "tsv"
    raise EvalDataError(f"{path}: expected a .csv, .tsv or .jsonl file (found {ext or 'no extension'}, and the first "
                        "line is neither a JSON object nor a header of comma- or tab-separated names; name the "
                        "format with --format)")


def _json_lines(path: str, text: str):
    """(line number, parsed value) of every non-blank line of JSON Lines ``text`` (read from ``path``);
    a lone surrogate ("\\ud800") is refused naming its line."""
    for i, line in enumerate(io.StringIO(text, newline=""), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except RecursionError:
            raise EvalDataError(f"{path}: line {i}: JSON nested too deeply") from None
        except ValueError as e:  # not JSON, or an integer past Python's digit limit
            raise EvalDataError(f"{path}: line {i}: not JSON ({getattr(e, 'msg', str(e).split(';')[0])})") from None
        refuse_surrogates(value, line, f"{path}: line {i}", EvalDataError)
        yield i, value


def _records(path: str, fmt: str | None = None):
    """(line, {column: value}) of every non-blank record, the column names in file order, and the
    format read (:func:`file_kind`)."""
    text = _read_text(path)
    kind = file_kind(path, text, fmt)
    if kind == "jsonl":
        out, columns = [], {}
        for i, obj in _json_lines(path, text):
            if not isinstance(obj, dict):
                raise EvalDataError(f"{path}: line {i}: expected a JSON object, found {type(obj).__name__}")
            columns.update(dict.fromkeys(obj))
            out.append((i, obj))
        if not out:
            raise EvalDataError(f"{path}: no records")
        return out, list(columns), kind
    refuse_nul(path, text, kind.upper())
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="," if kind == "csv" else "\t")
    try:
        header = next(reader, None)
        start = reader.line_num + 1
        rows = []
        for row in reader:
            if row and any(c.strip() for c in row):
                if len(row) != len(header):
                    raise EvalDataError(f"{path}: line {start}: {len(row)} fields, the header has {len(header)}")
                rows.append((start, dict(zip(header, row))))
            start = reader.line_num + 1
    except csv.Error as e:
        raise EvalDataError(f"{path}: line {reader.line_num}: not readable as {kind.upper()} ({e})") from None
    if not header or not any(h.strip() for h in header):
        raise EvalDataError(f"{path}: no header row (the first row names the columns)")
    seen = set()
    for h in header:  # one pass (header.count per name was quadratic in the columns)
        if h in seen:
            raise EvalDataError(f"{path}: column {h[:80]!r} appears twice in the header")
        seen.add(h)
    if not rows:
        raise EvalDataError(f"{path}: no rows after the header")
    return rows, header, kind


def free_name(name: str, taken) -> str:
    """``name``, or when the input already has a column (key) of that name, ``name.1``, ``name.2``, ...
    the first that is free: predictions are written beside every column of the input, never over one."""
    if name not in taken:
        return name
    k = 1
    while f"{name}.{k}" in taken:
        k += 1
    return f"{name}.{k}"


def prediction_names(wanted: list, columns) -> dict:
    """{wanted name: the name written} for prediction columns ``wanted`` beside the input's ``columns``
    (:func:`free_name`, in order; a renamed one is the caller's to say)."""
    taken, out = set(columns), {}
    for w in wanted:
        out[w] = free_name(w, taken)
        taken.add(out[w])
    return out


def cell(value) -> str:
    """A value as a CSV cell: text as it is, nothing for a missing one, numbers and lists as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _shown_columns(columns) -> str:
    """The column names for a message: all of a table's few, the first ones of a wide one."""
    return ", ".join(columns) if len(columns) <= 20 else ", ".join(columns[:20]) + f", ... ({len(columns)} columns)"


def _pick(path, columns, given, defaults, what, required=True):
    names = set(columns)
    if given is not None:
        if given not in names:
            raise EvalDataError(f"{path}: no column {given!r} ({what}; the columns are {_shown_columns(columns)})")
        return given
    found = next((c for c in defaults if c in names), None)
    if found is None and required:
        raise EvalDataError(f"{path}: no {what} column: name it with --{what.replace(' ', '-')}-column "
                            f"(the columns are {_shown_columns(columns)}; looked for {', '.join(defaults[:20])})")
    return found


LABEL_SEPARATOR = "|"  # multi-label CSV/TSV cells: "sports|politics"


def read_table(path: str, text_column: str | None = None, text_pair_column: str | None = None,
               label_column: str | None = None, need_labels: bool = True, problem: str = "auto",
               label_separator: str | None = None, fmt: str | None = None) -> Table:
    """The rows of a user's CSV/TSV/JSON Lines file (see the module docstring); ``fmt``: its format
    when neither its name nor its content says (--format)."""
    label_separator = LABEL_SEPARATOR if label_separator is None else label_separator
    if problem not in PROBLEMS:
        raise EvalDataError(f"problem {problem!r}: expected one of {', '.join(PROBLEMS)}")
    records, columns, kind = _records(path, fmt)
    text_c = _pick(path, columns, text_column, TEXT_COLUMNS, "text")
    pair_c = _pick(path, columns, text_pair_column, [c for c in PAIR_COLUMNS if c != text_c], "text pair",
                   required=False)
    others = [c for c in columns if c not in (text_c, pair_c)]
    label_defaults = list(LABEL_COLUMNS) + (others if len(others) == 1 else [])
    label_c = _pick(path, columns, label_column, label_defaults, "label", required=need_labels)
    rows = []
    for line, rec in records:
        text = rec.get(text_c)
        if not isinstance(text, str) or not text.strip():
            raise EvalDataError(f"{path}: line {line}: column {text_c!r}: "
                                + ("missing" if text is None else "empty" if isinstance(text, str)
                                   else f"expected text, found {type(text).__name__}"))
        pair = rec.get(pair_c) if pair_c else None
        if pair_c and not isinstance(pair, str):
            raise EvalDataError(f"{path}: line {line}: column {pair_c!r}: "
                                + ("missing" if pair is None else f"expected text, found {type(pair).__name__}"))
        label = rec.get(label_c) if label_c else None
        if label_c and need_labels:
            label = _parse_label(path, line, label_c, label, problem, label_separator)
        rows.append(Row(line, text, pair, label, rec))
    return Table(path, rows, text_c, pair_c, label_c, columns, kind)


def _parse_label(path, line, column, value, problem, sep):
    where = f"{path}: line {line}: column {column!r}"
    if value is None or (isinstance(value, str) and not value.strip()):
        raise EvalDataError(f"{where}: no label")
    if problem == "multi_label":
        if isinstance(value, list):
            items = value
        elif isinstance(value, str):
            items = [v.strip() for v in value.split(sep) if v.strip()]
        else:
            items = [value]
        if any(not isinstance(v, (str, int)) or isinstance(v, bool) for v in items):
            raise EvalDataError(f"{where}: multi-label classes must be strings or integers, found {value!r}")
        return [str(v) for v in items]
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise EvalDataError(f"{where}: expected a label, found {json.dumps(value)[:60]}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise EvalDataError(f"{where}: label {value} is not a finite number")
        return value
    s = value.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        if problem == "regression":
            raise EvalDataError(f"{where}: {s!r} is not a number (a regression target)") from None
        return s
    if not math.isfinite(f):
        raise EvalDataError(f"{where}: label {s!r} is not a finite number")
    return f


def problem_of(table: Table, problem: str = "auto") -> str:
    """``single_label``, ``regression`` or ``multi_label``: as asked, else what the labels are
    (real numbers that are not all whole: regression)."""
    if problem != "auto":
        if problem == "single_label":
            bad = next((r for r in table.rows if isinstance(r.label, float) and not r.label.is_integer()), None)
            if bad:
                raise EvalDataError(f"{table.path}: line {bad.line}: label {bad.label} is not a class")
        return problem
    labels = [r.label for r in table.rows]
    if any(isinstance(v, float) and not v.is_integer() for v in labels) and \
            all(isinstance(v, (int, float)) for v in labels):
        return "regression"
    bad = next((r for r in table.rows if isinstance(r.label, float) and not r.label.is_integer()), None)
    if bad:
        raise EvalDataError(f"{table.path}: line {bad.line}: label {bad.label} is a number among class names "
                            "(use --problem regression for a numeric target)")
    return "single_label"


def class_key(v) -> str:
    """A class's name as it travels (config id2label, predictions): 3.0 and 3 are class "3"."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return str(v)


def label_list(table: Table, problem: str) -> list:
    """The classes in transformers' run_glue order (sorted; numbers numerically)."""
    if problem == "regression":
        return []
    seen = {}
    for r in table.rows:
        for v in (r.label if problem == "multi_label" else [r.label]):
            seen[class_key(v)] = v
    keys = list(seen)
    if all(_is_int(k) for k in keys):
        return sorted(keys, key=int)
    return sorted(keys)


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def encode_labels(table: Table, problem: str, labels: list) -> np.ndarray:
    """Class ids [n] (single label), targets [n] float32 (regression), or multi-hot [n, k] float32."""
    index = {k: i for i, k in enumerate(labels)}
    if problem == "regression":
        return np.array([float(r.label) for r in table.rows], dtype=np.float32)
    if problem == "multi_label":
        out = np.zeros((len(table.rows), len(labels)), dtype=np.float32)
    else:
        out = np.zeros(len(table.rows), dtype=np.int64)
    for i, r in enumerate(table.rows):
        for v in (r.label if problem == "multi_label" else [r.label]):
            k = class_key(v)
            if k not in index:
                raise EvalDataError(f"{table.path}: line {r.line}: column {table.label_column!r}: label {k!r} is "
                                    f"not one of the model's classes ({', '.join(labels)})")
            if problem == "multi_label":
                out[i, index[k]] = 1.0
            else:
                out[i] = index[k]
    return out


# --------------------------------------------------------------------------- metrics


def f1_per_class(t, p, k: int) -> np.ndarray:
    """F1 of each class 0..k-1 (0 where a class has no true and no predicted member: sklearn's value)."""
    out = np.zeros(k)
    for c in range(k):
        tp = np.sum((t == c) & (p == c))
        denom = np.sum(t == c) + np.sum(p == c)
        out[c] = 2.0 * tp / denom if denom else 0.0
    return out


def classification_metrics(y_true, y_pred, num_labels: int) -> dict:
    """accuracy, macro-F1 (the unweighted mean of the classes' F1), Matthews correlation."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    present = sorted(set(t.tolist()) | set(p.tolist()))  # sklearn averages over the labels that occur
    f1 = f1_per_class(t, p, num_labels)
    return {"accuracy": accuracy(t, p), "macro_f1": float(np.mean(f1[present])) if present else 0.0,
            "mcc": matthews_corrcoef(t, p)}


def regression_metrics(y_true, y_pred) -> dict:
    t, p = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    return {"pearson": pearson(t, p), "spearman": spearman(t, p), "mse": float(np.mean((t - p) ** 2))}


def multi_label_metrics(y_true, y_pred) -> dict:
    """Rows of 0/1 per class: micro-F1 (counts pooled), macro-F1 (over classes), subset accuracy."""
    t, p = np.asarray(y_true) > 0.5, np.asarray(y_pred) > 0.5
    tp, fp, fn = (t & p).sum(0), (~t & p).sum(0), (t & ~p).sum(0)
    denom = 2 * tp + fp + fn
    per = np.where(denom > 0, 2.0 * tp / np.maximum(denom, 1), 0.0)
    micro = 2.0 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()) if (2 * tp.sum() + fp.sum() + fn.sum()) else 0.0
    return {"micro_f1": float(micro), "macro_f1": float(per.mean()) if per.size else 0.0,
            "subset_accuracy": float(np.mean(np.all(t == p, axis=1)))}


# --------------------------------------------------------------------------- tagging


@dataclass
class Sentence:
    line: int
    tokens: list
    tags: list | None
    fields: list | None = None  # CoNLL: each token's line split in columns (written back beside predictions)
    record: dict | None = None  # JSON Lines: the object as read


_TAG = re.compile(r"O|[BIESLU]-\S+|[BIESLU]")  # IOB1/IOB2/IOE/IOBES/BILOU tags


def _docstart(parts: list) -> bool:
    return bool(parts) and parts[0] == "-DOCSTART-"  # bare, or with CoNLL-2003's "-X- -X- O" columns


def tagged_layout(text: str, path: str = "") -> str:
    """"conll" (a word a line, its columns after it; blank lines, however many, between sentences;
    ``-DOCSTART-`` lines skipped; tabs or spaces; any line end) or "text" (a sentence a line), by
    the file's structure. CoNLL: every line one column (words, no tags), or every line a token and
    a tag (``TOKEN ... TAG``, the tag last). Text: no line ending in a tag, no ``-DOCSTART-``.
    Anything between is neither clearly: :class:`EvalDataError` naming the first line that does
    not fit what most lines are."""
    lines, docstart = [], False
    for i, line in enumerate(io.StringIO(text, newline=""), 1):
        parts = line.split()
        if _docstart(parts):
            docstart = True
        elif parts:
            lines.append((i, parts))
    single = sum(len(p) == 1 for _, p in lines)
    tagged = sum(len(p) > 1 and bool(_TAG.fullmatch(p[-1])) for _, p in lines)
    if single == len(lines) or tagged == len(lines):
        return "conll"
    if tagged == 0 and not docstart:
        return "text"
    if tagged * 2 >= len(lines) or docstart:  # mostly CoNLL: the first line that is not "TOKEN ... TAG"
        i, parts = next((i, p) for i, p in lines if not (len(p) > 1 and _TAG.fullmatch(p[-1])))
        why = f"{' '.join(parts)[:60]!r} is not 'TOKEN ... TAG'"
    else:  # mostly text: the first line that reads as a token and its tag
        i, parts = next((i, p) for i, p in lines if len(p) > 1 and _TAG.fullmatch(p[-1]))
        why = f"{' '.join(parts)[:60]!r} reads as a token and a tag among lines of plain text"
    raise EvalDataError(f"{path}: line {i}: {why}; the file is neither clearly CoNLL ({tagged} of {len(lines)} lines "
                        f"are 'TOKEN ... TAG'{', -DOCSTART- lines' if docstart else ''}) nor clearly plain text (a "
                        "sentence a line); fix that line or give JSON Lines")


def read_tagged(path: str, need_tags: bool = True) -> list:
    """Sentences of a CoNLL-style file (token first, tag last, whitespace-separated), a JSON Lines
    file of {"tokens": [...], "tags": [...]} (``ner_tags`` also read), or, without tags (to
    predict), plain text: a sentence a line (:func:`tagged_layout` tells it from CoNLL and refuses
    a file that is neither clearly). ``path`` may be ``-`` or a pipe: JSON Lines is told by its
    content then."""
    text = _read_text(path)
    ext = os.path.splitext(path)[1].lower() if path != "-" else ""
    out = []
    first = next((ln for ln in io.StringIO(text, newline="") if ln.strip()), "")
    if ext in (".jsonl", ".ndjson", ".json") or (not ext and first.lstrip().startswith("{")):
        for i, obj in _json_lines(path, text):
            tokens = obj.get("tokens") if isinstance(obj, dict) else None
            tags = (obj.get("tags", obj.get("ner_tags")) if isinstance(obj, dict) else None)
            if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
                raise EvalDataError(f"{path}: line {i}: column 'tokens': expected a non-empty list of strings")
            if need_tags:
                if not isinstance(tags, list) or not all(isinstance(t, (str, int)) for t in tags):
                    raise EvalDataError(f"{path}: line {i}: column 'tags': expected a list of tags")
                if len(tags) != len(tokens):
                    raise EvalDataError(f"{path}: line {i}: {len(tokens)} tokens but {len(tags)} tags")
                tags = [str(t) for t in tags]
            out.append(Sentence(i, tokens, tags if need_tags else None, record=obj))
        if not out:
            raise EvalDataError(f"{path}: no sentences")
        return out
    refuse_nul(path, text, "CoNLL or text")
    layout = tagged_layout(text, path)
    if layout == "text":
        if need_tags:
            raise EvalDataError(f"{path}: reads as plain text (a sentence a line, no tag column); tagged data "
                                "is CoNLL (a word a line: 'TOKEN ... TAG', a blank line between sentences) or "
                                "JSON Lines")
        for i, line in enumerate(io.StringIO(text, newline=""), 1):
            if line.split():
                out.append(Sentence(i, line.split(), None))
    else:
        start, tokens, tags, fields = None, [], [], []
        for i, line in enumerate(io.StringIO(text, newline=""), 1):
            parts = line.split()
            if not parts or _docstart(parts):
                if tokens:
                    out.append(Sentence(start, tokens, tags if need_tags else None, fields))
                start, tokens, tags, fields = None, [], [], []
                continue
            if need_tags and len(parts) < 2:
                raise EvalDataError(f"{path}: line {i}: a token without a tag (expected 'TOKEN ... TAG')")
            start = start or i
            tokens.append(parts[0])
            tags.append(parts[-1] if len(parts) > 1 else None)
            fields.append(parts)
        if tokens:
            out.append(Sentence(start, tokens, tags if need_tags else None, fields))
    if not out:
        raise EvalDataError(f"{path}: no sentences")
    return out


def tag_list(sentences: list) -> list:
    """The tags in a stable order: O first, then by entity type, B before I (as datasets list them)."""
    tags = {t for s in sentences for t in s.tags}
    return sorted(tags, key=lambda t: (t != "O", t[2:] if t[1:2] == "-" else t, t[:1]))


def chunks(tags: list) -> set:
    """{(type, start, end)} of a tag sequence, conlleval's chunk rules (IOB1/IOB2/IOE/IOBES)."""
    out, start, kind = set(), None, None
    prev_tag, prev_type = "O", ""
    for i, t in enumerate(list(tags) + ["O"]):
        tag, typ = (t.split("-", 1) + [""])[:2] if t != "O" else ("O", "")
        if _chunk_end(prev_tag, tag, prev_type, typ) and start is not None:
            out.add((kind, start, i - 1))
            start = None
        if _chunk_start(prev_tag, tag, prev_type, typ):
            start, kind = i, typ
        prev_tag, prev_type = tag, typ
    return out


def _chunk_end(prev, tag, prev_type, typ) -> bool:
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I"):
        return tag in ("B", "S", "O") or (tag in ("I", "E") and prev_type != typ)
    return False


def _chunk_start(prev, tag, prev_type, typ) -> bool:
    if tag in ("B", "S"):
        return True
    if tag in ("I", "E"):
        return prev in ("E", "S", "O") or prev_type != typ
    return False


def entity_scores(true_seqs: list, pred_seqs: list) -> dict:
    """Entity-level precision, recall and F1 (micro over all chunks, as seqeval's default and
    conlleval report them), plus token accuracy."""
    tp = n_pred = n_true = 0
    correct = total = 0
    for t, p in zip(true_seqs, pred_seqs):
        ct, cp = chunks(t), chunks(p)
        tp += len(ct & cp)
        n_pred += len(cp)
        n_true += len(ct)
        correct += sum(a == b for a, b in zip(t, p))
        total += len(t)
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_true if n_true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": correct / total if total else 0.0}


__all__ = ["Row", "Table", "read_table", "free_name", "prediction_names", "cell", "problem_of", "label_list", "encode_labels", "class_key",
           "classification_metrics", "regression_metrics", "multi_label_metrics", "Sentence", "read_tagged",
           "tag_list", "chunks", "entity_scores"]
