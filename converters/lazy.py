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

Writing (``of2lazy``): one folder per variable with ``out`` and ``meta``
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

import math
import os
import re

import numpy as np

from bert_of.checkpoint import expected_shapes
from bert_of.config import PROVENANCE_LN_EPS, BertConfig
from bert_of.errors import CheckpointError, ConfigError
from bert_of.files.atomic import writes_to
from bert_of.files.reading import read_bounded
from bert_of.tensors import check_shape, nbytes
from bert_of.converters.source import Options, ReportLine, Source, write_google_sidecars
from bert_of.converters.mapping import Table, apply, apply_shape, inverse, spell
from bert_of.converters.reader import Entry, Hit, check, finish, sort, whole
from bert_of.converters.descriptor import Format
from bert_of.converters import reference_np

NAME = "lazy"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
SNAPSHOT_DONE = "snapshot_done"
DATA_FILE = "out"
META_FILE = "meta"


def _scope(canonical: str) -> str:
    return canonical.replace(".", "-").replace("layer-{i}", "layer_{i}")


# How the lazy BERT spells each kind of scope (dense weights [in, out]; positions [1, P, H]).
PARAMS = {
    "embedding": [("", ".weight")],
    "position": [("", ".weight", "squeeze0")],
    "dense": [("-weight", ".weight", "T"), ("-bias", ".bias")],
    "ln": [("-LayerNorm-gamma", ".LayerNorm.weight"), ("-LayerNorm-beta", ".LayerNorm.bias")],
    "bias": [("-output_bias", ".bias")],
    "out": [("-output_weights", ".weight"), ("-output_bias", ".bias")],  # already [out, in]
}
POSITION = "bert-embeddings-position_embeddings"
# What OneFlow-Benchmark's lazy BERT names its variables (the writer's table).
TABLE = Table(spell(_scope, PARAMS, {
    "bert.embeddings.position_embeddings": (POSITION, "position"),
    "cls.seq_relationship": ("cls-seq_relationship", "out"),
    "qa_outputs": ("cls-squad-output", "dense"),  # [H, 2]
    "classifier": ("classification", "out"),
}))
# convert_tf_ckpt_to_of.py's names for Google's variables (read only): TF's head names, [P, H] positions.
TF_TABLE = Table(spell(_scope, PARAMS, {
    "cls.seq_relationship": ("cls-seq_relationship", "out"),
    "qa_outputs": ("cls-squad", "out"),
    "classifier": ("", "out"),
}) + [("output_weight-output_weights", "classifier.weight"),  # the script's off-by-one split
      ("output_bia-output_bias", "classifier.bias")])

# slot suffix -> (canonical prefix, which snapshot variant names it)
SLOTS = {"m": ("m", "lazy"), "v": ("v", "lazy"), "beta1_t": ("beta1_t", "lazy"), "beta2_t": ("beta2_t", "lazy"),
         "momentum": ("momentum", "lazy"), "adam_m": ("m", "tf"), "adam_v": ("v", "tf")}
_WRITE_SLOTS = {"m": "m", "v": "v", "beta1_t": "beta1_t", "beta2_t": "beta2_t", "momentum": "momentum"}
_SCALAR_SLOTS = ("beta1_t", "beta2_t")  # float [1] per variable, not the variable's shape
_TRAIN_STEP = re.compile(r"^System-Train-TrainStep-(?P<job>.+)$")
_LOSS_SCALE = re.compile(r"^System-Train-DynamicLossScale-(?P<job>.+)-LossScale$")
_GOOD_STEPS = re.compile(r"^System-Train-DynamicLossScale-(?P<job>.+)-GoodStepCounter$")
_TF_STEPS = ("global_ste-global_step", "global_step")
# system variable -> (on-disk dtype and shape when there is no meta)
_SYSTEM = {"step": (np.dtype("<i8"), (1,)), "loss_scale": (np.dtype("<f4"), (1,)),
           "good_step_counter": (np.dtype("<i8"), (1,)), "tf_step": (np.dtype("<i8"), ())}
# The job function names of OneFlow-Benchmark's BERT scripts (used when the source has none).
DEFAULT_JOBS = (("qa_outputs.", "SquadFinetuneJob"), ("classifier.", "BertGlueFinetuneJob"))
DEFAULT_JOB = "PretrainJob"

# VariableMetaInfo.data_type (oneflow/core/common/data_type.proto)
_DT_NAMES = {"kChar": 1, "kFloat": 2, "kDouble": 3, "kInt8": 4, "kInt32": 5, "kInt64": 6, "kUInt8": 7,
             "kFloat16": 9, "kBFloat16": 11, "kBool": 12}
_DT_CODE_NAME = {v: k for k, v in _DT_NAMES.items()}


def _np_dtypes():
    d = {2: np.dtype("<f4"), 3: np.dtype("<f8"), 4: np.dtype("i1"), 5: np.dtype("<i4"), 6: np.dtype("<i8"),
         7: np.dtype("u1"), 9: np.dtype("<f2"), 12: np.dtype("?")}
    try:
        import ml_dtypes

        d[11] = np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover
        pass
    return d


_CODE_TO_NP = _np_dtypes()

LAZY_NUMERICS = {"tf1": "gelu_tanh", "lazy": "gelu_erf", "hf": "gelu_erf"}
_MAX_META = 1 << 16  # a VariableMetaInfo is a few lines
# A job name becomes part of a folder name: letters, digits, "_", "-", "." (not leading).
_JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


# --------------------------------------------------------------------------- meta


# OneFlow 0.9's DataType enum (data_type.proto, proto2: a number must name one of these).
_DT_ALL = {"kInvalidDataType": 0, "kChar": 1, "kFloat": 2, "kDouble": 3, "kInt8": 4, "kInt32": 5, "kInt64": 6,
           "kUInt8": 7, "kOFRecord": 8, "kFloat16": 9, "kTensorBuffer": 10, "kBFloat16": 11, "kBool": 12,
           "kUInt16": 13, "kUInt32": 14, "kUInt64": 15, "kUInt128": 16, "kInt16": 17, "kInt128": 18,
           "kComplex32": 19, "kComplex64": 20, "kComplex128": 21}
# protobuf's text_format tokenizer (3.20, which OneFlow 0.9's flow.load parses ``meta`` with):
# whitespace and #-comments between tokens, identifiers, numbers, quoted strings, else one character.
_PB_SPACE = re.compile(r"(\s|(#.*$))+", re.MULTILINE)
_PB_TOKEN = re.compile(r"[a-zA-Z_][0-9a-zA-Z_+-]*|([0-9+-]|(\.[0-9]))[0-9a-zA-Z_.+-]*"
                       r"|'[^'\n\\]*((\\.)+[^'\n\\]*)*('|\\?$)|\"[^\"\n\\]*((\\.)+[^\"\n\\]*)*(\"|\\?$)")
_MAX_DIMS = 32


def _pb_tokens(text: str) -> list:
    """The tokens text_format.Parse sees in ``text`` (as ``open(meta).read()`` gives it: universal
    newlines), line by line as it splits them."""
    out = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        col = 0
        while True:
            m = _PB_SPACE.match(line, col)
            if m:
                col = m.end()
            if col >= len(line):
                break
            m = _PB_TOKEN.match(line, col)
            tok = m.group(0) if m else line[col]
            out.append(tok)
            col += len(tok)
    return out


def _pb_int(tok: str):
    """text_format's integer (ParseInteger: C octal 0NN, else Python's int(text, 0)), or None."""
    octal = re.match(r"(-?)0(\d+)$", tok)
    try:
        return int(octal.group(1) + "0o" + octal.group(2) if octal else tok, 0)
    except ValueError:
        return None


def parse_meta(text: str, where: str):
    """Text-format VariableMetaInfo -> (shape tuple, numpy dtype), read as flow.load reads it
    (protobuf's text_format.Parse): fields ``shape`` (a message: ``{...}`` or ``<...>``, its ``:``
    optional) and ``data_type`` (an enum name, or a number naming one), each at most once, each
    followed by an optional ``,`` or ``;``; ``dim`` repeated, one at a time or as a list
    ``dim: [2, 3]``; integers decimal, hex or C octal; ``#`` comments. What text_format refuses is
    refused; a meta it reads but no tensor can have (negative dims, no data_type, a dtype bert_of
    has no NumPy type for) is refused after."""
    toks = _pb_tokens(text)
    i = 0
    shape, dtype_code = None, None

    def bad(why):
        return CheckpointError(f"{where}: not a VariableMetaInfo ({why})")

    def peek():
        return toks[i] if i < len(toks) else ""

    def take(tok):
        nonlocal i
        if peek() == tok:
            i += 1
            return True
        return False

    def separator():
        if not take(","):
            take(";")

    def dim():
        nonlocal i
        v = _pb_int(peek())
        if v is None or not -(1 << 63) <= v < (1 << 63):
            raise bad(f"dim {peek()[:40]!r} is not an int64")
        i += 1
        if v < 0:
            raise bad(f"negative dim {v}")
        dims.append(v)
        if len(dims) > _MAX_DIMS:
            raise bad(f"more than {_MAX_DIMS} dims")

    while i < len(toks):
        name = toks[i]
        i += 1
        if name == "shape":
            if shape is not None:
                raise bad("more than one shape")
            take(":")
            if take("<"):
                close = ">"
            elif take("{"):
                close = "}"
            else:
                raise bad("shape without {")
            dims = []
            while not take(close):
                if i >= len(toks):
                    raise bad("unterminated shape")
                if toks[i] != "dim":
                    raise bad(f"unexpected {toks[i][:40]!r} in shape")
                i += 1
                if not take(":"):
                    raise bad("dim without ':'")
                if take("["):  # dim: [2, 3]
                    if not take("]"):
                        while True:
                            dim()
                            if take("]"):
                                break
                            if not take(","):
                                raise bad("a dim list without ','")
                else:
                    dim()
                separator()
            shape = check_shape(dims, where)
        elif name == "data_type":
            if dtype_code is not None:
                raise bad("more than one data_type")
            if not take(":"):
                raise bad("data_type without ':'")
            v = peek()
            i += 1
            try:
                number = int(v, 0)  # text_format's ParseEnum: a number, else a name
            except ValueError:
                if v not in _DT_ALL:
                    raise bad(f"unknown data_type {v[:40]!r}") from None
                number = _DT_ALL[v]
            if number not in _DT_ALL.values():
                raise bad(f"data_type {number} is no DataType")
            dtype_code = number
        else:
            raise bad(f"unexpected {name[:40]!r}")
        separator()
    if dtype_code is None:
        raise bad("no data_type")
    if dtype_code not in _CODE_TO_NP:
        name = _DT_CODE_NAME.get(dtype_code, next(k for k, v in _DT_ALL.items() if v == dtype_code))
        raise CheckpointError(f"{where}: unsupported data_type {name}")
    return (shape if shape is not None else ()), _CODE_TO_NP[dtype_code]


def format_meta(shape, dtype) -> str:
    """What OneFlow's text_format.MessageToString writes for a VariableMetaInfo."""
    dtype = np.dtype(dtype)
    code = next((c for c, d in _CODE_TO_NP.items() if d == dtype), None)
    if code is None:
        raise CheckpointError(f"dtype {dtype} has no OneFlow DataType")
    dims = "".join(f"  dim: {int(d)}\n" for d in shape)
    return f"shape {{\n{dims}}}\ndata_type: {_DT_CODE_NAME[code]}\n"


# --------------------------------------------------------------------------- names


def _model_hit(name):
    """name -> (canonical, transform, variant evidence "lazy"|"tf"|None) or None."""
    a, b = TABLE.to_canonical(name), TF_TABLE.to_canonical(name)
    if a and b:
        return a[0], a[1], None
    if a:
        return a[0], a[1], "lazy"
    if b:
        return b[0], b[1], "tf"
    return None


def _classify(name):
    """Variable folder name -> (kind, target, transform, evidence, extra).

    kind: model | slot | step | loss_scale | good_step_counter | tf_step | None.
    For slots, extra is (slot canonical prefix, base variable name).
    For system variables, extra is the job name.
    """
    hit = _model_hit(name)
    if hit:
        return "model", hit[0], hit[1], hit[2], None
    base, _, suffix = name.rpartition("-")
    if base and suffix in SLOTS:
        prefix, evidence = SLOTS[suffix]
        bases = [base]
        if base.endswith("-kernel"):  # convert_tf_ckpt_to_of.py keeps "kernel" in slot paths
            bases.append(base[: -len("-kernel")] + "-weight")
        for b in bases:
            hit = _model_hit(b)
            if hit:
                ev = evidence if hit[2] is None or hit[2] == evidence else "conflict"
                return "slot", f"{prefix}/{hit[0]}", hit[1], ev, (prefix, b)
    for rx, kind in ((_LOSS_SCALE, "loss_scale"), (_GOOD_STEPS, "good_step_counter"), (_TRAIN_STEP, "step")):
        m = rx.match(name)
        if m:
            return kind, kind, None, "lazy", m.group("job")
    if name in _TF_STEPS:
        return "tf_step", "step", None, "tf", None
    return None, None, None, None, None


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
        if e.is_dir() and _model_hit(e.name) and os.path.isfile(os.path.join(e.path, DATA_FILE)):
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
        kind, target, transform, evidence, extra = _classify(e.name)
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
            if prefix in _SCALAR_SLOTS:
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


# --------------------------------------------------------------------------- write


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
            if slot in _SCALAR_SLOTS:
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


FORMAT = Format(NAME, "legacy lazy OneFlow snapshot (one folder per variable, out [+ meta])", detect, read, write_files,
                reference_np.Lazy, owns=(DATA_FILE, META_FILE, SNAPSHOT_DONE, CONFIG_FILE, VOCAB_FILE),
                token_classifier=True,  # bert_config.json's bert_of key
                table=TABLE, dtypes=("float32", "float16"))  # the meta record has no bfloat16 code here
