"""Writing a legacy lazy OneFlow snapshot (``of2lazy``; the layout: converters/formats/lazy/).

One folder per variable with ``out`` and ``meta``
(exactly the text OneFlow's ``text_format.MessageToString`` gives), then an
empty ``snapshot_done``, written last. ``--no-meta`` writes the oldest layout
(``out`` + ``snapshot_done``; float32 only, since nothing records a dtype).
``bert_config.json`` (Google style) and ``vocab.txt`` go INSIDE the snapshot:
the loaders tolerate extra plain files. OneFlow 0.9's ``flow.load`` (checked in
check_point_v2.py and by the tests) asserts ``snapshot_done`` is present, then
treats every other directory entry as a variable and skips an entry without
``<entry>/out`` with a UserWarning ("does not have valid tensor data"), so the
two files cost two warnings and nothing else; the lazy-era
``flow.checkpoint.get`` skips entries without ``out`` silently, and the C++
model IO opens ``<snap>/<variable>/out`` by name. It also reads only
snapshots whose every variable has ``meta`` (no meta: RuntimeError "This
variable does not have meta info"). Keeping the config inside makes the
snapshot self-describing, which ``--no-meta`` output needs to be read back.
"""

from __future__ import annotations

import os
import re

import numpy as np

from bert_of.config import PROVENANCE_LN_EPS, BertConfig
from bert_of.errors import CheckpointError
from bert_of.files.atomic import writes_to
from bert_of.converters.source import Options, Source, write_google_sidecars
from bert_of.converters.mapping import apply, inverse
from bert_of.converters.containers.variable_meta import format_meta
from bert_of.converters.formats.lazy.names import DATA_FILE, META_FILE, SCALAR_SLOTS, SNAPSHOT_DONE, TABLE

_WRITE_SLOTS = {"m": "m", "v": "v", "beta1_t": "beta1_t", "beta2_t": "beta2_t", "momentum": "momentum"}
# The job function names of OneFlow-Benchmark's BERT scripts (used when the source has none).
DEFAULT_JOBS = (("qa_outputs.", "SquadFinetuneJob"), ("classifier.", "BertGlueFinetuneJob"))
DEFAULT_JOB = "PretrainJob"
# A job name becomes part of a folder name: letters, digits, "_", "-", "." (not leading).
_JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


def _lazy_numerics_note(config: BertConfig):
    reasons = []
    if config.hidden_act == "gelu_tanh":
        reasons.append("activation gelu_tanh (the lazy kernel computes gelu_erf)")
    elif config.hidden_act not in ("gelu_erf", "relu", "tanh", "linear"):
        reasons.append(f"activation {config.hidden_act} (the lazy BERT has none)")
    if not np.isclose(config.layer_norm_eps, PROVENANCE_LN_EPS["lazy"], rtol=1e-9, atol=0):
        reasons.append(f"layer_norm_eps {config.layer_norm_eps:g} (flow.layers.layer_norm uses 1e-05)")
    if not reasons:
        return None
    note = "note: the legacy lazy OneFlow BERT would compute differently: " + "; ".join(reasons)
    if config.provenance in ("tf1", "hf"):
        note += f"; reading this snapshot back records lazy numerics unless --numerics {config.provenance}"
    return note


def _job_name(source: Source, key="lazy_job_name") -> str:
    job = source.optimizer_meta.get(key) or source.optimizer_meta.get("lazy_job_name")
    if job:
        if not isinstance(job, str) or not _JOB_NAME.fullmatch(job):
            raise CheckpointError(f"{source.path}: optimizer metadata {key} {str(job)[:60]!r} is not a job name "
                                  f"(letters, digits, _ - .); it would name a variable folder")
        return job
    names = [s.name for s, _ in source.tensors]
    for prefix, j in DEFAULT_JOBS:
        if any(n.startswith(prefix) for n in names):
            return j
    return DEFAULT_JOB


def write_files(source: Source, d: str, opts: Options) -> list:
    """The snapshot's variable folders, bert_config.json, vocab.txt, snapshot_done into ``d``."""
    notes = []
    n = _lazy_numerics_note(source.config)
    if n:
        notes.append(n)

    items = []  # (lazy name, producer of the on-disk array)
    for spec, prod in source.tensors:
        hit = TABLE.from_canonical(spec.name)
        if hit is None:
            raise CheckpointError(f"{source.path}: tensor {spec.name} has no lazy OneFlow name")
        items.append((hit[0], _inverse_producer(prod, hit[1])))
    if opts.with_optimizer and source.optimizer:
        job, ls_job = _job_name(source), _job_name(source, "lazy_loss_scale_job_name")
        for spec, prod in source.optimizer:
            if spec.name == "step":
                items.append((f"System-Train-TrainStep-{job}", _one(prod, np.int64)))
                continue
            if spec.name == "loss_scale":
                items.append((f"System-Train-DynamicLossScale-{ls_job}-LossScale", _one(prod, None)))
                continue
            if spec.name == "good_step_counter":
                items.append((f"System-Train-DynamicLossScale-{ls_job}-GoodStepCounter", _one(prod, np.int64)))
                continue
            slot, _, canonical = spec.name.partition("/")
            hit = TABLE.from_canonical(canonical)
            if hit is None or slot not in _WRITE_SLOTS:
                raise CheckpointError(f"{source.path}: optimizer tensor {spec.name} has no lazy OneFlow name")
            if slot in SCALAR_SLOTS:
                items.append((f"{hit[0]}-{_WRITE_SLOTS[slot]}", _one(prod, None)))
            else:
                items.append((f"{hit[0]}-{_WRITE_SLOTS[slot]}", _inverse_producer(prod, hit[1])))
        meta = source.optimizer_meta
        if meta.get("optimizer") == "adamw" and (meta.get("bias_correction", "false") != "false" or
                                                  meta.get("eps", "1e-06") not in ("1e-06", "1e-6")):
            notes.append(f"note: the optimizer state was kept with bias_correction {meta.get('bias_correction')}, "
                         f"eps {meta.get('eps')}; the lazy AdamW has no bias correction and eps 1e-06")
    seen = set()
    for name, _ in items:
        if name in seen:
            raise CheckpointError(f"{source.path}: two tensors map to the lazy variable {name}")
        seen.add(name)

    if opts.no_meta:  # before anything is written: every float must be float32
        specs = list(source.tensors) + (list(source.optimizer) if opts.with_optimizer else [])
        for spec, _ in specs:
            if spec.name not in ("step", "good_step_counter") and spec.dtype != np.float32:
                raise CheckpointError(f"{source.path}: --no-meta records no dtype and readers assume float32, "
                                      f"but {spec.name} is {spec.dtype}")
    for name, prod in items:
        arr = np.asarray(prod())
        if opts.no_meta and arr.dtype.kind in "fV" and arr.dtype != np.float32:
            raise CheckpointError(f"--no-meta records no dtype and readers assume float32, but {name} is {arr.dtype}")
        if opts.no_meta and arr.dtype.kind not in "fV" and arr.dtype != np.int64:
            raise CheckpointError(f"--no-meta records no dtype, but {name} is {arr.dtype}")
        _write_var(os.path.join(d, name), arr, not opts.no_meta)
    write_google_sidecars(source, d)
    with writes_to(os.path.join(d, SNAPSHOT_DONE)), open(os.path.join(d, SNAPSHOT_DONE), "w"):
        pass
    return notes


def _write_var(d, arr, with_meta):
    with writes_to(d):
        os.makedirs(d)
    dtype = arr.dtype
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
        arr = arr.astype(dtype)
    arr = np.ascontiguousarray(arr)
    out = os.path.join(d, DATA_FILE)
    with writes_to(out), open(out, "wb") as f:
        if arr.size:
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))
    if with_meta:
        meta = os.path.join(d, META_FILE)
        with writes_to(meta), open(meta, "w") as f:
            f.write(format_meta(arr.shape, arr.dtype))


def _inverse_producer(prod, transform):
    inv = inverse(transform)
    return lambda: apply(inv, prod())


def _one(prod, dtype):
    """A scalar (or [1]) canonical value as the [1] tensor lazy OneFlow keeps."""
    def f():
        a = np.asarray(prod())
        if a.size != 1:
            raise CheckpointError(f"expected one value, got shape {list(a.shape)}")
        return a.reshape((1,)).astype(dtype if dtype is not None else a.dtype, copy=False)

    return f

