"""Forward equality, proven against a reference that is not bert_of's own model.

The reference is the float64 NumPy BERT of :mod:`bert_of.converters.verify.reference_forward`, run on the
SOURCE's tensors as its file stores them (its names, its layout, its numerics: the layouts of
:mod:`bert_of.converters.verify.reference_np`), so a wrong name table, transpose, GELU or epsilon in a
reader or writer shows as a difference. The checked side
runs bert_of (eager, and inside an nn.Graph) on the converted files; converted files in another
format (and every converted file when OneFlow, the ``oneflow`` extra, is not installed: the
report's ``bert_of_model`` says so) also run through their own layout's reference (and TensorFlow's graph of Google's
modeling.py when they are a Google checkpoint). Where the source's own ecosystem is importable
(TensorFlow for a Google checkpoint, converters/verify/tf_reference.py) it runs too, and its
difference from the reference is reported beside (``"ecosystem"``).

Inputs: real WordPiece tokens of a few sentence pairs from the checkpoint's vocabulary (both
segments, ``[MASK]`` positions, padding), up to :data:`REAL_LEN` tokens, and a padded random-id
batch that reaches every token type. Every output the checkpoint has a head for is compared,
per-token outputs at the real (unpadded) positions.

``convert --verify`` calls :func:`verify_source` with the ``Source`` it has already read (no
second detection, no second reading of the index); ``bert-of verify A B`` calls :func:`verify`.
"""

from __future__ import annotations

import json

import numpy as np

from bert_of.errors import CheckpointError, NeedsOneFlow
from bert_of.tokenization import FullTokenizer
from bert_of.converters.verify import ecosystems, reference_forward, reference_np
from bert_of.converters import registry
from bert_of.converters.source import Options, lower_case_of
from bert_of.converters.convert import detect, model_path, numerics_gate, read
from bert_of.progress import Progress, log

DEFAULT_TOL = 1e-5
# B's weights all float16 (`--dtype float16`): each weight moved by up to 2^-11 of itself, and the
# outputs with them (tiny BERT: 3.4e-3 on an output of magnitude ~4). The check is then relative:
# per output, max |diff| <= FLOAT16_TOL * max(1, max |reference output|) (docs/formats-onnx.md).
FLOAT16_TOL = 1e-2
FLOAT16_RULE = "float16 weights: max |diff| / max(1, max |reference output|)"
REAL_LEN = 128  # the real-token batch's longest row, at most (and at most max_position_embeddings)
SENTENCES = (  # pairs (segment A, segment B); [MASK] is kept as the token, as in pretraining
    ("The quick brown fox jumps over the lazy dog near the river bank.",
     "It was not [MASK] at all, and it ran back into the forest before sunset."),
    ("BERT reads a whole sentence at once instead of one word after another.",
     "Its self-attention [MASK] every token with every other token in both directions."),
    ("Paris is the capital and most populous city of France.",
     "The Seine flows through the city before it reaches the English [MASK]."),
    ("Unaffable people rarely smile at strangers.", None),  # one segment: the most padding
)


def make_batch(config, batch_size: int = 3, seq_len: int | None = None, seed: int = 0) -> dict:
    """A padded two-segment batch of random ids: [CLS] a.. [SEP] b.. [SEP] pad.., int64 [B, S].

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


def token_batch(source, max_len: int = REAL_LEN):
    """(batch, description) of :data:`SENTENCES` in the checkpoint's own vocabulary, or (None, why)."""
    if not source.vocab_file:
        return None, "no vocabulary beside the checkpoint (pass --vocab)"
    tok = FullTokenizer(source.vocab_file, do_lower_case=lower_case_of(source))
    missing = [t for t in ("[CLS]", "[SEP]", "[PAD]", "[UNK]") if t not in tok.vocab]
    if missing:
        return None, f"the vocabulary has no {missing[0]}"
    S = min(max_len, source.config.max_position_embeddings)
    rows = [tok.encode(a, b, max_len=S) for a, b in SENTENCES]
    if max(max(r["input_ids"]) for r in rows) >= source.config.vocab_size:
        return None, f"the vocabulary is larger than the config's vocab_size {source.config.vocab_size}"
    S = max(len(r["input_ids"]) for r in rows)
    batch = {k: np.zeros((len(rows), S), np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
    batch["input_ids"][:] = tok.vocab["[PAD]"]
    for i, r in enumerate(rows):
        for k in batch:
            batch[k][i, :len(r[k])] = r[k]
    if source.config.type_vocab_size < 2:  # one token type only: the pairs are read as one segment
        batch["token_type_ids"][:] = 0
    masked = int(np.sum(batch["input_ids"] == tok.vocab["[MASK]"])) if "[MASK]" in tok.vocab else 0
    unknown = int(np.sum(batch["input_ids"] == tok.vocab["[UNK]"]))
    return batch, {"size": len(rows), "seq_len": S, "tokens": int(batch["attention_mask"].sum()),
                   "masked": masked, "unknown": unknown,
                   "pairs": sum(1 for _, b in SENTENCES if b) if source.config.type_vocab_size > 1 else 0}


def _stack(batches: list) -> dict:
    """The batches' rows as one batch, padded to the longest (padding is masked, and not compared)."""
    S = max(b["input_ids"].shape[1] for b in batches)
    return {k: np.concatenate([np.pad(b[k], ((0, 0), (0, S - b[k].shape[1]))) for b in batches])
            for k in ("input_ids", "token_type_ids", "attention_mask")}


def _bert_of_runs(source, batches: dict, modes, device: str = "cpu") -> dict:
    """{mode: {batch: {output: np.ndarray}}} for bert_of on a Source's tensors, on ``device``."""
    from bert_of._flow import flow
    from bert_of.heads import model_class_for
    from bert_of.modeling import BertGraph

    tensors = source.load()
    model = model_class_for(tensors, source.config)(source.config)
    model.load_canonical({k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" or
                          np.asarray(v).dtype.name == "bfloat16" else v for k, v in tensors.items()},
                         strict_heads=True)
    del tensors
    model.eval()
    if device != "cpu":
        model.to(device)
    out = {m: {} for m in modes}
    with flow.no_grad():
        for name, batch in batches.items():
            args = [flow.tensor(batch[k], dtype=flow.int64, device=device)
                    for k in ("input_ids", "token_type_ids", "attention_mask")]
            if "eager" in modes:
                out["eager"][name] = {k: v.to("cpu").numpy() for k, v in model(*args).to_dict().items()}
            if "graph" in modes:  # one graph per input shape (an nn.Graph compiles for static shapes)
                out["graph"][name] = {k: v.to("cpu").numpy() for k, v in BertGraph(model)(*args).to_dict().items()}
    return out


def _bert_of_or_why(source, batches: dict, modes, device: str):
    """:func:`_bert_of_runs`, or a string saying why bert_of's model did not run: OneFlow (the
    ``oneflow`` extra) is not installed. The proof then rests on the NumPy reference run in A's
    layout and in B's (and TensorFlow / transformers where installed), which need no OneFlow."""
    try:
        import bert_of._flow as _flow  # noqa: F401 -- OneFlow, or NeedsOneFlow
    except NeedsOneFlow as e:
        return f"not run: {e}"
    return _bert_of_runs(source, batches, modes, device)


def run_bert_of(source, batch: dict, modes=("eager", "graph"), device: str = "cpu") -> dict:
    """{mode: {output: np.ndarray}} for bert_of on a Source's tensors, on ``device`` (cpu / cuda)."""
    return {m: r["batch"] for m, r in _bert_of_runs(source, {"batch": batch}, modes, device).items()}


def _numpy_runs(source, batches: dict) -> dict:
    """{batch: outputs} of the float64 NumPy reference on the file's stored tensors."""
    layout = registry.reference_layout(source)
    heads = int(layout.config.get("num_attention_heads", source.config.num_attention_heads))
    with np.errstate(all="ignore"):  # weights holding inf/NaN compute inf/NaN: compared, not warned about
        return {name: reference_forward.forward(layout, batch, heads) for name, batch in batches.items()}


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


def _scales(ref: dict) -> dict:
    """{output: max(1, max |finite value|) over every batch}: what a relative difference is of."""
    out = {}
    for outputs in ref.values():
        for k, v in outputs.items():
            a = np.abs(np.asarray(v, np.float64))
            a = a[np.isfinite(a)]
            out[k] = max(out.get(k, 1.0), float(a.max()) if a.size else 1.0)
    return out


def _diffs(ref: dict, run: dict, batches: dict) -> dict:
    """{output: max |diff| over every batch}, for the outputs both sides computed. Per-token
    outputs are compared at the real tokens: what a padding position yields nobody reads, and
    its fp32 rounding is the largest (all-MiniLM-L6-v2: 1.0e-5 there, at most 2.3e-6 on tokens)."""
    out = {}
    for batch, outputs in ref.items():
        real = np.asarray(batches[batch]["attention_mask"]).astype(bool)
        for k, v in outputs.items():
            if k in run.get(batch, {}):
                a, b = np.asarray(v), np.asarray(run[batch][k])
                if a.shape[:2] == real.shape and b.shape[:2] == real.shape:
                    a, b = a[real], b[real]
                out[k] = max(out.get(k, 0.0), max_abs_diff(a, b))
    return out


def _read_side(path: str, fmt: str, opts: Options):
    read_side = registry.get(fmt).read_reference_side  # e.g. TF's side needs no vocabulary
    if read_side is not None:
        numerics_gate(fmt, opts)
        return read_side(path, opts)
    return read(path, fmt, Options(vocab=opts.vocab, config=opts.config, numerics=opts.numerics))


def verify(a: str, b: str, tol: float | None = None, modes=("eager", "graph"), batch_size: int = 3,
           seq_len: int | None = None, opts: Options | None = None, reference_dtype: str = "float64",
           device: str = "cpu", torch_python: str | None = None) -> dict:
    """``bert-of verify A B``: read A (the reference side) and B, then :func:`verify_source`."""
    opts = opts or Options()
    a, b = model_path(a), model_path(b)  # a training run's folder: the model it published
    fa, fb = detect(a), detect(b)
    src_a = _read_side(a, fa, opts)
    src_b = _read_side(b, fb, Options())  # both read (and checked) before anything runs
    return verify_source(src_a, b, fb, tol, modes, batch_size, seq_len, reference_dtype, device, src_b,
                         torch_python=torch_python)


def verify_source(source, b: str, fb: str, tol: float | None = None, modes=("eager", "graph"),
                  batch_size: int = 3, seq_len: int | None = None, reference_dtype: str = "float64",
                  device: str = "cpu", src_b=None, shown_b: str | None = None,
                  torch_python: str | None = None) -> dict:
    """Compare the checkpoint at ``b`` (format ``fb``) with the ``Source`` it was made from.

    The reference is the NumPy BERT on ``source``'s stored tensors; every run of ``b`` (bert_of
    eager/graph on ``device``; its own layout's reference when ``fb`` is not bert_of's; TF when
    it is a Google checkpoint, transformers when it is an HF checkpoint and torch is at hand) is
    compared with it, and ``ok`` says every output of every run is within ``tol``. The source's
    ecosystem run (TensorFlow for tf/h5, transformers for hf, onnxruntime for onnx) is reported beside;
    on B, onnxruntime running the written ONNX graph decides too, where it is installed.
    ``torch_python``: an interpreter with torch and transformers, when this one has none. ``shown_b``: the path the
    report names for ``b`` (convert: the destination, not the staging folder). ``tol`` None: DEFAULT_TOL, or,
    when every weight of B is float16, FLOAT16_TOL relative to each output's magnitude (FLOAT16_RULE)."""
    fa = source.format
    src_b = src_b or _read_side(b, fb, Options())
    batches, described = {}, {}
    real, about = token_batch(source)
    if real is not None:
        batches["tokens"], described["tokens"] = real, about
    else:
        described["tokens"] = {"skipped": about}
    batches["random"] = make_batch(source.config, batch_size, seq_len)
    described["random"] = {"size": int(batches["random"]["input_ids"].shape[0]),
                           "seq_len": int(batches["random"]["input_ids"].shape[1]),
                           "tokens": int(batches["random"]["attention_mask"].sum())}
    batches = {"inputs": _stack(list(batches.values()))}  # one run of each side: one graph, one TF restore
    reference = f"numpy-float64 ({fa} layout)"
    with Progress("verify", total=4, unit="stage") as bar:
        bar.describe(f"verify: reference ({reference})")
        try:
            ref = _numpy_runs(source, batches)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{source.path}: the reference cannot compute this checkpoint ({e})") from None
        bar.update(1)
        eco_a, eco_b = registry.get(fa).ecosystem, registry.get(fb).ecosystem
        ecosystem = {}  # {name: EcosystemRun} reported beside the reference
        if eco_a is not None and eco_a.runs_a:
            bar.describe(f"verify: {eco_a.title} on A ({eco_a.dtype or reference_dtype})")
            run_a = ecosystems.run(eco_a, "A", source, source.path, batches, reference_dtype, torch_python)
            ecosystem[run_a.name] = run_a
        bar.update(1)
        bar.describe(f"verify: bert_of on B ({' + '.join(modes)})")
        model = _bert_of_or_why(src_b, batches, modes, device)
        runs = {f"B:{m}": r for m, r in model.items()} if isinstance(model, dict) else {}
        bar.update(1)
        # bert_of's own layout ran above as bert_of's model; without OneFlow, B's layout checks B
        if registry.get(fb).reference is not reference_np.BertOf or not runs:
            bar.describe(f"verify: B in its own layout ({fb})")
            runs[f"B:numpy-float64 ({fb} layout)"] = _numpy_runs(src_b, batches)
            if eco_b is not None and eco_b.runs_b:  # what B's own codebase computes from its files decides too
                run_b = ecosystems.run(eco_b, "B", src_b, b, batches, reference_dtype, torch_python)
                if run_b.outputs is not None:
                    runs[run_b.name] = run_b.outputs
                else:
                    ecosystem[run_b.name] = run_b
        bar.update(1)
    results = {k: _diffs(ref, v, batches) for k, v in runs.items()}
    rule = None
    if tol is None and {np.dtype(s.dtype) for s, _ in src_b.tensors} == {np.dtype(np.float16)}:
        tol, rule = FLOAT16_TOL, FLOAT16_RULE
        scale = _scales(ref)
        results = {k: {o: d / scale.get(o, 1.0) for o, d in r.items()} for k, r in results.items()}
    tol = DEFAULT_TOL if tol is None else tol
    worst = max((v for r in results.values() for v in r.values()), default=float("inf"))
    if isinstance(model, str):  # the report says so ("bert_of_model"); a note would be a second stderr line
        log.debug("verify: bert_of's OneFlow model %s; the NumPy reference in each file's layout decides", model)
    for k, v in ecosystem.items():
        if v.skipped_reason is not None:  # the NumPy reference still decides
            log.info("verify: %s %s", k, v.message)
    failed = {k: v.message for k, v in ecosystem.items() if k.startswith("B:") and v.failure is not None}
    return {
        "a": {"path": source.path, "format": fa}, "b": {"path": shown_b or b, "format": fb},
        "reference": reference, "bert_of_model": " + ".join(modes) if isinstance(model, dict) else model,
        "tolerance": tol, **({"tolerance_rule": rule} if rule else {}), "device": device, "batches": described,
        "outputs": sorted({k for r in results.values() for k in r}),
        "max_abs_diff": results, "worst": worst, "ok": bool(results and worst <= tol and not failed),
        "failures": failed,
        "ecosystem": {k: (_diffs(ref, v.outputs, batches) if v.outputs is not None else v.message)
                      for k, v in ecosystem.items()},
    }


def format_report(report: dict) -> str:
    return json.dumps(report, indent=2)


def verdict(report: dict) -> str:
    """The report in one line: A and B, ok or not, the largest difference against the tolerance,
    the reference and the runs compared (the JSON report holds every number)."""
    a, b = report["a"], report["b"]
    worst, tol = report["worst"], report["tolerance"]
    ok = "ok" if report["ok"] else "FAILED"
    runs = ", ".join(k.split(":", 1)[1] for k in report["max_abs_diff"])
    why = "; " + "; ".join(f"{k} {v}" for k, v in report["failures"].items()) if report.get("failures") else ""
    measure = f"{report['tolerance_rule']} {worst:.3g}" if report.get("tolerance_rule") else f"max |diff| {worst:.3g}"
    return (f"verify: {ok}: {b['path']} ({b['format']}) computes what {a['path']} ({a['format']}) does: {measure} "
            f"{'<=' if worst <= tol else '>'} {tol:g} against {report['reference']} ({runs}){why}")
