"""``bert-of pretrain``: OFRecord data -> a trained bert_of checkpoint (-> the zoo).

    bert-of pretrain --data DATA --output RUN --config bert_config.json --steps 1000
    bert-of pretrain ... --nproc 2               # 2 ranks, global tensors (graph or eager)
    bert-of pretrain ... --nproc 2 --ddp --mode eager
    bert-of pretrain ... --resume                # continue RUN exactly where it stopped

A run directory holds ``metrics.jsonl`` (one line per logged step),
``checkpoints/step-NNNNNNN/`` (a bert_of checkpoint + optimizer state in
canonical names + ``trainer_state.json``: step, scheduler, data position of
every rank, RNG), and ``final/`` at the end. Checkpoints are written to a
temporary directory and renamed, so a kill mid-save leaves the previous one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from bert_of.errors import BertOfError, ConfigError
from bert_of.fs import atomic_open
from bert_of.training.state import CKPT_DIR, STATE_NAME, latest_checkpoint, load_optimizer_state, save


# --------------------------------------------------------------------------- run


def _batch(raw: dict) -> dict:
    """Reader features -> the trainer's batch keys."""
    return {"input_ids": raw["input_ids"], "token_type_ids": raw["segment_ids"], "attention_mask": raw["input_mask"],
            "masked_lm_positions": raw["masked_lm_positions"], "masked_lm_ids": raw["masked_lm_ids"],
            "masked_lm_weights": raw["masked_lm_weights"], "next_sentence_labels": raw["next_sentence_labels"]}


def _load_any(path: str, vocab):
    """A checkpoint in any format bert_of reads (or a zoo name), as a Checkpoint."""
    from bert_of.checkpoint import Checkpoint, load_checkpoint
    from bert_of.converters.common import Options
    from bert_of.converters.convert import detect, read

    if not os.path.exists(path) and not os.path.exists(path + ".index"):
        from bert_of import zoo
        return load_checkpoint(zoo.resolve(path))
    fmt = detect(path)
    if fmt == "of":
        return load_checkpoint(path)
    source = read(path, fmt, Options(vocab=vocab))  # e.g. continue pretraining a Google TF checkpoint
    return Checkpoint(path, source.config, source.load(), source.vocab_file)


def run(args) -> int:
    from bert_of._flow import flow
    from bert_of.checkpoint import load_checkpoint
    from bert_of.config import BertConfig
    from bert_of.data.reader import PretrainingDataset, read_meta
    from bert_of.modeling import BertForPreTraining
    from bert_of.training import TrainConfig, Trainer

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    if args.batch_size % world:
        raise ConfigError(f"global batch {args.batch_size} is not divisible by {world} ranks")
    resume_from = latest_checkpoint(args.output) if args.resume else None
    if args.resume and resume_from is None:
        raise BertOfError(f"{args.output}: nothing to resume (no checkpoints/step-*/{STATE_NAME})")
    if not args.resume and os.path.isdir(os.path.join(args.output, CKPT_DIR)) and not args.overwrite:
        raise BertOfError(f"{args.output}: already holds a run (use --resume to continue or --overwrite)")

    # model and its config
    vocab_file = args.vocab
    if resume_from:
        ck = load_checkpoint(resume_from, with_optimizer=True)
        config, vocab_file = ck.config, vocab_file or ck.vocab_file
    elif args.init_checkpoint:
        ck = _load_any(args.init_checkpoint, args.vocab)
        config, vocab_file = ck.config, vocab_file or ck.vocab_file
    elif args.config:
        with open(args.config) as f:
            raw = json.load(f)
        config = BertConfig.from_dict(raw, args.config) if "provenance" in raw else \
            BertConfig.from_google_dict(raw, args.config)
        config.provenance = "bert_of"
        ck = None
    else:
        raise ConfigError("pass --config (a new model), --init-checkpoint (continue one) or --resume")
    if args.no_dropout:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    if vocab_file is None or not os.path.isfile(vocab_file):
        raise ConfigError("no vocab.txt: pass --vocab")
    with open(vocab_file, encoding="utf-8") as f:
        n_vocab = sum(1 for _ in f)
    if n_vocab > config.vocab_size:
        raise ConfigError(f"{vocab_file} has {n_vocab} tokens but the config's vocab_size is {config.vocab_size}")

    model = BertForPreTraining(config)
    if ck is not None:
        model.load_canonical(ck.tensors)
    else:
        model.init_weights(seed=args.seed)
    flow.manual_seed(args.seed + rank)

    cfg = TrainConfig(mode=args.mode, optimizer=args.optimizer, lr=args.lr, warmup_steps=args.warmup_steps,
                      total_steps=args.steps, weight_decay=args.weight_decay,
                      clip_grad_norm=args.clip_grad_norm or None, grad_accum_steps=args.grad_accum,
                      amp=args.amp, seed=args.seed)
    if resume_from:
        saved = json.load(open(os.path.join(resume_from, STATE_NAME)))
        mine = {k: v for k, v in cfg.to_dict().items() if k not in ("extra",)}
        theirs = {k: v for k, v in saved["train_config"].items() if k in mine}
        differ = [k for k in mine if k in theirs and mine[k] != theirs[k]]
        if differ or saved["world_size"] != world:
            what = ", ".join(f"{k} {theirs[k]!r} -> {mine[k]!r}" for k in differ) or \
                f"world size {saved['world_size']} -> {world}"
            raise ConfigError(f"{resume_from}: cannot resume exactly with a different setup ({what})")
    placement = flow.placement("cpu" if not flow.cuda.is_available() else "cuda", ranks=list(range(world))) \
        if world > 1 and not args.ddp else None
    trainer = Trainer(model, cfg, placement=placement, ddp=args.ddp and world > 1)

    options = (read_meta(args.data) or {}).get("options", {})
    seq_len = args.seq_length or options.get("max_seq_length")
    max_pred = args.max_predictions or options.get("max_predictions_per_seq")
    if not seq_len or not max_pred:
        raise ConfigError(f"{args.data}: no bert_of_data.json: pass --seq-length and --max-predictions")
    if seq_len > config.max_position_embeddings:
        raise ConfigError(f"{args.data}: sequences of {seq_len} exceed max_position_embeddings "
                          f"{config.max_position_embeddings}")
    data = PretrainingDataset(args.data, args.batch_size // world, int(seq_len), int(max_pred), rank=rank,
                              world_size=world, shuffle=not args.no_shuffle, seed=args.seed,
                              vocab_size=config.vocab_size)
    if resume_from:
        load_optimizer_state(trainer, ck.optimizer)
        trainer.global_step = saved["global_step"]
        trainer.sched.load_state_dict(saved["scheduler"])
        for group, lr in zip(trainer.opt.param_groups, trainer.sched.get_last_lr()):
            group["lr"] = lr  # eager steps read it; graph mode only reports it
        data.load_state_dict(saved["data"][rank])
        if trainer.scaler and saved.get("loss_scaler"):
            trainer.scaler.load_state_dict(saved["loss_scaler"])
        trainer.generator.set_state(flow.tensor(np.array(saved["rng"], np.uint8)))

    os.makedirs(args.output, exist_ok=True)
    metrics_path = os.path.join(args.output, "metrics.jsonl")
    metrics = open(metrics_path, "a") if rank == 0 else None
    bar = None
    if rank == 0 and not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=trainer.global_step, unit="step", dynamic_ncols=True, file=sys.stderr)
    t_last, n_last = time.perf_counter(), trainer.global_step
    while trainer.global_step < args.steps:
        losses = trainer.step(_batch(data.next_batch()))
        step = trainer.global_step
        if rank == 0:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{losses['loss']:.4f}", lr=f"{losses['lr']:.2e}")
            if step % args.log_every == 0 or step == args.steps:
                now = time.perf_counter()
                rec = {"step": step, **{k: round(v, 7) for k, v in losses.items()},
                       "samples_per_s": round((step - n_last) * args.batch_size / max(now - t_last, 1e-9), 3),
                       "mode": args.mode, "world": world}
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
                t_last, n_last = now, step
        if args.save_every and step % args.save_every == 0:
            save(trainer, args.output, data, vocab_file, args.keep, rank, world)
        if args.stop_after and step >= args.stop_after:  # for tests: a "kill" at a known step
            return 0
    if bar is not None:
        bar.close()
    final = os.path.join(args.output, "final")
    state = trainer.model.canonical_state()
    if rank == 0:
        from bert_of.checkpoint import write_checkpoint

        write_checkpoint(final, list(state.items()), config, vocab_file, overwrite=True,
                         metadata={"format": "bert_of", "pretrained_steps": str(trainer.global_step)})
        print(f"wrote {final} ({trainer.global_step} steps)")
        if args.zoo_name:
            from bert_of import zoo
            meta = {"training": {"steps": trainer.global_step, "data": os.path.abspath(args.data),
                                 "train_config": cfg.to_dict(), "world_size": world, "metrics": metrics_path}}
            meta_path = os.path.join(args.output, "zoo_metadata.json")
            with open(meta_path, "w") as f:
                json.dump(meta, f, indent=2)
            from bert_of.zoo.cli import main as zoo_main

            code = zoo_main(["add", final, "--name", args.zoo_name, "--metadata", meta_path, "--force"])
            if code:
                return code
    return 0


# --------------------------------------------------------------------------- CLI


def _add_arguments(p):
    p.add_argument("--data", required=True, help="OFRecord pretraining data (bert-of data create-pretraining)")
    p.add_argument("--output", required=True, help="run directory (metrics, checkpoints, final)")
    p.add_argument("--config", help="bert_config.json / config.json for a new model")
    p.add_argument("--init-checkpoint", help="continue pretraining a checkpoint in any format (tf, lazy, hf, ...) "
                                             "or a zoo name")
    p.add_argument("--vocab", help="vocab.txt (default: the checkpoint's)")
    p.add_argument("--seq-length", type=int, help="default: from the data's bert_of_data.json")
    p.add_argument("--max-predictions", type=int, help="default: from the data's bert_of_data.json")
    p.add_argument("--mode", choices=("graph", "eager"), default="graph")
    p.add_argument("--blas", choices=("fast", "exact"), default="fast",
                   help="CPU GEMM kernels: fast = OpenBLAS's AVX2/FMA kernels (3x; OneFlow's bundled "
                        "OpenBLAS misdetects recent Xeons), exact = the detected ones (default: fast)")
    p.add_argument("--optimizer", choices=("adamw", "lamb", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--steps", type=int, default=1000, help="total optimizer steps (the decay horizon)")
    p.add_argument("--batch-size", type=int, default=32, help="GLOBAL batch (split over ranks)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip-grad-norm", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--amp", action="store_true", help="fp16 autocast + dynamic loss scaling (graph, GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--no-dropout", action="store_true")
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--keep", type=int, default=2, help="checkpoints to keep")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this machine (relaunches itself)")
    p.add_argument("--ddp", action="store_true", help="eager DDP with local tensors instead of global tensors")
    p.add_argument("--zoo-name", help="register the final checkpoint in the local zoo under this name")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--stop-after", type=int, default=0, help=argparse.SUPPRESS)


def _set_blas(args) -> None:
    if "oneflow" not in sys.modules:  # read when OneFlow loads; inherited by relaunched ranks
        os.environ["BERT_OF_BLAS"] = args.blas


def cmd_pretrain(args) -> int:
    _set_blas(args)
    # Under the launcher WORLD_SIZE equals the rank count; a bare WORLD_SIZE=1 (OneFlow sets it
    # in processes that imported it) must not stop the relaunch.
    if args.nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) != args.nproc:
        if args.batch_size % args.nproc:  # say it once here, not once per rank
            raise ConfigError(f"global batch {args.batch_size} is not divisible by {args.nproc} ranks")
        return _relaunch(args.nproc)
    return run(args)


def cmd_plot(args) -> int:
    """Loss / accuracy / lr curves of one or more runs (their metrics.jsonl) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    for run_dir in args.runs:
        path = run_dir if run_dir.endswith(".jsonl") else os.path.join(run_dir, "metrics.jsonl")
        if not os.path.isfile(path):
            raise BertOfError(f"{path}: no metrics (is {run_dir} a pretraining run?)")
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not rows:
            raise BertOfError(f"{path}: empty")
        runs[os.path.basename(os.path.normpath(run_dir))] = rows
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["loss"] for r in rows], label=name)
        axes[1].plot(steps, [r["mlm_acc"] for r in rows], label=f"{name} MLM")
        axes[1].plot(steps, [r["nsp_acc"] for r in rows], "--", label=f"{name} NSP")
        axes[2].plot(steps, [r["lr"] for r in rows], label=name)
    for ax, title in zip(axes, ("loss (MLM + NSP)", "accuracy", "learning rate")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(args.out, "wb") as f:
        fig.savefig(f, dpi=110, format="png")
    print(f"wrote {args.out}")
    return 0


def _relaunch(nproc: int) -> int:
    """Run this same command under OneFlow's launcher with ``nproc`` ranks."""
    import socket
    import subprocess

    argv = sys.argv[1:]
    if argv and argv[0] == "pretrain":
        argv = argv[1:]
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "oneflow.distributed.launch", "--nproc_per_node", str(nproc), "--master_port",
           str(port), "-m", "bert_of.pretrain", *argv]
    return subprocess.call(cmd)


def add_parser(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain BERT on OFRecord data (graph/eager, 1+ ranks)",
                       description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    p.set_defaults(fn=cmd_pretrain)
    q = sub.add_parser("plot", help="PNG loss/accuracy/lr curves of pretraining runs")
    q.add_argument("runs", nargs="+", help="run directories (or metrics.jsonl files)")
    q.add_argument("--out", default="loss.png")
    q.set_defaults(fn=cmd_plot)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bert-of pretrain")
    _add_arguments(p)
    args = p.parse_args(argv)
    _set_blas(args)
    try:
        return run(args)
    except BertOfError as e:
        print(f"bert-of: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
