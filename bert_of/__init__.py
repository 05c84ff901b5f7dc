"""bert_of: BERT on OneFlow with exact, provenance-aware numerics.

Importing ``bert_of`` is cheap: OneFlow (~1 s, ~400 MB) loads only when a model
class is first touched, so converters and ``bert-of inspect`` stay light, and run without OneFlow
installed (it is the ``oneflow`` extra: a model class without it raises ImportError naming it). Importing it (and
OneFlow through it) leaves the process as it was: no signal handler, mask, file descriptor or
environment variable changes; a command line sets its process up explicitly (bert_of.runtime.process).
The one exception: when this import is a ``bert-of`` command line's first (``python -m bert_of...``,
the ``bert-of`` script), Ctrl-C is taken first thing, before the imports below (one line, the process
ends by SIGINT; setup() then installs the command's own handler), as no traceback may reach the user.
"""

import sys as _sys

if _sys.argv[:1] == ["-m"] or _sys.argv[0].endswith(("/bert-of", "\\bert-of", "bert-of.exe")):

    import _signal  # the C module: `signal` imports enum, a window of its own

    def _interrupted_at_start(signum, frame):
        import os

        _sys.stderr.write("bert-of: error: interrupted\n")
        _sys.stderr.flush()
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # ends by the signal: the shell sees 130 (and a loop stops)

    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # Python's own: no one else's
        _signal.signal(_signal.SIGINT, _interrupted_at_start)

from bert_of.errors import BertOfError, CheckpointError, ConfigError, InputError, InputTypeError, NeedsOneFlow
from bert_of.resolver import register_resolver, register_writer
from bert_of.version import __version__

_LAZY = {
    "BertConfig": "bert_of.config",  # lazy too: `bert-of` imports this package before it can take Ctrl-C
    "BertModel": "bert_of.modeling",
    "BertForPreTraining": "bert_of.heads",
    "BertForMaskedLM": "bert_of.heads",
    "BertForQuestionAnswering": "bert_of.heads",
    "BertForSequenceClassification": "bert_of.heads",
    "BertForTokenClassification": "bert_of.heads",
    "BertModelOutput": "bert_of.outputs",
    "BertGraph": "bert_of.modeling",
    "BertTokenizer": "bert_of.tokenizer",
}

__all__ = ["BertConfig", "BertOfError", "CheckpointError", "ConfigError", "InputError", "InputTypeError", "__version__",
           *_LAZY]


def _resolve_with_zoo(name_or_path: str, vocab=None) -> str:
    """Zoo names and checkpoints in other formats, for ``from_pretrained`` (bert_of.checkpoint.resolve_checkpoint);
    ``vocab``: for a source without a vocab.txt."""
    from bert_of.zoo import resolve  # the zoo loads on the first name or foreign format, not with bert_of

    return resolve(name_or_path, vocab=vocab)


register_resolver(_resolve_with_zoo)


def _write_with_converters(fmt: str, config, tensors: dict, vocab_file, folder: str) -> list:
    """A model's tensors as format ``fmt``'s files in ``folder``, by that format's writer (for
    ``save_pretrained(path, format=...)``; bert_of.resolver.writer)."""
    from bert_of.converters.convert import write_model  # the converters load on the first such save

    return write_model(fmt, config, tensors, vocab_file, folder)


register_writer(_write_with_converters)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name])
        except NeedsOneFlow:
            raise NeedsOneFlow(f"bert_of.{name}") from None
        return getattr(module, name)
    raise AttributeError(f"module 'bert_of' has no attribute {name!r}")
