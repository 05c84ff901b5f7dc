"""Regenerate the HF Keras-h5 fixtures (developer tool; needs transformers + TensorFlow).

    .venv-anchor/bin/python tests/data/h5/make_fixtures.py

For each model below: build the tiny model with transformers' own TF classes,
give it realistic-magnitude weights, ``save_pretrained`` it (tf_model.h5 +
config.json, exactly as HF writes them), gzip the h5 (the fixtures stay small;
HDF5's group metadata is mostly padding), and record HF-TF's forward outputs on
a fixed padded batch in ``expected.npz`` (plain arrays, loads with
allow_pickle=False). Tests never import transformers: these files are the
independent reference.

Weights are rounded to bfloat16-representable float32 values: still float32
tensors of realistic magnitude (so tanh-vs-erf GELU or a wrong LayerNorm eps
shows far above 1e-5), but they compress to half.
"""

import gzip
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import transformers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# Odd sizes on purpose (a transposed dimension cannot hide); type_vocab 3 so
# every token-type row is used. The bare model computes tanh-GELU ("gelu_new")
# with eps 1e-6 so the numerics read from config.json are exercised too.
ODD = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
           max_position_embeddings=40, type_vocab_size=3)
MODELS = {
    "pretraining": ("TFBertForPreTraining", dict(ODD)),
    "bare": ("TFBertModel", dict(ODD, hidden_act="gelu_new", layer_norm_eps=1e-6)),
    "qa": ("TFBertForQuestionAnswering", dict(ODD)),
    "classifier": ("TFBertForSequenceClassification", dict(ODD, num_hidden_layers=1, num_labels=3, hidden_act="relu")),
}


def batch(cfg, B=2, S=12, seed=0):
    """[CLS] a.. [SEP] b.. [SEP] pad..; row 1 is shorter and uses token types 0, 1, 2."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, S), np.int32)
    types = np.zeros((B, S), np.int32)
    mask = np.zeros((B, S), np.int32)
    for b in range(B):
        n = S - 4 * b
        ids[b, :n] = rng.integers(5, cfg["vocab_size"], n)
        ids[b, 0], ids[b, n - 1] = 1, 2
        types[b, n // 2:n] = 1
        if b == B - 1:
            types[b, :n] = np.arange(n) % cfg["type_vocab_size"]
        mask[b, :n] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def realistic(name, shape, rng):
    short = name.split("/", 1)[1]
    if short.endswith("kernel:0"):
        std = float(np.clip(1.5 / np.sqrt(shape[0]), 0.02, 0.35))
        v = rng.standard_normal(shape) * std
    elif "embeddings" in short and not short.endswith(("gamma:0", "beta:0")):
        v = rng.standard_normal(shape) * 0.05
    elif short.endswith("gamma:0"):
        v = 0.9 + 0.2 * rng.standard_normal(shape)
    elif short.endswith("beta:0"):
        v = 0.1 * rng.standard_normal(shape)
    elif short.endswith("predictions/bias:0"):
        v = -1.0 + rng.standard_normal(shape)
    else:  # dense biases
        v = 0.08 * rng.standard_normal(shape)
    v = v.astype(np.float32)
    # round to the nearest bfloat16-representable float32 (keeps 8 significant bits)
    bits = v.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def make(key, cls_name, cfg_kw, seed):
    cls = getattr(transformers, cls_name)
    config = transformers.BertConfig(**cfg_kw)
    model = cls(config)
    inputs = batch(cfg_kw)
    model(inputs, training=False)  # build
    rng = np.random.default_rng(seed)
    for w in model.weights:  # shared (tied) variables appear once
        w.assign(realistic(w.name, tuple(w.shape), rng))
    out_dir = os.path.join(HERE, key)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp = os.path.join(HERE, f".{key}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    os.makedirs(out_dir)
    with open(os.path.join(tmp, "tf_model.h5"), "rb") as f, \
            gzip.GzipFile(os.path.join(out_dir, "tf_model.h5.gz"), "wb", mtime=0) as g:
        shutil.copyfileobj(f, g)
    shutil.copyfile(os.path.join(tmp, "config.json"), os.path.join(out_dir, "config.json"))
    shutil.rmtree(tmp)

    # HF-TF's forward on the batch, in eager mode, dropout off.
    out = model(inputs, training=False)
    base = model.bert(inputs, training=False)
    expected = {k: v.astype(np.int64) for k, v in inputs.items()}
    expected["sequence_output"] = base.last_hidden_state.numpy()
    if base.pooler_output is not None:
        expected["pooled_output"] = base.pooler_output.numpy()
    for name in ("prediction_logits", "seq_relationship_logits", "start_logits", "end_logits", "logits"):
        if getattr(out, name, None) is not None:
            expected[name] = out[name].numpy()
    np.savez_compressed(os.path.join(out_dir, "expected.npz"), **expected)
    print(key, {k: v.shape for k, v in expected.items()},
          os.path.getsize(os.path.join(out_dir, "tf_model.h5.gz")), file=sys.stderr)


if __name__ == "__main__":
    print("transformers", transformers.__version__, "tensorflow", tf.__version__, file=sys.stderr)
    for i, (key, (cls_name, cfg)) in enumerate(MODELS.items()):
        make(key, cls_name, cfg, seed=100 + i)
