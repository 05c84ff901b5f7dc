"""Fine-tuning and prediction for SQuAD (v1.1 / v2.0) and GLUE / XNLI.

    finetune_squad(opts) / predict_squad(opts) / eval_squad(opts)
    finetune_glue(opts)  / predict_glue(opts)  / eval_glue(opts)

``opts`` is an ``argparse.Namespace`` (see :mod:`bert_of.eval.finetune_cli` for every option); values
left at None take the task's defaults, which are google-research/bert's:

* SQuAD (``run_squad.py`` flag defaults): lr 5e-5, batch 32, 3 epochs (2 for v2.0), warmup
  proportion 0.1, max_seq_length 384, doc_stride 128, max_query_length 64; prediction n-best 20,
  max answer length 30, null score threshold 0.0.
* GLUE / XNLI (``run_classifier.py``): lr 2e-5, batch 32, 3 epochs, warmup 0.1, max_seq_length 128.
* Both: Google's AdamWeightDecay (AdamW without bias correction, eps 1e-6, weight decay 0.01 not
  on LayerNorm / bias), linear warmup from 0 to lr then linear decay to 0 (:func:`google_schedule`),
  global-norm clipping at 1.0;
  ``steps = int(train examples / batch * epochs)`` (examples, not windows, as Google counts),
  the batch being the global batch over all ranks.

Losses: SQuAD = (CE(start) + CE(end)) / 2 over all positions (an answer outside a window, and a
v2.0 impossible question, point at [CLS]); classification = CE; STS-B = MSE on one output.

Runs eagerly or as an ``nn.Graph`` (default), on one process or several launched with
``python -m oneflow.distributed.launch`` (parameters broadcast, batch split(0) over the ranks;
rank 0 writes files and prints). This module imports OneFlow; the rest of :mod:`eval` does not.
"""
