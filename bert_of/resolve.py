"""What ``pretrain --init-checkpoint`` and ``finetune / predict / eval --model`` accept: a checkpoint
in any format bert_of reads (a folder, or a TF prefix), or a zoo name. The one place a name
becomes a checkpoint, for every command that trains or runs a model."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass

from bert_of.checkpoint import Checkpoint, is_checkpoint_dir, load_checkpoint
from bert_of.converters.common import Options
from bert_of.converters.convert import convert, detect, read
from bert_of.errors import ConfigError
from bert_of.zoo import Zoo


@dataclass
class ResolvedModel:
    path: str  # an existing checkpoint (absolute), or the zoo's cached bert_of folder
    name: str  # display name: the folder's (or file's) name, or the zoo entry's
    fmt: str  # "of" (a bert_of folder), "tf", "hf", "lazy", "h5", ...

    def load(self, vocab: str | None = None) -> Checkpoint:
        """The checkpoint in memory, read by its format's converter (no files written)."""
        if self.fmt == "of":
            return load_checkpoint(self.path)
        source = read(self.path, self.fmt, Options(vocab=vocab))  # e.g. continue pretraining a Google TF checkpoint
        return Checkpoint(self.path, source.config, source.load(), source.vocab_file)

    @contextlib.contextmanager
    def folder(self):
        """A bert_of checkpoint folder for it: itself, or (another format) a temporary conversion,
        removed afterwards."""
        if self.fmt == "of" and is_checkpoint_dir(self.path):
            yield self.path
            return
        tmp = tempfile.mkdtemp(prefix="bert-of-model-")
        try:
            out = os.path.join(tmp, "of")
            print(f"bert-of: {self.path}: a {self.fmt} checkpoint; converting it to bert_of ({self.fmt}2of) in {out}",
                  file=sys.stderr)
            convert(f"{self.fmt}2of", self.path, out)
            yield out
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def resolve_model(name_or_path: str, option: str = "--model") -> ResolvedModel:
    """A checkpoint path (any format) or a zoo name (downloaded and converted on first use)."""
    if not name_or_path:
        raise ConfigError(f"{option}: expected a checkpoint folder or a zoo name")
    if os.path.exists(name_or_path) or os.path.exists(name_or_path + ".index"):
        path = os.path.abspath(name_or_path)
        return ResolvedModel(path, os.path.basename(path.rstrip(os.sep)), detect(path))
    zoo = Zoo()
    entry = zoo.registry.lookup(name_or_path)
    if entry is None:
        raise ConfigError(f"{option} {name_or_path}: no such checkpoint folder, and not a zoo name "
                          "(`bert-of zoo list` shows the names)")
    return ResolvedModel(zoo.resolve(entry["name"]), entry["name"], "of")
