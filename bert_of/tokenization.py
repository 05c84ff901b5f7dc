"""BERT's WordPiece tokenizer, in pure Python (no OneFlow, no NumPy).

Implements the algorithm of google-research/bert ``tokenization.py``:

1. **clean**: drop NUL, U+FFFD and control characters (Unicode Cc/Cf except
   tab/newline/CR); every whitespace character (space, tab, newline, CR, Zs)
   becomes a space;
2. **CJK**: every CJK Unified Ideograph (and its extensions/compatibility
   blocks) becomes its own token;
3. split on whitespace; when lowercasing, ``str.lower()`` then strip accents
   (NFD, drop combining marks, category Mn);
4. **punctuation** is split off as single-character tokens: Unicode P*
   categories plus the ASCII symbol ranges 33-47, 58-64, 91-96, 123-126
   (so ``$ + < = > ^ ` | ~`` count as punctuation);
5. **WordPiece**: greedy longest-match-first against the vocabulary, pieces
   after the first prefixed ``##``; a word with no full segmentation, or
   longer than ``max_input_chars_per_word`` characters (Google: 200), is
   ``[UNK]``.

One addition, as HuggingFace's ``BertTokenizer`` does: special tokens written
literally in the text (``[CLS]``, ``[SEP]``, ``[MASK]``, ``[PAD]``, ``[UNK]``)
stay whole instead of being split into ``[``, ``cl``, ``##s``, ``]``
(``keep_special_tokens=False`` restores Google's behaviour). HuggingFace's
slow tokenizer cuts words at 100 characters; pass
``max_input_chars_per_word=100`` for id-for-id parity on such words.

:class:`FastTokenizer` gives :class:`FullTokenizer`'s exact output for bulk text (pretraining
data) about 20x faster, in C string operations plus a per-word cache; the classes above stay
the reference it is tested against. (HuggingFace ``tokenizers``' BERT pipeline is not used: it
disagrees with Google's rules on ~138,000 code points, private-use characters and punctuation
added after its Unicode tables among them, and measured slower than ``FastTokenizer``.)
"""

from __future__ import annotations

import unicodedata
from typing import Iterable, List, Optional

from bert_of.vocab import load_vocab

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


# --------------------------------------------------------------------------- character classes


def _is_whitespace(ch: str) -> bool:
    if ch in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    if ch in ("\t", "\n", "\r"):  # whitespace, not control
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # ASCII non-letters/digits count as punctuation even where Unicode says
    # "symbol" (S*): "^", "$", "`" ... are split off consistently.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def _is_cjk(cp: int) -> bool:
    """CJK Unified Ideographs: Chinese characters and Japanese kanji/Korean hanja.
    Hangul and kana are not in these blocks and are tokenized like Latin text."""
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def _is_mark(ch: str) -> bool:
    """An accent lower-casing strips: a nonspacing mark (Mn), judged after NFD."""
    return unicodedata.category(ch) == "Mn"


def _clean_char(ch: str) -> Optional[str]:
    """Steps 1-2 for one character: None (dropped), " " (whitespace), " ch " (a CJK ideograph: a
    token of its own), else ``ch``."""
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD or _is_control(ch):
        return None
    if _is_whitespace(ch):
        return " "
    return f" {ch} " if _is_cjk(cp) else ch


# --------------------------------------------------------------------------- basic tokenizer
#
# The one place of Google's BasicTokenizer rules: the per-character rules above, applied in the
# order below. :class:`FastTokenizer` applies the same rules through translate tables made from
# them; :meth:`BasicTokenizer.words_with_offsets` (transformers' offset mapping) keeps each
# character's offset through the same steps.


def _whitespace_split(text: str) -> List[str]:
    return text.split()


def _strip_accents(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if not _is_mark(ch))


class BasicTokenizer:
    """Cleaning, CJK splitting, lowercasing + accent stripping, punctuation split."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> List[str]:
        out = []
        for token in _whitespace_split(self._clean(text)):
            if self.do_lower_case:
                token = _strip_accents(token.lower())
            out.extend(self._split_punctuation(token))
        return _whitespace_split(" ".join(out))

    @staticmethod
    def _clean(text: str) -> str:
        """Steps 1-2: cleaned, CJK ideographs spaced apart."""
        return "".join(r for r in map(_clean_char, text) if r is not None)

    def words_with_offsets(self, text: str) -> list:
        """:meth:`tokenize`'s words of ``text``, each as (word, [offset in ``text`` of each of its
        characters]): the same steps, tracking positions."""
        chars = [(c, i) for i, r in enumerate(map(_clean_char, text)) if r is not None for c in r]
        words, cur = [], []
        for ch, o in chars + [(" ", len(text))]:  # whitespace split (str.split()'s whitespace)
            if not ch.isspace():
                cur.append((ch, o))
            elif cur:
                words.append(cur)
                cur = []
        out = []
        for word in words:
            if self.do_lower_case:
                word = _lower_strip(word)
            piece = []
            for ch, o in word + [(None, None)]:  # punctuation apart
                if ch is None or _is_punctuation(ch):
                    if piece:
                        out.append(("".join(c for c, _ in piece), [o for _, o in piece]))
                    if ch is not None:
                        out.append((ch, [o]))
                    piece = []
                else:
                    piece.append((ch, o))
        return out

    @staticmethod
    def _split_punctuation(text: str) -> List[str]:
        pieces, current = [], []
        for ch in text:
            if _is_punctuation(ch):
                if current:
                    pieces.append("".join(current))
                    current = []
                pieces.append(ch)
            else:
                current.append(ch)
        if current:
            pieces.append("".join(current))
        return pieces


def _lower_strip(word: list) -> list:
    """``str.lower()`` of the word [(character, offset)] (final sigma included), then NFD with
    accents dropped, per character so each output character keeps its origin."""
    whole = "".join(c for c, _ in word).lower()
    lowered = [c.lower() for c, _ in word]
    if sum(map(len, lowered)) == len(whole):  # always, bar exotic casings: take the word's own letters
        k, per = 0, []
        for c in lowered:
            per.append(whole[k:k + len(c)])
            k += len(c)
        lowered = per
    return [(ch, o) for piece, (_, o) in zip(lowered, word) for ch in unicodedata.normalize("NFD", piece)
            if not _is_mark(ch)]


class WordpieceTokenizer:
    """Greedy longest-match-first segmentation of one word into vocabulary pieces."""

    def __init__(self, vocab, unk_token: str = "[UNK]", max_input_chars_per_word: int = 200):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text: str) -> List[str]:
        out = []
        for word in _whitespace_split(text):
            if len(word) > self.max_input_chars_per_word:
                out.append(self.unk_token)
                continue
            pieces, start = [], 0
            while start < len(word):
                end, piece = len(word), None
                while start < end:
                    candidate = word[start:end]
                    if start > 0:
                        candidate = "##" + candidate
                    if candidate in self.vocab:
                        piece = candidate
                        break
                    end -= 1
                if piece is None:  # no full segmentation: the whole word is unknown
                    pieces = [self.unk_token]
                    break
                pieces.append(piece)
                start = end
            out.extend(pieces)
        return out


# --------------------------------------------------------------------------- full tokenizer


class FullTokenizer:
    """Basic tokenization, then WordPiece; ids from ``vocab.txt`` line numbers.

    >>> tok = FullTokenizer("vocab.txt")                     # uncased
    >>> tok.tokenize("Unaffable!")                           # ['una', '##ffa', '##ble', '!']
    >>> tok.encode("How old are you?", "I am 6.")            # input_ids, token_type_ids, attention_mask
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True, max_input_chars_per_word: int = 200,
                 keep_special_tokens: bool = True):
        self.vocab = load_vocab(vocab_file)
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic = BasicTokenizer(do_lower_case=do_lower_case)
        self.unk_token = "[UNK]"
        self.wordpiece = WordpieceTokenizer(self.vocab, self.unk_token, max_input_chars_per_word)
        self.special_tokens = tuple(t for t in SPECIAL_TOKENS if t in self.vocab) if keep_special_tokens else ()

    # ---------------------------------------------------------------- text -> tokens
    def tokenize(self, text: str) -> List[str]:
        out = []
        for piece, special in self._split_special(text):
            if special:
                out.append(piece)
                continue
            for token in self.basic.tokenize(piece):
                out.extend(self.wordpiece.tokenize(token))
        return out

    def _split_special(self, text: str):
        """[(piece, is_special)]: literal special tokens cut out of the text."""
        if not self.special_tokens:
            return [(text, False)]
        out, start, i = [], 0, 0
        while i < len(text):
            hit = next((t for t in self.special_tokens if text.startswith(t, i)), None)
            if hit is None:
                i += 1
                continue
            if i > start:
                out.append((text[start:i], False))
            out.append((hit, True))
            i += len(hit)
            start = i
        if start < len(text):
            out.append((text[start:], False))
        return out

    # ---------------------------------------------------------------- tokens <-> ids
    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
        unk = self.vocab.get(self.unk_token)
        ids = []
        for t in tokens:
            if t in self.vocab:
                ids.append(self.vocab[t])
            elif unk is not None:
                ids.append(unk)
            else:
                raise KeyError(f"token {t!r} is not in the vocabulary and it has no {self.unk_token}")
        return ids

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
        return [self.inv_vocab[int(i)] for i in ids]

    def _id(self, token: str) -> int:
        if token not in self.vocab:
            raise KeyError(f"the vocabulary has no {token}")
        return self.vocab[token]

    # ---------------------------------------------------------------- model inputs
    def encode(self, text_a: str, text_b: Optional[str] = None, max_len: Optional[int] = None,
               pad: bool = False) -> dict:
        """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` as lists of ints.

        token_type_ids are 0 over ``[CLS] a [SEP]`` and 1 over ``b [SEP]``.
        ``max_len`` truncates (the longer of a/b loses its last token first,
        as Google's ``_truncate_seq_pair``); ``pad=True`` pads to ``max_len``
        with ``[PAD]`` (attention_mask 0).
        """
        a = self.tokenize(text_a)
        b = self.tokenize(text_b) if text_b is not None else None
        if max_len is not None:
            room = max_len - (3 if b is not None else 2)
            if room < 0:
                raise ValueError(f"max_len {max_len} leaves no room for the special tokens")
            if b is None:
                a = a[:room]
            else:
                while len(a) + len(b) > room:
                    (a if len(a) > len(b) else b).pop()
        cls_id, sep_id = self._id("[CLS]"), self._id("[SEP]")
        ids = [cls_id] + self.convert_tokens_to_ids(a) + [sep_id]
        types = [0] * len(ids)
        if b is not None:
            ids += self.convert_tokens_to_ids(b) + [sep_id]
            types += [1] * (len(b) + 1)
        mask = [1] * len(ids)
        if pad:
            if max_len is None:
                raise ValueError("pad=True needs max_len")
            n = max_len - len(ids)
            ids, types, mask = ids + [self._id("[PAD]")] * n, types + [0] * n, mask + [0] * n
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


# --------------------------------------------------------------------------- fast path


class _CharTable(dict):
    """A ``str.translate`` table filled on first sight of each character by ``rule(ch)``
    (None: delete, else the replacement string). Lookups after the first are C dict hits."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def __missing__(self, cp: int):
        value = self[cp] = self.rule(chr(cp))
        return value


def _clean_char_punct(ch: str):
    out = _clean_char(ch)
    return f" {ch} " if out == ch and _is_punctuation(ch) else out


def _drop_mark_punct(ch: str):
    if _is_mark(ch):
        return None
    return f" {ch} " if _is_punctuation(ch) else ch


class FastTokenizer:
    """:class:`FullTokenizer`'s exact tokens and ids, a whole line at a time in C string code.

    The reference walks every character in Python; this runs the same steps over the line with
    ``str.translate``/``lower``/``normalize``/``split`` and caches WordPiece per distinct word:

    1. clean + CJK spacing are rules per character, so one translate table does both (filled
       lazily from the reference's own predicates); without lowercasing it spaces punctuation too;
    2. ``lower()`` of the line equals ``lower()`` per whitespace token: the only context rule
       (final sigma) never looks across whitespace;
    3. NFD of the line equals NFD per token (whitespace is a starter); a second table drops Mn
       marks and spaces punctuation, judged after NFD as the reference does;
    4. ``str.split()`` is ``whitespace_tokenize``; each word goes through the reference WordPiece
       once and its ids are cached (at most ``cache_size`` words; the cache restarts when full).

    tests/unit/test_tokenization.py proves equality with :class:`FullTokenizer` on every code point, on
    the shipped corpora and on long, unknown-heavy and mixed-script text.
    """

    def __init__(self, reference: "FullTokenizer", cache_size: int = 1 << 20):
        self.reference = reference
        self.vocab = reference.vocab
        self.lower = reference.do_lower_case
        self.cache_size = cache_size
        self._line_table = _CharTable(_clean_char_punct)  # cased lines, and ASCII lines in either mode
        self._clean_table = _CharTable(_clean_char)
        self._mark_table = _CharTable(_drop_mark_punct)
        self._ids = {}
        self._pieces = {}

    def words(self, text: str) -> List[str]:
        """``BasicTokenizer.tokenize(text)`` of the reference (special tokens are not split out)."""
        if not self.lower:
            return text.translate(self._line_table).split()
        if text.isascii():  # ASCII: lower() stays ASCII, nothing decomposes
            return text.translate(self._line_table).lower().split()
        text = text.translate(self._clean_table).lower()
        if not text.isascii():
            text = unicodedata.normalize("NFD", text)
        return text.translate(self._mark_table).split()

    def _convert(self, cache: dict, word: str, as_ids: bool) -> list:
        pieces = self.reference.wordpiece.tokenize(word)
        value = [self.vocab[t] for t in pieces] if as_ids else pieces
        if len(cache) >= self.cache_size:
            cache.clear()
        cache[word] = value
        return value

    def _run(self, text: str, as_ids: bool) -> list:
        cache = self._ids if as_ids else self._pieces
        if self.reference.special_tokens:
            parts = self.reference._split_special(text)
        else:
            parts = ((text, False),)
        out = []
        for part, is_special in parts:
            if is_special:
                out.append(self.vocab[part] if as_ids else part)
                continue
            for word in self.words(part):
                value = cache.get(word)
                out += value if value is not None else self._convert(cache, word, as_ids)
        return out

    def tokenize(self, text: str) -> List[str]:
        """The reference's ``tokenize(text)``."""
        return self._run(text, False)

    def ids(self, text: str) -> List[int]:
        """The reference's ``convert_tokens_to_ids(tokenize(text))`` ([UNK] must be in the vocabulary)."""
        return self._run(text, True)


__all__ = ["FullTokenizer", "BasicTokenizer", "WordpieceTokenizer", "FastTokenizer"]
