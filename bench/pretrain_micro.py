"""Two facts behind the pretraining profile, measured: GEMM speed and the 2-rank all-reduce.

    .venv/bin/python bench/pretrain_micro.py [--out bench/results/pretrain_micro.json]

- GEMM: one [2048, 1024] @ [1024, 256] fp32 matmul (an FFN-out forward at the benchmark's
  batch 16 x seq 128), best of 10, in OneFlow 0.9 with OpenBLAS's detected kernels
  (BERT_OF_BLAS=exact) and with its Haswell kernels (BERT_OF_BLAS=auto, what `bert-of pretrain`
  uses), and in PyTorch (MKL) on 1 and 2 threads (.venv-anchor). Each in a fresh process.
- all-reduce: flow.comm.all_reduce of 11.2M fp32 (the benchmark model's gradients, 45 MB) over
  2 CPU ranks (python -m oneflow.distributed.launch), best of 5.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OF_PY = os.path.join(ROOT, ".venv", "bin", "python")
PT_PY = os.path.join(ROOT, ".venv-anchor", "bin", "python")
M, K, N = 2048, 1024, 256
GRAD_ELEMENTS = 11_200_000


def best_ms(fn, reps):
    fn()
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(min(times) * 1000, 2)


def worker_matmul_oneflow():
    sys.path.insert(0, ROOT)
    from bert_of._flow import flow

    a, b = flow.randn(M, K), flow.randn(K, N)
    return {"ms": best_ms(lambda: flow.matmul(a, b).numpy(), 10),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "(detected)")}


def worker_matmul_torch(threads):
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(M, K), torch.randn(K, N)
    return {"ms": best_ms(lambda: a @ b, 10), "threads": threads}


def worker_allreduce(out):
    sys.path.insert(0, ROOT)
    from bert_of._flow import flow

    t = flow.ones(GRAD_ELEMENTS)

    def once():
        flow.comm.all_reduce(t)
        t.numpy()

    flow.comm.barrier()
    ms = best_ms(once, 5)
    if flow.env.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"ms": ms, "megabytes": GRAD_ELEMENTS * 4 / 1e6, "ranks": flow.env.get_world_size()}, f)


def run(cmd, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "BERT_OF_BLAS", "OMP_NUM_THREADS")}
    env.update(env_extra or {})
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("of-matmul", "pt-matmul", "allreduce"), help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.worker == "of-matmul":
        print(json.dumps(worker_matmul_oneflow()))
        return
    if a.worker == "pt-matmul":
        print(json.dumps(worker_matmul_torch(a.threads)))
        return
    if a.worker == "allreduce":
        worker_allreduce(a.out)
        return

    me = os.path.abspath(__file__)
    gflop = 2 * M * K * N / 1e9
    res = {"matmul_shape": [[M, K], [K, N]], "gflop": round(gflop, 3), "matmul": {}}
    for name, cmd, extra in (
            ("oneflow, BERT_OF_BLAS=exact", [OF_PY, me, "--worker", "of-matmul"], {"BERT_OF_BLAS": "exact"}),
            ("oneflow, BERT_OF_BLAS=auto", [OF_PY, me, "--worker", "of-matmul"], {"BERT_OF_BLAS": "auto"}),
            ("pytorch, 1 thread", [PT_PY, me, "--worker", "pt-matmul", "--threads", "1"], {}),
            ("pytorch, 2 threads", [PT_PY, me, "--worker", "pt-matmul", "--threads", "2"], {})):
        if cmd[0] == PT_PY and not os.path.exists(PT_PY):
            continue
        r = run(cmd, extra)
        r["gflop_per_s"] = round(gflop / (r["ms"] / 1000), 1)
        res["matmul"][name] = r
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = os.path.join(ROOT, "bench", f".allreduce-{os.getpid()}.json")
    subprocess.run([OF_PY, "-m", "oneflow.distributed.launch", "--nproc_per_node", "2", "--master_port", str(port),
                    me, "--worker", "allreduce", "--out", tmp], cwd=ROOT, capture_output=True, text=True,
                   timeout=600, check=True)
    with open(tmp) as f:
        res["allreduce"] = json.load(f)
    os.remove(tmp)
    res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
