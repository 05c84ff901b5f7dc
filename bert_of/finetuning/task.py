"""A fine-tuning task as one class: google-research/bert's ``DataProcessor`` grown to the whole job.

A task declares its options (one dataclass: the parsers of ``finetune``/``predict``/``eval TASK``
are generated from it), the help each command shows, the file its predictions go to, and three
methods: ``finetune``, ``predict`` and ``evaluate`` (features, head, metrics and predictions
writer live beside them in the task's module). The shared steps are :mod:`bert_of.finetuning.steps`'s
(the runtime and model to run, tokenizers, lengths, records: no OneFlow) and
:mod:`bert_of.finetuning.driver`'s (training on the one trainer, publishing: OneFlow).

Adding a task = its module (declaring ``TASK = MyTask()``) + one line in :data:`MODULES`.
A task module imports only cheap modules at its top (the CLI builds every task's parser without
OneFlow); its methods import the shared steps when they run (OneFlow loads with its engine's model,
or the driver's trainer; ``--engine onnxruntime`` predicts without it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from bert_of.finetuning.options import EVAL, PREDICT, TRAIN

# One line a task: bert_of/finetuning/<module>.py declares TASK.
MODULES = (
    "squad",
    "glue",
    "classify",
    "tag",
)


@dataclass(frozen=True)
class Help:
    """What ``bert-of COMMAND TASK --help`` shows (and the one-line ``help`` in COMMAND's list)."""

    help: str
    description: str
    examples: tuple = ()


@dataclass
class ModelRun:
    """What every task's predict step returns besides its own results: the model it ran (its bert_of
    folder, display name, identity path, train_args.json, whether its head was newly initialised)
    and the settings it ran with."""

    model_path: str
    model_name: str
    identity_path: str
    train_args: dict
    new_head: bool
    settings: dict


class Task:
    """One task. Subclasses set the class attributes and implement the three methods.

    ``predictions_file``: what ``predict``/``eval -o DIR`` writes into DIR. ``file_kinds``: None when
    ``-o`` is always a folder; else ``predict -o`` may name the predictions file itself, ending with
    one of these (``()``: any ending). ``helps``: {command: :class:`Help`} for ``finetune``,
    ``predict`` and ``eval``.
    """

    name: str
    options: type
    predictions_file: str
    file_kinds: tuple | None = None
    helps: dict

    def finetune(self, opts) -> dict:
        """Fine-tune in the run folder ``opts.output``, publish its final/, evaluate ``opts.eval_data``."""
        raise NotImplementedError

    def predict(self, opts, trained: str | None = None, model=None, rt=None):
        """Predictions for ``opts.data``, written by rank 0; a :class:`ModelRun` (None on other ranks)."""
        raise NotImplementedError

    def evaluate(self, opts, trained: str | None = None, model=None, rt=None) -> dict | None:
        """Predict a labeled file, score it, print the scores as JSON and record them."""
        raise NotImplementedError

    def run(self, command: str, opts):
        """The method of ``bert-of COMMAND TASK``."""
        return {TRAIN: self.finetune, PREDICT: self.predict, EVAL: self.evaluate}[command](opts)


def _load() -> dict:
    out = {}
    for m in MODULES:
        task = importlib.import_module(f"bert_of.finetuning.{m}").TASK
        if task.name in out:
            raise AssertionError(f"bert_of/finetuning/{m}.py: task name {task.name!r} is taken")
        out[task.name] = task
    return out


TASKS: dict = _load()  # name -> Task, in the order the commands list them


def get(name: str) -> Task:
    return TASKS[name]


__all__ = ["Help", "ModelRun", "MODULES", "TASKS", "Task", "get"]
