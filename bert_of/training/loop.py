"""The training loop every command shares: steps over a data source, ``metrics.jsonl``, progress,
periodic checkpoints; and the shuffled-rows data source of fine-tuning.

A data source has ``next_batch()`` (this rank's rows: a dict of numpy arrays named like the
model's forward arguments), ``state_dict()`` and ``load_state_dict()`` (its position, for an
exact resume).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from bert_of.fs import append_jsonl
from bert_of.progress import Progress, log
from bert_of.training.state import METRICS_NAME, NonFiniteError, RunDir  # noqa: F401 - METRICS_NAME re-exported


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


def _json_number(v):
    """A metric as JSON allows it: rounded, or null when it is NaN / infinite (an AMP-skipped step)."""
    return round(v, 7) if math.isfinite(v) else None


def fit(trainer, data, steps: int, *, batch_size: int, run: RunDir | None = None, log_every: int = 10,
        save_every: int = 0, keep: int = 2, vocab_file: str | None = None, progress: str | None = "bar",
        what: str = "train", stop_after: int = 0, unit: str = "samples") -> FitResult:
    """Step ``trainer`` until its global step reaches ``steps``.

    Every ``log_every`` steps (and at the last) rank 0 appends a record to ``run``'s
    ``metrics.jsonl`` (step, the step's outputs, samples/s over ``batch_size`` global rows per
    step, mode, world) and, with ``progress="lines"``, prints the loss; ``"bar"`` shows progress
    instead (:class:`bert_of.progress.Progress`: a bar on a terminal, else a line every few
    seconds). Every ``save_every`` steps a checkpoint goes to ``run``'s ``checkpoints/``. A
    non-finite loss stops training with one line naming the step (:meth:`Trainer._read`); the
    checkpoints already saved stay.
    """
    rt = trainer.rt
    metrics = run.metrics if run is not None and rt.is_main else None
    bar = None
    if progress == "bar" and rt.is_main:
        bar = Progress(what, total=steps, initial=trainer.global_step, unit="step")
    res = FitResult(trainer.global_step)
    t0 = t_last = time.perf_counter()
    first, n_last, window = trainer.global_step, trainer.global_step, []
    try:
        while trainer.global_step < steps:
            out = trainer.step(data.next_batch())
            step = trainer.global_step
            res.losses.append(out["loss"])
            if math.isfinite(out["loss"]):
                window.append(out["loss"])
            if bar is not None:
                bar.update(1, loss=f"{out['loss']:.4f}", lr=f"{out['lr']:.2e}")
            if step % log_every == 0 or step == steps:
                now = time.perf_counter()
                rate = (step - n_last) * batch_size / max(now - t_last, 1e-9)
                if metrics:
                    append_jsonl(metrics, {"step": step, **{k: _json_number(v) for k, v in out.items()},
                                           "samples_per_s": round(rate, 3), "mode": trainer.cfg.mode, "world": rt.world})
                if progress == "lines":
                    eta = (steps - step) * (now - t0) / (step - first)
                    mean = f"{sum(window) / len(window):.4f}" if window else "nan"
                    # metrics.jsonl keeps this step's loss; the line says it shows the window's mean
                    note(rt, f"step {step}/{steps}  loss {mean} (mean of {len(window) or 1} step(s); step "
                             f"{out['loss']:.4f})  lr {out['lr']:.3g}  {rate:.1f} {unit}/s  eta {eta:.0f} s")
                t_last, n_last, window = now, step, []
            if save_every and run is not None and step % save_every == 0:
                run.save(trainer, data, vocab_file, keep)
            if stop_after and step >= stop_after:  # for tests: a "kill" at a known step
                res.stopped = True
                break
    except NonFiniteError as e:
        kept = run.newest() if run is not None else None
        raise NonFiniteError(f"{what}: {e}; training stopped, nothing published"
                             + (f" (the last checkpoint, {kept}, stays)" if kept else "")) from None
    finally:
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
