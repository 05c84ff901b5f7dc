"""transformers' own BERT (PyTorch) on an HF checkpoint: verify's ecosystem run for ``hf`` sources.

Beside the NumPy reference, ``verify`` runs the checkpoint through the code its users run:
``transformers.BertModel`` and the head classes its tensors call for, loaded with
``from_pretrained(..., use_safetensors=True)`` (a pickled ``pytorch_model.bin`` is never handed
to ``torch.load``), eager attention, in float64 or float32. Outputs are named as bert_of's:
sequence_output [B, S, H], pooled_output [B, H], prediction_logits [B, S, V],
seq_relationship_logits [B, 2], start_logits / end_logits [B, S], logits ([B, L] or [B, S, L]).

This file imports only NumPy and safetensors at its top, so any interpreter that has torch and transformers can
run it as a script (``python hf_torch.py MODEL_DIR IN.npz OUT.npz DTYPE``): ``verify
--torch-python`` uses that when this process has no torch (OneFlow's last wheel is Python 3.10;
a CPU torch wheel may exist only for another Python).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open

WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def weight_names(model_dir: str):
    """The tensor names of ``model_dir``'s safetensors weights (one file or a sharded index), or
    None when it has none (only a pickled pytorch_model.bin, which this run does not load)."""
    if os.path.isfile(os.path.join(model_dir, WEIGHTS)):
        with safe_open(os.path.join(model_dir, WEIGHTS), "np") as f:
            return list(f.keys())
    if os.path.isfile(os.path.join(model_dir, WEIGHTS_INDEX)):
        with open(os.path.join(model_dir, WEIGHTS_INDEX), encoding="utf-8") as f:
            return list(json.load(f)["weight_map"])
    return None


def importable() -> bool:
    """True when this interpreter has torch and transformers."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _has(keys, *prefixes) -> bool:
    return any(k.startswith(p) or k.startswith("bert." + p) for k in keys for p in prefixes)


def forward(model_dir: str, batches: dict, dtype: str = "float64") -> dict:
    """{batch name: {output: np.ndarray}} of transformers' BERT on ``model_dir``'s safetensors."""
    import torch
    import transformers as tr

    keys = weight_names(model_dir)
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        arch = (json.load(f).get("architectures") or [""])[0]
    pooler = _has(keys, "pooler.")
    kinds = [(tr.BertModel, {"add_pooling_layer": pooler}, lambda o: {
        "sequence_output": o.last_hidden_state, **({"pooled_output": o.pooler_output} if pooler else {})})]
    if _has(keys, "cls.predictions."):
        if _has(keys, "cls.seq_relationship.") and pooler:
            kinds.append((tr.BertForPreTraining, {}, lambda o: {
                "prediction_logits": o.prediction_logits, "seq_relationship_logits": o.seq_relationship_logits}))
        else:
            kinds.append((tr.BertForMaskedLM, {}, lambda o: {"prediction_logits": o.logits}))
    if _has(keys, "qa_outputs."):
        kinds.append((tr.BertForQuestionAnswering, {}, lambda o: {"start_logits": o.start_logits,
                                                                  "end_logits": o.end_logits}))
    if _has(keys, "classifier."):
        cls = tr.BertForTokenClassification if arch == "BertForTokenClassification" else \
            tr.BertForSequenceClassification
        kinds.append((cls, {}, lambda o: {"logits": o.logits}))
    torch_dtype = {"float64": torch.float64, "float32": torch.float32}[dtype]
    out = {name: {} for name in batches}
    for cls, kw, pick in kinds:
        model = cls.from_pretrained(model_dir, use_safetensors=True, attn_implementation="eager", **kw)
        model = model.to(torch_dtype).eval()
        with torch.no_grad():
            for name, batch in batches.items():
                args = {k: torch.from_numpy(np.ascontiguousarray(batch[k], np.int64)) for k in INPUTS}
                out[name].update({k: v.numpy() for k, v in pick(model(**args)).items()})
        del model
    return out


def forward_in(python: str, model_dir: str, batches: dict, dtype: str = "float64") -> dict:
    """:func:`forward` run by another interpreter ``python`` (one that has torch and transformers)."""
    with tempfile.TemporaryDirectory(prefix="bert_of-hf-torch-") as tmp:
        src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(src, **{f"{b}/{k}": v for b, batch in batches.items() for k, v in batch.items()})
        r = subprocess.run([python, os.path.abspath(__file__), model_dir, src, dst, dtype],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            raise RuntimeError(f"{python}: {last}")
        out = {b: {} for b in batches}
        with np.load(dst, allow_pickle=False) as z:
            for key in z.files:
                b, _, k = key.partition("/")
                out[b][k] = z[key]
        return out


def _main(argv) -> int:
    model_dir, src, dst, dtype = argv
    batches = {}
    with np.load(src, allow_pickle=False) as z:
        for key in z.files:
            b, _, k = key.partition("/")
            batches.setdefault(b, {})[k] = z[key]
    out = forward(model_dir, batches, dtype)
    np.savez(dst, **{f"{b}/{k}": v for b, o in out.items() for k, v in o.items()})
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
