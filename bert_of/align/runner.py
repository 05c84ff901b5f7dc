"""Running the suite's training runs: one run from its spec (on the trainer's public API), worker
processes, 2-rank launches, the cache of finished runs; and ``run_experiments`` (plan, run, report)."""

from __future__ import annotations

import hashlib
import inspect
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from importlib import metadata, util

import numpy as np

from bert_of._flow import flow
from bert_of.align.data import (DEFAULT_CORPUS, DEFAULT_VOCAB, AlignError, BatchStream, _atomic_json, _log,
                                _rename_batch, prepare_data)
from bert_of.align.plans import BATCH, BY_NAME, SIZES, Ctx, _perturb, _run_key, resolve_experiments
from bert_of.align.report import _report, _run_cpu, _summary_line, plot_report, plot_skipped, summary_markdown
from bert_of.checkpoint import load_checkpoint
from bert_of.config import BertConfig
from bert_of.converters.verify.ecosystems import tf_reference_module
from bert_of.files.atomic import atomic_write
from bert_of.files.reading import read_json
from bert_of.heads import BertForPreTraining
from bert_of.launch import Topology, run_ranks, spawn
from bert_of.options import TrainConfig
from bert_of.training.runtime import Runtime
from bert_of.training.trainer import Trainer, state_names


# --------------------------------------------------------------------------- one run


def _load_optimizer_state(trainer, ckpt_dir):
    """Adam m / v of a converted checkpoint into the trainer; not its step: the run's schedule
    starts afresh (see experiment 7)."""
    ck = load_checkpoint(ckpt_dir, with_optimizer=True)
    if not ck.optimizer:
        raise AlignError(f"{ckpt_dir}: no optimizer.safetensors (convert with --with-optimizer)")
    names = list(state_names(trainer.model).values())
    missing = [n for n in names if f"m/{n}" not in ck.optimizer or f"v/{n}" not in ck.optimizer]
    if missing:
        raise AlignError(f"{ckpt_dir}: optimizer state lacks {missing[0]}")
    trainer.load_optimizer_state({f"{s}/{n}": ck.optimizer[f"{s}/{n}"] for n in names for s in ("m", "v")})


def _nudge(model, rel: float) -> None:
    """Multiply every parameter by (1 + rel * N(0, 1)), seeded: how far does the run move?"""
    rng = np.random.default_rng(0)
    with flow.no_grad():
        for p in model.parameters():
            noise = (1.0 + rel * rng.standard_normal(tuple(p.shape))).astype(np.float32)
            p.copy_(p * flow.tensor(noise))


def _tf_reference_run(spec: dict) -> dict:
    """Google's training in TF (bert_of/align/tf_reference_train.py) on the run's batches."""
    train_reference = tf_reference_module("bert_of.align.tf_reference_train", "align's TF experiment").train_reference

    t0, c0 = time.perf_counter(), time.process_time()
    stream = BatchStream(spec["data"])
    batches = [stream.next() for _ in range(spec["steps"])]
    stream.close()
    res = train_reference(spec["prefix"], spec["config"], batches, init_lr=spec["init_lr"],
                          num_train_steps=spec["total_steps"], num_warmup_steps=spec["warmup_steps"])
    res["seconds"], res["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    return res


def execute_run(spec: dict, rank: int = 0, world: int = 1) -> dict:
    """Train as ``spec`` says; per-step numbers of this process (the global loss on every rank)."""
    if spec.get("kind") == "tf-reference":
        return _tf_reference_run(spec)
    t0, c0 = time.perf_counter(), time.process_time()
    init = spec.get("init") or {"kind": "seed", "seed": 0}
    if init["kind"] == "checkpoint":
        model = BertForPreTraining.from_pretrained(init["path"])
    else:
        model = BertForPreTraining(BertConfig(**spec["model"]))
        model.init_weights(seed=init.get("seed", 0))
    dist, device = spec.get("dist", "none"), spec.get("device", "cpu")
    rt = Runtime.create(device, dist="global" if device != "cpu" else dist)
    variant = spec.get("variant") or {}
    naive = variant.get("ddp_local_denominator")  # naive DDP: each rank's MLM loss over its OWN weight sum
    trainer = Trainer(model, TrainConfig(**spec["train"]), rt, ddp_world=1 if naive else None)
    if init["kind"] == "checkpoint" and init.get("optimizer"):
        _load_optimizer_state(trainer, init["path"])
    stream = BatchStream(spec["data"], rank, world)
    out = {k: [] for k in ("loss", "mlm_loss", "nsp_loss", "lr", "local_loss", "grad_norm")}
    try:
        for i in range(spec["steps"]):
            batch = stream.next()
            if variant.get("nudge_rel") and i == variant["nudge_step"]:
                _nudge(model, variant["nudge_rel"])
            r = trainer.step(batch)
            for k in ("loss", "mlm_loss", "nsp_loss", "lr"):
                out[k].append(float(r[k]))
            out["local_loss"].append(r.get("rank_loss"))  # DDP: this rank's own loss
            if "grad_norm" in r:  # eager clipping: the global norm before the clip
                out["grad_norm"].append(r["grad_norm"])
    finally:
        stream.close()
    if not out["grad_norm"]:
        del out["grad_norm"]
    if not any(v is not None for v in out["local_loss"]):
        del out["local_loss"]
    out["seconds"] = time.perf_counter() - t0
    out["cpu_seconds"] = time.process_time() - c0  # this process (rank)
    out["rank"], out["world"] = rank, world
    return out


# --------------------------------------------------------------------------- workers


def _result_path(results_dir: str, key: str, rank: int) -> str:
    return os.path.join(results_dir, f"{key}-r{rank}.json")


def code_fingerprint() -> str:
    """What a run's numbers depend on besides its spec: the training/model/data code and versions.

    Finished runs are kept under ``DATA_DIR/runs/<fingerprint>/``; an interrupted
    ``bert-of align`` run again picks up where it stopped, and any change to that
    code starts afresh.
    """
    h = hashlib.sha256()
    mods = ["bert_of.training.optim", "bert_of.training.runtime", "bert_of.training.trainer", "bert_of.modeling",
            "bert_of.heads",
            "bert_of.config", "bert_of.checkpoint", "bert_of.data.layout", "bert_of.data.reader",
            "bert_of.data.ofrecord",
            "bert_of.converters.verify.tf_reference", "bert_of.converters.verify.tf_reference_model",
            "bert_of.converters.verify.tf_reference_checkpoint", "bert_of.align.tf_reference_train"]
    for mod in mods:
        with open(util.find_spec(mod).origin, "rb") as f:
            h.update(f.read())
    for obj in (execute_run, _tf_reference_run, _nudge, BatchStream, _load_optimizer_state, _rename_batch):
        h.update(inspect.getsource(obj).encode())
    for dist in ("oneflow", "numpy", "tensorflow-cpu"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:  # pragma: no cover
            pass
    return h.hexdigest()[:12]


def worker_main(batch_file: str, results_dir: str) -> int:
    """Run every spec of ``batch_file`` in this process (one rank of a launch, or a 1-process worker)."""
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    batch = read_json(batch_file, "align batch")
    for item in batch["runs"]:
        res = execute_run(item["spec"], rank, world)
        _atomic_json(_result_path(results_dir, item["key"], rank), res)
    return 0


def _spawn(items, work, results_dir, tag, world, nodes=None, batch_file=None):
    batch_file = batch_file or os.path.join(work, f"batch-{tag}.json")
    _atomic_json(batch_file, {"runs": items, "results_dir": results_dir, "world": world})
    log = open(os.path.join(work, f"log-{tag}.txt"), "w")
    proc = spawn(["-m", "bert_of.align.runner", batch_file, results_dir], world, nodes, stdout=log,
                 stderr=subprocess.STDOUT)
    return proc, log


# Several nodes: node 0 runs the suite; its multi-rank launch spans the nodes. It publishes the
# launch's batch file under OUT (a filesystem the nodes share); the other nodes wait for it, run
# their ranks of that launch (results into the shared results folder) and exit.


def launch_file(out: str, nodes: Topology) -> str:
    return os.path.join(out, ".launch", f"port{nodes.master_port}.json")


def follow(out: str, nodes: Topology, timeout: float = 3600, quiet: bool = False) -> int:
    """Node ``nodes.node_rank`` > 0: run this node's ranks of node 0's multi-rank launch."""
    path, t0 = launch_file(out, nodes), time.time()
    _log(f"node {nodes.node_rank}: waiting for node 0's launch ({path})", quiet)
    while not (os.path.isfile(path) and os.path.getmtime(path) >= t0 - 60):  # not a stale one
        if time.time() - t0 > timeout:
            raise AlignError(f"node {nodes.node_rank}: node 0 published no launch in {timeout:.0f} s ({path})")
        time.sleep(0.5)
    batch = read_json(path, "align launch")
    if not batch["runs"]:
        _log("node 0 has no multi-rank runs: nothing to do", quiet)
        return 0
    world = batch["world"]
    _log(f"node {nodes.node_rank}: {len(batch['runs'])} run(s) on ranks of a {world}-rank launch", quiet)
    topo = Topology(world // nodes.nnodes, nodes.nnodes, nodes.node_rank, nodes.master_addr, nodes.master_port)
    return run_ranks(["-m", "bert_of.align.runner", path, batch["results_dir"]], topo.check())


def _log_tail(work, tag, n=3000) -> str:
    try:
        with open(os.path.join(work, f"log-{tag}.txt"), errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _load_result(results_dir, key, world):
    paths = [_result_path(results_dir, key, r) for r in range(world)]
    if not all(os.path.isfile(p) for p in paths):
        return None
    ranks = [read_json(p, "align run result") for p in paths]
    res = ranks[0]
    if world > 1:
        res["ranks"] = ranks
    return res


def execute_all(specs: dict, work: str, results_dir: str, jobs: int = 1, quiet: bool = False,
                nodes: Topology | None = None, out: str | None = None) -> dict:
    """{key: spec} -> {key: result or {"error": ...}}; multi-rank results carry "ranks".

    Results already in ``results_dir`` (same spec, same code fingerprint) are reused. ``nodes``
    (several): multi-rank runs span them (see :func:`follow`)."""
    results = {}
    multi = {}
    single = []
    for key, spec in specs.items():
        world = spec.get("world", 1)
        cached = _load_result(results_dir, key, world)
        if cached is not None:
            results[key] = dict(cached, cached=True)
        elif world > 1:
            multi.setdefault(world, []).append(key)
        else:
            single.append(key)
    n_cached = sum(1 for r in results.values() if r.get("cached"))
    if n_cached:
        _log(f"{n_cached} run(s) reused from {results_dir} (same spec, same code)", quiet)

    def collect(keys, world, tag, rc):
        for key in keys:
            res = _load_result(results_dir, key, world)
            results[key] = res if res is not None else {
                "error": f"worker {tag} exited with {rc} before finishing this run:\n" + _log_tail(work, tag)}

    # Multi-rank launches start first and run beside the 1-process runs (3+ busy processes
    # keep 2 cores full through graph compilation and start-up).
    launches = []
    many = nodes is not None and nodes.nnodes > 1
    if many and len(multi) > 1:
        raise AlignError(f"runs on {' and '.join(map(str, sorted(multi)))} ranks: over several nodes one "
                         "multi-rank launch at a time (pick the experiments)")
    if many and not multi:
        os.makedirs(os.path.dirname(launch_file(out, nodes)), exist_ok=True)
        _atomic_json(launch_file(out, nodes), {"runs": [], "world": 0, "results_dir": results_dir})
    for world, keys in sorted(multi.items()):
        steps = sum(specs[k]["steps"] for k in keys)
        _log(f"{len(keys)} run(s) on {world} ranks ({steps} steps in all): one launch, in the background"
             + (f", over {nodes.nnodes} nodes" if many else ""), quiet)
        items = [{"key": k, "spec": specs[k]} for k in keys]
        if many:
            path = launch_file(out, nodes)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            launches.append((keys, world, f"world{world}") + _spawn(items, work, results_dir, f"world{world}", world,
                                                                    nodes, batch_file=path))
        else:
            launches.append((keys, world, f"world{world}") + _spawn(items, work, results_dir, f"world{world}", world))

    def finish_launches():
        for keys, world, tag, proc, log in launches:
            rc = proc.wait()
            log.close()
            collect(keys, world, tag, rc)

    if not single:
        finish_launches()
        return results
    if jobs <= 1:
        try:
            for key in single:
                s = specs[key]
                _log(f"run {s.get('label', key)}: {s['steps']} steps", quiet)
                try:
                    results[key] = execute_run(s)
                    _atomic_json(_result_path(results_dir, key, 0), results[key])
                except Exception as e:  # reported in the experiment, the others go on
                    results[key] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"}
        finally:
            finish_launches()
        return results
    # J worker processes, runs dealt longest first to the least loaded
    loads = [[0, []] for _ in range(min(jobs, len(single)))]
    for key in sorted(single, key=lambda k: -specs[k]["steps"]):
        loads.sort(key=lambda x: x[0])
        loads[0][0] += specs[key]["steps"]
        loads[0][1].append(key)
    _log(f"{len(single)} 1-process run(s) in {len(loads)} worker process(es)", quiet)
    procs = []
    for i, (_, keys) in enumerate(loads):
        procs.append((keys, f"single{i}") + _spawn([{"key": k, "spec": specs[k]} for k in keys], work,
                                                   results_dir, f"single{i}", 1))
    for keys, tag, proc, log in procs:
        rc = proc.wait()
        log.close()
        collect(keys, 1, tag, rc)
    finish_launches()
    return results


# --------------------------------------------------------------------------- driver


def run_experiments(names, steps=1000, out="align-out", size="small", jobs=1, data_dir=None, corpus=None,
                    vocab=None, seed=0, perturb_lr=0.0, quiet=False, fresh=False, nodes=None, data=None) -> dict:
    """Plan, run and report ``names``; returns the summary (also written to OUT/summary.json).
    ``nodes``: a :class:`~bert_of.launch.Topology` of several nodes, this one node 0: multi-rank
    runs span them (the others run :func:`follow`)."""
    if steps < 1:
        raise AlignError("--steps must be at least 1")
    if size not in SIZES:
        raise AlignError(f"--size must be one of {', '.join(SIZES)}")
    names = resolve_experiments(names)
    t_start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    data_root = data_dir or os.path.join(out, "data")
    corpus = list(corpus or DEFAULT_CORPUS)
    vocab = vocab or DEFAULT_VOCAB
    dirs = prepare_data(data_root, SIZES[size], corpus, vocab, quiet, data=data)
    work = os.path.join(out, f".work-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    ctx = Ctx(steps, size, dirs, vocab, seed=seed, perturb_lr=perturb_lr, work=work, data_root=data_root,
              quiet=quiet, cuda=bool(flow.cuda.is_available()))
    plans, specs = {}, {}
    try:
        for name in names:
            num, _, title, fn = BY_NAME[name]
            try:
                plan = fn(ctx)
            except Exception as e:
                plan = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:],
                        "runs": {}, "comparisons": [], "description": ""}
            if perturb_lr and not plan.get("skip"):
                _perturb(plan, perturb_lr)
            plan["keys"] = {}
            for label, spec in plan["runs"].items():
                key = _run_key(spec)
                spec = dict(spec, label=label)
                specs.setdefault(key, spec)
                plan["keys"][label] = key
            plans[name] = plan
        results_dir = os.path.join(data_root, "runs", code_fingerprint())
        if fresh:
            shutil.rmtree(results_dir, ignore_errors=True)
        os.makedirs(results_dir, exist_ok=True)
        results = execute_all(specs, work, results_dir, jobs=jobs, quiet=quiet, nodes=nodes, out=out)
        summary = {"steps": steps, "size": size, "model": ctx.model, "batch_size": BATCH,
                   "data": {"corpus": [os.path.basename(p) for p in corpus] if data is None else None,
                            "records": data, "vocab": os.path.basename(vocab),
                            "seq_length": SIZES[size]["seq_length"],
                            "max_predictions": SIZES[size]["max_predictions"]},
                   "perturb_lr": perturb_lr or None, "experiments": {}}
        for name in names:
            rep = _report(name, plans[name], results, ctx)
            jpath, ppath = os.path.join(out, f"{name}.json"), os.path.join(out, f"{name}.png")
            _atomic_json(jpath, rep)
            try:
                (plot_skipped if rep["status"] in ("skipped", "error") else plot_report)(rep, ppath)
            except Exception as e:  # a plot must not hide the numbers
                rep.setdefault("notes", []).append(f"plot failed: {type(e).__name__}: {e}")
                _atomic_json(jpath, rep)
            summary["experiments"][name] = _summary_line(rep, jpath, ppath)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary["wall_seconds"] = time.perf_counter() - t_start
    summary["run_cpu_seconds"] = sum(_run_cpu(r) for r in results.values() if "error" not in r)
    summary["reused_runs"] = sum(1 for r in results.values() if r.get("cached"))
    summary["passed"] = all(e["status"] in ("pass", "skipped") for e in summary["experiments"].values())
    summary["platform"] = _platform()
    _atomic_json(os.path.join(out, "summary.json"), summary)
    atomic_write(os.path.join(out, "README.md"), summary_markdown(summary).encode())
    return summary


def _platform():
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "oneflow": flow.__version__, "cuda": bool(flow.cuda.is_available())}


if __name__ == "__main__":  # a worker: python -m bert_of.align.runner BATCH.json RESULTS_DIR (one per rank)
    if len(sys.argv) != 3:
        sys.exit("usage: python -m bert_of.align.runner BATCH.json RESULTS_DIR")
    sys.exit(worker_main(sys.argv[1], sys.argv[2]))
