"""Inference over many rows, whichever engine runs the model: :func:`infer`, which every task's
predict step and ``bert-of predict`` use. The inputs pass the model's input gate here, once, on the
host; then OneFlow's engine (:mod:`bert_of.training.oneflow_engine`: memory budgets, length
buckets, one compiled encoder layer for every layer on CPU) or onnxruntime's
(:mod:`bert_of.training.onnxruntime_engine`) runs the batches, each padded to its longest row
(:mod:`bert_of.training.padding`). OneFlow's engine, and OneFlow with it, is imported only for a
OneFlow model: onnxruntime's predicts without it.
"""

from __future__ import annotations

from bert_of.inputs import check_inputs
from bert_of.training.onnxruntime_engine import OnnxModel
from bert_of.training.runtime import Runtime


def infer(model, inputs: list, outputs: tuple, batch_size: int, mode: str, rt: Runtime, *,
          pad_to_batch: bool = True, positions: tuple = (), fill: float = 0.0,
          graph_budget: int | None = None, stats: dict | None = None) -> list:
    """Run ``model`` (eval mode, no autograd) over rows of ``inputs`` (input_ids, token_type_ids,
    attention_mask: [n, S]) in global batches of ``batch_size`` rows; returns one float32 array per
    output name, rows in input order.

    ``pad_to_batch`` (bert_of.training.padding): rows sorted by length, each batch run at its
    longest row (rounded up to PAD_MULTIPLE tokens), S only the cap; the attention mask makes the
    real positions' results the same as at S to float rounding. False: every batch at S (max
    padding, run_classifier's way). ``positions``: the names among ``outputs`` with a position axis
    ([n, S, ...]: a tagger's logits, SQuAD's start/end logits); they come back S wide, ``fill`` at
    the positions a batch did not compute (past its longest row: padding of every row in it).

    Graph mode compiles ONE graph and reports its build once. One, because OneFlow 0.9 frees
    nothing of a compiled graph when it is deleted (measured: +1.7 GB per MiniLM graph of 4 x 384,
    kept after ``del`` and gc), so a graph per batch width would each add a graph's memory for good:
    padding to the batch, its width is the longest row of all (rounded up). In one CPU process that
    graph is one encoder layer, run for every layer (:class:`~bert_of.training.oneflow_engine.LayerwiseRunner`,
    :func:`~bert_of.training.oneflow_engine.graph_rows` of one layer per call); on CUDA or several
    ranks it is the whole model, [rows per call, width], the last batch padded to it
    (``graph_budget``: the bytes of activations a CPU graph may hold, default
    :data:`~bert_of.training.oneflow_engine.GRAPH_CPU_BUDGET`). Eager CPU calls hold at most
    :func:`~bert_of.training.padding.eager_rows` rows of their width, whatever ``batch_size`` says:
    the results are the same. ``stats`` (a dict) receives the graphs built, their build seconds, the
    rows per call and the token positions computed (padding included).

    ``model`` may also be an :class:`~bert_of.training.onnxruntime_engine.OnnxModel` (``--engine
    onnxruntime``): the same inputs checked here, the same batches and outputs, run by its session
    (``mode`` and ``rt`` are OneFlow's and do not apply)."""
    check_inputs(model.config, inputs[0], inputs[1])  # on the host, once: graphs do not check
    if isinstance(model, OnnxModel):  # --engine onnxruntime: the same batches, on onnxruntime's session
        return model.infer(inputs, outputs, batch_size, pad_to_batch=pad_to_batch, positions=positions, fill=fill,
                           stats=stats)
    from bert_of.training.oneflow_engine import infer_oneflow  # OneFlow's model: OneFlow is loaded

    return infer_oneflow(model, inputs, outputs, batch_size, mode, rt, pad_to_batch=pad_to_batch, positions=positions,
                         fill=fill, graph_budget=graph_budget, stats=stats)
