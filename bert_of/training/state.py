"""Run directories and training checkpoints: the ONE place checkpoints are written and read.

A run directory (``pretrain --output``, ``finetune --output``)::

    .bert_of.lock                 held by the one process writing the run (pid and command inside)
    metrics.jsonl                 a record every --log-every steps (:func:`bert_of.training.loop.fit`)
    checkpoints/step-NNNNNNN/     config.json, model.safetensors, optimizer.safetensors (canonical
                                  names), vocab.txt, trainer_state.json (step, train config, setup,
                                  world size, schedule, every rank's data position, dropout RNG,
                                  loss scale) and manifest.json (size + SHA-256 of each, written last)

What holds, whatever happens to the process:

- One writer: a second process on the same run directory is refused at once, naming the first.
- A checkpoint is built in a staging folder and published by one rename, so a kill mid-save leaves
  the previous one; it counts only when its manifest lists model, optimizer and trainer state and
  every file matches. ``--resume`` takes the newest complete one and says which it passed over.
- Exact resume or none: another train config, rank count or setup (batch size, model config...)
  is refused with the difference named; so is a checkpoint without optimizer state.
- Nothing non-finite is saved: model and optimizer tensors are checked first.
- Stale staging folders of killed saves go when the run is opened again; after a resume,
  ``metrics.jsonl`` loses the records of the steps that are run again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys

import numpy as np

from bert_of._flow import flow
from bert_of.checkpoint import CONFIG_NAME, OPTIMIZER_NAME, RUN_CHECKPOINTS, RUN_METRICS, WEIGHTS_NAME, load_checkpoint, write_checkpoint_files
from bert_of.tensors import TensorSpec
from bert_of.errors import BertOfError, CheckpointError, ConfigError
from bert_of.files.atomic import filter_jsonl, write_json
from bert_of.files.locks import LOCK_NAME, locked
from bert_of.files.owned import check_sources, foreign_entry, register_own_files
from bert_of.files.publish import publishing, remove_stale_staging
from bert_of.files.reading import read_json, sha256_file
from bert_of.progress import log

CKPT_DIR = RUN_CHECKPOINTS  # named in bert_of.checkpoint, whose run_final finds a run's model
STATE_NAME = "trainer_state.json"
MANIFEST_NAME = "manifest.json"
METRICS_NAME = RUN_METRICS
register_own_files((STATE_NAME, MANIFEST_NAME, METRICS_NAME))
REQUIRED = (CONFIG_NAME, WEIGHTS_NAME, OPTIMIZER_NAME, STATE_NAME)  # what an exact resume reads
_STEP = re.compile(r"step-\d{7,}")


class NonFiniteError(BertOfError):
    """A loss or a tensor that is NaN or infinite: training stops, nothing is published."""


def check_finite(tensors: dict, what: str) -> None:
    """Refuse to save ``tensors`` ({name: array}) if any floating value is NaN or infinite."""
    for name, arr in tensors.items():
        a = np.asarray(arr)
        if a.dtype.kind == "f":
            ok = np.isfinite(a)
            if not ok.all():
                raise NonFiniteError(f"{what}: tensor {name} holds {a.size - int(np.count_nonzero(ok))} non-finite "
                                     "value(s) (NaN or inf); not saving it")


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(trainer, run_dir: str, data, vocab_file=None, keep: int = 2, setup: dict | None = None) -> str:
    """Write ``checkpoints/step-N`` (every rank calls this; rank 0 writes). Keeps the newest ``keep``.

    ``setup``: what else an exact resume must find unchanged (the command's batch size, model
    config...), saved in trainer_state.json and compared by :func:`restore`.
    """
    rt, step = trainer.rt, trainer.global_step
    parent = os.path.join(run_dir, CKPT_DIR)
    final = os.path.join(parent, f"step-{step:07d}")
    model_state = trainer.model.canonical_state()  # a collective for global tensors: every rank calls it
    opt_state, opt_meta = trainer.optimizer_state()
    check_finite(model_state, f"checkpoint of step {step}")  # every rank holds the same values: all stop
    check_finite(opt_state, f"optimizer state of step {step}")
    ranks = os.path.join(parent, f".step-{step:07d}.ranks")  # every rank's data position, gathered here
    if rt.is_main:
        shutil.rmtree(ranks, ignore_errors=True)
        os.makedirs(ranks)
    rt.barrier()
    write_json(os.path.join(ranks, f"data-rank{rt.rank}.json"), data.state_dict(), indent=None)
    rt.barrier()
    if rt.is_main:
        try:
            state = {"global_step": step, "train_config": trainer.cfg.to_dict(), "setup": setup or {},
                     "world_size": rt.world, "scheduler": _jsonable(trainer.sched.state_dict()),
                     "data": [read_json(os.path.join(ranks, f"data-rank{r}.json")) for r in range(rt.world)],
                     "rng": trainer.generator.get_state().numpy().tolist(),
                     "loss_scaler": trainer.scaler.state_dict() if trainer.scaler else None}
            items = [(TensorSpec(k, v.dtype, v.shape), (lambda v=v: v)) for k, v in opt_state.items()]
            with publishing(final, overwrite=True) as stage:
                write_checkpoint_files(stage, list(model_state.items()), trainer.model.config, vocab_file,
                                       optimizer=(items, opt_meta), metadata={"format": "bert_of", "step": str(step)})
                write_json(os.path.join(stage, STATE_NAME), state, indent=None)
                _write_manifest(stage, step)  # last: the checkpoint counts from here
        finally:
            shutil.rmtree(ranks, ignore_errors=True)
        done = sorted(n for n in os.listdir(parent) if _STEP.fullmatch(n))
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(parent, old), ignore_errors=True)
    rt.barrier()
    return final


def _write_manifest(stage: str, step: int) -> None:
    files = {}
    for n in sorted(os.listdir(stage)):
        p = os.path.join(stage, n)
        if not n.startswith(".") and os.path.isfile(p):
            files[n] = {"size": os.path.getsize(p), "sha256": sha256_file(p)}
    write_json(os.path.join(stage, MANIFEST_NAME), {"step": step, "files": files})


def verify_checkpoint(path: str) -> dict:
    """The trainer state of the complete checkpoint at ``path``; otherwise one CheckpointError line
    naming what is missing or damaged."""
    manifest = os.path.join(path, MANIFEST_NAME)
    if not os.path.isfile(manifest):
        raise CheckpointError(f"{path}: incomplete (no {MANIFEST_NAME}: the save did not finish)")
    files = read_json(manifest, "checkpoint manifest", error=CheckpointError).get("files")
    if not isinstance(files, dict) or not all(isinstance(v, dict) and isinstance(k, str) for k, v in files.items()):
        raise CheckpointError(f"{manifest}: malformed (no map of files)")
    for name in REQUIRED:
        if name not in files:
            raise CheckpointError(f"{path}: incomplete (its manifest lists no {name})")
    for name, info in sorted(files.items()):
        p = os.path.join(path, name)
        if os.path.basename(name) != name or name.startswith("."):
            raise CheckpointError(f"{manifest}: {name[:80]!r} is not a file of the checkpoint")
        if not os.path.isfile(p):
            raise CheckpointError(f"{path}: {name} is missing")
        if os.path.getsize(p) != info.get("size") or sha256_file(p) != info.get("sha256"):
            raise CheckpointError(f"{p}: differs from the checkpoint's manifest (damaged or modified)")
    state = read_json(os.path.join(path, STATE_NAME), "trainer state", error=CheckpointError)
    _check_state(state, os.path.join(path, STATE_NAME))
    return state


def _check_state(state: dict, where: str) -> None:
    def is_int(v, lo=0):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    bad = None
    if not is_int(state.get("global_step")):
        bad = "global_step"
    elif not is_int(state.get("world_size"), 1):
        bad = "world_size"
    elif not (isinstance(state.get("data"), list) and len(state["data"]) == state["world_size"]
              and all(isinstance(d, dict) for d in state["data"])):
        bad = "data (one position per rank)"
    else:
        for key, kind in (("train_config", dict), ("setup", dict), ("scheduler", dict), ("rng", list)):
            if not isinstance(state.get(key), kind):
                bad = key
                break
    if bad is None and not (state.get("loss_scaler") is None or isinstance(state["loss_scaler"], dict)):
        bad = "loss_scaler"
    if bad:
        raise CheckpointError(f"{where}: malformed trainer state ({bad})")


def latest_checkpoint(run_dir: str):
    """The newest complete checkpoint of a run directory (verified against its manifest), or None."""
    for path in _checkpoints(run_dir):
        try:
            verify_checkpoint(path)
        except BertOfError:
            continue
        return path
    return None


def _checkpoints(run_dir: str) -> list:
    """Paths of ``checkpoints/step-N``, newest first."""
    d = os.path.join(run_dir, CKPT_DIR)
    names = os.listdir(d) if os.path.isdir(d) else []
    return [os.path.join(d, n) for n in sorted((n for n in names if _STEP.fullmatch(n)), reverse=True)]


def _differences(theirs: dict, mine: dict, prefix: str = "") -> list:
    """``key saved -> now`` for every value that differs (nested dicts by dotted key)."""
    out = []
    for k in sorted(set(theirs) | set(mine)):
        a, b = theirs.get(k), mine.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k} {a!r} -> {b!r}")
    return out


def check_resumable(path: str, state: dict, trainer, setup: dict | None = None) -> None:
    """Refuse a resume that could not be exact: another train config, rank count or setup. The
    one change a resume may make is a longer run (more ``steps``: :func:`restore` re-plans)."""
    mine = _jsonable({k: v for k, v in trainer.cfg.to_dict().items() if k not in ("extra", "steps")})
    theirs = {k: v for k, v in state["train_config"].items() if k not in ("extra", "steps")}
    differ = _differences(theirs, mine)
    if state["world_size"] != trainer.rt.world:
        differ.append(f"world size {state['world_size']} -> {trainer.rt.world}")
    differ += _differences(state.get("setup") or {}, _jsonable(setup or {}))
    planned = state["train_config"].get("steps")
    if trainer.cfg.steps != planned and not (isinstance(planned, int) and trainer.cfg.steps > planned):
        differ.append(f"steps {planned!r} -> {trainer.cfg.steps!r} (a resume may extend a run, not shorten it)")
    if differ:
        raise ConfigError(f"{path}: cannot resume exactly with a different setup ({', '.join(differ)})")


def restore(trainer, path: str, data, setup: dict | None = None, state: dict | None = None) -> None:
    """Continue exactly where the complete checkpoint at ``path`` stopped: model, optimizer, step,
    schedule, this rank's data position, loss scale and dropout RNG. ``state``: its trainer state,
    already verified (:func:`verify_checkpoint`)."""
    state = verify_checkpoint(path) if state is None else state
    check_resumable(path, state, trainer, setup)
    ck = load_checkpoint(path, with_optimizer=True)
    if "step" not in ck.optimizer:
        raise CheckpointError(f"{os.path.join(path, OPTIMIZER_NAME)}: no optimizer state to resume exactly")
    trainer.model.load_canonical(ck.tensors, strict_heads=True)
    trainer.load_optimizer_state(ck.optimizer)
    trainer.global_step = state["global_step"]
    if state["train_config"].get("steps") == trainer.cfg.steps:
        trainer.sched.load_state_dict(state["scheduler"])
    else:  # a longer run: the schedule of the new horizon, at this step (as Google's continues to a larger
        for _ in range(trainer.global_step):  # num_train_steps): its rate is a function of the step alone
            trainer.sched.step()
    for group, lr in zip(trainer.opt.param_groups, trainer.sched.get_last_lr()):
        group["lr"] = lr  # eager steps read it; graph mode only reports it
    data.load_state_dict(state["data"][trainer.rt.rank])
    if trainer.scaler and state.get("loss_scaler"):
        trainer.scaler.load_state_dict(state["loss_scaler"])
    trainer.generator.set_state(flow.tensor(np.array(state["rng"], np.uint8)))


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


# --------------------------------------------------------------------------- run directories


class RunDir:
    """One training run's directory, held by this process while the run lasts::

        run = RunDir(path, rt, outputs=("final",), sources=(data_dir,))
        with run.open(resume=args.resume, overwrite=args.overwrite):
            ...  # build the model, trainer and data
            run.start(trainer, data, setup={"batch_size": 32, "config": config.to_dict()})
            fit(trainer, data, steps, run=run, ...)

    ``outputs``: what else of the command's lives in it (``--overwrite`` removes those too, never
    anything else); ``sources``: inputs it must not be, hold or lie inside; ``record``: (file name,
    the run's options) kept in it, which a resume reads first; ``own``: the files a resumed run reads
    instead of a checkpoint's (a vocabulary, a config), which the command writes when it starts.
    """

    def __init__(self, path: str, rt, *, outputs=(), sources=(), what: str = "train", record=None, own=()):
        self.path, self.rt, self.what = os.path.abspath(path), rt, what
        self.record = record  # (file name, the run's options as data): written when the run starts or resumes
        self.own = ((record[0],) if record else ()) + tuple(own)  # the run's own files, written before its first step
        self.ours = (METRICS_NAME, CKPT_DIR, *outputs, *self.own)
        self.sources = tuple(sources)
        self.metrics = os.path.join(self.path, METRICS_NAME)
        self.resume_from = self.state = None
        self.setup: dict = {}

    @contextlib.contextmanager
    def open(self, resume: bool = False, overwrite: bool = False):
        """Hold the run directory for the block (rank 0 takes the lock; every rank checks).

        New run: a directory already holding a run is refused unless ``overwrite``, which removes
        what the run wrote before. ``resume``: find the newest complete checkpoint
        (``self.resume_from``); :meth:`start` restores it.
        """
        if resume and overwrite:
            raise ConfigError("--resume continues the run and --overwrite starts it again: pass one of them")
        check_sources(self.path, self.sources)
        created = not os.path.exists(self.path)
        with contextlib.ExitStack() as stack:
            if self.rt.is_main:
                stack.enter_context(locked(os.path.join(self.path, LOCK_NAME), what=self.path))
                if created:
                    stack.callback(self._remove_if_unused)
                self._tidy()
            if resume:
                self.resume_from, self.state = self._resumable()
            else:
                self._fresh(overwrite)
            if self.record:
                self.rt.barrier()  # every rank has looked at the directory before the run writes into it
                if self.rt.is_main:
                    write_json(os.path.join(self.path, self.record[0]), self.record[1])
            yield self

    def _tidy(self) -> None:
        """Remove what killed saves left (this process holds the run: no writer is alive)."""
        remove_stale_staging(self.path)
        d = os.path.join(self.path, CKPT_DIR)
        if os.path.isdir(d):
            remove_stale_staging(d)
            for n in os.listdir(d):
                if n.startswith(".step-") and n.endswith(".ranks"):
                    shutil.rmtree(os.path.join(d, n), ignore_errors=True)

    def _remove_if_unused(self) -> None:
        names = os.listdir(self.path)
        if set(names) <= {LOCK_NAME, *self.own}:  # a run that failed before its first step
            with contextlib.suppress(OSError):
                for n in sorted(names, key=lambda n: n == LOCK_NAME):  # the lock last
                    os.remove(os.path.join(self.path, n))
                os.rmdir(self.path)

    def _fresh(self, overwrite: bool) -> None:
        present = [n for n in self.ours if os.path.lexists(os.path.join(self.path, n))]
        if not present:
            return
        made = [n for n in present if n not in self.own]  # what its steps made
        if made and not overwrite:  # (only the run's own files: it stopped before its first step, start again)
            raise BertOfError(f"{self.path}: already holds a run ({', '.join(made)}); use --resume to continue "
                              "it or --overwrite to start again")
        for n in present:
            p = os.path.join(self.path, n)
            foreign = foreign_entry(p) if os.path.isdir(p) and not os.path.islink(p) else None
            if foreign:
                raise BertOfError(f"{p}: holds {foreign}, which bert_of did not write; not removing it")
        if self.rt.is_main:
            for n in present:
                p = os.path.join(self.path, n)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.remove(p)

    def _resumable(self) -> tuple:
        """(path, trainer state) of the newest complete checkpoint; says which were passed over."""
        found = _checkpoints(self.path)
        if not found:
            raise BertOfError(f"{self.path}: nothing to resume (no {CKPT_DIR}/step-*)")
        passed = []
        for path in found:
            try:
                state = verify_checkpoint(path)
            except BertOfError as e:
                passed.append(str(e))
                continue
            if passed and self.rt.is_main:
                print(f"{self.what}: passing over {'; '.join(passed)}; resuming from {path}", file=sys.stderr,
                      flush=True)
            return path, state
        raise CheckpointError(f"{self.path}: no complete checkpoint to resume ({'; '.join(passed)})")

    def start(self, trainer, data, setup: dict) -> None:
        """Before the first step: keep ``setup`` for the checkpoints; when resuming, restore the
        checkpoint :meth:`open` found (refusing another setup) and drop the metrics of the steps
        that follow it (they are run again)."""
        self.setup = _jsonable(setup)
        if self.resume_from is None:
            return
        restore(trainer, self.resume_from, data, self.setup, self.state)
        planned = self.state["train_config"].get("steps")
        if self.rt.is_main and planned != trainer.cfg.steps:
            log.info(f"{self.what}: {planned} -> {trainer.cfg.steps} steps: the learning-rate schedule is re-planned "
                     f"for {trainer.cfg.steps} steps from step {trainer.global_step}")
        if self.rt.is_main:
            step = trainer.global_step
            filter_jsonl(self.metrics, lambda r: isinstance(r.get("step"), int) and r["step"] <= step)

    def save(self, trainer, data, vocab_file=None, keep: int = 2) -> str:
        return save_checkpoint(trainer, self.path, data, vocab_file, keep, self.setup)

    def newest(self):
        """The newest checkpoint folder on disk (complete or not), or None."""
        found = _checkpoints(self.path)
        return found[0] if found else None
