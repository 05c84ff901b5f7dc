"""bert_of model zoo: a registry of real BERT checkpoints, verified resumable downloads, a cache.

    bert-of zoo list | info NAME | download NAME [--format of|tf|lazy|hf] | path NAME
    bert-of zoo verify NAME | remove NAME | add DIR --name NAME [--metadata FILE]

Python::

    from bert_of import zoo
    path = zoo.resolve("bert-base")           # a bert_of checkpoint folder; downloads on first use
    zoo.resolve("runs/final/")                # a bert_of checkpoint folder is returned as it is
    zoo.resolve("uncased_L-12_H-768_A-12/")   # any other format: converted once into the cache
    r = zoo.resolve_details("bert-base")      # (path, name, source_format, conversion, source_path)

The registry is data (``zoo/registry.json``; schema and merge rules in
``zoo/README.md``). Environment: ``BERT_OF_HOME`` (cache), ``BERT_OF_OFFLINE=1``,
``BERT_OF_ENDPOINT`` (mirror), ``BERT_OF_REGISTRY`` (extra registries,
``os.pathsep``-separated), ``BERT_OF_DOWNLOAD_{TIMEOUT,RETRIES,BACKOFF}``.
"""

from bert_of.zoo.core import FORMATS, Zoo, default_cache_dir
from bert_of.zoo.download import DownloadOptions
from bert_of.zoo.errors import (ChecksumError, DiskSpaceError, DownloadError, NotCachedError, OfflineError, RegistryError,
                                UnknownEntryError, UnsafeArchiveError, ZooError)
from bert_of.zoo.resolve import Resolved


def resolve(name_or_path, *, download: bool = True, vocab: str | None = None) -> str:
    """A bert_of checkpoint folder for ``name_or_path``.

    - a zoo name or alias: its cached folder, downloaded, verified and converted first when
      needed and ``download`` is true (never in offline mode: then a missing entry is an
      :class:`OfflineError`; with ``download=False`` a :class:`NotCachedError`);
    - a bert_of checkpoint folder: returned as it is;
    - a checkpoint in another format (tf folder or prefix, hf, h5, lazy): converted once into
      ``$BERT_OF_HOME/converted/`` and reused while the source is unchanged (``vocab``: for a
      source without a vocab.txt beside it).

    Anything else raises :class:`UnknownEntryError` (or the format detector's one-line error for
    a path that holds no checkpoint).
    """
    return Zoo().resolve(name_or_path, download=download, vocab=vocab)


def resolve_details(name_or_path, *, download: bool = True, vocab: str | None = None) -> Resolved:
    """As :func:`resolve`: ``Resolved(path, name, source_format, conversion, source_path)``.

    ``name`` is the entry's name or the source folder's; ``conversion`` the report of the
    conversion that produced ``path`` (None when ``path`` is the checkpoint given);
    ``source_path`` where the original files are (the path given, a `zoo add` folder, else
    ``path``).
    """
    return Zoo().resolve_details(name_or_path, download=download, vocab=vocab)


def resolve_for(option: str, name_or_path, *, vocab: str | None = None) -> Resolved:
    """:func:`resolve_details` for a command's option (``--model``, ``--init-checkpoint``): what
    pretraining and fine-tuning accept, with errors that name the option."""
    if not name_or_path:
        raise UnknownEntryError(f"{option}: expected a checkpoint (any format) or a zoo name")
    try:
        return resolve_details(name_or_path, vocab=vocab)
    except UnknownEntryError as e:
        raise UnknownEntryError(f"{option} {e}") from None


def is_zoo_name(name: str) -> bool:
    """True if ``name`` is an entry or alias of the (environment-configured) registries."""
    try:
        return Zoo(quiet=True).registry.lookup(name) is not None
    except ZooError:
        return False


__all__ = ["resolve", "resolve_details", "resolve_for", "Resolved", "is_zoo_name", "Zoo", "FORMATS", "DownloadOptions",
           "default_cache_dir", "ZooError", "RegistryError", "UnknownEntryError", "DownloadError", "ChecksumError",
           "UnsafeArchiveError", "OfflineError", "NotCachedError", "DiskSpaceError"]
