"""A checkpoint's vocabulary (``vocab.txt``) and the casing of the text fed to it: its tokens as
Google's and HF's readers see them, how many ids it defines and whether that fits a model, whether
it looks cased, and the one ``do_lower_case`` rule every path follows (:func:`lower_case_for`).
The tokenizers that use it are :mod:`bert_of.tokenization`'s.
"""

from __future__ import annotations

import collections
import hashlib
import os
from dataclasses import dataclass
from typing import List, Optional

from bert_of.errors import BertOfError, ConfigError
from bert_of.files.atomic import atomic_write
from bert_of.files.home import bert_of_home
from bert_of.files.reading import MAX_TEXT, read_bounded, read_json

__all__ = ["read_vocab_lines", "vocab_size", "check_vocab_fits", "load_vocab", "vocab_looks_cased",
           "recorded_lower_case", "lower_case_for", "TOKENIZER_JSON", "WordPieceJson", "read_tokenizer_json",
           "vocab_from_tokenizer_json"]

TOKENIZER_JSON = "tokenizer.json"  # the tokenizers library's file (transformers' *TokenizerFast)
MAX_TOKENIZER_JSON = 256 << 20  # multilingual BERTs' are ~2-10 MB
MAX_VOCAB = 10_000_000


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
    fine-tuned run's ``train_args.json``, a ``do_lower_case`` key in ``config.json``, or a BERT
    ``tokenizer.json``'s normalizer (transformers' fast tokenizer follows tokenizer_config.json's
    setting over it too); None when none does."""
    for name in ("tokenizer_config.json", "train_args.json", "config.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            d = read_json(path, name, error)
            value = d.get("do_lower_case")
            if name == "config.json" and value is None and isinstance(d.get("extra"), dict):
                value = d["extra"].get("do_lower_case")  # bert_of's config.json keeps a source's keys there
            if isinstance(value, bool):
                return value
    path = os.path.join(folder, TOKENIZER_JSON)
    if os.path.isfile(path):  # a fast tokenizer's own file: its normalizer's lowercase
        try:
            return read_tokenizer_json(path).lowercase
        except BertOfError:
            return None  # not BERT's WordPiece: it records nothing bert_of's tokenizer reads
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


# --------------------------------------------------------------------------- tokenizer.json


@dataclass(frozen=True)
class WordPieceJson:
    """What a BERT ``tokenizer.json`` (as transformers' BertTokenizerFast saves it) says: the
    WordPiece tokens in id order, whether it lower-cases (and strips accents with it, Google's rule),
    the longest word it splits."""

    tokens: tuple
    lowercase: bool
    max_input_chars_per_word: int


def _setting(d: dict, key: str, default, kinds, path: str, where: str):
    value = d.get(key, default)
    if value is not None and (isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds)):
        raise BertOfError(f"{path}: {where}.{key} is {str(value)[:40]!r}, not a {kinds[0].__name__}")
    return value


def read_tokenizer_json(path: str) -> WordPieceJson:
    """A BERT WordPiece ``tokenizer.json`` read as data (size-bounded JSON, every field checked):
    model WordPiece with the ``##`` prefix and ``[UNK]``, ids 0..V-1 each once, a BertNormalizer
    (lowercase, strip_accents following it or equal to it, clean_text and CJK handling on) and the
    BertPreTokenizer; added tokens must be vocabulary tokens (bert_of's tokenizer adds none). What
    bert_of's WordPiece would compute otherwise is refused in one line naming the file and field,
    never tokenized another way."""
    raw = read_bounded(path, MAX_TOKENIZER_JSON, TOKENIZER_JSON, BertOfError)
    d = read_json(path, TOKENIZER_JSON, BertOfError, raw=raw)  # huge integers, deep nesting: one line
    model = d.get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, dict) else None
        raise BertOfError(f"{path}: not a WordPiece tokenizer (model type {str(kind)[:40]!r}); bert_of reads BERT's")
    if model.get("continuing_subword_prefix", "##") != "##" or model.get("unk_token", "[UNK]") != "[UNK]":
        raise BertOfError(f"{path}: a WordPiece with prefix {str(model.get('continuing_subword_prefix'))[:20]!r} and "
                          f"unknown token {str(model.get('unk_token'))[:20]!r}; BERT's are '##' and '[UNK]'")
    chars = _setting(model, "max_input_chars_per_word", 100, (int,), path, "model")
    if chars is None or not 0 < chars <= 1 << 20:
        raise BertOfError(f"{path}: model.max_input_chars_per_word {chars!r} is not a positive word length")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise BertOfError(f"{path}: model.vocab is not a map of tokens to ids")
    if len(vocab) > MAX_VOCAB:
        raise BertOfError(f"{path}: {len(vocab)} tokens; more than {MAX_VOCAB} is not a vocabulary")
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(vocab) or tokens[i] is not None:
            raise BertOfError(f"{path}: model.vocab gives {token[:40]!r} the id {str(i)[:20]}; ids must be "
                              f"0..{len(vocab) - 1}, each once")
        if not token or token != token.strip() or any(c in token for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
            raise BertOfError(f"{path}: token {i} {token[:40]!r} is empty or holds a line break or surrounding "
                              f"space (not a WordPiece token)")
        tokens[i] = token
    norm = d.get("normalizer")
    if not isinstance(norm, dict) or norm.get("type") != "BertNormalizer":
        kind = norm.get("type") if isinstance(norm, dict) else norm
        raise BertOfError(f"{path}: normalizer {str(kind)[:40]!r}; bert_of's WordPiece computes BERT's "
                          f"(BertNormalizer)")
    lower = _setting(norm, "lowercase", True, (bool,), path, "normalizer")
    strip = _setting(norm, "strip_accents", None, (bool,), path, "normalizer")
    if strip is not None and strip != lower:
        raise BertOfError(f"{path}: normalizer.strip_accents {str(strip).lower()} with lowercase "
                          f"{str(lower).lower()}; bert_of strips accents exactly when it lower-cases (Google's rule)")
    for key in ("clean_text", "handle_chinese_chars"):
        if _setting(norm, key, True, (bool,), path, "normalizer") is not True:
            raise BertOfError(f"{path}: normalizer.{key} false; bert_of's WordPiece always does it (Google's rule)")
    pre = d.get("pre_tokenizer")
    if not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
        kind = pre.get("type") if isinstance(pre, dict) else pre
        raise BertOfError(f"{path}: pre_tokenizer {str(kind)[:40]!r}; bert_of splits words as BERT's "
                          f"(BertPreTokenizer)")
    added = d.get("added_tokens") or []
    if not isinstance(added, list):
        raise BertOfError(f"{path}: added_tokens is not a list")
    for a in added:
        content = a.get("content") if isinstance(a, dict) else None
        if not isinstance(content, str) or vocab.get(content) != a.get("id"):
            raise BertOfError(f"{path}: added token {str(content)[:40]!r} (id {str(a.get('id') if isinstance(a, dict) else None)[:20]}) "
                              f"is not the vocabulary's; bert_of's tokenizer has no added tokens")
    return WordPieceJson(tuple(tokens), lower, chars)


def vocab_from_tokenizer_json(path: str) -> tuple:
    """(a vocab.txt of ``path``'s tokens, its WordPieceJson): the tokens one per line, kept under
    ``$BERT_OF_HOME/vocab/`` by their hash (written once, atomically), so everything that reads a
    vocab.txt reads this one; never written beside the user's file."""
    spec = read_tokenizer_json(path)
    text = "\n".join(spec.tokens) + "\n"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    out = os.path.join(bert_of_home(), "vocab", f"{digest}.txt")
    if not os.path.isfile(out):
        try:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            atomic_write(out, text)
        except OSError as e:  # a read-only home: say where, not a traceback
            raise BertOfError(f"{out}: cannot keep the vocabulary of {path} there ({e.strerror or e}; "
                              f"set BERT_OF_HOME to a writable folder)") from None
    return out, spec
