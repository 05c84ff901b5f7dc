"""bert_of model zoo: a registry of real BERT checkpoints, verified resumable downloads, a cache.

    bert-of zoo list | info NAME | download NAME [--format of|tf|lazy|hf] | path NAME
    bert-of zoo verify NAME | remove NAME | add DIR --name NAME [--metadata FILE]

Python::

    from bert_of import zoo
    path = zoo.resolve("bert-base")     # a bert_of checkpoint folder; downloads on first use
    zoo.resolve("some/dir/")            # an existing directory is returned unchanged

The registry is data (``zoo/registry.json``; schema and merge rules in
``zoo/README.md``). Environment: ``BERT_OF_HOME`` (cache), ``BERT_OF_OFFLINE=1``,
``BERT_OF_ENDPOINT`` (mirror), ``BERT_OF_REGISTRY`` (extra registries,
``os.pathsep``-separated), ``BERT_OF_DOWNLOAD_{TIMEOUT,RETRIES,BACKOFF}``.
"""

from bert_of.zoo.core import FORMATS, Zoo, default_cache_dir
from bert_of.zoo.download import DownloadOptions
from bert_of.zoo.errors import (ChecksumError, DiskSpaceError, DownloadError, NotCachedError, OfflineError, RegistryError,
                        UnknownEntryError, UnsafeArchiveError, ZooError)


def resolve(name_or_path: str, download: bool = True, format: str = "of") -> str:  # noqa: A002 - CLI word
    """A local checkpoint folder for a zoo name or alias (``bert-base``), or ``name_or_path`` itself.

    An existing directory is returned unchanged. A zoo name is looked up in the
    registries (environment-configured) and its cached folder returned,
    downloading, verifying and converting it first when needed and
    ``download`` is true (never in offline mode: then a missing entry is an
    :class:`OfflineError`). Anything else raises :class:`UnknownEntryError`.
    """
    import os

    if os.path.isdir(name_or_path):
        return name_or_path
    return Zoo().resolve(name_or_path, download=download, fmt=format)


def is_zoo_name(name: str) -> bool:
    """True if ``name`` is an entry or alias of the (environment-configured) registries."""
    try:
        return Zoo(quiet=True).registry.lookup(name) is not None
    except ZooError:
        return False


__all__ = ["resolve", "is_zoo_name", "Zoo", "FORMATS", "DownloadOptions", "default_cache_dir", "ZooError",
           "RegistryError", "UnknownEntryError", "DownloadError", "ChecksumError", "UnsafeArchiveError",
           "OfflineError", "NotCachedError", "DiskSpaceError"]
