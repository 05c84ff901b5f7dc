"""What the interop core writes and computes from the repository's fixtures: ``python -m
tests.scripts.core_outputs OUT`` prints {name: sha256} of every file it wrote under OUT and writes
OUT/reference.npz. In one environment (NumPy 1.x, Python 3.10) and another (NumPy 2, the newest
Python) the tables must be equal and the reference's outputs agree (tests/e2e/test_core.py).

Covered: every writable format converted from the tiny HF checkpoint (every file's bytes), the
float64 NumPy reference's outputs in every format's layout, pretraining data (every part file)
and the SQuAD / GLUE scores (what the commands print)."""

import contextlib
import hashlib
import io
import json
import os
import sys

import numpy as np

from bert_of.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_TINY = os.path.join(ROOT, "tests", "data", "hf", "tiny_pt")
TEXT = os.path.join(ROOT, "tests", "data", "text")
SQUAD = os.path.join(ROOT, "tests", "data", "squad")
GLUE = os.path.join(ROOT, "tests", "data", "glue")
FORMATS = ("of", "tf", "h5", "ofsd", "lazy", "libai", "ofmodels")


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tree(d: str, prefix: str) -> dict:
    return {f"{prefix}/{os.path.relpath(os.path.join(r, n), d)}": digest(os.path.join(r, n))
            for r, _, names in os.walk(d) for n in names}


def run(*argv) -> None:
    code = main(["-q", "--no-progress", *map(str, argv)])
    if code:
        raise SystemExit(f"bert-of {' '.join(map(str, argv))}: exit {code}")


def outputs(out: str) -> dict:
    table = {}
    for fmt in FORMATS:
        run("convert", f"hf2{fmt}", HF_TINY, "-o", os.path.join(out, fmt))
        table.update(tree(os.path.join(out, fmt), fmt))
    from bert_of.converters import registry
    from bert_of.converters.verify import compare as verify, reference_forward
    from bert_of.converters.convert import read

    refs = {}
    for fmt in ("hf", *FORMATS):
        source = read(HF_TINY if fmt == "hf" else os.path.join(out, fmt), fmt)
        batch = verify.make_batch(source.config, 3, 12)
        ref = reference_forward.forward(registry.reference_layout(source), batch, source.config.num_attention_heads)
        refs.update({f"{fmt}/{k}": np.asarray(v, np.float64) for k, v in ref.items()})
    np.savez(os.path.join(out, "reference.npz"), **refs)
    data = os.path.join(out, "data")
    run("data", "create-pretraining", "--input", os.path.join(TEXT, "sample_text.txt"), "--vocab",
        os.path.join(TEXT, "vocab.txt"), "--output", data, "--num-parts", 2, "--dupe-factor", 2)
    table.update(tree(data, "data"))
    for name, argv in (("squad", ["squad-score", "--data", os.path.join(SQUAD, "dev-v1.1-mini.json"),
                                  "--predictions", os.path.join(SQUAD, "predictions-v1.1.json")]),
                       ("glue", ["glue-score", "--task", "mnli", "--data", os.path.join(GLUE, "mnli-dev_matched.tsv"),
                                 "--predictions", os.path.join(GLUE, "mnli-m-preds.tsv")])):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            run("eval", *argv, "--no-record")
        table[f"score/{name}"] = hashlib.sha256(printed.getvalue().encode()).hexdigest()
    return table


if __name__ == "__main__":
    with contextlib.redirect_stdout(io.StringIO()):  # what the commands print ("wrote ... in 0.03 s")
        table = outputs(sys.argv[1])
    print(json.dumps(table, indent=1, sort_keys=True))
