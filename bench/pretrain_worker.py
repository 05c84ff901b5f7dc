"""One bert_of pretraining timing run (one configuration, one fresh process or one launch).

    .venv/bin/python bench/pretrain_worker.py --mode graph --steps 20 --warmup 3 --out r.json
    .venv/bin/python -m oneflow.distributed.launch --nproc_per_node 2 bench/pretrain_worker.py \
        --mode graph --way global --global-batch 16 --out r.json

Trains bert_of's BertForPreTraining with bert_of.training.Trainer (AdamW, Google's
loss, weight decay with excludes, clip 1.0, dropout 0.1 on: a real pretraining step)
on synthetic batches of the benchmark's shape, warms up (graph compile included),
then times ``--steps`` steps. Writes one JSON object (rank 0): samples/s over the
global batch, per-step times, compile/warm-up time, and what the process used
(OMP_NUM_THREADS, threads, CPU seconds / wall seconds over the timed steps).
Used by bench/pretrain_bench.py; the shapes live there (CONFIG, SEQ, PRED).
"""

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from threads import by_role, thread_cpu, thread_roles  # noqa: E402

# The benchmark's model: 4 layers, hidden 256, 4 heads, intermediate 1024, BERT vocab.
CONFIG = dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
              max_position_embeddings=512, type_vocab_size=2, hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1)
SEQ, PRED = 128, 20
TRAIN = dict(optimizer="adamw", lr=1e-4, warmup_steps=10, steps=10000, weight_decay=0.01, clip_grad_norm=1.0)
N_BATCHES = 4  # distinct synthetic batches cycled through
EXPERIMENTS = ("graph:allow_fuse_add_to_output", "graph:allow_fuse_model_update_ops",
               "graph:enable_multi_tensor_update", "graph:allow_fuse_cast_scale", "graph:enable_straighten_algorithm")


def make_batch(i: int, batch: int, vocab: int = CONFIG["vocab_size"]) -> dict:
    """Synthetic pretraining features: two segments, some padding, PRED masked positions
    (the last few padded with weight 0 on some rows, as create_pretraining_data leaves them)."""
    r = np.random.default_rng(100 + i)
    lens = r.integers(SEQ // 2, SEQ + 1, batch)
    mask = (np.arange(SEQ)[None] < lens[:, None]).astype(np.int64)
    seg = (np.arange(SEQ)[None] >= (lens[:, None] // 2)).astype(np.int64) * mask
    ids = r.integers(1000, vocab, (batch, SEQ)) * mask
    pos = np.stack([np.sort(r.choice(np.arange(1, int(n) - 1), PRED, replace=False)) for n in lens])
    w = np.ones((batch, PRED), np.float32)
    w[::3, -2:] = 0.0
    return dict(input_ids=ids.astype(np.int64), token_type_ids=seg, attention_mask=mask,
                masked_lm_positions=pos.astype(np.int64), masked_lm_ids=r.integers(1000, vocab, (batch, PRED)),
                masked_lm_weights=w, next_sentence_labels=r.integers(0, 2, batch).astype(np.int64))


def threads_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("eager", "graph"), required=True)
    ap.add_argument("--way", choices=("single", "global", "ddp"), default="single",
                    help="single process; 2+ ranks with global tensors (eager or graph) or eager DDP")
    ap.add_argument("--global-batch", type=int, default=16, help="rows per step over all ranks")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--experiment", action="append", default=[], choices=EXPERIMENTS,
                    help="an nn.Graph config switch bert_of does not set (repeatable)")
    ap.add_argument("--thread-report", action="store_true",
                    help="per-thread CPU seconds of the timed steps by OneFlow thread role (gdb snapshot)")
    ap.add_argument("--nice-scheduler", type=int, default=None, metavar="N",
                    help="experiment: after warm-up, nice the VM scheduler thread (found by gdb) to N (20: SCHED_IDLE)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    t_import = time.perf_counter()
    from bert_of._flow import flow
    from bert_of.config import BertConfig
    from bert_of.heads import BertForPreTraining
    from bert_of.training import Runtime, Trainer, TrainConfig

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    flow.manual_seed(0)  # dropout masks
    if a.way == "single" and world != 1:
        sys.exit("--way single runs in one process")
    model = BertForPreTraining(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    runtime = Runtime.create("cpu", dist={"global": "global", "ddp": "ddp"}.get(a.way, "none"))
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode=a.mode)), runtime)
    for opt in a.experiment:  # nn.Graph config switches, set before the first call compiles the graph
        if opt.startswith("graph:"):
            if trainer.graph is None:
                sys.exit(f"--experiment {opt} needs --mode graph")
            getattr(trainer.graph.config, opt.split(":", 1)[1])(True)
    n = a.global_batch
    batches = []
    for i in range(N_BATCHES):
        b = make_batch(i, n)
        batches.append({k: v[rank * n // world:(rank + 1) * n // world] for k, v in b.items()})  # this rank's rows

    def barrier():
        if world > 1:
            flow.comm.barrier()

    barrier()
    t0 = time.perf_counter()
    first = None
    for i in range(a.warmup):
        trainer.step(batches[i % N_BATCHES])
        if first is None:
            first = time.perf_counter() - t0  # graph: includes compilation
    barrier()
    warm = time.perf_counter() - t0
    roles = thread_roles(os.getpid()) if a.thread_report or a.nice_scheduler is not None else {}
    if a.nice_scheduler is not None:
        for tid, role in roles.items():
            if role == "vm-scheduler":
                if a.nice_scheduler >= 20:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                else:
                    os.setpriority(os.PRIO_PROCESS, tid, a.nice_scheduler)
    barrier()

    times, losses = [], []
    tc0 = thread_cpu()
    ru0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(a.steps):
        ts = time.perf_counter()
        out = trainer.step(batches[(a.warmup + i) % N_BATCHES])  # returns floats: the step is finished
        times.append(time.perf_counter() - ts)
        losses.append(out["loss"])
    barrier()
    wall = time.perf_counter() - c0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    tc1 = thread_cpu()
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    used = {"rank": rank, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "os_threads": threads_now(),
            "cpu_s_per_wall_s": round(cpu / wall, 2), "cpu_s_per_step": round(cpu / a.steps, 3),
            "affinity": sorted(os.sched_getaffinity(0))}
    if a.thread_report:
        used["cpu_s_per_step_by_thread_role"] = {k: round(v / a.steps, 3) for k, v in by_role(tc0, tc1, roles).items()}
    # Gather each rank's usage on rank 0 (small: through a file next to --out).
    if world > 1:
        with open(f"{a.out}.rank{rank}", "w") as f:
            json.dump(used, f)
        barrier()
    if rank == 0:
        per_rank = [used]
        for r in range(1, world):
            with open(f"{a.out}.rank{r}") as f:
                per_rank.append(json.load(f))
            os.remove(f"{a.out}.rank{r}")
        res = {"framework": "oneflow", "mode": a.mode, "experiments": a.experiment, "way": a.way, "ranks": world, "global_batch": n,
               "rows_per_rank": n // world, "steps": a.steps, "warmup": a.warmup,
               "samples_per_s": round(n * a.steps / wall, 3), "step_s": [round(t, 4) for t in times],
               "step_median_s": round(float(np.median(times)), 4), "first_step_s": round(first, 2),
               "warmup_s": round(warm, 2), "startup_s": round(t0 - t_import, 2), "loss_first_last": [losses[0], losses[-1]],
               "used": per_rank, "blas": __import__("bert_of.runtime.blas").blas.status()}
        with open(a.out, "w") as f:
            json.dump(res, f)
    barrier()


if __name__ == "__main__":
    main()
