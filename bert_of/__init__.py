"""bert_of: BERT on OneFlow with exact, provenance-aware numerics.

Importing ``bert_of`` is cheap: OneFlow (~1 s, ~400 MB) loads only when a model
class is first touched, so converters and ``bert-of inspect`` stay light.
"""

import os as _os
import signal as _signal
import sys as _sys

# `bert-of` and `python -m bert_of...`: until a command runs there is nothing to clean up, so
# Ctrl-C during start-up ends the process at once and quietly, as for any program (Python's own
# handler would print a KeyboardInterrupt traceback from whichever import it interrupted).
# bert_of.cli installs the command's handlers when it starts.
_argv = getattr(_sys, "orig_argv", None) or _sys.argv
if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "bert-of" or \
        any(a == "-m" and b.startswith("bert_of") for a, b in zip(_argv, _argv[1:])):
    try:
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        # Threads native libraries start at import (NumPy's OpenBLAS pool, OneFlow's, TF's) must
        # never receive Ctrl-C / SIGTERM: a signal they take runs whatever C handler is installed
        # at that moment (OneFlow installs one that calls exit(-1)). Threads inherit the mask of
        # the thread that starts them, so NumPy is imported with both blocked; bert_of._flow does
        # the same for OneFlow.
        _mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT, _signal.SIGTERM})
        try:
            import numpy as _numpy  # noqa: F401
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, _mask)
    except ValueError:  # not the main thread: not a command line's start-up
        pass

from bert_of.config import BertConfig  # noqa: E402 - after the start-up signal disposition
from bert_of.errors import BertOfError, CheckpointError, ConfigError  # noqa: E402
from bert_of.hooks import register_resolver  # noqa: E402
from bert_of.version import __version__  # noqa: E402

_LAZY = {
    "BertModel": "bert_of.modeling",
    "BertForPreTraining": "bert_of.modeling",
    "BertForQuestionAnswering": "bert_of.modeling",
    "BertForSequenceClassification": "bert_of.modeling",
    "BertModelOutput": "bert_of.outputs",
    "BertGraph": "bert_of.modeling",
    "BertTokenizer": "bert_of.tokenizer",
}

__all__ = ["BertConfig", "BertOfError", "CheckpointError", "ConfigError", "__version__", *_LAZY]


def _resolve_with_zoo(name_or_path: str) -> str:
    """Zoo names and checkpoints in other formats, for ``from_pretrained`` (bert_of.checkpoint.resolve_checkpoint)."""
    from bert_of.zoo import resolve  # the zoo loads on the first name or foreign format, not with bert_of

    return resolve(name_or_path)


register_resolver(_resolve_with_zoo)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bert_of' has no attribute {name!r}")
