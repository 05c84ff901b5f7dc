"""Fine-tuning and prediction for SQuAD (v1.1 / v2.0) and GLUE / XNLI, on the shared trainer.

    squad.finetune_squad(SquadOptions(...)) / predict_squad(...) / eval_squad(...)
    glue.finetune_glue(GlueOptions(...))    / predict_glue(...)  / eval_glue(...)

Options are one dataclass per task (:mod:`~bert_of.finetuning.options`; the CLI,
:mod:`bert_of.finetuning.cli`, generates its parsers from them). The defaults are
google-research/bert's:

* SQuAD (``run_squad.py`` flag defaults): lr 5e-5, batch 32, 3 epochs (2 for v2.0), warmup
  proportion 0.1, max_seq_length 384, doc_stride 128, max_query_length 64; prediction n-best 20,
  max answer length 30, null score threshold 0.0.
* GLUE / XNLI (``run_classifier.py``): lr 2e-5, batch 32, 3 epochs, warmup 0.1, max_seq_length 128.
* Both: Google's AdamWeightDecay (AdamW without bias correction, eps 1e-6, weight decay 0.01 not
  on LayerNorm / bias), linear warmup from 0 to lr then linear decay to 0, global-norm clipping
  at 1.0; ``steps = int(train examples / batch * epochs)`` (examples, not windows, as Google
  counts), the batch being the global batch over all ranks.

Training is :class:`bert_of.training.Trainer` + :func:`bert_of.training.fit`, the same as
pretraining: the heads compute their losses (SQuAD (CE(start) + CE(end)) / 2, classification CE,
STS-B MSE), eager or ``nn.Graph`` (default), AMP in both, one process or several ranks
(``--nproc``: parameters broadcast, batch split(0); rank 0 writes files and prints), and with a
run directory, metrics.jsonl and checkpoints that resume exactly.
"""
