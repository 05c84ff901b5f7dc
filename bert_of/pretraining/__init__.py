"""Pretraining: ``bert-of pretrain`` on the shared trainer.

    run.py      the run: data -> :class:`bert_of.training.Trainer` -> a checkpoint
    options.py  :class:`~bert_of.pretraining.options.PretrainOptions` (the parser is generated from them)
    cli.py      the ``pretrain`` and ``plot`` commands (cheap to import: no OneFlow)

Fine-tuning, on the same trainer, is its sibling :mod:`bert_of.finetuning`.
"""
