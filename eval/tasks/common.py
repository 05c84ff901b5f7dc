"""What the SQuAD and GLUE tasks share: runtime, models and tokenizers, the training loop,
prediction batches, publishing the fine-tuned checkpoint, records."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from bert_of._flow import flow
from bert_of.checkpoint import write_checkpoint_files
from bert_of.errors import BertOfError, CheckpointError, ConfigError
from bert_of.fs import bert_of_home, publishing, utc_now
from bert_of.version import __version__
from bert_of.eval.errors import EvalDataError

TRAIN_ARGS = "train_args.json"

SQUAD_PREDICT_DEFAULTS = dict(n_best_size=20, max_answer_length=30, null_score_diff_threshold=0.0,
                              predict_batch_size=32)

COMMON_DEFAULTS = dict(weight_decay=0.01, clip_grad_norm=1.0, adam_eps=1e-6, seed=42, mode="graph",
                       grad_accum_steps=1, log_every=50)


# --------------------------------------------------------------------------- runtime


@dataclass
class Runtime:
    """Where tensors live: one process (local tensors on ``device``) or several ranks (global
    tensors on ``placement``: parameters broadcast, batches split(0))."""

    device: str
    world: int
    rank: int
    placement: object = None

    @classmethod
    def create(cls, device: str | None = None) -> "Runtime":
        world, rank = flow.env.get_world_size(), flow.env.get_rank()
        if device in (None, "auto"):
            device = "cuda" if flow.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise ConfigError(f"--device {device!r}: expected cpu, cuda or auto")
        if device == "cuda" and not flow.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available to OneFlow")
        placement = flow.placement(device, ranks=list(range(world))) if world > 1 else None
        return cls(device, world, rank, placement)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _local_device(self):
        if self.device == "cuda":
            return flow.device("cuda", flow.env.get_local_rank() if self.world > 1 else 0)
        return flow.device("cpu")

    def place(self, model):
        if self.placement is not None:
            model.to_global(placement=self.placement, sbp=flow.sbp.broadcast)
        elif self.device != "cpu":
            model.to(self._local_device())
        return model

    def tensor(self, arr: np.ndarray):
        """A global batch (numpy rows) as this run's input tensor (this rank's rows when global)."""
        dtype = flow.float32 if arr.dtype.kind == "f" else flow.int64
        if self.placement is None:
            return flow.tensor(np.ascontiguousarray(arr), dtype=dtype, device=self._local_device())
        n = len(arr)
        mine = arr[self.rank * n // self.world:(self.rank + 1) * n // self.world]
        t = flow.tensor(np.ascontiguousarray(mine), dtype=dtype, device=self._local_device())
        return t.to_global(placement=self.placement, sbp=flow.sbp.split(0))

    @staticmethod
    def numpy(t) -> np.ndarray:
        if t.is_global:
            t = t.to_global(sbp=flow.sbp.broadcast).to_local()
        return t.numpy()


def note(rt: Runtime | None, msg: str) -> None:
    if rt is None or rt.is_main:
        print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- models and tokenizers


def resolve_model(name_or_dir: str) -> tuple:
    """(bert_of checkpoint folder, display name, temporary folder or None) for a folder or a zoo name.

    A zoo name resolves to its cached bert_of folder (downloaded and converted on first use). A
    folder in another format (Google's TF release, HF, lazy, h5) is converted into a temporary
    folder, which the caller removes when done.
    """
    from bert_of.checkpoint import is_checkpoint_dir

    if not name_or_dir:
        raise ConfigError("--model: expected a checkpoint folder or a zoo name")
    if os.path.isdir(name_or_dir):
        path = os.path.abspath(name_or_dir)
        name = os.path.basename(path.rstrip(os.sep))
    elif os.path.exists(name_or_dir) or os.path.exists(name_or_dir + ".index"):
        path, name = os.path.abspath(name_or_dir), os.path.basename(name_or_dir)
    else:
        from bert_of import zoo
        z = zoo.Zoo()
        entry = z.registry.lookup(name_or_dir)
        if entry is None:
            raise ConfigError(f"--model {name_or_dir}: no such checkpoint folder, and not a zoo name "
                              "(`bert-of zoo list` shows the names)")
        return z.resolve(entry["name"]), entry["name"], None
    from bert_of.converters.convert import convert, detect

    fmt = detect(path)
    if fmt == "of" and is_checkpoint_dir(path):
        return path, name, None
    import tempfile

    tmp = tempfile.mkdtemp(prefix="bert-of-finetune-")
    out = os.path.join(tmp, "of")
    print(f"bert-of: {path}: a {fmt} checkpoint; converting it to bert_of ({fmt}2of) in {out}", file=sys.stderr)
    convert(f"{fmt}2of", path, out)
    return out, name, tmp


def _new_head_init(model, missing: list, seed: int) -> None:
    """Google's init for task heads that were not in the checkpoint: truncated normal
    (2 std, std = initializer_range) weights, zero biases."""
    if not missing:
        return
    from bert_of.modeling import truncated_normal

    rng = np.random.default_rng(seed)
    std = model.config.initializer_range
    own = dict(model.state_dict())
    with flow.no_grad():
        for name in sorted(missing):
            param = own[name]
            shape = tuple(param.shape)
            if name.endswith("bias"):
                value = np.zeros(shape, np.float32)
            else:
                value = truncated_normal(rng, shape, std)
            param.copy_(flow.tensor(value, dtype=param.dtype, device=param.device))


def _checkpoint_head_labels(path: str):
    """Number of classes of a checkpoint's classifier head (from the safetensors header), or None."""
    from bert_of.checkpoint import WEIGHTS_NAME, SafetensorsFile

    with SafetensorsFile(os.path.join(path, WEIGHTS_NAME)) as f:
        if "classifier.weight" in f.entries:
            return int(f.shape("classifier.weight")[0])
    return None


def load_model(cls, path: str, seed: int = 0, **overrides):
    """``cls.from_pretrained(path)`` with Google's init for newly created heads.

    Returns (model, newly initialised tensor names)."""
    model = cls.from_pretrained(path, **overrides)
    missing = list(model.loading_info["missing"])
    _new_head_init(model, missing, seed)
    return model, missing


def read_train_args(path: str) -> dict:
    p = os.path.join(path, TRAIN_ARGS)
    if not os.path.isfile(p):
        return {}
    try:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{p}: unreadable ({e})") from None
    return d if isinstance(d, dict) else {}


def vocab_looks_cased(vocab) -> bool:
    """A cased vocabulary (Google's cased models) holds capitalised whole words."""
    caps = sum(1 for t in vocab if t[:1].isupper() and not t.startswith("["))
    return caps >= max(10, len(vocab) // 50)


def make_tokenizer(path: str, do_lower_case: bool | None, vocab_file: str | None = None, rt: Runtime | None = None):
    from bert_of.tokenization import FullTokenizer

    vocab_file = vocab_file or os.path.join(path, "vocab.txt")
    if not os.path.isfile(vocab_file):
        raise CheckpointError(f"{path}: no vocab.txt in the checkpoint (pass --vocab FILE)")
    lower = True if do_lower_case is None else bool(do_lower_case)
    tok = FullTokenizer(vocab_file, do_lower_case=lower)
    cased = vocab_looks_cased(tok.vocab)
    if cased and lower:
        note(rt, f"warning: {vocab_file} looks like a CASED vocabulary but the text is lower-cased "
                 "(pass --no-lower-case for cased models)")
    elif not cased and not lower:
        note(rt, f"warning: {vocab_file} looks like an uncased vocabulary but --no-lower-case keeps capitals "
                 "(most words will become [UNK])")
    return tok


def _check_seq_len(model_config, max_seq_length: int, path: str) -> None:
    if max_seq_length > model_config.max_position_embeddings:
        raise ConfigError(f"--max-seq-length {max_seq_length} exceeds the model's max_position_embeddings "
                          f"{model_config.max_position_embeddings} ({path})")
    if max_seq_length < 8:
        raise ConfigError(f"--max-seq-length {max_seq_length}: too short")


# --------------------------------------------------------------------------- training


class _TrainGraph(flow.nn.Graph):
    def __init__(self, loss_module, opt, sched, accum: int, amp: bool):
        super().__init__()
        self.loss_module = loss_module
        self.add_optimizer(opt, lr_sch=sched)
        if accum > 1:
            self.config.set_gradient_accumulation_steps(accum)
        if amp:
            self.config.enable_amp(True)
            self.set_grad_scaler(flow.amp.GradScaler(init_scale=2.0 ** 30, growth_factor=2.0, backoff_factor=0.5,
                                                     growth_interval=2000))

    def build(self, *batch):
        loss = self.loss_module(*batch)
        loss.backward()
        return loss


class _PredictGraph(flow.nn.Graph):
    def __init__(self, model, outputs: tuple):
        super().__init__()
        self.model, self.outputs = model, outputs

    def build(self, input_ids, segment_ids, input_mask):
        out = self.model(input_ids, segment_ids, input_mask)
        return tuple(getattr(out, k) for k in self.outputs)


@dataclass
class Hyper:
    """Fine-tuning hyper-parameters, as recorded in train_args.json."""

    lr: float
    batch_size: int
    epochs: float
    warmup_proportion: float
    weight_decay: float
    clip_grad_norm: float | None
    adam_eps: float
    seed: int
    mode: str
    grad_accum_steps: int
    amp: bool
    max_steps: int | None = None
    steps: int = 0
    warmup_steps: int = 0


def _hyper(opts, defaults: dict, epochs_default: float) -> Hyper:
    def pick(name, default):
        v = getattr(opts, name, None)
        return default if v is None else v

    h = Hyper(lr=float(pick("lr", defaults["lr"])), batch_size=int(pick("batch_size", defaults["batch_size"])),
              epochs=float(pick("epochs", epochs_default)),
              warmup_proportion=float(pick("warmup_proportion", defaults["warmup_proportion"])),
              weight_decay=float(pick("weight_decay", COMMON_DEFAULTS["weight_decay"])),
              clip_grad_norm=pick("clip_grad_norm", COMMON_DEFAULTS["clip_grad_norm"]),
              adam_eps=float(pick("adam_eps", COMMON_DEFAULTS["adam_eps"])),
              seed=int(pick("seed", COMMON_DEFAULTS["seed"])), mode=pick("mode", COMMON_DEFAULTS["mode"]),
              grad_accum_steps=int(pick("grad_accum_steps", COMMON_DEFAULTS["grad_accum_steps"])),
              amp=bool(getattr(opts, "amp", False)), max_steps=getattr(opts, "max_steps", None))
    if h.clip_grad_norm is not None and h.clip_grad_norm <= 0:
        h.clip_grad_norm = None
    if h.mode not in ("graph", "eager"):
        raise ConfigError(f"--mode {h.mode!r}: expected graph or eager")
    if h.lr <= 0 or h.batch_size < 1 or h.epochs <= 0 or not 0 <= h.warmup_proportion < 1 or h.grad_accum_steps < 1:
        raise ConfigError("need --lr > 0, --batch-size >= 1, --epochs > 0, 0 <= --warmup-proportion < 1, "
                          "--grad-accum-steps >= 1")
    if h.amp and h.mode != "graph":
        raise ConfigError("--amp needs --mode graph")
    return h


def google_schedule(opt, total_steps: int, warmup_steps: int):
    """google-research/bert's optimization.py schedule (linear warmup, linear decay to 0)."""
    from bert_of.training import TrainConfig, build_scheduler

    return build_scheduler(opt, TrainConfig(total_steps=total_steps, warmup_steps=warmup_steps, end_lr=0.0,
                                            power=1.0))


class FinetuneTrainer:
    """One optimizer step per call over a global batch (numpy arrays in the loss module's
    argument order), eager or graph, local or global; returns the loss tensor (not synced)."""

    def __init__(self, loss_module, model, h: Hyper, rt: Runtime):
        from bert_of.training import TrainConfig, build_optimizer

        self.h, self.rt, self.model, self.loss_module = h, rt, model, loss_module
        per_rank = h.batch_size // rt.world
        if h.batch_size % rt.world or per_rank % h.grad_accum_steps:
            raise ConfigError(f"--batch-size {h.batch_size} must split evenly over {rt.world} rank(s) and "
                              f"{h.grad_accum_steps} accumulation step(s)")
        self.cfg = TrainConfig(mode=h.mode, optimizer="adamw", lr=h.lr, warmup_steps=h.warmup_steps,
                               total_steps=h.steps, end_lr=0.0, power=1.0, weight_decay=h.weight_decay,
                               eps=h.adam_eps, bias_correction=False, clip_grad_norm=h.clip_grad_norm,
                               grad_accum_steps=h.grad_accum_steps, amp=h.amp, seed=h.seed)
        model.train()
        # One seeded generator for every dropout (an nn.Dropout otherwise draws from its own): runs repeat;
        # ranks draw different masks, as data-parallel replicas should.
        self.generator = flow.Generator()
        self.generator.manual_seed(h.seed * 1000 + rt.rank)
        for m in model.modules():
            if isinstance(m, flow.nn.Dropout):
                m.generator = self.generator
        self.opt = build_optimizer(model, self.cfg, for_graph=h.mode == "graph")
        self.sched = google_schedule(self.opt, h.steps, h.warmup_steps)
        self.graph = _TrainGraph(loss_module, self.opt, self.sched, h.grad_accum_steps, h.amp) \
            if h.mode == "graph" else None

    def lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    def step(self, batch: list):
        if self.graph is not None:
            loss = self.graph(*[self.rt.tensor(a) for a in batch])
            self.sched.step()  # the graph keeps its own schedule; this copy reports the rate
            return loss
        from bert_of.training import clip_by_global_norm

        k = self.h.grad_accum_steps
        n = len(batch[0])
        total = None
        for i in range(k):
            micro = [self.rt.tensor(a[i * n // k:(i + 1) * n // k]) for a in batch]
            loss = self.loss_module(*micro)
            (loss / k).backward()
            total = loss.detach() / k if total is None else total + loss.detach() / k
        if self.h.clip_grad_norm:
            clip_by_global_norm([p for p in self.model.parameters() if p.grad is not None],
                                float(self.h.clip_grad_norm))
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        return total


def train_loop(loss_module, model, arrays: list, n_examples: int, h: Hyper, rt: Runtime, log_every: int,
               what: str) -> dict:
    """Google's schedule over ``arrays`` (features, one array per loss input); returns a summary."""
    n = len(arrays[0])
    if n == 0:
        raise EvalDataError(f"{what}: no training features")
    h.steps = int(h.max_steps) if h.max_steps else int(n_examples / h.batch_size * h.epochs)
    if h.steps < 1:
        raise ConfigError(f"{what}: {n_examples} examples / batch {h.batch_size} * {h.epochs:g} epochs is less "
                          "than one step (lower --batch-size or set --max-steps)")
    h.warmup_steps = int(h.steps * h.warmup_proportion)
    flow.manual_seed(h.seed)
    trainer = FinetuneTrainer(loss_module, model, h, rt)
    note(rt, f"{what}: {n_examples} examples, {n} features; {h.steps} steps (warmup {h.warmup_steps}) of batch "
             f"{h.batch_size} over {rt.world} rank(s) on {rt.device}, lr {h.lr:g}, {h.mode} mode")
    rng = np.random.default_rng(h.seed)
    order = np.empty(0, dtype=np.int64)
    pending, losses = [], []
    t0 = time.perf_counter()
    last_t, last_step = t0, 0
    for step in range(1, h.steps + 1):
        while len(order) < h.batch_size:  # epochs follow each other without a gap (run_squad's repeat())
            order = np.concatenate([order, rng.permutation(n)])
        idx, order = order[:h.batch_size], order[h.batch_size:]
        lr = trainer.lr()
        pending.append(trainer.step([a[idx] for a in arrays]))
        if step % log_every == 0 or step == h.steps:
            vals = [float(Runtime.numpy(t).astype(np.float64).mean()) for t in pending]
            if not all(math.isfinite(v) for v in vals):
                raise BertOfError(f"{what}: the loss is not finite at step {step} (lower --lr?)")
            losses += vals
            now = time.perf_counter()
            rate = (step - last_step) * h.batch_size / max(now - last_t, 1e-9)
            eta = (h.steps - step) * (now - t0) / step
            note(rt, f"step {step}/{h.steps}  loss {sum(vals) / len(vals):.4f}  lr {lr:.3g}  "
                     f"{rate:.1f} examples/s  eta {eta:.0f} s")
            pending, last_t, last_step = [], now, step
    model.eval()
    return {"steps": h.steps, "warmup_steps": h.warmup_steps, "first_loss": losses[0], "final_loss": losses[-1],
            "train_seconds": round(time.perf_counter() - t0, 3)}


def infer(model, inputs: list, outputs: tuple, batch_size: int, mode: str, rt: Runtime) -> list:
    """Run ``model`` (eval mode) over rows of ``inputs`` (input_ids, segment_ids, input_mask) in
    fixed-size batches (the last one padded); returns one float32 array per output name."""
    model.eval()
    n = len(inputs[0])
    batch_size = max(1, min(batch_size, n))
    batch_size = -(-batch_size // rt.world) * rt.world
    graph = _PredictGraph(model, outputs) if mode == "graph" else None
    results = [[] for _ in outputs]
    with flow.no_grad():
        for lo in range(0, n, batch_size):
            rows = [a[lo:lo + batch_size] for a in inputs]
            real = len(rows[0])
            if real < batch_size:  # static shapes: pad with copies of the first row, drop their outputs
                rows = [np.concatenate([r, np.repeat(r[:1], batch_size - real, axis=0)]) for r in rows]
            tensors = [rt.tensor(r) for r in rows]
            if graph is not None:
                vals = graph(*tensors)
            else:
                out = model(*tensors)
                vals = tuple(getattr(out, k) for k in outputs)
            for acc, v in zip(results, vals):
                acc.append(Runtime.numpy(v)[:real].astype(np.float32))
    return [np.concatenate(r, axis=0) for r in results]


# --------------------------------------------------------------------------- saving and records


def save_finetuned(model, output: str, train_args: dict, overwrite: bool, rt: Runtime) -> None:
    """The fine-tuned checkpoint + train_args.json, published in one rename (rank 0 writes)."""
    state = model.canonical_state()  # every rank: gathers global tensors
    try:
        if rt.is_main:
            _publish(model, state, output, train_args, overwrite)
    finally:
        if rt.world > 1:  # the other ranks may read the folder next (evaluation after training)
            flow.comm.barrier()


def _publish(model, state: dict, output: str, train_args: dict, overwrite: bool) -> None:
    meta = {"finetuned_task": train_args.get("task", ""),
            "base_checkpoint": (train_args.get("base_checkpoint") or {}).get("name", "")}
    with publishing(output, overwrite=overwrite) as stage:
        write_checkpoint_files(stage, list(state.items()), model.config,
                               vocab_file=getattr(model, "vocab_file", None), metadata=meta)
        with open(os.path.join(stage, TRAIN_ARGS), "w", encoding="utf-8") as f:
            json.dump(train_args, f, indent=2, ensure_ascii=False, allow_nan=False)
            f.write("\n")


def _check_output(output: str, overwrite: bool) -> None:
    if os.path.exists(output) and not overwrite:
        raise CheckpointError(f"{output}: already exists (use --overwrite to replace it)")
    if os.path.exists(output) and not os.path.isdir(output):
        raise CheckpointError(f"{output}: exists and is not a folder")


def _identity(path: str, name: str) -> dict:
    from bert_of.eval.results import checkpoint_identity

    ident = checkpoint_identity(path, name=name)
    if ident.get("format") == "bert_of":  # an HF folder also holds a model.safetensors
        from bert_of.converters.convert import detect

        try:
            fmt = detect(path)
        except BertOfError:
            fmt = "of"
        if fmt != "of":
            ident["format"] = fmt
    return ident


def _base_args(task: str, h: Hyper, rt: Runtime, model_path: str, model_name: str, ident_path: str | None,
               train_path: str, lower: bool) -> dict:
    from bert_of.eval.results import file_identity, hardware_info

    return {"task": task, "base_checkpoint": _identity(ident_path or model_path, model_name),
            "train_data": file_identity(train_path), "do_lower_case": lower,
            "hparams": {"lr": h.lr, "batch_size": h.batch_size, "epochs": h.epochs, "max_steps": h.max_steps,
                        "warmup_proportion": h.warmup_proportion, "weight_decay": h.weight_decay,
                        "clip_grad_norm": h.clip_grad_norm, "adam_eps": h.adam_eps, "bias_correction": False,
                        "seed": h.seed, "mode": h.mode, "amp": h.amp, "grad_accum_steps": h.grad_accum_steps,
                        "ranks": rt.world, "device": rt.device},
            "date": utc_now(), "hardware": hardware_info(), "bert_of_version": __version__,
            "command": _command_line()}


def _command_line() -> str | None:
    """The bert-of command line, when this process is one (not an embedding program or test)."""
    prog = sys.argv[0] if sys.argv else ""
    if os.path.basename(prog) == "bert-of" or prog.endswith(os.path.join("bert_of", "cli.py")):
        import shlex

        return " ".join(["bert-of", *map(shlex.quote, sys.argv[1:])])
    return None


def default_eval_dir(model_name: str, data_path: str, task: str) -> str:
    stem = os.path.splitext(os.path.basename(data_path))[0]
    stamp = utc_now().replace("-", "").replace(":", "").rstrip("Z").replace("T", "-")
    return os.path.join(bert_of_home(), "eval", f"{model_name}", f"{task}-{stem}-{stamp}")


def _eval_opts(opts, data: str):
    """The options of a post-training evaluation of the checkpoint just written."""
    import argparse

    d = dict(vars(opts))
    d.update(data=data, output=None, output_model=opts.output, model=opts.output, name=None)
    return argparse.Namespace(**d)


def _record(opts, rt: Runtime, task: str, metrics: dict, *, data_path: str, pred_path: str, model_path: str,
            model_name: str, train_args: dict, settings: dict, tool: str, new_head: bool) -> None:
    if getattr(opts, "no_record", False) or not rt.is_main:
        return
    from bert_of.eval.results import append_result, file_identity, make_record

    hp = dict((train_args.get("hparams") or {}))
    hp.update({k: v for k, v in settings.items() if k not in hp})
    for item in getattr(opts, "hparam", None) or []:
        if "=" not in item:
            raise ConfigError(f"--hparam {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            hp[k.strip()] = json.loads(v)
        except ValueError:
            hp[k.strip()] = v
    extra = {"settings": settings, "head_trained": not new_head}
    base = train_args.get("base_checkpoint")
    if base:
        extra["base_checkpoint"] = base
        extra["note"] = f"fine-tuned from {base.get('name')}"
    if new_head:
        extra["note"] = "task head not trained (newly initialised)"
    ident = _identity(model_path, getattr(opts, "name", None) or model_name)
    rec = make_record(task, metrics, split=os.path.basename(data_path), checkpoint=ident, hparams=hp,
                      data=file_identity(data_path), predictions=file_identity(pred_path), tool=tool, **extra)
    path = append_result(rec, getattr(opts, "results", None))
    note(rt, f"recorded in {path}")
