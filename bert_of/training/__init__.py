"""Training BERT: one trainer for pretraining, fine-tuning and the alignment suite.

:mod:`~bert_of.training.optim` (optimizers, schedule, clipping, loss scaling),
:mod:`~bert_of.training.trainer` (the train step, eager and nn.Graph, local and global),
:mod:`~bert_of.training.state` (checkpoints and exact resume).
"""

from bert_of.training.optim import (DynamicLossScaler, TrainConfig, build_optimizer, build_scheduler,
                                    clip_by_global_norm)
from bert_of.training.trainer import BATCH_KEYS, LOSS_KEYS, PretrainGraph, Trainer, pretraining_loss

__all__ = ["TrainConfig", "Trainer", "PretrainGraph", "DynamicLossScaler", "build_optimizer", "build_scheduler",
           "clip_by_global_norm", "pretraining_loss", "BATCH_KEYS", "LOSS_KEYS"]
