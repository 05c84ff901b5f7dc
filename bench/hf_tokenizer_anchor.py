"""The anchor side of bench/hf_tokenizer_check.py, run in the anchor environment (transformers):

    .venv-anchor/bin/python bench/hf_tokenizer_anchor.py HF_DIR TEXTS.json OUT.npz

Loads HF_DIR with AutoTokenizer and AutoModel, exactly as a transformers user would, and saves for
every text its WordPieces, input ids and the model's last_hidden_state / pooler_output.
"""

import json
import sys

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer


def main():
    hf_dir, texts_path, out = sys.argv[1:4]
    texts = json.load(open(texts_path))
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModel.from_pretrained(hf_dir).eval()
    result = {"tokenizer_class": type(tok).__name__, "do_lower_case": bool(getattr(tok, "do_lower_case", None))}
    arrays = {}
    with torch.no_grad():
        for i, text in enumerate(texts):
            enc = tok(text, return_tensors="pt")
            out_ = model(**enc)
            arrays[f"ids_{i}"] = enc["input_ids"][0].numpy()
            arrays[f"tokens_{i}"] = np.array(tok.convert_ids_to_tokens(enc["input_ids"][0]), dtype=object).astype(str)
            arrays[f"sequence_{i}"] = out_.last_hidden_state[0].numpy()
            arrays[f"pooled_{i}"] = out_.pooler_output[0].numpy()
    np.savez(out, meta=np.array(json.dumps(result)), **arrays)


if __name__ == "__main__":
    main()
