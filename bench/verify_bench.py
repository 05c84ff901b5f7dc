"""`convert tf2of --verify` on a BERT-base-shaped checkpoint: this checkout against another revision.

    .venv/bin/python bench/verify_bench.py [--base main] [--runs 3]

Creates (once, cached in bench/out/) the 110M-parameter BERT-base checkpoint of tf2of_bench.py,
exports ``--base`` (git archive) to a temporary folder, then alternates runs of
``python -m bert_of.cli convert tf2of SRC -o DST --verify`` under each tree (the same venv, the
tree first on PYTHONPATH), base and ours interleaved so a shared machine's load falls on both
alike. Each run is a fresh process: wall time and peak RSS (wait4's ru_maxrss). Prints one JSON
object: both sides' samples, medians and the ratios ours / base.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
PY = os.path.join(ROOT, ".venv", "bin", "python")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from tf2of_bench import ensure_checkpoint, run, summary  # noqa: E402  (the same checkpoint and timing)


def export(rev: str, dst: str) -> str:
    """``rev``'s tree at ``dst``, laid out as the installed package (converters/ zoo/ eval/ inside bert_of/)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", dst], input=archive, check=True)
    for pkg in ("converters", "zoo", "eval"):
        os.symlink(os.path.join(dst, pkg), os.path.join(dst, "bert_of", pkg))
    return dst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="the revision to compare with (default main)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    src = os.path.join(OUT, "bert-base-tf")
    ensure_checkpoint(src)
    tmp = tempfile.mkdtemp(prefix="verify-bench-")
    try:
        base = os.path.join(tmp, "base")
        os.makedirs(base)
        trees = {"base": export(a.base, base), "ours": ROOT}
        samples = {k: [] for k in trees}
        for i in range(a.runs):
            for side in (("base", "ours") if i % 2 == 0 else ("ours", "base")):
                dst = os.path.join(tmp, f"out-{side}")
                env = dict(os.environ, PYTHONPATH=trees[side], TF_CPP_MIN_LOG_LEVEL="2")
                # --tol: timing is the point here; fp32 MLM logits reach 1e-5 at this size on some CPUs (1.1e-5 seen)
                samples[side].append(run([PY, "-m", "bert_of.cli", "convert", "tf2of", src, "-o", dst, "--verify",
                                          "--tol", "1e-3", "--no-progress", "-q"], env=env))
                shutil.rmtree(dst, ignore_errors=True)
        out = {k: summary(v) for k, v in samples.items()}
        out["base"]["revision"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", a.base], check=True,
                                                 stdout=subprocess.PIPE, text=True).stdout.strip()
        out["ratio_wall"] = round(out["ours"]["wall_median_s"] / out["base"]["wall_median_s"], 3)
        out["ratio_peak_rss"] = round(out["ours"]["peak_rss_median_mib"] / out["base"]["peak_rss_median_mib"], 3)
        out["command"] = "bert-of convert tf2of bert-base-tf -o DST --verify"
        out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
