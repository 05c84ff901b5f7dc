"""Tests of converters/tf_reference*.py, the TensorFlow yardstick of Google's BERT.

The reference is itself checked against a float64 numpy forward written here
from the math (not from the reference's code), against Google's variable
layout written out by hand, and for its ability to see activation mismatches.
"""

import os
import sys
from math import erf, pi, sqrt

import numpy as np
import pytest


tf = pytest.importorskip("tensorflow")
from bert_of.converters.verify import tf_reference as ref  # noqa: E402
from bert_of.converters.verify import tf_reference_checkpoint as ref_ckpt  # noqa: E402

pytestmark = pytest.mark.tf

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=40, type_vocab_size=3,
            hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
            initializer_range=0.02)
RELU = dict(TINY, hidden_act="relu", type_vocab_size=2)
ONE_LAYER = dict(TINY, num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                 intermediate_size=24, vocab_size=57, max_position_embeddings=20)
CONFIGS = {"tiny": TINY, "relu": RELU, "one_layer": ONE_LAYER}
ALL_HEADS = ("pretraining", "squad", "classifier")


# --------------------------------------------------------------------------- helpers


def google_layout(cfg, heads=("pretraining",), num_labels=2):
    """Google's variable names and shapes, written out from modeling.py,
    run_pretraining.py, run_squad.py and run_classifier.py."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = {
        "bert/embeddings/word_embeddings": [V, H],
        "bert/embeddings/token_type_embeddings": [cfg["type_vocab_size"], H],
        "bert/embeddings/position_embeddings": [cfg["max_position_embeddings"], H],
        "bert/embeddings/LayerNorm/gamma": [H],
        "bert/embeddings/LayerNorm/beta": [H],
        "bert/pooler/dense/kernel": [H, H],
        "bert/pooler/dense/bias": [H],
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}/"
        for n in ("query", "key", "value"):
            d[p + f"attention/self/{n}/kernel"] = [H, H]
            d[p + f"attention/self/{n}/bias"] = [H]
        d[p + "attention/output/dense/kernel"] = [H, H]
        d[p + "attention/output/dense/bias"] = [H]
        d[p + "attention/output/LayerNorm/gamma"] = [H]
        d[p + "attention/output/LayerNorm/beta"] = [H]
        d[p + "intermediate/dense/kernel"] = [H, I]
        d[p + "intermediate/dense/bias"] = [I]
        d[p + "output/dense/kernel"] = [I, H]
        d[p + "output/dense/bias"] = [H]
        d[p + "output/LayerNorm/gamma"] = [H]
        d[p + "output/LayerNorm/beta"] = [H]
    if "pretraining" in heads:
        d["cls/predictions/transform/dense/kernel"] = [H, H]
        d["cls/predictions/transform/dense/bias"] = [H]
        d["cls/predictions/transform/LayerNorm/gamma"] = [H]
        d["cls/predictions/transform/LayerNorm/beta"] = [H]
        d["cls/predictions/output_bias"] = [V]
        d["cls/seq_relationship/output_weights"] = [2, H]
        d["cls/seq_relationship/output_bias"] = [2]
    if "squad" in heads:
        d["cls/squad/output_weights"] = [2, H]
        d["cls/squad/output_bias"] = [2]
    if "classifier" in heads:
        d["output_weights"] = [num_labels, H]
        d["output_bias"] = [num_labels]
    return d


_verf = np.vectorize(erf)


def np_act(name, x):
    if name in ("gelu", "gelu_tanh"):
        return 0.5 * x * (1.0 + np.tanh(sqrt(2.0 / pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu_erf":
        return 0.5 * x * (1.0 + _verf(x / sqrt(2.0)))
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "tanh":
        return np.tanh(x)
    if name == "linear":
        return x
    raise ValueError(name)


def np_forward(weights, cfg, batch):
    """BERT forward in float64 numpy, from the equations."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    act = cfg.get("bert_of_hidden_act", cfg.get("hidden_act", "gelu"))
    eps = cfg.get("layer_norm_eps", 1e-12)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + "/LayerNorm/gamma"] + w[p + "/LayerNorm/beta"]

    def lin(x, p):
        return x @ w[p + "/kernel"] + w[p + "/bias"]

    ids, tt = batch["input_ids"], batch["token_type_ids"]
    mask = batch["attention_mask"].astype(np.float64)
    B, S = ids.shape
    H, N = cfg["hidden_size"], cfg["num_attention_heads"]
    D = H // N
    e = "bert/embeddings"
    x = w[e + "/word_embeddings"][ids] + w[e + "/token_type_embeddings"][tt] + w[e + "/position_embeddings"][:S]
    x = ln(x, e)
    split = lambda t: t.reshape(B, S, N, D).transpose(0, 2, 1, 3)
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}"
        q, k, v = (split(lin(x, f"{p}/attention/self/{n}")) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / sqrt(D) - 10000.0 * (1.0 - mask)[:, None, None, :]
        s = np.exp(s - s.max(-1, keepdims=True))
        probs = s / s.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(B, S, H)
        y = ln(lin(ctx, p + "/attention/output/dense") + x, p + "/attention/output")
        x = ln(lin(np_act(act, lin(y, p + "/intermediate/dense")), p + "/output/dense") + y, p + "/output")
    out = {"sequence_output": x, "pooled_output": np.tanh(lin(x[:, 0], "bert/pooler/dense"))}
    if "cls/predictions/output_bias" in w:
        h = ln(np_act(act, lin(x, "cls/predictions/transform/dense")), "cls/predictions/transform")
        out["prediction_logits"] = h @ w[e + "/word_embeddings"].T + w["cls/predictions/output_bias"]
        out["seq_relationship_logits"] = (out["pooled_output"] @ w["cls/seq_relationship/output_weights"].T
                                          + w["cls/seq_relationship/output_bias"])
    if "cls/squad/output_weights" in w:
        lg = x @ w["cls/squad/output_weights"].T + w["cls/squad/output_bias"]
        out["start_logits"], out["end_logits"] = lg[..., 0], lg[..., 1]
    if "output_weights" in w:
        out["logits"] = out["pooled_output"] @ w["output_weights"].T + w["output_bias"]
    return out


def max_diff(a, b, keys=None):
    keys = keys or sorted(set(a) & set(b))
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) for k in keys)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("tiny") / "model.ckpt")
    ref_ckpt.make_checkpoint(prefix, TINY, seed=0, heads=ALL_HEADS, realistic=True)
    return prefix


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_checkpoint_layout_is_googles(tmp_path, name):
    cfg = CONFIGS[name]
    prefix = str(tmp_path / "model.ckpt")
    ref_ckpt.make_checkpoint(prefix, cfg, seed=1, heads=ALL_HEADS, realistic=False)
    for suffix in (".index", ".data-00000-of-00001", ".meta"):
        assert os.path.isfile(prefix + suffix), suffix
    assert tf.train.latest_checkpoint(str(tmp_path)) == prefix
    got = {n: list(s) for n, s in tf.train.list_variables(prefix)}
    assert got == google_layout(cfg, ALL_HEADS, num_labels=2)
    reader = tf.train.load_checkpoint(prefix)
    assert set(reader.get_variable_to_dtype_map().values()) == {tf.float32}
    # Google's init: LayerNorm gamma 1 / beta 0, zero biases, truncated normal kernels.
    assert np.all(reader.get_tensor("bert/encoder/layer_0/output/LayerNorm/gamma") == 1)
    assert np.all(reader.get_tensor("bert/embeddings/LayerNorm/beta") == 0)
    assert np.all(reader.get_tensor("cls/predictions/output_bias") == 0)
    k = reader.get_tensor("bert/encoder/layer_0/intermediate/dense/kernel")
    assert np.abs(k).max() <= 2 * 0.02 + 1e-7 and 0.01 < k.std() < 0.02


def test_heads_subsets_and_num_labels(tmp_path):
    prefix = str(tmp_path / "squad.ckpt")
    ref_ckpt.make_checkpoint(prefix, TINY, heads=("squad",))
    got = {n: list(s) for n, s in tf.train.list_variables(prefix)}
    assert got == google_layout(TINY, ("squad",))
    out = ref.run_reference(prefix, TINY, ref.make_batch(TINY))
    assert set(out) == {"sequence_output", "pooled_output", "start_logits", "end_logits"}

    prefix = str(tmp_path / "cls.ckpt")
    cfg = dict(TINY, num_labels=3)
    ref_ckpt.make_checkpoint(prefix, cfg, heads=("classifier",))
    got = {n: list(s) for n, s in tf.train.list_variables(prefix)}
    assert got == google_layout(cfg, ("classifier",), num_labels=3)
    out = ref.run_reference(prefix, TINY, ref.make_batch(TINY))  # num_labels read from the checkpoint
    assert set(out) == {"sequence_output", "pooled_output", "logits"}
    assert out["logits"].shape == (3, 3)


def test_optimizer_slots_and_global_step(tmp_path, tiny_ckpt):
    prefix = str(tmp_path / "model.ckpt-7")
    ref_ckpt.make_checkpoint(prefix, TINY, seed=0, heads=ALL_HEADS, with_optimizer=True, global_step=7)
    got = {n: list(s) for n, s in tf.train.list_variables(prefix)}
    model = google_layout(TINY, ALL_HEADS)
    want = dict(model)
    for n, s in model.items():
        want[n + "/adam_m"] = s
        want[n + "/adam_v"] = s
    want["global_step"] = []
    assert got == want
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["global_step"] == tf.int64 and reader.get_tensor("global_step") == 7
    assert all(dtypes[n] == tf.float32 for n in want if n != "global_step")
    for n in model:
        assert np.all(reader.get_tensor(n + "/adam_v") >= 0)
    # Slots are ignored by the forward; model values equal the slot-free checkpoint's.
    batch = ref.make_batch(TINY)
    a = ref.run_reference(prefix, TINY, batch)
    b = ref.run_reference(tiny_ckpt, TINY, batch)
    assert max_diff(a, b) == 0.0


# --------------------------------------------------------------------------- numerics


def test_outputs_shapes_finite_deterministic(tiny_ckpt):
    batch = ref.make_batch(TINY, batch_size=3)
    a = ref.run_reference(tiny_ckpt, TINY, batch)
    b = ref.run_reference(tiny_ckpt, TINY, batch)
    B, S, H, V = 3, 16, 32, 99
    shapes = {"sequence_output": (B, S, H), "pooled_output": (B, H), "prediction_logits": (B, S, V),
              "seq_relationship_logits": (B, 2), "start_logits": (B, S), "end_logits": (B, S),
              "logits": (B, 2)}
    assert {k: v.shape for k, v in a.items()} == shapes
    for k in a:
        assert a[k].dtype == np.float32 and np.all(np.isfinite(a[k])), k
        assert np.array_equal(a[k], b[k]), k
    # Same seed -> same checkpoint; numpy weights path -> same numbers.
    w = ref_ckpt.make_weights(TINY, seed=0, heads=ALL_HEADS, realistic=True)
    reader = tf.train.load_checkpoint(tiny_ckpt)
    for n, v in w.items():
        assert np.array_equal(reader.get_tensor(n), v), n
    c = ref.forward_numpy_weights(w, TINY, batch, return_all_layers=True)
    assert max_diff(a, c, keys=list(a)) == 0.0
    assert np.array_equal(c["encoder_layer_2"], a["sequence_output"])
    assert c["embedding_output"].shape == (B, S, H)
    # A directory resolves to its latest checkpoint.
    d = ref.run_reference(os.path.dirname(tiny_ckpt), TINY, batch)
    assert max_diff(a, d) == 0.0
    # A different seed gives different weights.
    w1 = ref_ckpt.make_weights(TINY, seed=1, heads=ALL_HEADS)
    assert not np.array_equal(w1["bert/pooler/dense/kernel"], w["bert/pooler/dense/kernel"])


@pytest.mark.parametrize("realistic", [True, False], ids=["realistic", "google_init"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_float64_numpy(name, realistic):
    cfg = CONFIGS[name]
    w = ref_ckpt.make_weights(cfg, seed=3, heads=ALL_HEADS, realistic=realistic)
    batch = ref.make_batch(cfg, batch_size=3, seed=3)
    got = ref.forward_numpy_weights(w, cfg, batch)
    want = np_forward(w, cfg, batch)
    assert set(got) == set(want)
    assert max_diff(got, want) < 1e-5


@pytest.mark.parametrize("act", ["gelu_erf", "tanh", "linear", "gelu_tanh"])
def test_activation_and_eps_options_match_numpy(act):
    cfg = dict(TINY, bert_of_hidden_act=act, layer_norm_eps=1e-5)
    w = ref_ckpt.make_weights(cfg, seed=4, heads=("pretraining",))
    batch = ref.make_batch(cfg, seed=4)
    got = ref.forward_numpy_weights(w, cfg, batch)
    assert max_diff(got, np_forward(w, cfg, batch)) < 1e-5
    # bert_of_hidden_act (set above, beside hidden_act "gelu") overrides Google's label.
    plain = {k: v for k, v in cfg.items() if k != "bert_of_hidden_act"}
    plain["hidden_act"] = act
    same = ref.forward_numpy_weights(w, plain, batch)
    assert max_diff(got, same) == 0.0


def test_layer_norm_eps_is_used():
    w = ref_ckpt.make_weights(TINY, seed=5, heads=("pretraining",))
    batch = ref.make_batch(TINY, seed=5)
    a = ref.forward_numpy_weights(w, TINY, batch)
    b = ref.forward_numpy_weights(w, dict(TINY, layer_norm_eps=1e-3), batch)
    assert max_diff(a, b) > 1e-5


def test_realistic_weights_expose_gelu_variant():
    """tanh-GELU vs erf-GELU must be visible on realistic weights, not on Google's init."""
    batch = ref.make_batch(TINY)
    diffs = {}
    for realistic in (True, False):
        w = ref_ckpt.make_weights(TINY, seed=0, heads=ALL_HEADS, realistic=realistic)
        t = ref.forward_numpy_weights(w, TINY, batch)
        e = ref.forward_numpy_weights(w, dict(TINY, hidden_act="gelu_erf"), batch)
        diffs[realistic] = float(np.abs(t["sequence_output"] - e["sequence_output"]).max())
        if realistic:
            # Not saturated: attention not one-hot, pooled tanh not all +-1, MLM softmax spread.
            assert np.mean(np.abs(t["pooled_output"]) > 0.99) < 0.3
            p = np.exp(t["prediction_logits"] - t["prediction_logits"].max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            assert np.median(p.max(-1)) < 0.9
    assert diffs[True] > 1e-4, diffs
    assert diffs[False] < 1e-5 and diffs[False] < diffs[True] / 50, diffs


def test_padding_does_not_leak():
    w = ref_ckpt.make_weights(TINY, seed=6, heads=ALL_HEADS)
    batch = ref.make_batch(TINY, batch_size=3, seed=6)
    mask = batch["attention_mask"].astype(bool)
    assert (~mask).any()
    changed = {k: v.copy() for k, v in batch.items()}
    rng = np.random.default_rng(0)
    changed["input_ids"][~mask] = rng.integers(1, TINY["vocab_size"], int((~mask).sum()))
    changed["token_type_ids"][~mask] = 1
    a = ref.forward_numpy_weights(w, TINY, batch)
    b = ref.forward_numpy_weights(w, TINY, changed)
    diff = np.abs(a["sequence_output"] - b["sequence_output"])[mask]
    assert diff.max() <= 1e-6
    assert np.abs(a["pooled_output"] - b["pooled_output"]).max() <= 1e-6
    # ... while a change at an unmasked position does change the output.
    c = {k: v.copy() for k, v in batch.items()}
    c["input_ids"][0, 1] = (c["input_ids"][0, 1] + 1) % TINY["vocab_size"]
    assert np.abs(ref.forward_numpy_weights(w, TINY, c)["sequence_output"][0] - a["sequence_output"][0]).max() > 1e-3


def test_make_batch():
    b = ref.make_batch(TINY, batch_size=4, seed=2)
    ids, tt, m = b["input_ids"], b["token_type_ids"], b["attention_mask"]
    assert ids.shape == tt.shape == m.shape == (4, 16)
    assert all(a.dtype == np.int64 for a in (ids, tt, m))
    lengths = m.sum(1)
    assert lengths[0] == 16 and len(set(lengths.tolist())) == 4
    for r, L in enumerate(lengths):
        assert np.all(m[r, :L] == 1) and np.all(m[r, L:] == 0)
        assert np.all(ids[r, L:] == 0) and np.all(tt[r, L:] == 0)
        sep = ids[r, L - 1]
        assert (ids[r, :L] == sep).sum() == 2 and ids[r, 0] != sep
        assert tt[r, 0] == 0 and tt[r, L - 1] >= 1
    assert ids.max() < TINY["vocab_size"] and ids.min() >= 0
    assert tt.max() == 2  # type_vocab_size 3: the extra type is used
    assert ref.make_batch(RELU, batch_size=3)["token_type_ids"].max() == 1
    assert ref.make_batch(dict(TINY, max_position_embeddings=8))["input_ids"].shape == (3, 8)
    assert np.array_equal(ref.make_batch(TINY, seed=2)["input_ids"], ref.make_batch(TINY, seed=2)["input_ids"])
