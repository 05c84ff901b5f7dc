"""What the user sees on stderr: log lines and progress.

Library code logs to ``logging.getLogger("bert_of")`` (stdout is for results) and shows long jobs
through :class:`Progress`. The entry points call :func:`setup_logging` once: INFO by default,
errors only with ``-q``, DEBUG with ``-v``; ranks other than 0 keep warnings and errors only.

A progress bar (tqdm) appears only when stderr is a terminal, logging is at INFO or below, this is
rank 0 and ``BERT_OF_DISABLE_PROGRESS_BARS`` is unset. Otherwise (a pipe, a log file, CI) a job
that runs longer than ``BERT_OF_PROGRESS_EVERY`` seconds (default 10) logs a plain line that
often: no carriage returns in logs.
"""

from __future__ import annotations

import logging
import os
import sys
import time

log = logging.getLogger("bert_of")

DISABLE_ENV = "BERT_OF_DISABLE_PROGRESS_BARS"
EVERY_ENV = "BERT_OF_PROGRESS_EVERY"
_PREFIX = {logging.WARNING: "warning: ", logging.ERROR: "bert-of: error: ", logging.CRITICAL: "bert-of: error: ",
           logging.DEBUG: "debug: "}
_bars = []  # open tqdm bars: log lines are written through tqdm.write while one is shown
_allowed = [True]  # --no-progress of the running command


def note(rt, msg: str) -> None:
    """A note for the user (the ``bert_of`` logger: stderr, -q silences it), from rank 0 only (``rt``:
    the run's Runtime, or None); a message starting "warning:" is a warning."""
    if rt is None or rt.is_main:
        (log.warning if msg.startswith("warning:") else log.info)(msg)


def _off(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


class _Formatter(logging.Formatter):
    def format(self, record):
        msg = record.getMessage()
        if record.levelno >= logging.WARNING and msg.startswith(("warning:", "note:", "bert-of:")):
            return msg  # already says what it is
        return _PREFIX.get(record.levelno, "") + msg


class _Handler(logging.Handler):
    """Writes to the current sys.stderr (tests and callers may swap it), above any open bar. The
    default one (installed on import, for library use) stays silent when the program configured
    the root logger: the record reaches the program's handlers instead."""

    def __init__(self, default: bool = False):
        super().__init__()
        self.default = default

    def emit(self, record):
        if self.default and logging.getLogger().handlers:
            return
        try:
            line = self.format(record)
            if _bars:
                from tqdm import tqdm

                tqdm.write(line, file=sys.stderr)
            else:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never take the command down
            self.handleError(record)


def _install(default: bool) -> None:
    for h in list(log.handlers):
        if isinstance(h, _Handler):
            log.removeHandler(h)
    handler = _Handler(default)
    handler.setFormatter(_Formatter())
    log.addHandler(handler)


def setup_logging(verbosity: int = 0) -> None:
    """Configure the ``bert_of`` logger for a command line: -1 = errors only (-q), 0 = info,
    1 = debug (-v); its lines go to stderr."""
    level = logging.ERROR if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    if _rank() > 0:
        level = max(level, logging.WARNING)
    _install(default=False)
    log.setLevel(level)


# Library use (no setup_logging): notes at INFO on stderr, as print() would, unless the program
# configured logging itself.
if not any(isinstance(h, _Handler) for h in log.handlers):
    _install(default=True)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


def allow_bars(allowed: bool) -> None:
    """``--no-progress``: no bars in this process (ranks it starts get the flag on their command line)."""
    _allowed[0] = bool(allowed)


def bars_enabled(stream=None) -> bool:
    """Whether a tqdm bar may be drawn now (see the module doc)."""
    if not _allowed[0] or _off(DISABLE_ENV) or _rank() > 0 or not log.isEnabledFor(logging.INFO):
        return False
    try:
        return bool((stream or sys.stderr).isatty())
    except (AttributeError, ValueError):
        return False


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get(EVERY_ENV, "10")))
    except ValueError:
        return 10.0


def _size(n: float, unit: str, scale: bool) -> str:
    if not scale:
        return f"{n:,.0f}"
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or prefix == "Ti":
            return f"{n:.0f} {prefix}{unit}" if not prefix else f"{n:.1f} {prefix}{unit}"
        n /= 1024
    return f"{n:.1f}"


class Progress:
    """Progress of one job: ``update(n)`` as work is done, ``close()`` at the end (or ``with``).

    ``total``: the amount of work (None: unknown); ``unit``: what is counted ("B" with
    ``unit_scale`` counts bytes). ``enabled=False`` shows nothing (e.g. a quiet caller).
    """

    def __init__(self, desc: str, total: float | None = None, unit: str = "it", unit_scale: bool = False,
                 initial: float = 0, enabled: bool = True):
        self.desc, self.total, self.unit, self.unit_scale = desc, total, unit, unit_scale
        self.n = initial
        self.postfix = {}
        self._bar = None
        self._enabled = enabled and _rank() <= 0  # OneFlow sets RANK=-1 in a process it did not launch
        self._t0 = self._last = time.monotonic()
        self._n0 = initial
        self._lines = 0
        if self._enabled and bars_enabled():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale,
                             unit_divisor=1024 if unit_scale else 1000, file=sys.stderr, dynamic_ncols=True,
                             mininterval=0.25, leave=False)
            _bars.append(self._bar)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def update(self, n: float = 1, **postfix) -> None:
        self.n += n
        if postfix:
            self.postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix(self.postfix, refresh=False)
            self._bar.update(n)
        elif self._enabled:
            now = time.monotonic()
            if now - self._last >= _every() and log.isEnabledFor(logging.INFO):
                self._last = now
                self._lines += 1
                log.info(self._line(now))

    def describe(self, desc: str) -> None:
        """What the job does now (a bar shows it at once; log lines from the next one on)."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description(desc)

    def _line(self, now: float) -> str:
        el = now - self._t0
        rate = (self.n - self._n0) / el if el > 0 else 0.0
        done = _size(self.n, self.unit, self.unit_scale)
        units = "" if self.unit_scale else f" {self.unit}" if self.unit == "it" else f" {self.unit}s"
        if self.total:
            pct = 100.0 * self.n / self.total
            left = (self.total - self.n) / rate if rate > 0 else None
            text = f"{done} of {_size(self.total, self.unit, self.unit_scale)}{units} ({pct:.0f}%)"
            eta = f", eta {left:.0f} s" if left is not None else ""
        else:
            text, eta = done + units, ""
        post = "".join(f", {k} {v}" for k, v in self.postfix.items())
        return f"{self.desc}: {text}, {el:.0f} s{eta}{post}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            if self._bar in _bars:
                _bars.remove(self._bar)
            self._bar = None
        elif self._enabled and self._lines and log.isEnabledFor(logging.INFO):
            log.info(self._line(time.monotonic()) + " (done)")
        self._enabled = False


def progress_iter(iterable, desc: str, total: float | None = None, unit: str = "it"):
    """Iterate while showing progress (total: len(iterable) when it has one)."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    with Progress(desc, total=total, unit=unit) as p:
        for item in iterable:
            yield item
            p.update(1)


__all__ = ["DISABLE_ENV", "EVERY_ENV", "Progress", "allow_bars", "bars_enabled", "log", "note", "progress_iter", "setup_logging"]
