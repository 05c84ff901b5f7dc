"""Errors that reach the user as one line.

The CLI prints ``str(err)`` of a :class:`BertOfError` on a single line and exits
non-zero; anything else is a bug and keeps its traceback.
"""


class BertOfError(Exception):
    """A problem with the user's input (file, tensor, shape, config)."""


class CheckpointError(BertOfError):
    """A checkpoint that cannot be read, written or mapped as asked."""


class UnsafeContent(CheckpointError):
    """A file that asks for code to run (a pickle naming a global outside the admitted data types):
    refused, nothing executed. Never reported as anything else (not "another format's file")."""


class SourceChanged(CheckpointError):
    """A checkpoint replaced by another one (``--overwrite``) while it was being read: reading it
    again gives one whole checkpoint."""


class MissingVocab(CheckpointError):
    """A checkpoint that needs a vocabulary and holds none (an HF folder of model files only). The
    message names the command line's ``--vocab``; the Python API re-raises it with
    :meth:`spelled` naming its own keyword (``vocab=``)."""

    def __init__(self, where: str, how: str = "pass --vocab"):
        super().__init__(f"{where}: no vocab.txt; a bert_of checkpoint needs one (HuggingFace and Keras "
                         f"directories often lack it: {how})")
        self.where = where

    def spelled(self, how: str) -> "MissingVocab":
        return MissingVocab(self.where, how)


class ConfigError(BertOfError):
    """A config that is missing, malformed, or does not fit the tensors."""


class InputError(BertOfError, ValueError):
    """Model inputs that do not fit the model: a token id outside the vocabulary, a token type
    outside ``type_vocab_size``, a sequence longer than ``max_position_embeddings``, an empty
    batch, a mask or labels of the wrong shape or range (:mod:`bert_of.inputs`). A ValueError,
    as Python's own checks of a value."""


class InputTypeError(InputError, TypeError):
    """Model inputs of the wrong kind: token ids that are not integers, a mask that is not numbers."""


class OutputError(BertOfError):
    """A destination that cannot be written as asked: it exists, another process is writing it,
    it is not a directory, or the disk is full."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``timeout``, ``kill`` and job schedulers send), raised by the command line's
    handler like Ctrl-C's KeyboardInterrupt: it unwinds every ``with publishing(...)`` (staging
    folders are removed) and is neither an error nor an ``Exception``."""


ONEFLOW_INSTALL = "pip install 'bert_of[oneflow]' (Python 3.10)"


class NeedsOneFlow(BertOfError, ImportError):
    """Something that runs bert_of's model (the model classes, training, fine-tuning, prediction,
    evaluation runs, align, selftest) was asked for and OneFlow is not installed: it is the
    ``oneflow`` extra, and OneFlow 0.9 has wheels for Python 3.10 only. An ImportError (what
    ``from bert_of import BertModel`` raises) and a BertOfError (what a command prints as one line)."""

    def __init__(self, what: str = "bert_of's model"):
        import sys

        here = "" if sys.version_info[:2] == (3, 10) else f"; this is Python {sys.version_info[0]}.{sys.version_info[1]}"
        super().__init__(f"{what} needs OneFlow: {ONEFLOW_INSTALL}{here}", name="oneflow")
        self.what = what
