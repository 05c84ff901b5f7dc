"""A BERT ``tokenizer.json`` (what transformers' BertTokenizerFast saves) where there is no
vocab.txt: the same ids as transformers (recorded by tests/data/hf/make_transformers_calls.py),
read as data with one-line errors for what bert_of's WordPiece would compute otherwise; and
``BertTokenizer.from_pretrained`` reading the tokenizer files only, never the weights."""

import json
import os
import shutil

import pytest

from bert_of.errors import BertOfError
from bert_of.tokenizer import BertTokenizer
from bert_of.vocab import read_tokenizer_json
from tests.conftest import ROOT, error_lines, run_cli

DATA = os.path.join(ROOT, "tests", "data", "hf")
FAST = os.path.join(DATA, "tokenizer_json")  # tokenizer.json + tokenizer_config.json, no vocab.txt
TINY_PT = os.path.join(DATA, "tiny_pt")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def spec():
    with open(os.path.join(FAST, "tokenizer.json"), encoding="utf-8") as f:
        return json.load(f)


def test_the_ids_are_transformers_fast_tokenizers():
    with open(os.path.join(DATA, "tokenizer_json_cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    assert cases["class"] == "BertTokenizerFast"
    tok = BertTokenizer.from_pretrained(FAST)
    assert tok.do_lower_case is False  # tokenizer_config.json's, as transformers reads it
    for text, ids in cases["single"]:
        assert tok(text)["input_ids"] == ids, text
    for a, b, ids, types in cases["pairs"]:
        got = tok(a, b)
        assert (got["input_ids"], got["token_type_ids"]) == (ids, types), (a, b)


def test_lowercasing_comes_from_the_normalizer_without_a_tokenizer_config(tmp_path):
    d = spec()
    d["normalizer"]["lowercase"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(d), encoding="utf-8")
    tok = BertTokenizer.from_pretrained(str(tmp_path))
    assert tok.do_lower_case is True
    assert tok.tokenize("NEW York") == ["new", "york"]  # the uncased tokens, not [UNK]
    tok.save_pretrained(str(tmp_path / "saved"))  # a vocab.txt of its tokens, in id order
    tokens = sorted(d["model"]["vocab"], key=d["model"]["vocab"].get)
    assert (tmp_path / "saved" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1] == tokens


def test_from_pretrained_reads_only_the_tokenizer_files(tmp_path, home):
    folder = tmp_path / "m"
    shutil.copytree(TINY_PT, folder)
    (folder / "model.safetensors").write_bytes(b"not weights at all")  # never read
    tok = BertTokenizer.from_pretrained(str(folder))
    assert tok.vocab_file == str(folder / "vocab.txt") and tok.model_max_length == 40
    os.remove(folder / "vocab.txt")
    shutil.copy(os.path.join(TINY_PT, "model.safetensors"), folder / "model.safetensors")
    with pytest.raises(BertOfError) as e:
        BertTokenizer.from_pretrained(str(folder))
    assert str(e.value) == f"{folder}: no vocab.txt or tokenizer.json (a tokenizer needs the checkpoint's vocabulary)"
    assert not (home / "converted").exists()  # no weight was converted to learn that


def mutated(change):
    d = spec()
    change(d)
    return d


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return d


BAD = [  # (tokenizer.json text, what its one error line says)
    ("{not json", "malformed JSON at line 1"),
    ("[]", "expected a JSON object"),
    (json.dumps(mutated(lambda d: _set(d, ["model", "type"], "BPE"))), "not a WordPiece tokenizer (model type 'BPE')"),
    (json.dumps(mutated(lambda d: _set(d, ["model", "vocab", "man"], 5))), "the id 5; ids must be 0..97, each once"),
    (json.dumps(mutated(lambda d: _set(d, ["model", "vocab", "man"], 500))), "gives 'man' the id 500"),
    (json.dumps(mutated(lambda d: _set(d, ["model", "vocab", "man"], True))), "gives 'man' the id True"),
    (json.dumps(mutated(lambda d: d["model"]["vocab"].update({"a\nb": d["model"]["vocab"].pop("man")}))),
     "holds a line break"),
    (json.dumps(mutated(lambda d: _set(d, ["model", "continuing_subword_prefix"], "@@"))), "prefix '@@'"),
    (json.dumps(mutated(lambda d: _set(d, ["normalizer", "strip_accents"], True))),
     "normalizer.strip_accents true with lowercase false"),
    (json.dumps(mutated(lambda d: _set(d, ["normalizer", "lowercase"], "yes"))), "normalizer.lowercase is 'yes'"),
    (json.dumps(mutated(lambda d: _set(d, ["normalizer"], {"type": "NFC"}))), "normalizer 'NFC'"),
    (json.dumps(mutated(lambda d: _set(d, ["pre_tokenizer"], {"type": "Whitespace"}))), "pre_tokenizer 'Whitespace'"),
    (json.dumps(mutated(lambda d: d["added_tokens"].append({"id": 101, "content": "<new>"}))),
     "added token '<new>' (id 101) is not the vocabulary's"),
    (json.dumps(mutated(lambda d: _set(d, ["model", "max_input_chars_per_word"], 0))), "is not a positive word length"),
    ('{"model": {"type": "WordPiece", "vocab": {"a": ' + "9" * 5000 + "}}}", "not a tokenizer.json (Exceeds the limit"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
]


@pytest.mark.parametrize("text,said", BAD, ids=range(len(BAD)))
def test_a_bad_tokenizer_json_is_one_line_naming_the_file(tmp_path, text, said):
    path = tmp_path / "tokenizer.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BertOfError) as e:
        read_tokenizer_json(str(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and said in msg and "\n" not in msg, msg


def test_convert_of_a_folder_with_a_bad_tokenizer_json_is_one_line(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TINY_PT, name), folder / name)
    (folder / "tokenizer.json").write_text(json.dumps(mutated(lambda d: _set(d, ["model", "type"], "Unigram"))))
    r = run_cli("convert", "hf2of", folder, "-o", tmp_path / "of", check=False, process=True,
                env={"BERT_OF_HOME": str(tmp_path / "home")})
    assert r.returncode == 1 and error_lines(r.stderr) == [
        f"bert-of: error: {folder / 'tokenizer.json'}: not a WordPiece tokenizer (model type 'Unigram'); "
        "bert_of reads BERT's"], r.stderr
    assert not (tmp_path / "of").exists()


def test_against_transformers_in_process_where_installed():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    theirs = transformers.AutoTokenizer.from_pretrained(FAST)
    ours = BertTokenizer.from_pretrained(FAST)
    with open(os.path.join(DATA, "tokenizer_json_cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    for text, _ in cases["single"]:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
    for a, b, _, _ in cases["pairs"]:
        assert ours(a, b)["token_type_ids"] == theirs(a, b)["token_type_ids"], (a, b)
