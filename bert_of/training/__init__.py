"""Training BERT: one trainer for pretraining, SQuAD / GLUE fine-tuning and the alignment suite.

    from bert_of.training import TrainConfig, Trainer
    trainer = Trainer(model, TrainConfig(mode="graph", lr=1e-4, steps=1000))
    out = trainer.step(batch)   # numpy rows named like model.forward's arguments, labels included

Modules: :mod:`~bert_of.training.optim` (config, optimizers, schedule, clipping, loss scaling),
:mod:`~bert_of.training.runtime` (one process, global tensors over ranks, or DDP),
:mod:`~bert_of.training.trainer` (the step: eager / nn.Graph, accumulation, AMP),
:mod:`~bert_of.training.state` (run directories, checkpoints, exact resume),
:mod:`~bert_of.training.loop` (the loop: metrics.jsonl, progress, periodic checkpoints).
Inside the library, import from those modules; this package namespace is for users, and loads
each name's module when the name is first used (the trainer's bring OneFlow).
"""

import importlib

# name -> its module, imported when the name is first used: the package's modules that need no
# OneFlow (padding, inference's dispatch, onnxruntime's engine) load without the trainer's
_LAZY = {
    "TrainConfig": "bert_of.options",
    "Callback": "bert_of.training.loop", "FitResult": "bert_of.training.loop", "ShuffledRows": "bert_of.training.loop",
    "StopAfter": "bert_of.training.loop", "fit": "bert_of.training.loop",
    "DynamicLossScaler": "bert_of.training.optim", "build_optimizer": "bert_of.training.optim",
    "build_scheduler": "bert_of.training.optim", "clip_by_global_norm": "bert_of.training.optim",
    "Runtime": "bert_of.training.runtime",
    "RunDir": "bert_of.training.state", "latest_checkpoint": "bert_of.training.state",
    "restore": "bert_of.training.state", "save_checkpoint": "bert_of.training.state",
    "Trainer": "bert_of.training.trainer", "TrainGraph": "bert_of.training.trainer",
}

__all__ = ["TrainConfig", "Trainer", "TrainGraph", "Runtime", "DynamicLossScaler", "build_optimizer",
           "build_scheduler", "clip_by_global_norm", "fit", "FitResult", "Callback", "StopAfter", "ShuffledRows", "save_checkpoint",
           "restore", "latest_checkpoint", "RunDir"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bert_of.training' has no attribute {name!r}")
