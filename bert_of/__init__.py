"""bert_of: BERT on OneFlow with exact, provenance-aware numerics.

Importing ``bert_of`` is cheap: OneFlow (~1 s, ~400 MB) loads only when a model
class is first touched, so converters and ``bert-of inspect`` stay light, and run without OneFlow
installed (it is the ``oneflow`` extra: a model class without it raises ImportError naming it). Importing it (and
OneFlow through it) leaves the process as it was: no signal handler, mask, file descriptor or
environment variable changes; a command line sets its process up explicitly (bert_of.runtime.process).
"""

from bert_of.config import BertConfig
from bert_of.errors import BertOfError, CheckpointError, ConfigError, InputError, InputTypeError, NeedsOneFlow
from bert_of.resolver import register_resolver, register_writer
from bert_of.version import __version__

_LAZY = {
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
