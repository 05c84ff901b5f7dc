"""The training loop every command shares: steps over a data source, then its callbacks
(``metrics.jsonl`` and progress, periodic checkpoints, a stop at a step); and the shuffled-rows
data source of fine-tuning.

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

from bert_of.files.atomic import append_jsonl
from bert_of.progress import Progress, note
from bert_of.runtime.process import interrupt_note
from bert_of.training.padding import cut, padded_width, row_lengths
from bert_of.training.state import NonFiniteError, RunDir


@dataclass
class FitResult:
    steps: int  # the trainer's global step at the end
    losses: list = field(default_factory=list)  # the loss of every step this call ran
    seconds: float = 0.0
    stopped: bool = False  # ended early by a callback (e.g. StopAfter)


def _json_number(v):
    """A metric as JSON allows it: rounded, or null when it is NaN / infinite (an AMP-skipped step)."""
    return round(v, 7) if math.isfinite(v) else None


class Callback:
    """Work :func:`fit` does after a step: ``after_step`` returns True to stop training there
    (what it did stays: a stopped run resumes). ``close`` runs when the loop ends, however."""

    def after_step(self, trainer, data, out: dict, step: int) -> bool:
        return False

    def close(self) -> None:
        pass


class LogMetrics(Callback):
    """Every ``every`` steps (and at the last): a ``metrics.jsonl`` record on rank 0 (step, the step's
    outputs, samples/s over ``batch_size`` global rows, mode, world) and, with ``lines``, the loss
    as a note (also at once after this invocation's first step); else (``bar``) a progress bar (:class:`bert_of.progress.Progress`: a bar on a
    terminal, a line every few seconds otherwise)."""

    def __init__(self, trainer, steps: int, batch_size: int, every: int, metrics: str | None, progress, what: str,
                 unit: str = "samples"):
        self.rt, self.steps, self.batch_size, self.every, self.metrics = trainer.rt, steps, batch_size, every, metrics
        self.unit = unit
        self.lines, self.mode = progress == "lines", trainer.cfg.mode
        self.bar = Progress(what, total=steps, initial=trainer.global_step, unit="step") \
            if progress == "bar" and self.rt.is_main else None
        self.t0 = self.t_last = time.perf_counter()
        self.first = self.n_last = trainer.global_step
        self.window = []

    def after_step(self, trainer, data, out, step):
        if math.isfinite(out["loss"]):
            self.window.append(out["loss"])
        if self.bar is not None:
            self.bar.update(1, loss=f"{out['loss']:.4f}", lr=f"{out['lr']:.2e}")
        if self.lines and step == self.first + 1 and step % self.every and step != self.steps:
            # the first step at once (a short run, or a slow first step, is not silent until step N)
            note(self.rt, f"step {step}/{self.steps}  loss {out['loss']:.4f}  lr {out['lr']:.3g}  "
                          f"(then every {self.every} steps)")
        if step % self.every == 0 or step == self.steps:
            now = time.perf_counter()
            rate = (step - self.n_last) * self.batch_size / max(now - self.t_last, 1e-9)
            if self.metrics:
                append_jsonl(self.metrics, {"step": step, **{k: _json_number(v) for k, v in out.items()},
                                            "samples_per_s": round(rate, 3), "mode": self.mode, "world": self.rt.world})
            if self.lines:
                eta = (self.steps - step) * (now - self.t0) / (step - self.first)
                mean = f"{sum(self.window) / len(self.window):.4f}" if self.window else "nan"
                # metrics.jsonl keeps this step's loss; the line says it shows the window's mean
                note(self.rt, f"step {step}/{self.steps}  loss {mean} (mean of {len(self.window) or 1} step(s); "
                              f"step {out['loss']:.4f})  lr {out['lr']:.3g}  {rate:.1f} {self.unit}/s  eta {eta:.0f} s")
            self.t_last, self.n_last, self.window = now, step, []
        return False

    def close(self):
        if self.bar is not None:
            self.bar.close()


class SaveCheckpoints(Callback):
    """A resumable checkpoint in ``run``'s ``checkpoints/`` every ``every`` steps (the newest ``keep`` stay)."""

    def __init__(self, run: RunDir, every: int, keep: int, vocab_file: str | None):
        self.run, self.every, self.keep, self.vocab_file = run, every, keep, vocab_file

    def after_step(self, trainer, data, out, step):
        if step % self.every == 0:
            self.run.save(trainer, data, self.vocab_file, self.keep)
        return False


def resume_note(what: str, run: RunDir) -> str:
    """What a Ctrl-C's line adds during training: the command that continues the run and from which
    step (its newest checkpoint on disk: a published one is complete), or that there is none yet."""
    newest = run.newest()
    step = int(os.path.basename(newest).split("-")[-1]) if newest else None
    run = run.path
    if step is None:
        return f"; no checkpoint of this {what} run yet (--save-every N saves them): nothing to --resume"
    return f"; `bert-of {what} -o {run} --resume` continues from step {step} (the last checkpoint)"


class StopAfter(Callback):
    """Stop once the global step reaches ``step`` (the run stays resumable from its checkpoints)."""

    def __init__(self, step: int):
        self.step = step

    def after_step(self, trainer, data, out, step):
        return step >= self.step


def fit(trainer, data, steps: int, *, batch_size: int, run: RunDir | None = None, log_every: int = 10,
        save_every: int = 0, keep: int = 2, vocab_file: str | None = None, progress: str | None = "bar",
        what: str = "train", callbacks=(), unit: str = "samples") -> FitResult:
    """Step ``trainer`` until its global step reaches ``steps``; after each step the callbacks run:
    :class:`LogMetrics` (every ``log_every`` steps), :class:`SaveCheckpoints` (every ``save_every``
    steps, with a ``run``), then ``callbacks`` (e.g. :class:`StopAfter`); one returning True stops
    the loop. ``unit`` names what a row is in the progress line. A non-finite loss stops training with one line naming the step
    (:meth:`Trainer._read`); the checkpoints already saved stay.
    """
    rt = trainer.rt
    metrics = run.metrics if run is not None and rt.is_main else None
    work = [LogMetrics(trainer, steps, batch_size, log_every, metrics, progress, what, unit)]
    if save_every and run is not None:
        work.append(SaveCheckpoints(run, save_every, keep, vocab_file))
    work += list(callbacks)
    res = FitResult(trainer.global_step)
    t0 = time.perf_counter()
    if run is not None:  # a Ctrl-C's line names the --resume command (updated at every checkpoint)
        interrupt_note(lambda: resume_note(what, run))
    try:
        while trainer.global_step < steps:
            out = trainer.step(data.next_batch())
            res.losses.append(out["loss"])
            stop = [cb.after_step(trainer, data, out, trainer.global_step) for cb in work]
            if any(stop):
                res.stopped = True
                break
    except NonFiniteError as e:
        kept = run.newest() if run is not None else None
        raise NonFiniteError(f"{what}: {e}; training stopped, nothing published"
                             + (f" (the last checkpoint, {kept}, stays)" if kept else "")) from None
    finally:
        for cb in work:
            cb.close()
    interrupt_note("")  # (a Ctrl-C unwinding through here keeps it: the command's last line says it)
    res.steps, res.seconds = trainer.global_step, time.perf_counter() - t0
    return res


class ShuffledRows:
    """Batches of rows drawn from global arrays, epochs after each other without a gap (run_squad's
    ``repeat()``): each epoch a new permutation of a NumPy generator seeded with ``seed``. Every
    rank draws the same global rows and keeps its share (``runtime.rank_rows``).

    ``pad_to_batch``: each batch cut to its longest row (bert_of.training.padding; the attention
    mask's ``attention_mask`` array says how long each row is), every [n, S] array alike (a tagger's
    labels past it are all ignored). For eager steps: a graph would build again for each width. The
    rows drawn are the same either way."""

    def __init__(self, arrays: dict, batch_size: int, seed: int, runtime, pad_to_batch: bool = False):
        self.arrays, self.batch_size, self.seed, self.rt = arrays, batch_size, seed, runtime
        self.pad_to_batch = pad_to_batch and "attention_mask" in arrays
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
        batch = {k: a[idx] for k, a in self.arrays.items()}
        if self.pad_to_batch:  # on the global batch: every rank cuts to the same width
            mask = batch["attention_mask"]
            batch = cut(batch, padded_width(row_lengths(mask), mask.shape[1]), mask.shape[1])
        return {k: self.rt.rank_rows(a) for k, a in batch.items()}

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches": self.drawn, "rank": self.rt.rank}

    def load_state_dict(self, state: dict) -> None:
        """Replay the draws (permutations only: cheap)."""
        self.seed = int(state["seed"])
        self._reset()
        for _ in range(int(state["batches"])):
            self._indices()
