"""Zoo errors: one line each, naming the entry, file or URL concerned.

All derive from :class:`bert_of.errors.BertOfError`, so ``bert-of`` prints them
as ``bert-of: error: ...`` and exits 1.
"""

from bert_of.errors import BertOfError


class ZooError(BertOfError):
    """Anything the zoo cannot do as asked."""


class RegistryError(ZooError):
    """A registry file that cannot be read or does not follow the schema."""


class UnknownEntryError(ZooError):
    """A name that is neither an entry, an alias nor an existing directory."""


class DownloadError(ZooError):
    """The network (or a file:// source) did not deliver the file."""


class ChecksumError(ZooError):
    """A file whose SHA-256 (or size) differs from the registry's."""


class UnsafeArchiveError(ZooError):
    """An archive member that would land outside its folder (.., absolute, link, device)."""


class OfflineError(ZooError):
    """Offline mode and the entry is not in the cache."""


class NotCachedError(ZooError):
    """The entry is not downloaded (and downloading was not allowed)."""


class DiskSpaceError(ZooError):
    """Not enough free space for the download, extraction and conversion."""
