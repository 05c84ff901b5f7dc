"""Pretraining: the loss, optimizers, LR schedule, and eager / nn.Graph train steps.

The same model trains three ways that must agree (see ``bert-of align``):
eagerly, inside an ``nn.Graph``, and either of them over several ranks with
global tensors. Choices that make them agree:

- Weight decay skips names containing bias / LayerNorm / layer_norm (Google's
  optimization.py). Eager uses two parameter groups; the graph uses ONE group
  whose weight-decay conf lists those names as excludes, because graph mode
  clips gradients per group and clipping must see one global norm.
- Eager clips with one ``clip_grad_norm_`` over all parameters, for the same
  reason.
- Losses are Google's: MLM = sum(w * nll) / (sum(w) + 1e-5) over the masked
  positions, NSP = mean nll; with global tensors the denominator is made
  broadcast (a partial-sum / partial-sum division is not supported).

Shapes: B batch, S sequence, P max predictions per sequence, V vocab.
"""

from __future__ import annotations

import numpy as np

from bert_of._flow import flow
from bert_of.training.optim import DynamicLossScaler, TrainConfig, build_optimizer, build_scheduler, clip_by_global_norm

BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids",
              "masked_lm_weights", "next_sentence_labels")


# --------------------------------------------------------------------------- loss


def pretraining_loss(prediction_logits, seq_relationship_logits, masked_lm_ids, masked_lm_weights,
                     next_sentence_labels, ddp_world: int = 1) -> dict:
    """prediction_logits [B, P, V], seq_relationship_logits [B, 2], masked_lm_ids int64 [B, P],
    masked_lm_weights float [B, P], next_sentence_labels int64 [B] -> dict of scalars.

    ddp_world > 1 (eager DDP, local tensors): the MLM denominator is the weight
    sum over ALL ranks divided by the rank count, so the mean of the ranks'
    losses (and gradients) equals the loss over the global batch even when
    ranks hold different numbers of real predictions.
    """
    V = prediction_logits.shape[-1]
    nll = flow.nn.functional.cross_entropy(prediction_logits.reshape(-1, V), masked_lm_ids.reshape(-1),
                                           reduction="none")  # [B*P]
    w = masked_lm_weights.reshape(-1)
    if ddp_world > 1:
        total = w.sum().detach().clone()
        flow.comm.all_reduce(total)
        denom = (total + 1e-5) / ddp_world
    else:
        denom = w.sum() + 1e-5
    if denom.is_global:
        denom = denom.to_global(sbp=flow.sbp.broadcast)
    mlm = (w * nll).sum() / denom
    nsp = flow.nn.functional.cross_entropy(seq_relationship_logits, next_sentence_labels.reshape(-1))
    hit = (prediction_logits.argmax(dim=-1).reshape(-1) == masked_lm_ids.reshape(-1)).to(w.dtype)
    mlm_acc = (w * hit).sum() / denom
    nsp_acc = (seq_relationship_logits.argmax(dim=-1) == next_sentence_labels.reshape(-1)).to(w.dtype).mean()
    return {"loss": mlm + nsp, "mlm_loss": mlm, "nsp_loss": nsp, "mlm_acc": mlm_acc, "nsp_acc": nsp_acc}

LOSS_KEYS = ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc")


def forward_loss(model, batch: dict, ddp_world: int = 1) -> dict:
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                masked_lm_positions=batch["masked_lm_positions"])
    return pretraining_loss(out.prediction_logits, out.seq_relationship_logits, batch["masked_lm_ids"],
                            batch["masked_lm_weights"], batch["next_sentence_labels"], ddp_world)


class PretrainingLoss(flow.nn.Module):
    """model + loss as one module returning a tuple (LOSS_KEYS order): what DDP's hooks can wrap."""

    def __init__(self, model, ddp_world: int = 1):
        super().__init__()
        self.model, self.ddp_world = model, ddp_world

    def forward(self, *batch):
        losses = forward_loss(self.model, dict(zip(BATCH_KEYS, batch)), self.ddp_world)
        return tuple(losses[k] for k in LOSS_KEYS)


# --------------------------------------------------------------------------- train steps


class PretrainGraph(flow.nn.Graph):
    """One optimizer step per call: forward, loss, backward, clip, update, LR step."""

    def __init__(self, model, opt, sched, cfg: TrainConfig):
        super().__init__()
        self.model = model
        self.add_optimizer(opt, lr_sch=sched)
        if cfg.grad_accum_steps > 1:
            self.config.set_gradient_accumulation_steps(cfg.grad_accum_steps)
        if cfg.amp:
            self.config.enable_amp(True)
            self.set_grad_scaler(flow.amp.GradScaler(init_scale=2.0 ** 30, growth_factor=2.0, backoff_factor=0.5,
                                                     growth_interval=2000))

    def build(self, *batch):
        losses = forward_loss(self.model, dict(zip(BATCH_KEYS, batch)))
        losses["loss"].backward()
        return tuple(losses[k] for k in LOSS_KEYS)


class Trainer:
    """Train ``model`` (a BertForPreTraining) with ``cfg``; eager or graph, local or global.

    ``step(batch)`` takes a dict of numpy arrays for this rank (keys BATCH_KEYS),
    runs one optimizer step and returns the losses as floats.
    """

    def __init__(self, model, cfg: TrainConfig, placement=None, ddp: bool = False):
        """placement: global tensors over these ranks (params broadcast, batch split(0)).
        ddp: eager data parallel with local tensors; each rank passes its own rows."""
        self.model, self.cfg, self.placement, self.ddp = model, cfg, placement, ddp
        model.train()
        if placement is not None:
            model.to_global(placement=placement, sbp=flow.sbp.broadcast)
        if ddp:
            if cfg.mode == "graph" or placement is not None:
                from bert_of.errors import ConfigError

                raise ConfigError("ddp is eager data parallelism with local tensors: use mode eager, no placement")
        # OneFlow 0.9's DDP returns the module itself with gradient all-reduce hooks;
        # its hooks understand tensors/tuples, so it wraps model + loss.
        self.loss_module = PretrainingLoss(model, flow.env.get_world_size() if ddp else 1)
        if ddp:
            self.loss_module = flow.nn.parallel.DistributedDataParallel(self.loss_module)
        # One generator for every dropout (each nn.Dropout otherwise makes its own, unseeded):
        # runs repeat, and its state is saved with checkpoints for exact resume.
        self.generator = flow.Generator()
        self.generator.manual_seed(cfg.seed * 1000 + flow.env.get_rank())
        for m in model.modules():
            if isinstance(m, flow.nn.Dropout):
                m.generator = self.generator
        self.opt = build_optimizer(model, cfg, for_graph=cfg.mode == "graph")
        self.sched = build_scheduler(self.opt, cfg)
        self.graph = PretrainGraph(model, self.opt, self.sched, cfg) if cfg.mode == "graph" else None
        # Eager AMP keeps its own dynamic loss scale; the graph uses OneFlow's GradScaler conf.
        self.scaler = DynamicLossScaler() if cfg.amp and cfg.mode == "eager" else None
        self.grad_hook = None
        self.global_step = 0

    def _tensor(self, arr):
        dtype = flow.float32 if arr.dtype.kind == "f" else flow.int64
        t = flow.tensor(np.ascontiguousarray(arr), dtype=dtype)
        if self.placement is not None:  # this rank's rows of the global batch
            t = t.to_global(placement=self.placement, sbp=flow.sbp.split(0))
        return t

    def step(self, batch: dict) -> dict:
        # Dropout masks are a function of (seed, step, rank): a resumed run draws the same ones.
        # (OneFlow 0.9's CPU Generator.get_state/set_state does not replay dropout masks.)
        self.generator.manual_seed((self.cfg.seed * 1_000_003 + self.global_step) * 4099 + flow.env.get_rank())
        lr = self.current_lr()  # the rate this step uses
        if self.graph is not None:
            values = self.graph(*[self._tensor(batch[k]) for k in BATCH_KEYS])
            out = {k: _scalar(v) for k, v in zip(LOSS_KEYS, values)}
            self.sched.step()  # the graph keeps its own schedule; this copy only reports it
        else:
            out = self._eager_step(batch)
        self.global_step += 1
        out["lr"] = lr
        return out

    def _eager_step(self, batch):
        k = self.cfg.grad_accum_steps
        n = len(batch["input_ids"])
        if n % k:
            from bert_of.errors import ConfigError

            raise ConfigError(f"batch of {n} does not split into {k} accumulation steps")
        sums = dict.fromkeys(LOSS_KEYS, 0.0)
        scale = self.scaler.scale if self.scaler else 1.0
        for i in range(k):
            micro = {key: self._tensor(v[i * n // k:(i + 1) * n // k]) for key, v in batch.items() if key in BATCH_KEYS}
            with self._autocast():
                losses = dict(zip(LOSS_KEYS, self.loss_module(*[micro[key] for key in BATCH_KEYS])))
            (losses["loss"] * (scale / k)).backward()
            for key in LOSS_KEYS:
                sums[key] += self._report(losses[key]) / k
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.grad_hook is not None:  # tests inject non-finite gradients here
            self.grad_hook(self, params)
        if self.scaler is None or self.scaler.unscale_and_check(params):
            if self.cfg.clip_grad_norm:
                clip_by_global_norm(params, float(self.cfg.clip_grad_norm))
            self.opt.step()
            sums["skipped"] = 0.0
        else:
            sums["skipped"] = 1.0  # inf/nan gradients: no update, smaller scale next time
        self.opt.zero_grad()
        self.sched.step()
        if self.scaler:
            sums["loss_scale"] = self.scaler.scale
        return sums

    def _autocast(self):
        """fp16 autocast on CUDA under AMP; a no-op on CPU (no fp16 matmul kernels there)."""
        import contextlib

        if self.placement is not None:  # global tensors have a placement, not a device
            on_cuda = self.placement.type == "cuda"
        else:
            on_cuda = next(self.model.parameters()).device.type == "cuda"
        if self.cfg.amp and on_cuda:
            return flow.autocast(device_type="cuda", dtype=flow.float16)
        return contextlib.nullcontext()

    def _report(self, t) -> float:
        """A loss as a float; under DDP the mean over ranks ((l_1 + ... + l_n) / n), which
        equals the loss over the global batch when every rank holds as many rows."""
        if self.ddp and flow.env.get_world_size() > 1:
            t = t.detach().clone()
            flow.comm.all_reduce(t)
            return _scalar(t) / flow.env.get_world_size()
        return _scalar(t)

    def current_lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])


def _scalar(t) -> float:
    if t.is_global:
        t = t.to_global(sbp=flow.sbp.broadcast).to_local()
    return float(t.numpy().reshape(-1).mean())
