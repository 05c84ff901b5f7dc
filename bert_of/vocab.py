"""A checkpoint's vocabulary (``vocab.txt``) and the casing of the text fed to it: its tokens as
Google's and HF's readers see them, how many ids it defines and whether that fits a model, whether
it looks cased, and the one ``do_lower_case`` rule every path follows (:func:`lower_case_for`).
The tokenizers that use it are :mod:`bert_of.tokenization`'s.
"""

from __future__ import annotations

import collections
import os
from typing import List, Optional

from bert_of.errors import BertOfError, ConfigError
from bert_of.files.reading import MAX_TEXT, read_bounded, read_json

__all__ = ["read_vocab_lines", "vocab_size", "check_vocab_fits", "load_vocab", "vocab_looks_cased",
           "recorded_lower_case", "lower_case_for"]


def read_vocab_lines(vocab_file: str) -> List[str]:
    """The tokens of ``vocab.txt``, one per line, the way Google's and HF's readers see them: line
    ends ``\\n``, ``\\r\\n`` or ``\\r``; each token stripped of surrounding whitespace (Google strips).
    What they would turn into junk is dropped: a UTF-8 BOM (it would glue onto the first token)
    and blank lines at the end (they would add an empty token past the real ones). A blank line
    inside keeps its id, as in both readers. Errors are one line naming the file."""
    raw = read_bounded(vocab_file, MAX_TEXT, "vocabulary", BertOfError)  # a regular file, its size first
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BertOfError(f"{vocab_file}: vocabulary is not UTF-8 text (byte {e.start})") from None
    lines = [ln.strip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise BertOfError(f"{vocab_file}: empty vocabulary")
    return lines


def vocab_size(vocab_file: str) -> int:
    """How many ids ``vocab.txt`` defines (see :func:`read_vocab_lines`; a trailing newline or blank
    line adds none): the number a model's ``vocab_size`` must cover."""
    return len(read_vocab_lines(vocab_file))


def check_vocab_fits(vocab_file: str, model_vocab_size: int, pad: int = 1) -> None:
    """A vocabulary attached to a model must define exactly the ids of its embedding table: more
    would look up rows that do not exist, fewer means it belongs to another model, unless the
    model's maker pads its vocabulary to a multiple of ``pad`` (NVIDIA: 8) and these are those rows."""
    n = vocab_size(vocab_file)
    if n != model_vocab_size and not (n < model_vocab_size == -(-n // pad) * pad):
        raise ConfigError(f"{vocab_file} has {n} tokens but the model's vocab_size is {model_vocab_size}: "
                          "not this model's vocabulary")


def load_vocab(vocab_file: str) -> "collections.OrderedDict[str, int]":
    """token -> id, the id being the line number (0-based); see :func:`read_vocab_lines`."""
    vocab = collections.OrderedDict()
    for index, token in enumerate(read_vocab_lines(vocab_file)):
        vocab[token] = index
    return vocab


def vocab_looks_cased(vocab) -> bool:
    """A cased vocabulary (Google's cased models) holds capitalised whole words; an uncased one none."""
    caps = sum(1 for t in vocab if t[:1].isupper() and not t.startswith("["))
    return caps >= max(10, len(vocab) // 50)


def recorded_lower_case(folder: str, error: type = BertOfError) -> Optional[bool]:
    """``do_lower_case`` as a checkpoint folder records it: HF's ``tokenizer_config.json``, a
    fine-tuned run's ``train_args.json``, or a ``do_lower_case`` key in ``config.json``; None when
    none does."""
    for name in ("tokenizer_config.json", "train_args.json", "config.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            d = read_json(path, name, error)
            value = d.get("do_lower_case")
            if name == "config.json" and value is None and isinstance(d.get("extra"), dict):
                value = d["extra"].get("do_lower_case")  # bert_of's config.json keeps a source's keys there
            if isinstance(value, bool):
                return value
    return None


def lower_case_for(folder: str, vocab_file: Optional[str] = None, given: Optional[bool] = None,
                   error: type = BertOfError, sources=()) -> tuple:
    """(do_lower_case, where it comes from) for text fed to the checkpoint in ``folder``: the one rule
    every path follows (``BertTokenizer.from_pretrained``, finetune, predict, eval, convert):
    ``given`` (an explicit flag or argument) wins ("given"); else what the folder records
    (:func:`recorded_lower_case`: "checkpoint"), or, for a converted copy, the folder it was
    converted from (``sources``: an HF folder's tokenizer_config.json); else what ``vocab_file``
    looks like ("vocabulary"); else True ("default")."""
    if given is not None:
        return bool(given), "given"
    for where in (folder, *sources):
        where = where if os.path.isdir(where) else os.path.dirname(where)  # a TF prefix: its folder
        recorded = recorded_lower_case(where, error) if where else None
        if recorded is not None:
            return recorded, "checkpoint"
    if vocab_file and os.path.isfile(vocab_file):
        return not vocab_looks_cased(read_vocab_lines(vocab_file)), "vocabulary"
    return True, "default"
