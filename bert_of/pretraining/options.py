"""The options of ``bert-of pretrain`` (its parser is generated from them) and the checks of them
that need no OneFlow: importing this is cheap."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bert_of.data.layout import data_lengths
from bert_of.errors import ConfigError
from bert_of.options import Ranks, RunOptions, arg
from bert_of.vocab import vocab_size

@dataclass(kw_only=True)
class PretrainOptions(RunOptions):
    """Everything ``bert-of pretrain`` takes: its parser is generated from these fields, and the
    trainer's part (:class:`~bert_of.options.TrainConfig`) and the run control
    (:class:`~bert_of.options.RunOptions`, as ``finetune``'s) are the same fields."""

    data: str = arg(help="pretraining data: OFRecord parts (bert-of data create-pretraining), Google's TFRecords "
                         "or NVIDIA's HDF5 shards; a directory or a glob", metavar="DIR_OR_GLOB", path=True)
    output: str = arg(help="run directory: run.json, vocab.txt, config.json, metrics.jsonl, checkpoints/, final/",
                      short="-o", metavar="DIR", path=True, on_resume="not kept")  # the record is in it
    config: str | None = arg(None, help="bert_config.json / config.json of a new model", metavar="FILE", path=True)
    init_checkpoint: str | None = arg(None, help="continue pretraining a checkpoint in any format (tf, lazy, hf, "
                                                 "...) or a zoo name", metavar="NAME_OR_DIR")
    vocab: str | None = arg(None, help="vocab.txt (unset: the one the data was made with, else the checkpoint's)",
                            metavar="FILE", path=True)
    max_seq_length: int | None = arg(None, help="tokens per sequence (unset: the data's: its bert_of_data.json, else its first record)",
                                     metavar="N")
    max_predictions_per_seq: int | None = arg(None, help="masked positions per sequence (unset: the data's)",
                                              metavar="N")
    blas: str | None = arg(None, choices=("auto", "mkl", "openblas", "oneflow", "exact"),
                           help="the BLAS under OneFlow's CPU GEMMs (unset: BERT_OF_BLAS, else auto): auto = a "
                                "threaded one (MKL, else OpenBLAS from scipy-openblas32), oneflow = OneFlow's own with "
                                "AVX2/FMA kernels (1 thread), exact = OneFlow's own as it detects the CPU")
    no_shuffle: bool = arg(False, help="read the records in order")
    no_dropout: bool = arg(False, help="dropout off (e.g. to compare runs step by step)")
    overwrite: bool = arg(False, help="replace an existing run directory", on_resume="not kept")
    ddp: bool = arg(False, help="eager DDP with local tensors instead of global tensors")
    zoo_name: str | None = arg(None, help="register the final checkpoint in the local zoo under NAME", metavar="NAME",
                               on_resume="may change")
    ranks: Ranks = field(default_factory=Ranks)
    quiet: bool = False  # the common -q (no progress bar)


def check_vocab(vocab: str, limit, what: str = "the config's") -> None:
    """A vocabulary must fit the model's embedding table."""
    n_vocab = vocab_size(vocab)
    if isinstance(limit, int) and n_vocab > limit:
        raise ConfigError(f"{vocab} has {n_vocab} tokens but {what} vocab_size is {limit}")


def with_data_lengths(opts: PretrainOptions) -> PretrainOptions:
    """``opts`` with the sequence lengths the data was made with filled in (where not given)."""
    seq, pred = opts.max_seq_length, opts.max_predictions_per_seq
    if not seq or not pred:  # bert_of_data.json, else the first record (Google's or NVIDIA's files)
        made_seq, made_pred = data_lengths(opts.data)
        seq, pred = seq or made_seq, pred or made_pred
    return replace(opts, max_seq_length=int(seq), max_predictions_per_seq=int(pred))


__all__ = ["PretrainOptions", "check_vocab", "with_data_lengths"]
