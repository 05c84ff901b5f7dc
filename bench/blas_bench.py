"""The BLAS under OneFlow's CPU GEMMs (bert_of/runtime/blas.py): each BERT_OF_BLAS choice beside torch.

    .venv/bin/python bench/blas_bench.py [--rounds 3] [--mkl PATH/libmkl_rt.so.3] [--out bench/results/blas.json]

Each row is a fresh process: a GEMM [1536, 768] x [768, 3072] (BERT-base's FFN up at 4 x 384
tokens; OneFlow's ``flow.matmul`` or torch's ``matmul``, median of 7 after a warm-up) and a
4-layer BERT-base forward at 4 x 384 tokens (bert_of's ``BertModel`` or transformers'
``BertModel``, no grad, median of 3). Rows: OneFlow's own OpenBLAS as it detects the CPU
(``exact``) and with its AVX2/FMA kernels (``oneflow``, bert_of before), OpenBLAS from
scipy-openblas32 on 1 and 2 threads, the same with OpenBLAS's default spinning idle threads
(``OPENBLAS_THREAD_TIMEOUT=28``), MKL when ``--mkl`` names it, and torch 2.13 on 1 and 2 threads
(.venv-anchor). Rounds interleave the rows; the 1-minute load average must be below --max-load
before each round (waited for, and recorded).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OF_PY = os.path.join(ROOT, ".venv", "bin", "python")
HF_PY = os.path.join(ROOT, ".venv-anchor", "bin", "python")
M, K, N = 1536, 768, 3072
CFG = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072,
           max_position_embeddings=512, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _median_time(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(fw: str, threads: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    ids = rng.integers(0, CFG["vocab_size"], (4, 384))
    if fw == "torch":
        import torch
        import transformers

        torch.set_num_threads(threads)
        x, y = torch.from_numpy(a), torch.from_numpy(b)
        gemm = _median_time(lambda: torch.matmul(x, y), 7)
        model = transformers.BertModel(transformers.BertConfig(**CFG, hidden_act="gelu_new")).eval()
        t = torch.from_numpy(ids)
        with torch.inference_mode():
            fwd = _median_time(lambda: model(t)[0], 3)
        return {"gemm_ms": round(gemm * 1e3, 1), "forward_s": round(fwd, 3), "blas": f"torch {torch.__version__}",
                "threads": threads}
    sys.path.insert(0, ROOT)
    from bert_of._flow import flow
    import bert_of.runtime.blas as blas
    from bert_of.config import BertConfig
    from bert_of.modeling import BertModel

    x, y = flow.tensor(a), flow.tensor(b)
    gemm = _median_time(lambda: flow.matmul(x, y).numpy(), 7)
    model = BertModel(BertConfig(**CFG)).eval()
    t = flow.tensor(ids, dtype=flow.int64)
    with flow.no_grad():
        fwd = _median_time(lambda: model(t)[0].numpy(), 3)
    return {"gemm_ms": round(gemm * 1e3, 1), "forward_s": round(fwd, 3), "blas": blas.describe(), **blas.status()}


ROWS = {  # name -> (python, framework, env)
    "oneflow exact (detected kernels)": (OF_PY, "oneflow", {"BERT_OF_BLAS": "exact"}),
    "oneflow own (AVX2/FMA, bert_of before)": (OF_PY, "oneflow", {"BERT_OF_BLAS": "oneflow"}),
    "openblas 1 thread": (OF_PY, "oneflow", {"BERT_OF_BLAS": "openblas", "BERT_OF_BLAS_THREADS": "1"}),
    "openblas 2 threads (auto)": (OF_PY, "oneflow", {"BERT_OF_BLAS": "auto"}),
    "openblas 2 threads, spinning idle threads": (OF_PY, "oneflow", {"BERT_OF_BLAS": "openblas",
                                                                     "OPENBLAS_THREAD_TIMEOUT": "28"}),
    "torch 1 thread": (HF_PY, "torch", {"THREADS": "1"}),
    "torch 2 threads": (HF_PY, "torch", {"THREADS": "2"}),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mkl", help="libmkl_rt.so.* to add an MKL row (BERT_OF_BLAS=PATH)")
    ap.add_argument("--max-load", type=float, default=0.5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "blas.json"))
    ap.add_argument("--worker", nargs=2, metavar=("FW", "THREADS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], int(a.worker[1]))))
        return
    rows = dict(ROWS)
    if a.mkl:
        rows["mkl 2 threads"] = (OF_PY, "oneflow", {"BERT_OF_BLAS": a.mkl})
    if not os.path.exists(HF_PY):
        rows = {k: v for k, v in rows.items() if v[1] != "torch"}
        print("no .venv-anchor: torch rows skipped (`make bench-env`)", file=sys.stderr)
    results, loads = {k: [] for k in rows}, []
    t_start = time.time()
    for rnd in range(a.rounds):
        t0 = time.time()
        while os.getloadavg()[0] >= a.max_load and time.time() - t0 < 300:
            time.sleep(5)
        loads.append({"round": rnd, "load_at_start": round(os.getloadavg()[0], 2), "waited_s": round(time.time() - t0)})
        for name, (py, fw, extra) in rows.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith(("BERT_OF_BLAS", "OPENBLAS_", "MKL_", "KMP_"))}
            env.update({k: v for k, v in extra.items() if k != "THREADS"})
            p = subprocess.run([py, os.path.abspath(__file__), "--worker", fw, extra.get("THREADS", "0")], env=env,
                               capture_output=True, text=True, timeout=1800, cwd=ROOT)
            if p.returncode != 0:
                sys.exit(f"{name}: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            r = json.loads(p.stdout.splitlines()[-1])
            results[name].append(r)
            print(f"[{rnd + 1}/{a.rounds}] {name:44s} gemm {r['gemm_ms']:7.1f} ms  forward {r['forward_s']:6.3f} s",
                  file=sys.stderr, flush=True)
    summary = {}
    for name, rs in results.items():
        gemm = statistics.median(r["gemm_ms"] for r in rs)
        summary[name] = {"gemm_ms": gemm, "gemm_gflops": round(2 * M * K * N / gemm / 1e6, 1),
                         "forward_s": statistics.median(r["forward_s"] for r in rs),
                         "blas": rs[0]["blas"], "runs": rs}
    anchor = summary.get("torch 2 threads")
    for s in summary.values():
        if anchor:
            s["forward_vs_torch_2t"] = round(anchor["forward_s"] / s["forward_s"], 3)
            s["gemm_vs_torch_2t"] = round(anchor["gemm_ms"] / s["gemm_ms"], 3)
    res = {"bench": "blas", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "command": " ".join(["bench/blas_bench.py"] + sys.argv[1:]), "gemm": [M, K, N],
           "forward": "BertModel 4 x 768 (12 heads, I 3072), batch 4 x 384, no grad", "rounds": a.rounds,
           "loads": loads, "minutes": round((time.time() - t_start) / 60, 1),
           "speed_vs_torch": "torch 2 threads' time / this row's time (> 1: faster than torch)", "rows": summary}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for name, s in summary.items():
        print(f"| {name} | {s['gemm_ms']} | {s['gemm_gflops']} | {s['forward_s']} | "
              f"{s.get('forward_vs_torch_2t', '-')} |")


if __name__ == "__main__":
    main()
