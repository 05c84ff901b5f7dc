"""Regenerate google_golden.npz: the output of google-research/bert's own
create_pretraining_data.py on the fixture texts, the reference that
tests/e2e/test_pretraining_data.py compares `bert-of data create-pretraining --combine-files`
against, record for record.

Needs TensorFlow (tensorflow-cpu 2.15 in .venv) and a checkout of google-research/bert
(its create_pretraining_data.py and tokenization.py; not shipped here):

    .venv/bin/python tests/data/text/make_google_golden.py --google-bert /path/to/bert

Google's TF1 script runs unchanged with ``tensorflow`` bound to ``tf.compat.v1``.
"""

import argparse
import hashlib
import json
import os
import runpy
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "sample_text.txt")  # a copy of google-research/bert's sample_text.txt
CLASSICS = os.path.join(HERE, "classics.txt")
HOSTILE = os.path.join(HERE, "hostile.txt")  # controls, CJK, accents, 230-char words, CRLF, BOM, literal [CLS]
VOCAB = os.path.join(HERE, "vocab.txt")

# name -> (input files, flags). Small dupe factors keep the file small.
CASES = {
    "defaults": ([SAMPLE], dict(dupe_factor=2)),
    "wwm": ([SAMPLE, CLASSICS], dict(do_whole_word_mask=True, max_seq_length=64, max_predictions_per_seq=12,
                                     short_seq_prob=0.25, masked_lm_prob=0.2, dupe_factor=2, random_seed=7)),
    "hostile": ([HOSTILE, SAMPLE], dict(do_whole_word_mask=True, max_seq_length=48, max_predictions_per_seq=9,
                                        short_seq_prob=0.3, masked_lm_prob=0.25, dupe_factor=2, random_seed=5)),
    "hostile_cased": ([HOSTILE], dict(do_lower_case=False, max_seq_length=24, max_predictions_per_seq=4,
                                      dupe_factor=1, random_seed=11)),
}
FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_google(google_dir, inputs, flags, out_file):
    import tensorflow.compat.v1 as tf1

    sys.modules["tensorflow"] = tf1
    if google_dir not in sys.path:
        sys.path.insert(0, google_dir)
    argv = [f"--input_file={','.join(inputs)}", f"--output_file={out_file}", f"--vocab_file={VOCAB}"]
    argv += [f"--{k}={v}" for k, v in flags.items()]
    sys.argv = ["create_pretraining_data.py"] + argv
    tf1.flags.FLAGS.unparse_flags() if hasattr(tf1.flags.FLAGS, "unparse_flags") else None
    try:
        runpy.run_path(os.path.join(google_dir, "create_pretraining_data.py"), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    rows = {k: [] for k in FEATURES}
    for raw in tf1.io.tf_record_iterator(out_file):
        ex = tf1.train.Example.FromString(raw)
        for k in FEATURES:
            f = ex.features.feature[k]
            rows[k].append(list(f.float_list.value) if k == "masked_lm_weights" else list(f.int64_list.value))
    return {k: np.asarray(v, dtype=np.float32 if k == "masked_lm_weights" else np.int32) for k, v in rows.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--google-bert", required=True, help="directory with Google's create_pretraining_data.py")
    ap.add_argument("--case", choices=sorted(CASES), help="(internal) run one case, write --out")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.case:  # absl flags are process-global: one case per process
        inputs, flags = CASES[args.case]
        with tempfile.TemporaryDirectory() as d:
            arrays = run_google(os.path.abspath(args.google_bert), inputs, flags, os.path.join(d, "out.tfrecord"))
        np.savez(args.out, **arrays)
        return
    import subprocess

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, (inputs, flags) in CASES.items():
            p = os.path.join(d, f"{name}.npz")
            subprocess.run([sys.executable, __file__, "--google-bert", args.google_bert, "--case", name, "--out", p],
                           check=True)
            with np.load(p) as z:
                for k in z.files:
                    out[f"{name}/{k}"] = z[k]
            out[f"{name}/meta"] = np.array(json.dumps({
                "inputs": [os.path.basename(p) for p in inputs], "sha256": [sha256(p) for p in inputs],
                "vocab_sha256": sha256(VOCAB), "flags": flags}))
    np.savez_compressed(os.path.join(HERE, "google_golden.npz"), **out)
    print("wrote", os.path.join(HERE, "google_golden.npz"), {k: v.shape for k, v in out.items()})


if __name__ == "__main__":
    main()
