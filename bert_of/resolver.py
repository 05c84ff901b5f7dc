"""The checkpoint resolver and format writer slots: what an upper layer installs so the layers
below never import it.

``resolver``: name or path -> bert_of checkpoint directory, for what
:func:`bert_of.checkpoint.resolve_checkpoint` does not handle itself (zoo names, checkpoints in
other formats). The package facade (``bert_of/__init__.py``) installs the zoo's. The slot is not in
checkpoint.py because that imports NumPy and safetensors: this module imports nothing, so
installing costs ``import bert_of`` nothing (no NumPy, no OneFlow).

``writer``: ``writer(fmt, config, tensors, vocab_file, folder) -> notes`` writes a model held in
memory (``tensors``: {canonical name: array}) as format ``fmt``'s files into the (staging) folder,
for ``save_pretrained(path, format="hf")``; the facade installs the converters'.
"""

from __future__ import annotations

from typing import Callable, Optional

resolver: Optional[Callable[[str], str]] = None


def register_resolver(fn: Optional[Callable[[str], str]]) -> None:
    """Install ``fn(name_or_path, vocab=None) -> checkpoint directory`` (None removes it); ``vocab``
    is passed only when a caller gives one."""
    global resolver
    resolver = fn


writer: Optional[Callable[..., list]] = None


def register_writer(fn: Optional[Callable[..., list]]) -> None:
    """Install ``fn(fmt, config, tensors, vocab_file, folder) -> notes`` (None removes it)."""
    global writer
    writer = fn
