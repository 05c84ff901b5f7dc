"""Legacy lazy OneFlow snapshots end to end through the real CLI: lazy2of, of2lazy, lazy2tf, tf2lazy, verify.

The snapshots are laid out here by a small writer of our own (folders with raw
``out`` bytes, OneFlow's text ``meta``, ``snapshot_done``), independent of
converters/formats/lazy/, in each layout found in the wild: checkpoint v2 with Adam
slots, the oldest out-only layout, LAMB + fp16 loss-scale state, the output of
OneFlow-Benchmark's convert_tf_ckpt_to_of.py, and the SQuAD/classifier heads.
Weights have realistic magnitudes, so erf vs tanh GELU or eps 1e-5 vs 1e-12
would show far above the 1e-5 verification tolerance.
"""

import json
import math
import os
import re
import shutil
import warnings

import numpy as np
import pytest
import safetensors.numpy

from tests.conftest import TINY, error_lines, run_cli, write_vocab

JOB = "PretrainJob"
STEP = 4321
OF_DTYPES = {np.dtype("float32"): "kFloat", np.dtype("int64"): "kInt64", np.dtype("float16"): "kFloat16"}


# --------------------------------------------------------------------------- an independent snapshot writer


def lay_out(snap, tensors, meta=True, done=True):
    """One folder per variable: out = raw little-endian C-order bytes; meta = OneFlow's text format."""
    os.makedirs(snap)
    for name, arr in tensors.items():
        d = os.path.join(snap, name)
        os.mkdir(d)
        with open(os.path.join(d, "out"), "wb") as f:
            f.write(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        if meta:
            dims = "".join(f"  dim: {n}\n" for n in arr.shape)
            with open(os.path.join(d, "meta"), "w") as f:
                f.write(f"shape {{\n{dims}}}\ndata_type: {OF_DTYPES[arr.dtype]}\n")
    if done:
        open(os.path.join(snap, "snapshot_done"), "w").close()
    return snap


def bert_tensors(cfg, seed=0, heads=("pretraining",), tf_names=False, labels=3):
    """Lazy-OneFlow variables of a BERT in their on-disk layout (dense [in,out]), realistic magnitudes
    (embeddings ~0.05 as in trained BERTs, so LayerNorm eps 1e-5 vs 1e-12 shows; kernels ~1.5/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    H, I, V, P, T = (cfg[k] for k in ("hidden_size", "intermediate_size", "vocab_size",
                                      "max_position_embeddings", "type_vocab_size"))
    f32 = np.float32

    def kernel(i, o):
        return (rng.standard_normal((i, o)) * 1.5 / np.sqrt(i)).astype(f32)

    def vec(n, mean=0.0, std=0.2):
        return (mean + std * rng.standard_normal(n)).astype(f32)

    t = {
        "bert-embeddings-word_embeddings": vec((V, H), std=0.05),
        "bert-embeddings-token_type_embeddings": vec((T, H), std=0.05),
        # lazy OneFlow keeps [1, P, H]; convert_tf_ckpt_to_of.py writes Google's [P, H]
        "bert-embeddings-position_embeddings": vec((P, H) if tf_names else (1, P, H), std=0.05),
        "bert-embeddings-LayerNorm-gamma": vec(H, 0.9), "bert-embeddings-LayerNorm-beta": vec(H),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert-encoder-layer_{i}-"
        for n in ("attention-self-query", "attention-self-key", "attention-self-value", "attention-output-dense"):
            t[p + n + "-weight"], t[p + n + "-bias"] = kernel(H, H), vec(H)
        t[p + "attention-output-LayerNorm-gamma"], t[p + "attention-output-LayerNorm-beta"] = vec(H, 0.9), vec(H)
        t[p + "intermediate-dense-weight"], t[p + "intermediate-dense-bias"] = kernel(H, I), vec(I)
        t[p + "output-dense-weight"], t[p + "output-dense-bias"] = kernel(I, H), vec(H)
        t[p + "output-LayerNorm-gamma"], t[p + "output-LayerNorm-beta"] = vec(H, 0.9), vec(H)
    t["bert-pooler-dense-weight"], t["bert-pooler-dense-bias"] = kernel(H, H), vec(H)
    if "pretraining" in heads:
        t["cls-predictions-transform-dense-weight"], t["cls-predictions-transform-dense-bias"] = kernel(H, H), vec(H)
        t["cls-predictions-transform-LayerNorm-gamma"] = vec(H, 0.9)
        t["cls-predictions-transform-LayerNorm-beta"] = vec(H)
        t["cls-predictions-output_bias"] = vec(V, 1.0)
        t["cls-seq_relationship-output_weights"] = kernel(2, H)  # [out, in] already
        t["cls-seq_relationship-output_bias"] = vec(2)
    if "squad" in heads:
        if tf_names:
            t["cls-squad-output_weights"], t["cls-squad-output_bias"] = kernel(2, H), vec(2)
        else:
            t["cls-squad-output-weight"], t["cls-squad-output-bias"] = kernel(H, 2), vec(2)  # [in, out]
    if "classifier" in heads:
        if tf_names:  # the script's rfind('/') == -1 off-by-one
            t["output_weight-output_weights"], t["output_bia-output_bias"] = kernel(labels, H), vec(labels)
        else:
            t["classification-output_weights"], t["classification-output_bias"] = kernel(labels, H), vec(labels)
    return t


def adam_slots(model, rng, names=("m", "v")):
    out = {}
    for k, a in model.items():
        out[f"{k}-{names[0]}"] = (rng.standard_normal(a.shape) * 1e-3).astype(a.dtype)
        out[f"{k}-{names[1]}"] = (rng.random(a.shape) * 1e-6).astype(a.dtype)
    return out


def write_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


@pytest.fixture(scope="module")
def snaps(tmp_path_factory):
    root = tmp_path_factory.mktemp("lazy")
    rng = np.random.default_rng(5)
    s = {}

    # (a) checkpoint v2: out + meta, Adam -m/-v, TrainStep; config and vocab in the parent (model_save_dir)
    a = root / "a"
    a.mkdir()
    write_config(a / "bert_config.json", TINY)
    write_vocab(a / "vocab.txt", TINY["vocab_size"])
    model = bert_tensors(TINY, seed=1)
    lay_out(str(a / "snapshot_1000"), {**model, **adam_slots(model, rng),
                                        f"System-Train-TrainStep-{JOB}": np.array([STEP], np.int64)})
    s["adam"] = a / "snapshot_1000"

    # (b) the oldest layout: out files + snapshot_done, no meta, no config anywhere near
    b = root / "b"
    b.mkdir()
    cfg_b = dict(TINY, num_hidden_layers=2, hidden_act="relu")
    write_config(root / "config_b.json", cfg_b)
    lay_out(str(b / "snap"), {**bert_tensors(cfg_b, seed=2),
                              f"System-Train-TrainStep-{JOB}": np.array([77], np.int64)}, meta=False)
    s["nometa"], s["nometa_config"] = b / "snap", root / "config_b.json"

    # (c) LAMB slots + fp16 dynamic loss scale, config inside the snapshot
    model = bert_tensors(TINY, seed=3)
    opt = adam_slots(model, rng)
    for k in model:
        opt[f"{k}-beta1_t"] = np.array([0.9 ** 11], np.float32)
        opt[f"{k}-beta2_t"] = np.array([0.999 ** 11], np.float32)
    c = lay_out(str(root / "c"), {**model, **opt, "System-Train-TrainStep-LambJob": np.array([11], np.int64),
                                  "System-Train-DynamicLossScale-LambJob-LossScale": np.array([65536.0], np.float32),
                                  "System-Train-DynamicLossScale-LambJob-GoodStepCounter": np.array([7], np.int64)})
    write_config(os.path.join(c, "bert_config.json"), TINY)
    write_vocab(os.path.join(c, "vocab.txt"), TINY["vocab_size"])
    s["lamb"] = root / "c"

    # (d) convert_tf_ckpt_to_of.py output: TF names, [P,H] positions, <var>-kernel-adam_m, global_ste-global_step,
    #     out files only (no meta, no snapshot_done); config beside it
    d = root / "d"
    d.mkdir()
    write_config(d / "bert_config.json", TINY)
    write_vocab(d / "vocab.txt", TINY["vocab_size"])
    model = bert_tensors(TINY, seed=4, tf_names=True)
    opt = {}
    for k, arr in model.items():
        base = k[: -len("-weight")] + "-kernel" if k.endswith("-weight") else k
        opt[f"{base}-adam_m"] = (rng.standard_normal(arr.shape) * 1e-3).astype(np.float32)
        opt[f"{base}-adam_v"] = (rng.random(arr.shape) * 1e-6).astype(np.float32)
    lay_out(str(d / "of_model"), {**model, **opt, "global_ste-global_step": np.array(1234, np.int64)},
            meta=False, done=False)
    s["tfconv"] = d / "of_model"

    # (e) fine-tuned heads: lazy SQuAD (meta), lazy classifier (no meta: labels from the file size),
    #     and convert_tf_ckpt_to_of.py's SQuAD + classifier names
    for name, heads, tf_names, meta in (("squad", ("squad",), False, True), ("glue", ("classifier",), False, False),
                                        ("tfheads", ("squad", "classifier"), True, False)):
        e = lay_out(str(root / name), bert_tensors(TINY, seed=6, heads=heads, tf_names=tf_names),
                    meta=meta, done=not tf_names)
        write_config(os.path.join(e, "bert_config.json"), TINY)
        s[name] = root / name
    return s


# --------------------------------------------------------------------------- helpers


def _vars(snap):
    """{variable: (out bytes, meta text or None)} of a snapshot directory."""
    out = {}
    for name in sorted(os.listdir(snap)):
        d = os.path.join(snap, name)
        if os.path.isdir(d):
            meta = os.path.join(d, "meta")
            out[name] = (open(os.path.join(d, "out"), "rb").read(),
                         open(meta).read() if os.path.isfile(meta) else None)
    return out


def _meta(text):
    return tuple(int(x) for x in re.findall(r"dim:\s*(\d+)", text)), re.search(r"data_type:\s*(\w+)", text).group(1)


def _counts(stdout):
    return stdout.splitlines()[0]


def _is_optimizer(name):
    return name.startswith("System-") or name.endswith(("-m", "-v", "-beta1_t", "-beta2_t", "-adam_m", "-adam_v")) \
        or name == "global_ste-global_step"


def _assert_same_snapshot(a, b, names=None):
    va, vb = _vars(a), _vars(b)
    if names is not None:
        va = {k: v for k, v in va.items() if k in names}
    assert sorted(va) == sorted(vb)
    for k in va:
        assert va[k][0] == vb[k][0], f"{k}: out bytes differ"
        if va[k][1] is not None:
            assert vb[k][1] is not None and _meta(va[k][1]) == _meta(vb[k][1]), k
            assert va[k][1] == vb[k][1], k  # we write exactly OneFlow's text
    assert os.path.isfile(os.path.join(b, "snapshot_done"))


# --------------------------------------------------------------------------- round trips


def test_lazy_of_lazy_bit_exact_with_optimizer(snaps, tmp_path):
    src = snaps["adam"]
    n = len(_vars(src))
    n_model = sum(1 for k in _vars(src) if not _is_optimizer(k))
    r = run_cli("convert", "lazy2of", src, "-o", tmp_path / "of", "--with-optimizer")
    assert _counts(r.stdout) == f"{n} source tensors: {n_model} mapped, {n - n_model} optimizer"
    with safetensors.safe_open(str(tmp_path / "of" / "optimizer.safetensors"), "numpy") as f:
        meta = f.metadata()
        step = f.get_tensor("step")
        assert step.dtype == np.int64 and step.shape == () and int(step) == STEP
        assert f.get_tensor("m/bert.embeddings.position_embeddings.weight").shape == (TINY["max_position_embeddings"],
                                                                                     TINY["hidden_size"])
        assert len(f.keys()) == n - n_model
    assert meta["optimizer"] == "adamw" and meta["bias_correction"] == "false" and meta["eps"] == "1e-06"
    assert meta["lazy_job_name"] == JOB and meta["source"] == "legacy lazy OneFlow"
    run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "back", "--with-optimizer")
    _assert_same_snapshot(src, tmp_path / "back")
    # the snapshot carries its config and vocab (the legacy loaders skip plain files)
    cfg = json.loads((tmp_path / "back" / "bert_config.json").read_text())
    assert cfg["hidden_act"] == "gelu" and cfg["bert_of_hidden_act"] == "gelu_erf" and cfg["layer_norm_eps"] == 1e-5
    assert (tmp_path / "back" / "vocab.txt").read_bytes() == (src.parent / "vocab.txt").read_bytes()


def test_optimizer_dropped_by_default_and_not_written(snaps, tmp_path):
    src = snaps["adam"]
    names = _vars(src)
    n_model = sum(1 for k in names if not _is_optimizer(k))
    r = run_cli("convert", "lazy2of", src, "-o", tmp_path / "of")
    assert _counts(r.stdout) == f"{len(names)} source tensors: {len(names) - n_model} dropped, {n_model} mapped"
    assert "--with-optimizer" in r.stdout
    assert not (tmp_path / "of" / "optimizer.safetensors").exists()
    run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "back", "--with-optimizer")
    assert sorted(_vars(tmp_path / "back")) == sorted(k for k in names if not _is_optimizer(k))
    _assert_same_snapshot(src, tmp_path / "back", names={k for k in names if not _is_optimizer(k)})


def test_mapping_checked_independently_with_numpy(snaps, tmp_path):
    src = snaps["adam"]
    run_cli("convert", "lazy2of", src, "-o", tmp_path / "of", "--with-optimizer")
    w = safetensors.numpy.load_file(str(tmp_path / "of" / "model.safetensors"))
    o = safetensors.numpy.load_file(str(tmp_path / "of" / "optimizer.safetensors"))
    H, I, P = TINY["hidden_size"], TINY["intermediate_size"], TINY["max_position_embeddings"]

    def lazy(name, shape):
        return np.fromfile(os.path.join(src, name, "out"), np.float32).reshape(shape)

    q = lazy("bert-encoder-layer_1-attention-self-query-weight", (H, H))
    assert np.array_equal(w["bert.encoder.layer.1.attention.self.query.weight"], q.T)
    assert np.array_equal(w["bert.encoder.layer.2.intermediate.dense.weight"],
                          lazy("bert-encoder-layer_2-intermediate-dense-weight", (H, I)).T)
    assert w["bert.encoder.layer.2.intermediate.dense.weight"].shape == (I, H)
    assert np.array_equal(w["bert.embeddings.position_embeddings.weight"],
                          lazy("bert-embeddings-position_embeddings", (1, P, H))[0])
    assert np.array_equal(w["cls.seq_relationship.weight"], lazy("cls-seq_relationship-output_weights", (2, H)))
    assert np.array_equal(w["bert.encoder.layer.0.output.LayerNorm.weight"],
                          lazy("bert-encoder-layer_0-output-LayerNorm-gamma", (H,)))
    assert np.array_equal(o["m/bert.encoder.layer.1.attention.self.query.weight"],
                          lazy("bert-encoder-layer_1-attention-self-query-weight-m", (H, H)).T)
    assert np.array_equal(o["v/bert.embeddings.position_embeddings.weight"],
                          lazy("bert-embeddings-position_embeddings-v", (1, P, H))[0])
    assert "cls.predictions.bias" in w and len(w) == sum(1 for k in _vars(src) if not _is_optimizer(k))


@pytest.mark.oneflow
def test_verify_passes_and_lazy_numerics_are_recorded(snaps, tmp_path):
    src = snaps["adam"]
    run_cli("convert", "lazy2of", src, "-o", tmp_path / "of")
    cfg = json.loads((tmp_path / "of" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_erf" and cfg["layer_norm_eps"] == 1e-5 and cfg["provenance"] == "lazy"
    r = run_cli("verify", src, tmp_path / "of", "--json")
    report = json.loads(r.stdout[r.stdout.index("{"):])
    assert report["ok"] and report["a"]["format"] == "lazy" and report["b"]["format"] == "of"
    assert set(report["max_abs_diff"]) == {"B:eager", "B:graph"} and report["reference"] == "numpy-float64 (lazy layout)"
    assert "prediction_logits" in report["outputs"] and report["worst"] <= 1e-5
    # The lazy side really computes erf GELU with eps 1e-5: a copy recorded with tf1 numerics differs.
    r = run_cli("convert", "lazy2of", src, "-o", tmp_path / "of_tf1", "--numerics", "tf1")
    cfg = json.loads((tmp_path / "of_tf1" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_tanh" and cfg["layer_norm_eps"] == 1e-12 and cfg["provenance"] == "tf1"
    r = run_cli("verify", src, tmp_path / "of_tf1", "--modes", "eager", "--json", check=False)
    assert r.returncode == 1
    assert json.loads(r.stdout[r.stdout.index("{"):])["worst"] > 1e-4
    assert error_lines(r.stderr)[-1].startswith("bert-of: error: forward outputs differ")


def _numpy_lazy_bert(snap, cfg, ids, types, mask, act, eps):
    """The lazy BERT's sequence output in float64, straight from the out files (bert.py's math: x @ W[in,out])."""
    H, I, nh = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    dh = H // nh

    def t(name, shape):
        return np.fromfile(os.path.join(snap, name, "out"), np.float32).reshape(shape).astype(np.float64)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * t(p + "LayerNorm-gamma", (H,)) + t(p + "LayerNorm-beta", (H,))

    def dense(x, p, i, o):
        return x @ t(p + "-weight", (i, o)) + t(p + "-bias", (o,))

    erf = np.vectorize(math.erf)
    gelu = {"erf": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
            "tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))}[act]
    B, S = ids.shape
    x = (t("bert-embeddings-word_embeddings", (cfg["vocab_size"], H))[ids]
         + t("bert-embeddings-token_type_embeddings", (cfg["type_vocab_size"], H))[types]
         + t("bert-embeddings-position_embeddings", (1, cfg["max_position_embeddings"], H))[:, :S])
    x = ln(x, "bert-embeddings-")
    adder = (mask[:, None, None, :] - 1.0) * 10000.0
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert-encoder-layer_{i}-"

        def heads(name):
            return dense(x, p + "attention-self-" + name, H, H).reshape(B, S, nh, dh).transpose(0, 2, 1, 3)

        scores = heads("query") @ heads("key").transpose(0, 1, 3, 2) / math.sqrt(dh) + adder
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ heads("value")).transpose(0, 2, 1, 3).reshape(B, S, H)
        a = ln(dense(ctx, p + "attention-output-dense", H, H) + x, p + "attention-output-")
        h = gelu(dense(a, p + "intermediate-dense", H, I))
        x = ln(dense(h, p + "output-dense", I, H) + a, p + "output-")
    return x


@pytest.mark.oneflow
def test_lazy_read_computes_erf_gelu_and_eps_1e5(snaps, tmp_path):
    """bert_of on the lazy2of output == an independent NumPy lazy BERT (erf, 1e-5) on the raw out files."""
    from bert_of import BertModel
    from bert_of._flow import flow

    src = snaps["adam"]
    run_cli("convert", "lazy2of", src, "-o", tmp_path / "of")
    model = BertModel.from_pretrained(str(tmp_path / "of"))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, TINY["vocab_size"], (2, 12))
    types = rng.integers(0, TINY["type_vocab_size"], (2, 12))
    mask = np.ones((2, 12), np.int64)
    mask[1, 8:] = 0
    with flow.no_grad():
        out = model(*(flow.tensor(a, dtype=flow.int64) for a in (ids, types, mask))).sequence_output.numpy()
    exact = _numpy_lazy_bert(src, TINY, ids, types, mask, "erf", 1e-5)
    assert np.max(np.abs(out - exact)) < 1e-5
    for act, eps in (("tanh", 1e-5), ("erf", 1e-12), ("tanh", 1e-12)):  # the numerics are visible at this size
        assert np.max(np.abs(out - _numpy_lazy_bert(src, TINY, ids, types, mask, act, eps))) > 1e-4, (act, eps)


def test_no_meta_snapshot_needs_config_and_round_trips(snaps, tmp_path):
    src, cfg = snaps["nometa"], snaps["nometa_config"]
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", "lazy2of", src, "-o", out / "of", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("bert-of: error: "), lines
    assert "no bert_config.json" in lines[0] and "no meta" in lines[0] and "--config" in lines[0]
    assert os.listdir(out) == []
    vocab = write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"])
    r = run_cli("convert", "lazy2of", src, "-o", out / "of", "--config", cfg, "--vocab", vocab, "--with-optimizer")
    of_cfg = json.loads((out / "of" / "config.json").read_text())
    assert of_cfg["num_hidden_layers"] == 2 and of_cfg["hidden_act"] == "relu" and of_cfg["layer_norm_eps"] == 1e-5
    with safetensors.safe_open(str(out / "of" / "optimizer.safetensors"), "numpy") as f:
        assert int(f.get_tensor("step")) == 77
    run_cli("convert", "of2lazy", out / "of", "-o", out / "back", "--with-optimizer", "--no-meta")
    _assert_same_snapshot(src, out / "back")
    assert not any(os.path.exists(os.path.join(out / "back", k, "meta")) for k in _vars(out / "back"))
    # the written snapshot carries its bert_config.json, so it reads back without --config
    run_cli("convert", "lazy2of", out / "back", "-o", out / "of2")
    a = safetensors.numpy.load_file(str(out / "of" / "model.safetensors"))
    b = safetensors.numpy.load_file(str(out / "of2" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_lamb_and_dynamic_loss_scale(snaps, tmp_path):
    src = snaps["lamb"]
    n = len(_vars(src))
    r = run_cli("convert", "lazy2of", src, "-o", tmp_path / "of", "--with-optimizer")
    n_model = sum(1 for k in _vars(src) if not _is_optimizer(k))
    assert _counts(r.stdout) == f"{n} source tensors: {n_model} mapped, {n - n_model} optimizer"
    o = safetensors.numpy.load_file(str(tmp_path / "of" / "optimizer.safetensors"))
    assert o["loss_scale"].dtype == np.float32 and float(o["loss_scale"]) == 65536.0 and o["loss_scale"].shape == ()
    assert o["good_step_counter"].dtype == np.int64 and int(o["good_step_counter"]) == 7
    assert int(o["step"]) == 11
    b1 = o["beta1_t/bert.encoder.layer.0.attention.self.query.weight"]
    assert b1.shape == (1,) and b1[0] == np.float32(0.9 ** 11)
    assert np.array_equal(o["m/bert.pooler.dense.weight"],
                          np.fromfile(os.path.join(src, "bert-pooler-dense-weight-m", "out"), np.float32)
                          .reshape(TINY["hidden_size"], TINY["hidden_size"]).T)
    with safetensors.safe_open(str(tmp_path / "of" / "optimizer.safetensors"), "numpy") as f:
        meta = f.metadata()
    assert meta["optimizer"] == "lamb" and meta["lazy_job_name"] == "LambJob"
    run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "back", "--with-optimizer")
    _assert_same_snapshot(src, tmp_path / "back")


def test_convert_tf_ckpt_to_of_output(snaps, tmp_path):
    src = snaps["tfconv"]
    names = _vars(src)
    r = run_cli("convert", "lazy2of", src, "-o", tmp_path / "of", "--with-optimizer", "-v")
    n_model = sum(1 for k in names if not _is_optimizer(k))
    assert _counts(r.stdout) == f"{len(names)} source tensors: {n_model} mapped, {len(names) - n_model} optimizer"
    assert "convert_tf_ckpt_to_of.py output" in r.stdout and "tf1 numerics" in r.stdout
    cfg = json.loads((tmp_path / "of" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_tanh" and cfg["layer_norm_eps"] == 1e-12 and cfg["provenance"] == "tf1"
    w = safetensors.numpy.load_file(str(tmp_path / "of" / "model.safetensors"))
    o = safetensors.numpy.load_file(str(tmp_path / "of" / "optimizer.safetensors"))
    H, P = TINY["hidden_size"], TINY["max_position_embeddings"]
    pos = np.fromfile(os.path.join(src, "bert-embeddings-position_embeddings", "out"), np.float32).reshape(P, H)
    assert np.array_equal(w["bert.embeddings.position_embeddings.weight"], pos)
    k = np.fromfile(os.path.join(src, "bert-encoder-layer_0-attention-self-key-kernel-adam_m", "out"),
                    np.float32).reshape(H, H)
    assert np.array_equal(o["m/bert.encoder.layer.0.attention.self.key.weight"], k.T)
    assert int(o["step"]) == 1234 and o["step"].shape == ()
    with safetensors.safe_open(str(tmp_path / "of" / "optimizer.safetensors"), "numpy") as f:
        assert f.metadata()["optimizer"] == "adamw" and "lazy_job_name" not in f.metadata()
    # of2lazy writes the genuine lazy layout: [1,P,H] positions, -m/-v slots, a TrainStep, same bytes,
    # and warns that the legacy code would compute erf/1e-5 where these weights were made with tanh/1e-12
    r = run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "lazy", "--with-optimizer")
    assert "note: the legacy lazy OneFlow BERT would compute differently: activation gelu_tanh" in r.stdout
    assert "--numerics tf1" in r.stdout
    back = _vars(tmp_path / "lazy")
    assert back["bert-embeddings-position_embeddings"][0] == names["bert-embeddings-position_embeddings"][0]
    assert _meta(back["bert-embeddings-position_embeddings"][1]) == ((1, P, H), "kFloat")
    assert back["bert-encoder-layer_0-attention-self-key-weight-m"][0] == \
        names["bert-encoder-layer_0-attention-self-key-kernel-adam_m"][0]
    assert np.frombuffer(back[f"System-Train-TrainStep-{JOB}"][0], np.int64).tolist() == [1234]
    # read back, that genuine lazy snapshot records lazy numerics; --numerics tf1 restores the TF ones
    run_cli("convert", "lazy2of", tmp_path / "lazy", "-o", tmp_path / "of_back", "--numerics", "tf1")
    assert json.loads((tmp_path / "of_back" / "config.json").read_text()) == \
        json.loads((tmp_path / "of" / "config.json").read_text())
    # --numerics overrides the guess
    run_cli("convert", "lazy2of", src, "-o", tmp_path / "of_lazy", "--numerics", "lazy")
    cfg = json.loads((tmp_path / "of_lazy" / "config.json").read_text())
    assert cfg["hidden_act"] == "gelu_erf" and cfg["layer_norm_eps"] == 1e-5 and cfg["provenance"] == "lazy"


@pytest.mark.parametrize("name", ["squad", "glue", "tfheads"])
def test_fine_tuned_heads(snaps, tmp_path, name):
    src = snaps[name]
    vocab = write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"])
    run_cli("convert", "lazy2of", src, "-o", tmp_path / "of", "--vocab", vocab)
    w = safetensors.numpy.load_file(str(tmp_path / "of" / "model.safetensors"))
    cfg = json.loads((tmp_path / "of" / "config.json").read_text())
    H = TINY["hidden_size"]

    def disk(n, shape):
        return np.fromfile(os.path.join(src, n, "out"), np.float32).reshape(shape)

    if name == "squad":
        assert np.array_equal(w["qa_outputs.weight"], disk("cls-squad-output-weight", (H, 2)).T)
        assert "classifier.weight" not in w and cfg["provenance"] == "lazy"
    if name == "glue":  # no meta: the label count comes from the file size
        assert np.array_equal(w["classifier.weight"], disk("classification-output_weights", (3, H)))
        assert cfg["num_labels"] == 3 and cfg["provenance"] == "lazy"
    if name == "tfheads":
        assert np.array_equal(w["qa_outputs.weight"], disk("cls-squad-output_weights", (2, H)))
        assert np.array_equal(w["classifier.weight"], disk("output_weight-output_weights", (3, H)))
        assert np.array_equal(w["classifier.bias"], disk("output_bia-output_bias", (3,)))
        assert cfg["provenance"] == "tf1"
        return
    run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "back", *(["--no-meta"] if name == "glue" else []))
    _assert_same_snapshot(src, tmp_path / "back")


def test_lazy_tf_lazy_through_the_hub(snaps, tmp_path):
    from bert_of.converters.containers import tf1_bundle

    src = snaps["adam"]
    run_cli("convert", "lazy2tf", src, "-o", tmp_path / "tf", "--with-optimizer")
    prefix = tf1_bundle.resolve_prefix(str(tmp_path / "tf"))
    entries = tf1_bundle.read_index(prefix)
    H, P = TINY["hidden_size"], TINY["max_position_embeddings"]
    q = tf1_bundle.read_tensor(prefix, entries["bert/encoder/layer_0/attention/self/query/kernel"])
    assert q.tobytes() == _vars(src)["bert-encoder-layer_0-attention-self-query-weight"][0]  # both [in, out]
    pos = tf1_bundle.read_tensor(prefix, entries["bert/embeddings/position_embeddings"])
    assert pos.shape == (P, H) and pos.tobytes() == _vars(src)["bert-embeddings-position_embeddings"][0]
    assert int(tf1_bundle.read_tensor(prefix, entries["global_step"])) == STEP
    run_cli("convert", "tf2lazy", tmp_path / "tf", "-o", tmp_path / "back", "--with-optimizer")
    _assert_same_snapshot(src, tmp_path / "back")


@pytest.mark.oneflow
def test_flow_load_reads_our_snapshots(snaps, tmp_path):
    """OneFlow 0.9's legacy loader accepts what of2lazy writes: same names, shapes, dtypes, values."""
    from bert_of._flow import flow

    run_cli("convert", "lazy2of", snaps["lamb"], "-o", tmp_path / "of", "--with-optimizer")
    run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "snap", "--with-optimizer")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = flow.load(str(tmp_path / "snap"))
    ours = _vars(tmp_path / "snap")
    assert sorted(loaded) == sorted(ours) and len(ours) > 100
    for name, (data, meta) in ours.items():
        shape, dt = _meta(meta)
        want = np.frombuffer(data, {"kFloat": np.float32, "kInt64": np.int64}[dt]).reshape(shape)
        got = loaded[name].numpy()
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), name
    # our two plain files are skipped with a warning each, nothing else complains
    skipped = sorted(os.path.basename(re.search(r"'(.*?)'", str(w.message)).group(1)) for w in caught)
    assert skipped == ["bert_config.json", "vocab.txt"]
    # ... and the canonical tensors are what OneFlow reads, transposed back
    w = safetensors.numpy.load_file(str(tmp_path / "of" / "model.safetensors"))
    assert np.array_equal(loaded["bert-encoder-layer_2-output-dense-weight"].numpy().T,
                          w["bert.encoder.layer.2.output.dense.weight"])
    assert np.array_equal(loaded["bert-embeddings-position_embeddings"].numpy()[0],
                          w["bert.embeddings.position_embeddings.weight"])
    # The facts the writer relies on: flow.load needs snapshot_done and meta everywhere.
    run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "nometa", "--no-meta")
    with pytest.raises(RuntimeError, match="meta info"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # our bert_config.json / vocab.txt
        flow.load(str(tmp_path / "nometa"))
    os.remove(tmp_path / "snap" / "snapshot_done")
    with pytest.raises(AssertionError):
        flow.load(str(tmp_path / "snap"))


def test_detect(snaps, tmp_path):
    from bert_of.converters.formats import lazy
    from bert_of.converters.convert import detect

    for k in ("adam", "nometa", "tfconv", "tfheads", "lamb"):
        assert detect(str(snaps[k])) == "lazy", k
    run_cli("convert", "lazy2of", snaps["adam"], "-o", tmp_path / "of")
    run_cli("convert", "lazy2tf", snaps["adam"], "-o", tmp_path / "tf")
    assert not lazy.detect(str(tmp_path / "of")) and not lazy.detect(str(tmp_path / "tf"))
    assert not lazy.detect(str(snaps["adam"].parent))  # the model_save_dir above a snapshot
    other = tmp_path / "other"  # a non-BERT variable folder, no snapshot_done
    lay_out(str(other), {"conv1-weight": np.zeros((2, 2), np.float32)}, done=False)
    assert not lazy.detect(str(other))
    assert detect(str(tmp_path / "of")) == "of" and detect(str(tmp_path / "tf")) == "tf"


# --------------------------------------------------------------------------- bad input


def _truncate(d):
    p = d / "bert-encoder-layer_1-intermediate-dense-weight" / "out"
    p.write_bytes(p.read_bytes()[:-100])


def _meta_misfit(d):  # a meta (and out) of the wrong size for the config's intermediate_size 37
    v = d / "bert-encoder-layer_0-intermediate-dense-bias"
    (v / "out").write_bytes(np.zeros(40, np.float32).tobytes())
    (v / "meta").write_text("shape {\n  dim: 40\n}\ndata_type: kFloat\n")


def _unknown(d):
    (d / "my_extra_head-weight").mkdir()
    (d / "my_extra_head-weight" / "out").write_bytes(np.zeros(6, np.float32).tobytes())


def _not_bert(d):
    shutil.rmtree(d)
    lay_out(str(d), {"conv1-weight": np.zeros((8, 3, 3, 3), np.float32), "fc-bias": np.zeros(10, np.float32)})


BAD = {
    "truncated out": ("adam", _truncate, "bert-encoder-layer_1-intermediate-dense-weight/out: 4636 bytes, but"),
    "meta misfit": ("adam", _meta_misfit,
                    "tensor bert-encoder-layer_0-intermediate-dense-bias has shape [40] but the config implies [37]"),
    "unknown variable": ("adam", _unknown, "unknown variable my_extra_head-weight"),
    "no config": ("nometa", lambda d: None, "no bert_config.json"),
    "not bert": ("adam", _not_bert, "not a BERT snapshot"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_one_line_nonzero_no_output(snaps, tmp_path, case):
    which, breaker, needle = BAD[case]
    src = tmp_path / "src"
    shutil.copytree(snaps[which], src)
    if which == "adam":  # the config lives beside the snapshot
        shutil.copy(snaps[which].parent / "bert_config.json", src / "bert_config.json")
    breaker(src)
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", "lazy2of", src, "-o", out / "of", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("bert-of: error: "), lines
    assert needle in lines[0], lines[0]
    assert os.listdir(out) == []  # no partial output, no temp leftovers
    if case == "unknown variable":  # --skip-unknown drops it and says so
        r = run_cli("convert", "lazy2of", src, "-o", out / "of", "--skip-unknown", "--vocab",
                    write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"]))
        assert "dropped   my_extra_head-weight  (not a BERT variable (--skip-unknown))" in r.stdout


def test_of2lazy_refuses_existing_destination_and_leaves_nothing_on_error(snaps, tmp_path):
    run_cli("convert", "lazy2of", snaps["squad"], "-o", tmp_path / "of", "--vocab",
            write_vocab(tmp_path / "vocab.txt", TINY["vocab_size"]))
    (tmp_path / "dst").mkdir()
    r = run_cli("convert", "of2lazy", tmp_path / "of", "-o", tmp_path / "dst", check=False)
    assert r.returncode == 1 and "already exists" in error_lines(r.stderr)[0]
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli("convert", "of2lazy", tmp_path / "of", "-o", out / "snap", "--no-meta", "--dtype", "float16", check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "--no-meta records no dtype" in lines[0], lines
    assert os.listdir(out) == []
