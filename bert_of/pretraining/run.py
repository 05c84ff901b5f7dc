"""``bert-of pretrain``: OFRecord data -> a trained bert_of checkpoint (-> the zoo).

    bert-of pretrain --data DATA -o RUN --config bert_config.json --steps 1000
    bert-of pretrain ... --nproc 2               # 2 ranks, global tensors (graph or eager)
    bert-of pretrain ... --nproc 2 --ddp --mode eager
    bert-of pretrain ... --resume                # continue RUN exactly where it stopped

The run directory holds ``metrics.jsonl``, ``checkpoints/step-NNNNNNN/`` (see
:mod:`bert_of.training.state`) and ``final/`` at the end. The training itself is
:class:`bert_of.training.Trainer` driving :class:`bert_of.heads.BertForPreTraining`, whose
forward computes Google's loss from the batch's labels.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

from bert_of._flow import flow
from bert_of.checkpoint import load_checkpoint, write_checkpoint
from bert_of.config import BertConfig
from bert_of.data.layout import dataset_vocab
from bert_of.data.reader import PretrainingDataset
from bert_of.errors import ConfigError
from bert_of.files.atomic import atomic_write, write_json
from bert_of.files.reading import sha256_file
from bert_of.files.owned import register_own_files
from bert_of.heads import BertForPreTraining
from bert_of.options import RUN_RECORD, TrainConfig, record
from bert_of.progress import bars_enabled
from bert_of.pretraining.options import PretrainOptions, check_vocab, with_data_lengths
from bert_of.vocab import check_vocab_fits, vocab_size
from bert_of.training.loop import StopAfter, fit
from bert_of.training.runtime import Runtime
from bert_of.training.state import RunDir, check_finite
from bert_of.training.trainer import Trainer
from bert_of.zoo import Zoo, resolve_for


ZOO_METADATA = "zoo_metadata.json"
register_own_files((ZOO_METADATA,))


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


VOCAB_NAME, CONFIG_NAME = "vocab.txt", "config.json"  # the run's own: a resume reads these, not a checkpoint's


def _model_config(opts: PretrainOptions, run: RunDir) -> tuple:
    """(config, vocab file, initial tensors or None) of the model to train. A resumed run's are
    the run directory's own copies (made when it started: never a checkpoint's, which --keep may
    delete). A new run's vocabulary: --vocab, else the one the data was made with, else the
    checkpoint's."""
    if run.resume_from:
        own = os.path.join(run.path, CONFIG_NAME)
        return BertConfig.from_json_file(own), os.path.join(run.path, VOCAB_NAME), None
    data_vocab = dataset_vocab(opts.data)
    if opts.init_checkpoint:
        ck = load_checkpoint(resolve_for("--init-checkpoint", opts.init_checkpoint, vocab=opts.vocab).path)
        if not opts.vocab and data_vocab and ck.vocab_file and not _same_file(data_vocab, ck.vocab_file):
            raise ConfigError(f"{opts.data} was made with another vocabulary than {opts.init_checkpoint}'s "
                              f"({data_vocab} differs from {ck.vocab_file}): token ids would mean other words; "
                              "pass --vocab to choose one anyway")
        config, vocab, tensors = ck.config, opts.vocab or data_vocab or ck.vocab_file, ck.tensors
    elif opts.config:
        config = BertConfig.from_model_json_file(opts.config)
        config.provenance = "bert_of"
        vocab, tensors = opts.vocab or data_vocab, None
    else:
        raise ConfigError("pass --config (a new model), --init-checkpoint (continue one) or --resume")
    if opts.no_dropout:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    if vocab is None:
        raise ConfigError(f"no vocab.txt: {opts.data} does not record the one it was made with; pass --vocab")
    if not os.path.isfile(vocab):
        raise ConfigError(f"{vocab}: vocab file not found")
    if opts.init_checkpoint and opts.vocab:  # attached to a model that exists: exactly its ids
        # or the padded rows its own vocabulary leaves (NVIDIA's multiple of 8): the same answer as beside it
        own = vocab_size(ck.vocab_file) if ck.vocab_file else None
        check_vocab_fits(opts.vocab, config.vocab_size,
                         8 if own is not None and own < config.vocab_size == -(-own // 8) * 8 else 1)
    check_vocab(vocab, config.vocab_size)
    if run.rt.is_main:  # the run owns what it reads from here on
        with open(vocab, "rb") as f:
            atomic_write(os.path.join(run.path, VOCAB_NAME), f.read())
        atomic_write(os.path.join(run.path, CONFIG_NAME), config.to_json_string())
    return config, vocab, tensors


def run(opts: PretrainOptions) -> int:
    """Train as ``opts`` says (a parsed command line: :func:`bert_of.pretraining.cli.options`, the data's
    sequence lengths filled in: :func:`~bert_of.pretraining.cli.with_data_lengths`)."""
    opts = with_data_lengths(opts)
    rt = Runtime.create(dist="ddp" if opts.ddp else "auto")
    if opts.batch_size % rt.world:
        raise ConfigError(f"global batch {opts.batch_size} is not divisible by {rt.world} ranks")
    run_dir = RunDir(opts.output, rt, outputs=("final", ZOO_METADATA), own=(VOCAB_NAME, CONFIG_NAME), what="pretrain",
                     sources=(opts.data, opts.config, opts.vocab, opts.init_checkpoint),
                     record=(RUN_RECORD, record(opts)))
    with run_dir.open(resume=opts.resume, overwrite=opts.overwrite):
        return _train(opts, rt, run_dir)


def _train(opts: PretrainOptions, rt: Runtime, run_dir: RunDir) -> int:
    config, vocab_file, tensors = _model_config(opts, run_dir)
    if opts.max_seq_length > config.max_position_embeddings:
        raise ConfigError(f"{opts.data}: sequences of {opts.max_seq_length} exceed max_position_embeddings "
                          f"{config.max_position_embeddings}")
    model = BertForPreTraining(config)
    if tensors is not None:
        model.load_canonical(tensors)
    elif not run_dir.resume_from:
        model.init_weights(seed=opts.seed)
    flow.manual_seed(opts.seed + rt.rank)
    cfg = TrainConfig.of(opts).check()
    trainer = Trainer(model, replace(cfg, mode=rt.mode(cfg.mode, "pretrain")), rt)
    data = PretrainingBatches(PretrainingDataset(
        opts.data, opts.batch_size // rt.world, opts.max_seq_length, opts.max_predictions_per_seq, rank=rt.rank,
        world_size=rt.world, shuffle=not opts.no_shuffle, seed=opts.seed, vocab_size=config.vocab_size))
    # What an exact resume must find unchanged besides the train config (saved with every checkpoint).
    setup = {"batch_size": opts.batch_size, "max_seq_length": opts.max_seq_length,
             "max_predictions_per_seq": opts.max_predictions_per_seq,
             "config": {k: v for k, v in config.to_dict().items() if k != "provenance"}}
    run_dir.start(trainer, data, setup)

    done = fit(trainer, data, opts.steps, batch_size=opts.batch_size, run=run_dir, log_every=opts.log_every,
               save_every=opts.save_every, keep=opts.keep, vocab_file=vocab_file,
               progress=None if opts.quiet else "bar" if bars_enabled() else "lines", what="pretrain",
               callbacks=[StopAfter(opts.stop_after)] if opts.stop_after else [])
    losses = [v for v in done.losses if math.isfinite(v)]  # AMP may have skipped a step
    summary = f"{trainer.global_step} steps" + (f", loss {losses[-1]:.4f}" if losses else "") + \
        f", {done.seconds:.1f} s"  # the last word whether piped or after a terminal's bar
    if done.stopped:
        if rt.is_main:
            print(f"stopped at step {trainer.global_step} ({summary}); `--resume` continues it")
        return 0
    final = os.path.join(run_dir.path, "final")
    state = trainer.model.canonical_state()  # a collective for global tensors
    check_finite(state, f"{final} (step {trainer.global_step})")  # never publish or register a broken model
    if not rt.is_main:
        return 0
    write_checkpoint(final, list(state.items()), config, vocab_file, overwrite=True,
                     metadata={"format": "bert_of", "pretrained_steps": str(trainer.global_step)})
    print(f"wrote {final} ({summary})")
    if opts.zoo_name:
        meta = {"training": {"steps": trainer.global_step, "data": os.path.abspath(opts.data),
                             "train_config": cfg.to_dict(), "world_size": rt.world,
                             "metrics": run_dir.metrics}}
        meta_path = os.path.join(run_dir.path, ZOO_METADATA)
        write_json(meta_path, meta)
        zoo = Zoo()
        e = zoo.add(final, opts.zoo_name, metadata=meta_path, overwrite=True)
        print(f"registered {e['name']} -> {e['path']} in {zoo.local_registry_path}")
    return 0


__all__ = ["PretrainOptions", "PretrainingBatches", "run"]
