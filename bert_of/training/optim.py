"""Optimizers, Google's learning-rate schedule, global-norm clipping and the eager loss scaler.

The recipe is Google's (optimization.py); the hyper-parameters and their defaults are
:class:`bert_of.options.TrainConfig`'s.
"""

from __future__ import annotations

import numpy as np

from bert_of._flow import flow
from bert_of.errors import ConfigError
from bert_of.options import TrainConfig


# --------------------------------------------------------------------------- optimizer and schedule


def _decays(name: str, cfg: TrainConfig) -> bool:
    return not any(pat in name for pat in cfg.no_decay)


def build_optimizer(model, cfg: TrainConfig, for_graph: bool):
    """The optimizer. Eager: two groups (decay, no decay). Graph: ONE group whose weight-decay conf
    excludes the no-decay names, because graph mode clips per group and the clip must see one
    global norm."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if for_graph:
        groups = [{"params": [p for _, p in named], "weight_decay": cfg.weight_decay}]
        if cfg.clip_grad_norm:
            groups[0].update(clip_grad_max_norm=float(cfg.clip_grad_norm), clip_grad_norm_type=2.0)
    else:
        groups = [{"params": [p for n, p in named if _decays(n, cfg)], "weight_decay": cfg.weight_decay},
                  {"params": [p for n, p in named if not _decays(n, cfg)], "weight_decay": 0.0}]
    kinds = _GRAPH_OPTIMIZERS if for_graph and cfg.weight_decay else _OPTIMIZERS
    if cfg.optimizer not in kinds:
        raise ConfigError(f"optimizer {cfg.optimizer!r} is not one of adamw, lamb, sgd")
    if cfg.optimizer == "adamw":
        opt = kinds["adamw"](groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps,
                             do_bias_correction=cfg.bias_correction)
    elif cfg.optimizer == "lamb":
        opt = kinds["lamb"](groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps, adam_w_mode=True,
                            do_bias_correction=cfg.bias_correction)
    else:
        opt = kinds["sgd"](groups, lr=cfg.lr, momentum=cfg.momentum)
    if kinds is _GRAPH_OPTIMIZERS:
        opt.no_decay, opt.no_decay_params = tuple(cfg.no_decay), [p for n, p in named if not _decays(n, cfg)]
    return opt


class _GraphDecayExcludes:
    """A graph optimizer whose conf skips weight decay for the no-decay parameters (``no_decay``
    name patterns, ``no_decay_params``): Adam/LAMB decay is a conf with name patterns to exclude,
    SGD's a per-variable L2."""

    no_decay: tuple = ()
    no_decay_params: list = []

    def _generate_conf_for_graph(self, train_conf, vars_conf):
        confs = super()._generate_conf_for_graph(train_conf, vars_conf)
        if isinstance(self, flow.optim.SGD):
            for p in self.no_decay_params:
                vars_conf[p].l2 = 0.0
        else:
            for conf in confs:
                conf.weight_decay_conf.excludes.pattern.extend(self.no_decay)
        return confs


class _GraphAdamW(_GraphDecayExcludes, flow.optim.AdamW):
    pass


class _GraphLAMB(_GraphDecayExcludes, flow.optim.LAMB):
    pass


class _GraphSGD(_GraphDecayExcludes, flow.optim.SGD):
    pass


_OPTIMIZERS = {"adamw": flow.optim.AdamW, "lamb": flow.optim.LAMB, "sgd": flow.optim.SGD}
_GRAPH_OPTIMIZERS = {"adamw": _GraphAdamW, "lamb": _GraphLAMB, "sgd": _GraphSGD}


def build_scheduler(opt, cfg: TrainConfig):
    """google-research/bert's schedule, in eager and graph alike: lr * step / warmup while
    step < warmup, then polynomial decay over the GLOBAL step, lr * (1 - step / total)^power
    (to end_lr). OneFlow's WarmupLR would ramp to the decayed rate lr * (1 - warmup / total)
    instead of to lr; chaining LinearLR and PolynomialLR without interval rescaling does not.
    """
    sch = flow.optim.lr_scheduler
    decay = sch.PolynomialLR(opt, decay_batch=cfg.steps, end_learning_rate=cfg.end_lr, power=cfg.power)
    if cfg.warmup_steps <= 0:
        return decay
    ramp = sch.LinearLR(opt, start_factor=0.0, end_factor=1.0, total_iters=cfg.warmup_steps)
    return sch.SequentialLR(opt, schedulers=[ramp, decay], milestones=[cfg.warmup_steps], interval_rescaling=[False])


class DynamicLossScaler:
    """Dynamic loss scaling for fp16 training (eager; the graph has OneFlow's own).

    The loss is multiplied by ``scale`` before backward. Then: any inf/nan in the
    gradients -> skip the update and scale *= backoff; otherwise unscale the
    gradients, update, and after ``growth_interval`` good steps in a row scale *= growth.
    """

    def __init__(self, init_scale=2.0 ** 16, growth=2.0, backoff=0.5, growth_interval=2000, min_scale=1.0):
        self.scale, self.growth, self.backoff = float(init_scale), growth, backoff
        self.growth_interval, self.min_scale, self.good_steps = growth_interval, min_scale, 0

    def unscale_and_check(self, params) -> bool:
        """Divide grads by the scale; True if all are finite (then step), else False (skip)."""
        with flow.no_grad():
            finite = all(bool(flow.isfinite(p.grad).all().numpy()) for p in params)
            if not finite:
                self.scale = max(self.scale * self.backoff, self.min_scale)
                self.good_steps = 0
                return False
            if self.scale != 1.0:
                for p in params:
                    p.grad.mul_(1.0 / self.scale)
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0
        return True

    def state_dict(self):
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state):
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])


def clip_by_global_norm(params, max_norm: float):
    """grads *= max_norm / max(||g||, max_norm), ||g|| over ALL params: the graph's formula.

    (``flow.nn.utils.clip_grad_norm_`` divides by norm + 1e-6 instead, which
    drifts from graph mode by ~1e-6 relative per clipped step.)

    A local CPU norm within max_norm makes the factor exactly 1: the multiplications (one
    single-threaded pass over every gradient, ~20 ms a MiniLM step) are skipped, the same bits
    (the caller reads the norm anyway).
    """
    with flow.no_grad():
        norm = flow.sqrt(sum((p.grad * p.grad).sum() for p in params))
        if not (norm.is_lazy or norm.is_global) and norm.device.type == "cpu" and \
                float(norm.numpy()) <= float(np.float32(max_norm)):
            return norm
        coef = max_norm / flow.maximum(norm, flow.ones_like(norm) * max_norm)
        for p in params:
            p.grad.mul_(coef)
    return norm
