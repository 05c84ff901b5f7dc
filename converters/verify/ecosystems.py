"""The source codebases ``verify`` runs beside the NumPy reference, one runner per
:class:`~bert_of.converters.descriptor.Ecosystem` a format declares (``Format.ecosystem``), keyed by
its name in :data:`RUNNERS`; every run is one :class:`EcosystemRun`.

A runner returns outputs ``{batch: {output: np.ndarray [B, S, ...] or [B, ...]}}``, or says why it
did not run (an optional dependency is missing: the NumPy reference still decides), or how the
codebase itself failed on the files (on a written B that fails the check).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

import bert_of.runtime.process as process
from bert_of.errors import BertOfError
from bert_of.converters import registry
from bert_of.converters.descriptor import ONNXRUNTIME, TF_CHECKPOINT, TF_WEIGHTS, TRANSFORMERS, Ecosystem
from bert_of.converters.formats import onnx as onnx_format
from bert_of.converters.verify import transformers_run as hf_torch

TF_EXTRA = "pip install 'bert_of[tf]'"
TORCH_EXTRA = "pip install torch transformers"


@dataclass(frozen=True)
class EcosystemRun:
    """One ecosystem's run on one side: exactly one of ``outputs`` (``{batch: {output: array}}``),
    ``skipped_reason`` (why it did not run) and ``failure`` (the codebase's own error) is set.
    ``name``: the report's key, e.g. ``"B:transformers-float64"``."""

    name: str
    outputs: Optional[dict] = None
    skipped_reason: Optional[str] = None
    failure: Optional[str] = None

    @property
    def message(self) -> Optional[str]:
        """What the report says in place of differences: ``"not run: ..."`` / ``"failed: ..."``."""
        if self.skipped_reason is not None:
            return f"not run: {self.skipped_reason}"
        if self.failure is not None:
            return f"failed: {self.failure}"
        return None


class NeedsTensorFlow(BertOfError):
    """The TF reference (Google's model in TensorFlow) was asked for and TensorFlow is not installed."""


def tf_reference_module(name: str = "bert_of.converters.verify.tf_reference", why: str = "verifying a TF1 checkpoint"):
    """Module ``name`` (the TF reference, or align's TF training), which imports TensorFlow: the
    optional ``tf`` extra. Without it, one line saying so."""
    process.set_environ({"TF_CPP_MIN_LOG_LEVEL": "2"}, keep_existing=True)  # TF's start-up banner is noise here
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "tensorflow":
            raise
        raise NeedsTensorFlow(f"{why} runs the TF reference, which needs TensorFlow (the tf extra): "
                              f"{TF_EXTRA}") from None


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


class Runner:
    """How one ecosystem is run: :meth:`run` on a side's ``Source`` (``path``: the files it reads)."""

    ecosystem: Ecosystem

    def run(self, name: str, source, path: str, batches: dict, dtype: str,
            python: Optional[str] = None) -> EcosystemRun:
        """The run named ``name`` on ``source``: ``batches`` is ``{batch: {"input_ids",
        "token_type_ids", "attention_mask": int64 [B, S]}}``, ``dtype`` the precision it computes in
        (float64 / float32), ``python`` an interpreter with torch and transformers (HF only)."""
        raise NotImplementedError


class _TensorFlow(Runner):
    """TensorFlow's graph of Google's modeling.py, in ``dtype``."""

    def run(self, name, source, path, batches, dtype, python=None):
        try:
            tf_reference = tf_reference_module(why="TensorFlow's run beside the reference")
        except NeedsTensorFlow:
            return EcosystemRun(name, skipped_reason=f"TensorFlow is not installed (the tf extra: {TF_EXTRA})")
        return EcosystemRun(name, outputs=self.forward(tf_reference, source, batches, dtype))

    def forward(self, tf_reference, source, batches: dict, dtype: str) -> dict:
        """{batch: outputs} of TensorFlow on ``source``."""
        raise NotImplementedError


class TFCheckpoint(_TensorFlow):
    """TensorFlow restores a Google checkpoint from its own files."""

    ecosystem = TF_CHECKPOINT

    def forward(self, tf_reference, source, batches, dtype):
        cfg = source.config.to_google_dict()
        return {b: tf_reference.run_reference(source.path, cfg, batch, dtype=dtype) for b, batch in batches.items()}


class TFWeights(_TensorFlow):
    """TensorFlow fed a file's weights (a Keras h5, Model Garden): Google's names, the file's numerics."""

    ecosystem = TF_WEIGHTS

    def forward(self, tf_reference, source, batches, dtype):
        cfg = source.config.to_google_dict()
        layout = registry.reference_layout(source)
        weights = layout.as_google()
        H = source.config.hidden_size  # Google's model always builds a pooler; a file without one (QA, token
        weights.setdefault("bert/pooler/dense/kernel", np.zeros((H, H), np.float32))  # heads) never reads it
        weights.setdefault("bert/pooler/dense/bias", np.zeros((H,), np.float32))
        cfg.update(bert_of_hidden_act=layout.act, layer_norm_eps=layout.eps)
        return {b: tf_reference.forward_numpy_weights(weights, cfg, batch, dtype=dtype) for b, batch in batches.items()}


class Transformers(Runner):
    """transformers' BERT (PyTorch) on an HF checkpoint's own files, in this interpreter or in
    ``python`` (an interpreter that has torch and transformers)."""

    ecosystem = TRANSFORMERS

    def run(self, name, source, path, batches, dtype, python=None):
        model_dir = source.path if os.path.isdir(source.path) else os.path.dirname(source.path)
        if hf_torch.weight_names(model_dir) is None:
            return EcosystemRun(name, skipped_reason="no safetensors weights (transformers would unpickle "
                                                     "pytorch_model.bin; bert_of does not)")
        try:
            if python:
                return EcosystemRun(name, outputs=hf_torch.forward_in(python, model_dir, batches, dtype))
            if not hf_torch.importable():
                return EcosystemRun(name, skipped_reason=f"torch and transformers are not installed ({TORCH_EXTRA}, "
                                                         "or pass --torch-python with an interpreter that has them)")
            return EcosystemRun(name, outputs=hf_torch.forward(model_dir, batches, dtype))
        except Exception as e:  # noqa: BLE001 -- transformers' own error, reported (on B it fails the check)
            return EcosystemRun(name, failure=f"transformers ({_first_line(e)})")


class OnnxRuntime(Runner):
    """onnxruntime on bert_of's ONNX model at ``path`` (float32: the graph's precision)."""

    ecosystem = ONNXRUNTIME

    def run(self, name, source, path, batches, dtype, python=None):
        try:
            return EcosystemRun(name, outputs={b: onnx_format.run_onnxruntime(path, batch)
                                               for b, batch in batches.items()})
        except onnx_format.NeedsOnnxRuntime as e:
            return EcosystemRun(name, skipped_reason=f"{e}; the NumPy reference of the model's weights decides")
        except Exception as e:  # noqa: BLE001 -- onnxruntime's own error, reported (on B it fails the check)
            return EcosystemRun(name, failure=f"onnxruntime ({_first_line(e)})")


RUNNERS: dict = {r.ecosystem.name: r for r in (TFCheckpoint(), TFWeights(), Transformers(), OnnxRuntime())}


def run(ecosystem: Ecosystem, side: str, source, path: str, batches: dict, reference_dtype: str,
        python: Optional[str] = None) -> EcosystemRun:
    """``ecosystem``'s run on ``side`` ("A" / "B"): its declared runner on ``source`` (files at ``path``)."""
    dtype = ecosystem.dtype or reference_dtype
    return RUNNERS[ecosystem.name].run(ecosystem.key(side, reference_dtype), source, path, batches, dtype, python)


__all__ = ["EcosystemRun", "NeedsTensorFlow", "RUNNERS", "Runner", "TF_EXTRA", "TORCH_EXTRA", "run",
           "tf_reference_module"]
