"""Errors of the evaluation layer: one line each, naming the file and the record.

All derive from :class:`bert_of.errors.BertOfError`, so ``bert-of`` prints them as
``bert-of: error: ...`` and exits 1.
"""

from bert_of.errors import BertOfError


class EvalDataError(BertOfError):
    """A data file (SQuAD json, GLUE tsv) that is malformed or inconsistent."""


class PredictionsError(BertOfError):
    """A predictions / na-prob file that does not fit the data it is scored against."""


class ResultsError(BertOfError):
    """A results store that cannot be read or written."""
