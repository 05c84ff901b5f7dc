"""The one gate every tensor passes on its way in: name, dtype, shape, and the fit to the config.

Every reader in ``converters/`` (through ``Source``), ``bert_of.checkpoint.load_checkpoint`` and
the model's ``load_canonical`` call :func:`check_tensors`, so what one route refuses no other
route accepts:

- **dtype**: weights and optimizer moments are floating point (float16/32/64, bfloat16); step
  counters are integers. A weight relabelled int32 is refused, never loaded as 1e9-sized floats.
- **shape**: a tuple of non-negative Python ints (no floats, bools, strings), at most 32 dims,
  with a sane element count; ``nbytes`` is exact Python-int arithmetic (no int64 overflow).
- **names and fit**: every model tensor has a place in a BERT of this config (a layer index below
  ``num_hidden_layers``, a known scope) and the shape the config implies; the backbone is complete.
  Optimizer state: ``step``/``loss_scale``/``good_step_counter`` or ``<slot>/<model tensor>``.

Messages are one line, naming the file and the tensor as the input spells it (``source(name)``)
with the shape as stored there (``source_shape(name, shape)``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional

import numpy as np

from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError

MAX_DIMS = 32  # NumPy's limit
MAX_ELEMENTS = 1 << 40  # ~1e12 elements: far above any BERT tensor, far below int64 overflow
INTEGER_STATE = ("step", "good_step_counter")  # counters; every other tensor is floating point
SCALAR_STATE = ("step", "loss_scale", "good_step_counter")
SLOTS = ("m", "v", "momentum")  # per-parameter state with the parameter's shape
SCALAR_SLOTS = ("beta1_t", "beta2_t")  # LAMB's beta^t accumulators: [1] per parameter


def _bf16() -> Optional[np.dtype]:
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:  # pragma: no cover - ml_dtypes ships with TF and safetensors users
        return None


def is_float(dtype) -> bool:
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt.name == "bfloat16"


def check_dtype(dtype, where: str) -> np.dtype:
    """A NumPy dtype that holds numbers (floating, integer, bool); anything else refused."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise CheckpointError(f"{where}: dtype {dtype!r} is not a numeric type") from None
    if dt.kind not in "fiub" and dt.name != "bfloat16":
        raise CheckpointError(f"{where}: dtype {dt} is not a numeric type bert_of reads")
    return dt


def check_shape(shape, where: str) -> tuple:
    """``shape`` as a tuple of non-negative Python ints; floats, bools, negatives, absurd sizes refused."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise CheckpointError(f"{where}: shape {shape!r} is not a list of dimensions")
    dims = []
    for d in shape:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise CheckpointError(f"{where}: shape {list(shape)!r} has a non-integer dimension {d!r}")
        if d < 0:
            raise CheckpointError(f"{where}: shape {list(shape)} has a negative dimension {int(d)}")
        dims.append(int(d))
    if len(dims) > MAX_DIMS:
        raise CheckpointError(f"{where}: shape has {len(dims)} dimensions (at most {MAX_DIMS})")
    if math.prod(dims) > MAX_ELEMENTS:
        raise CheckpointError(f"{where}: shape {dims} holds {math.prod(dims)} elements, more than any "
                              f"BERT tensor (or this machine) could")
    return tuple(dims)


def nbytes(shape, dtype) -> int:
    """Exact byte count (Python ints: a lying shape cannot overflow into a small number)."""
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor is, before it is read: name, dtype, shape (validated on construction)."""

    name: str
    dtype: np.dtype
    shape: tuple

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "\x00" in self.name:
            raise CheckpointError(f"tensor name {self.name!r} is not a non-empty string")
        object.__setattr__(self, "dtype", check_dtype(self.dtype, f"tensor {self.name}"))
        object.__setattr__(self, "shape", check_shape(self.shape, f"tensor {self.name}"))

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape, self.dtype)


# --------------------------------------------------------------------------- roles


def check_role(name: str, dtype, where: str, shown: Optional[str] = None) -> None:
    """Weights and moments floating point, counters integer."""
    dt = np.dtype(dtype)
    shown = shown or name
    if name in INTEGER_STATE:
        if dt.kind not in "iu":
            raise CheckpointError(f"{where}: tensor {shown} has dtype {dt}; a step counter is an integer")
    elif not is_float(dt):
        what = "BERT weights" if "/" not in name and name not in SCALAR_STATE else "optimizer state"
        raise CheckpointError(f"{where}: tensor {shown} has dtype {dt}; {what} are floating point "
                              f"(float16, float32, float64, bfloat16)")


# --------------------------------------------------------------------------- names and shapes a config implies


# The BERT scope list, written once: (canonical scope, kind, shape of its weight, group), in model
# order; ``{i}`` is an encoder layer. Every format's name table is derived from it
# (converters/mapping.py:spell), so a new head is one row here plus one spelling per format.
# kind: "embedding" (.weight), "dense" (.weight [out, in] + .bias [out]), "ln" (.LayerNorm.weight
# + .bias, [H]), "bias" (.bias). Dimensions: V vocab, P positions, T token types, H hidden,
# I intermediate, L labels.
SCOPES = (
    ("bert.embeddings.word_embeddings", "embedding", "VH", "embeddings"),
    ("bert.embeddings.token_type_embeddings", "embedding", "TH", "embeddings"),
    ("bert.embeddings.position_embeddings", "embedding", "PH", "embeddings"),
    ("bert.embeddings", "ln", "H", "embeddings"),
    ("bert.encoder.layer.{i}.attention.self.query", "dense", "HH", "layer"),
    ("bert.encoder.layer.{i}.attention.self.key", "dense", "HH", "layer"),
    ("bert.encoder.layer.{i}.attention.self.value", "dense", "HH", "layer"),
    ("bert.encoder.layer.{i}.attention.output.dense", "dense", "HH", "layer"),
    ("bert.encoder.layer.{i}.attention.output", "ln", "H", "layer"),
    ("bert.encoder.layer.{i}.intermediate.dense", "dense", "IH", "layer"),
    ("bert.encoder.layer.{i}.output.dense", "dense", "HI", "layer"),
    ("bert.encoder.layer.{i}.output", "ln", "H", "layer"),
    ("bert.pooler.dense", "dense", "HH", "pooler"),
    ("cls.predictions.transform.dense", "dense", "HH", "mlm"),
    ("cls.predictions.transform", "ln", "H", "mlm"),
    ("cls.predictions", "bias", "V", "mlm"),
    ("cls.seq_relationship", "dense", "2H", "nsp"),
    ("qa_outputs", "dense", "2H", "qa"),
    ("classifier", "dense", "LH", "classifier"),
)
# kind -> the parameters of a scope: (canonical suffix, which dims of the scope's shape)
PARAMS = {
    "embedding": ((".weight", slice(None)),),
    "dense": ((".weight", slice(None)), (".bias", slice(0, 1))),
    "ln": ((".LayerNorm.weight", slice(None)), (".LayerNorm.bias", slice(None))),
    "bias": ((".bias", slice(None)),),
}


def expected_shapes(config: BertConfig) -> dict:
    """Canonical name -> shape for BertModel and every head bert_of knows (from :data:`SCOPES`)."""
    dims = {"V": config.vocab_size, "P": config.max_position_embeddings, "T": config.type_vocab_size,
            "H": config.hidden_size, "I": config.intermediate_size, "L": config.num_labels, "2": 2}
    s = {}
    for scope, kind, shape, _ in SCOPES:
        for sc in ([scope.format(i=i) for i in range(config.num_hidden_layers)] if "{i}" in scope else [scope]):
            for suffix, part in PARAMS[kind]:
                s[sc + suffix] = tuple(dims[d] for d in shape[part])
    return s


def backbone_names(config: BertConfig) -> list:
    return [k for k in expected_shapes(config) if k.startswith("bert.")]


# A pre-LN BERT (LiBai's default) keeps original BERT's canonical names, its LayerNorms each
# shifted one place as LiBai's own HF loader shifts them; bert_of's pre-LN modules (and so their
# state dicts) name them where they sit: layer i's ``input_layer_norm`` and
# ``post_attention_layer_norm``, the encoder's ``final_layer_norm``.
_PRE_LN_IN = re.compile(r"(bert\.encoder\.layer\.)(\d+)\.input_layer_norm\.(weight|bias)")
_PRE_LN_POST = re.compile(r"(bert\.encoder\.layer\.\d+)\.post_attention_layer_norm\.(weight|bias)")
_PRE_LN_FINAL = re.compile(r"bert\.encoder\.final_layer_norm\.(weight|bias)")
_PRE_LN_EMB = re.compile(r"bert\.embeddings\.LayerNorm\.(weight|bias)")
_PRE_LN_OUT = re.compile(r"(bert\.encoder\.layer\.)(\d+)\.(attention\.output|output)\.LayerNorm\.(weight|bias)")


def pre_ln_canonical_name(name: str, num_layers: int) -> str:
    """The canonical name of a pre-LN module's parameter ``name`` (``bert.`` first): layer i's
    input LayerNorm is ``bert.embeddings.LayerNorm`` (i = 0) or layer i-1's ``output.LayerNorm``,
    its post-attention one its ``attention.output.LayerNorm``, the final one layer L-1's
    ``output.LayerNorm``. Other names are the same."""
    m = _PRE_LN_IN.fullmatch(name)
    if m:
        i = int(m.group(2))
        return (f"bert.embeddings.LayerNorm.{m.group(3)}" if i == 0
                else f"{m.group(1)}{i - 1}.output.LayerNorm.{m.group(3)}")
    m = _PRE_LN_POST.fullmatch(name)
    if m:
        return f"{m.group(1)}.attention.output.LayerNorm.{m.group(2)}"
    m = _PRE_LN_FINAL.fullmatch(name)
    if m:
        return f"bert.encoder.layer.{num_layers - 1}.output.LayerNorm.{m.group(1)}"
    return name


def pre_ln_module_name(name: str, num_layers: int) -> str:
    """The inverse of :func:`pre_ln_canonical_name`: a canonical name as a pre-LN module names it."""
    m = _PRE_LN_EMB.fullmatch(name)
    if m:
        return f"bert.encoder.layer.0.input_layer_norm.{m.group(1)}"
    m = _PRE_LN_OUT.fullmatch(name)
    if m:
        i, p = int(m.group(2)), m.group(4)
        if m.group(3) == "attention.output":
            return f"{m.group(1)}{i}.post_attention_layer_norm.{p}"
        return f"{m.group(1)}{i + 1}.input_layer_norm.{p}" if i + 1 < num_layers else f"bert.encoder.final_layer_norm.{p}"
    return name


def _no_place(name: str, shown: str, config: BertConfig, where: str) -> CheckpointError:
    m = name.split(".")
    if len(m) > 3 and m[:3] == ["bert", "encoder", "layer"] and m[3].isdigit():
        return CheckpointError(f"{where}: tensor {shown} is layer {m[3]} but the config has "
                               f"num_hidden_layers {config.num_hidden_layers}")
    return CheckpointError(f"{where}: tensor {shown} has no place in a BERT model")


def check_fit(shapes: Mapping, config: BertConfig, where: str, source: Optional[Callable[[str], str]] = None,
              source_shape: Optional[Callable] = None, require_backbone: bool = True,
              loose: Iterable[str] = ()) -> None:
    """Every tensor has a place in this config's BERT with the shape it implies; the backbone is
    complete. ``loose``: names whose shape is not checked (a head the caller does not use)."""
    try:
        config.validate()  # readers set num_labels from a tensor: still a sane config?
    except BertOfError as e:
        raise CheckpointError(f"{where}: {str(e).removeprefix('config: ')}") from None
    source = source or (lambda name: name)
    on_disk = source_shape or (lambda name, shape: tuple(shape))
    want = expected_shapes(config)
    loose = set(loose)
    for name, shape in shapes.items():
        if name not in want:
            raise _no_place(name, source(name), config, where)
        if name not in loose and tuple(shape) != tuple(want[name]):
            raise CheckpointError(
                f"{where}: tensor {source(name)} has shape {list(on_disk(name, shape))} but the config implies "
                f"{list(on_disk(name, want[name]))} (config does not fit the tensors)")
    if require_backbone:
        for name in backbone_names(config):
            if name not in shapes:
                raise CheckpointError(f"{where}: tensor {source(name)} is missing")


def check_optimizer(specs: Iterable[TensorSpec], config: BertConfig, where: str,
                    source: Optional[Callable[[str], str]] = None) -> None:
    """Optimizer state: known names, counters integer and single-valued, moments shaped like their weight."""
    source = source or (lambda name: name)
    want = expected_shapes(config)
    for s in specs:
        shown = source(s.name)
        check_role(s.name, s.dtype, where, shown)
        if s.name in SCALAR_STATE:
            if math.prod(s.shape) != 1:
                raise CheckpointError(f"{where}: tensor {shown} has shape {list(s.shape)}, expected one value")
            continue
        slot, _, param = s.name.partition("/")
        if slot not in SLOTS + SCALAR_SLOTS or param not in want:
            raise CheckpointError(f"{where}: optimizer tensor {shown} is not state bert_of knows "
                                  f"(step, loss_scale, good_step_counter or m|v|momentum|beta1_t|beta2_t/<weight>)")
        expect = (1,) if slot in SCALAR_SLOTS else want[param]
        if tuple(s.shape) != tuple(expect):
            raise CheckpointError(f"{where}: tensor {shown} has shape {list(s.shape)}, but {param} implies "
                                  f"{list(expect)}")


def check_tensors(model: Iterable[TensorSpec], config: BertConfig, where: str, optimizer: Iterable[TensorSpec] = (),
                  source: Optional[Callable[[str], str]] = None, source_shape: Optional[Callable] = None) -> None:
    """The gate: dtypes, then the fit to the config, then the optimizer state (see the module doc)."""
    model = list(model)
    shown = source or (lambda name: name)
    seen = set()
    for s in model:
        if s.name in seen:
            raise CheckpointError(f"{where}: tensor {shown(s.name)} appears twice")
        seen.add(s.name)
        check_role(s.name, s.dtype, where, shown(s.name))
    check_fit({s.name: s.shape for s in model}, config, where, source, source_shape)
    check_optimizer(optimizer, config, where, source)


def checked_producer(spec: TensorSpec, producer: Callable[[], np.ndarray], where: str) -> Callable[[], np.ndarray]:
    """``producer`` whose array must be exactly what ``spec`` announced (dtype and shape)."""

    def produce():
        arr = producer()
        if not isinstance(arr, np.ndarray) or arr.dtype != spec.dtype or tuple(arr.shape) != spec.shape:
            got = f"{arr.dtype}{list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise CheckpointError(f"{where}: tensor {spec.name} read as {got}, but its header says "
                                  f"{spec.dtype}{list(spec.shape)}")
        return arr

    produce.checked = True
    return produce
