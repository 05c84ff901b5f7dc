"""bert_of.BertTokenizer: transformers' call convention on bert_of's WordPiece.

Ids are checked against those transformers gave (tests/data/hf/tokenizer_cases.json, recorded from
transformers 4.57.6 on the real all-MiniLM-L6-v2 vocabulary; bench/tokenizer_parity.py compares
3,000 lines of real text with BertTokenizerFast id for id); offsets and word ids against the text
itself; the tracking path against the fast path on the shipped corpora and hostile text.
"""

import json
import os

import numpy as np
import pytest

from bert_of.converters.convert import convert
from bert_of.errors import BertOfError
from bert_of.tokenization import FastTokenizer, FullTokenizer
from bert_of.tokenizer import BertTokenizer
from tests.conftest import ROOT
from tests.helpers.models import HF_DATA as DATA, minilm_dir

TEXT = os.path.join(ROOT, "tests", "data", "text")


@pytest.fixture(scope="module")
def tok():
    return BertTokenizer(os.path.join(minilm_dir(), "vocab.txt"), do_lower_case=True)


def _cases():
    with open(os.path.join(DATA, "tokenizer_cases.json"), encoding="utf-8") as f:
        return json.load(f)["cases"]


def test_ids_equal_what_transformers_gave(tok):
    for case in _cases():
        e = tok(case["text"], case.get("text_b"), max_length=case.get("max_len"))
        assert e["input_ids"] == case["input_ids"], case["text"]
        assert e["token_type_ids"] == case["token_type_ids"]
        assert e["attention_mask"] == [1] * len(case["input_ids"])


def _corpus_lines():
    lines = []
    for f in ("classics.txt", "sample_text.txt", "hostile.txt"):
        lines += [ln.rstrip("\n") for ln in open(os.path.join(TEXT, f), encoding="utf-8", errors="replace")]
    return [ln for ln in lines if ln.strip()]


@pytest.mark.parametrize("lower", [True, False])
def test_offset_tracking_gives_the_fast_paths_tokens_on_corpora_and_hostile_text(lower):
    t = BertTokenizer(os.path.join(minilm_dir(), "vocab.txt"), do_lower_case=lower)
    # + line and paragraph separators: whitespace to str.split() (so to Google's rules), not to Unicode's Zs
    lines = _corpus_lines() + ["first\u2028second\u2029Third word", "a\u2028\u2029b"]
    fast = t(lines, add_special_tokens=False)
    tracked = t(lines, add_special_tokens=False, return_offsets_mapping=True)
    assert tracked["input_ids"] == fast["input_ids"]
    assert [tracked.word_ids(i) for i in range(len(lines))] == [fast.word_ids(i) for i in range(len(lines))]
    ref = FastTokenizer(FullTokenizer(os.path.join(minilm_dir(), "vocab.txt"), do_lower_case=lower,
                                      max_input_chars_per_word=100))
    assert fast["input_ids"] == [ref.ids(ln) for ln in lines]


def test_offsets_point_at_the_characters_of_each_piece(tok):
    text = "Hello, World! Unaffable café in 東京 [MASK] tokens"
    e = tok(text, return_offsets_mapping=True)
    pieces = tok.convert_ids_to_tokens(e["input_ids"])
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]" and e["offset_mapping"][0] == e["offset_mapping"][-1] == (0, 0)
    for piece, (s, b) in zip(pieces[1:-1], e["offset_mapping"][1:-1]):
        got = text[s:b] if piece == "[MASK]" else text[s:b].lower().replace("é", "e")
        assert got == piece.removeprefix("##"), (piece, got)
    words = e.word_ids()
    assert words[0] is None and words[-1] is None and words[1:4] == [0, 1, 2]  # hello , world


def test_padding_truncation_and_tensors(tok):
    lines = ["A man is eating food.", "Hi", "The quick brown fox jumps over the lazy dog"]
    e = tok(lines, padding=True)
    width = max(len(tok.encode(t)) for t in lines)
    assert [len(r) for r in e["input_ids"]] == [width] * 3
    for row, mask, t in zip(e["input_ids"], e["attention_mask"], lines):
        n = len(tok.encode(t))
        assert mask == [1] * n + [0] * (width - n) and row[n:] == [tok.pad_token_id] * (width - n)
    e = tok(lines, padding="max_length", max_length=16, return_tensors="np")
    assert e["input_ids"].shape == (3, 16) and e["input_ids"].dtype == np.int64
    e = tok(lines, truncation=True, max_length=6)
    assert [len(r) for r in e["input_ids"]] == [6, 3, 6] and all(r[-1] == tok.sep_token_id for r in e["input_ids"])
    assert tok(lines, padding=True, pad_to_multiple_of=8)["input_ids"][0].__len__() % 8 == 0
    one = tok("Hi", return_tensors="np")
    assert one["input_ids"].shape == (1, 3)  # a batch axis, as transformers adds
    with pytest.raises(BertOfError, match="use padding=True"):
        tok(lines, return_tensors="np")
    with pytest.raises(BertOfError, match="'np' \\(NumPy\\) or 'of'"):
        tok("Hi", return_tensors="pt")


@pytest.mark.oneflow
def test_of_tensors_go_into_the_model_as_they_are(tok):
    from bert_of.config import BertConfig
    from bert_of.modeling import BertModel

    batch = tok(["A man is eating food.", "Hi"], padding=True, return_tensors="of")
    assert tuple(batch["input_ids"].shape) == (2, 8) and str(batch["input_ids"].dtype) == "oneflow.int64"
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=16))
    model.eval()
    assert tuple(model(**batch).sequence_output.shape) == (2, 8, 8)


def test_pairs_are_cut_longest_first_as_transformers_fast_tokenizers_cut_them(tok):
    a = "one two three four five six seven eight nine ten"  # 10 pieces
    b = "alpha beta gamma delta epsilon"
    nb = len(tok.tokenize(b))
    for max_length, (ka, kb) in {15: (7, nb), 12: (5, 4), 8: (3, 2)}.items():  # what BertTokenizerFast gave
        e = tok(a, b, truncation=True, max_length=max_length)
        types = e["token_type_ids"]
        assert len(e["input_ids"]) == max_length
        assert types.count(0) == ka + 2 and types.count(1) == kb + 1, max_length
    e = tok(a, a, truncation=True, max_length=8)  # a tie: the second text keeps the odd token
    assert e["token_type_ids"].count(0) == 4 and e["token_type_ids"].count(1) == 4
    e = tok(a, b, truncation="only_first", max_length=10)
    assert e["token_type_ids"].count(1) == nb + 1 and len(e["input_ids"]) == 10
    with pytest.raises(BertOfError, match="needs a text pair"):
        tok(a, truncation="only_second", max_length=5)


def test_pre_split_words_map_back_to_their_words(tok):
    words = ["Unaffable", "Johanson", "went", "to", "Zürich", "."]
    e = tok(words, is_split_into_words=True)
    ids = e.word_ids()
    assert ids[0] is None and ids[-1] is None and sorted(set(ids[1:-1])) == list(range(len(words)))
    for w, word in enumerate(words):
        pieces = [p for p, i in zip(tok.convert_ids_to_tokens(e["input_ids"]), ids) if i == w]
        assert pieces == tok.tokenize(word)
    batch = tok([words, words[:2]], is_split_into_words=True, padding=True)
    assert len(batch["input_ids"]) == 2 and batch.word_ids(1)[-1] is None


def test_decode_and_ids_outside_the_vocabulary(tok):
    ids = tok.encode("Hello, world! It's a test.")
    assert tok.decode(ids, skip_special_tokens=True) == "hello, world! it's a test."
    assert tok.decode(ids).startswith("[CLS] hello")
    assert tok.convert_ids_to_tokens(tok.cls_token_id) == "[CLS]"
    with pytest.raises(BertOfError, match="token id 99999 is outside the vocabulary \\(0..30521\\)"):
        tok.decode([101, 99999])


def test_from_pretrained_reads_the_checkpoints_own_case(tmp_path):
    from tests.helpers.models import minilm_dir as mini

    t = BertTokenizer.from_pretrained(mini())  # an HF folder: tokenizer_config.json says lower-case
    assert t.do_lower_case is True and t.model_max_length == 512
    cfg = json.load(open(os.path.join(mini(), "tokenizer_config.json")))
    cased = tmp_path / "cased"
    cased.mkdir()
    for f in os.listdir(mini()):
        p = os.path.join(mini(), f)
        if os.path.isfile(p):
            (cased / f).write_bytes(open(p, "rb").read())
    (cased / "tokenizer_config.json").write_text(json.dumps(dict(cfg, do_lower_case=False)))
    t = BertTokenizer.from_pretrained(str(cased))
    assert t.do_lower_case is False and t.tokenize("Hello")[0] != "hello"
    assert BertTokenizer.from_pretrained(str(cased), do_lower_case=True).do_lower_case is True
    # a bert_of folder converted from it: no tokenizer_config.json, so its vocabulary decides (uncased)
    out = tmp_path / "of"
    convert("hf2of", mini(), str(out))
    assert BertTokenizer.from_pretrained(str(out)).do_lower_case is True
    with pytest.raises(BertOfError):
        BertTokenizer.from_pretrained(str(tmp_path / "nowhere"))
