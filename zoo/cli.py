"""``bert-of zoo ...``: the model zoo's command line.

``add_parser(subparsers)`` adds ``zoo`` to the ``bert-of`` parser. Every command's
function takes the parsed ``args`` and returns an exit code; zoo errors are
bert_of errors, printed as one ``bert-of: error:`` line by ``bert_of.cli.dispatch``.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from bert_of.cli_grammar import add_command, examples
from bert_of.options import arg, from_args
from bert_of.progress import log
from bert_of.zoo.core import FORMATS, Zoo
from bert_of.zoo.download import DownloadOptions, human_size
from bert_of.zoo.errors import ChecksumError

DESCRIPTION = ("Model zoo: Google's released BERT checkpoints (and your own), downloaded resumably, "
               "SHA-256 verified, extracted safely, converted to bert_of with a forward-equality check, cached.")

ENV_HELP = """environment:
  BERT_OF_HOME       cache folder (default ~/.cache/bert_of, or $XDG_CACHE_HOME/bert_of)
  BERT_OF_OFFLINE=1  never touch the network; a missing entry is an error
  BERT_OF_ENDPOINT   mirror URL replacing https://storage.googleapis.com/ in registry URLs
                     (http://host/path/ or file:///mnt/mirror/)
  BERT_OF_REGISTRY   extra registry files, separated by '%s' (later ones override earlier, by name)
  BERT_OF_DOWNLOAD_TIMEOUT / _RETRIES / _BACKOFF   download timeout (s), retries, first backoff (s)
""" % os.pathsep
EPILOG = examples("bert-of zoo list", "bert-of zoo download bert-base-uncased", "bert-of zoo info bert-base",
                  "bert-of zoo add run/final --name my-mini-bert") + "\n\n" + ENV_HELP


# --------------------------------------------------------------------------- options

ZOO = "zoo options"
NAME_HELP = "registry name or alias (case-insensitive), e.g. bert-base-uncased, bert-base"
FORMAT_HELP = "of: bert_of checkpoint; tf: Google's files as published; lazy/hf: converted"
DEFAULT_FORMAT = "of"


@dataclass(kw_only=True)
class ZooOptions:
    """What every ``bert-of zoo`` command takes: where the registry and the cache are."""

    registry: list = arg(default_factory=list, metavar="FILE", group=ZOO,
                         help="extra registry file (repeatable; after BERT_OF_REGISTRY; later files override by name)")
    cache_dir: str | None = arg(None, metavar="DIR", group=ZOO, help="cache folder (unset: BERT_OF_HOME or "
                                                                      "~/.cache/bert_of)")
    offline: bool | None = arg(None, group=ZOO, help="never touch the network (as BERT_OF_OFFLINE=1)")
    endpoint: str | None = arg(None, metavar="URL", group=ZOO,
                               help="mirror replacing https://storage.googleapis.com/ in registry URLs (as "
                                    "BERT_OF_ENDPOINT)")


@dataclass(kw_only=True)
class ListOptions(ZooOptions):
    downloaded: bool = arg(False, help="only entries in the cache (or local)")
    json: bool = arg(False, help="print the entries as JSON on stdout")


@dataclass(kw_only=True)
class InfoOptions(ZooOptions):
    name: str = arg(positional=True, metavar="NAME", help=NAME_HELP)
    json: bool = arg(False, help="print the entry as JSON on stdout")


@dataclass(kw_only=True)
class FetchOptions(ZooOptions):
    name: str = arg(positional=True, metavar="NAME", help=NAME_HELP)
    format: str = arg(DEFAULT_FORMAT, choices=FORMATS, help=FORMAT_HELP)
    no_verify: bool = arg(False, help="skip the forward-equality check after converting")
    force: bool = arg(False, help="download and build again even if cached")
    keep_archive: bool = arg(False, help="keep the downloaded archive in the cache")
    timeout: float | None = arg(None, metavar="S", help="seconds for the connection and each read (unset: "
                                                        "BERT_OF_DOWNLOAD_TIMEOUT, else the downloader's)")
    retries: int | None = arg(None, metavar="N", help="retries without progress before giving up (unset: "
                                                      "BERT_OF_DOWNLOAD_RETRIES, else the downloader's)")


@dataclass(kw_only=True)
class PathOptions(ZooOptions):
    name: str = arg(positional=True, metavar="NAME", help=NAME_HELP)
    format: str = arg(DEFAULT_FORMAT, choices=FORMATS, help=FORMAT_HELP)


@dataclass(kw_only=True)
class CachedOptions(ZooOptions):
    """``zoo verify`` and ``zoo remove``: every cached format, or one."""

    name: str = arg(positional=True, metavar="NAME", help=NAME_HELP)
    format: str | None = arg(None, choices=FORMATS, help="only this cached format (unset: every cached one)")


@dataclass(kw_only=True)
class AddOptions(ZooOptions):
    dir: str = arg(positional=True, metavar="DIR", help="the checkpoint folder (any format bert-of convert reads)")
    name: str = arg(metavar="NAME", help="the entry's name in the zoo")
    alias: list = arg(default_factory=list, metavar="NAME", help="another name for it (repeatable)")
    metadata: str | None = arg(None, metavar="FILE", help="JSON: training metadata and evaluation results")
    description: str | None = arg(None, metavar="TEXT", help="one line shown by zoo info")
    overwrite: bool = arg(False, help="replace an entry or alias of the same name")


@dataclass(kw_only=True)
class CacheListOptions(ZooOptions):
    json: bool = arg(False, help="print the items as JSON on stdout")


@dataclass(kw_only=True)
class CacheRemoveOptions(ZooOptions):
    ids: list = arg(positional=True, nargs="+", metavar="ID", help="what to remove")


@dataclass(kw_only=True)
class CachePruneOptions(ZooOptions):
    dry_run: bool = arg(False, help="say what would be removed; remove nothing")


def _zoo(args) -> Zoo:
    return Zoo(cache_dir=args.cache_dir, registries=args.registry, offline=args.offline, endpoint=args.endpoint,
               download_options=DownloadOptions.from_env(timeout=getattr(args, "timeout", None),
                                                         retries=getattr(args, "retries", None)),
               quiet=False)  # -q: the bert_of logger's level


def _params(n) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


# --------------------------------------------------------------------------- commands


def cmd_list(args) -> int:
    args = from_args(ListOptions, args)
    z = _zoo(args)
    rows = z.rows()
    if args.downloaded:
        rows = [r for r in rows if r["downloaded"]]
    if args.json:
        print(json.dumps({"cache_dir": z.cache_dir, "registries": z.registry.sources, "entries": rows}, indent=1))
        return 0
    table = [("NAME", "ALIAS", "PARAMS", "SIZE", "FORMAT", "DOWNLOADED", "SQuAD1.1 EM/F1")]
    for r in rows:
        size = "?" if r["size"] is None else ("" if r["size_exact"] else "~") + human_size(r["size"])
        sq, ms = r["squad_v11"], r.get("squad_v11_measured")
        cells = ([f"{sq['exact_match']:.2f}/{sq['f1']:.2f}"] if sq else []) + \
            ([f"{ms['exact_match']:.2f}/{ms['f1']:.2f}*"] if ms else [])
        table.append((r["name"], r["aliases"][0] if r["aliases"] else "", _params(r["params"]), size,
                      r["source_format"], ",".join(r["downloaded"]) or "-", " ".join(cells) or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) if i not in (2, 3) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     .rstrip())
    print(f"\n{len(rows)} entries; cache {z.cache_dir}" + (" (offline)" if z.offline else ""))
    print("SIZE: on disk when downloaded, else the archive's (~ estimated: 4 bytes per parameter). "
          "FORMAT: as published (tf = Google TF1). SQuAD: first published v1.1 dev result (`zoo info NAME` "
          "lists all, with sources).")
    if any(r.get("squad_v11_measured") for r in rows):
        print(f"*: measured here: the latest `bert-of eval squad` result on SQuAD v1.1 of the checkpoint or of a model "
              f"fine-tuned from it ({z.results_path}; `bert-of results` lists them).")
    return 0


def cmd_info(args) -> int:
    args = from_args(InfoOptions, args)
    z = _zoo(args)
    info = z.info(args.name)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    p = print
    p(f"{info['name']}" + (f"  (aliases: {', '.join(info['aliases'])})" if info["aliases"] else ""))
    if info.get("description"):
        p(f"  {info['description']}")
    p(f"  registry:      {info['registry']}")
    p(f"  source format: {info['source_format']}" + (f", archive {info['archive']}" if info.get("archive") else ""))
    if info.get("path"):
        p(f"  local folder:  {info['path']}")
    for i, f in enumerate(info.get("files", [])):
        p(f"  url:           {f['url']}")
        if info.get("effective_urls") and info["effective_urls"][i] != f["url"]:
            p(f"    via mirror:  {info['effective_urls'][i]}")
        if f.get("sha256") or f.get("size"):
            p(f"    archive:     sha256 {f.get('sha256') or '-'}  size {f.get('size') or '-'}")
    cs = info.get("contents_sha256")
    if cs:
        p("  SHA-256 of the extracted files" + (f" ({info['provenance'].get('checksums_source')})"
                                                 if info.get("provenance", {}).get("checksums_source") else "") + ":")
        for k, v in cs.items():
            p(f"    {v}  {k}")
    elif info.get("files"):
        p("  SHA-256 of the extracted files: not published (recorded in the cache manifest at first download)")
    if info.get("files_sha256"):
        p("  SHA-256 recorded by `zoo add`:")
        for k, v in info["files_sha256"].items():
            p(f"    {v}  {k}")
    c = info.get("config") or {}
    if c:
        p("  config:        " + " ".join(f"{k}={c[k]}" for k in ("L", "H", "A", "I", "V", "P", "T") if k in c)
          + (f" act={c['hidden_act']}" if c.get("hidden_act") else "")
          + (f" ln_eps={c['layer_norm_eps']:g}" if c.get("layer_norm_eps") else "")
          + (f" lowercase={c['lowercase']}" if "lowercase" in c and c["lowercase"] is not None else ""))
    p(f"  parameters:    {info.get('params'):,}" if info.get("params") else "  parameters:    ?")
    if info.get("size_bytes"):
        p(f"  size:          {human_size(info['size_bytes'])}")
    elif info.get("size_estimate_bytes"):
        p(f"  size:          ~{human_size(info['size_estimate_bytes'])} (estimate: 4 bytes per parameter)")
    p(f"  license:       {info.get('license', '?')}")
    prov = info.get("provenance") or {}
    for k, v in prov.items():
        if k != "checksums_source":
            p(f"  {k + ':':<14} {v if not isinstance(v, (list, dict)) else json.dumps(v)}")
    if info.get("training"):
        p(f"  training:      {json.dumps(info['training'])}")
    if info.get("evaluation"):
        p("  evaluation:")
        for r in info["evaluation"]:
            m = ", ".join(f"{k} {v}" for k, v in r["metrics"].items())
            p(f"    {r['task']}: {m}")
            if r.get("setting"):
                p(f"      setting: {r['setting']}")
            if r.get("note"):
                p(f"      note: {r['note']}")
            p(f"      source: {r['source']}")
    if info["cache"]:
        p("  cached:")
        for fmt, c in info["cache"].items():
            diff = c.get("forward_max_abs_diff")
            extra = f", forward max |diff| {diff:.2g}" if diff is not None else ""
            p(f"    {fmt}: {c['path']} ({human_size(c['size'])}, {c['created']}, contents "
              f"{c['contents_verified'] or '-'}{extra})")
    else:
        p("  cached:        no" + ("" if info.get("path") else f" (`bert-of zoo download {info['name']}`)"))
    return 0


def cmd_download(args) -> int:
    args = from_args(FetchOptions, args)
    z = _zoo(args)
    try:
        path = z.download(args.name, args.format, verify=not args.no_verify, force=args.force,
                          keep_archive=args.keep_archive)
    except KeyboardInterrupt:
        log.warning("a partial download is kept and resumes next time")
        raise
    print(path)
    return 0


def cmd_path(args) -> int:
    args = from_args(PathOptions, args)
    print(_zoo(args).path(args.name, args.format))
    return 0


def cmd_verify(args) -> int:
    args = from_args(CachedOptions, args)
    z = _zoo(args)
    results = z.verify(args.name, args.format)
    bad = []
    for fmt, path, problems in results:
        if problems:
            for pr in problems:
                print(f"FAIL  {fmt:<11} {path}: {pr}")
            bad.append((fmt, problems[0]))
        else:
            print(f"ok    {fmt:<11} {path}")
    if bad:
        name = z.entry(args.name)["name"]
        raise ChecksumError(f"{name} ({bad[0][0]}): {bad[0][1]}; `bert-of zoo download {name} --force` "
                            "fetches a fresh copy")
    return 0


def cmd_remove(args) -> int:
    args = from_args(CachedOptions, args)
    z = _zoo(args)
    removed = z.remove(args.name, args.format)
    if not removed:
        print(f"{z.entry(args.name)['name']}: not in the cache; nothing removed")
    for r in removed:
        print(f"removed {r}")
    return 0


def cmd_cache_list(args) -> int:
    args = from_args(CacheListOptions, args)
    z = _zoo(args)
    rows = z.cache_rows()
    if args.json:
        print(json.dumps({"cache_dir": z.cache_dir, "items": rows}, indent=1))
        return 0
    table = [("ID", "KIND", "SIZE", "STATE", "SOURCE")]
    for r in rows:
        src = r["source"] or "?"
        if r["kind"] == "converted":
            src = f"{src} ({r['format']})" + (f" +{len(r['used_by']) - 1} more" if len(r["used_by"]) > 1 else "")
        table.append((r["id"], r["kind"], human_size(r["size"]), r["state"], src))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.rjust(w) if i == 2 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    print(f"\n{len(rows)} item(s), {human_size(sum(r['size'] for r in rows))} in {z.cache_dir}")
    return 0


def cmd_cache_remove(args) -> int:
    args = from_args(CacheRemoveOptions, args)
    z = _zoo(args)
    for ident in args.ids:
        for r in z.cache_remove(ident):
            print(f"removed {r}")
    return 0


def cmd_cache_prune(args) -> int:
    args = from_args(CachePruneOptions, args)
    z = _zoo(args)
    rows = z.cache_prune(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for r in rows:
        print(f"{verb} {r['path']} ({human_size(r['size'])}; {r['state']}: {r['source']})")
    print(f"{verb} {len(rows)} converted cop{'y' if len(rows) == 1 else 'ies'}, "
          f"{human_size(sum(r['size'] for r in rows))}")
    return 0


def cmd_add(args) -> int:
    args = from_args(AddOptions, args)
    z = _zoo(args)
    e = z.add(args.dir, args.name, aliases=args.alias, metadata=args.metadata, description=args.description,
              overwrite=args.overwrite)
    c = e.get("config") or {}
    print(f"registered {e['name']} -> {e['path']} ({e['source_format']}, {_params(e.get('params'))} parameters, "
          f"L={c.get('L')} H={c.get('H')} A={c.get('A')}, {len(e['files_sha256'])} files hashed) in "
          f"{z.local_registry_path}")
    return 0


# --------------------------------------------------------------------------- parser


def _fill(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="zoo_command", required=True, metavar="ZOO_COMMAND")

    add_command(sub, "list", cmd_list, ListOptions, help="table of entries: params, size, format, downloaded?, SQuAD",
                description="List every registry entry.",
                example_lines=("bert-of zoo list", "bert-of zoo list --downloaded",
                               "bert-of zoo list --json | jq '.entries[].name'"))

    add_command(sub, "info", cmd_info, InfoOptions, help="everything about one entry",
                description="URLs, hashes, config, license, provenance, evaluation results with sources, "
                            "cache state, and which registry the entry came from.",
                example_lines=("bert-of zoo info bert-base-uncased", "bert-of zoo info bert-large --json"))

    add_command(sub, "download", cmd_download, FetchOptions,
                help="download, verify, extract, convert, cache; print the path",
                description="Download NAME (resuming a partial download), verify SHA-256, extract safely, "
                            "convert (tf2of by default) with a forward-equality check, publish into the "
                            "cache atomically, and print the folder. Cached entries return at once. "
                            "Ctrl-C keeps the partial download; the next call resumes it.",
                example_lines=("bert-of zoo download bert-base-uncased",
                               "bert-of zoo download bert-large-cased --format tf    # Google's files",
                               "MODEL=$(bert-of zoo download bert-base -q)          # just the path"),
                interrupt_note=" (a partial download is kept and resumes next time)")

    add_command(sub, "path", cmd_path, PathOptions, help="print the cached folder (error if not downloaded)",
                description="Print NAME's folder in the cache; an error (exit 1) when it is not there. "
                            "Never downloads.",
                example_lines=("bert-of zoo path bert-base-uncased", "ls $(bert-of zoo path bert-base --format tf)"))

    add_command(sub, "verify", cmd_verify, CachedOptions, help="re-hash the cached files against their manifest",
                description="Re-hash every cached file of NAME against the SHA-256 recorded when it was "
                            "published (and, for Google's files, against the registry). Exit 1 on any "
                            "difference.",
                example_lines=("bert-of zoo verify bert-base-uncased", "bert-of zoo verify bert-base --format tf"))

    add_command(sub, "remove", cmd_remove, CachedOptions, help="delete cached folders; unregister a `zoo add` entry",
                description="Delete NAME's cached folders and partial downloads (all formats, or --format). "
                            "For an entry made by `zoo add`, also unregister it; its folder is not touched.",
                example_lines=("bert-of zoo remove bert-large-uncased", "bert-of zoo remove bert-base --format hf"))

    add_command(sub, "add", cmd_add, AddOptions, help="register a local checkpoint folder (e.g. from pretraining)",
                description="Register DIR (a bert_of checkpoint, or any format bert-of convert reads) under "
                            "NAME in <cache>/registry.local.json, referenced in place with the SHA-256 of "
                            "its files. Every tensor is read: one holding NaN or inf (a diverged run) is "
                            "refused. --metadata FILE: JSON with optional description, aliases, license, "
                            "training {...}, evaluation [{task, metrics, source?, setting?}], provenance.",
                example_lines=("bert-of zoo add run/final --name my-mini-bert",
                               "bert-of zoo add run/final --name my-mini-bert --alias mini --overwrite"))

    _fill_cache(sub)


def _fill_cache(sub) -> None:
    s = sub.add_parser("cache", help="what the cache holds (zoo entries, converted copies), its size; remove, prune",
                       description="The cache as a whole: zoo entries, partial downloads and the bert_of copies of "
                                   "checkpoints in other formats that `--model DIR`, `from_pretrained(DIR)` and "
                                   "`--init-checkpoint DIR` convert once (keyed by the source's content).",
                       epilog=examples("bert-of zoo cache list", "bert-of zoo cache remove ~/models/minilm-hf",
                                       "bert-of zoo cache prune --dry-run"))
    cache = s.add_subparsers(dest="cache_command", required=True, metavar="CACHE_COMMAND")
    add_command(cache, "list", cmd_cache_list, CacheListOptions, help="every item: id, kind, size, state, source",
                description="Every item in the cache with its size; a converted copy's state says whether "
                            "its source is still there as it was.",
                example_lines=("bert-of zoo cache list", "bert-of zoo cache list --json"))
    add_command(cache, "remove", cmd_cache_remove, CacheRemoveOptions, help="remove converted copies or zoo entries",
                description="Remove each ID: a converted copy (its id, a prefix of 6+ characters of it, or "
                            "the path of the source it was converted from) or a zoo entry (NAME or "
                            "NAME/FORMAT, as `bert-of zoo remove`).",
                example_lines=("bert-of zoo cache remove 3f2a9c", "bert-of zoo cache remove ./my-hf-model"))
    add_command(cache, "prune", cmd_cache_prune, CachePruneOptions,
                help="remove converted copies no source needs any more",
                description="Remove the converted copies whose sources are gone or now hold other content "
                            "(a source that was only touched or copied keeps its copy).",
                example_lines=("bert-of zoo cache prune", "bert-of zoo cache prune --dry-run"))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``zoo`` command (and its sub-commands) to ``bert-of``'s subparsers."""
    p = subparsers.add_parser("zoo", help="model zoo: list, download (verified, resumable), cache, add your own",
                              description=DESCRIPTION, epilog=EPILOG)
    _fill(p)
    return p
