"""Regenerate transformers' answers to the calls tests/e2e/test_transformers_calls.py makes
(developer tool, not run by the tests).

Needs torch + transformers, outside the repository's venvs: made with torch 2.13.0 (CPU) and
transformers 4.57.6 (the version that wrote ``tiny_pt/``; its BertModel still takes
``head_mask``), checked with transformers 5.25.0 (``--check``, 2026-12-06): the same outputs
within 1.7e-6 and the same tokenizer ids; its BertModel.forward has no ``head_mask`` parameter
and takes the keyword silently, computing as without it (all-zero mask: identical output), so
``head_mask``'s meaning here is transformers 4's::

    python3.11 -m venv /tmp/tf4 && /tmp/tf4/bin/pip install torch 'transformers<5' safetensors
    /tmp/tf4/bin/python tests/data/hf/make_transformers_calls.py            # writes the files
    /tmp/tf5/bin/python tests/data/hf/make_transformers_calls.py --check    # transformers 5: compares

Writes, from ``tiny_pt/`` (BertModel under its BertForPreTraining, eval mode) and the batch of
``tiny_pt_outputs.npz``:

- ``transformers_calls.npz``: ``position_ids`` [3, 12] (not 0..S-1) and the sequence/pooled
  outputs with them; ``inputs_embeds`` [3, 12, 32] (seeded normal) and the outputs with them in
  place of ``input_ids``; ``head_mask`` [3, 4] (0 silences a head) and the outputs and
  attentions [L, B, N, S, S] with it; ``resized_bias`` the MLM bias after
  ``resize_token_embeddings(105, mean_resizing=False)`` (old entries kept, new ones 0).
- ``tokenizer_json/``: a WordPiece tokenizer as ``BertTokenizerFast.save_pretrained`` writes it
  (tokenizer.json, tokenizer_config.json, special_tokens_map.json; its vocab.txt removed: the case
  bert_of reads tokenizer.json for), cased, from the small vocabulary below; and
  ``tokenizer_json_cases.json``: its ids for the sentences below, with and without pairs.

Facts read off transformers 4.57.6 / 5.25.0 while making them (what the tests hold bert_of to):
``inputs_embeds`` with ``input_ids`` too is a ValueError; ``resize_token_embeddings`` returns the
new table, sets ``config.vocab_size``, keeps the first rows, and the MLM bias follows; loading a
2-label classifier with ``num_labels=3`` fails naming ``ignore_mismatched_sizes=True`` and, with it,
loads with the classifier newly initialised.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "tiny_pt")
OUT = os.path.join(HERE, "transformers_calls.npz")
TOK = os.path.join(HERE, "tokenizer_json")
CASES = os.path.join(HERE, "tokenizer_json_cases.json")

WORDS = ["the", "a", "man", "is", "eat", "##ing", "food", "Hello", "world", "un", "##believ", "##able", "café",
         "cafe", "!", ".", ",", "?", "'", "s", "New", "York", "new", "york", "naïve", "##s", "über"]
SENTENCES = ["Hello world!", "A man is eating food.", "The café in New York is unbelievable!",
             "naïve über cafe's", "  spaces   and\ttabs ", "[CLS] literal [SEP] tokens", "unknownword"]
PAIRS = [("Hello world!", "A man is eating."), ("New York", "new york")]


def outputs(model, **kw):
    with torch.no_grad():
        out = model(**kw)
    return out


def main(check: bool) -> None:
    batch = dict(np.load(os.path.join(HERE, "tiny_pt_outputs.npz")))
    ids = torch.tensor(batch["input_ids"])
    tt = torch.tensor(batch["token_type_ids"])
    mask = torch.tensor(batch["attention_mask"])
    model = transformers.BertModel.from_pretrained(TINY, attn_implementation="eager").eval()
    B, S = ids.shape
    position_ids = (np.arange(S)[None, :] * np.array([[1], [2], [3]]) + np.array([[0], [5], [1]])) % 40
    rng = np.random.default_rng(0)
    embeds = rng.normal(0.0, 0.05, (B, S, model.config.hidden_size)).astype(np.float32)
    rec = {"position_ids": position_ids, "inputs_embeds": embeds}
    o = outputs(model, input_ids=ids, token_type_ids=tt, attention_mask=mask, position_ids=torch.tensor(position_ids))
    rec["pos_sequence_output"], rec["pos_pooled_output"] = o.last_hidden_state.numpy(), o.pooler_output.numpy()
    o = outputs(model, inputs_embeds=torch.tensor(embeds), token_type_ids=tt, attention_mask=mask)
    rec["embeds_sequence_output"], rec["embeds_pooled_output"] = o.last_hidden_state.numpy(), o.pooler_output.numpy()
    try:
        model(input_ids=ids, inputs_embeds=torch.tensor(embeds))
        raise SystemExit("both input_ids and inputs_embeds: no error")
    except ValueError as e:
        print("both:", e)
    head_mask = np.array([[1, 0, 1, 1], [1, 1, 1, 1], [0, 1, 0, 1]], np.float32)
    rec["head_mask"] = head_mask
    try:
        o = outputs(model, input_ids=ids, token_type_ids=tt, attention_mask=mask, head_mask=torch.tensor(head_mask),
                    output_attentions=True)
        rec["head_sequence_output"] = o.last_hidden_state.numpy()
        rec["head_attentions"] = np.stack([a.numpy() for a in o.attentions])
    except TypeError as e:
        print(f"transformers {transformers.__version__}: no head_mask ({e})")
    pt = transformers.BertForPreTraining.from_pretrained(TINY).eval()
    table = pt.resize_token_embeddings(105, mean_resizing=False)
    assert tuple(table.weight.shape) == (105, 32) and pt.config.vocab_size == 105
    rec["resized_bias"] = pt.cls.predictions.bias.detach().numpy()
    if check:
        with np.load(OUT) as ref:
            for k, v in rec.items():
                if k in ref.files:
                    print(k, "max |diff|", float(np.max(np.abs(ref[k].astype(np.float64) - v))))
        check_tokenizer()
        return
    np.savez_compressed(OUT, **rec)
    make_tokenizer()


def make_tokenizer() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        vocab = os.path.join(d, "vocab.txt")
        letters = sorted(set("".join(w.lstrip("#") for w in WORDS)) | set("abcdefghijklmnopqrstuvwxyz"))
        tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + letters + ["##" + c for c in letters]
        with open(vocab, "w", encoding="utf-8") as f:
            f.write("\n".join(dict.fromkeys(tokens)) + "\n")
        tok = transformers.BertTokenizerFast(vocab, do_lower_case=False)
        shutil.rmtree(TOK, ignore_errors=True)
        tok.save_pretrained(TOK)
    os.remove(os.path.join(TOK, "vocab.txt"))
    with open(CASES, "w", encoding="utf-8") as f:
        json.dump(cases(transformers.AutoTokenizer.from_pretrained(TOK)), f, ensure_ascii=False, indent=1)


def cases(tok) -> dict:
    return {"transformers": transformers.__version__, "class": type(tok).__name__,
            "single": [[s, tok(s)["input_ids"]] for s in SENTENCES],
            "pairs": [[a, b, tok(a, b)["input_ids"], tok(a, b)["token_type_ids"]] for a, b in PAIRS]}


def check_tokenizer() -> None:
    with open(CASES, encoding="utf-8") as f:
        want = json.load(f)
    got = cases(transformers.AutoTokenizer.from_pretrained(TOK))
    print("tokenizer.json ids equal:", got["single"] == want["single"] and got["pairs"] == want["pairs"])


if __name__ == "__main__":
    main("--check" in sys.argv)
