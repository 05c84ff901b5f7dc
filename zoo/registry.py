"""Registries: JSON files of entries, validated and merged by name.

Order (later wins, whole entry by name; see zoo/README.md):

1. ``zoo/registry.json`` shipped with bert_of (Google's releases);
2. ``<cache>/registry.local.json`` (entries made by ``bert-of zoo add``);
3. the files in ``BERT_OF_REGISTRY`` (``os.pathsep``-separated), in order;
4. the ``--registry FILE`` flags, in order.

An entry that overrides another replaces it whole (its aliases too). A name
is looked up as an entry name first, then as an alias; when two entries claim
one alias, the later registry's entry has it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field

from bert_of.files.atomic import write_json
from bert_of.files.reading import read_json
from bert_of.converters import registry as formats
from bert_of.progress import log
from bert_of.zoo.errors import RegistryError, UnknownEntryError


SCHEMA_VERSION = 1
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "registry.json")
LOCAL_NAME = "registry.local.json"
SOURCE_FORMATS = formats.names()  # what an entry's archive may hold: every registered format
ARCHIVES = ("zip", "tar", "tar.gz", "none")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SHA_RE = re.compile(r"^[0-9a-fA-F]{64}$")
# Registry URLs under this prefix are rewritten by an endpoint override (BERT_OF_ENDPOINT / --endpoint)
# unless the entry names its own "endpoint_prefix".
DEFAULT_ENDPOINT_PREFIX = "https://storage.googleapis.com/"


@dataclass
class Registry:
    entries: dict = field(default_factory=dict)  # name -> entry (with "_registry": source file)
    aliases: dict = field(default_factory=dict)  # alias -> name
    sources: list = field(default_factory=list)  # files read, in order

    def lookup(self, name: str):
        if name in self.entries:
            return self.entries[name]
        if name in self.aliases:
            return self.entries[self.aliases[name]]
        low = name.lower()  # names are case-insensitive when unambiguous
        hits = [n for n in self.entries if n.lower() == low] or \
            [self.aliases[a] for a in self.aliases if a.lower() == low]
        if len(set(hits)) == 1:
            return self.entries[hits[0]]
        return None

    def get(self, name: str) -> dict:
        e = self.lookup(name)
        if e is None:
            raise UnknownEntryError(f"{name}: not a zoo entry{self._suggest(name)} (`bert-of zoo list` shows them all)")
        return e

    def _suggest(self, name):
        close = difflib.get_close_matches(name, list(self.entries) + list(self.aliases), n=3, cutoff=0.6)
        return f"; did you mean {', '.join(close)}?" if close else ""

    def names(self):
        return list(self.entries)


def _err(where, msg):
    return RegistryError(f"{where}: {msg}")


def _check_rel(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "\\" not in path


def validate_entry(e, where: str) -> dict:
    """Check one entry against the schema; returns it with defaults filled in."""
    if not isinstance(e, dict):
        raise _err(where, "an entry must be a JSON object")
    name = e.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _err(where, f"entry name {name!r} must match {NAME_RE.pattern} (it becomes a directory name)")
    w = f"{where}: entry {name!r}"
    e = dict(e)
    aliases = e.setdefault("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and NAME_RE.match(a) for a in aliases):
        raise _err(w, f"aliases must be a list of names matching {NAME_RE.pattern}")
    fmt = e.setdefault("source_format", "tf")
    if fmt not in SOURCE_FORMATS:
        raise _err(w, f"source_format {fmt!r} is not one of {', '.join(SOURCE_FORMATS)}")
    has_files, has_path = "files" in e, "path" in e
    if has_files == has_path:
        raise _err(w, "needs exactly one of 'files' (to download) or 'path' (a local checkpoint)")
    if has_files:
        archive = e.setdefault("archive", "zip")
        if archive not in ARCHIVES:
            raise _err(w, f"archive {archive!r} is not one of {', '.join(ARCHIVES)}")
        files = e["files"]
        if not isinstance(files, list) or not files:
            raise _err(w, "'files' must be a non-empty list of {url, filename?, sha256?, size?}")
        if archive != "none" and len(files) != 1:
            raise _err(w, f"an archive entry ({archive}) has exactly one file")
        norm = []
        for i, f in enumerate(files):
            if isinstance(f, str):
                f = {"url": f}
            if not isinstance(f, dict) or not isinstance(f.get("url"), str):
                raise _err(w, f"files[{i}] needs a 'url' string")
            f = dict(f)
            parsed = urllib.parse.urlsplit(f["url"])
            if parsed.scheme not in ("http", "https", "file"):
                raise _err(w, f"files[{i}].url {f['url']!r}: scheme must be http, https or file")
            fname = f.get("filename") or os.path.basename(urllib.parse.unquote(parsed.path))
            if not re.match(r"^[\w.+-]+$", fname) or fname in (".", ".."):
                raise _err(w, f"files[{i}]: cannot use {fname!r} as a file name "
                              "(a plain name: letters, digits, . _ + -)")
            f["filename"] = fname
            sha = f.get("sha256")
            if sha is not None and (not isinstance(sha, str) or not SHA_RE.match(sha)):
                raise _err(w, f"files[{i}].sha256 must be 64 hex digits or null")
            size = f.get("size")
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
                raise _err(w, f"files[{i}].size must be a byte count or null")
            norm.append(f)
        if len({f["filename"] for f in norm}) != len(norm):
            raise _err(w, "two files share a file name")
        e["files"] = norm
    else:
        if not isinstance(e["path"], str) or not e["path"]:
            raise _err(w, "'path' must be a directory path")
    cs = e.setdefault("contents_sha256", None)
    if cs is not None:
        if not isinstance(cs, dict) or not all(isinstance(k, str) and _check_rel(k) and isinstance(v, str)
                                               and SHA_RE.match(v) for k, v in cs.items()):
            raise _err(w, "contents_sha256 must map relative file names to 64-hex SHA-256 values")
    ef = e.setdefault("expected_files", sorted(cs) if cs else [])
    if not isinstance(ef, list) or not all(isinstance(x, str) and _check_rel(x) for x in ef):
        raise _err(w, "expected_files must be a list of relative file names")
    ev = e.setdefault("evaluation", [])
    if not isinstance(ev, list):
        raise _err(w, "evaluation must be a list")
    for i, r in enumerate(ev):
        if not isinstance(r, dict) or not isinstance(r.get("task"), str) or not isinstance(r.get("metrics"), dict):
            raise _err(w, f"evaluation[{i}] needs 'task' (string) and 'metrics' (object)")
        if not isinstance(r.get("source"), str) or not r["source"]:
            raise _err(w, f"evaluation[{i}] ({r['task']}) needs a 'source' saying where the numbers come from")
    ep = e.get("endpoint_prefix")
    if ep is not None and not isinstance(ep, str):
        raise _err(w, "endpoint_prefix must be a URL prefix string")
    return e


def load_file(path: str) -> list:
    """Validated entries of one registry file (in file order); any fault is a RegistryError."""
    data = read_json(path, "registry", error=RegistryError)
    if not isinstance(data.get("entries"), list):
        raise RegistryError(f"{path}: a registry is a JSON object with an 'entries' list (see zoo/README.md)")
    v = data.get("schema_version", SCHEMA_VERSION)
    if v != SCHEMA_VERSION:
        raise RegistryError(f"{path}: schema_version {v!r} is not supported (this bert_of reads {SCHEMA_VERSION})")
    out, seen = [], set()
    for i, e in enumerate(data["entries"]):
        e = _placed(validate_entry(e, f"{path}: entries[{i}]"), path)
        if e["name"] in seen:
            raise RegistryError(f"{path}: entry {e['name']!r} appears twice")
        seen.add(e["name"])
        out.append(e)
    return out


def load_local(path: str, warn: bool = True) -> tuple:
    """(entries, damaged) of the local registry that ``zoo add`` writes; never fatal.

    It is rewritten whole and atomically, so damage comes from outside (a disk error, an editor, a
    copy cut short): a file that is not a whole registry gives the entries readable before the
    damage (``damaged`` True), an entry that breaks the schema is skipped, each with a warning, so
    the shipped registry and every ``bert-of zoo`` command keep working.
    """
    say = log.warning if warn else (lambda *a: None)
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return [], False
    except OSError as e:
        say("%s: cannot read it (%s); its entries are left out", path, e.strerror)
        return [], False
    damaged = False
    try:
        data = json.loads(text)
        items = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ValueError("no 'entries' list")
    except (ValueError, RecursionError):
        items, damaged = _salvage(text), True
        say("%s: damaged (not a whole registry); using the %d entr%s readable before the damage "
            "(the next `bert-of zoo add` or `remove` rewrites it, keeping a copy)", path, len(items),
            "y" if len(items) == 1 else "ies")
    else:
        if data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
            say("%s: schema_version %r is not supported (this bert_of reads %d); its entries are left out", path,
                data["schema_version"], SCHEMA_VERSION)
            return [], False
    out = {}
    for i, e in enumerate(items):
        try:
            e = _placed(validate_entry(e, f"{path}: entries[{i}]"), path)
        except RegistryError as err:
            say("%s; entry skipped", err)
            continue
        out.pop(e["name"], None)  # the later of two wins, as across registries
        out[e["name"]] = e
    return list(out.values()), damaged


def _salvage(text: str) -> list:
    """The entry objects of a damaged registry text, in order, up to the first one that does not parse."""
    m = re.search(r'"entries"\s*:\s*\[', text)
    if not m:
        return []
    dec, pos, out = json.JSONDecoder(), m.end(), []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            return out
        try:
            obj, pos = dec.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return out
        out.append(obj)


def _placed(e: dict, path: str) -> dict:
    """Note the file an entry comes from; a relative local path is relative to that file."""
    e["_registry"] = os.path.abspath(path)
    if "path" in e and not os.path.isabs(e["path"]):
        e["path"] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), e["path"]))
    return e


def merge(paths: list, lenient=()) -> Registry:
    """Read ``paths`` in order; later entries replace earlier ones with the same name (whole entry).

    Files in ``lenient`` (the local registry) are read with :func:`load_local`: damage there is a
    warning, never an error."""
    reg = Registry()
    order = []
    for p in paths:
        for e in (load_local(p)[0] if p in lenient else load_file(p)):
            if e["name"] in reg.entries:
                order.remove(e["name"])
            reg.entries[e["name"]] = e
            order.append(e["name"])
        reg.sources.append(os.path.abspath(p))
    reg.entries = {n: reg.entries[n] for n in order}
    # aliases: in registry order, later entries win; a name always beats an alias
    rank = {p: i for i, p in enumerate(reg.sources)}
    for e in sorted(reg.entries.values(), key=lambda e: rank.get(e["_registry"], -1)):
        for a in e["aliases"]:
            if a not in reg.entries:
                reg.aliases[a] = e["name"]
    return reg


def write_file(path: str, entries: list) -> None:
    """Write a registry file atomically (entries without the private '_' keys)."""
    data = {"schema_version": SCHEMA_VERSION,
            "entries": [{k: v for k, v in e.items() if not k.startswith("_")} for e in entries]}
    try:
        write_json(path, data, indent=1)
    except ValueError as e:  # NaN or inf from a metadata file: not JSON, so never written
        raise RegistryError(f"{path}: cannot write the registry: {e}") from None


def effective_url(entry: dict, url: str, endpoint) -> str:
    """``url`` after the endpoint override.

    With an endpoint E, a URL that starts with the entry's ``endpoint_prefix``
    (default ``https://storage.googleapis.com/``) has that prefix replaced by
    E (a trailing ``/`` is added to E if missing). Other URLs are unchanged.
    """
    if not endpoint:
        return url
    prefix = entry.get("endpoint_prefix") or DEFAULT_ENDPOINT_PREFIX
    if url.startswith(prefix):
        return endpoint.rstrip("/") + "/" + url[len(prefix):]
    return url


def squad_v11(entry: dict):
    """(EM, F1, source) of the first SQuAD v1.1 result with both numbers, else None."""
    for r in entry.get("evaluation") or []:
        m = r.get("metrics", {})
        if r.get("task", "").lower().startswith("squad v1.1") and "exact_match" in m and "f1" in m:
            return m["exact_match"], m["f1"], r.get("source")
    return None
