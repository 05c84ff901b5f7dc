"""Every format to every other and back: bit-exact in fp32, dtypes kept for fp16/bf16,
and forward-equal (bert-of verify) between every pair."""

import itertools
import json

import numpy as np
import pytest

from bert_of.converters import registry
from bert_of.converters.verify import tf_reference_checkpoint as ref
from bert_of.converters.source import Options
from bert_of.converters.convert import convert, read
from bert_of.converters.verify.compare import verify
from tests.conftest import TINY, run_cli, write_vocab

pytestmark = pytest.mark.tf

# every registered format that bert_of writes; bert_of's own first (the matrix's sources are made from it)
FORMATS = ("of",) + tuple(n for n in registry.names(writable=True) if n != "of")
# formats that can hold each dtype (declared by each format: h5py has no bfloat16; the lazy meta has
# no bf16 code here, nor the flow.save folders' meta, which is the same record). Every pair in fp32;
# in fp16/bf16 one format stands for those sharing a container (the same files: the flow.save three,
# the TF bundles).


def _one_per_container(fmts):
    """The last registered of the formats writing the same files (tf of tf2/tf, ofsd of the flow.save three)."""
    last = {registry.get(f).owns: f for f in fmts}
    return tuple(f for f in fmts if last[registry.get(f).owns] == f)


DTYPE_FORMATS = {dt: (lambda fs: fs if dt == "float32" else _one_per_container(fs))(
    tuple(f for f in FORMATS if dt in registry.get(f).dtypes)) for dt in ("float32", "float16", "bfloat16")}
# formats whose reader records its codebase's numerics whatever the weights came from (erf GELU,
# eps 1e-5; LiBai's MLM head at eps 1e-5): compared with what is converted FROM them
PROVENANCE_NUMERICS = ("lazy", "ofmodels", "libai")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One model in every format, per dtype: {dtype: {fmt: path}}."""
    root = tmp_path_factory.mktemp("matrix")
    google = root / "google"
    google.mkdir()
    ref.make_checkpoint(str(google / "bert_model.ckpt"), TINY, seed=5, heads=("pretraining",), realistic=True)
    (google / "bert_config.json").write_text(json.dumps(TINY))
    write_vocab(google / "vocab.txt", TINY["vocab_size"])
    out = {}
    for dtype, fmts in DTYPE_FORMATS.items():
        base = root / f"of-{dtype}"
        convert("tf2of", str(google), str(base), Options(dtype=None if dtype == "float32" else dtype))
        out[dtype] = {"of": str(base)}
        for f in fmts:
            if f != "of":
                out[dtype][f] = str(root / f"{f}-{dtype}")
                convert(f"of2{f}", str(base), out[dtype][f], Options())
    out["google"] = str(google)
    return out


def _canonical(path, fmt):
    src = read(path, fmt, Options(with_optimizer=True))
    return {s.name: p() for s, p in src.tensors}, sorted(r.source for r in src.report)


@pytest.mark.parametrize("dtype", list(DTYPE_FORMATS))
def test_round_trip_every_pair_is_bit_exact(sources, tmp_path, dtype):
    fmts = DTYPE_FORMATS[dtype]
    pairs = 0
    originals = {a: _canonical(sources[dtype][a], a) for a in fmts}  # each source read once, not per pair
    for a, b in itertools.permutations(fmts, 2):
        mid, back = tmp_path / f"{a}-{b}", tmp_path / f"{a}-{b}-{a}"
        convert(f"{a}2{b}", sources[dtype][a], str(mid), Options())
        convert(f"{b}2{a}", str(mid), str(back), Options())
        want, want_names = originals[a]
        got, got_names = _canonical(str(back), a)
        assert got_names == want_names, (a, b)
        assert sorted(got) == sorted(want), (a, b)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].dtype.name == dtype, (a, b, k, got[k].dtype)
            assert got[k].shape == want[k].shape and got[k].tobytes() == want[k].tobytes(), (a, b, k)
        pairs += 1
    assert pairs == len(fmts) * (len(fmts) - 1)


def test_every_pair_verifies_forward_equal(sources, tmp_path):
    fp32 = sources["float32"]
    same_numerics = ["of", "tf", "hf", "h5"]
    checked = []
    for a, b in itertools.combinations(same_numerics, 2):
        checked.append((a, b, verify(fp32[a], fp32[b], modes=("eager", "graph"))))
    # bert_of's own state dict carries bert_of's config: the same numerics. (The flow.save formats
    # read into the same model as every other: eager only here, graph vs eager is checked above.)
    checked.append(("ofsd", "tf", verify(fp32["ofsd"], fp32["tf"], modes=("eager",))))
    # A lazy snapshot means erf GELU and eps 1e-5 (what the lazy kernels compute), so it is
    # compared with what is converted FROM it: the numerics travel in every format's config.
    # So are the models repo's and LiBai's folders (their codebases' numerics).
    # (LiBai's MLM head LayerNorm is at eps 1e-5 whatever its layernorm_eps, here Google's 1e-12: only
    # of holds both; tf/hf get a note. test_native checks libai2tf/hf where the eps agree.)
    for a in PROVENANCE_NUMERICS:
        for b in {"lazy": same_numerics, "ofmodels": ("tf",), "libai": ("of",)}[a]:
            dst = tmp_path / f"{a}2{b}"
            convert(f"{a}2{b}", fp32[a], str(dst), Options())
            modes = ("eager", "graph") if a == "lazy" else ("eager",)
            checked.append((a, b, verify(fp32[a], str(dst), modes=modes)))
    # NVIDIA's PyTorch BERT computes Google's numerics (tanh GELU, eps 1e-12) under HF-like names
    checked.append(("nvidia", "tf", verify(fp32["nvidia"], fp32["tf"], modes=("eager",))))
    for a, b, report in checked:
        assert report["ok"] and report["worst"] <= 1e-5, (a, b, report["max_abs_diff"])
        runs = set(report["max_abs_diff"])
        assert any(r.endswith(":eager") for r in runs), runs
        if a not in ("ofsd", "ofmodels", "libai", "nvidia"):
            assert any(r.endswith(":graph") for r in runs), runs
        assert report["reference"] == f"numpy-float64 ({a} layout)", report["reference"]
        if b != "of":  # what was written, computed in its own format's layout too
            assert f"B:numpy-float64 ({b} layout)" in runs, runs
        if a == "tf":  # Google's own graph beside, in agreement with the reference
            assert max(report["ecosystem"]["A:tf-float64"].values()) <= 1e-9
    assert len(checked) == 6 + 1 + 4 + 1 + 1 + 1


def test_lazy_numerics_differ_from_googles(sources):
    """of (Google numerics) vs the same weights as a lazy snapshot (erf, eps 1e-5): verify says no."""
    report = verify(sources["float32"]["of"], sources["float32"]["lazy"], modes=("eager",))
    assert not report["ok"] and report["worst"] > 1e-4


def test_dtype_flag_casts_and_round_trips(sources, tmp_path):
    half = tmp_path / "half"
    convert("of2hf", sources["float32"]["of"], str(half), Options(dtype="float16"))
    tensors, _ = _canonical(str(half), "hf")
    assert {v.dtype.name for v in tensors.values()} == {"float16"}
    full, _ = _canonical(sources["float32"]["of"], "of")
    for k, v in tensors.items():
        assert np.array_equal(v, full[k].astype(np.float16)), k


def test_the_registry_is_the_one_list_of_formats():
    """Every format module is registered by one line; the CLI, the owned files, the zoo and this
    matrix read the registry (a format module that is not registered, or a list kept elsewhere, fails)."""
    import glob
    import os
    import re as _re

    from bert_of.converters import convert as conv
    from bert_of.files.owned import own_files
    from bert_of.zoo import cache, registry as zoo_registry
    from tests.conftest import ROOT

    formats = os.path.join(ROOT, "converters", "formats")
    declared = sorted(os.path.relpath(p, formats)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                      for p in glob.glob(os.path.join(formats, "**", "*.py"), recursive=True)
                      if _re.search(r"^FORMAT = Format\(", open(p, encoding="utf-8").read(), _re.M))
    assert declared == sorted(registry.MODULES)
    assert conv.FORMATS is registry.FORMATS and list(conv.DESCRIPTIONS) == list(registry.FORMATS)
    for name, f in registry.FORMATS.items():
        assert set(f.owns) <= own_files(), name
        assert f.reference.from_source and (f.write_files is None) == (name not in FORMATS)
    assert zoo_registry.SOURCE_FORMATS == registry.names() and cache.FORMATS == registry.names(writable=True)
    shown = run_cli("convert", "--help").stdout
    assert all(f"{n} = " in " ".join(shown.split()) for n in registry.FORMATS), shown


# what --numerics says a "gelu" was computed as: (activation, LayerNorm epsilon)
NUMERICS = {"tf1": ("gelu_tanh", 1e-12), "lazy": ("gelu_erf", 1e-5), "hf": ("gelu_erf", 1e-12)}


def test_numerics_flag_applies_or_is_refused_for_every_format(sources, tmp_path):
    """Every format x every --numerics: the reader computes what the flag says, or refuses it in one
    line naming the flag; never accepted and ignored. HF's and Keras's files are walked twice: as
    written from this (tanh) model ("gelu_new" names its GELU: refused) and relabelled "gelu" (the
    label a converted Google model keeps: applied)."""
    import shutil

    from bert_of.errors import BertOfError

    paths = [(fmt, sources["float32"][fmt]) for fmt in DTYPE_FORMATS["float32"]]
    for fmt in ("hf", "h5"):
        relabelled = tmp_path / fmt
        shutil.copytree(sources["float32"][fmt], relabelled)
        cfg = json.loads((relabelled / "config.json").read_text())
        cfg["hidden_act"] = "gelu"
        (relabelled / "config.json").write_text(json.dumps(cfg))
        paths.append((fmt, str(relabelled)))
    applied = set()
    for fmt, path in paths:
        for flag, (act, eps) in NUMERICS.items():
            try:
                src = read(path, fmt, Options(numerics=flag))
            except BertOfError as e:
                assert f"--numerics {flag}" in str(e) and "\n" not in str(e), (fmt, flag, e)
                continue
            assert (src.config.hidden_act, src.config.layer_norm_eps) == (act, eps), (fmt, flag, src.config)
            applied.add(fmt)
    assert applied == {"hf", "h5", "lazy"}  # the formats whose files leave a "gelu" open


def test_numerics_flag_on_model_garden_and_google_is_refused(sources, tmp_path):
    """tf2 / tf record their numerics (Model Garden's and Google's "gelu" is tanh): --numerics hf is
    one line, nothing written."""
    for fmt in ("tf2", "tf"):
        r = run_cli("convert", f"{fmt}2of", sources["float32"][fmt], "-o", tmp_path / fmt, "--numerics", "hf",
                    check=False)
        lines = [l for l in r.stderr.splitlines() if l.startswith("bert-of:")]
        assert r.returncode == 1 and len(lines) == 1 and "--numerics hf does not apply" in lines[0], r.stderr
        assert not (tmp_path / fmt).exists()


def test_numerics_flag_never_overrides_an_explicit_activation(sources, tmp_path):
    """An HF config saying relu is computed as relu: --numerics is refused, not applied over it."""
    import shutil

    from bert_of.errors import BertOfError

    hf = tmp_path / "hf"
    shutil.copytree(sources["float32"]["hf"], hf)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["hidden_act"] = "relu"
    (hf / "config.json").write_text(json.dumps(cfg))
    for flag in NUMERICS:
        with pytest.raises(BertOfError, match=f"--numerics {flag}: .* 'relu'"):
            read(str(hf), "hf", Options(numerics=flag))
    assert read(str(hf), "hf", Options()).config.hidden_act == "relu"
