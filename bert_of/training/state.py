"""Training checkpoints: canonical optimizer state, ``checkpoints/step-N`` with everything an exact
resume needs."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from bert_of.fs import atomic_write

CKPT_DIR = "checkpoints"

STATE_NAME = "trainer_state.json"


def optimizer_state(trainer) -> tuple:
    """({m/<name>, v/<name>, momentum/<name>, step}: numpy, metadata) whatever the mode."""
    from bert_of._flow import flow

    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    out = {}

    from bert_of.modeling import to_local_full

    def local(t):
        return to_local_full(t).numpy()

    if trainer.graph is not None:
        state = trainer.graph.state_dict()
        # The graph's own step counter is not read back: on 2 ranks reading it hangs rank 1
        # in OneFlow 0.9, and it equals the trainer's step anyway.
        out["step"] = np.asarray(trainer.global_step, np.int64)
        for key, t in state.items():
            for suffix, slot in (("-m", "m"), ("-v", "v"), ("-momentum", "momentum")):
                if key.startswith("model.") and key.endswith(suffix):
                    out[f"{slot}/{key[len('model.'):-len(suffix)]}"] = local(t)
    else:
        sd = trainer.opt.state_dict()
        order = [p for g in trainer.opt.param_groups for p in g.parameters]
        by_param = {id(p): n for n, p in trainer.model.named_parameters()}
        for idx, slots in sd["state"].items():
            if idx == "step":
                continue
            name = by_param[id(order[idx])]
            for key, slot in (("exp_avg", "m"), ("exp_avg_sq", "v"), ("momentum_buf", "momentum")):
                if key in slots:
                    out[f"{slot}/{name}"] = local(slots[key])
        out["step"] = np.asarray(trainer.global_step, np.int64)
    cfg = trainer.cfg
    meta = {"optimizer": cfg.optimizer, "bias_correction": str(cfg.bias_correction).lower(), "eps": repr(cfg.eps),
            "weight_decay": repr(cfg.weight_decay), "exclude_from_weight_decay": ",".join(cfg.no_decay),
            "source": "bert_of", "parameters": str(len(names))}
    return out, meta


def load_optimizer_state(trainer, state: dict) -> None:
    """Put canonical optimizer state into the trainer (before a graph's first call)."""
    from bert_of._flow import flow

    def tensor(arr, like=None):
        t = flow.tensor(np.ascontiguousarray(arr))
        if trainer.placement is not None:
            t = t.to_global(placement=trainer.placement, sbp=flow.sbp.broadcast)
        return t

    step = int(state.get("step", 0))
    if trainer.graph is not None:
        graph_state = {"System-Train-TrainStep": tensor(np.array([step], np.int64))}
        suffix = {"m": "-m", "v": "-v", "momentum": "-momentum"}
        for key, arr in state.items():
            if "/" in key:
                slot, name = key.split("/", 1)
                graph_state[f"model.{name}{suffix[slot]}"] = tensor(arr)
        trainer.graph.load_state_dict(graph_state, strict=False)
    else:
        sd = trainer.opt.state_dict()
        order = [p for g in trainer.opt.param_groups for p in g.parameters]
        position = {id(p): i for i, p in enumerate(order)}  # identity: tensor == compares values
        index = {n: position[id(p)] for n, p in trainer.model.named_parameters() if id(p) in position}
        new_state = {"step": step}
        keys = {"m": "exp_avg", "v": "exp_avg_sq", "momentum": "momentum_buf"}
        for key, arr in state.items():
            if "/" in key:
                slot, name = key.split("/", 1)
                new_state.setdefault(index[name], {})[keys[slot]] = tensor(arr)
        sd["state"] = new_state
        trainer.opt.load_state_dict(sd)


def latest_checkpoint(run_dir: str):
    d = os.path.join(run_dir, CKPT_DIR)
    if not os.path.isdir(d):
        return None
    steps = sorted(n for n in os.listdir(d) if n.startswith("step-") and not n.endswith(".tmp")
                   and os.path.isfile(os.path.join(d, n, STATE_NAME)))
    return os.path.join(d, steps[-1]) if steps else None


def save(trainer, run_dir, data, vocab_file, keep: int, rank: int, world: int) -> str:
    """Write checkpoints/step-N atomically; every rank adds its data position."""
    from bert_of._flow import flow
    from bert_of.checkpoint import TensorSpec, write_checkpoint

    step = trainer.global_step
    final = os.path.join(run_dir, CKPT_DIR, f"step-{step:07d}")
    stage = final + ".ranks.tmp"  # per-rank files gathered here first (one node: shared disk)
    if rank == 0:
        shutil.rmtree(stage, ignore_errors=True)
        os.makedirs(stage)
    if world > 1:
        flow.comm.barrier()
    with open(os.path.join(stage, f"data-rank{rank}.json"), "w") as f:
        json.dump(data.state_dict(), f)
    if world > 1:
        flow.comm.barrier()
    model_state = trainer.model.canonical_state()  # collective for global tensors: every rank calls it
    opt_state, opt_meta = optimizer_state(trainer)
    if rank == 0:
        items = [(TensorSpec(k, v.dtype, v.shape), (lambda v=v: v)) for k, v in opt_state.items()]
        if os.path.exists(final):
            shutil.rmtree(final)
        write_checkpoint(final, list(model_state.items()), trainer.model.config, vocab_file,
                         optimizer=(items, opt_meta), metadata={"format": "bert_of", "step": str(step)})
        state = {"global_step": step, "train_config": trainer.cfg.to_dict(), "world_size": world,
                 "scheduler": _jsonable(trainer.sched.state_dict()),
                 "data": [json.load(open(os.path.join(stage, f"data-rank{r}.json"))) for r in range(world)],
                 "rng": trainer.generator.get_state().numpy().tolist(),
                 "loss_scaler": trainer.scaler.state_dict() if trainer.scaler else None}
        atomic_write(os.path.join(final, STATE_NAME), json.dumps(state))  # the checkpoint counts once this exists
        shutil.rmtree(stage, ignore_errors=True)
        ckpts = sorted(n for n in os.listdir(os.path.dirname(final)) if n.startswith("step-") and "." not in n)
        for old in ckpts[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(os.path.dirname(final), old), ignore_errors=True)
    if world > 1:
        flow.comm.barrier()
    return final


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
