"""What a checkpoint format declares about itself (one :class:`Format` per format module, listed in
``converters/registry.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Ecosystem:
    """The codebase that made a format's files, as ``verify`` runs it beside the NumPy reference.

    ``name`` keys its runner in ``converters/verify/ecosystems.py``; ``title`` names it in verify's
    progress line; its runs are reported as ``"A:<label>-<dtype>"`` / ``"B:<label>-<dtype>"``, the
    dtype being ``dtype`` where the codebase computes in one precision only (onnxruntime: float32),
    else ``--reference-dtype``. ``runs_a``: run on the source (A), reported beside the reference;
    ``runs_b``: also run on a written B, where its outputs decide like bert_of's (and its failure
    fails the check).
    """

    name: str
    title: str
    label: str
    runs_a: bool = True
    runs_b: bool = True
    dtype: Optional[str] = None

    def key(self, side: str, reference_dtype: str) -> str:
        """The report's name for this run on ``side`` ("A" / "B"), e.g. ``"A:tf-float64"``."""
        return f"{side}:{self.label}-{self.dtype or reference_dtype}"


# TensorFlow restores a Google checkpoint from its own files (A, and a written B)
TF_CHECKPOINT = Ecosystem("tf-checkpoint", "TensorFlow", "tf")
# TensorFlow's graph of Google's modeling.py fed a file's weights (Keras h5, Model Garden): A only
TF_WEIGHTS = Ecosystem("tf-weights", "TensorFlow", "tf", runs_b=False)
# transformers' BertModel (PyTorch) on an HF checkpoint's own safetensors files
TRANSFORMERS = Ecosystem("transformers", "transformers", "transformers")
# onnxruntime on the ONNX graph itself
ONNXRUNTIME = Ecosystem("onnxruntime", "onnxruntime", "onnxruntime", dtype="float32")
ECOSYSTEMS = (TF_CHECKPOINT, TF_WEIGHTS, TRANSFORMERS, ONNXRUNTIME)


@dataclass(frozen=True)
class Format:
    """One checkpoint format: what the rest of bert_of knows about it.

    ``detect(path) -> bool``; ``read(path, Options) -> Source``; ``write_files(Source, staging
    dir, Options) -> [notes]`` (None: read only). ``owns``/``owns_patterns``: the file names (and
    full-match regexes) its writer creates, which ``--overwrite`` may replace. ``pre_ln``: it can
    hold a pre-LN encoder; ``records_numerics``: its config records bert_of's activation and epsilon
    (else a conversion to it notes what it drops); ``token_classifier``: its files say a classifier
    reads every position. ``table``: its name table (``converters.mapping.Table``), where it has
    one. ``reference``: its ``reference_np.Layout`` class (the file's own names, orientation and
    numerics, with ``from_source``). ``ecosystem``: the source codebase verify runs beside the
    reference (an :class:`Ecosystem`: one of :data:`ECOSYSTEMS`), where it has one.
    ``read_reference_side``: how ``verify`` reads the file as its A side, when not ``read``.
    ``numerics_flag``: the ``--numerics`` values its reader applies, where its files can leave the
    activation/epsilon open (any other is refused, never ignored); ``numerics_recorded``: why its
    files leave nothing to choose, for that refusal.
    ``dtypes``: the float dtypes its files hold. ``shards``: its writer honours ``--max-shard-size``.
    """

    name: str
    description: str
    detect: Callable
    read: Callable
    write_files: Optional[Callable]
    reference: type
    owns: tuple = ()
    owns_patterns: tuple = ()
    pre_ln: bool = False
    records_numerics: bool = False
    numerics_flag: tuple = ()
    numerics_recorded: str = "its files record the numerics its code computes"
    token_classifier: bool = False
    table: object = None
    ecosystem: Optional[Ecosystem] = None
    read_reference_side: Optional[Callable] = None
    dtypes: tuple = ("float32", "float16", "bfloat16")
    shards: bool = False  # its writer splits the weights by --max-shard-size
    inspect: Optional[Callable] = None  # (path, config) -> {"tensors", "config", ...} as stored, for inspect
    extra: dict = field(default_factory=dict)  # a format's own traits, for its own tests and tools
