"""Build Google-layout release zips (a TINY model inside) and registries pointing at them.

A release zip holds ``<folder>/bert_config.json``, ``vocab.txt`` and
``bert_model.ckpt.{data-00000-of-00001,index,meta}`` written by TensorFlow's own
Saver (converters.verify.tf_reference_checkpoint), exactly the file set of Google's zips.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile

RELEASE_FILES = ("bert_config.json", "vocab.txt", "bert_model.ckpt.data-00000-of-00001",
                 "bert_model.ckpt.index", "bert_model.ckpt.meta")


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make_release_dir(root, config: dict, seed: int = 3) -> str:
    """A folder with Google's five files for ``config`` (a Google bert_config dict)."""
    from bert_of.converters.verify import tf_reference_checkpoint
    from tests.conftest import write_vocab

    os.makedirs(root, exist_ok=True)
    tf_reference_checkpoint.make_checkpoint(os.path.join(root, "bert_model.ckpt"), config, seed=seed, realistic=True)
    os.remove(os.path.join(root, "checkpoint"))  # TF's state file: not part of Google's zips
    with open(os.path.join(root, "bert_config.json"), "w") as f:
        json.dump({k: v for k, v in config.items() if k != "num_labels"}, f, indent=2)
    write_vocab(os.path.join(root, "vocab.txt"), config["vocab_size"])
    return root


def zip_release(src_dir, zip_path, folder: str | None, extra_members=()) -> dict:
    """Zip the five files under ``folder/`` (or flat with folder=None); returns {file: sha256}."""
    os.makedirs(os.path.dirname(os.path.abspath(zip_path)), exist_ok=True)
    hashes = {}
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        if folder:
            zf.writestr(zipfile.ZipInfo(folder + "/"), b"")
        for name in RELEASE_FILES:
            p = os.path.join(src_dir, name)
            zf.write(p, f"{folder}/{name}" if folder else name)
            hashes[name] = sha256(p)
        for info, data in extra_members:
            zf.writestr(info, data)
    return hashes


def registry_entry(name, url, hashes, aliases=(), **extra) -> dict:
    e = {"name": name, "aliases": list(aliases), "source_format": "tf", "archive": "zip",
         "files": [{"url": url}], "expected_files": list(RELEASE_FILES), "contents_sha256": hashes,
         "license": "Apache-2.0", "description": "test release (a tiny model in Google's layout)",
         "evaluation": [{"task": "SQuAD v1.1 dev", "metrics": {"exact_match": 1.0, "f1": 2.0}, "source": "test"}]}
    e.update(extra)
    return e


def write_registry(path, entries) -> str:
    with open(path, "w") as f:
        json.dump({"schema_version": 1, "entries": entries}, f, indent=1)
    return str(path)
