"""``bert-of selftest``: check this machine in one command; on a GPU machine, everything CUDA.
(The command line is :mod:`bert_of.selftest.cli`.)

    bert-of selftest [-o REPORT] [--steps 50] [--quick]

Checks, in order (each ``pass`` / ``fail`` / ``skipped`` with its numbers):

  verify      a small BERT written as a Google TF1 checkpoint, run by bert_of (eager + graph) and
              by TF's reference graph: max |diff| <= 1e-5 on cpu, and on cuda when there is one
              (TF32 off: OneFlow enables it for fp32 matmuls by default)
  kernels     the model's CUDA branches (OneFlow's fused layer_norm and fast_gelu) against the CPU
              formulas in float64; on CPU the CPU formulas themselves
  blas        which BLAS runs OneFlow's CPU GEMMs (bert_of.runtime.blas, BERT_OF_BLAS), its GEMM rate
              (GFLOP/s of a 1024^3 matmul) and its result against NumPy in float64 (rel. <= 1e-5)
  amp         ``bert-of align amp``: 50 steps fp32 vs fp16 AMP on cuda (CUDA only)
  throughput  BERT-base, seq 128, pretraining samples/s: fp32 and AMP, eager and graph on one GPU;
              2-GPU global tensors (graph) vs eager DDP when 2 GPUs exist (CUDA only)

Prints one JSON summary on stdout; exit status 1 when any check fails. Without CUDA it says so
(stderr), runs the CPU parts and exits 0 when they pass. On one GPU it takes a few minutes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

import bert_of.runtime.blas as blas
import bert_of.runtime.kernels as kernels
import bert_of.runtime.train_kernels as train_kernels
import bert_of.runtime.oneflow_fix as oneflow_fix
import bert_of.runtime.process as process
from bert_of._flow import flow
from bert_of.align.runner import run_experiments
from bert_of.checkpoint import write_checkpoint
from bert_of.config import BertConfig
from bert_of.converters.convert import convert
from bert_of.converters.verify.compare import verify
from bert_of.files.atomic import atomic_write
from bert_of.files.reading import read_json
from bert_of.heads import BertForPreTraining
from bert_of.launch import Topology, child_env, run_ranks
from bert_of.runtime.kernels import LayerNorm, gelu_erf, gelu_tanh, native_status
from bert_of.options import TrainConfig
from bert_of.training.runtime import Runtime
from bert_of.training.trainer import Trainer

TF32_ENV = "ONEFLOW_EP_CUDA_ENABLE_TF32_EXECUTION"  # read when OneFlow creates a CUDA stream
VERIFY_TOL = 1e-5
KERNEL_TOL = 1e-4  # fp32 fused kernels vs float64 formulas, inputs ~N(0, 1)
BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            max_position_embeddings=512, type_vocab_size=2, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
SEQ, PRED = 128, 20


# --------------------------------------------------------------------------- checks (in this process)


def check_verify(devices: list, work: str) -> dict:
    """A random small BERT -> bert_of checkpoint -> Google TF1 checkpoint (of2tf); verify TF vs bert_of."""
    config = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=96, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu_tanh")
    vocab = os.path.join(work, "vocab.txt")
    atomic_write(vocab, "".join(f"{w}\n" for w in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                                [f"tok{i}" for i in range(115)]))
    model = BertForPreTraining(config)
    model.init_weights(seed=0)
    of_dir, tf_dir = os.path.join(work, "of"), os.path.join(work, "tf")
    write_checkpoint(of_dir, list(model.canonical_state().items()), config, vocab, overwrite=True)
    convert("of2tf", of_dir, tf_dir)
    out = {}
    for device in devices:
        rep = verify(tf_dir, of_dir, tol=VERIFY_TOL, modes=("eager", "graph"), device=device)
        out[device] = {"ok": rep["ok"], "worst": rep["worst"], "reference": rep["reference"],
                       "runs": sorted(rep["max_abs_diff"])}
    return {"status": "pass" if all(v["ok"] for v in out.values()) else "fail", "tolerance": VERIFY_TOL, **out}


def _layer_norm64(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def _gelu_tanh64(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf64(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def check_kernels(devices: list) -> dict:
    """The model's LayerNorm and GELUs on each device (CUDA: OneFlow's fused kernels; CPU inference:
    bert_of's own vectorised GELU kernels when within their bound of float64, ``cpu_gelu``) vs float64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 33, 96)).astype(np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(96)).astype(np.float32)
    b = (0.1 * rng.standard_normal(96)).astype(np.float32)
    want_ln = _layer_norm64(x.astype(np.float64), w, b, 1e-12)
    want_gelu = _gelu_tanh64(x.astype(np.float64))
    want_erf = _gelu_erf64(x.astype(np.float64))
    out, ok = {}, True
    for device in devices:
        ln = LayerNorm(96, eps=1e-12)
        with flow.no_grad():
            ln.weight.copy_(flow.tensor(w))
            ln.bias.copy_(flow.tensor(b))
        ln.to(device)
        t = flow.tensor(x, device=device)
        with flow.no_grad():
            got_ln = ln(t).to("cpu").numpy()
            got_gelu = gelu_tanh(t).to("cpu").numpy()
            got_erf = gelu_erf(t).to("cpu").numpy()
        d = {"layer_norm": float(np.abs(got_ln - want_ln).max()), "gelu_tanh": float(np.abs(got_gelu - want_gelu).max()),
             "gelu_erf": float(np.abs(got_erf - want_erf).max())}
        out[device] = d
        ok = ok and all(v <= KERNEL_TOL for v in d.values())
    return {"status": "pass" if ok else "fail", "tolerance": KERNEL_TOL, "max_abs_diff": out, "cpu_gelu": native_status()}


class _OneLayer(flow.nn.Graph):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def build(self, x):
        return self.layer(x)


def check_graph_launch(launches: int = 2000) -> dict:
    """OneFlow 0.9's graph-launch race guarded (bert_of/runtime/oneflow_fix.py): a small CPU graph run
    ``launches`` times through the guard gives the same output every time."""
    guard = oneflow_fix.status()
    if not guard["active"]:
        return {"status": "fail", "guard": guard}
    g = _OneLayer(flow.nn.Linear(16, 16).eval())
    x = flow.tensor(np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32))
    first = g(x).numpy()
    same = all(np.array_equal(g(x).numpy(), first) for _ in range(launches))
    return {"status": "pass" if same else "fail", "guard": oneflow_fix.status(), "launches": launches}


def check_blas(n: int = 1024, reps: int = 5) -> dict:
    """The BLAS under OneFlow's CPU GEMMs: which, how fast (the median of ``reps`` n^3 matmuls), and
    its result against float64 NumPy."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    x, y = flow.tensor(a), flow.tensor(b)
    got = flow.matmul(x, y).numpy()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        flow.matmul(x, y).numpy()
        times.append(time.perf_counter() - t0)
    want = a.astype(np.float64) @ b.astype(np.float64)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    return {"status": "pass" if rel <= 1e-5 else "fail", **blas.status(), "description": blas.describe(),
            "gflops": round(2 * n ** 3 / sorted(times)[reps // 2] / 1e9, 1), "max_rel_diff": rel}


def check_amp(steps: int, work: str) -> dict:
    """``bert-of align amp`` (fp32 vs AMP on cuda) for ``steps`` steps."""
    summary = run_experiments(["amp"], steps=steps, out=os.path.join(work, "align"), size="small", quiet=True)
    line = summary["experiments"]["amp"]
    return {"status": {"pass": "pass", "skipped": "skipped"}.get(line["status"], "fail"), "steps": steps,
            "report": {k: v for k, v in line.items() if k not in ("json", "png")}}


# --------------------------------------------------------------------------- throughput (worker processes)


def _batch(rows: int, rank: int, world: int, seed: int) -> dict:
    """Synthetic pretraining features of BERT's shapes: this rank's rows of a global batch."""
    r = np.random.default_rng(seed)
    ids = r.integers(1000, BASE["vocab_size"], (rows, SEQ))
    pos = np.sort(np.stack([r.choice(np.arange(1, SEQ - 1), PRED, replace=False) for _ in range(rows)]), axis=1)
    b = dict(input_ids=ids, token_type_ids=(np.arange(SEQ)[None] >= SEQ // 2).repeat(rows, 0).astype(np.int64),
             attention_mask=np.ones((rows, SEQ), np.int64), masked_lm_positions=pos.astype(np.int64),
             masked_lm_ids=r.integers(1000, BASE["vocab_size"], (rows, PRED)),
             masked_lm_weights=np.ones((rows, PRED), np.float32),
             next_sentence_labels=r.integers(0, 2, rows).astype(np.int64))
    lo, hi = rank * rows // world, (rank + 1) * rows // world
    return {k: v[lo:hi] for k, v in b.items()}


def throughput_worker(mode: str, amp: bool, dist: str, batch: int, steps: int, warmup: int, out: str) -> int:
    """One timing run (one process, or one rank of a launch): samples/s over the global batch."""
    model = BertForPreTraining(BertConfig(**BASE))
    model.init_weights(seed=0)
    rt = Runtime.create("cuda", dist=dist)
    trainer = Trainer(model, TrainConfig(mode=mode, amp=amp, lr=1e-4, warmup_steps=10, steps=10000), rt)
    batches = [_batch(batch, rt.rank, rt.world, i) for i in range(2)]
    t0 = time.perf_counter()
    for i in range(warmup):
        trainer.step(batches[i % 2])
    rt.barrier()
    first = time.perf_counter() - t0
    times, losses = [], []
    for i in range(steps):
        ts = time.perf_counter()
        losses.append(float(trainer.step(batches[i % 2])["loss"]))  # a float: the step has finished
        times.append(time.perf_counter() - ts)
    rt.barrier()
    if rt.is_main:
        med = float(np.median(times))
        atomic_write(out, json.dumps({"samples_per_s": round(batch / med, 2), "step_median_s": round(med, 4),
                                      "warmup_s": round(first, 1), "global_batch": batch, "ranks": rt.world,
                                      "loss_first_last": [losses[0], losses[-1]],
                                      "finite": all(math.isfinite(v) for v in losses)}))
    return 0


def _throughput_run(work: str, name: str, mode: str, amp: bool, dist: str, batch: int, steps: int, nproc: int) -> dict:
    out = os.path.join(work, f"tp-{name}.json")
    target = ["-m", "bert_of.selftest.checks", "--worker", mode, "amp" if amp else "fp32", dist, str(batch), str(steps), "3",
              out]
    t0 = time.perf_counter()
    try:
        if nproc > 1:
            run_ranks(target, Topology(nproc))
        else:
            p = subprocess.run([sys.executable, *target], env=child_env(), capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                last = [line for line in p.stderr.splitlines() if line.strip()][-1:] or [f"exit {p.returncode}"]
                return {"status": "fail", "error": last[0][:300]}
        res = read_json(out, "throughput result")
    except Exception as e:  # noqa: BLE001 - one configuration failing is reported, the others run
        return {"status": "fail", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    res["status"] = "pass" if res.get("finite") else "fail"
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def check_throughput(n_gpus: int, steps: int, work: str, tf32: str | None) -> dict:
    """Timing runs in fresh processes, with OneFlow's default TF32 setting (or the user's)."""
    runs = {}
    ours = os.environ.get(TF32_ENV)
    process.set_environ({TF32_ENV: tf32})  # the children's (None: OneFlow's default)
    for mode in ("eager", "graph"):
        for amp in (False, True):
            name = f"{mode}_{'amp' if amp else 'fp32'}"
            runs[name] = _throughput_run(work, name, mode, amp, "none", 32, steps, 1)
    if n_gpus >= 2:
        runs["2gpu_global_graph_fp32"] = _throughput_run(work, "2g", "graph", False, "global", 64, steps, 2)
        runs["2gpu_ddp_eager_fp32"] = _throughput_run(work, "2d", "eager", False, "ddp", 64, steps, 2)
    process.set_environ({TF32_ENV: ours})
    ok = all(r["status"] == "pass" for r in runs.values())
    return {"status": "pass" if ok else "fail", "model": "BERT-base (L12 H768 A12 I3072), seq 128, 20 masked",
            "samples_per_s": {k: r.get("samples_per_s") for k, r in runs.items()}, "runs": runs}


# --------------------------------------------------------------------------- the command


def _run(name: str, fn, *args) -> dict:
    t0 = time.perf_counter()
    try:
        res = fn(*args)
    except Exception as e:  # noqa: BLE001 - a failing check is a result, the others still run
        res = {"status": "fail", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
               "where": traceback.format_exc().splitlines()[-3:]}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"selftest: {name}: {res['status']} ({res['seconds']} s)", file=sys.stderr)
    return res


def selftest(steps: int = 50, quick: bool = False) -> dict:
    """Run the checks; the summary (``ok`` False when a check failed)."""
    tf32 = os.environ.get(TF32_ENV)  # the user's, for the throughput runs
    process.set_environ({TF32_ENV: "0"})  # verify, kernels, amp: fp32 means fp32 (no CUDA stream exists yet)
    kernels.check_again()  # the CPU kernels' first-use checks run here, whatever verdicts were kept
    train_kernels.check_again()
    t0 = time.perf_counter()
    cuda = bool(flow.cuda.is_available())
    n_gpus = flow.cuda.device_count() if cuda else 0
    devices = ["cpu", "cuda"] if cuda else ["cpu"]
    skip = {"status": "skipped", "reason": "CUDA is not available"}
    checks = {}
    with tempfile.TemporaryDirectory(prefix="bert-of-selftest-") as work:
        checks["verify"] = _run("verify", check_verify, devices, work)
        checks["kernels"] = _run("kernels", check_kernels, devices)
        checks["graph_launch"] = _run("graph_launch", check_graph_launch)
        checks["blas"] = _run("blas", check_blas)
        checks["amp"] = _run("amp", check_amp, steps, work) if cuda else skip
        if cuda and not quick:
            checks["throughput"] = _run("throughput", check_throughput, n_gpus, 10, work, tf32)
        else:
            checks["throughput"] = skip if not cuda else {"status": "skipped", "reason": "--quick"}
    return {"cuda": cuda, "gpus": n_gpus, "oneflow": flow.__version__, "checks": checks,
            "ok": all(c["status"] != "fail" for c in checks.values()), "seconds": round(time.perf_counter() - t0, 1)}


if __name__ == "__main__":  # a throughput worker: python -m bert_of.selftest.checks --worker MODE fp32|amp DIST BATCH STEPS WARMUP OUT
    if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 9:
        sys.exit("usage: python -m bert_of.selftest.checks --worker MODE fp32|amp DIST BATCH STEPS WARMUP OUT")
    m, prec, dist, b, n, w, o = sys.argv[2:]
    sys.exit(throughput_worker(m, prec == "amp", dist, int(b), int(n), int(w), o))
