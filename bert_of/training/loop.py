"""The training loop every command shares: steps over a data source, ``metrics.jsonl``, progress,
periodic checkpoints; and the shuffled-rows data source of fine-tuning.

A data source has ``next_batch()`` (this rank's rows: a dict of numpy arrays named like the
model's forward arguments), ``state_dict()`` and ``load_state_dict()`` (its position, for an
exact resume).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from bert_of.errors import BertOfError
from bert_of.fs import append_jsonl
from bert_of.progress import Progress, log
from bert_of.training.state import save_checkpoint

METRICS_NAME = "metrics.jsonl"


@dataclass
class FitResult:
    steps: int  # the trainer's global step at the end
    losses: list = field(default_factory=list)  # the loss of every step this call ran
    seconds: float = 0.0
    stopped: bool = False  # ended early by stop_after


def note(rt, msg: str) -> None:
    """A note for the user (the ``bert_of`` logger: stderr, -q silences it), from rank 0 only; a
    message starting "warning:" is a warning."""
    if rt is None or rt.is_main:
        (log.warning if msg.startswith("warning:") else log.info)(msg)


def fit(trainer, data, steps: int, *, batch_size: int, run_dir: str | None = None, log_every: int = 10,
        save_every: int = 0, keep: int = 2, vocab_file: str | None = None, progress: str | None = "bar",
        what: str = "train", stop_after: int = 0, check_finite: bool = False) -> FitResult:
    """Step ``trainer`` until its global step reaches ``steps``.

    Every ``log_every`` steps (and at the last) rank 0 appends a record to
    ``run_dir/metrics.jsonl`` (step, the step's outputs, samples/s over ``batch_size`` global
    rows per step, mode, world) and, with ``progress="lines"``, prints the loss; ``"bar"``
    shows progress instead (:class:`bert_of.progress.Progress`: a bar on a terminal, else a line
    every few seconds). Every ``save_every`` steps a checkpoint goes to
    ``run_dir/checkpoints/``. ``check_finite``: a non-finite loss stops training with an error.
    """
    rt = trainer.rt
    metrics = os.path.join(run_dir, METRICS_NAME) if run_dir and rt.is_main else None
    if metrics:
        os.makedirs(run_dir, exist_ok=True)
    bar = None
    if progress == "bar" and rt.is_main:
        bar = Progress(what, total=steps, initial=trainer.global_step, unit="step")
    res = FitResult(trainer.global_step)
    t0 = t_last = time.perf_counter()
    first, n_last, window = trainer.global_step, trainer.global_step, []
    while trainer.global_step < steps:
        out = trainer.step(data.next_batch())
        step = trainer.global_step
        res.losses.append(out["loss"])
        window.append(out["loss"])
        if bar is not None:
            bar.update(1, loss=f"{out['loss']:.4f}", lr=f"{out['lr']:.2e}")
        if step % log_every == 0 or step == steps:
            if check_finite and not all(math.isfinite(v) for v in window):
                raise BertOfError(f"{what}: the loss is not finite at step {step} (lower --lr?)")
            now = time.perf_counter()
            rate = (step - n_last) * batch_size / max(now - t_last, 1e-9)
            if metrics:
                append_jsonl(metrics, {"step": step, **{k: round(v, 7) for k, v in out.items()},
                                       "samples_per_s": round(rate, 3), "mode": trainer.cfg.mode, "world": rt.world})
            if progress == "lines":
                eta = (steps - step) * (now - t0) / (step - first)
                note(rt, f"step {step}/{steps}  loss {sum(window) / len(window):.4f}  lr {out['lr']:.3g}  "
                         f"{rate:.1f} examples/s  eta {eta:.0f} s")
            t_last, n_last, window = now, step, []
        if save_every and run_dir and step % save_every == 0:
            save_checkpoint(trainer, run_dir, data, vocab_file, keep)
        if stop_after and step >= stop_after:  # for tests: a "kill" at a known step
            res.stopped = True
            break
    if bar is not None:
        bar.close()
    res.steps, res.seconds = trainer.global_step, time.perf_counter() - t0
    return res


class ShuffledRows:
    """Batches of rows drawn from global arrays, epochs after each other without a gap (run_squad's
    ``repeat()``): each epoch a new permutation of a NumPy generator seeded with ``seed``. Every
    rank draws the same global rows and keeps its share (``runtime.rank_rows``)."""

    def __init__(self, arrays: dict, batch_size: int, seed: int, runtime):
        self.arrays, self.batch_size, self.seed, self.rt = arrays, batch_size, seed, runtime
        self.n = len(next(iter(arrays.values())))
        self._reset()

    def _reset(self):
        self.rng, self.order, self.drawn = np.random.default_rng(self.seed), np.empty(0, dtype=np.int64), 0

    def _indices(self) -> np.ndarray:
        while len(self.order) < self.batch_size:
            self.order = np.concatenate([self.order, self.rng.permutation(self.n)])
        idx, self.order = self.order[:self.batch_size], self.order[self.batch_size:]
        self.drawn += 1
        return idx

    def next_batch(self) -> dict:
        idx = self._indices()
        return {k: self.rt.rank_rows(a[idx]) for k, a in self.arrays.items()}

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches": self.drawn, "rank": self.rt.rank}

    def load_state_dict(self, state: dict) -> None:
        """Replay the draws (permutations only: cheap)."""
        self.seed = int(state["seed"])
        self._reset()
        for _ in range(int(state["batches"])):
            self._indices()
