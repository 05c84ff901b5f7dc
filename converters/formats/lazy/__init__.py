"""Legacy lazy OneFlow BERT snapshots (OneFlow-Benchmark LanguageModeling/BERT) <-> canonical names.

A snapshot is a directory with one folder per variable::

    <snap>/<var>/out      raw little-endian C-order bytes, no header
    <snap>/<var>/meta     optional text VariableMetaInfo: shape { dim: 30522 dim: 768 } data_type: kFloat
    <snap>/snapshot_done  empty; written last by OneFlow

Variables without ``meta`` (the oldest, C++ model-IO layout) get their shapes
from ``bert_config.json``: ``--config``, else ``<snap>/bert_config.json``,
else ``<snap>/../bert_config.json``; their dtype is float32 (int64 for step
counters). Every ``out`` is size-checked before anything is converted.

Names are dash-joined scopes. Dense weights are [in, out] ("T" to the
canonical [out, in]); position embeddings are [1, P, H] ("squeeze0");
``cls-seq_relationship-output_weights`` and ``classification-output_weights``
are already [out, in]; the SQuAD ``cls-squad-output-weight`` is [H, 2] ("T").

Also read: the output of OneFlow-Benchmark's ``convert_tf_ckpt_to_of.py``
(Google TF weights): the same names (``/`` -> ``-``, ``kernel`` -> ``weight``)
but position embeddings [P, H], TF head names (``cls-squad-output_weights``
[2, H]; the classifier's ``output_weights`` / ``output_bias``, which its
off-by-one split writes as ``output_weight-output_weights`` /
``output_bia-output_bias``), Adam slots ``<var>-kernel-adam_m`` /
``<var>-adam_v`` (the script renames ``kernel`` only as the last path
element, so slot folders keep it), ``global_ste-global_step`` (the same
off-by-one), only ``out`` files, no ``snapshot_done``.

Numerics: a genuine lazy snapshot computes erf GELU with LayerNorm eps 1e-5
(the lazy kernels and ``flow.layers.layer_norm``'s default); the config records
that (``provenance`` "lazy"). A ``convert_tf_ckpt_to_of.py`` snapshot holds
Google's weights, so tf1 numerics (tanh GELU, eps 1e-12) are recorded and the
report says why. ``--numerics`` overrides either. Which of the two a snapshot
is: TF-only names (``-adam_m``, ``global_ste-global_step``, TF head names)
say TF, lazy-only names (``-m``/``-v``/LAMB/momentum slots,
``System-Train-*``, lazy head names) say lazy; with neither, a 2-D position
embedding ``meta`` says TF, a 3-D one or a ``snapshot_done`` says lazy, and a
directory with neither ``meta`` nor ``snapshot_done`` (exactly what the script
writes) is taken as TF.

Optimizer and system variables (converted with ``--with-optimizer``, else
reported dropped): ``<var>-m`` / ``-v`` -> ``m/<canonical>`` / ``v/<canonical>``;
LAMB ``-beta1_t`` / ``-beta2_t`` ([1], the beta^t accumulators LAMB divides by,
i.e. bias correction) -> ``beta1_t/<canonical>`` / ``beta2_t/<canonical>``;
``-momentum`` -> ``momentum/<canonical>``; ``System-Train-TrainStep-<Job>``
(int64 [1]) -> ``step`` (int64 scalar); fp16's
``System-Train-DynamicLossScale-<Job>-LossScale`` (float [1]) and
``-GoodStepCounter`` (int64 [1]) -> ``loss_scale`` / ``good_step_counter``
(scalars). The job name is kept in ``optimizer_meta["lazy_job_name"]`` so
``of2lazy`` writes the same variable names back.

Writing: converters/formats/lazy/write.py; the ``meta`` record: converters/containers/variable_meta.py;
the names: converters/formats/lazy/names.py.
"""

from __future__ import annotations

import math
import os

import numpy as np

from bert_of.tensors import expected_shapes
from bert_of.config import PROVENANCE_LN_EPS, BertConfig
from bert_of.errors import CheckpointError, ConfigError
from bert_of.files.reading import read_bounded
from bert_of.tensors import nbytes
from bert_of.converters.source import Options, ReportLine, Source
from bert_of.converters.mapping import apply_shape, inverse
from bert_of.converters.reader import Entry, Hit, check, finish, sort, whole
from bert_of.converters.descriptor import Format
from bert_of.converters.verify import reference_np
from bert_of.converters.containers.variable_meta import parse_meta
from bert_of.converters.formats.lazy.names import (CONFIG_FILE, DATA_FILE, META_FILE, NAME, POSITION, SCALAR_SLOTS,
                                           SNAPSHOT_DONE, TABLE, VOCAB_FILE, classify, model_hit)
from bert_of.converters.formats.lazy.write import write_files

# system variable -> (on-disk dtype and shape when there is no meta)
_SYSTEM = {"step": (np.dtype("<i8"), (1,)), "loss_scale": (np.dtype("<f4"), (1,)),
           "good_step_counter": (np.dtype("<i8"), (1,)), "tf_step": (np.dtype("<i8"), ())}

LAZY_NUMERICS = {"tf1": "gelu_tanh", "lazy": "gelu_erf", "hf": "gelu_erf"}
_MAX_META = 1 << 16  # a VariableMetaInfo is a few lines


# --------------------------------------------------------------------------- detect


def detect(path: str) -> bool:
    """A directory with snapshot_done, or with a folder holding ``out`` named like a BERT variable."""
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, SNAPSHOT_DONE)):
        return True
    try:
        entries = list(os.scandir(path))
    except OSError:
        return False
    for e in entries:
        if e.is_dir() and model_hit(e.name) and os.path.isfile(os.path.join(e.path, DATA_FILE)):
            return True
    return False


# --------------------------------------------------------------------------- read


def _find_side(snap, override, name, what, pin):
    """The side file ``name`` (the path naming it): ``override``, else in the snapshot or beside it."""
    if override:
        if not os.path.isfile(pin.real(override)):
            raise (ConfigError if what == "config" else CheckpointError)(f"{override}: {what} file not found")
        return override
    for d in (snap, os.path.dirname(os.path.abspath(snap))):
        p = os.path.join(d, name)
        if os.path.isfile(pin.real(p)):
            return p
    return None


def apply_numerics(config: BertConfig, provenance: str) -> BertConfig:
    """Record what a source computes: GELU flavour and LayerNorm eps of ``provenance``."""
    if config.hidden_act in ("gelu_tanh", "gelu_erf"):
        config.hidden_act = LAZY_NUMERICS[provenance]
    config.layer_norm_eps = PROVENANCE_LN_EPS[provenance]
    config.provenance = provenance
    config.validate()
    return config


class _Var(Entry):
    """A variable folder: an Entry (name, on-disk shape and dtype, its ``out`` read raw) and what
    the lazy rules need to get there (kind, variant evidence, slot or job, meta)."""

    def __init__(self, name, d, kind, target, transform, evidence, extra):
        super().__init__(name, read=self._read)
        self.dir, self.kind, self.evidence, self.extra, self.meta = d, kind, evidence, extra, None
        self.data = None  # the path that reads ``out`` once it is held open (reader.whole), else out
        self.hit = None if kind is None else Hit(target, transform, optimizer=kind != "model")

    target = property(lambda self: self.hit.target)
    transform = property(lambda self: self.hit.transform, lambda self, t: setattr(self.hit, "transform", t))

    @property
    def out(self):
        return os.path.join(self.dir, DATA_FILE)

    def _read(self):
        n = math.prod(self.shape)
        try:
            arr = np.fromfile(self.data or self.out, dtype=self.dtype, count=n)
        except OSError as e:
            raise CheckpointError(f"{self.out}: cannot read ({e.strerror or e})") from None
        if arr.size != n:
            raise CheckpointError(f"{self.out}: file ended early ({arr.size} of {n} elements)")
        return arr.reshape(self.shape)


def _variant(snap, vars_, done):
    """("lazy"|"tf", reason)."""
    ev = {v.evidence for v in vars_ if v.evidence}
    names = {e: next((v.name for v in vars_ if v.evidence == e), None) for e in ("lazy", "tf")}
    if "conflict" in ev or ("lazy" in ev and "tf" in ev):
        bad = next((v.name for v in vars_ if v.evidence == "conflict"), None)
        detail = bad or f"{names['lazy']} and {names['tf']}"
        raise CheckpointError(f"{snap}: mixes lazy OneFlow names and convert_tf_ckpt_to_of.py names ({detail})")
    if "tf" in ev:
        return "tf", f"TF name {names['tf']}"
    if "lazy" in ev:
        return "lazy", f"lazy name {names['lazy']}"
    pos = next((v for v in vars_ if v.name == POSITION and v.meta), None)
    if pos is not None and len(pos.meta[0]) == 2:
        return "tf", f"{POSITION} is 2-D"
    if pos is not None and len(pos.meta[0]) == 3:
        return "lazy", f"{POSITION} is [1, P, H]"
    if done:
        return "lazy", SNAPSHOT_DONE
    if any(v.meta for v in vars_):
        return "lazy", "meta files"
    return "tf", f"only out files, no meta, no {SNAPSHOT_DONE}"


def read(path: str, opts: Options) -> Source:
    path = os.fspath(path)  # a PathLike from a Python caller
    snap = path.rstrip("/") or path
    if not os.path.isdir(snap):
        raise CheckpointError(f"{snap}: not a directory (a lazy OneFlow snapshot is a directory of variable folders)")
    return whole(snap, lambda pin: _read(pin, snap, opts))


def _read(pin, snap: str, opts: Options) -> Source:
    """Every variable folder through ``pin`` (bert_of.files.pinned.PinnedDir: one snapshot, whatever replaces
    ``snap``); the variables' paths read that tree (messages name them as ``snap`` does)."""
    done = os.path.isfile(pin.real(os.path.join(snap, SNAPSHOT_DONE)))

    vars_, empty = [], []
    for e in sorted(os.scandir(pin.real(snap)), key=lambda e: e.name):
        if not e.is_dir():
            continue  # snapshot_done, bert_config.json, vocab.txt, notes: not variables
        if not os.path.isfile(os.path.join(e.path, DATA_FILE)):
            empty.append(e.name)
            continue
        kind, target, transform, evidence, extra = classify(e.name)
        v = _Var(e.name, e.path, kind, target, transform, evidence, extra)
        if os.path.isfile(os.path.join(e.path, META_FILE)):
            raw = read_bounded(os.path.join(e.path, META_FILE), _MAX_META, "VariableMetaInfo", CheckpointError)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise CheckpointError(f"{os.path.join(e.path, META_FILE)}: cannot read ({err})") from None
            v.meta = parse_meta(text, os.path.join(e.path, META_FILE))
        vars_.append(v)
    if not any(v.kind == "model" for v in vars_):
        seen = (f"{len(vars_)} variable folder(s), e.g. {vars_[0].name}" if vars_
                else "no variable folders with out files")
        raise CheckpointError(f"{snap}: not a BERT snapshot ({seen}; no bert-embeddings-word_embeddings "
                              f"or other BERT variable)")
    if empty and not opts.skip_unknown:
        raise CheckpointError(f"{snap}: folder {empty[0]} has no {DATA_FILE} file (a variable folder without data; "
                              f"--skip-unknown ignores it)")
    found = sort(vars_, lambda v: v.hit, opts, snap, "variable", TABLE)
    for v, _ in found.model + found.optimizer:  # read later, from this snapshot even once it is replaced
        v.data = pin.hold(v.out, spare=True)
    known = [v for v in vars_ if v.kind is not None]
    variant, why = _variant(snap, known, done)

    cfg_path = _find_side(snap, opts.config, CONFIG_FILE, "config", pin)
    if cfg_path is None:
        need = ("its variables have no meta files, so shapes must come from it; "
                if not all(v.meta for v in known) else "")
        raise ConfigError(f"{snap}: no {CONFIG_FILE} in the snapshot or its parent directory ({need}pass --config)")
    held_cfg = pin.hold(cfg_path)
    with open(held_cfg, "rb") as f:
        config = BertConfig.from_google_json_file(cfg_path, raw=f.read())
    provenance = opts.numerics or ("tf1" if variant == "tf" else "lazy")
    apply_numerics(config, provenance)
    vocab = _find_side(snap, opts.vocab, VOCAB_FILE, "vocab", pin)
    vocab = vocab and pin.hold(vocab)

    _resolve_shapes(snap, known, config, variant)

    # optimizer semantics
    slots = {v.extra[0] for v in known if v.kind == "slot"}
    jobs = {v.kind: v.extra for v in known if v.kind in ("step", "loss_scale", "good_step_counter")}
    steps = [v.name for v in known if v.kind in ("step", "tf_step")]
    if len(steps) > 1:
        raise CheckpointError(f"{snap}: more than one train step variable ({', '.join(steps)})")

    if variant == "tf" and not opts.numerics:  # said once, on the first weight
        first = next(r for r in found.report if r.action == "mapped")
        first.note = (f"convert_tf_ckpt_to_of.py output ({why}): Google TF weights, recorded tf1 numerics "
                      f"(gelu_tanh, layer_norm_eps 1e-12; --numerics lazy overrides)")
    for name in empty:
        found.report.append(ReportLine(name, "dropped", note=f"folder without {DATA_FILE} (--skip-unknown)"))

    meta = {}
    if "beta1_t" in slots or "beta2_t" in slots:
        meta = {"optimizer": "lamb", "bias_correction": "true", "eps": "1e-06",
                "bias_correction_state": "beta1_t/beta2_t (beta^t per variable)"}
    elif "momentum" in slots:
        meta = {"optimizer": "sgd_momentum"}
    else:
        meta = {"optimizer": "adamw", "bias_correction": "false", "eps": "1e-06"}
    meta["source"] = ("legacy lazy OneFlow" if variant == "lazy"
                      else "google-research/bert AdamWeightDecayOptimizer via convert_tf_ckpt_to_of.py")
    if "step" in jobs:
        meta["lazy_job_name"] = jobs["step"]
    for k in ("loss_scale", "good_step_counter"):
        if k in jobs and jobs[k] != meta.setdefault("lazy_job_name", jobs[k]):
            meta["lazy_loss_scale_job_name"] = jobs[k]
    source = finish(snap, NAME, config, vocab, found, opts, TABLE, optimizer_meta=meta, config_file=held_cfg)
    source.native_numerics = "tf1" if variant == "tf" else "lazy"
    return source


def _model_shape(snap, v, config, variant):
    """(on-disk shape, dtype) of a model variable: its meta, else what the config implies."""
    if v.meta:
        return v.meta
    H = config.hidden_size
    if v.target in ("classifier.weight", "classifier.bias"):  # Google-style configs lack the label count
        size = os.path.getsize(v.out)
        per = 4 * (H if v.target == "classifier.weight" else 1)
        if size % per or size == 0:
            what = f"rows of hidden_size {H}" if per > 4 else "values"
            raise CheckpointError(f"{v.out}: {size} bytes is not a whole number of float32 {what} "
                                  f"(classifier {v.name}; no meta)")
        labels = size // per
        return ((labels, H) if v.target == "classifier.weight" else (labels,)), np.dtype("<f4")
    want = expected_shapes(config)
    if v.target not in want:
        _no_place(snap, v.name, v.target, config)
    if v.target == "bert.embeddings.position_embeddings.weight":
        shape = want[v.target] if variant == "tf" else (1,) + tuple(want[v.target])
    else:
        shape = apply_shape(inverse(v.transform), want[v.target])
    return tuple(shape), np.dtype("<f4")


def _no_place(snap, name, target, config):
    m = target.split(".")
    if m[:3] == ["bert", "encoder", "layer"]:
        raise CheckpointError(f"{snap}: tensor {name} is layer {m[3]} but the config has "
                              f"num_hidden_layers {config.num_hidden_layers}")
    raise CheckpointError(f"{snap}: tensor {name} has no place in a BERT model")


def _position_transform(v):
    if v.target.endswith("bert.embeddings.position_embeddings.weight"):
        v.transform = "squeeze0" if len(v.shape) == 3 else None


def _check_sizes(vars_):
    for v in vars_:
        need = nbytes(v.shape, v.dtype)
        size = os.path.getsize(v.out)
        if size != need:
            src = "meta" if v.meta else "config"
            hint = " (truncated?)" if size < need else ""
            raise CheckpointError(f"{v.out}: {size} bytes, but {v.name} is {np.dtype(v.dtype).name} "
                                  f"{list(v.shape)} by its {src}, which needs {need}{hint}")


def _resolve_shapes(snap, vars_, config, variant):
    """Shapes and dtypes of every variable (meta, else config); out sizes; the config fit."""
    model = [v for v in vars_ if v.kind == "model"]
    for v in model:
        v.shape, v.dtype = _model_shape(snap, v, config, variant)
        _position_transform(v)
    _check_sizes(model)
    clf = next((v for v in model if v.target == "classifier.weight"), None)
    if clf is not None and len(clf.shape) == 2:
        config.num_labels = clf.shape[0]
    check([(v, v.hit) for v in model], config, snap, TABLE)

    by_target = {v.target: v for v in model}
    rest = [v for v in vars_ if v.kind != "model"]
    for v in rest:
        if v.kind == "slot":
            prefix, base = v.extra
            if prefix in SCALAR_SLOTS:
                v.transform = None  # [1] per variable, whatever the variable's layout
                v.shape, v.dtype = v.meta or ((1,), np.dtype("<f4"))
                if tuple(v.shape) != (1,):
                    raise CheckpointError(f"{snap}: tensor {v.name} has shape {list(v.shape)}, expected [1]")
                continue
            b = by_target.get(v.target.split("/", 1)[1])
            if v.meta:
                v.shape, v.dtype = v.meta
                if b is not None and tuple(v.shape) != tuple(b.shape):
                    raise CheckpointError(f"{snap}: tensor {v.name} has shape {list(v.shape)} but its variable "
                                          f"{b.name} has {list(b.shape)}")
            elif b is not None:
                v.shape, v.dtype = tuple(b.shape), np.dtype("<f4")
            else:
                tmp = _Var(base, v.dir, "model", v.target.split("/", 1)[1], v.transform, None, None)
                v.shape, v.dtype = _model_shape(snap, tmp, config, variant)
            _position_transform(v)
        elif v.kind in _SYSTEM:
            v.transform = "scalar"  # a counter or loss scale kept as [1]: one value
            v.dtype, v.shape = _SYSTEM[v.kind]
            if v.meta:
                v.shape, v.dtype = v.meta
                if math.prod(v.shape) != 1:
                    raise CheckpointError(f"{snap}: tensor {v.name} has shape {list(v.shape)}, expected one value")
    _check_sizes(rest)


FORMAT = Format(NAME, "legacy lazy OneFlow snapshot (one folder per variable, out [+ meta])", detect, read, write_files,
                reference_np.Lazy, owns=(DATA_FILE, META_FILE, SNAPSHOT_DONE, CONFIG_FILE, VOCAB_FILE),
                token_classifier=True,  # bert_config.json's bert_of key
                table=TABLE, dtypes=("float32", "float16"),
                numerics_flag=("tf1", "lazy", "hf"))  # a snapshot does not say whose weights it holds  # the meta record has no bfloat16 code here
