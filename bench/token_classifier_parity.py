"""transformers' BertForTokenClassification vs bert_of after ``convert hf2of``, on the same ids.

    .venv/bin/python bench/token_classifier_parity.py [--out bench/results/token_classifier_parity.json]

The transformers side runs in .venv-anchor (``make bench-env``: torch + transformers), in a child
process of this script (``--hf-side``): a small random BertForTokenClassification with named labels
is saved with ``save_pretrained`` (safetensors) and run on fixed ids (torch float32, eval mode).
Then ``bert-of convert hf2of`` reads it, bert_of's BertForTokenClassification (OneFlow, float32)
runs the same ids, ``bert-of convert of2hf`` writes it back and transformers loads that
(``from_pretrained``: no missing or unexpected keys) and runs it once more. Prints one JSON
object: the max |diff| of the logits at the real (unpadded) tokens, and the label names each side
reports.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHOR_PY = os.path.join(ROOT, ".venv-anchor", "bin", "python")
OURS = os.path.join(ROOT, ".venv", "bin", "bert-of")
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
SEED = 0


def batch(vocab: int, B: int = 4, S: int = 24):
    """Fixed ids [B, S], token types and a mask with padded rows."""
    rng = np.random.default_rng(SEED)
    ids = rng.integers(5, vocab, (B, S))
    mask = np.ones((B, S), np.int64)
    for i, n in enumerate((S, S - 5, S - 11, 7)[:B]):
        mask[i, n:] = 0
    types = np.zeros((B, S), np.int64)
    types[:, S // 2:] = 1
    return {"input_ids": ids.astype(np.int64), "token_type_ids": types, "attention_mask": mask}


def hf_side(work: str, mode: str) -> None:
    """In .venv-anchor: ``build`` saves a random model to work/hf; ``run`` runs work/<dir> (both
    write their logits and label names into work)."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    torch.manual_seed(SEED)
    inputs = dict(np.load(os.path.join(work, "inputs.npz")))
    if mode == "build":
        cfg = BertConfig(vocab_size=211, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                         intermediate_size=96, max_position_embeddings=64, type_vocab_size=2,
                         id2label=dict(enumerate(LABELS)), label2id={k: i for i, k in enumerate(LABELS)})
        model = BertForTokenClassification(cfg)
        with torch.no_grad():  # realistic, non-zero biases and LayerNorms (fresh ones are 0 / 1)
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        model.save_pretrained(os.path.join(work, "hf"), safe_serialization=True)
        src = "hf"
    else:
        src = mode
    model, info = BertForTokenClassification.from_pretrained(os.path.join(work, src), output_loading_info=True)
    model.eval()
    with torch.no_grad():
        logits = model(**{k: torch.tensor(v) for k, v in inputs.items()}).logits.numpy()
    np.save(os.path.join(work, f"logits_{src}.npy"), logits)
    with open(os.path.join(work, f"info_{src}.json"), "w") as f:
        json.dump({"id2label": {str(k): v for k, v in model.config.id2label.items()},
                   "architectures": model.config.architectures,
                   "loading": {k: sorted(map(str, v)) for k, v in info.items()},
                   "torch": torch.__version__, "transformers": __import__("transformers").__version__}, f)


def bert_of_logits(path: str, inputs: dict) -> tuple:
    from bert_of._flow import flow
    from bert_of.heads import BertForTokenClassification

    model = BertForTokenClassification.from_pretrained(path)
    with flow.no_grad():
        out = model(*(flow.tensor(inputs[k], dtype=flow.int64)
                      for k in ("input_ids", "token_type_ids", "attention_mask")))
    return out.logits.numpy(), model.config


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "token_classifier_parity.json"))
    ap.add_argument("--hf-side", nargs=2, metavar=("WORK", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hf_side:
        return hf_side(*a.hf_side)
    if not os.path.isfile(ANCHOR_PY):
        sys.exit("no .venv-anchor (torch + transformers): make bench-env")
    work = tempfile.mkdtemp(prefix="tokclf-")
    try:
        inputs = batch(211)
        np.savez(os.path.join(work, "inputs.npz"), **inputs)
        anchor = [ANCHOR_PY, os.path.abspath(__file__), "--hf-side", work]
        subprocess.run(anchor + ["build"], check=True)
        conv = subprocess.run([OURS, "convert", "hf2of", os.path.join(work, "hf"), "-o", os.path.join(work, "of"),
                               "--vocab", _vocab(work), "--verify"], check=True, capture_output=True, text=True)
        verify = json.loads(conv.stdout[conv.stdout.index("{"):])
        ours, config = bert_of_logits(os.path.join(work, "of"), inputs)
        subprocess.run([OURS, "convert", "of2hf", os.path.join(work, "of"), "-o", os.path.join(work, "back")],
                       check=True, capture_output=True)
        subprocess.run(anchor + ["back"], check=True)
        hf = np.load(os.path.join(work, "logits_hf.npy"))
        back = np.load(os.path.join(work, "logits_back.npy"))
        info = json.load(open(os.path.join(work, "info_back.json")))
        real = inputs["attention_mask"].astype(bool)
        report = {
            "model": {"layers": 3, "hidden": 64, "heads": 4, "labels": len(LABELS), "batch": list(real.shape),
                      "real_tokens": int(real.sum())},
            "versions": {"torch": info["torch"], "transformers": info["transformers"]},
            "logits_shape": {"transformers": list(hf.shape), "bert_of": list(ours.shape)},
            "max_abs_diff_logits": {
                "bert_of_vs_transformers": float(np.abs(ours[real] - hf[real]).max()),
                "transformers_after_of2hf_vs_before": float(np.abs(back[real] - hf[real]).max()),
            },
            "verify_numpy_float64": {"ok": verify["ok"], "worst": verify["worst"],
                                     "logits": verify["max_abs_diff"]["B:eager"].get("logits")},
            "bert_of_config": {"classifier_kind": config.classifier_kind,
                               "id2label": {str(k): v for k, v in config.id2label.items()}},
            "after_of2hf": {"architectures": info["architectures"], "id2label": info["id2label"],
                            "loading": info["loading"]},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=2)
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text + "\n")


def _vocab(work: str) -> str:
    """A vocab.txt of the model's size (save_pretrained of a model writes none; bert_of keeps one)."""
    path = os.path.join(work, "vocab.txt")
    with open(path, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(206)]) + "\n")
    return path


if __name__ == "__main__":
    main()
