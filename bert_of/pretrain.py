"""``bert-of pretrain``: OFRecord data -> a trained bert_of checkpoint (-> the zoo).

    bert-of pretrain --data DATA -o RUN --config bert_config.json --steps 1000
    bert-of pretrain ... --nproc 2               # 2 ranks, global tensors (graph or eager)
    bert-of pretrain ... --nproc 2 --ddp --mode eager
    bert-of pretrain ... --resume                # continue RUN exactly where it stopped

The run directory holds ``metrics.jsonl``, ``checkpoints/step-NNNNNNN/`` (see
:mod:`bert_of.training.state`) and ``final/`` at the end. The training itself is
:class:`bert_of.training.Trainer` driving :class:`bert_of.modeling.BertForPreTraining`, whose
forward computes Google's loss from the batch's labels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bert_of._flow import flow
from bert_of.checkpoint import load_checkpoint, write_checkpoint
from bert_of.config import BertConfig
from bert_of.data.reader import PretrainingDataset, dataset_vocab, read_meta
from bert_of.errors import ConfigError
from bert_of.fs import read_json, sha256_file, write_json
from bert_of.modeling import BertForPreTraining
from bert_of.tokenization import vocab_size
from bert_of.training.loop import fit
from bert_of.training.optim import TrainConfig
from bert_of.training.runtime import Runtime
from bert_of.training.state import RunDir, check_finite
from bert_of.training.trainer import Trainer
from bert_of.zoo import resolve_for
from bert_of.zoo.cli import main as zoo_main


@dataclass(kw_only=True)
class PretrainOptions:
    """Everything ``bert-of pretrain`` takes (its CLI options, same names and defaults)."""

    data: str
    output: str  # the run directory
    config: str | None = None  # a new model from bert_config.json / config.json
    init_checkpoint: str | None = None  # or continue one (any format, or a zoo name)
    vocab: str | None = None
    seq_length: int | None = None  # default: the data's bert_of_data.json
    max_predictions: int | None = None
    mode: str = "graph"
    optimizer: str = "adamw"
    lr: float = 1e-4
    warmup_steps: int = 0
    steps: int = 1000
    batch_size: int = 32  # global, over all ranks
    grad_accum: int = 1
    weight_decay: float = 0.01
    clip_grad_norm: float = 1.0  # 0: off
    amp: bool = False
    seed: int = 0
    no_shuffle: bool = False
    no_dropout: bool = False
    save_every: int = 0
    keep: int = 2
    log_every: int = 10
    resume: bool = False
    overwrite: bool = False
    ddp: bool = False
    zoo_name: str | None = None
    quiet: bool = False
    stop_after: int = 0  # tests: stop ("killed") after this step


ZOO_METADATA = "zoo_metadata.json"


class PretrainingBatches:
    """A rank's shard of pretraining records as batches named like the model's forward arguments."""

    def __init__(self, dataset: PretrainingDataset):
        self.dataset = dataset

    def next_batch(self) -> dict:
        raw = self.dataset.next_batch()
        return {"input_ids": raw["input_ids"], "token_type_ids": raw["segment_ids"],
                "attention_mask": raw["input_mask"], "masked_lm_positions": raw["masked_lm_positions"],
                "masked_lm_ids": raw["masked_lm_ids"], "masked_lm_weights": raw["masked_lm_weights"],
                "next_sentence_labels": raw["next_sentence_labels"]}

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)


def _same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b) or sha256_file(a) == sha256_file(b)


def _model_config(opts: PretrainOptions, run: RunDir) -> tuple:
    """(config, vocab file, initial tensors or None) of the model to train. A resumed run's model
    is the checkpoint's; a ``--config`` given again must describe it (:meth:`RunDir.start`). The
    vocabulary: --vocab, else the run's (resume), else the one the data was made with, else the
    checkpoint's."""
    data_vocab = dataset_vocab(opts.data)
    if opts.config:
        raw = read_json(opts.config, "model config")
        config = BertConfig.from_dict(raw, opts.config) if "provenance" in raw else \
            BertConfig.from_google_dict(raw, opts.config)
        config.provenance = "bert_of"
    if run.resume_from:
        if not opts.config:
            config = BertConfig.from_json_file(os.path.join(run.resume_from, "config.json"))
        vocab = os.path.join(run.resume_from, "vocab.txt")
        return config, opts.vocab or (vocab if os.path.isfile(vocab) else data_vocab), None
    if opts.init_checkpoint:
        ck = load_checkpoint(resolve_for("--init-checkpoint", opts.init_checkpoint, vocab=opts.vocab).path)
        if not opts.vocab and data_vocab and ck.vocab_file and not _same_file(data_vocab, ck.vocab_file):
            raise ConfigError(f"{opts.data} was made with another vocabulary than {opts.init_checkpoint}'s "
                              f"({data_vocab} differs from {ck.vocab_file}): token ids would mean other words; "
                              "pass --vocab to choose one anyway")
        return ck.config, opts.vocab or data_vocab or ck.vocab_file, ck.tensors
    if opts.config:
        return config, opts.vocab or data_vocab, None
    raise ConfigError("pass --config (a new model), --init-checkpoint (continue one) or --resume")


def run(opts: PretrainOptions) -> int:
    rt = Runtime.create(dist="ddp" if opts.ddp else "auto")
    if opts.batch_size % rt.world:
        raise ConfigError(f"global batch {opts.batch_size} is not divisible by {rt.world} ranks")
    run_dir = RunDir(opts.output, rt, outputs=("final", ZOO_METADATA), what="pretrain",
                     sources=(opts.data, opts.config, opts.vocab, opts.init_checkpoint))
    with run_dir.open(resume=opts.resume, overwrite=opts.overwrite):
        return _train(opts, rt, run_dir)


def _train(opts: PretrainOptions, rt: Runtime, run_dir: RunDir) -> int:
    config, vocab_file, tensors = _model_config(opts, run_dir)
    if opts.no_dropout:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    if vocab_file is None:
        raise ConfigError(f"no vocab.txt: {opts.data} does not record the one it was made with; pass --vocab")
    if not os.path.isfile(vocab_file):
        raise ConfigError(f"{vocab_file}: vocab file not found")
    n_vocab = vocab_size(vocab_file)
    if n_vocab > config.vocab_size:
        raise ConfigError(f"{vocab_file} has {n_vocab} tokens but the config's vocab_size is {config.vocab_size}")

    model = BertForPreTraining(config)
    if tensors is not None:
        model.load_canonical(tensors)
    elif not run_dir.resume_from:
        model.init_weights(seed=opts.seed)
    flow.manual_seed(opts.seed + rt.rank)
    cfg = TrainConfig(mode=opts.mode, optimizer=opts.optimizer, lr=opts.lr, warmup_steps=opts.warmup_steps,
                      total_steps=opts.steps, weight_decay=opts.weight_decay,
                      clip_grad_norm=opts.clip_grad_norm or None, grad_accum_steps=opts.grad_accum,
                      amp=opts.amp, seed=opts.seed)
    trainer = Trainer(model, cfg, rt)

    options = (read_meta(opts.data) or {}).get("options", {})
    seq_len = opts.seq_length or options.get("max_seq_length")
    max_pred = opts.max_predictions or options.get("max_predictions_per_seq")
    if not seq_len or not max_pred:
        raise ConfigError(f"{opts.data}: no bert_of_data.json: pass --max-seq-length and --max-predictions-per-seq")
    if seq_len > config.max_position_embeddings:
        raise ConfigError(f"{opts.data}: sequences of {seq_len} exceed max_position_embeddings "
                          f"{config.max_position_embeddings}")
    data = PretrainingBatches(PretrainingDataset(
        opts.data, opts.batch_size // rt.world, int(seq_len), int(max_pred), rank=rt.rank, world_size=rt.world,
        shuffle=not opts.no_shuffle, seed=opts.seed, vocab_size=config.vocab_size))
    # What an exact resume must find unchanged besides the train config (saved with every checkpoint).
    setup = {"batch_size": opts.batch_size, "seq_length": int(seq_len), "max_predictions": int(max_pred),
             "config": {k: v for k, v in config.to_dict().items() if k != "provenance"}}
    run_dir.start(trainer, data, setup)

    done = fit(trainer, data, opts.steps, batch_size=opts.batch_size, run=run_dir, log_every=opts.log_every,
               save_every=opts.save_every, keep=opts.keep, vocab_file=vocab_file,
               progress=None if opts.quiet else "bar", what="pretrain", stop_after=opts.stop_after)
    if done.stopped:
        return 0
    final = os.path.join(run_dir.path, "final")
    state = trainer.model.canonical_state()  # a collective for global tensors
    check_finite(state, f"{final} (step {trainer.global_step})")  # never publish or register a broken model
    if not rt.is_main:
        return 0
    write_checkpoint(final, list(state.items()), config, vocab_file, overwrite=True,
                     metadata={"format": "bert_of", "pretrained_steps": str(trainer.global_step)})
    print(f"wrote {final} ({trainer.global_step} steps)")
    if opts.zoo_name:
        meta = {"training": {"steps": trainer.global_step, "data": os.path.abspath(opts.data),
                             "train_config": cfg.to_dict(), "world_size": rt.world,
                             "metrics": run_dir.metrics}}
        meta_path = os.path.join(run_dir.path, ZOO_METADATA)
        write_json(meta_path, meta)
        return zoo_main(["add", final, "--name", opts.zoo_name, "--metadata", meta_path, "--overwrite"])
    return 0


__all__ = ["PretrainOptions", "PretrainingBatches", "run"]
