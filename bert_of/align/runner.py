"""Running the suite's training runs: one run from its spec, worker processes, 2-rank launches,
the cache of finished runs; and ``run_experiments`` (plan, run, report)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback

import numpy as np

from bert_of.align.data import (DEFAULT_CORPUS, DEFAULT_VOCAB, REPO_ROOT, AlignError, BatchStream, _atomic_json, _log,
                                _rename_batch, prepare_data)
from bert_of.align.plans import BATCH, BY_NAME, SIZES, Ctx, _perturb, _run_key, resolve_experiments
from bert_of.align.report import _report, _run_cpu, _summary_line, plot_report, plot_skipped, summary_markdown
from bert_of.fs import atomic_write

# --------------------------------------------------------------------------- one run


def _make_trainer(model, cfg, placement, ddp):
    from bert_of.training import trainer as T

    class AlignTrainer(T.Trainer):
        """Trainer that also keeps this rank's local loss values (before the DDP mean)."""

        def _report(self, t):
            self.local_values.append(T._scalar(t.detach()))
            return super()._report(t)

    tr = AlignTrainer(model, cfg, placement=placement, ddp=ddp)
    tr.local_values = []
    return tr


def _load_optimizer_state(trainer, model, ckpt_dir):
    """Adam m / v of a converted checkpoint into the trainer's optimizer (eager) or graph."""
    from bert_of._flow import flow
    from bert_of.checkpoint import load_checkpoint

    ck = load_checkpoint(ckpt_dir, with_optimizer=True)
    if not ck.optimizer:
        raise AlignError(f"{ckpt_dir}: no optimizer.safetensors (convert with --with-optimizer)")
    params = dict(model.named_parameters())
    missing = [n for n in params if f"m/{n}" not in ck.optimizer or f"v/{n}" not in ck.optimizer]
    if missing:
        raise AlignError(f"{ckpt_dir}: optimizer state lacks {missing[0]}")
    if trainer.graph is not None:
        # The graph's Adam variables are "<graph attribute>.<param>-m" / "-v"; loaded before the
        # first call, they initialise the compiled job's state.
        trainer.graph.load_state_dict({f"model.{n}-{s}": flow.tensor(ck.optimizer[f"{s}/{n}"])
                                       for n in params for s in ("m", "v")}, strict=False)
    else:
        for n, p in params.items():
            trainer.opt._state[p]["exp_avg"] = flow.tensor(ck.optimizer[f"m/{n}"])
            trainer.opt._state[p]["exp_avg_sq"] = flow.tensor(ck.optimizer[f"v/{n}"])


def _nudge(model, rel: float) -> None:
    """Multiply every parameter by (1 + rel * N(0, 1)), seeded: how far does the run move?"""
    from bert_of._flow import flow

    rng = np.random.default_rng(0)
    with flow.no_grad():
        for p in model.parameters():
            noise = (1.0 + rel * rng.standard_normal(tuple(p.shape))).astype(np.float32)
            p.copy_(p * flow.tensor(noise))


def execute_run(spec: dict, rank: int = 0, world: int = 1) -> dict:
    """Train as ``spec`` says; per-step numbers of this process (the global loss on every rank)."""
    from bert_of._flow import flow
    from bert_of.training import trainer as T
    from bert_of.config import BertConfig
    from bert_of.modeling import BertForPreTraining

    t0, c0 = time.perf_counter(), time.process_time()
    init = spec.get("init") or {"kind": "seed", "seed": 0}
    if init["kind"] == "checkpoint":
        model = BertForPreTraining.from_pretrained(init["path"])
    else:
        model = BertForPreTraining(BertConfig(**spec["model"]))
        model.init_weights(seed=init.get("seed", 0))
    dist = spec.get("dist", "none")
    device = spec.get("device", "cpu")
    placement = None
    if dist == "global" or device != "cpu":
        placement = flow.placement(device, ranks=list(range(world)))
    cfg = T.TrainConfig(**spec["train"])
    trainer = _make_trainer(model, cfg, placement, ddp=dist == "ddp")
    variant = spec.get("variant") or {}
    if variant.get("ddp_local_denominator"):
        # naive DDP: every rank normalises the MLM loss by its OWN weight sum
        trainer.loss_module.ddp_world = 1
    if init["kind"] == "checkpoint" and init.get("optimizer"):
        _load_optimizer_state(trainer, model, init["path"])
    stream = BatchStream(spec["data"], rank, world)
    out = {k: [] for k in ("loss", "mlm_loss", "nsp_loss", "lr", "local_loss")}
    norms = []
    orig_clip = T.clip_by_global_norm

    def recording_clip(params, max_norm):  # eager clipping: keep the pre-clip global norm
        n = orig_clip(params, max_norm)
        norms.append(T._scalar(n))
        return n

    T.clip_by_global_norm = recording_clip
    try:
        for i in range(spec["steps"]):
            batch = stream.next()
            if variant.get("nudge_rel") and i == variant["nudge_step"]:
                _nudge(model, variant["nudge_rel"])
            trainer.local_values.clear()
            r = trainer.step(batch)
            for k in ("loss", "mlm_loss", "nsp_loss", "lr"):
                out[k].append(float(r[k]))
            k_micro = cfg.grad_accum_steps if cfg.mode == "eager" else 1
            vals = trainer.local_values[0::len(T.LOSS_KEYS)]  # "loss" of each micro-batch
            out["local_loss"].append(float(np.mean(vals)) if len(vals) == k_micro else None)
    finally:
        T.clip_by_global_norm = orig_clip
        stream.close()
    if norms:
        out["grad_norm"] = norms
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
    import inspect
    from importlib import metadata

    h = hashlib.sha256()
    base = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rels = sorted(os.path.join("training", n) for n in os.listdir(os.path.join(base, "training")) if n.endswith(".py"))
    for rel in rels + ["modeling.py", "config.py", "checkpoint.py", os.path.join("data", "reader.py"),
                       os.path.join("data", "ofrecord.py")]:
        with open(os.path.join(base, rel), "rb") as f:
            h.update(f.read())
    for obj in (execute_run, _nudge, BatchStream, _make_trainer, _load_optimizer_state, _rename_batch):
        h.update(inspect.getsource(obj).encode())
    for dist in ("oneflow", "numpy"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:  # pragma: no cover
            pass
    return h.hexdigest()[:12]


def worker_main(batch_file: str, results_dir: str) -> int:
    """Run every spec of ``batch_file`` in this process (one rank of a launch, or a 1-process worker)."""
    from bert_of._flow import flow

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    with open(batch_file) as f:
        batch = json.load(f)
    for item in batch["runs"]:
        res = execute_run(item["spec"], rank, world)
        _atomic_json(_result_path(results_dir, item["key"], rank), res)
    return 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _spawn(items, work, results_dir, tag, world):
    batch_file = os.path.join(work, f"batch-{tag}.json")
    _atomic_json(batch_file, {"runs": items})
    log = open(os.path.join(work, f"log-{tag}.txt"), "w")
    if world > 1:
        cmd = [sys.executable, "-m", "oneflow.distributed.launch", "--nproc_per_node", str(world),
               "--master_port", str(_free_port()), "--module", "bert_of.align", "worker", batch_file, results_dir]
    else:
        cmd = [sys.executable, "-m", "bert_of.align", "worker", batch_file, results_dir]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_worker_env())
    return proc, log


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
    ranks = []
    for p in paths:
        with open(p) as f:
            ranks.append(json.load(f))
    res = ranks[0]
    if world > 1:
        res["ranks"] = ranks
    return res


def execute_all(specs: dict, work: str, results_dir: str, jobs: int = 1, quiet: bool = False) -> dict:
    """{key: spec} -> {key: result or {"error": ...}}; multi-rank results carry "ranks".

    Results already in ``results_dir`` (same spec, same code fingerprint) are reused."""
    results = {}
    multi = {}
    single = []
    for key, spec in specs.items():
        world = spec.get("world", 1)
        if spec.get("precomputed") is not None:
            results[key] = spec["precomputed"]
            continue
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
    for world, keys in sorted(multi.items()):
        steps = sum(specs[k]["steps"] for k in keys)
        _log(f"{len(keys)} run(s) on {world} ranks ({steps} steps in all): one launch, in the background", quiet)
        launches.append((keys, world, f"world{world}") + _spawn([{"key": k, "spec": specs[k]} for k in keys], work,
                                                                results_dir, f"world{world}", world))

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
                    vocab=None, seed=0, perturb_lr=0.0, quiet=False, fresh=False) -> dict:
    """Plan, run and report ``names``; returns the summary (also written to OUT/summary.json)."""
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
    dirs = prepare_data(data_root, SIZES[size], corpus, vocab, quiet)
    work = os.path.join(out, f".work-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    ctx = Ctx(steps, size, dirs, vocab, seed=seed, perturb_lr=perturb_lr, work=work, data_root=data_root,
              quiet=quiet)
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
                key = _run_key(spec) if "precomputed" not in spec else f"pre-{name}-{len(specs)}"
                spec = dict(spec, label=label)
                specs.setdefault(key, spec)
                plan["keys"][label] = key
            plans[name] = plan
        results_dir = os.path.join(data_root, "runs", code_fingerprint())
        if fresh:
            shutil.rmtree(results_dir, ignore_errors=True)
        os.makedirs(results_dir, exist_ok=True)
        results = execute_all(specs, work, results_dir, jobs=jobs, quiet=quiet)
        summary = {"steps": steps, "size": size, "model": ctx.model, "batch_size": BATCH,
                   "data": {"corpus": [os.path.basename(p) for p in corpus], "vocab": os.path.basename(vocab),
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
    import platform

    info = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        from bert_of._flow import flow

        info["oneflow"] = flow.__version__
        info["cuda"] = bool(flow.cuda.is_available())
    except Exception:  # pragma: no cover
        pass
    return info
