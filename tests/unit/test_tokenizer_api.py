"""BertTokenizer's transformers habits: pad_to_multiple_of (transformers' test_padding_to_multiple_of
assertions), padding_side / truncation_side "left", pairs given as tuples, encode_plus /
batch_encode_plus, batch_decode, save_pretrained (checked by hand against transformers 4.57.6
BertTokenizerFast on this vocabulary: the same ids, masks and errors)."""

import json
import os

import numpy as np
import pytest

from bert_of.errors import InputError
from bert_of.tokenizer import BertTokenizer
from tests.helpers.models import minilm_dir


@pytest.fixture()
def tok():
    return BertTokenizer(os.path.join(minilm_dir(), "vocab.txt"), do_lower_case=True, model_max_length=64)


def test_padding_to_multiple_of_as_transformers_tests_it(tok):
    for text in ("", "This is a sample input"):
        for key, value in tok(text, padding=True, pad_to_multiple_of=8).items():
            assert len(value) % 8 == 0, key
    for key, value in tok("This", pad_to_multiple_of=8).items():  # no padding asked: none done
        assert len(value) % 8 != 0, key
    for key, value in tok("This", padding=True, truncation=True, pad_to_multiple_of=8).items():
        assert len(value) % 8 == 0, key
    # truncating to a length that is not a multiple: a ValueError, not more than max_length ids
    with pytest.raises(ValueError, match=r"truncation length \(12\) is not a multiple of pad_to_multiple_of \(8\)"):
        tok("This", padding=True, truncation=True, max_length=12, pad_to_multiple_of=8)
    long = "word " * 40
    assert len(tok(long, padding="max_length", truncation=True, max_length=16, pad_to_multiple_of=8)["input_ids"]) == 16
    with pytest.raises(InputError, match="pad_to_multiple_of=0"):
        tok("This", padding=True, pad_to_multiple_of=0)


def test_left_padding_puts_the_padding_first(tok):
    texts = ["Hello world", "A much longer sentence here, with words."]
    right = tok(texts, padding=True, return_special_tokens_mask=True)
    for left in (tok(texts, padding=True, padding_side="left", return_special_tokens_mask=True),
                 _with(tok, padding_side="left")(texts, padding=True, return_special_tokens_mask=True)):
        for key, fill in (("input_ids", tok.pad_token_id), ("token_type_ids", 0), ("attention_mask", 0),
                          ("special_tokens_mask", 1)):
            n = sum(right["attention_mask"][0])
            pad = len(right[key][0]) - n
            assert pad > 0 and left[key][0] == [fill] * pad + right[key][0][:n], key
            assert left[key][1] == right[key][1], key  # the longest row has no padding
        assert left.word_ids(0)[:pad] == [None] * pad and left.word_ids(0)[pad:] == right.word_ids(0)[:n]
    with pytest.raises(InputError, match="padding_side='middle'"):
        tok(texts, padding=True, padding_side="middle")


def test_left_truncation_keeps_the_end(tok):
    text = "A much longer sentence here, with many words in it."
    full = tok(text)["input_ids"]
    right = tok(text, truncation=True, max_length=7)["input_ids"]
    assert right == full[:6] + full[-1:]
    cut = _with(tok, truncation_side="left")(text, truncation=True, max_length=7)["input_ids"]
    assert cut == full[:1] + full[-6:]  # [CLS] + the last 5 word pieces + [SEP]


def test_pairs_as_tuples_encode_plus_and_batch_encode_plus(tok):
    a, b = ["Hello world", "Hi"], ["second part", "there"]
    want = tok(a, b, padding=True)
    assert tok(list(zip(a, b)), padding=True) == want
    assert tok.batch_encode_plus(list(zip(a, b)), padding=True) == want
    assert tok.batch_encode_plus(a, padding="longest") == tok(a, padding="longest")
    assert tok.encode_plus("Hello world", "second", max_length=6, truncation=True) == \
        tok("Hello world", "second", max_length=6, truncation=True)
    with pytest.raises(InputError, match="encode_plus takes one text"):
        tok.encode_plus(a)
    with pytest.raises(InputError, match="an empty batch"):
        tok([], padding=True)


def test_batch_decode(tok):
    rows = tok(["Hello world!", "It's a test."], padding=True, return_tensors="np")["input_ids"]
    assert tok.batch_decode(rows, skip_special_tokens=True) == ["hello world!", "it's a test."]
    assert tok.batch_decode(rows.tolist()) == [tok.decode(r) for r in rows.tolist()]
    assert tok.batch_decode(rows)[1].startswith("[CLS] it's a test. [SEP]")


def test_save_pretrained_reads_back_as_the_same_tokenizer(tmp_path):
    cased = BertTokenizer(os.path.join(minilm_dir(), "vocab.txt"), do_lower_case=False, model_max_length=128,
                          padding_side="left")
    paths = cased.save_pretrained(str(tmp_path / "tok"))
    assert sorted(os.path.basename(p) for p in paths) == ["special_tokens_map.json", "tokenizer_config.json",
                                                          "vocab.txt"]
    cfg = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert (cfg["tokenizer_class"], cfg["do_lower_case"], cfg["model_max_length"], cfg["padding_side"]) == \
        ("BertTokenizer", False, 128, "left")
    assert "truncation_side" not in cfg  # transformers' default, left out as it leaves it out
    back = BertTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert (back.do_lower_case, back.model_max_length, back.padding_side) == (False, 128, "left")
    texts = ["Hello World", "Ünïcode and CASE stay"]
    assert back(texts, padding=True) == cased(texts, padding=True)
    assert cased.tokenize("Hello")[0] != "hello"
    (tmp_path / "tok" / "other.txt").write_text("kept")
    cased.save_pretrained(str(tmp_path / "tok"))  # into an existing folder: other files kept
    assert (tmp_path / "tok" / "other.txt").read_text() == "kept"


def _with(tok, **attrs):
    for k, v in attrs.items():
        setattr(tok, k, v)
    return tok
