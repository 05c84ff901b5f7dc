"""What a newcomer from transformers or google-research/bert meets on the command line: the
checkpoint's lower-casing reaches fine-tuning and prediction, plain text is tagged word by word,
a run folder resolves to its model, --eval-data is checked before training, writers agree on
-o / --overwrite. A tiny BERT (hidden 32, 2 layers) and a few steps: the paths, not the accuracy."""

import csv
import json
import os
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, error_lines, run_cli
from tests.test_finetune import tiny_bert

USER = os.path.join(ROOT, "tests", "data", "user")
S_TRAIN, S_DEV, S_NEW = (os.path.join(USER, f"sentiment-{s}.csv") for s in ("train", "dev", "new"))
N_TRAIN, N_DEV = (os.path.join(USER, f"ner-{s}.conll") for s in ("train", "dev"))
FAST = ["--max-seq-length", 32, "--batch-size", 8, "--mode", "eager", "--log-every", 100, "--no-record"]


def _cased_vocab(path):
    """Every word of the user fixtures with its capitals (a cased vocabulary), plus characters."""
    from bert_of.tokenization import BasicTokenizer

    bt = BasicTokenizer(do_lower_case=False)
    words = set()
    for name in os.listdir(USER):
        with open(os.path.join(USER, name), encoding="utf-8-sig", newline="") as f:
            if name.endswith(".csv"):
                for row in csv.DictReader(f):
                    for v in row.values():
                        words.update(bt.tokenize(v))
            elif name.endswith(".conll"):
                words.update(w for line in f for w in bt.tokenize(line))
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)
    vocab += [c for c in chars if c not in words] + ["##" + c for c in chars]
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(path), len(vocab)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("habits")
    saved = os.environ.get("BERT_OF_HOME")
    os.environ["BERT_OF_HOME"] = str(root / "home")  # the zoo's cache (converted copies) inside the test
    try:
        vocab, n = _cased_vocab(root / "vocab.txt")
        yield SimpleNamespace(root=root, cased=tiny_bert(root / "cased", vocab, n, dropout=0.0))
    finally:
        if saved is None:
            os.environ.pop("BERT_OF_HOME", None)
        else:
            os.environ["BERT_OF_HOME"] = saved


# --------------------------------------------------------------------------- provenance


def test_a_cased_checkpoint_fine_tuned_through_the_cli_keeps_case(env, tmp_path):
    from bert_of import BertTokenizer

    hf = tmp_path / "hf"
    run_cli("convert", "of2hf", env.cased, "-o", hf)
    assert json.loads((hf / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert BertTokenizer.from_pretrained(str(hf)).do_lower_case is False  # the Python API's answer
    ft = tmp_path / "ft"
    run_cli("finetune", "classify", "--model", hf, "--train", S_TRAIN, "-o", ft, "--steps", 1, *FAST)
    args = json.loads((ft / "train_args.json").read_text())
    assert args["do_lower_case"] is False and args["do_lower_case_from"] == "checkpoint"
    assert BertTokenizer.from_pretrained(str(ft)).do_lower_case is False
    # what the fine-tuned folder records reaches predict: no flag, the same case as training
    r = run_cli("predict", "classify", "--model", ft, "--data", S_NEW, "-o", tmp_path / "p.jsonl", "-v")
    assert "looks like a CASED vocabulary" not in r.stderr, r.stderr  # what lower-casing it would say
    # an explicit flag still wins, and says what it overrides
    ft2 = tmp_path / "ft2"
    r = run_cli("finetune", "classify", "--model", hf, "--train", S_TRAIN, "-o", ft2, "--steps", 1, *FAST,
                "--do-lower-case")
    args = json.loads((ft2 / "train_args.json").read_text())
    assert args["do_lower_case"] is True and args["do_lower_case_from"] == "given"
    assert "--do-lower-case overrides the checkpoint's do_lower_case false" in r.stderr, r.stderr
