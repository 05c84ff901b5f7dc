"""Run directories and training checkpoints: the ONE place checkpoints are written and read.

A run directory holds ``metrics.jsonl`` and ``checkpoints/step-NNNNNNN/``: a bert_of checkpoint
(config, model, optimizer state in canonical names, vocab) plus ``trainer_state.json`` (step,
train config, world size, scheduler, every rank's data position, dropout RNG, loss scale):
everything an exact resume needs. A checkpoint is built in a staging folder and published by
one rename (:func:`bert_of.fs.publishing`), so a kill mid-save leaves the previous one.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from bert_of._flow import flow
from bert_of.checkpoint import TensorSpec, load_checkpoint, write_checkpoint_files
from bert_of.errors import BertOfError, ConfigError
from bert_of.fs import publishing, read_json, write_json

CKPT_DIR = "checkpoints"
STATE_NAME = "trainer_state.json"


def latest_checkpoint(run_dir: str):
    """The newest complete checkpoint of a run directory, or None."""
    d = os.path.join(run_dir, CKPT_DIR)
    if not os.path.isdir(d):
        return None
    steps = sorted(n for n in os.listdir(d) if n.startswith("step-") and "." not in n
                   and os.path.isfile(os.path.join(d, n, STATE_NAME)))
    return os.path.join(d, steps[-1]) if steps else None


def prepare_run_dir(run_dir: str, resume: bool, overwrite: bool):
    """Check ``run_dir`` before training; returns the checkpoint to resume from (or None)."""
    if resume:
        found = latest_checkpoint(run_dir)
        if found is None:
            raise BertOfError(f"{run_dir}: nothing to resume (no {CKPT_DIR}/step-*/{STATE_NAME})")
        return found
    if os.path.isdir(os.path.join(run_dir, CKPT_DIR)) and not overwrite:
        raise BertOfError(f"{run_dir}: already holds a run (use --resume to continue or --overwrite)")
    return None


def save_checkpoint(trainer, run_dir: str, data, vocab_file=None, keep: int = 2) -> str:
    """Write ``checkpoints/step-N`` (every rank calls this; rank 0 writes). Keeps the newest ``keep``."""
    rt, step = trainer.rt, trainer.global_step
    parent = os.path.join(run_dir, CKPT_DIR)
    final = os.path.join(parent, f"step-{step:07d}")
    ranks = os.path.join(parent, f".step-{step:07d}.ranks")  # every rank's data position, gathered here
    if rt.is_main:
        shutil.rmtree(ranks, ignore_errors=True)
        os.makedirs(ranks)
    rt.barrier()
    write_json(os.path.join(ranks, f"data-rank{rt.rank}.json"), data.state_dict(), indent=None)
    rt.barrier()
    model_state = trainer.model.canonical_state()  # a collective for global tensors: every rank calls it
    opt_state, opt_meta = trainer.optimizer_state()
    if rt.is_main:
        state = {"global_step": step, "train_config": trainer.cfg.to_dict(), "world_size": rt.world,
                 "scheduler": _jsonable(trainer.sched.state_dict()),
                 "data": [read_json(os.path.join(ranks, f"data-rank{r}.json")) for r in range(rt.world)],
                 "rng": trainer.generator.get_state().numpy().tolist(),
                 "loss_scaler": trainer.scaler.state_dict() if trainer.scaler else None}
        items = [(TensorSpec(k, v.dtype, v.shape), (lambda v=v: v)) for k, v in opt_state.items()]
        with publishing(final, overwrite=True) as stage:
            write_checkpoint_files(stage, list(model_state.items()), trainer.model.config, vocab_file,
                                   optimizer=(items, opt_meta), metadata={"format": "bert_of", "step": str(step)})
            write_json(os.path.join(stage, STATE_NAME), state, indent=None)
        shutil.rmtree(ranks, ignore_errors=True)
        done = sorted(n for n in os.listdir(parent) if n.startswith("step-") and "." not in n)
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(parent, old), ignore_errors=True)
    rt.barrier()
    return final


def read_checkpoint(path: str) -> tuple:
    """(the checkpoint with its optimizer state, its trainer_state.json)."""
    return load_checkpoint(path, with_optimizer=True), read_json(os.path.join(path, STATE_NAME), "trainer state")


def check_resumable(path: str, state: dict, trainer) -> None:
    """Refuse a resume that could not be exact: another train config or rank count."""
    mine = {k: v for k, v in trainer.cfg.to_dict().items() if k != "extra"}
    theirs = {k: v for k, v in state["train_config"].items() if k in mine}
    differ = [k for k in mine if k in theirs and mine[k] != theirs[k]]
    if differ or state["world_size"] != trainer.rt.world:
        what = ", ".join(f"{k} {theirs[k]!r} -> {mine[k]!r}" for k in differ) or \
            f"world size {state['world_size']} -> {trainer.rt.world}"
        raise ConfigError(f"{path}: cannot resume exactly with a different setup ({what})")


def restore(trainer, path: str, data) -> None:
    """Continue exactly where the checkpoint at ``path`` stopped: model, optimizer, step,
    schedule, this rank's data position, loss scale and dropout RNG."""
    ck, state = read_checkpoint(path)
    check_resumable(path, state, trainer)
    trainer.model.load_canonical(ck.tensors, strict_heads=True)
    trainer.load_optimizer_state(ck.optimizer)
    trainer.global_step = state["global_step"]
    trainer.sched.load_state_dict(state["scheduler"])
    for group, lr in zip(trainer.opt.param_groups, trainer.sched.get_last_lr()):
        group["lr"] = lr  # eager steps read it; graph mode only reports it
    data.load_state_dict(state["data"][trainer.rt.rank])
    if trainer.scaler and state.get("loss_scaler"):
        trainer.scaler.load_state_dict(state["loss_scaler"])
    trainer.generator.set_state(flow.tensor(np.array(state["rng"], np.uint8)))


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
