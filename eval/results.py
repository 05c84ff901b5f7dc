"""The results store: one JSON line per evaluation, beside the model zoo.

Location: ``--results FILE``, else ``results.jsonl`` in the zoo's folder: ``$BERT_OF_HOME``, else
``$XDG_CACHE_HOME/bert_of``, else ``~/.cache/bert_of``. A record::

    {"schema": 1, "kind": "measured", "task": "squad-v1.1", "split": "dev",
     "metrics": {"exact_match": 80.9, "f1": 88.3},
     "checkpoint": {"name": ..., "path": ..., "format": ..., "sha256": ...} | null,
     "hparams": {...}, "data": {"path", "sha256"}, "predictions": {"path", "sha256"},
     "date": "2026-12-01T10:00:00+00:00", "hardware": {...}, "tool": "bert-of eval squad-score"}

Published numbers (``eval/published.json``, from the reference sheet) join the table as rows of
kind "published": quoted, not measured.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess

from bert_of.eval.errors import ResultsError
from bert_of.files.atomic import append_jsonl, read_jsonl
from bert_of.files.home import bert_of_home, utc_now
from bert_of.files.reading import input_sha256, read_json, sha256_file
from bert_of.progress import log


SCHEMA = 1
PUBLISHED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published.json")


def default_results_path() -> str:
    return os.path.join(bert_of_home(), "results.jsonl")


# --------------------------------------------------------------------------- identity


def file_identity(path: str) -> dict:
    """Where a file the user gave is and its hash (``-``: standard input, named so; a pipe: the bytes it gave)."""
    return {"path": path if path == "-" else os.path.abspath(path), "sha256": input_sha256(path)}


def checkpoint_identity(path: str, name: str | None = None) -> dict:
    """Name, path, format and content hash of a checkpoint.

    bert_of directory: sha256 of ``model.safetensors``. TF checkpoint (prefix, ``.index`` or a
    release directory): sha256 over the index and data shards, in name order. Any other file:
    its sha256.
    """
    p = os.path.abspath(path)
    ident = {"name": name or os.path.basename(p.rstrip(os.sep)), "path": p, "format": None, "sha256": None}
    if os.path.isdir(p) and os.path.isfile(os.path.join(p, "model.safetensors")):
        ident["format"] = "bert_of"
        ident["sha256"] = sha256_file(os.path.join(p, "model.safetensors"))
        return ident
    prefix = p[:-len(".index")] if p.endswith(".index") else p
    if os.path.isdir(p) and os.path.isfile(os.path.join(p, "bert_model.ckpt.index")):
        prefix = os.path.join(p, "bert_model.ckpt")
    if os.path.isfile(prefix + ".index"):
        d, base = os.path.split(prefix)
        parts = sorted(f for f in os.listdir(d) if f == base + ".index" or f.startswith(base + ".data-"))
        h = hashlib.sha256()
        for f in parts:
            h.update(f.encode() + b"\0" + bytes.fromhex(sha256_file(os.path.join(d, f))))
        ident["format"], ident["sha256"] = "tf", h.hexdigest()
        return ident
    if os.path.isfile(p):
        ident["format"], ident["sha256"] = "file", sha256_file(p)
        return ident
    raise ResultsError(f"{path}: no checkpoint there (expected a bert_of directory, a TF checkpoint or a file)")


def hardware_info() -> dict:
    """CPU model and count, machine, OS, Python; GPU names when ``nvidia-smi`` answers."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "cpus": os.cpu_count(), "machine": platform.machine(),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(), "gpus": []}
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=10)
            if r.returncode == 0:
                info["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def hardware_summary(hw: dict | None) -> str:
    if not hw:
        return ""
    if hw.get("gpus"):
        g = hw["gpus"]
        return f"{len(g)}x {g[0]}"
    cpu = hw.get("cpu") or hw.get("machine") or "cpu"
    return f"{cpu} ({hw.get('cpus')} cpus)" if hw.get("cpus") else cpu


# --------------------------------------------------------------------------- records


def make_record(task: str, metrics: dict, *, split: str = "", checkpoint: dict | None = None,
                hparams: dict | None = None, data: dict | None = None, predictions: dict | None = None,
                hardware: dict | None = None, date: str | None = None, tool: str = "", **extra) -> dict:
    """A measured-result record (see the module docstring). ``checkpoint`` as from
    :func:`checkpoint_identity`; ``hardware`` defaults to :func:`hardware_info`."""
    if not isinstance(metrics, dict) or not metrics:
        raise ResultsError(f"{task}: a result needs at least one metric")
    rec = {"schema": SCHEMA, "kind": "measured", "task": task, "split": split, "metrics": dict(metrics),
           "checkpoint": checkpoint, "hparams": dict(hparams or {}), "data": data, "predictions": predictions,
           "date": date or utc_now(),
           "hardware": hardware if hardware is not None else hardware_info(), "tool": tool}
    rec.update(extra)
    return rec


def append_result(record: dict, path: str | None = None) -> str:
    """Append one record as a JSON line (creating the file and its directory). Returns the path.

    Whole-line append with fsync; a torn last line left by a crash or a full disk is cut first,
    with a warning (bert_of.files.atomic.append_jsonl)."""
    path = path or default_results_path()
    append_jsonl(path, record)
    return path


def load_results(path: str | None = None) -> list:
    """Measured records of a results file ([] when it does not exist yet).

    A damaged store degrades, it does not die: unreadable lines (a torn tail, garbage) and lines
    that are not result records (no "task" and "metrics") are skipped with a one-line warning
    naming the file, so one bad line never hides the other records."""
    path = path or default_results_path()
    out, skipped = [], 0
    for rec in read_jsonl(path, "results"):
        if not isinstance(rec.get("task"), str) or not isinstance(rec.get("metrics"), dict):
            skipped += 1
            continue
        rec.setdefault("kind", "measured")
        out.append(rec)
    if skipped:
        log.warning('%s: skipped %d line(s) that are not result records (no "task" and "metrics")', path, skipped)
    return out


def load_published() -> list:
    rows = read_json(PUBLISHED_PATH, "published results", error=ResultsError)["rows"]
    return [dict(r, kind="published") for r in rows]


# --------------------------------------------------------------------------- table

COLUMNS = ("task", "split", "model", "metrics", "kind", "date", "hardware", "sha256", "source")


def _fmt_num(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    return f"{v:.2f}"


def _is_count(key: str) -> bool:
    """Question counts and thresholds stay out of the markdown cell (CSV/JSON keep them)."""
    return key == "total" or key.endswith("_total") or key.endswith("_thresh")


def _row(rec: dict) -> dict:
    ck = rec.get("checkpoint") or {}
    published = rec.get("kind") == "published"
    model = rec.get("model") or ck.get("name") or ""
    source = rec.get("source", "") if published else (rec.get("tool") or "")
    if rec.get("note"):
        source = f"{source} ({rec['note']})" if source else rec["note"]
    return {
        "task": rec.get("task", ""),
        "split": rec.get("split", "") or "",
        "model": model,
        "metrics": ", ".join(f"{k} {_fmt_num(v)}" for k, v in rec["metrics"].items() if not _is_count(k)),
        "kind": "published (not measured)" if published else "measured",
        "date": (rec.get("date") or "")[:10],
        "hardware": hardware_summary(rec.get("hardware")),
        "sha256": (ck.get("sha256") or "")[:12],
        "source": source,
    }


def select(records: list, task: str | None = None, kind: str | None = None) -> list:
    out = records
    if task:
        out = [r for r in out if r.get("task") == task]
    if kind:
        out = [r for r in out if r.get("kind") == kind]
    return out


def sort_records(records: list) -> list:
    """Grouped by task (first appearance), published rows first, then measured by date."""
    order = {}
    for r in records:
        order.setdefault(r.get("task", ""), len(order))
    return sorted(records, key=lambda r: (order[r.get("task", "")], r.get("kind") != "published",
                                          r.get("date") or ""))


def format_table(records: list, fmt: str = "markdown") -> str:
    """The results as a markdown table, CSV (one metric per column) or JSON (the records)."""
    records = sort_records(records)
    if fmt == "json":
        return json.dumps(records, indent=2, ensure_ascii=False)
    if fmt == "csv":
        metric_names = []
        for r in records:
            for k in r["metrics"]:
                if k not in metric_names:
                    metric_names.append(k)
        cols = ["task", "split", "model", "kind", *metric_names, "date", "hardware", "sha256", "source"]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in records:
            row = _row(r)
            row["kind"] = r.get("kind", "measured")
            ck = r.get("checkpoint") or {}
            row["sha256"] = ck.get("sha256") or ""
            w.writerow([row[c] if c in row else r["metrics"].get(c, "") for c in cols])
        return buf.getvalue().rstrip("\n")
    if fmt != "markdown":
        raise ResultsError(f"unknown format {fmt!r} (markdown, csv, json)")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in records:
        row = _row(r)
        lines.append("| " + " | ".join(str(row[c]).replace("|", "\\|") for c in COLUMNS) + " |")
    return "\n".join(lines)
