"""tf2of on a BERT-base-shaped checkpoint vs HF transformers' TF route, side by side.

    make bench            (or: .venv/bin/python bench/tf2of_bench.py [--runs 3])

Creates (once, cached in bench/out/) a 110M-parameter BERT-base checkpoint in
Google's layout with TensorFlow's Saver, then alternates runs of
  ours:   bert-of convert tf2of SRC DST
  anchor: transformers BertForPreTraining + load_tf_weights_in_bert + save_pretrained
each in a fresh process, measuring wall time and peak RSS (wait4's ru_maxrss).
Prints one JSON object. Targets (issue 2): ours <= 1/4 of the anchor's wall
time and <= 1/3 of its peak RSS. Also reports forward parity at this size
(bert-of verify: TF reference vs bert_of eager + graph).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
OURS = [os.path.join(ROOT, ".venv", "bin", "bert-of"), "convert", "tf2of"]
ANCHOR_PY = os.path.join(ROOT, ".venv-anchor", "bin", "python")


def run(cmd, env=None):
    """(wall seconds, peak RSS MiB) of one child process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"benchmark command failed: {' '.join(cmd)}\n{err[-2000:]}")
    return wall, ru.ru_maxrss / 1024.0


def ensure_checkpoint(src):
    if os.path.isfile(os.path.join(src, "bert_model.ckpt.index")):
        return
    print("creating a BERT-base checkpoint (once) ...", file=sys.stderr)
    subprocess.run([os.path.join(ROOT, ".venv", "bin", "python"), os.path.join(ROOT, "scripts", "make_tf_checkpoint.py"),
                    src, "--layers", "12", "--hidden", "768", "--heads", "12", "--intermediate", "3072"],
                   check=True, stdout=subprocess.DEVNULL)


def summary(samples):
    walls, rss = [s[0] for s in samples], [s[1] for s in samples]
    return {"wall_s": [round(w, 3) for w in walls], "wall_median_s": round(statistics.median(walls), 3),
            "peak_rss_mib": [round(r, 1) for r in rss], "peak_rss_median_mib": round(statistics.median(rss), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-verify", action="store_true", help="skip the bert-base parity check")
    a = ap.parse_args()
    if not os.path.exists(ANCHOR_PY):
        sys.exit("the anchor environment is missing: run `make bench-env` (Python 3.11 + torch + transformers + TF)")
    src = os.path.join(OUT, "bert-base-tf")
    ensure_checkpoint(src)
    data = os.path.join(src, "bert_model.ckpt.data-00000-of-00001")
    ours_dst, hf_dst = os.path.join(OUT, "ours-of"), os.path.join(OUT, "hf-out")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    ours, anchor = [], []
    for _ in range(a.runs):  # alternate so drift on the machine hits both alike
        shutil.rmtree(ours_dst, ignore_errors=True)
        ours.append(run(OURS + [src, "-o", ours_dst], env))
        shutil.rmtree(hf_dst, ignore_errors=True)
        anchor.append(run([ANCHOR_PY, os.path.join(ROOT, "bench", "hf_tf_route.py"), src, hf_dst], env))
    o, h = summary(ours), summary(anchor)
    result = {
        "benchmark": "tf2of, BERT-base (110M parameters) Google TF1 checkpoint",
        "checkpoint_bytes": os.path.getsize(data),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": a.runs,
        "ours": dict(o, command="bert-of convert tf2of SRC DST"),
        "anchor": dict(h, command="transformers BertForPreTraining + load_tf_weights_in_bert + save_pretrained"),
        "wall_ratio": round(o["wall_median_s"] / h["wall_median_s"], 3),
        "rss_ratio": round(o["peak_rss_median_mib"] / h["peak_rss_median_mib"], 3),
        "targets": {"wall_ratio_max": 0.25, "rss_ratio_max": round(1 / 3, 3)},
    }
    result["targets_met"] = result["wall_ratio"] <= 0.25 and result["rss_ratio"] <= 1 / 3
    if not a.no_verify:
        r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "bert-of"), "verify", src, ours_dst, "--json"],
                           capture_output=True, text=True, env=env)
        rep = json.loads(r.stdout[r.stdout.index("{"):])
        result["parity_bert_base"] = {k: rep[k] for k in ("reference", "max_abs_diff", "worst", "ok",
                                                          "vs_tf-float32", "tf-float32_vs_reference")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
