"""Make tests/data/tf2_real/: checkpoints written by Model Garden's own trainers (tf-models-official).

Runs OUTSIDE this repository, in a venv that has tf-models-official (see README.md for the exact
versions and the install), on CPU:

    python make_fixtures.py WORK OUT

1. writes a 100-token vocab.txt and tiny TFRecords of tf.train.Examples with the features Model
   Garden's data loaders parse (pretraining: input_ids/input_mask/segment_ids/masked_lm_*/
   next_sentence_labels as official/nlp/data/create_pretraining_data.py writes them; SQuAD training
   features: input_ids/input_mask/segment_ids/start_positions/end_positions);
2. runs `python -m official.nlp.train --experiment=bert/pretraining --mode=train` (the MaskedLMTask,
   BertPretrainerV2 with its default next_sentence classification head, AdamWeightDecay) for 6
   steps: the trainer saves `ckpt-6` (tf.train.Checkpoint(global_step, model, optimizer));
3. exports the pretrained encoder as the fine-tuning tasks read it:
   `tf.train.Checkpoint(**BertPretrainerV2.checkpoint_items)` (encoder/ + masked_lm/ + the heads);
4. runs `python -m official.nlp.train --experiment=bert/squad --mode=train` (QuestionAnsweringTask,
   BertSpanLabeler) for 4 steps from that export (`task.init_checkpoint`): `ckpt-4`;
5. restores each checkpoint into the task's own model (task.build_model(), eval mode) and records
   what Model Garden computes on a fixed batch: `garden_outputs.npz` (inputs + outputs).

Nothing of Model Garden's code is copied: it is imported from the installed package and run.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np

V, H, LAYERS, HEADS, I, P, S, MAX_PRED = 100, 32, 2, 2, 64, 64, 32, 5
# initializer_range 0.2 (not 0.02): on weights this small the tanh and erf GELUs would differ by
# less than the 1e-5 the tests compare at; at 0.2 the wrong GELU is visibly wrong (the control).
ENCODER = {"type": "bert", "bert": {"vocab_size": V, "hidden_size": H, "num_layers": LAYERS,
                                    "num_attention_heads": HEADS, "intermediate_size": I,
                                    "max_position_embeddings": P, "type_vocab_size": 2,
                                    "initializer_range": 0.2}}
RUNTIME = {"distribution_strategy": "one_device", "num_gpus": 0}


def trainer(steps, lr):
    return {"train_steps": steps, "steps_per_loop": 2, "summary_interval": 2, "checkpoint_interval": steps,
            "validation_interval": steps, "max_to_keep": 5,
            "optimizer_config": {"learning_rate": {"type": "polynomial", "polynomial": {
                "initial_learning_rate": lr, "decay_steps": steps, "end_learning_rate": 0.0}},
                "warmup": {"type": "polynomial", "polynomial": {"warmup_steps": 1}}}}


def write_vocab(path):
    words = ["[PAD]"] + [f"[unused{i}]" for i in range(4)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words += [f"w{i}" for i in range(V - len(words))]
    assert len(words) == V
    with open(path, "w") as f:
        f.write("\n".join(words) + "\n")


def feature_ints(tf, values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def write_pretraining(tf, path, n, rng):
    """Google's create_pretraining_data.py record layout (the one BertPretrainDataLoader parses)."""
    with tf.io.TFRecordWriter(path) as w:
        for _ in range(n):
            a, b = int(rng.integers(4, 12)), int(rng.integers(4, 12))
            ids = [6] + list(rng.integers(9, V, a)) + [7] + list(rng.integers(9, V, b)) + [7]
            seg = [0] * (a + 2) + [1] * (b + 1)
            pos = sorted(rng.choice(np.arange(1, len(ids) - 1), MAX_PRED, replace=False))
            labels = [ids[p] for p in pos]
            for p in pos:
                ids[p] = 8
            pad = S - len(ids)
            feats = {"input_ids": feature_ints(tf, ids + [0] * pad),
                     "input_mask": feature_ints(tf, [1] * len(ids) + [0] * pad),
                     "segment_ids": feature_ints(tf, seg + [0] * pad),
                     "masked_lm_positions": feature_ints(tf, pos), "masked_lm_ids": feature_ints(tf, labels),
                     "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * MAX_PRED)),
                     "next_sentence_labels": feature_ints(tf, [int(rng.integers(0, 2))])}
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


def write_squad(tf, path, n, rng):
    """The training features of official/nlp/data/squad_lib.py (what QADataLoader parses)."""
    with tf.io.TFRecordWriter(path) as w:
        for _ in range(n):
            q, c = int(rng.integers(3, 8)), int(rng.integers(10, 20))
            ids = [6] + list(rng.integers(9, V, q)) + [7] + list(rng.integers(9, V, c)) + [7]
            start = int(rng.integers(q + 2, q + 2 + c - 3))
            pad = S - len(ids)
            feats = {"input_ids": feature_ints(tf, ids + [0] * pad),
                     "input_mask": feature_ints(tf, [1] * len(ids) + [0] * pad),
                     "segment_ids": feature_ints(tf, [0] * (q + 2) + [1] * (c + 1) + [0] * pad),
                     "start_positions": feature_ints(tf, [start]), "end_positions": feature_ints(tf, [start + 2])}
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


def train(experiment, model_dir, override, log):
    """Model Garden's own entry point, as its README runs it."""
    cfg = os.path.join(os.path.dirname(model_dir), os.path.basename(model_dir) + "_override.yaml")
    with open(cfg, "w") as f:
        json.dump(override, f, indent=1)  # JSON is YAML: train.py's --config_file reads it
    cmd = [sys.executable, "-m", "official.nlp.train", f"--experiment={experiment}", "--mode=train",
           f"--model_dir={model_dir}", f"--config_file={cfg}"]
    log.append(" ".join(cmd[1:]) + "   # " + json.dumps(override))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(cmd, check=True, env=env)


def fixed_batch():
    rng = np.random.default_rng(7)
    ids = rng.integers(9, V, (2, S)).astype(np.int32)
    ids[:, 0] = 6
    ids[0, 20], ids[1, 12] = 7, 7
    mask = np.ones((2, S), np.int32)
    mask[1, 24:] = 0
    ids[1, 24:] = 0
    types = np.zeros((2, S), np.int32)
    types[0, 21:] = 1
    types[1, 13:24] = 1
    return ids, types, mask


def main(work, out):
    import tensorflow as tf
    from official.common import registry_imports  # noqa: F401  (registers the experiments and tasks)
    from official.core import exp_factory, task_factory


    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    vocab = os.path.join(work, "vocab.txt")
    write_vocab(vocab)
    write_pretraining(tf, os.path.join(work, "pretrain.tfrecord"), 96, rng)
    write_squad(tf, os.path.join(work, "squad_train.tfrecord"), 64, rng)
    log = []

    pre_dir = os.path.join(work, "pretrain")
    data = {"input_path": os.path.join(work, "pretrain.tfrecord"), "global_batch_size": 8, "seq_length": S,
            "max_predictions_per_seq": MAX_PRED, "use_next_sentence_label": True}
    pre = {"task": {"model": {"encoder": ENCODER, "mlm_initializer_range": 0.2,
                              "cls_heads": [{"inner_dim": H, "num_classes": 2, "dropout_rate": 0.1,
                                             "name": "next_sentence"}]},
                    "train_data": data, "validation_data": dict(data, is_training=False)},
           "trainer": trainer(6, 1e-2), "runtime": RUNTIME}
    shutil.rmtree(pre_dir, ignore_errors=True)
    train("bert/pretraining", pre_dir, pre, log)

    # The pretraining task's model, restored from the trainer's checkpoint.
    params = exp_factory.get_exp_config("bert/pretraining")
    params.override(pre, is_strict=False)
    task = task_factory.get_task(params.task)
    model = task.build_model()
    ckpt = tf.train.latest_checkpoint(pre_dir)
    tf.train.Checkpoint(model=model).read(ckpt).expect_partial().assert_existing_objects_matched()
    ids, types, mask = fixed_batch()
    enc = model.encoder_network({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}, training=False)
    positions = np.tile(np.arange(S, dtype=np.int32), (2, 1))
    full = model({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types,
                  "masked_lm_positions": positions}, training=False)
    pre_out = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
               "sequence_output": enc["sequence_output"].numpy(), "pooled_output": enc["pooled_output"].numpy(),
               "mlm_logits": full["mlm_logits"].numpy(), "next_sentence": full["next_sentence"].numpy()}

    # The pretrained encoder as fine-tuning reads it (task.init_checkpoint): checkpoint_items.
    export_dir = os.path.join(work, "pretrained")
    shutil.rmtree(export_dir, ignore_errors=True)
    export_prefix = tf.train.Checkpoint(**model.checkpoint_items).write(os.path.join(export_dir, "bert_model.ckpt"))
    log.append(f"tf.train.Checkpoint(**BertPretrainerV2.checkpoint_items).write({export_prefix!r})")

    sq_dir = os.path.join(work, "squad")
    sq_data = {"input_path": os.path.join(work, "squad_train.tfrecord"), "global_batch_size": 8, "seq_length": S,
               "is_training": True, "drop_remainder": True}
    sq = {"task": {"init_checkpoint": export_prefix, "model": {"encoder": ENCODER},
                   "train_data": sq_data, "validation_data": dict(sq_data, input_path="", is_training=False)},  # train only: no SQuAD json
          "trainer": trainer(4, 5e-3), "runtime": RUNTIME}
    shutil.rmtree(sq_dir, ignore_errors=True)
    train("bert/squad", sq_dir, sq, log)
    params = exp_factory.get_exp_config("bert/squad")
    params.override(sq, is_strict=False)
    sq_task = task_factory.get_task(params.task)
    sq_model = sq_task.build_model()
    tf.train.Checkpoint(model=sq_model).read(tf.train.latest_checkpoint(sq_dir)).expect_partial() \
        .assert_existing_objects_matched()
    sq_enc = sq_model.checkpoint_items["encoder"]({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types},
                                      training=False)
    spans = sq_model({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}, training=False)
    if not isinstance(spans, dict):  # BertSpanLabeler returns [start_logits, end_logits]
        spans = dict(zip(("start_logits", "end_logits"), spans))
    sq_out = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
              "sequence_output": sq_enc["sequence_output"].numpy(), "pooled_output": sq_enc["pooled_output"].numpy(),
              "start_logits": spans["start_logits"].numpy(), "end_logits": spans["end_logits"].numpy()}

    # What is committed: the trainers' own files of the last checkpoint, the export, the outputs.
    shutil.rmtree(out, ignore_errors=True)
    for name, src, outputs in (("pretrain", pre_dir, pre_out), ("pretrained", export_dir, pre_out),
                               ("squad", sq_dir, sq_out)):
        dst = os.path.join(out, name)
        os.makedirs(dst)
        last = os.path.basename(tf.train.latest_checkpoint(src) or "bert_model.ckpt")  # the last save only
        for f in sorted(os.listdir(src)):
            if f.startswith(last + ".") or f in ("checkpoint", "params.yaml"):
                shutil.copy(os.path.join(src, f), dst)
        np.savez(os.path.join(dst, "garden_outputs.npz"), **outputs)
    shutil.copy(vocab, out)
    import importlib.metadata as md
    versions = {p: md.version(p) for p in ("tensorflow", "tf-models-official", "tf-keras", "numpy")}
    with open(os.path.join(out, "made_by.json"), "w") as f:
        json.dump({"python": sys.version.split()[0], "versions": versions,
                   "commands": log}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]))
