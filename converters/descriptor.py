"""What a checkpoint format declares about itself (one :class:`Format` per format module, listed in
``converters/registry.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


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
    reference: "tf-checkpoint" (TensorFlow restores the files; also run on a written B),
    "tf-weights" (TensorFlow fed the weights, as A only), "transformers" (PyTorch, A and B),
    "onnxruntime" (the written graph; A and B).
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
    ecosystem: Optional[str] = None
    read_reference_side: Optional[Callable] = None
    dtypes: tuple = ("float32", "float16", "bfloat16")
    shards: bool = False  # its writer splits the weights by --max-shard-size
    inspect: Optional[Callable] = None  # (path, config) -> {"tensors", "config", ...} as stored, for inspect
    extra: dict = field(default_factory=dict)  # a format's own traits, for its own tests and tools
