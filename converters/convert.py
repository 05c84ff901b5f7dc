"""Any format to any format, through canonical names.

``convert("tf2of", src, dst)`` = ``FORMATS["of"].write_files(FORMATS["tf"].read(src), staged dst)``.
Adding a format means one module and one line in ``converters/registry.py``; no pairwise code.
"""

from __future__ import annotations

import contextlib
import difflib
import os

from bert_of.checkpoint import run_final
from bert_of.errors import BertOfError, CheckpointError, OutputError, SourceChanged, UnsafeContent
from bert_of.files.owned import check_destination
from bert_of.files.publish import publishing
from bert_of.converters.source import Options, Source, summarize
from bert_of.converters import registry
from bert_of.converters.reader import ATTEMPTS
from bert_of.progress import Progress
from bert_of.tensors import TensorSpec
from bert_of.vocab import check_vocab_fits

# short name -> Format (converters/registry.py: every format module declares its own descriptor)
FORMATS = registry.FORMATS
DESCRIPTIONS = {name: f.description for name, f in FORMATS.items()}


def module(fmt: str):
    """The format's descriptor (``detect``, ``read``, ``write_files`` and its traits)."""
    return registry.get(fmt)


def parse_direction(direction: str) -> tuple:
    # a format's name may hold a "2" (tf2): every "2" is tried as the separator
    splits = [(direction[:i], direction[i + 1:]) for i, c in enumerate(direction) if c == "2"]
    found = [(a, b) for a, b in splits if a in FORMATS and b in FORMATS]
    if len(found) != 1:
        pairs = [f"{a}2{b}" for a in FORMATS for b in FORMATS if a != b]
        close = difflib.get_close_matches(direction, pairs, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}? " if close else ""
        raise BertOfError(f"unknown conversion {direction!r}: {hint}a direction is SRC2DST with SRC, DST among "
                          f"{', '.join(FORMATS)} (e.g. tf2of, of2hf)")
    return found[0]


def model_path(path: str) -> str:
    """``path``, or the checkpoint a training run's folder stands for (its ``final/``, else its newest
    periodic checkpoint, with a note): bert_of.checkpoint.run_final, the one rule, for every reader."""
    return run_final(os.fspath(path))


def detect(path: str) -> str:
    """The format of ``path``; a clear error when none fits. A training run's folder is the model
    it published (:func:`model_path`)."""
    path = model_path(path)
    if not os.path.exists(path) and not any(os.path.exists(path + s) for s in (".index",)):
        raise CheckpointError(f"{path}: no such file or directory")
    for fmt, f in FORMATS.items():
        if f.detect(path):
            return fmt
    raise CheckpointError(f"{path}: not a checkpoint in any known format ({', '.join(FORMATS)})")


def read(path: str, fmt: str | None = None, opts: Options | None = None) -> Source:
    """The checkpoint at ``path`` as a ``Source`` (tensors streamed later, from the tree read now)."""
    return _read(fmt or detect(path), path, opts or Options())


def numerics_gate(fmt: str, opts: Options) -> None:
    """``--numerics`` applies where the format's reader applies it, and is refused everywhere else
    (accepted and ignored is never an answer): one line saying what the format's files record."""
    f = module(fmt)
    if opts.numerics and opts.numerics not in f.numerics_flag:
        takes = f" (it takes {' or '.join(f.numerics_flag)})" if f.numerics_flag else ""
        raise CheckpointError(f"--numerics {opts.numerics} does not apply to a {fmt} checkpoint: "
                              f"{f.numerics_recorded}{takes}")


def _read(fmt: str, path: str, opts: Options, target: str | None = None) -> Source:
    """The format's reader; a vocabulary passed in ``opts`` must fit the model it is attached to.

    A path that is not ``fmt`` at all (its detector says no) but another format's checkpoint is
    refused naming that format and the direction that reads it (``target``: the direction's
    destination), instead of the reader's complaint about files a ``fmt`` checkpoint would hold."""
    path = model_path(path)  # a training run's folder: the model it stands for
    numerics_gate(fmt, opts)
    try:
        source = module(fmt).read(path, opts)
    except (SourceChanged, UnsafeContent):  # the file's own fault, whatever format it is
        raise
    except BertOfError:
        other = _other_format(path, fmt)
        if other is None:
            raise
        hint = (f"{other}2{target} reads it" if target and target != other else f"it is {other} already"
                if target else f"read it as format {other}")
        raise CheckpointError(f"{path}: this is {_article(other)} {other} checkpoint, not {fmt}: {hint}") from None
    if source.numerics_unknown and not opts.describe:
        raise CheckpointError(source.numerics_unknown)
    if opts.vocab:
        check_vocab_fits(opts.vocab, source.config.vocab_size, source.vocab_pad)
    return source


def _other_format(path: str, fmt: str) -> str | None:
    """The format the registry's detectors find at ``path`` when ``fmt``'s does not; else None
    (the path is ``fmt`` as far as its detector says, or nothing known: the reader's error stands)."""
    try:
        if module(fmt).detect(path):
            return None
        found = detect(path)
    except (BertOfError, OSError):
        return None
    return found if found != fmt else None


def _article(fmt: str) -> str:
    return "an" if fmt[0] in "aeiohn" else "a"  # spelled-out letters: an hf, an h5, an of; a tf, a lazy


def load(path: str, fmt: str | None = None, opts: Options | None = None) -> tuple:
    """(Source, {canonical name: array}): one whole checkpoint in memory. A checkpoint replaced
    (``--overwrite``) after its files were read but before every tensor was (its old tree deleted
    meanwhile) is read again, up to ATTEMPTS times."""
    for attempt in range(ATTEMPTS):
        source = read(path, fmt, opts)
        try:
            return source, source.load()
        except SourceChanged:
            if attempt == ATTEMPTS - 1:
                raise


@contextlib.contextmanager
def _counted(source: Source, desc: str):
    """Progress of a conversion: the bytes of the tensors the writer has read (a bar on a terminal,
    else a line every few seconds of a long conversion)."""
    items = {"tensors": source.tensors, "optimizer": source.optimizer}
    total = sum(s.nbytes for group in items.values() for s, _ in group)
    with Progress(desc, total=total, unit="B", unit_scale=True) as bar:
        def counting(spec, produce):
            def produce_counted():
                arr = produce()
                bar.update(spec.nbytes)
                return arr
            produce_counted.checked = getattr(produce, "checked", False)
            return produce_counted

        for key, group in items.items():
            setattr(source, key, [(s, counting(s, p)) for s, p in group])
        try:
            yield
        finally:
            for key, group in items.items():
                setattr(source, key, group)


def convert(direction: str, src: str, dst: str, opts: Options | None = None, check=None) -> tuple:
    """Run one conversion; returns (Source, notes). Nothing is left at dst on error.

    ``dst`` is never the source, inside it or around it (nor ``opts.config`` / ``opts.vocab``);
    ``opts.overwrite`` replaces only a folder of files bert_of writes (:func:`bert_of.files.owned.check_destination`).

    ``check(source, staged_dir)``, when given, runs on the finished files before they are published
    (``convert --verify``, with the ``Source`` already read): if it raises, ``dst`` is never created (or, with ``overwrite``, the
    old ``dst`` stays as it was).
    """
    opts = opts or Options()
    a, b = parse_direction(direction)
    if module(b).write_files is None:
        raise BertOfError(f"cannot convert to {b}: bert_of reads {b} and does not write it")
    if opts.max_shard_size and not module(b).shards:
        raise BertOfError(f"--max-shard-size: {b} is not written in shards "
                          f"({', '.join(n for n, f in FORMATS.items() if f.shards)} is)")
    sources = (src, opts.config, opts.vocab)  # never written over, into or around
    check_destination(dst, opts.overwrite, sources)  # before reading: fail at once
    for attempt in range(ATTEMPTS):
        try:
            return _convert(a, b, direction, src, dst, opts, check, sources)
        except SourceChanged:  # the source was replaced while its tensors streamed: nothing was published
            if attempt == ATTEMPTS - 1:
                raise


def _convert(a, b, direction, src, dst, opts, check, sources) -> tuple:
    source = _read(a, src, opts, target=b)
    target = module(b)
    why = source.config.original_bert_mismatch()
    if why and not target.pre_ln:
        raise CheckpointError(f"{src}: cannot convert to {b}: {why}")
    stage = None
    try:
        with publishing(dst, overwrite=opts.overwrite, sources=sources) as stage:
            with _counted(source, direction):
                notes = target.write_files(source, stage, opts) or []
                if not target.records_numerics:  # an original-BERT format: what it drops
                    notes += source.config.numerics_notes()
                if source.config.classifier_kind == "token" and not target.token_classifier and \
                        any(s.name == "classifier.weight" for s, _ in source.tensors):
                    notes.append(f"note: {b} does not record a token classifier: classifier.* written as they "
                                 f"are, read back as a sequence classifier (on the pooled output)")
            if check is not None:
                check(source, stage)
    except OutputError as e:  # name the file as the user will know it, not its staging path
        if stage is None:
            raise
        raise OutputError(str(e).replace(stage, os.path.abspath(dst))) from None
    return source, notes


def write_model(fmt: str, config, tensors: dict, vocab_file, folder: str) -> list:
    """A model held in memory ({canonical name: array}) as format ``fmt``'s files in the (staging)
    folder ``folder``: ``save_pretrained(path, format=fmt)``. Returns the writer's notes. The
    tensors pass the same gate as a read checkpoint's (``Source``); the vocabulary's folder is the
    model's, where its recorded lower-casing is found."""
    target = module(fmt)
    why = config.original_bert_mismatch()
    if why and not target.pre_ln:
        raise CheckpointError(f"cannot save as {fmt}: {why}")
    specs = [(TensorSpec(name, a.dtype, tuple(a.shape)), lambda a=a: a) for name, a in sorted(tensors.items())]
    where = os.path.dirname(os.path.abspath(vocab_file)) if vocab_file else "<model in memory>"
    source = Source(where, "of", config, vocab_file, specs)
    if vocab_file:
        check_vocab_fits(vocab_file, config.vocab_size)
    notes = target.write_files(source, folder, Options()) or []
    return notes + ([] if target.records_numerics else config.numerics_notes())


__all__ = ["FORMATS", "Options", "convert", "detect", "read", "summarize", "parse_direction", "write_model"]
