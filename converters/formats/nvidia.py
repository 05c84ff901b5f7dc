"""NVIDIA DeepLearningExamples' PyTorch BERT (PyTorch/LanguageModeling/BERT): its checkpoints, read
as data and written as its scripts write them.

- ``run_pretraining.py`` saves ``ckpt_<step>.pt``: since a9e2c1d5 (2022-03) ``{'model', 'optimizer':
  FusedLAMBAMP state, 'grad_scaler', 'epoch'}``, before it ``{'model', 'optimizer': apex FusedLAMB
  state, 'master params': [nn.Parameter], 'files', 'epoch', 'data_loader'}``; ``run_squad.py`` saves
  ``pytorch_model.bin`` = ``{'model': state_dict}`` beside ``bert_config.json`` / ``config.json``.
  Torch zip pickles, parsed as data (:mod:`converters.containers.torch_zip` through
  :mod:`bert_of.pickles`): nothing in them is executed.
- Names are HF's BERT names except its fused bias+activation layers (``LinearActivation``):
  ``intermediate.dense_act``, ``pooler.dense_act``, ``cls.predictions.transform.dense_act``;
  ``cls.predictions.decoder.weight`` is stored and IS the word embeddings (checked equal, dropped;
  written back sharing its storage, as torch.save does).
- Vocabulary: its scripts round ``vocab_size`` up to a multiple of 8 at run time (110 -> 112, 30522 ->
  30528). A config saying the unpadded size of a padded embedding is read padded; a vocab.txt
  (beside or ``--vocab``) of fewer lines fits when the rows are its size so rounded (``vocab_pad``).
- Numerics: LayerNorm eps 1e-12 everywhere, mask ``(1 - mask) * -10000``; ``"gelu"`` was the erf
  GELU before a9e2c1d5 and the tanh form since, with the same config. The checkpoint's keys say its
  era (the same commit changed them); where nothing says (run_squad.py's output), ``--numerics hf``
  (erf) or ``tf1`` (tanh) is required, and is refused where it contradicts the keys or the config
  names its activation. The writer records the exact GELU beside the label (``bert_of_hidden_act``).
- Optimizer state of any optimizer over run_pretraining.py's two parameter groups (weights with
  decay, then biases and LayerNorm): FusedLAMB(AMP)'s or AdamW's ``exp_avg``/``exp_avg_sq`` per
  parameter index as ``m/<name>``/``v/<name>``, the step (group 0's, or AdamW's per-parameter one)
  as ``step``; schedule fields (``lr``, ``initial_lr``, hyper-parameters as tensors), ``grad_scaler``
  and amp's master copies are dropped with their reason, as is state whose groups are not those two.

A path is a ``.pt``/``.bin`` file or a folder holding ``pytorch_model.bin`` or ``ckpt_<N>.pt`` (the
largest N); the config is ``--config``, else ``config.json`` / ``bert_config.json`` beside.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from bert_of.checkpoint import copy_file
from bert_of.config import BertConfig
from bert_of.errors import CheckpointError
from bert_of.files.atomic import writes_to
from bert_of.files.reading import read_json
from bert_of.vocab import read_vocab_lines
from bert_of.converters.formats.hf import names as hf_names
from bert_of.converters.verify import reference_np
from bert_of.converters.descriptor import Format
from bert_of.converters.mapping import Table, apply, inverse, spell
from bert_of.converters.reader import WORD_EMB, Entry, Hit, finish, hit, sort, whole
from bert_of.converters.source import Options, Source
from bert_of.converters.containers.torch_zip import StateDict, Tensor, TorchZipFile, write_torch_zip

NAME = "nvidia"
WEIGHTS = "pytorch_model.bin"  # run_squad.py's
CONFIG_FILES = ("config.json", "bert_config.json")
VOCAB_FILE = "vocab.txt"
_CKPT = re.compile(r"ckpt_(\d+)\.pt")
# HF's names with LinearActivation's fused layers
_FUSED = {"intermediate.dense": "intermediate.dense_act", "bert.pooler.dense": "bert.pooler.dense_act",
          "cls.predictions.transform.dense": "cls.predictions.transform.dense_act"}
TABLE = Table(spell(lambda s: next((s.replace(a, b) for a, b in _FUSED.items() if s.endswith(a)), s), hf_names.PARAMS))
DECODER = "cls.predictions.decoder.weight"
NO_DECAY = ("bias", "gamma", "beta", "LayerNorm")  # run_pretraining.py's second parameter group
SLOTS = {"exp_avg": "m", "exp_avg_sq": "v"}
OPTIMIZER_META = {"optimizer": "lamb", "bias_correction": "true", "eps": "1e-06", "weight_decay": "0.01",
                  "exclude_from_weight_decay": ",".join(NO_DECAY),
                  "source": "NVIDIA DeepLearningExamples FusedLAMBAMP"}


def _weights(path: str, real=lambda p: p):
    """The checkpoint file of ``path`` (a file, or the folder's pytorch_model.bin / latest ckpt_N.pt)."""
    if os.path.isfile(real(path)):
        return path
    if not os.path.isdir(real(path)):
        return None
    if os.path.isfile(real(os.path.join(path, WEIGHTS))):
        return os.path.join(path, WEIGHTS)
    steps = [(int(m.group(1)), n) for n in os.listdir(real(path)) for m in [_CKPT.fullmatch(n)] if m]
    return os.path.join(path, max(steps)[1]) if steps else None


def detect(path: str) -> bool:
    """A torch zip whose pickle is a dict with a 'model' state dict (HF's bin is the state dict itself)."""
    f = _weights(path)
    if f is None or not f.endswith((".pt", ".bin", ".pth")):
        return False
    try:
        z = TorchZipFile(f, state_dict=False)
    except CheckpointError:
        return False
    try:
        return isinstance(z.obj, dict) and isinstance(z.obj.get("model"), dict)
    finally:
        z.close()


def read(path: str, opts: Options) -> Source:
    path = os.fspath(path)
    return whole(path, lambda pin: _read(pin, path, opts))


def _param_names(model_keys: list) -> list:
    """``model.named_parameters()`` order: the state dict's keys without the tied decoder."""
    return [k for k in model_keys if k != DECODER]


def _optimizer_names(obj: dict, model_keys: list) -> tuple:
    """({parameter index: state-dict name}, why not) of an optimizer over run_pretraining.py's two
    parameter groups (weights with decay, then biases and LayerNorm), whatever the optimizer (its
    FusedLAMB / FusedLAMBAMP, or AdamW put in its place): the indices name the parameters only
    through that grouping, so other groupings are reported, not guessed."""
    groups = (obj.get("optimizer") or {}).get("param_groups") if isinstance(obj.get("optimizer"), dict) else None
    if not groups:
        return {}, ""
    names = _param_names(model_keys)
    split = [[n for n in names if not any(x in n for x in NO_DECAY)], [n for n in names if any(x in n for x in NO_DECAY)]]
    out = {}
    for g, group in enumerate(groups):
        ids = group.get("params") if isinstance(group, dict) else None
        if g >= 2 or not isinstance(ids, list) or len(ids) != len(split[g]) or \
                not all(type(i) is int for i in ids):
            return {}, ("its parameter groups are not run_pretraining.py's (weights with decay, then biases "
                        "and LayerNorm), so its indices name no parameter")
        out.update(zip(ids, split[g]))
    return out, ""


def _optimizer_kind(group) -> str:
    """The optimizer a parameter group's fields say: torch's Adam/AdamW keep ``amsgrad``; apex's and
    NVIDIA's LAMBs keep ``grad_averaging`` and ``max_grad_norm``."""
    if not isinstance(group, dict):
        return "lamb"
    if "amsgrad" in group:
        return "adamw" if group.get("decoupled_weight_decay", True) else "adam"
    return "lamb"


# run_pretraining.py's source at a9e2c1d5 (2022-03-02) changed both what ckpt_N.pt holds and the
# GELU of modeling.py (erf -> tanh): the keys of a run's checkpoint say which era wrote it
_OLD_KEYS = ("master params", "files")  # before a9e2c1d5: apex amp's masters, the shard list
_NEW_KEYS = ("grad_scaler",)  # a9e2c1d5 and later: torch.cuda.amp.GradScaler's state
NUMERICS_FLAG = {"hf": "gelu_erf", "tf1": "gelu_tanh"}  # what --numerics may say of an NVIDIA checkpoint
ERAS = "erf GELU before a9e2c1d5 (2022-03), tanh since"


def _numerics(obj: dict, raw_cfg: dict, cfg_path: str, where: str, flag) -> tuple:
    """(activation, where it was read from) of NVIDIA's modeling.py for this checkpoint: activation
    None when the config names it (read as Google's config reads), "" (with why) when nothing says
    which GELU made it. A recorded activation (``relu``, or the exact one
    bert_of wrote as ``bert_of_hidden_act``) is never overridden by ``--numerics``; the checkpoint's
    era (its keys) is evidence ``--numerics`` may not contradict."""
    label, exact = raw_cfg.get("hidden_act", "gelu"), raw_cfg.get("bert_of_hidden_act")
    if exact is not None or not (isinstance(label, str) and label.lower() == "gelu"):
        if flag:
            shown = exact if exact is not None else label
            raise CheckpointError(f"--numerics {flag}: {cfg_path} records hidden_act {shown!r}, which NVIDIA's "
                                  f"modeling.py computes one way only (nothing to choose)")
        return None, ""  # Google's reading of the config (from_google_dict)
    if flag is not None and flag not in NUMERICS_FLAG:
        raise CheckpointError(f"--numerics {flag}: NVIDIA's modeling.py never computed it (LayerNorm eps 1e-12 "
                              f"always; --numerics hf: erf GELU, tf1: tanh GELU)")
    era = None
    if any(k in obj for k in _OLD_KEYS):
        era = ("gelu_erf", f"{where}: keys {', '.join(repr(k) for k in _OLD_KEYS if k in obj)}: "
                           f"run_pretraining.py before a9e2c1d5 (2022-03), whose modeling.py computes the erf GELU")
    elif any(k in obj for k in _NEW_KEYS):
        era = ("gelu_tanh", f"{where}: key 'grad_scaler': run_pretraining.py since a9e2c1d5 (2022-03), whose "
                            f"modeling.py computes the tanh GELU")
    if flag is not None:
        if era and era[0] != NUMERICS_FLAG[flag]:
            raise CheckpointError(f"--numerics {flag} contradicts the checkpoint ({era[1]})")
        return NUMERICS_FLAG[flag], era[1] if era else f"--numerics {flag}"
    if era:
        return era
    return "", (f"{where}: hidden_act \"gelu\" and nothing else says which GELU NVIDIA's modeling.py computed "
                f"({ERAS}): pass --numerics hf (erf) or --numerics tf1 (tanh)")


def _fit_vocab(config: BertConfig, rows, vocab: str, lines, cfg_path: str) -> str:
    """NVIDIA's rule (run_pretraining.py, run_squad.py): ``vocab_size`` rounded up to a multiple of 8
    at run time. A config saying the unpadded size of a padded embedding is that rule; a vocabulary
    (beside or ``--vocab``) of fewer lines than rows fits when the rows are its size so rounded.
    Returns the note for the report."""
    notes = []
    if rows is not None and rows != config.vocab_size and rows == -(-config.vocab_size // 8) * 8:
        notes.append(f"{cfg_path} says vocab_size {config.vocab_size}, run time pads it to {rows} "
                     f"(a multiple of 8, as NVIDIA's scripts do)")
        config.vocab_size = rows
    if lines is not None and lines != config.vocab_size:
        if lines > config.vocab_size or -(-lines // 8) * 8 != config.vocab_size:
            raise CheckpointError(f"{vocab} has {lines} tokens but the model's vocab_size is {config.vocab_size} "
                                  f"(NVIDIA pads {lines} to {-(-lines // 8) * 8}): not this model's vocabulary")
        notes.append(f"{config.vocab_size} rows, {os.path.basename(vocab)} has {lines}: "
                     f"{config.vocab_size - lines} padding rows kept (NVIDIA pads the vocabulary to a multiple of 8)")
    return "; ".join(notes)


def _read(pin, path: str, opts: Options) -> Source:
    f = _weights(path, pin.real)
    if f is None:
        raise CheckpointError(f"{path}: no {WEIGHTS} or ckpt_<N>.pt")
    z = TorchZipFile(pin.real(f), state_dict=False)
    obj = z.obj
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise CheckpointError(f"{f}: not an NVIDIA BERT checkpoint (no 'model' state dict)")
    d = os.path.dirname(f)
    cfg_path = opts.config or next((os.path.join(d, n) for n in CONFIG_FILES
                                    if os.path.isfile(pin.real(os.path.join(d, n)))), None)
    if cfg_path is None or not os.path.isfile(pin.real(cfg_path)):
        raise CheckpointError(f"{cfg_path or os.path.join(d, CONFIG_FILES[0])}: config file not found (pass --config)")
    raw_cfg = read_json(pin.real(cfg_path), "config")
    config = BertConfig.from_google_dict(raw_cfg, cfg_path)
    act, numerics_from = _numerics(obj, raw_cfg, cfg_path, f, opts.numerics)
    if act:
        config.hidden_act = act
        config.provenance = "hf" if act == "gelu_erf" else "tf1"  # erf / tanh GELU, eps 1e-12
    vocab = opts.vocab or (os.path.join(d, VOCAB_FILE) if os.path.isfile(pin.real(os.path.join(d, VOCAB_FILE)))
                           else None)
    if vocab and not os.path.isfile(pin.real(vocab)):
        raise CheckpointError(f"{vocab}: vocab file not found")
    model_keys = [k for k in obj["model"]]
    opt_names, opt_problem = _optimizer_names(obj, model_keys)
    groups = obj["optimizer"].get("param_groups") if isinstance(obj.get("optimizer"), dict) else None
    kind = _optimizer_kind(groups[0] if groups else None)
    first = {}  # AdamW's per-parameter step: the first one read is the step, the others equal copies

    def entry(key):  # a model tensor by its state-dict name (what verify's reference reads), others by path
        t = z.tensors[key]
        name = key[len("model/"):] if key.startswith("model/") and key.count("/") == 1 else key
        if key.endswith("/step") and t.dtype.kind in "iuf" and int(np.prod(t.shape)) == 1:
            # FusedLAMBAMP's int32 [1], AdamW's float32 []: the canonical int64 [1] step
            return Entry(name, (1,), np.dtype("<i8"), (lambda k=key: np.asarray(z.get(k)).reshape(1).astype(np.int64)))
        return Entry(name, tuple(t.shape), t.dtype, (lambda k=key: z.get(k)),
                     origin=(t.storage.key, t.offset, t.shape, t.stride))

    def classify(e):
        parts = e.name.split("/")
        if len(parts) == 1:  # the model's state dict
            if e.name == DECODER:
                return Hit(WORD_EMB, kind="tied", note="the MLM decoder's weight IS the word embeddings, equal")
            return hit(TABLE, e.name)
        if parts[0] == "optimizer" and len(parts) == 4 and parts[1] == "state":
            if parts[3] == "step":  # AdamW's per-parameter count (LAMB keeps it per group)
                if "step" in first or (groups and isinstance(groups[0], dict) and "step" in groups[0]):
                    return Hit(kind="buffer", note=f"{kind}'s per-parameter step (the same count; one step kept)")
                first["step"] = e.name
                return Hit("step", "scalar", optimizer=True)
            if parts[3] not in SLOTS:
                return Hit(kind="buffer", note=f"{kind} state {parts[3]!r} bert_of's optimizers do not keep")
            name = opt_names.get(int(parts[2])) if parts[2].isdigit() else None
            found = hit(TABLE, name, optimizer=True) if name else None
            if found is None:
                return Hit(kind="buffer", note=f"optimizer state not converted: {opt_problem or 'no such parameter'}")
            found.target = f"{SLOTS[parts[3]]}/{found.target}"
            return found
        if parts[0] == "optimizer" and len(parts) == 4 and parts[1] == "param_groups":
            if parts[3] == "step":
                return Hit("step", "scalar", optimizer=True) if parts[2] == "0" else \
                    Hit(kind="buffer", note="the step of another parameter group (one step: group 0's)")
            # lr the schedule set, initial_lr the LR scheduler records, hyper-parameters as tensors
            return Hit(kind="buffer", note=f"parameter group {parts[2]}'s {parts[3]} (schedule / hyper-parameter, "
                                           f"not state)")
        if parts[0] == "master params" and len(parts) == 2:  # older run_pretraining.py (apex amp)
            return Hit(kind="buffer", note="apex amp's fp32 master copy of a parameter (the model's own is read)")
        if parts[0] == "grad_scaler":
            return Hit(kind="buffer", note="torch.cuda.amp.GradScaler's loss-scale state (not model state)")
        return None

    entries = [entry(k) for k in z.tensors]
    g0 = groups[0] if groups and isinstance(groups[0], dict) else {}
    if type(g0.get("step")) is int and 0 <= g0["step"] < 2 ** 63:  # apex FusedLAMB counts in a Python int
        entries.append(Entry("optimizer/param_groups/0/step", (1,), np.dtype("<i8"),
                             (lambda n=g0["step"]: np.array([n], np.int64))))
    where = f
    found = sort(entries, classify, opts, where, table=TABLE)
    words = next((e for e, h in found.model if h.target == WORD_EMB), None)
    lines = len(read_vocab_lines(pin.real(vocab))) if vocab else None
    note = _fit_vocab(config, words.shape[0] if words is not None else None, vocab, lines, cfg_path)
    if note:
        for r in found.report:
            if r.target == WORD_EMB:
                r.note = note
    if act and numerics_from:
        first_line = next((r for r in found.report if r.action == "mapped"), None)
        if first_line is not None:
            extra = f"numerics {act} from {numerics_from}"
            first_line.note = f"{first_line.note}; {extra}" if first_line.note else extra
    vocab = vocab and pin.hold(vocab)
    meta = dict(OPTIMIZER_META)
    if kind != "lamb":
        meta = {"optimizer": kind, "exclude_from_weight_decay": ",".join(NO_DECAY),
                "source": f"NVIDIA DeepLearningExamples run_pretraining.py with torch.optim "
                          f"{'AdamW' if kind == 'adamw' else 'Adam'}"}
    if groups and isinstance(groups[0], dict):
        g = groups[0]
        meta.update({k: str(g[k]).lower() if isinstance(g[k], bool) else repr(g[k]) for k in
                     ("bias_correction", "eps", "weight_decay") if isinstance(g.get(k), (bool, float))})
    source = finish(where, NAME, config, vocab, found, opts, TABLE, optimizer_meta=meta, config_file=cfg_path)
    source.vocab_pad = 8
    if act:
        source.native_numerics = "hf" if act == "gelu_erf" else "tf1"
        source.numerics_from = numerics_from
    elif act == "":
        source.numerics_unknown = numerics_from
    return source


def write_files(source: Source, d: str, opts: Options) -> list:
    """``pytorch_model.bin`` ({'model': state_dict}, as run_squad.py saves) or, with
    ``--with-optimizer`` and optimizer state, ``ckpt_<step>.pt`` (as run_pretraining.py saves), with
    config.json (Google's keys, as NVIDIA's configs) and vocab.txt."""
    notes = []
    sd, storage = StateDict(), {}
    for spec, prod in source.tensors:
        found = TABLE.from_canonical(spec.name)
        if found is None:
            raise CheckpointError(f"{source.path}: tensor {spec.name} has no NVIDIA name")
        key = str(len(storage))
        storage[spec.name] = key
        sd[found[0]] = Tensor(key, np.dtype(spec.dtype), tuple(spec.shape),
                              (lambda p=prod, t=found[1]: apply(inverse(t), p())))
    if "cls.predictions.bias" in storage and WORD_EMB in storage:  # its decoder IS the word embeddings:
        sd[DECODER] = sd[TABLE.from_canonical(WORD_EMB)[0]]  # one storage under two keys, as torch.save
    obj, name = {"model": sd}, WEIGHTS
    if opts.with_optimizer and source.optimizer:
        step = {s.name: p for s, p in source.optimizer}.get("step")
        obj, name = _with_optimizer(source, sd, storage), f"ckpt_{int(np.asarray(step())) if step else 0}.pt"
    write_torch_zip(os.path.join(d, name), obj)
    cfg = os.path.join(d, CONFIG_FILES[0])
    google = source.config.to_google_dict()
    # NVIDIA's "gelu" was erf, then tanh (a9e2c1d5): the exact one is recorded beside, always
    if google["hidden_act"] == "gelu":
        google.setdefault("bert_of_hidden_act", source.config.hidden_act)
    with writes_to(cfg), open(cfg, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(google, indent=2) + "\n")
    if source.vocab_file:
        copy_file(source.vocab_file, os.path.join(d, VOCAB_FILE))
    reason = source.config.google_mismatch()
    if reason:
        notes.append(f"note: NVIDIA's modeling.py would compute differently: {reason}; config.json records "
                     f"the exact numerics (bert_of_hidden_act / layer_norm_eps)")
    return notes


def _with_optimizer(source: Source, sd: StateDict, storage: dict) -> dict:
    """run_pretraining.py's checkpoint: FusedLAMBAMP's state by parameter index over its two groups."""
    opt = {s.name: (s, p) for s, p in source.optimizer}
    names = _param_names(list(sd))
    groups = [[n for n in names if not any(x in n for x in NO_DECAY)], [n for n in names if any(x in n for x in NO_DECAY)]]
    state, ids, i = {}, [[], []], 0
    for g, members in enumerate(groups):
        for n in members:
            canonical = TABLE.to_canonical(n)[0]
            slots = {}
            for slot, prefix in SLOTS.items():
                if f"{prefix}/{canonical}" not in opt:
                    raise CheckpointError(f"{source.path}: no {prefix}/{canonical} for NVIDIA's LAMB state "
                                          f"(its state covers every parameter)")
                s, p = opt[f"{prefix}/{canonical}"]
                slots[slot] = Tensor(f"{prefix}-{storage[canonical]}", np.dtype(s.dtype), tuple(s.shape), p)
            state[i] = slots
            ids[g].append(i)
            i += 1
    step = opt.get("step")
    meta = source.optimizer_meta
    group = {"bias_correction": meta.get("bias_correction", "true") != "false", "betas": (0.9, 0.999),
             "eps": float(meta.get("eps", "1e-06")), "grad_averaging": True, "max_grad_norm": 1.0}
    if step is not None:
        group["step"] = Tensor("step", np.dtype("<i4"), (1,), lambda: np.asarray(step[1](), np.int32).reshape(1))
    param_groups = [{**group, "weight_decay": 0.01, "params": ids[0]}, {**group, "weight_decay": 0.0, "params": ids[1]}]
    return {"model": sd, "optimizer": {"state": state, "param_groups": param_groups}, "epoch": 0}


class Reference(reference_np.HuggingFace):
    """verify's reference in this format's layout, written from NVIDIA's modeling.py (not from TABLE):
    HF's names and nn.Linear layout, but
    its fused ``LinearActivation`` layers are ``dense_act``; ``"gelu"`` is
    ``F.gelu(approximate=True)`` (tanh), LayerNorm eps 1e-12 (hard-coded), mask ``(1 - m) * -10000``."""
    name = "nvidia"
    mask_value = -10000.0
    _L = "bert.encoder.layer.{i}."
    NAMES = {**reference_np.HuggingFace.NAMES, **reference_np.roles({}, None, {}, {}, {
        "in": [(_L + "intermediate.dense_act.weight", _L + "intermediate.dense_act.bias", "out_in")],
        "pool": [("bert.pooler.dense_act.weight", "bert.pooler.dense_act.bias", "out_in")],
        "mlm": [("cls.predictions.transform.dense_act.weight", "cls.predictions.transform.dense_act.bias",
                 "out_in")]})}

    @classmethod
    def numerics(cls, config, provenance=None):
        """Its ACT2FN labels; the exact activation and epsilon bert_of records beside them are
        honoured, as for Google's bert_config.json."""
        label = config.get("hidden_act")
        act = config.get("bert_of_hidden_act") or \
            {"tanh": "tanh", "relu": "relu", "swish": "silu"}.get(label)
        if act is None and isinstance(label, str) and label.lower() == "gelu":
            # which GELU is the checkpoint's era (or --numerics), as the reader found it (never assumed)
            act = {"hf": "gelu_erf", "tf1": "gelu_tanh"}.get(provenance)
            if act is None:
                raise ValueError(f"hidden_act \"gelu\": which GELU NVIDIA's modeling.py computed is not known "
                                 f"({ERAS}); pass --numerics hf or tf1")
        return act, 1e-12 if config.get("layer_norm_eps") is None else float(config["layer_norm_eps"])

    def token_classifier(self):
        return False


FORMAT = Format(
    NAME, "NVIDIA DeepLearningExamples PyTorch BERT (ckpt_N.pt or pytorch_model.bin + config.json)", detect, read,
    write_files, Reference, owns=(WEIGHTS, *CONFIG_FILES, VOCAB_FILE), owns_patterns=(r"ckpt_\d+\.pt",),
    table=TABLE, numerics_flag=tuple(NUMERICS_FLAG),
    numerics_recorded=f"NVIDIA's modeling.py computes LayerNorm eps 1e-12 always, its \"gelu\" the {ERAS}")
