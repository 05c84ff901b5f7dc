"""What `bert-of zoo list` and `zoo info` show: one row per entry, one entry in full.

Rows carry the published SQuAD v1.1 result of an entry and, when the results store holds one,
the latest one measured here (``bert-of eval squad``) on the entry's checkpoint or on a model
fine-tuned from it.
"""

from __future__ import annotations

import os

from bert_of.errors import BertOfError
from bert_of.eval.results import load_results
import bert_of.zoo.registry as _reg
from bert_of.zoo.build import _urls
from bert_of.zoo.cache import cached_formats, dir_size, read_manifest


def measured_squad(z) -> dict:
    """{entry name: latest measured SQuAD v1.1 record} from the results store.

    A record counts for an entry when its checkpoint, or the checkpoint it was fine-tuned
    from, is one of the entry's folders (cached formats or a local entry's folder); records
    of an untrained (newly initialised) SQuAD head do not count.
    """
    try:
        records = load_results(z.results_path)
    except BertOfError as e:
        z.log(f"note: results store not read ({e})")
        return {}
    if not records:
        return {}
    folders = {}
    for e in z.registry.entries.values():
        dirs = list(cached_formats(z.cache_dir, e).values()) + ([e["path"]] if "path" in e else [])
        for d in dirs:
            folders[os.path.realpath(d)] = e["name"]
    out = {}
    for r in records:  # file order is date order: later records win
        if r.get("task") != "squad-v1.1" or r.get("head_trained") is False:
            continue
        m = r.get("metrics") or {}
        if not isinstance(m.get("exact_match"), (int, float)) or not isinstance(m.get("f1"), (int, float)):
            continue
        for ident in (r.get("checkpoint"), r.get("base_checkpoint")):
            p = (ident or {}).get("path") if isinstance(ident, dict) else None
            name = folders.get(os.path.realpath(p)) if isinstance(p, str) else None
            if name:
                out[name] = {"exact_match": m["exact_match"], "f1": m["f1"], "date": r.get("date"),
                             "checkpoint": (r.get("checkpoint") or {}).get("name"),
                             "finetuned_from": (r.get("base_checkpoint") or {}).get("name")}
                break
    return out


def rows(z) -> list:
    """One dict per entry for `zoo list`."""
    out = []
    measured = measured_squad(z)
    for e in z.registry.entries.values():
        cached = cached_formats(z.cache_dir, e)
        local = "path" in e
        if cached:
            size, exact = sum(dir_size(d) for d in cached.values()), True
        elif local:
            size, exact = e.get("size_bytes"), True
        else:
            declared = [f.get("size") for f in e.get("files", [])]
            if declared and all(declared):
                size, exact = sum(declared), True
            else:
                size, exact = e.get("size_estimate_bytes"), False
        sq = _reg.squad_v11(e)
        out.append({
            "name": e["name"], "aliases": e["aliases"], "params": e.get("params"),
            "size": size, "size_exact": exact, "source_format": e["source_format"],
            "downloaded": (["local"] if local else []) + list(cached),
            "squad_v11": {"exact_match": sq[0], "f1": sq[1], "source": sq[2]} if sq else None,
            "squad_v11_measured": measured.get(e["name"]),
            "registry": e["_registry"],
        })
    return out


def info(z, name: str) -> dict:
    e = dict(z.entry(name))
    e["registry"] = e.pop("_registry")
    if z.endpoint and e.get("files"):
        e["effective_urls"] = _urls(z, z.entry(name))
    cached = {}
    for f, d in cached_formats(z.cache_dir, z.entry(name)).items():
        m = read_manifest(d)
        ver = m.get("verification")
        cached[f] = {"path": d, "created": m.get("created"), "size": dir_size(d),
                     "contents_verified": (m.get("source") or {}).get("contents_verified"),
                     "forward_max_abs_diff": ver.get("worst") if ver else None}
    e["cache"] = cached
    return e
