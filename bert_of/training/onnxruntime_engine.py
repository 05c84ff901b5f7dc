"""``--engine onnxruntime``: a checkpoint's prediction run by onnxruntime instead of OneFlow, chosen
by the user, never switched to silently.

The model is the graph ``convert of2onnx`` writes for the checkpoint (the same reader, the same
writer: converters/formats/onnx), built in memory and handed to ``onnxruntime.InferenceSession``
as bytes: nothing is written beside the user's files. :meth:`OnnxModel.infer` is
:func:`bert_of.training.inference.infer`'s engine for it: the same inputs and outputs, rows grouped
by length and each batch padded to its longest row (:mod:`bert_of.training.padding`), outputs back
in input order (:class:`~bert_of.training.padding.Gathered`), so the tasks' post-processing
(softmax, sigmoid, n-best spans, tags) is theirs, once, whatever ran the model.

Threads: onnxruntime's intra-op pool gets bert_of's thread count
(:func:`bert_of.runtime.blas.default_threads`: ``BERT_OF_BLAS_THREADS``, else the CPUs this
process may use), or ``OMP_NUM_THREADS`` when the user set it (onnxruntime's CPU build reads no
environment variable for it); one inter-op thread (the graph is a chain).
"""

from __future__ import annotations

import os
import time

import numpy as np

from bert_of.converters.convert import read as read_checkpoint
from bert_of.converters.formats.onnx import import_onnxruntime, model_bytes
from bert_of.errors import ConfigError
from bert_of.progress import Progress
from bert_of.runtime.blas import default_threads
from bert_of.training.padding import Gathered, eager_rows, length_batches, row_lengths

# infer()'s inputs, in its order ([n, S] each): the graph's inputs are named
INFER_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def session_threads() -> int:
    """onnxruntime's intra-op threads: ``OMP_NUM_THREADS`` when set, else bert_of's default."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given:
        try:
            n = int(given.split(",")[0])  # OpenMP's list form: the outer level
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"OMP_NUM_THREADS={given!r}: not a positive integer")
        return n
    return default_threads()


class OnnxModel:
    """The bert_of checkpoint folder ``path`` as onnxruntime runs it (CPU). ``config``: its
    BertConfig; ``outputs``: the graph's output names (``logits``, ``start_logits``, ...: the
    checkpoint's heads); ``notes``: the ONNX writer's; ``build_seconds``: reading + building +
    the session's optimisation."""

    def __init__(self, path: str, threads: int | None = None):
        ort = import_onnxruntime()
        t0 = time.perf_counter()
        source = read_checkpoint(path, "of")  # what `convert of2onnx` reads
        data, self.notes = model_bytes(source)
        self.config = source.config
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: its warnings are not ours to show
        self.threads = threads or session_threads()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        del data
        self.outputs = tuple(o.name for o in self.session.get_outputs())
        self.version = ort.__version__
        self.build_seconds = time.perf_counter() - t0

    def infer(self, inputs: list, outputs: tuple, batch_size: int, *, pad_to_batch: bool = True,
              positions: tuple = (), fill: float = 0.0, stats: dict | None = None) -> list:
        """:func:`bert_of.training.inference.infer` on onnxruntime (the inputs already checked there):
        ``inputs`` (input_ids, token_type_ids, attention_mask [n, S]) in batches of ``batch_size``
        rows, each at its longest row (``pad_to_batch``; else at S), a call holding at most
        :func:`~bert_of.training.padding.eager_rows` rows (the attention's [rows, heads, L, L]
        peak, as OneFlow's eager calls); one float32 array per output, rows in input order,
        ``positions`` outputs S wide with ``fill`` past each batch's width."""
        absent = [o for o in outputs if o not in self.outputs]
        if absent:  # the head's output is missing: the graph is the checkpoint's, which has no such head
            raise ConfigError(f"--engine onnxruntime: the checkpoint's graph has no {', '.join(absent)} output "
                              f"(its outputs: {', '.join(self.outputs)})")
        n, width = len(inputs[0]), int(inputs[0].shape[1])
        lengths = row_lengths(inputs[2]) if pad_to_batch else np.full(n, width)
        results = Gathered(outputs, n, width, positions, fill)
        named = dict(zip(INFER_INPUTS, inputs))
        computed = most = 0
        with Progress("predict", total=n, unit="window") as bar:
            for batch_idx, tokens in length_batches(lengths, max(1, min(batch_size, n)), width):
                step = eager_rows(self.config, tokens, "cpu")
                for lo in range(0, len(batch_idx), step):
                    idx = batch_idx[lo:lo + step]
                    feed = {k: np.ascontiguousarray(a[idx, :tokens], np.int64) for k, a in named.items()}
                    results.put(idx, self.session.run(list(outputs), feed))
                    computed, most = computed + len(idx) * tokens, max(most, len(idx))
                    bar.update(len(idx))
        if stats is not None:
            stats.update(graphs=0, build_seconds=round(self.build_seconds, 3), batch_size=most, positions=computed,
                         layerwise=False, width=width, engine="onnxruntime")
        return results.arrays


__all__ = ["OnnxModel", "session_threads"]
