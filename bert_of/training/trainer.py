"""The train step: one optimizer step over a batch, eagerly or inside an ``nn.Graph``, on one
process, over several ranks with global tensors, or with eager DDP. Any model whose forward
computes its loss from labelled keyword arguments trains here (the heads of
:mod:`bert_of.heads`): pretraining, SQuAD and GLUE differ only by model and data.

The ways must agree (see ``bert-of align``); what makes them agree:

- Weight decay skips names containing bias / LayerNorm / layer_norm (Google's optimization.py).
  Eager uses two parameter groups; the graph uses ONE group whose weight-decay conf lists those
  names as excludes, because graph mode clips gradients per group and clipping must see one
  global norm (:mod:`bert_of.training.optim`).
- Eager clips with one global norm over all parameters, with the graph's formula.
- Dropout draws from the model's one generator (``model.dropout_generator``), seeded every step
  by (seed, step, rank): runs repeat, resumes replay.
- Gradient accumulation splits the batch into k micro-batches; each micro-batch's loss is
  scaled by 1/k (the graph does the same).
- AMP: the graph gets OneFlow's GradScaler conf; eager steps a dynamic loss scaler of our own
  (fp16 autocast on CUDA; on CPU both run in fp32 and change nothing).

Shapes: B batch (this rank's rows), S sequence.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import replace

import numpy as np

from bert_of._flow import flow
from bert_of.errors import ConfigError
from bert_of.outputs import SCALAR_OUTPUTS
from bert_of.options import TrainConfig
from bert_of.training.optim import (DynamicLossScaler, GradientViews, build_optimizer, build_scheduler,
                                    clip_by_global_norm)
from bert_of.training.runtime import Runtime, scalar, to_numpy
from bert_of.training.state import NonFiniteError

MAX_AMP_NONFINITE = 10  # AMP: consecutive non-finite losses the loss scaler may skip before training stops


def _scalars(out) -> tuple:
    """The scalar outputs a forward computed, (names, tensors), loss first."""
    names = tuple(k for k in SCALAR_OUTPUTS if getattr(out, k, None) is not None)
    if not names or names[0] != "loss":
        raise ConfigError("the model computed no loss: the batch lacks its labels")
    return names, tuple(getattr(out, k) for k in names)


def state_names(model) -> dict:
    """{parameter key: the name its optimizer state is stored under}: the canonical spelling
    (a bert_of model's ``state_name``; the same key but for pre-LN's LayerNorms), else the key."""
    spell = getattr(model, "state_name", None)
    return {k: spell(k) if spell else k for k, _ in model.named_parameters()}


def _state_tensor(rt: Runtime, arr):
    """An optimizer-state array as a tensor where the parameters live (broadcast when global)."""
    t = flow.tensor(np.ascontiguousarray(arr))
    if rt.placement is not None:
        t = t.to_global(placement=rt.placement, sbp=flow.sbp.broadcast)
    elif rt.device != "cpu":
        t = t.to(rt.local_device)
    return t


class _Forward(flow.nn.Module):
    """``model(**batch, **extra)`` -> its scalar outputs as a tuple: what eager DDP's hooks understand."""

    def __init__(self, model, extra: dict):
        super().__init__()
        self.model, self.extra, self.keys, self.names = model, extra, None, None

    def forward(self, *tensors):
        self.names, values = _scalars(self.model(**dict(zip(self.keys, tensors)), **self.extra))
        return values


class TrainGraph(flow.nn.Graph):
    """One optimizer step per call: forward (which computes the loss), backward, clip, update, LR step."""

    def __init__(self, model, opt, sched, cfg: TrainConfig):
        super().__init__()
        self.model = model  # parameters (and optimizer state) are named "model.<canonical name>"
        self.keys, self.names = None, None
        self.add_optimizer(opt, lr_sch=sched)
        if cfg.grad_accum_steps > 1:
            self.config.set_gradient_accumulation_steps(cfg.grad_accum_steps)
        if cfg.amp:
            self.config.enable_amp(True)
            self.set_grad_scaler(flow.amp.GradScaler(init_scale=2.0 ** 30, growth_factor=2.0, backoff_factor=0.5,
                                                     growth_interval=2000))

    def build(self, *tensors):
        self.names, values = _scalars(self.model(**dict(zip(self.keys, tensors))))
        values[0].backward()
        return values


# --------------------------------------------------------------------------- the two ways of a step
#
# Each builds its optimizer and schedule and has: start(keys) before the first batch;
# run(batch, read) -> outputs, one optimizer update (``read`` turns the micro-batches' scalars into
# numbers and checks the loss, before any eager update); slots() / load_slots(slots, step): the
# optimizer state as {m/<name>, v/<name>, momentum/<name>: array}. The scheduler steps in Trainer.


class GraphStep:
    """The whole step (micro-batches, clip, update, schedule) in one compiled ``nn.Graph`` call."""

    scaler = None  # AMP: the graph's own GradScaler conf

    def __init__(self, model, cfg: TrainConfig, rt: Runtime):
        self.rt = rt
        self.names = state_names(model)
        self.opt = build_optimizer(model, cfg, for_graph=True)
        self.sched = build_scheduler(self.opt, cfg)
        self.graph = TrainGraph(model, self.opt, self.sched, cfg)

    def start(self, keys: tuple) -> None:
        self.keys = self.graph.keys = keys

    def run(self, batch: dict, read) -> dict:
        values = self.graph(*[self.rt.tensor(batch[k]) for k in self.keys])
        return read(self.graph.names, [values])

    def slots(self) -> dict:
        # The graph's own step counter is not read back: on 2 ranks reading it hangs rank 1
        # in OneFlow 0.9, and it equals the trainer's step anyway.
        out = {}
        for key, t in self.graph.state_dict().items():
            for suffix, slot in (("-m", "m"), ("-v", "v"), ("-momentum", "momentum")):
                if key.startswith("model.") and key.endswith(suffix):
                    param = key[len('model.'):-len(suffix)]
                    out[f"{slot}/{self.names.get(param, param)}"] = to_numpy(t)
        return out

    def load_slots(self, slots: dict, step) -> None:
        """Before the graph's first call (it reads them when it compiles)."""
        suffix = {"m": "-m", "v": "-v", "momentum": "-momentum"}
        key_of = {name: key for key, name in self.names.items()}
        graph_state = {f"model.{key_of.get(k.partition('/')[2], k.partition('/')[2])}{suffix[k.partition('/')[0]]}":
                       _state_tensor(self.rt, a) for k, a in slots.items()}
        if step is not None:  # the graph's schedule reads its train step
            graph_state["System-Train-TrainStep"] = _state_tensor(self.rt, np.array([int(step)], np.int64))
        self.graph.load_state_dict(graph_state, strict=False)


class EagerStep:
    """Forward and backward per micro-batch (DDP all-reduces the gradients), then the loss scaler's
    check (AMP), global-norm clip and update by hand."""

    def __init__(self, model, cfg: TrainConfig, rt: Runtime, ddp_world: int | None):
        self.model, self.cfg, self.rt = model, cfg, rt
        extra = {}
        if rt.ddp and "ddp_world" in inspect.signature(model.forward).parameters:
            extra["ddp_world"] = rt.world if ddp_world is None else ddp_world  # its loss normalises over the ranks
        self.scalars_of = _Forward(model, extra)  # model -> its scalars
        if rt.ddp:
            # OneFlow 0.9's DDP returns the module itself with gradient all-reduce hooks
            # (and broadcasts rank 0's parameters); its hooks understand tuples of tensors.
            self.scalars_of = flow.nn.parallel.DistributedDataParallel(self.scalars_of)
        self.opt = build_optimizer(model, cfg, for_graph=False)
        self.sched = build_scheduler(self.opt, cfg)
        self.views = GradientViews()  # the gradients' memory for the native clip, kept step to step
        # AMP keeps its own dynamic loss scale (the graph uses OneFlow's GradScaler conf).
        self.scaler = DynamicLossScaler() if cfg.amp else None

    def start(self, keys: tuple) -> None:
        self.keys = self.scalars_of.keys = keys

    def run(self, batch: dict, read) -> dict:
        k = self.cfg.grad_accum_steps
        n = len(batch[self.keys[0]])
        if n % k:
            raise ConfigError(f"batch of {n} does not split into {k} accumulation steps")
        scale = self.scaler.scale if self.scaler else 1.0
        micro_values = []
        for i in range(k):
            micro = [self.rt.tensor(batch[key][i * n // k:(i + 1) * n // k]) for key in self.keys]
            with self._autocast():
                values = self.scalars_of(*micro)
            (values[0] * (scale / k)).backward()
            micro_values.append(values)
        out = read(self.scalars_of.names, micro_values)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.scaler is None or self.scaler.unscale_and_check(params):
            if self.cfg.clip_grad_norm:
                out["grad_norm"] = scalar(clip_by_global_norm(params, float(self.cfg.clip_grad_norm), self.views))
            self.opt.step()
            skipped = 0.0
        else:
            skipped = 1.0  # inf/nan gradients: no update, smaller scale next time
        self.opt.zero_grad()
        if self.scaler:
            out["skipped"], out["loss_scale"] = skipped, self.scaler.scale
        return out

    def _autocast(self):
        """fp16 autocast on CUDA under AMP; a no-op on CPU (no fp16 matmul kernels there)."""
        if self.cfg.amp and self.rt.device == "cuda":
            return flow.autocast(device_type="cuda", dtype=flow.float16)
        return contextlib.nullcontext()

    def _order(self) -> list:
        return [p for g in self.opt.param_groups for p in g.parameters]

    def slots(self) -> dict:
        out = {}
        order = self._order()
        names = state_names(self.model)
        by_param = {id(p): names[n] for n, p in self.model.named_parameters()}
        for idx, slots in self.opt.state_dict()["state"].items():
            if idx == "step":
                continue
            name = by_param[id(order[idx])]
            for key, slot in (("exp_avg", "m"), ("exp_avg_sq", "v"), ("momentum_buf", "momentum")):
                if key in slots:
                    out[f"{slot}/{name}"] = to_numpy(slots[key])
        return out

    def load_slots(self, slots: dict, step) -> None:
        sd = self.opt.state_dict()
        names = state_names(self.model)
        params = {names[n]: p for n, p in self.model.named_parameters()}
        position = {id(p): i for i, p in enumerate(self._order())}  # identity: tensor == compares values
        new_state = {"step": int(step if step is not None else sd["state"].get("step", 0))}
        keys = {"m": "exp_avg", "v": "exp_avg_sq", "momentum": "momentum_buf"}
        for key, arr in slots.items():
            slot, _, name = key.partition("/")
            new_state.setdefault(position[id(params[name])], {})[keys[slot]] = _state_tensor(self.rt, arr)
        sd["state"] = new_state
        self.opt.load_state_dict(sd)


# --------------------------------------------------------------------------- the trainer


class Trainer:
    """Train ``model`` with ``cfg`` on ``runtime`` (default: one process, or global tensors when
    launched on several ranks).

    ``step(batch)`` takes this rank's rows as a dict of numpy arrays named like the model's
    forward arguments (labels included), runs one optimizer step and returns floats: the
    model's scalar outputs (``loss`` first; pretraining adds mlm_loss, nsp_loss, mlm_acc,
    nsp_acc), ``lr`` (the rate this step used) and, in eager mode, ``grad_norm`` (before
    clipping, when clipping), ``skipped`` / ``loss_scale`` (AMP) and ``rank_loss`` (DDP: this
    rank's own loss; ``loss`` is the mean over the ranks).

    ``cfg.mode`` auto resolves as for fine-tuning (:meth:`Runtime.mode`); `bert-of pretrain` passes
    its own resolution. The step itself is the mode's (:class:`EagerStep` or :class:`GraphStep`); the trainer keeps
    what both share: the step count, the dropout seed, the schedule, the reading of the outputs.
    ``model`` needs ``dropout_generator`` (the heads of :mod:`bert_of.heads` have it).
    ``ddp_world``: what a forward taking ``ddp_world`` gets (BertForPreTraining's MLM
    denominator); default the rank count under eager DDP, else 1.
    """

    def __init__(self, model, cfg: TrainConfig, runtime: Runtime | None = None, ddp_world: int | None = None):
        self.rt = runtime or Runtime.create()
        cfg = replace(cfg, mode=self.rt.mode(cfg.mode, "finetune"))
        self.model, self.cfg = model, cfg
        if self.rt.ddp and cfg.mode == "graph":
            raise ConfigError("DDP is eager data parallelism with local tensors: use mode eager")
        model.train()
        self.rt.place(model)
        # The model's one dropout generator, seeded by (seed, step, rank) every step (see step):
        # runs repeat, and its state is saved with checkpoints for exact resume.
        self.generator = model.dropout_generator
        self.generator.manual_seed(cfg.seed * 1000 + self.rt.rank)
        self.way = GraphStep(model, cfg, self.rt) if cfg.mode == "graph" else EagerStep(model, cfg, self.rt, ddp_world)
        self.opt, self.sched, self.scaler = self.way.opt, self.way.sched, self.way.scaler
        self.keys = None
        self.global_step = 0
        self.nonfinite = 0  # consecutive steps with a non-finite loss (AMP skips a few)

    def current_lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    def step(self, batch: dict) -> dict:
        keys = tuple(batch)
        if self.keys is None:
            self.keys = keys
            self.way.start(keys)
        elif keys != self.keys:
            raise ConfigError(f"batch keys {list(keys)} differ from the first batch's {list(self.keys)}")
        # Dropout masks are a function of (seed, step, rank): a resumed run draws the same ones.
        # (OneFlow 0.9's CPU Generator.get_state/set_state does not replay dropout masks.)
        self.generator.manual_seed((self.cfg.seed * 1_000_003 + self.global_step) * 4099 + self.rt.rank)
        lr = self.current_lr()  # the rate this step uses
        out = self.way.run(batch, self._read)
        self.sched.step()  # the graph keeps its own schedule: there this copy only reports it
        self.global_step += 1
        out["lr"] = lr
        return out

    def _read(self, names: tuple, micro_values: list) -> dict:
        """The ONE place a step's outputs become numbers: the mean over the micro-batches of each
        scalar (under DDP, also over the ranks), and the finiteness check of the loss.

        A non-finite loss stops training (:class:`NonFiniteError` naming the step) before an eager
        update; every rank reads the same loss, so every rank stops. Under AMP the loss scaler
        skips such a step (no update, smaller scale); only ``MAX_AMP_NONFINITE`` in a row stop it.
        """
        k = len(micro_values)
        out = dict.fromkeys(names, 0.0)
        if self.rt.ddp:
            out["rank_loss"] = 0.0
        for values in micro_values:
            for name, v in zip(names, values):
                out[name] += self._report(v) / k
            if self.rt.ddp:
                out["rank_loss"] += scalar(values[0].detach()) / k
        if math.isfinite(out["loss"]):
            self.nonfinite = 0
        else:
            self.nonfinite += 1
            if not self.cfg.amp or self.nonfinite > MAX_AMP_NONFINITE:
                why = f" ({self.nonfinite} steps in a row, beyond what AMP's loss scaler absorbs)" if self.cfg.amp else ""
                raise NonFiniteError(f"the loss is not finite at step {self.global_step + 1} ({out['loss']}){why}")
        return out

    def _report(self, t) -> float:
        """A loss as a float; under DDP the mean over ranks ((l_1 + ... + l_n) / n), which
        equals the loss over the global batch when every rank holds as many rows."""
        if self.rt.ddp:
            t = t.detach().clone()
            flow.comm.all_reduce(t)
            return scalar(t) / self.rt.world
        return scalar(t)

    # ----------------------------------------------------------------------- optimizer state

    def optimizer_state(self) -> tuple:
        """({m/<name>, v/<name>, momentum/<name>: array, step}, metadata): the optimizer's state in
        canonical parameter names, whatever the mode (what a bert_of checkpoint stores)."""
        out = self.way.slots()
        out["step"] = np.asarray(self.global_step, np.int64)
        cfg = self.cfg
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        meta = {"optimizer": cfg.optimizer, "bias_correction": str(cfg.bias_correction).lower(), "eps": repr(cfg.adam_eps),
                "weight_decay": repr(cfg.weight_decay), "exclude_from_weight_decay": ",".join(cfg.no_decay),
                "source": "bert_of", "parameters": str(len(names))}
        return out, meta

    def load_optimizer_state(self, state: dict) -> None:
        """Canonical optimizer state ({m/<name>, v/<name>, momentum/<name>}, and ``step`` when the
        schedule continues from it) into the optimizer, or the graph before its first call."""
        params = set(state_names(self.model).values())
        slots = {}
        for key, arr in state.items():
            if key == "step":
                continue
            slot, _, name = key.partition("/")
            if slot not in ("m", "v", "momentum") or name not in params:
                raise ConfigError(f"optimizer state {key!r}: not a slot of this model's parameters")
            slots[key] = arr
        self.way.load_slots(slots, state.get("step"))
