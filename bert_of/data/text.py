"""Text files -> a tokenized corpus, by the document rules of Google's ``create_pretraining_data.py``.

* One sentence per line; lines end at ``b"\\n"`` only (TensorFlow's GFile), are UTF-8, and are
  ``str.strip()``-ed. A blank line ends the current document; a line whose tokens are empty is
  skipped (it does not end a document); documents without sentences are dropped. A file
  boundary is not a document boundary (Google's reader keeps appending to the last document).
* A line longer than ``max_line_chars`` characters is refused, naming the file and line: such
  "sentences" are not text, and the file is read in blocks so even a 50 MB line costs at most
  ~4x the limit in memory before it is refused.

The corpus is flat NumPy, ~4 bytes per token and 8 per sentence::

    ids            int32 [tokens]         every sentence's token ids back to back, document order
    sentence_ends  int64 [sentences + 1]  sentence k is ids[sentence_ends[k]:sentence_ends[k + 1]]
    document_ends  int64 [documents + 1]  document d is sentences document_ends[d] .. document_ends[d + 1] - 1
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from bert_of.errors import BertOfError

MAX_LINE_CHARS = 1_000_000
_BLOCK = 1 << 22  # bytes read at a time


class DataError(BertOfError):
    """Input text, vocabulary, config or output directory problems for data creation."""


@dataclass
class Corpus:
    ids: np.ndarray
    sentence_ends: np.ndarray
    document_ends: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.document_ends) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_ends) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    def documents(self) -> List[List[List[int]]]:
        """As Google holds them: documents of sentences of token ids (for tests and small data)."""
        s, d = self.sentence_ends.tolist(), self.document_ends.tolist()
        ids = self.ids.tolist()
        return [[ids[s[k]:s[k + 1]] for k in range(d[i], d[i + 1])] for i in range(self.num_documents)]


def iter_line_blocks(path: str, max_line_chars: int = MAX_LINE_CHARS,
                     on_bytes: Optional[Callable[[int], None]] = None) -> Iterator[Tuple[int, List[str]]]:
    """(number of the first line, lines) for consecutive blocks of a text file.

    Lines are split at ``b"\\n"`` only and decoded as UTF-8, without their ``"\\n"``. Invalid
    UTF-8 and lines over ``max_line_chars`` characters (0: no limit) raise :class:`DataError`
    naming the file and line.
    """
    limit = max_line_chars if max_line_chars and max_line_chars > 0 else None
    pending: List[bytes] = []  # the start of a line that has not ended yet
    pending_len = 0
    first = 1
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: input file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a text file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        while True:
            block = f.read(_BLOCK)
            if on_bytes is not None and block:
                on_bytes(len(block))
            if not block:
                break
            cut = block.rfind(b"\n")
            if cut < 0:
                pending.append(block)
                pending_len += len(block)
                if limit is not None and pending_len > 4 * limit:  # UTF-8: >= 1 char per 4 bytes
                    raise _too_long(path, first, limit)
                continue
            data = b"".join(pending) + block[:cut + 1] if pending else block[:cut + 1]
            rest = block[cut + 1:]
            pending, pending_len = ([rest], len(rest)) if rest else ([], 0)
            lines = _decode(path, first, data).split("\n")
            lines.pop()  # data ends with "\n"
            _check_lengths(path, first, lines, limit)
            yield first, lines
            first += len(lines)
    if pending:
        lines = [_decode(path, first, b"".join(pending))]
        _check_lengths(path, first, lines, limit)
        yield first, lines


def _decode(path: str, first: int, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        lineno = first + data.count(b"\n", 0, e.start)
        raise DataError(f"{path}: line {lineno} is not valid UTF-8 (byte {e.start - line_start})") from None


def _too_long(path: str, lineno: int, limit: int) -> DataError:
    return DataError(f"{path}: line {lineno} is longer than {limit:,} characters: expected one sentence per "
                     f"line (raise --max-line-chars to accept it)")


def _check_lengths(path: str, first: int, lines: List[str], limit: Optional[int]) -> None:
    if limit is not None and max(map(len, lines), default=0) > limit:
        k = next(i for i, line in enumerate(lines) if len(line) > limit)
        raise _too_long(path, first + k, limit)


class CorpusBuilder:
    """Accumulates tokenized lines into a :class:`Corpus` with Google's document rules."""

    def __init__(self, encode: Callable[[str], List[int]]):
        self.encode = encode  # line -> token ids
        self._ids = array("i")
        self._sentence_ends = array("q", [0])
        self._document_ends = array("q", [0])

    def add_lines(self, lines: Sequence[str]) -> None:
        ids, ends, docs, encode = self._ids, self._sentence_ends, self._document_ends, self.encode
        for line in lines:
            line = line.strip()
            if not line:  # a blank line ends the document (an empty one is dropped)
                if len(ends) - 1 > docs[-1]:
                    docs.append(len(ends) - 1)
                continue
            tokens = encode(line)
            if tokens:
                ids.extend(tokens)
                ends.append(len(ids))

    def add_file(self, path: str, max_line_chars: int = MAX_LINE_CHARS,
                 on_bytes: Optional[Callable[[int], None]] = None) -> None:
        for _, lines in iter_line_blocks(path, max_line_chars, on_bytes):
            self.add_lines(lines)

    def build(self) -> Corpus:
        docs = self._document_ends
        if len(self._sentence_ends) - 1 > docs[-1]:
            docs.append(len(self._sentence_ends) - 1)
        return Corpus(np.frombuffer(self._ids, dtype=np.int32) if self._ids else np.zeros(0, np.int32),
                      np.frombuffer(self._sentence_ends, dtype=np.int64).copy(),
                      np.frombuffer(docs, dtype=np.int64).copy())


def read_corpus(paths: Sequence[str], encode: Callable[[str], List[int]], max_line_chars: int = MAX_LINE_CHARS,
                on_bytes: Optional[Callable[[int], None]] = None) -> Corpus:
    """One corpus from text files read in order (documents may continue across files, as Google's)."""
    builder = CorpusBuilder(encode)
    for path in paths:
        builder.add_file(path, max_line_chars, on_bytes)
    return builder.build()
