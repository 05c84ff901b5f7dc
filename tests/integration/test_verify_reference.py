"""verify's reference (converters/verify/reference_forward.py on converters/verify/reference_np.py's layouts) is
independent and has teeth, for every format.

A realistic-magnitude BERT (trained-BERT weight scales, where tanh- and erf-GELU differ by ~5e-4)
is written in every source format (OneFlow's own flow.save folders of bert_of, the models repo and LiBai included), converted to bert_of's format (bert_of's own to HF's), and then
broken the ways a reader or writer could break it: q and k swapped, a kernel left untransposed, the
other GELU, the other LayerNorm epsilon. The NumPy reference reads the SOURCE as its own format stores it, so each
of those must be a difference above the tolerance; the untouched conversion must pass.
"""

import json
import re

import numpy as np
import pytest

from bert_of.checkpoint import SafetensorsFile, load_safetensors, save_safetensors
from bert_of.converters.verify import transformers_run as hf_torch, reference_forward
from bert_of.converters import registry
from bert_of.converters.verify import tf_reference_checkpoint as ref
from bert_of.converters.source import Options
from bert_of.converters.convert import convert, read
from bert_of.converters.verify.compare import DEFAULT_TOL, SENTENCES, token_batch, verify

pytestmark = pytest.mark.oneflow

CONFIG = {"vocab_size": 160, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 37, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
          "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64, "type_vocab_size": 2,
          "initializer_range": 0.02}
SOURCES = ("tf", "hf", "h5", "lazy", "of", "ofsd", "ofmodels", "libai")
TARGET = {"of": "hf"}  # each source converted to bert_of's format; bert_of's own to HF's
ACT_FLIP = {"gelu_erf": "gelu_tanh", "gelu_tanh": "gelu_erf", "gelu": "gelu_new", "gelu_new": "gelu"}


def _vocab(path, n):
    """Specials, then the words of verify's sentences (so its token batch is real WordPiece), then fillers."""
    words = []
    for a, b in SENTENCES:
        for w in re.findall(r"\w+|[^\w\s]", f"{a} {b or ''}".replace("[MASK]", "").lower()):
            if w not in words:
                words.append(w)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    vocab += [f"tok{i}" for i in range(n - len(vocab))]
    path.write_text("\n".join(vocab[:n]) + "\n")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """{format: (source path, its conversion to bert_of's format, or HF's for bert_of's own)}."""
    root = tmp_path_factory.mktemp("reference")
    google = root / "tf"
    google.mkdir()
    ref.make_checkpoint(str(google / "bert_model.ckpt"), CONFIG, seed=3, heads=("pretraining",), realistic=True)
    (google / "bert_config.json").write_text(json.dumps(CONFIG))
    _vocab(google / "vocab.txt", CONFIG["vocab_size"])
    out = {}
    for fmt in SOURCES:
        src = str(google) if fmt == "tf" else str(root / fmt)
        if fmt != "tf":
            convert(f"tf2{fmt}", str(google), src, Options())
        dst = TARGET.get(fmt, "of")
        convert(f"{fmt}2{dst}", src, str(root / f"{fmt}-{dst}"), Options(vocab=str(google / "vocab.txt")))
        out[fmt] = (src, root / f"{fmt}-{dst}")
    return out


def _copy(of_dir, dst):
    dst.mkdir()
    for f in of_dir.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _edit_weights(d, fn):
    path = str(d / "model.safetensors")
    with SafetensorsFile(path) as f:
        metadata = dict(f.metadata)  # as its format writes it (transformers wants {"format": "pt"})
    tensors = load_safetensors(path)
    fn(tensors)
    save_safetensors(path, tensors, metadata)


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _swap_qk(t):
    p = "bert.encoder.layer.0.attention.self."
    for s in ("weight", "bias"):
        t[p + "query." + s], t[p + "key." + s] = t[p + "key." + s], t[p + "query." + s]


def _no_transpose(t):  # a square kernel left as the file stores it ([in, out])
    k = "bert.encoder.layer.1.attention.output.dense.weight"
    t[k] = np.ascontiguousarray(t[k].T)


BREAKS = {
    "swapped q/k": lambda d: _edit_weights(d, _swap_qk),
    "missing transpose": lambda d: _edit_weights(d, _no_transpose),
    "tanh vs erf GELU": lambda d: _edit_config(d, hidden_act=ACT_FLIP[
        json.loads((d / "config.json").read_text())["hidden_act"]]),
    "1e-5 vs 1e-12 epsilon": lambda d: _edit_config(d, layer_norm_eps={1e-5: 1e-12, 1e-12: 1e-5}[
        json.loads((d / "config.json").read_text())["layer_norm_eps"]]),
}


@pytest.mark.parametrize("fmt", SOURCES)
def test_conversion_passes_against_the_sources_own_layout(made, fmt):
    src, of_dir = made[fmt]
    report = verify(src, str(of_dir), modes=("eager",))
    assert report["ok"] and report["worst"] <= DEFAULT_TOL, report["max_abs_diff"]
    assert report["reference"] == f"numpy-float64 ({fmt} layout)"  # never bert_of's own model
    assert {"sequence_output", "pooled_output", "prediction_logits", "seq_relationship_logits"} <= \
        set(report["outputs"])
    tokens = report["batches"]["tokens"]
    assert tokens["unknown"] == 0 and tokens["masked"] >= 3 and tokens["pairs"] == 3, tokens


@pytest.mark.parametrize("fmt", SOURCES)
@pytest.mark.parametrize("what", list(BREAKS))
def test_a_broken_conversion_fails(made, tmp_path, fmt, what):
    src, of_dir = made[fmt]
    broken = _copy(of_dir, tmp_path / "broken")
    BREAKS[what](broken)
    report = verify(src, str(broken), modes=("eager",))
    assert not report["ok"] and report["worst"] > 10 * DEFAULT_TOL, (what, report["max_abs_diff"])


def test_the_reference_reads_each_layout_itself(made):
    """The same weights as four files: four layouts (names, orientation, [1, P, H] positions),
    one function. The lazy snapshot computes erf GELU / eps 1e-5, so it alone differs from Google's."""
    outs = {}
    for fmt in ("tf", "hf", "h5", "lazy"):
        source = read(made[fmt][0], fmt, Options(vocab=made["tf"][0] + "/vocab.txt"))
        batch, _ = token_batch(source)
        layout = registry.reference_layout(source)
        assert layout.name == fmt and (layout.act, layout.eps) == (
            ("gelu_erf", 1e-5) if fmt == "lazy" else ("gelu_tanh", 1e-12))
        outs[fmt] = reference_forward.forward(layout, batch, CONFIG["num_attention_heads"])
    for fmt in ("hf", "h5"):
        for k, v in outs["tf"].items():
            assert np.max(np.abs(outs[fmt][k] - v)) < 1e-12, (fmt, k)
    assert np.max(np.abs(outs["lazy"]["sequence_output"] - outs["tf"]["sequence_output"])) > 1e-4


def test_real_minilm_hf2of_verify(tmp_path):
    """The real all-MiniLM-L6-v2 weights and vocabulary: hf2of --verify within 1e-5 of the reference."""
    from tests.conftest import run_cli
    from tests.helpers.models import minilm_dir

    r = run_cli("convert", "hf2of", minilm_dir(), "-o", tmp_path / "of", "--verify", "--json")
    report = json.loads(r.stdout)
    assert report["ok"] and report["reference"] == "numpy-float64 (hf layout)" and report["worst"] <= 1e-5
    assert report["b"]["path"] == str(tmp_path / "of")  # named as published, not the staging folder
    tokens = report["batches"]["tokens"]
    assert tokens["unknown"] == 0 and tokens["masked"] == 3 and tokens["pairs"] == 3, tokens
    assert set(report["max_abs_diff"]) == {"B:eager", "B:graph"}
    assert {"sequence_output", "pooled_output"} <= set(report["outputs"])
    ran = report["ecosystem"]["A:transformers-float64"]  # transformers' own BERT on the source
    if hf_torch.importable():
        assert max(ran.values()) < 1e-9, ran
    else:
        assert ran.startswith("not run: torch and transformers are not installed"), ran


def test_transformers_runs_on_hf_output_or_says_why(made):
    """of2hf: what transformers computes from the written files decides too, where it can run;
    without torch the report says so in one place and the NumPy reference still decides."""
    src, hf_dir = made["of"]
    report = verify(src, str(hf_dir), modes=("eager",))
    assert report["ok"], report["max_abs_diff"]
    if hf_torch.importable():
        assert max(report["max_abs_diff"]["B:transformers-float64"].values()) <= DEFAULT_TOL
    else:
        assert report["ecosystem"]["B:transformers-float64"].startswith("not run:")
        assert "B:transformers-float64" not in report["max_abs_diff"]


def test_a_transformers_interpreter_that_fails_fails_the_check(made):
    """--torch-python names an interpreter that cannot run transformers: on the checked side that is a
    failed check (one line naming it, exit 1), not a silent pass."""
    from tests.conftest import run_cli

    src, hf_dir = made["of"]
    r = run_cli("verify", src, hf_dir, "--modes", "eager", "--torch-python", "/bin/false", "--json", check=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "B:transformers-float64 failed: transformers" in err[0] and "/bin/false" in err[0], err
    assert "Traceback" not in r.stderr
    report = json.loads(r.stdout[r.stdout.index("{"):])
    assert not report["ok"] and report["worst"] <= DEFAULT_TOL  # the numbers agreed; transformers did not run
