"""The reader skeleton: the steps every format's ``read`` shares, written once.

A format lists what its file holds and says what each name is; the skeleton accounts for every
tensor, refuses what it must with the same one-line errors in every format, checks the fit to
the config in the file's own names and layout, and streams the tensors (one in memory at a time)
into a :class:`~bert_of.converters.source.Source`, the single validation point
(:func:`bert_of.tensors.check_tensors`). A whole reader is::

    def read(path, opts):
        config, vocab = ...                                  # the format's side files
        entries = [Entry(name, shape, dtype, read_fn) ...]   # nothing read yet
        found = sort(entries, lambda e: hit(TABLE, e.name), opts, where)
        return finish(where, NAME, config, vocab, found, opts, TABLE)

The API:

- :class:`Entry`: one stored tensor: ``name`` as the file spells it (in the report and in
  messages), ``shape`` and ``dtype`` as stored, ``read()`` -> the stored array; ``problem``: why
  it cannot be read (a partitioned variable), raised only if the tensor is kept.
- ``classify(entry)`` returns a :class:`Hit` (a weight, or with ``optimizer=True`` optimizer
  state, kept with ``--with-optimizer``), a ``ReportLine`` the format accounts for itself (a tied
  copy, a buffer: dropped), or None: not BERT, an error unless ``--skip-unknown`` (a ReportLine
  with action "unknown" says that with the format's own note).
  :func:`hit` is the table lookup most formats need.
- :func:`sort`: classify everything, report it, refuse unknown / duplicate / unreadable tensors.
- :func:`check`: every tensor the shape the config implies, the backbone complete; messages
  name the tensor and its shape as stored (for formats that check before :func:`finish`).
- :func:`finish`: the label count from the classifier, the fit check, producers, the ``Source``.
  ``fill`` adds tensors the file lacks as zeros (a QA model's pooler, which its head never reads).
  ``config_file``: the config the format read; with ``Source.stored`` (every kept entry's
  ``read``, checked to yield the dtype and shape the entry announced) it is what ``verify``'s reference computes from, so a new format also
  gets a layout in ``converters/verify/reference_np.py`` (its names, orientation and numerics, written
  from the format's own code, not from its TABLE).

Whole checkpoints: :func:`whole` runs a format's read on one :class:`bert_of.files.pinned.PinnedDir` (the
folder, or the folder holding a file or TF prefix), so every file comes from one tree even while
``--overwrite`` swaps the path between checkpoints; a read that the swap broke is read again,
and the producers keep the pin (they read that tree, or fail with ``SourceChanged``).

An entry's shape and dtype may be filled in after :func:`sort` (a format that learns them only
for the tensors it keeps, or from the config); the report's layout notes ("transposed") are
written by :func:`finish`, from the transforms as they are then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError, SourceChanged
from bert_of.files.pinned import PinnedDir
from bert_of.tensors import SCALAR_SLOTS, SCALAR_STATE, TensorSpec, check_fit, checked_producer
from bert_of.converters.source import Options, ReportLine, Source, cast_spec
from bert_of.converters.mapping import Table, apply, apply_shape, inverse

WORD_EMB = "bert.embeddings.word_embeddings.weight"
POOLER = ("bert.pooler.dense.weight", "bert.pooler.dense.bias")
CLASSIFIER = "classifier.weight"
# what a layout transform says in the report (summarize() shows no more than that)
LAYOUT_NOTES = {"T": "transposed", "squeeze0": "[1,P,H] squeezed",
                "heads_in": "einsum heads merged, transposed", "heads_out": "einsum heads merged, transposed",
                "heads_bias": "einsum heads merged"}  # Model Garden's attention (tf2)


@dataclass
class Entry:
    name: str  # as the file spells it
    shape: Optional[tuple] = None  # as stored (a format may set it after sorting)
    dtype: object = None
    read: Optional[Callable[[], np.ndarray]] = None  # the stored array
    problem: str = ""  # why it cannot be read; an error only if the tensor is kept
    origin: object = None  # where its bytes are: entries of one origin are one stored tensor (never compared)


@dataclass
class Hit:
    """What one stored tensor is. ``kind``: "mapped" (one canonical tensor, or optimizer state),
    "fused" (one tensor holding ``parts``, several canonical tensors along its first axis, cut by
    ``split(array, j)``: LiBai's q,k,v), "tied" (a copy of ``target``'s stored tensor, which the
    model ties: checked equal when that tensor is read, then dropped), "buffer" (not a weight:
    ``check(array)`` says what is wrong with it, or None; then dropped)."""

    target: str = ""  # canonical name, or optimizer state ("m/<canonical>", "step", ...); tied: the twin
    transform: Optional[str] = None  # stored -> canonical (bert_of.converters.mapping.TRANSFORMS)
    note: str = ""
    optimizer: bool = False
    kind: str = "mapped"
    parts: tuple = ()  # fused: the canonical names, in the order of the stored tensor's first axis
    split: Optional[Callable] = None  # fused: (stored array, j) -> canonical array j
    check: Optional[Callable] = None  # buffer: stored array -> error text or None

    @property
    def targets(self) -> tuple:
        return self.parts if self.kind == "fused" else (self.target,)


@dataclass
class Sorted:
    """What :func:`sort` found: kept (entry, hit) pairs and a report line for every entry."""

    model: list = field(default_factory=list)
    optimizer: list = field(default_factory=list)
    report: list = field(default_factory=list)
    ties: dict = field(default_factory=dict)  # canonical name -> [tied entries] equal to its stored tensor


def hit(table: Table, name: str, optimizer: bool = False) -> Optional[Hit]:
    """The table's canonical name and transform for ``name``, as a Hit (None if not in the table)."""
    found = table.to_canonical(name)
    return Hit(found[0], found[1], optimizer=optimizer) if found else None


def sort(entries, classify: Callable, opts: Options, where: str, what: str = "tensor",
         table: Optional[Table] = None) -> Sorted:
    """Classify every entry and account for it in the report (see the module doc).

    Errors, in this order: two tensors for one canonical name; no BERT tensor at all (``table``
    names the word embeddings as the format spells them); tensors that are not BERT's (unless
    ``--skip-unknown``); a tied copy of a tensor the file lacks; a kept tensor with a ``problem``
    or a fused one that does not split; a buffer its ``check`` refuses (buffers are small: read now,
    so a wrong one fails before any output)."""
    out, unknown, owner, later = Sorted(), [], {}, []
    for e in entries:
        h = classify(e)
        if isinstance(h, ReportLine) and h.action == "unknown":  # not BERT, with the format's own note
            unknown.append(e.name)
            h.action = "dropped"
            out.report.append(h)
        elif isinstance(h, ReportLine):
            out.report.append(h)
        elif h is None:
            unknown.append(e.name)
            out.report.append(ReportLine(e.name, "dropped", note=f"not a BERT {what} (--skip-unknown)"))
        elif h.optimizer and not opts.with_optimizer:
            out.report.append(ReportLine(e.name, "dropped", note="optimizer state; convert it with --with-optimizer"))
        elif h.optimizer:
            out.report.append(ReportLine(e.name, "optimizer", h.target, h.note))
            out.optimizer.append((e, h))
        elif h.kind in ("tied", "buffer"):
            later.append((e, h, len(out.report)))
            out.report.append(None)  # its line once the twin is known
        else:
            for c in h.targets:
                if c in owner:
                    raise CheckpointError(f"{where}: {what}s {owner[c]} and {e.name} are both {c}")
                owner[c] = e.name
            out.report.append(ReportLine(e.name, "mapped", ", ".join(h.targets), h.note))
            out.model.append((e, h))
    if not out.model:
        spelled = table.from_canonical(WORD_EMB)[0] if table and table.from_canonical(WORD_EMB) else WORD_EMB
        raise CheckpointError(f"{where}: not a BERT checkpoint (no {spelled} or other BERT {what})")
    if unknown and not opts.skip_unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise CheckpointError(f"{where}: unknown {what} {unknown[0]}{more} (not BERT; --skip-unknown drops them)")
    for e, h, i in later:
        if h.kind == "tied":
            if h.target not in owner:
                raise CheckpointError(f"{where}: {what} {e.name} is tied to {h.target}, which is missing")
            out.ties.setdefault(h.target, []).append(e)
            out.report[i] = ReportLine(e.name, "dropped", note=h.note or f"tied to {owner[h.target]}, equal")
        else:
            out.report[i] = ReportLine(e.name, "dropped", note=h.note)
    for e, h in out.model + out.optimizer:
        if e.problem:
            raise CheckpointError(f"{where}: {what} {e.name} {e.problem}")
        n = len(h.parts)
        if h.kind == "fused" and (not e.shape or e.shape[0] % n):
            raise CheckpointError(f"{where}: {what} {e.name} has shape {list(e.shape or ())}, not {n} fused parts")
    for e, h, _ in later:
        msg = h.check(e.read()) if h.kind == "buffer" and h.check else None
        if msg:
            raise CheckpointError(f"{where}: buffer {e.name} {msg}")
    return out


def _shapes(e: Entry, h: Hit) -> list:
    """[(canonical name, shape)] a kept entry yields."""
    shape = apply_shape(h.transform, e.shape)
    if h.kind == "fused":
        shape = (shape[0] // len(h.parts),) + tuple(shape[1:])
    return [(c, shape) for c in h.targets]


def check(model, config: BertConfig, where: str, table: Table, fill=(), noun: str = "tensor",
          shown: Optional[Callable[[str], str]] = None) -> None:
    """:func:`bert_of.tensors.check_fit` of the kept (entry, hit) pairs (plus ``fill`` specs), its
    messages in the file's names (``shown(canonical)`` for a tensor the file lacks) and with
    shapes as stored ([in, out] kernels, [1, P, H] positions)."""
    shapes = {c: shape for e, h in model for c, shape in _shapes(e, h)}
    shapes.update({s.name: s.shape for s in fill})
    stored = {c: (e.name, None if h.kind == "fused" else h.transform) for e, h in model for c in h.targets}

    def source(name):
        if name in stored:
            return stored[name][0]
        if shown is not None:
            return shown(name)
        spelled = table.from_canonical(name) if table else None
        return spelled[0] if spelled else name

    def source_shape(name, shape):
        transform = stored[name][1] if name in stored else \
            ((table.from_canonical(name) if table else None) or (None, None))[1]
        return apply_shape(inverse(transform), shape)

    try:
        check_fit(shapes, config, where, source, source_shape)
    except CheckpointError as e:
        if noun == "tensor":
            raise
        raise CheckpointError(str(e).replace(": tensor ", f": {noun} ", 1)) from None


def zeros(names_shapes, dtype) -> list:
    """``fill`` specs: tensors a file lacks, filled with zeros of ``dtype``."""
    return [TensorSpec(n, np.dtype(dtype), shape) for n, shape in names_shapes]


def pooler_zeros(config: BertConfig, dtype) -> list:
    H = config.hidden_size
    return zeros(zip(POOLER, ((H, H), (H,))), dtype)


def _tied(e: Entry, twins: list, where: str) -> Callable:
    """``e.read`` that also checks the tied copies of ``e`` hold the same bytes (bert_of keeps one)."""
    if not twins:
        return e.read

    def read():
        arr = e.read()
        for t in twins:
            if t.origin is not None and t.origin == e.origin:
                continue  # one stored object under two names: the same tensor
            other = t.read()
            if other.dtype != arr.dtype or other.shape != arr.shape or other.tobytes() != arr.tobytes():
                raise CheckpointError(f"{where}: tensor {t.name} differs from {e.name}; the model ties them "
                                      f"(bert_of keeps one)")
        return arr
    return read


def _stream(pairs, opts: Options, ties: Optional[dict] = None, where: str = "") -> list:
    out = []
    for e, h in pairs:
        read = _tied(e, (ties or {}).get(h.target, []), where) if h.kind == "mapped" else e.read
        for j, (c, shape) in enumerate(_shapes(e, h)):
            spec = TensorSpec(c, np.dtype(e.dtype), shape)
            if h.kind == "fused":
                produce = (lambda r=read, h=h, j=j: h.split(apply(h.transform, r()), j))
            else:
                produce = (lambda r=read, t=h.transform: apply(t, r()))
            # --dtype casts weights and their moments, never counters, loss scales or beta^t
            cast = c not in SCALAR_STATE and c.partition("/")[0] not in SCALAR_SLOTS
            out.append(cast_spec(spec, produce, opts.dtype if cast else None))
    return out


def finish(where: str, fmt: str, config: BertConfig, vocab: Optional[str], found: Sorted, opts: Options,
           table: Table, fill=(), optimizer_meta: Optional[dict] = None, noun: str = "tensor",
           shown: Optional[Callable[[str], str]] = None, config_file: Optional[str] = None) -> Source:
    """The label count, the fit check, the producers: the ``Source`` (validated once more there).
    ``config_file``: the config read, which verify's reference reads for itself."""
    clf = next((apply_shape(h.transform, e.shape) for e, h in found.model if h.target == CLASSIFIER), None)
    if clf:  # the label count is the tensor's (Google's configs do not record it)
        config.num_labels = clf[0]
    check(found.model, config, where, table, fill, noun, shown)
    layout = {e.name: LAYOUT_NOTES.get(h.transform, "") for e, h in found.model}  # known now (lazy: by shape)
    for r in found.report:
        if r.action == "mapped" and layout.get(r.source):
            r.note = f"{layout[r.source]}; {r.note}" if r.note else layout[r.source]
    tensors = _stream(found.model, opts, found.ties, where)
    tensors += [cast_spec(s, (lambda s=s: np.zeros(s.shape, s.dtype)), opts.dtype) for s in fill]
    return Source(where, fmt, config, vocab, tensors, _stream(found.optimizer, opts),
                  dict(optimizer_meta or {}) if found.optimizer else {}, found.report,
                  {e.name: checked_producer(TensorSpec(e.name, np.dtype(e.dtype), e.shape), e.read, where)
                   for e, _ in found.model}, config_file)


ATTEMPTS = 5  # reads of a checkpoint replaced meanwhile, as bert_of.checkpoint.load_checkpoint


def _one_line(pin: PinnedDir, e: Exception) -> BertOfError:
    """``e`` as one bert_of error naming files as the user did (not through /proc)."""
    if isinstance(e, OSError):
        where = pin.shown(e.filename) if isinstance(e.filename, str) else pin.path
        return CheckpointError(f"{where}: cannot read ({e.strerror or e})")
    text = pin.shown(str(e))
    if text == str(e):
        return e
    try:
        return type(e)(text)
    except TypeError:
        return CheckpointError(text)


def whole(path: str, read_pinned: Callable[[PinnedDir], Source]):
    """``read_pinned(pin)`` on ``path``'s tree held open: one whole checkpoint (see the module doc).

    The reader opens every file of the checkpoint through ``pin`` (``pin.real(p)`` / ``pin.hold(p)``
    for the display path ``p``); a publisher does not delete the tree meanwhile (the pin's shared
    lock, bert_of.files.pinned). When the tree was replaced while it was read anyway (a file of it
    gone, or an error while ``pin.replaced()``), the whole read starts again, up to ATTEMPTS times."""
    for attempt in range(ATTEMPTS):
        try:
            pin = PinnedDir.around(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such file or directory") from None
        except OSError as e:
            raise CheckpointError(f"{path}: cannot open ({e.strerror})") from None
        try:
            source = read_pinned(pin)
            pin.release()  # its files are open: the tree may now be deleted once swapped out
        except (OSError, BertOfError) as e:
            again = pin.replaced()
            err = _one_line(pin, e)
            pin.close()
            if not again:
                raise err from None
            if attempt == ATTEMPTS - 1:
                raise SourceChanged(f"{path}: replaced {ATTEMPTS} times while being read (is something rewriting "
                                    f"it in a loop?): {err}") from None
            continue
        if isinstance(source, Source):
            _keep(source, pin)
        else:  # a description (inspect), read whole: nothing streams from it later
            pin.close()
        return source
    raise AssertionError("unreachable")


def _keep(source: Source, pin: PinnedDir) -> None:
    """Producers that read ``pin``'s tree: an error once it was replaced is ``SourceChanged``."""
    source.pinned = pin
    where = source.path  # not the Source: no cycle, so its files close when it is dropped

    def keep(p):
        def produce():
            try:
                return p()
            except (OSError, BertOfError) as e:
                err = _one_line(pin, e)
                if pin.replaced():
                    raise SourceChanged(f"{where}: replaced by another checkpoint while its tensors were "
                                        f"being read ({err}); read it again") from None
                raise err from None
        produce.checked = getattr(p, "checked", False)
        return produce

    source.tensors = [(s, keep(p)) for s, p in source.tensors]
    source.optimizer = [(s, keep(p)) for s, p in source.optimizer]
    source.stored = {k: keep(p) for k, p in source.stored.items()}
