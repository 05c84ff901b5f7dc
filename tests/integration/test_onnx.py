"""ONNX: of2onnx writes a graph onnxruntime runs as bert_of's reference computes (any batch, any
length), onnx2of reads back exactly what was written, and anything else is refused in one line.

The models are tiny bert_of checkpoints with every head kind and every activation, written by
bert_of's own writer; the ONNX files are written by ours (no ``onnx`` package). onnxruntime (the
``onnx`` extra) runs them; ``onnx.checker`` validates them where ``onnx`` is installed."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_of.checkpoint import write_checkpoint
from bert_of.config import BertConfig
from bert_of.tensors import SCOPES, TensorSpec, expected_shapes
from bert_of.converters.formats import onnx as onnx_format
from bert_of.converters.formats.onnx import graph as onnx_graph
from bert_of.converters.verify import reference_forward
from bert_of.converters import registry
from bert_of.converters.convert import read
from bert_of.converters.source import Options, Source
from bert_of.converters.verify.compare import make_batch
from tests.conftest import ROOT, error_lines, run_cli, write_vocab
from tests.helpers.blocked_imports import env_without

ort = pytest.importorskip("onnxruntime")

BASE = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=40, type_vocab_size=3, provenance="hf")
# name -> (head groups, config numerics and task); every activation bert_of knows, two epsilons
VARIANTS = {
    "pretraining": (("pooler", "mlm", "nsp"), dict(hidden_act="gelu_erf", layer_norm_eps=1e-12)),
    "mlm-head-eps": (("pooler", "mlm", "nsp"), dict(hidden_act="gelu_tanh", layer_norm_eps=1e-12,
                                                   head_layer_norm_eps=1e-2)),
    "bare": (("pooler",), dict(hidden_act="linear", layer_norm_eps=1e-5)),
    "qa": (("pooler", "qa"), dict(hidden_act="gelu_tanh", layer_norm_eps=1e-5)),
    # the zero pooler bert_of fills in for transformers' BertForQuestionAnswering (which has none)
    "qa-no-pooler": (("pooler", "qa"), dict(hidden_act="gelu_erf")),
    "classifier": (("pooler", "classifier"), dict(hidden_act="relu", num_labels=3)),
    "token": (("pooler", "classifier"), dict(hidden_act="silu", num_labels=5, classifier_kind="token")),
    "tanh": (("pooler", "classifier"), dict(hidden_act="tanh", num_labels=2)),
}
# graph outputs as transformers names them, per variant
OUTPUTS = {
    "pretraining": ["last_hidden_state", "pooler_output", "prediction_logits", "seq_relationship_logits"],
    "qa": ["last_hidden_state", "pooler_output", "start_logits", "end_logits"],
    "qa-no-pooler": ["last_hidden_state", "start_logits", "end_logits"],
    "classifier": ["last_hidden_state", "pooler_output", "logits"],
    "bare": ["last_hidden_state", "pooler_output"],
}
SHAPES = ((2, 5), (3, 16), (1, 40), (4, 1))  # (batch, sequence) changed from run to run, up to max positions


def _group(name):
    """The head group (SCOPES) a canonical tensor name belongs to."""
    for scope, _, _, group in SCOPES:
        if re.match(re.escape(scope).replace(re.escape("{i}"), r"\d+") + r"\.", name):
            return group
    raise AssertionError(name)


def _model(path, name, seed):
    groups, numerics = VARIANTS[name]
    config = BertConfig(**BASE, **numerics)
    rng = np.random.default_rng(seed)
    tensors = []
    for n, shape in expected_shapes(config).items():
        if _group(n) not in ("embeddings", "layer") + groups:
            continue
        value = 1.0 + 0.1 * rng.standard_normal(shape) if n.endswith("LayerNorm.weight") else \
            0.3 * rng.standard_normal(shape)
        if name == "qa-no-pooler" and n.startswith("bert.pooler."):
            value = np.zeros(shape)
        tensors.append((n, value.astype(np.float32)))
    write_checkpoint(str(path), tensors, config, write_vocab(str(path) + "-vocab.txt", 99))
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{variant: (bert_of dir, ONNX dir)}, the ONNX written by the real CLI."""
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for seed, name in enumerate(VARIANTS):
        of = _model(root / name, name, seed)
        run_cli("convert", "of2onnx", of, "-o", root / f"{name}-onnx")
        out[name] = (of, str(root / f"{name}-onnx"))
    return out


def _reference(of_dir, batch):
    source = read(of_dir, "of")
    layout = registry.reference_layout(source)
    return reference_forward.forward(layout, batch, source.config.num_attention_heads)


def _session(onnx_dir):
    return ort.InferenceSession(os.path.join(onnx_dir, "model.onnx"), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- forward equality


@pytest.mark.parametrize("name", list(VARIANTS))
def test_onnxruntime_computes_the_reference_at_any_batch_and_length(models, name):
    of, onnx_dir = models[name]
    session = _session(onnx_dir)
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.type == "tensor(int64)" and i.shape == ["batch", "sequence"] for i in session.get_inputs())
    names = [o.name for o in session.get_outputs()]
    if name in OUTPUTS:
        assert names == OUTPUTS[name]
    config = read(of, "of").config
    for B, S in SHAPES:
        batch = make_batch(config, B, S, seed=B * 100 + S)
        got = dict(zip(names, session.run(names, {k: batch[k] for k in onnx_graph.INPUTS})))
        want = _reference(of, batch)
        real = batch["attention_mask"].astype(bool)
        unread = {"pooled_output"} if name == "qa-no-pooler" else set()  # zeros no head reads: not an output
        assert {onnx_format.REFERENCE_NAMES.get(k, k) for k in got} == set(want) - unread
        for k, v in got.items():
            ref = want[onnx_format.REFERENCE_NAMES.get(k, k)]
            assert v.dtype == np.float32 and v.shape == ref.shape, (k, v.shape, ref.shape)
            if v.shape[:2] == (B, S):  # per-token outputs: at the real tokens
                v, ref = v[real], ref[real]
            diff = float(np.max(np.abs(v.astype(np.float64) - ref)))
            assert diff <= 1e-5, (name, B, S, k, diff)
            assert float(np.max(np.abs(ref))) > 1e-2  # the outputs are not trivially zero
    if name == "token":
        assert got["logits"].shape == (4, 1, 5)  # per token
    if name == "classifier":
        assert got["logits"].shape == (4, 3)  # on the pooled output


def test_numerics_are_the_configs_a_wrong_activation_or_epsilon_is_visible(models, tmp_path):
    """The control: the same weights under another activation (and the MLM head's own epsilon
    dropped) compute something else than the reference by far more than the tolerance."""
    of, _ = models["mlm-head-eps"]
    cfg = json.loads(open(os.path.join(of, "config.json")).read())
    for change in ({"hidden_act": "gelu_erf"}, {"head_layer_norm_eps": None}):
        wrong = tmp_path / f"wrong-{next(iter(change))}"
        os.makedirs(wrong)
        for f in ("model.safetensors", "vocab.txt"):
            os.link(os.path.join(of, f), wrong / f)
        (wrong / "config.json").write_text(json.dumps({**cfg, **change}))
        run_cli("convert", "of2onnx", wrong, "-o", tmp_path / f"{wrong.name}-onnx")
        batch = make_batch(BertConfig(**BASE), 3, 16)
        session = _session(str(tmp_path / f"{wrong.name}-onnx"))
        got = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {k: batch[k] for k in onnx_graph.INPUTS})))
        want = _reference(of, batch)
        assert float(np.max(np.abs(got["prediction_logits"] - want["prediction_logits"]))) > 1e-3, change


# --------------------------------------------------------------------------- reading back


@pytest.mark.parametrize("name", list(VARIANTS))
def test_of_onnx_of_is_bit_exact(models, tmp_path, name):
    of, onnx_dir = models[name]
    r = run_cli("convert", "onnx2of", onnx_dir, "-o", tmp_path / "back")
    assert "initializers" not in r.stderr
    a, b = read(of, "of"), read(str(tmp_path / "back"), "of")
    want, got = a.load(), b.load()
    assert sorted(want) == sorted(got)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), k
    assert b.config.to_dict() == a.config.to_dict()
    assert open(tmp_path / "back" / "vocab.txt").read() == open(os.path.join(of, "vocab.txt")).read()
    # every initializer accounted for: dense weights read transposed, the rest as they are
    src = read(onnx_dir, "onnx")
    in_file = [n for n in want if name != "qa-no-pooler" or not n.startswith("bert.pooler.")]  # zeros filled in
    assert {r.action for r in src.report} == {"mapped"} and sorted(r.target for r in src.report) == sorted(in_file)
    kernels = [r for r in src.report if r.source.endswith(".kernel")]
    assert kernels and all(r.note == "transposed" and r.target == r.source[:-len("kernel")] + "weight"
                           for r in kernels)


@pytest.mark.oneflow  # B:eager is OneFlow's run of the checkpoint
def test_verify_runs_onnxruntime_on_the_written_graph(models, tmp_path):
    of, onnx_dir = models["pretraining"]
    report = tmp_path / "report.json"
    run_cli("convert", "of2onnx", of, "-o", tmp_path / "checked", "--verify")
    run_cli("verify", of, onnx_dir, "--modes", "eager", "-o", report)
    r = json.loads(report.read_text())
    assert r["ok"] and r["b"]["format"] == "onnx"
    runs = r["max_abs_diff"]
    assert set(runs) == {"B:eager", "B:numpy-float64 (onnx layout)", "B:onnxruntime-float32"}
    assert set(runs["B:onnxruntime-float32"]) == {"sequence_output", "pooled_output", "prediction_logits",
                                                   "seq_relationship_logits"}
    assert max(runs["B:onnxruntime-float32"].values()) <= 1e-5
    # the ONNX as A: onnxruntime runs beside the reference of its weights
    run_cli("verify", onnx_dir, of, "--modes", "eager", "-o", report)
    r = json.loads(report.read_text())
    assert r["ok"] and r["reference"] == "numpy-float64 (onnx layout)"
    assert max(r["ecosystem"]["A:onnxruntime-float32"].values()) <= 1e-5


def test_float16_is_half_the_file_and_onnxruntime_runs_it_within_the_stated_tolerance(models, tmp_path):
    """`--dtype float16`: float16 initializers (each read through a Cast to float32), about half the
    float32 file; the same int64 inputs and float32 outputs; onnxruntime's outputs within
    FLOAT16_TOL of each output's magnitude of the float32 reference, and exactly what the float16
    weights compute; the verdict states the rule; onnx2of reads the float16 weights back bit for bit."""
    from bert_of.converters.verify.compare import FLOAT16_RULE, FLOAT16_TOL

    config = BertConfig(**{**BASE, "hidden_size": 128, "intermediate_size": 512}, hidden_act="gelu_erf")
    rng = np.random.default_rng(7)  # wide enough that the weights, not the graph, make the file's size
    of = str(tmp_path / "of")
    write_checkpoint(of, [(n, (1.0 + 0.1 * rng.standard_normal(shape) if n.endswith("LayerNorm.weight") else
                               0.05 * rng.standard_normal(shape)).astype(np.float32))
                          for n, shape in expected_shapes(config).items() if _group(n) in
                          ("embeddings", "layer", "pooler", "mlm", "nsp")], config, write_vocab(of + "-vocab.txt", 99))
    onnx32, half = tmp_path / "full", tmp_path / "half"
    run_cli("convert", "of2onnx", of, "-o", onnx32)
    r = run_cli("convert", "of2onnx", of, "-o", half, "--dtype", "float16", "--verify")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("verify: "))
    assert line.startswith("verify: ok:") and f"{FLOAT16_RULE} " in line and f"<= {FLOAT16_TOL:g}" in line, line
    report = json.loads(run_cli("verify", of, half, "--modes", "eager", "--json").stdout)
    assert report["ok"] and report["tolerance"] == FLOAT16_TOL and report["tolerance_rule"] == FLOAT16_RULE
    size32, size16 = os.path.getsize(onnx32 / "model.onnx"), os.path.getsize(half / "model.onnx")
    weights = sum(int(np.prod(s.shape)) for s, _ in read(of, "of").tensors)
    assert size32 - size16 >= 2 * weights - 20_000 and 0.5 < size16 / size32 < 0.53, (size16, size32)
    try:
        import onnx
    except ModuleNotFoundError:
        onnx = None  # onnxruntime below still runs it
    if onnx is not None:
        onnx.checker.check_model(onnx.load(str(half / "model.onnx")), full_check=True)
    session = _session(str(half))
    assert [(i.name, i.type) for i in session.get_inputs()] == [(n, "tensor(int64)") for n in onnx_graph.INPUTS]
    assert [o.name for o in session.get_outputs()] == OUTPUTS["pretraining"]
    assert all(o.type == "tensor(float)" for o in session.get_outputs())
    batch = make_batch(read(of, "of").config, 3, 16, seed=5)
    got = dict(zip(OUTPUTS["pretraining"], session.run(None, {k: batch[k] for k in onnx_graph.INPUTS})))
    want = _reference(of, batch)
    back = tmp_path / "back"
    run_cli("convert", "onnx2of", half, "-o", back)
    exact = _reference(str(back), batch)  # the float16 weights, in float64
    real = batch["attention_mask"].astype(bool)
    moved = 0.0
    for k, v in got.items():
        ref, ref16 = want[onnx_format.REFERENCE_NAMES.get(k, k)], exact[onnx_format.REFERENCE_NAMES.get(k, k)]
        if v.shape[:2] == real.shape:
            v, ref, ref16 = v[real], ref[real], ref16[real]
        rel = float(np.max(np.abs(v - ref))) / max(1.0, float(np.max(np.abs(ref))))
        assert rel <= FLOAT16_TOL, (k, rel)
        moved = max(moved, rel)
        assert float(np.max(np.abs(v - ref16))) <= 1e-5, k  # the graph computes the float16 weights exactly
    assert moved > 1e-5  # the float16 rounding is visible: the tolerance is needed, and used
    r = run_cli("verify", of, half, "--modes", "eager")
    assert r.stdout.startswith("verify: ok:") and f"{FLOAT16_RULE} " in r.stdout and f"<= {FLOAT16_TOL:g}" in r.stdout
    r = run_cli("verify", of, half, "--modes", "eager", "--tol", "1e-5", check=False)  # an explicit --tol is absolute
    assert r.returncode == 1 and error_lines(r.stderr)[-1].startswith("bert-of: error: forward outputs differ: max |diff|")
    a, b = read(str(back), "of").load(), read(of, "of").load()
    assert all(a[k].dtype == np.float16 and np.array_equal(a[k], b[k].astype(np.float16)) for k in b)


def test_float16_files_edited_are_refused_in_one_line(models, tmp_path):
    """One initializer turned float32 (mixed), a Cast removed: one line each, nothing written."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    of, _ = models["pretraining"]
    half = tmp_path / "half"
    run_cli("convert", "of2onnx", of, "-o", half, "--dtype", "float16")
    cases = {}
    m = onnx.load(str(half / "model.onnx"))
    first = m.graph.initializer[0]
    first.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(first).astype(np.float32), first.name))
    cases["mixed"] = (m, "its initializers mix float32 and float16")
    m = onnx.load(str(half / "model.onnx"))
    cast = next(i for i, n in enumerate(m.graph.node) if n.op_type == "Cast" and n.output[0].endswith(":float32"))
    del m.graph.node[cast]
    cases["no-cast"] = (m, "are not the ones of2onnx writes")
    for name, (model, needle) in cases.items():
        d = tmp_path / name
        d.mkdir()
        onnx.save(model, str(d / "model.onnx"))
        assert needle in _fails("convert", "onnx2of", d, "-o", tmp_path / f"out-{name}"), name
        assert not os.path.exists(tmp_path / f"out-{name}")


def test_checker_accepts_the_model(models):
    onnx = pytest.importorskip("onnx")
    for name in ("pretraining", "qa", "token"):
        model = onnx.load(os.path.join(models[name][1], "model.onnx"))
        onnx.checker.check_model(model, full_check=True)  # shapes inferred through the whole graph
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 14)] and model.ir_version == 7
        assert model.producer_name == "bert_of"
        assert all(t.data_type == onnx.TensorProto.FLOAT and t.raw_data and not t.float_data
                   for t in model.graph.initializer)
        assert {n.op_type for n in model.graph.node} <= {
            "Add", "Cast", "Constant", "Div", "Erf", "Gather", "MatMul", "Mul", "ReduceMean", "Relu", "Reshape",
            "Shape", "Sigmoid", "Slice", "Softmax", "Sqrt", "Sub", "Tanh", "Transpose", "Unsqueeze"}


# --------------------------------------------------------------------------- refusals


def test_a_model_beyond_protobufs_2gb_is_refused_before_anything_is_written(tmp_path):
    """A 2.6 GB word-embedding table (never produced: the size is known from the specs)."""
    config = BertConfig(**{**BASE, "vocab_size": 20_000_000})
    shapes = expected_shapes(config)

    def never():
        raise AssertionError("a tensor was read")
    tensors = [(TensorSpec(n, np.dtype(np.float32), s), never) for n, s in shapes.items() if n.startswith("bert.")]
    source = Source("big", "of", config, None, tensors)
    with pytest.raises(Exception) as e:
        onnx_format.write_files(source, str(tmp_path), Options())
    assert "beyond protobuf's 2 GB limit" in str(e.value) and "2.56 GB" in str(e.value)
    assert os.listdir(tmp_path) == []


def _foreign_model(path, producer):
    """A valid ONNX model (an Identity graph) written with our field writer under another producer."""
    from bert_of.converters.formats.onnx.graph import Graph
    from bert_of.converters.containers.onnx_proto import FLOAT, int_field, len_field, tensor_proto, value_info
    g = Graph()
    g.op("Identity", "x", out="y")
    graph = b"".join(len_field(1, n) for n in g.nodes) + len_field(2, "g") + \
        len_field(5, tensor_proto("w", (2,), FLOAT, np.zeros(2, "<f4").tobytes())) + \
        len_field(11, value_info("x", FLOAT, (2,))) + len_field(12, value_info("y", FLOAT, (2,)))
    with open(path, "wb") as f:
        f.write(int_field(1, 7) + len_field(2, producer) + len_field(7, graph) + len_field(8, int_field(2, 14)))


def _fails(*args):
    r = run_cli(*args, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("bert-of: error: "), (r.stderr, lines)
    return lines[0]


def test_onnx_models_bert_of_did_not_write_are_refused_in_one_line(models, tmp_path):
    foreign = tmp_path / "foreign.onnx"
    _foreign_model(foreign, "pytorch")
    control = ort.InferenceSession(str(foreign), providers=["CPUExecutionProvider"])
    assert control.run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [1.0, 1.0]  # a real ONNX model
    line = _fails("convert", "onnx2of", foreign, "-o", tmp_path / "out")
    assert "an ONNX model bert_of did not write (producer 'pytorch')" in line
    assert not os.path.exists(tmp_path / "out")


def test_damaged_onnx_files_are_refused_in_one_line(models, tmp_path):
    model = open(os.path.join(models["qa"][1], "model.onnx"), "rb").read()
    from bert_of.converters.formats.onnx import CONFIG_KEY
    from bert_of.converters.containers.onnx_proto import len_field
    config = read(models["qa"][1], "onnx").config
    entry = len_field(14, len_field(1, CONFIG_KEY) + len_field(2, config.to_json_string()))
    pre = BertConfig.from_dict({**config.to_dict(), "layernorm_placement": "pre"})
    assert model.count(entry) == 1
    cases = {
        # a valid model whose metadata says pre-LN: the graph (post-LN) would not compute that
        "pre-ln": model.replace(entry, len_field(14, len_field(1, CONFIG_KEY) + len_field(2, pre.to_json_string()))),
        "truncated": model[:len(model) // 2],
        "empty": b"",
        "noise": bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
        # an initializer renamed to a name that is not BERT's (same length: the framing stays valid)
        "unknown": model.replace(b"qa_outputs.kernel", b"qa_outputs.kernal"),
        # a valid ONNX model, edited: its GELU's tanh made a relu (op_type is NodeProto field 4)
        "edited": model.replace(b"\x22\x04Tanh", b"\x22\x04Relu"),
    }
    expected = {"pre-ln": "bert_of.config describes a pre-LN BERT, which of2onnx never writes",
                "truncated": "not a readable ONNX model", "empty": "not a readable ONNX model",
                "noise": "not a readable ONNX model", "unknown": "unknown initializer qa_outputs.kernal",
                "edited": "its graph's nodes are not the ones of2onnx writes for its config and weights"}
    assert cases["edited"] != model and ort.InferenceSession(cases["edited"], providers=["CPUExecutionProvider"])
    for case, data in cases.items():
        d = tmp_path / case
        os.makedirs(d)
        (d / "model.onnx").write_bytes(data)
        line = _fails("convert", "onnx2of", d, "-o", tmp_path / f"{case}-out")
        assert expected[case] in line, (case, line)
        assert not os.path.exists(tmp_path / f"{case}-out")


# --------------------------------------------------------------------------- without onnxruntime

def test_without_onnxruntime_writing_works_and_verify_says_so_in_one_note(models, tmp_path):
    env = env_without("onnxruntime", tmp_path)

    def bert_of(*args):
        return subprocess.run([sys.executable, "-m", "bert_of.cli", *map(str, args)], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=300)
    r = subprocess.run([sys.executable, "-c", "import onnxruntime"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "No module named 'onnxruntime'" in r.stderr  # the control
    of = models["qa"][0]
    report = tmp_path / "report.json"
    r = bert_of("convert", "of2onnx", of, "-o", tmp_path / "onnx", "--verify")
    assert r.returncode == 0, r.stderr
    r = bert_of("verify", of, tmp_path / "onnx", "--modes", "eager", "-o", report)
    assert r.returncode == 0, r.stderr
    note = "verify: B:onnxruntime-float32 not run: onnxruntime is not installed (the onnx extra: " \
           "pip install 'bert_of[onnx]'); the NumPy reference of the model's weights decides"
    assert error_lines(r.stderr).count(note) == 1, r.stderr
    got = json.loads(report.read_text())
    assert got["ok"] and "B:numpy-float64 (onnx layout)" in got["max_abs_diff"]
    assert got["ecosystem"]["B:onnxruntime-float32"].startswith("not run: onnxruntime is not installed")


def test_random_damage_is_a_bert_of_error_or_a_model_never_a_crash(models, tmp_path):
    """Bytes overwritten or cut anywhere (framing, graph, weights, metadata): reading gives the model
    (its tensors as they were named and shaped: a weight or a string changed) or one bert_of error
    line, nothing else; damage to the graph's nodes is refused."""
    from bert_of.errors import BertOfError
    model = open(os.path.join(models["classifier"][1], "model.onnx"), "rb").read()
    rng = np.random.default_rng(7)
    d = tmp_path / "m"
    os.makedirs(d)
    outcomes = {"read": 0, "refused": 0}
    want = {k: (v.shape, v.dtype) for k, v in read(models["classifier"][1], "onnx").load().items()}
    nodes = (model.index(b"Constant"), model.index(b"bert.embeddings.word_embeddings.weight\x4a"))
    for i in range(120):
        data = bytearray(model)
        if i % 3 == 0:
            data = data[:int(rng.integers(0, len(data)))]
        else:
            at = int(rng.integers(*nodes) if i % 3 == 1 else rng.integers(0, len(data) - 4))
            data[at:at + 4] = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
        (d / "model.onnx").write_bytes(bytes(data))
        try:
            got = read(str(d), "onnx").load()
            outcomes["read"] += 1
            assert {k: (v.shape, v.dtype) for k, v in got.items()} == want
            assert i % 3 != 1 or bytes(data) == model, i  # the nodes' bytes changed: never read
        except BertOfError as e:
            assert "\n" not in str(e) and str(e).startswith(str(d)), e
            outcomes["refused"] += 1
    assert outcomes["refused"] >= 80 and outcomes["read"] >= 1, outcomes


def test_lower_casing_travels_in_the_metadata(models, tmp_path):
    """A cased model whose vocabulary looks uncased (its folder records do_lower_case false): the
    ONNX model records it, and what is read back from it says it too."""
    from bert_of.converters.source import lower_case_of
    of = tmp_path / "cased"
    os.makedirs(of)
    for f in ("model.safetensors", "vocab.txt", "config.json"):
        os.link(os.path.join(models["bare"][0], f), of / f)
    (of / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert lower_case_of(read(str(of), "of")) is False and lower_case_of(read(models["bare"][0], "of")) is True
    run_cli("convert", "of2onnx", of, "-o", tmp_path / "onnx")
    run_cli("convert", "onnx2of", tmp_path / "onnx", "-o", tmp_path / "back")
    assert lower_case_of(read(str(tmp_path / "onnx"), "onnx")) is False
    assert lower_case_of(read(str(tmp_path / "back"), "of")) is False
    # the uncased one records nothing beyond its vocabulary's word
    assert "do_lower_case" not in read(models["bare"][1], "onnx").config.extra
