"""Entries made by ``bert-of zoo add``: a local checkpoint folder registered in place.

The entry (content hashes of the folder's files, config summary, parameter count, the
metadata given) goes into ``<cache>/registry.local.json``; the folder itself is never copied.
"""

from __future__ import annotations

import getpass
import os
import shutil

import numpy as np

from bert_of.checkpoint import run_final
from bert_of.converters.convert import detect, read
from bert_of.files.home import utc_now
from bert_of.files.reading import read_json
import bert_of.zoo.registry as _reg
from bert_of.zoo.cache import entry_lock, hash_tree
from bert_of.zoo.errors import ZooError


def config_summary(cfg) -> dict:
    """{L, H, A, I, V, P, T, hidden_act, layer_norm_eps} of a BertConfig."""
    return {"L": cfg.num_hidden_layers, "H": cfg.hidden_size, "A": cfg.num_attention_heads,
            "I": cfg.intermediate_size, "V": cfg.vocab_size, "P": cfg.max_position_embeddings,
            "T": cfg.type_vocab_size, "hidden_act": cfg.hidden_act, "layer_norm_eps": cfg.layer_norm_eps}


def add(z, directory: str, name: str, aliases=(), metadata: str | None = None,
        description: str | None = None, overwrite: bool = False) -> dict:
    """Register a local checkpoint folder (referenced in place, content-hashed) in registry.local.json."""
    directory = os.path.abspath(os.path.expanduser(directory))
    if not os.path.isdir(directory):
        raise ZooError(f"{directory}: not a directory")
    model = run_final(directory)  # a training run's folder: the checkpoint it published
    if model != directory:
        z.log(f"{directory}: a training run; adding the checkpoint it stands for, {model}")
        directory = model
    if not _reg.NAME_RE.match(name or ""):
        raise ZooError(f"--name {name!r}: must match {_reg.NAME_RE.pattern}")
    fmt = detect(directory)
    md = read_json(metadata, "metadata file", error=ZooError) if metadata else {}
    known = {"description", "aliases", "license", "training", "evaluation", "provenance"}
    evaluation = []
    for i, r in enumerate(md.get("evaluation") or []):
        if not isinstance(r, dict):
            raise ZooError(f"{metadata}: evaluation[{i}] must be an object")
        r = dict(r)
        r.setdefault("source", f"local: {os.path.abspath(metadata)}")
        evaluation.append(r)
    cfg_summary, params = _describe_checkpoint(directory, fmt)
    files = hash_tree(directory, skip=())
    entry = {
        "name": name,
        "aliases": list(aliases or []) + [a for a in md.get("aliases", []) if a not in (aliases or [])],
        "description": description or md.get("description") or f"local {fmt} checkpoint {directory}",
        "source_format": fmt,
        "path": directory,
        "files_sha256": {k: v["sha256"] for k, v in files.items()},
        "size_bytes": sum(v["size"] for v in files.values()),
        "config": cfg_summary,
        "params": params,
        "license": md.get("license", "unspecified"),
        "provenance": dict({"publisher": "local", "added": utc_now(), "by": _user()},
                           **({"metadata_file": os.path.abspath(metadata)} if metadata else {}),
                           **(md.get("provenance") or {})),
        "training": md.get("training"),
        "evaluation": evaluation,
    }
    extra = {k: v for k, v in md.items() if k not in known}
    if extra:
        entry["metadata"] = extra
    entry = _reg.validate_entry(entry, f"zoo add {name}")

    def change(entries):
        reg = z.registry  # read under the lock: a concurrent `zoo add` of the same name is seen
        for n in [name] + entry["aliases"]:
            other = reg.lookup(n)
            if other is not None and not overwrite:
                raise ZooError(f"{n}: already names the entry {other['name']} (from {other['_registry']}); "
                               "choose another --name/--alias, or pass --overwrite to replace it")
        if name in reg.entries and reg.entries[name]["_registry"] != z.local_registry_path:
            z.log(f"note: {name} now overrides the entry of {reg.entries[name]['_registry']} "
                  "(later registries win, whole entry)")
        return [e for e in entries if e["name"] != name] + [entry]

    update_local(z, change)
    return z.entry(name)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "?"


def _describe_checkpoint(directory: str, fmt: str):
    """(config summary, parameter count) of a local checkpoint, read tensor by tensor; a tensor
    holding NaN or inf (a diverged run) is refused, so it can never be registered."""
    try:
        src = read(directory, fmt)
        params = 0
        for spec, produce in src.tensors:
            params += int(np.prod(spec.shape, dtype=np.int64))
            arr = produce()
            if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
                bad = arr.size - int(np.count_nonzero(np.isfinite(arr.astype(np.float32, copy=False))))
                if bad:
                    raise ZooError(f"{directory}: tensor {spec.name} holds {bad} non-finite value(s) (NaN or inf): "
                                   "a diverged run? not registering it")
        return config_summary(src.config), params
    except (OSError, ValueError) as e:
        raise ZooError(f"{directory}: cannot read it ({e})") from None


def unregister(z, name: str) -> None:
    """Drop ``name`` from registry.local.json."""
    update_local(z, lambda entries: [e for e in entries if e["name"] != name])


def update_local(z, change) -> None:
    """Rewrite registry.local.json as ``change(entries)``: whole, atomically, under one lock, so
    concurrent `zoo add`s all land. A damaged file is copied aside first (its readable entries are
    kept), so nothing of it is lost without a trace."""
    path = z.local_registry_path
    with entry_lock(z.cache_dir, ".registry.local", z.log):
        z._registry = None
        entries, damaged = _reg.load_local(path, warn=False)
        new = change(entries)
        if damaged:
            keep = f"{path}.damaged-{utc_now().replace(':', '')}"
            shutil.copyfile(path, keep)
            z.log(f"warning: {path} was damaged: kept a copy as {keep}; rewritten with its {len(entries)} "
                  "readable entries")
        _reg.write_file(path, new)
        z._registry = None
