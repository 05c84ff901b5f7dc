"""``bert-of align``: prove that eager, graph, multi-rank, accumulation and converted
checkpoints train the same.

What the OneFlow BERT work did by hand, as one command: every experiment trains a
BertForPreTraining two (or more) ways from ONE initialisation, dropout off, data
read in order (no shuffling), and compares the per-step losses:

    1 eager-graph     eager vs nn.Graph; SGD momentum 0.9, lr 1e-3, batch 32, constant lr
    2 schedulers      eager vs graph with linear warmup + polynomial decay, under SGD, AdamW, LAMB
    3 accumulation    batch 32 vs 8 x 4 gradient-accumulation steps (eager and graph)
    4 data-parallel   1 process x 32 vs 2 ranks x 16: global tensors (graph, eager) and eager DDP
    5 data-sharding   2 ranks on data_diff / data_shuffle / data_repeat (per-rank part files)
    6 clipping        one global-norm clip: eager, graph, 2-rank global graph, 2-rank DDP
    7 tf-checkpoint   continue a Google TF checkpoint (tf2of --with-optimizer) vs the TF reference
    8 amp             AMP vs fp32 (CUDA only; skipped with the reason on CPU)

Each experiment writes ``OUT/NAME.json`` (per-step losses of every run, max |diff|,
max relative diff over the first 10 and over all steps, pass/fail against its stated
tolerance) and ``OUT/NAME.png`` (curves overlaid + their relative difference);
``OUT/summary.json`` lists them all. Exit status 1 if any experiment fails.

Comparisons are "equal" (the tolerance applies), "differ" (a control that must NOT
be equal: it proves the check can see the difference it is about) or "info"
(measured and explained, no verdict). Runs are keyed by their full spec, so
experiments that need the same run (the 1-process baseline of 1, 3, 4) share it.

Every run trains with :class:`bert_of.training.Trainer`, through its public API only.
Multi-rank runs are executed as ranks of :mod:`bert_of.launch` (``python -m bert_of.launch
--job ... -m bert_of.align.runner BATCH.json RESULTS_DIR``: all multi-rank runs of an invocation
in one launch); 1-process runs in this process (``--jobs 1``) or in ``--jobs J`` worker processes.

Modules: :mod:`~bert_of.align.plans` (the experiments as data), :mod:`~bert_of.align.data`
(datasets), :mod:`~bert_of.align.runner` (runs, workers, launches, cache),
:mod:`~bert_of.align.report` (comparisons, reports, plots), :mod:`~bert_of.align.cli`.
"""
