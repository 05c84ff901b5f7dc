"""Forward equality between two checkpoints, in any formats.

Each side runs where it is native: a TF1 checkpoint through the independent
TensorFlow reference (converters.tf_reference, Google's modeling.py in TF),
anything else through bert_of in eager mode AND inside an nn.Graph. Every run
sees the same padded two-segment batch; the report gives max |diff| of every
output against the reference run (the TF one when there is one).
"""

from __future__ import annotations

import json

import numpy as np

from bert_of.converters import tf1
from bert_of.converters.common import Options
from bert_of.converters.convert import detect, read
from bert_of.errors import BertOfError
from bert_of.progress import Progress

DEFAULT_TOL = 1e-5


def make_batch(config, batch_size: int = 3, seq_len: int | None = None, seed: int = 0) -> dict:
    """A padded two-segment batch: [CLS] a.. [SEP] b.. [SEP] pad.., int64 [B, S].

    Rows have different lengths; with type_vocab_size > 2 one row also uses
    the higher token types, so every embedding row is exercised.
    """
    rng = np.random.default_rng(seed)
    S = seq_len or min(16, config.max_position_embeddings)
    V, T = config.vocab_size, config.type_vocab_size
    ids = np.zeros((batch_size, S), np.int64)
    types = np.zeros((batch_size, S), np.int64)
    mask = np.zeros((batch_size, S), np.int64)
    for b in range(batch_size):
        n = max(3, S - 3 * b) if S >= 3 else S  # row b is 3b tokens shorter
        n = min(n, S)
        ids[b, :n] = rng.integers(min(5, V - 1), V, n) if V > 5 else rng.integers(0, V, n)
        ids[b, 0], ids[b, n - 1] = min(1, V - 1), min(2, V - 1)  # "[CLS]" ... "[SEP]"
        a = max(1, n // 2)
        types[b, a:n] = 1 if T > 1 else 0
        if T > 2 and b == batch_size - 1:
            types[b, :n] = np.arange(n) % T
        mask[b, :n] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def run_bert_of(source, batch: dict, modes=("eager", "graph"), device: str = "cpu") -> dict:
    """{mode: {output: np.ndarray}} for bert_of on a Source's tensors, on ``device`` (cpu / cuda)."""
    from bert_of._flow import flow
    from bert_of.modeling import BertGraph, model_class_for

    tensors = source.load()
    cls = model_class_for(tensors)
    model = cls(source.config)
    model.load_canonical({k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" or
                          np.asarray(v).dtype.name == "bfloat16" else v for k, v in tensors.items()},
                         strict_heads=True)
    model.eval()
    if device != "cpu":
        model.to(device)
    args = [flow.tensor(batch[k], dtype=flow.int64, device=device)
            for k in ("input_ids", "token_type_ids", "attention_mask")]
    out = {}
    with flow.no_grad():
        if "eager" in modes:
            out["eager"] = {k: v.to("cpu").numpy() for k, v in model(*args).to_dict().items()}
        if "graph" in modes:
            out["graph"] = {k: v.to("cpu").numpy() for k, v in BertGraph(model)(*args).to_dict().items()}
    return out


def checked_tf(path: str, opts: Options):
    """A TF1 checkpoint read through bert_of's own validated reader before TensorFlow sees it:
    index, shards, dtypes and the fit to the config, then every model tensor's CRC (streamed, one
    tensor at a time). Returns the Source (prefix in ``.path``). Variables that are not BERT's are
    left to TensorFlow, which ignores them too."""
    source = tf1.read(path, Options(config=opts.config, vocab=opts.vocab, skip_unknown=True), require_vocab=False)
    for _, produce in source.tensors:
        produce()
    return source


TF_EXTRA = "pip install 'bert_of[tf]'"


class NeedsTensorFlow(BertOfError):
    """The TF reference (Google's model in TensorFlow) was asked for and TensorFlow is not installed."""


def tf_reference_module(name: str = "tf_reference", why: str = "verifying a TF1 checkpoint"):
    """``bert_of.converters.<name>`` (the TF reference, or its training), which imports TensorFlow: the
    optional ``tf`` extra. Without it, one line saying so."""
    import importlib
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's start-up banner is noise here
    try:
        return importlib.import_module(f"bert_of.converters.{name}")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "tensorflow":
            raise
        raise NeedsTensorFlow(f"{why} runs the TF reference, which needs TensorFlow (the tf extra): "
                              f"{TF_EXTRA}") from None


def run_side(path: str, fmt: str, batch: dict, modes, opts: Options, source=None, device: str = "cpu") -> dict:
    """{run name: {output: array}} for one checkpoint, run where it is native."""
    if fmt == "tf":
        tf_reference = tf_reference_module()
        source = source or checked_tf(path, opts)
        return {f"tf-{dt}": tf_reference.run_reference(source.path, source.config.to_google_dict(), batch, dtype=dt)
                for dt in ("float64", "float32")}
    return run_bert_of(source or read(path, fmt, Options(vocab=opts.vocab, config=opts.config)), batch, modes,
                       device)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b|, where equal values count 0 even when they are inf or NaN (weights holding NaN
    give NaN outputs on both sides: the same function), and a NaN on one side only counts inf."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not a.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
        d[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
    d[np.isnan(d)] = np.inf
    return float(d.max())


def _diffs(ref: dict, outs: dict) -> dict:
    return {k: max_abs_diff(ref[k], outs[k]) for k in ref if k in outs}


def _runs_of(fmt: str, modes) -> str:
    return "TF reference, float64 + float32" if fmt == "tf" else "bert_of " + " + ".join(modes)


def verify(a: str, b: str, tol: float = DEFAULT_TOL, modes=("eager", "graph"), batch_size: int = 3,
           seq_len: int | None = None, opts: Options | None = None, reference_dtype: str = "float64",
           device: str = "cpu") -> dict:
    """Run both sides on one batch and compare every bert_of run (on ``device``) to the reference.

    With a TF1 side, the reference is Google's graph in TensorFlow. It runs in
    float64 (Google's function without rounding: what remains is bert_of's own
    fp32 error) and in float32 (what TF computes: two fp32 implementations'
    rounding added up, ~1e-5 at BERT-base size); both are reported, and
    ``reference_dtype`` picks the one the tolerance applies to. Without a TF
    side, A's eager run is the reference.
    """
    opts = opts or Options()
    fa, fb = detect(a), detect(b)
    if "tf" in (fa, fb):
        tf_reference_module()  # without TensorFlow: one line now, before any work
    with Progress("verify: reading A", total=4, unit="stage") as bar:
        # Both sides read (and checked) before anything runs: a broken B fails before A's work.
        src_a = checked_tf(a, opts) if fa == "tf" else read(a, fa, Options(vocab=opts.vocab, config=opts.config))
        bar.describe("verify: reading B")
        bar.update(1)
        src_b = checked_tf(b, Options()) if fb == "tf" else read(b, fb, Options())
        batch = make_batch(src_a.config, batch_size, seq_len)
        bar.describe(f"verify: running A ({_runs_of(fa, modes)})")
        bar.update(1)
        runs = {f"A:{k}": v for k, v in run_side(a, fa, batch, modes, opts, src_a, device).items()}
        bar.describe(f"verify: running B ({_runs_of(fb, modes)})")
        bar.update(1)
        runs.update({f"B:{k}": v for k, v in run_side(b, fb, batch, modes, Options(), src_b, device).items()})
        bar.update(1)
    tf_runs = [k for k in runs if ":tf-" in k]
    ref_key = next((k for k in tf_runs if k.endswith(reference_dtype)), next(iter(runs)))
    ours = [k for k in runs if k != ref_key and ":tf-" not in k]
    results = {k: _diffs(runs[ref_key], runs[k]) for k in ours}
    worst = max((v for r in results.values() for v in r.values()), default=float("inf"))
    report = {
        "a": {"path": a, "format": fa}, "b": {"path": b, "format": fb},
        "reference": ref_key, "tolerance": tol, "device": device,
        "batch": {"size": int(batch["input_ids"].shape[0]), "seq_len": int(batch["input_ids"].shape[1]),
                  "tokens": int(batch["attention_mask"].sum())},
        "outputs": sorted({k for r in results.values() for k in r}),
        "max_abs_diff": results, "worst": worst, "ok": bool(results and worst <= tol),
    }
    others = [k for k in tf_runs if k != ref_key]
    for other in others:  # the other TF precision, for information
        report[f"vs_{other.split(':')[1]}"] = {k: _diffs(runs[other], runs[k]) for k in ours}
        report[f"{other.split(':')[1]}_vs_reference"] = _diffs(runs[ref_key], runs[other])
    return report


def format_report(report: dict) -> str:
    return json.dumps(report, indent=2)
