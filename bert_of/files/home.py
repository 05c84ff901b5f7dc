"""Where bert_of keeps its stores, and the time stamp its records carry."""

from __future__ import annotations

import datetime
import os


def utc_now() -> str:
    """The current UTC time as ISO 8601 to the second, e.g. ``2026-12-01T10:00:00Z``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def bert_of_home() -> str:
    """Where bert_of keeps its zoo cache and results store: ``$BERT_OF_HOME``, else
    ``$XDG_CACHE_HOME/bert_of``, else ``~/.cache/bert_of``."""
    env = os.environ.get("BERT_OF_HOME")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "bert_of")
