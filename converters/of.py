"""bert_of's own checkpoint directory: the hub format (canonical names already)."""

from __future__ import annotations

import numpy as np

from bert_of.checkpoint import TensorSpec, is_checkpoint_dir, load_checkpoint, write_checkpoint
from converters.common import Options, ReportLine, Source, cast_spec

NAME = "of"


def detect(path: str) -> bool:
    return is_checkpoint_dir(path)


def read(path: str, opts: Options) -> Source:
    ck = load_checkpoint(path, with_optimizer=True)
    tensors = [cast_spec(TensorSpec(k, v.dtype, v.shape), (lambda v=v: np.array(v)), opts.dtype)
               for k, v in ck.tensors.items()]
    report = [ReportLine(k, "mapped", k) for k in ck.tensors]
    optim = []
    for k, v in ck.optimizer.items():
        if opts.with_optimizer:
            optim.append((TensorSpec(k, v.dtype, v.shape), (lambda v=v: np.array(v))))
            report.append(ReportLine(k, "optimizer", k))
        else:
            report.append(ReportLine(k, "dropped", note="optimizer state; convert it with --with-optimizer"))
    return Source(path, NAME, ck.config, ck.vocab_file, tensors, optim, ck.optimizer_meta, report)


def write(source: Source, dst: str, opts: Options) -> list:
    if source.vocab_file is None:
        from bert_of.errors import CheckpointError

        raise CheckpointError(f"{source.path}: no vocab.txt beside the checkpoint (pass --vocab)")
    optimizer = None
    if opts.with_optimizer and source.optimizer:
        optimizer = (list(source.optimizer), source.optimizer_meta)
    write_checkpoint(dst, [(s, p) for s, p in source.tensors], source.config, source.vocab_file,
                     optimizer=optimizer, overwrite=opts.overwrite,
                     metadata={"format": "bert_of", "converted_from": source.format})
    return []
