"""Optimizers, Google's learning-rate schedule, global-norm clipping and the eager loss scaler.

The recipe is Google's (optimization.py); the hyper-parameters and their defaults are
:class:`bert_of.options.TrainConfig`'s.
"""

from __future__ import annotations

import math

import numpy as np

import bert_of.runtime.update_kernels as update_kernels
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


class _AdamW(flow.optim.AdamW):
    """flow.optim.AdamW whose eager step on CPU updates each parameter group in one native pass
    (:func:`bert_of.runtime.update_kernels.adamw`: OneFlow's adam_update bit for bit, on every core)
    instead of an adam_update op per parameter; the same state (``exp_avg``, ``exp_avg_sq`` per
    parameter, ``step``), so state_dict and load_state_dict are flow.optim.AdamW's. A group the
    kernel does not take (amsgrad, fused, CUDA, global tensors, ``BERT_OF_CPU_ADAMW=0``) runs
    OneFlow's per-parameter update, as ``super().step`` would."""

    def step(self, closure=None):
        if closure is not None:
            return super().step(closure)
        with flow.no_grad():
            for index, group in enumerate(self.param_groups):  # flow.optim.AdamW.step's loop, OneFlow 0.9
                if group["do_bias_correction"]:
                    group["bias_correction1"] = 1.0 - math.pow(group["betas"][0], self._state["step"] + 1)
                    group["bias_correction2"] = 1.0 - math.pow(group["betas"][1], self._state["step"] + 1)
                if group["fused"]:
                    self._fused_update(group)
                elif group["amsgrad"] or not self._native_update(group, index):
                    self._single_tensor_update(group)
            self._state["step"] += 1
        return None

    def _native_update(self, group, index: int) -> bool:
        if not hasattr(self, "_views"):  # the parameters' and state's memory, kept between steps
            self._views = update_kernels.Views()
        params = [p for p in group.parameters if p.grad is not None]
        if not params:
            return True
        for p in params:  # as _single_tensor_update creates them
            state = self._state[p]
            if "exp_avg" not in state:
                state["exp_avg"] = flow.zeros_like(p)
            if "exp_avg_sq" not in state:
                state["exp_avg_sq"] = flow.zeros_like(p)
        return update_kernels.adamw(
            params, [p.grad for p in params], [self._state[p]["exp_avg"] for p in params],
            [self._state[p]["exp_avg_sq"] for p in params], lr=group["lr"], beta1=group["betas"][0],
            beta2=group["betas"][1], eps=group["eps"], weight_decay=group["weight_decay"],
            bias_correction1=group["bias_correction1"], bias_correction2=group["bias_correction2"],
            views=self._views, group=index)


_OPTIMIZERS = {"adamw": _AdamW, "lamb": flow.optim.LAMB, "sgd": flow.optim.SGD}
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


GradientViews = update_kernels.Views  # what clip_by_global_norm takes as ``views``


def clip_by_global_norm(params, max_norm: float, views=None):
    """grads *= max_norm / max(||g||, max_norm), ||g|| over ALL params: the graph's formula.

    (``flow.nn.utils.clip_grad_norm_`` divides by norm + 1e-6 instead, which
    drifts from graph mode by ~1e-6 relative per clipped step.)

    Local eager float32 CPU gradients: the norm is one native pass over all of them, summed in
    float64 (:func:`bert_of.runtime.update_kernels.global_norm`; OneFlow's ~200 products and sums,
    each single-threaded, took ~50 ms a MiniLM step), the scaling another (when the norm is over
    max_norm; a norm within it makes the factor exactly 1, so nothing is multiplied: the same bits).
    Otherwise (graphs, global tensors, CUDA, ``BERT_OF_CPU_CLIP=0``) OneFlow's ops. ``views``: the
    caller's :class:`bert_of.runtime.update_kernels.Views`, kept from step to step.
    """
    grads = [p.grad for p in params]
    with flow.no_grad():
        native = update_kernels.global_norm(grads, views)
        if native is not None:
            limit = np.float32(max_norm)
            if native <= limit or (math.isfinite(native) and update_kernels.scale(grads, limit / native, views)):
                return flow.tensor(native)
            norm = flow.tensor(native)  # not finite, or the scaling does not apply: OneFlow's formula
        else:
            norm = flow.sqrt(sum((g * g).sum() for g in grads))
            if not (norm.is_lazy or norm.is_global) and norm.device.type == "cpu" and \
                    float(norm.numpy()) <= float(np.float32(max_norm)):
                return norm
        coef = max_norm / flow.maximum(norm, flow.ones_like(norm) * max_norm)
        for g in grads:
            g.mul_(coef)
    return norm
