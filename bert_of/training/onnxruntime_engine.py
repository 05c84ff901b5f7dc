"""``--engine onnxruntime``: a checkpoint's prediction run by onnxruntime instead of OneFlow, chosen
by the user, never switched to silently.

The model is the graph ``convert of2onnx`` writes for the checkpoint (the same reader, the same
writer: converters/formats/onnx), built in memory and handed to ``onnxruntime.InferenceSession``
(an in-memory file on Linux, bytes elsewhere: :meth:`OnnxModel._session`): nothing is written
beside the user's files. :meth:`OnnxModel.infer` is
:func:`bert_of.training.inference.infer`'s engine for it: the same inputs and outputs, rows grouped
by length and each batch padded to its longest row (:mod:`bert_of.training.padding`), outputs back
in input order (:class:`~bert_of.training.padding.Gathered`), so the tasks' post-processing
(softmax, sigmoid, n-best spans, tags) is theirs, once, whatever ran the model.

The graph is the checkpoint's in onnxruntime's fused ops (``model_bytes(fused=True)``, graph.py's
``build_graph``): one contrib Attention per layer (q, k, v in one GEMM, the heads' scores, mask,
softmax and context in one kernel), SkipLayerNormalization for each residual + bias + LayerNorm,
BiasGelu / FastGelu for the config's erf / tanh GELU, LayerNormalization elsewhere: the same
function as of2onnx's graph (answers within 1e-6 of it on MiniLM; tests/integration/test_engines.py
holds both to OneFlow's within 1e-5), ~15% less CPU at 384 tokens. ``BERT_OF_ORT_FUSED=0`` runs
of2onnx's own graph instead; a session refusing the fused graph (an onnxruntime build without its
contrib ops) runs of2onnx's graph too, the reason in :attr:`OnnxModel.notes`.

Threads: onnxruntime's intra-op pool gets bert_of's thread count
(:func:`bert_of.runtime.blas.default_threads`: ``BERT_OF_BLAS_THREADS``, else the CPUs this
process may use), or ``OMP_NUM_THREADS`` when the user set it (onnxruntime's CPU build reads no
environment variable for it); one inter-op thread (the graph is a chain); the pool's threads sleep
between ops rather than spin (:func:`spinning`: ``BERT_OF_ORT_SPIN=1`` spins).
"""

from __future__ import annotations

import os
import time

import numpy as np

from bert_of.converters.convert import read as read_checkpoint
from bert_of.converters.formats.onnx import import_onnxruntime, model_bytes, stream
from bert_of.errors import ConfigError
from bert_of.progress import Progress
from bert_of.runtime.blas import default_threads
from bert_of.training.padding import Gathered, eager_rows, length_batches, row_lengths

# infer()'s inputs, in its order ([n, S] each): the graph's inputs are named
INFER_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
PROC_FDS = "/proc/self/fd"  # this process's open files by number (Linux): the in-memory model's path
FUSED_SWITCH = "BERT_OF_ORT_FUSED"  # "0": of2onnx's graph, not the fused one (to compare them)
SPIN_SWITCH, SPIN_DEFAULT = "BERT_OF_ORT_SPIN", "0"  # the intra-op pool's spinning (spinning())


def spinning() -> str:
    """onnxruntime's ``session.intra_op.allow_spinning``: "0" (the pool's threads sleep between
    ops) unless ``BERT_OF_ORT_SPIN`` says "1" (onnxruntime's own default: they spin, waiting for
    work). On the 2-core machine shared with other work, spinning took 1.1-1.5x the wall time of
    sleeping and up to 1.5x its CPU seconds (docs/benchmarks.md, 2026-12-06 "fused ops"); alone
    on its cores it saves a thread wake-up per parallel op (microseconds, against milliseconds of
    work per op)."""
    given = os.environ.get(SPIN_SWITCH, SPIN_DEFAULT).strip()
    if given not in ("0", "1"):
        raise ConfigError(f"{SPIN_SWITCH}={given!r}: not 0 or 1")
    return given


def ort_errors(ort) -> tuple:
    """The exceptions onnxruntime raises for a graph it cannot load (its pybind11 state's)."""
    state = ort.capi.onnxruntime_pybind11_state
    return tuple(getattr(state, n) for n in ("Fail", "InvalidGraph", "NotImplemented", "InvalidArgument")
                 if hasattr(state, n))


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
    checkpoint's heads); ``fused``: whether the session runs the fused graph; ``notes``: the ONNX
    writer's (and why the fused graph was not run, when refused); ``build_seconds``: reading +
    building + the session's optimisation."""

    def __init__(self, path: str, threads: int | None = None):
        ort = import_onnxruntime()
        t0 = time.perf_counter()
        source = read_checkpoint(path, "of")  # what `convert of2onnx` reads
        self.config = source.config
        self.threads = threads or session_threads()
        self.fused = os.environ.get(FUSED_SWITCH, "1") != "0"
        self.session = None
        if self.fused:
            try:
                self.session, self.notes = self._session(ort, source, True)
            except ort_errors(ort) as e:  # the build has no contrib ops (or refuses one): of2onnx's own graph
                self.fused, why = False, str(e).strip().splitlines()[0][:200]
        if self.session is None:
            self.session, self.notes = self._session(ort, source, False)
            if os.environ.get(FUSED_SWITCH, "1") != "0":
                self.notes.append(f"note: onnxruntime refused the fused graph ({why}); running of2onnx's graph")
        self.outputs = tuple(o.name for o in self.session.get_outputs())
        self.version = ort.__version__
        self.build_seconds = time.perf_counter() - t0

    def _session(self, ort, source, fused: bool) -> tuple:
        """(an InferenceSession over the checkpoint's graph, fused or of2onnx's; the writer's notes).

        Memory: onnxruntime's Python session keeps the ``bytes`` it was made from for as long as
        it lives (the model's size again: ~440 MB for BERT-base), and joining them holds the model
        twice. On Linux the graph is streamed one tensor at a time into an anonymous in-memory
        file (``memfd_create``: nothing on disk, not mapped into this process) that onnxruntime
        reads by path and that is closed once the session holds its weights; elsewhere, bytes."""
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: its warnings are not ours to show
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning())
        providers = ["CPUExecutionProvider"]
        if hasattr(os, "memfd_create") and os.path.isdir(PROC_FDS):
            fd = os.memfd_create("bert_of-model.onnx", os.MFD_CLOEXEC)
            try:
                with open(fd, "wb", closefd=False) as f:
                    notes = stream(source, f, fused)
                return ort.InferenceSession(os.path.join(PROC_FDS, str(fd)), options, providers=providers), notes
            finally:
                os.close(fd)
        data, notes = model_bytes(source, fused)
        return ort.InferenceSession(data, options, providers=providers), list(notes)

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
