"""Training BERT: one trainer for pretraining, SQuAD / GLUE fine-tuning and the alignment suite.

    from bert_of.training import TrainConfig, Trainer
    trainer = Trainer(model, TrainConfig(mode="graph", lr=1e-4, steps=1000))
    out = trainer.step(batch)   # numpy rows named like model.forward's arguments, labels included

Modules: :mod:`~bert_of.training.optim` (config, optimizers, schedule, clipping, loss scaling),
:mod:`~bert_of.training.runtime` (one process, global tensors over ranks, or DDP),
:mod:`~bert_of.training.trainer` (the step: eager / nn.Graph, accumulation, AMP),
:mod:`~bert_of.training.state` (run directories, checkpoints, exact resume),
:mod:`~bert_of.training.loop` (the loop: metrics.jsonl, progress, periodic checkpoints).
Inside the library, import from those modules; this package namespace is for users.
"""

from bert_of.training.loop import Callback, FitResult, ShuffledRows, StopAfter, fit
from bert_of.options import TrainConfig
from bert_of.training.optim import DynamicLossScaler, build_optimizer, build_scheduler, clip_by_global_norm
from bert_of.training.runtime import Runtime
from bert_of.training.state import RunDir, latest_checkpoint, restore, save_checkpoint
from bert_of.training.trainer import Trainer, TrainGraph

__all__ = ["TrainConfig", "Trainer", "TrainGraph", "Runtime", "DynamicLossScaler", "build_optimizer",
           "build_scheduler", "clip_by_global_norm", "fit", "FitResult", "Callback", "StopAfter", "ShuffledRows", "save_checkpoint",
           "restore", "latest_checkpoint", "RunDir"]
