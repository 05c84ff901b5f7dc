"""Google BERT's *basic* tokenization rules, used to project predicted SQuAD spans
back onto the original text (``get_final_text``).

The rules (google-research/bert ``tokenization.BasicTokenizer``): drop NUL, U+FFFD and
control characters, map whitespace to a space, put spaces around CJK ideographs, split on
whitespace, then per token optionally lower-case and strip accents (NFD, drop ``Mn``), and
split every punctuation character off as its own token. Written here from that description
so the evaluation layer does not depend on a particular tokenizer module; any object with a
``tokenize(text) -> list[str]`` method following the same rules can be passed instead.
"""

from __future__ import annotations

import unicodedata

# CJK Unified Ideographs blocks (and extensions / compatibility blocks) that BERT treats as
# one token per character.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def is_whitespace(ch: str) -> bool:
    return ch in (" ", "\t", "\n", "\r") or unicodedata.category(ch) == "Zs"


def is_control(ch: str) -> bool:
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch).startswith("C")


def is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # All non-letter/number ASCII counts, e.g. "^", "$", "`" (not Unicode "P*").
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


class BasicTokenizer:
    """Punctuation splitting, optional lower-casing and accent stripping."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[str]:
        chars = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or is_control(ch):
                continue
            if is_whitespace(ch):
                chars.append(" ")
            elif _is_cjk(cp):
                chars.extend((" ", ch, " "))
            else:
                chars.append(ch)
        pieces: list[str] = []
        for token in "".join(chars).split():
            if self.do_lower_case:
                token = token.lower()
                token = "".join(c for c in unicodedata.normalize("NFD", token)
                                if unicodedata.category(c) != "Mn")
            current = ""
            for ch in token:
                if is_punctuation(ch):
                    if current:
                        pieces.append(current)
                        current = ""
                    pieces.append(ch)
                else:
                    current += ch
            if current:
                pieces.append(current)
        return " ".join(pieces).split()
