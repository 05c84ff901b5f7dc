"""Jobs on worker processes, results in job order (:func:`run_pool`): each worker has a pipe of its
own (jobs in; results, errors and progress out), a failure or Ctrl-C kills the workers outright,
and a worker that dies is reported naming its job's input, never waited for. What a job is, is
the caller's (:mod:`bert_of.data.create_pretraining`: one corpus -> one framed OFRecord file).
"""

from __future__ import annotations

import contextlib
import sys
import time

from bert_of.runtime.process import as_worker

from .text import DataError

__all__ = ["PipeProgress", "run_pool"]


class PipeProgress:
    """Progress a worker reports to the parent's bar, sent over the worker's own pipe in chunks."""

    def __init__(self, conn):
        self.conn, self.pending, self.last = conn, 0.0, time.monotonic()

    def __call__(self, amount: float) -> None:
        self.pending += amount
        now = time.monotonic()
        if now - self.last > 0.1:
            self.flush()
            self.last = now

    def flush(self) -> None:
        if self.pending:
            self.conn.send(("progress", self.pending))
        self.pending = 0.0


def _serve(conn, init, process, progress: bool) -> None:
    """A worker process: jobs in, results out, over its own pipe. ``init`` is (function, args) to
    call first, or None (a forked worker inherits what the parent made)."""
    as_worker()  # Ctrl-C is the parent's: it stops the workers
    if init is not None:
        init[0](*init[1])
    report = PipeProgress(conn) if progress else None
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the parent is gone
            return
        if job is None:
            return
        try:
            result = ("done", process(job, report))
        except Exception as e:  # noqa: BLE001 - the parent re-raises it
            result = ("error", e)
        try:
            conn.send(result)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            conn.send(("error", DataError(f"{type(result[1]).__name__}: {result[1]}")))
        if result[0] == "error":
            return


def run_pool(jobs, process, n_workers: int, bar, *, init, init_forked, describe):
    """``process(job, report)`` for every job on ``n_workers`` processes, results in job order.
    A spawned worker first calls ``init`` = (function, args); with fork the parent calls
    ``init_forked()`` once and the workers inherit what it made. ``report(amount)`` adds to ``bar``;
    ``describe(job)`` names a job's input when its worker dies.

    Each worker has a pipe of its own and shares no lock with the others: multiprocessing.Pool's
    workers share one queue lock, and one that died holding it (killed at the end of a failed run)
    left another waiting forever while Pool.terminate joined it. Here a failure or Ctrl-C kills the
    workers outright, and a worker that dies is reported, never waited for."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    # fork is cheap (workers inherit the tokenizer), but not safe once OneFlow's threads exist here.
    method = "spawn" if "oneflow" in sys.modules else "fork"
    ctx = mp.get_context(method)
    if method == "fork":
        init_forked()
    jobs, workers, ok = list(jobs), [], False
    try:
        for _ in range(n_workers):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(theirs, None if method == "fork" else init, process,
                                                 not bar.disable), daemon=True)
            p.start()
            theirs.close()
            workers.append({"proc": p, "conn": mine, "job": None, "lost": False})
        todo, results, done, seen = iter(range(len(jobs))), {}, 0, 0.0

        # A worker's pipe that breaks (EOF, or ECONNRESET / EPIPE when it died with bytes unread) means
        # the worker died: reported below as its death, naming its input, never as an I/O error.
        def feed(w):
            w["job"] = next(todo, None)
            if w["job"] is not None:
                try:
                    w["conn"].send(jobs[w["job"]])
                except OSError:
                    w["lost"] = True

        def drain(w):
            nonlocal seen
            while w["job"] is not None and not w["lost"]:
                try:
                    if not w["conn"].poll():
                        return
                    kind, value = w["conn"].recv()
                except (EOFError, OSError):
                    w["lost"] = True
                    return
                if kind == "progress":
                    seen += value
                elif kind == "error":
                    raise value  # the worker's own error (an unreadable input is an OSError too)
                else:
                    results[w["job"]] = value
                    feed(w)

        def died(w):
            """The worker of an unfinished job is gone (its pipe broke or it exited): its exit status."""
            if w["lost"]:
                w["proc"].join(timeout=30)  # the pipe closes as the process ends: its status follows
                if w["proc"].is_alive():  # a pipe broken under a live worker: it cannot go on
                    w["proc"].kill()
                    w["proc"].join()
            return not w["proc"].is_alive()

        for w in workers:
            feed(w)
        while done < len(jobs):
            busy = [w for w in workers if w["job"] is not None]
            wait([w["conn"] for w in busy] + [w["proc"].sentinel for w in busy], timeout=0.2)
            for w in busy:
                drain(w)
                if w["job"] is not None and (w["lost"] or not w["proc"].is_alive()):
                    drain(w)  # what it sent just before it ended (its error) comes first
                    if w["job"] is not None and died(w):
                        raise DataError(f"{describe(jobs[w['job']])}: the worker process making its "
                                        f"records died (exit status {w['proc'].exitcode})")
            if not bar.disable:
                bar.n = min(bar.total, seen)
                bar.refresh()
            while done in results:
                yield results.pop(done)
                done += 1
        ok = True
    finally:
        for w in workers:
            if ok:
                with contextlib.suppress(OSError):
                    w["conn"].send(None)
            else:
                w["proc"].kill()
        for w in workers:
            w["proc"].join(timeout=10)
            if w["proc"].is_alive():
                w["proc"].kill()
                w["proc"].join()
            w["conn"].close()
