"""The interop core without OneFlow: what ``pip install bert_of`` (no extras) gives on Python 3.10+
with NumPy 1.x or 2.x. convert, verify, inspect, the zoo, pretraining data, scoring and the
tokenizer run; the model, training and everything else that runs it say in one line that they
need the ``oneflow`` extra.

``make test`` runs these in .venv (Python 3.10, OneFlow) and in .venv-core (the newest Python here,
NumPy 2, neither OneFlow nor TensorFlow). Tests about OneFlow being absent run where it is absent
(the core suite); where it is installed they are skipped, saying so.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, error_lines, run_cli

HF_TINY = os.path.join(ROOT, "tests", "data", "hf", "tiny_pt")
SQUAD = os.path.join(ROOT, "tests", "data", "squad")
NEEDS = "needs OneFlow: pip install 'bert_of[oneflow]' (Python 3.10)"
without_oneflow = pytest.mark.skipif(importlib.util.find_spec("oneflow") is not None,
                                     reason="OneFlow is installed here; this runs in the core suite (make test-core)")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERT_OF_")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


def test_the_core_never_imports_oneflow_or_tensorflow():
    """Every module of the core imported, the tokenizer run: neither OneFlow nor TensorFlow loaded,
    here or in .venv where both are installed."""
    r = _python("import sys, bert_of, bert_of.cli, bert_of.converters.convert, bert_of.converters.verify.compare, "
                "bert_of.converters.cli, bert_of.zoo, bert_of.zoo.cli, bert_of.eval.cli, bert_of.eval.squad_metrics, "
                "bert_of.eval.glue_metrics, bert_of.data.cli, bert_of.data.create_pretraining;"
                "from bert_of import BertTokenizer;"
                f"t = BertTokenizer.from_pretrained({HF_TINY!r}); ids = t('hello world')['input_ids'];"
                "assert ids[0] == t.cls_token_id and ids[-1] == t.sep_token_id, ids;"
                "print(sorted(m for m in sys.modules if m.split('.')[0] in ('oneflow', 'tensorflow')))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]"]


@without_oneflow
def test_the_model_api_says_it_needs_the_oneflow_extra():
    import bert_of

    assert bert_of.BertConfig and bert_of.__version__
    with pytest.raises(ImportError, match=r"^bert_of\.BertModel " + NEEDS.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        from bert_of import BertModel  # noqa: F401
    with pytest.raises(ImportError, match="needs OneFlow"):
        import bert_of.modeling  # noqa: F401


@without_oneflow
def test_every_command_that_runs_the_model_is_one_line_naming_the_extra(tmp_path):
    model = tmp_path / "of"
    run_cli("convert", "hf2of", HF_TINY, "-o", model)
    data = os.path.join(SQUAD, "dev-v1.1-mini.json")
    glue = os.path.join(ROOT, "tests", "data", "glue", "mrpc-dev.tsv")
    commands = {
        "finetune squad": ["--model", model, "--train", data, "-o", tmp_path / "ft"],
        "finetune glue": ["--task", "mrpc", "--model", model, "--train", glue, "-o", tmp_path / "ftg"],
        "predict squad": ["--model", model, "--data", data, "-o", tmp_path / "pred"],
        "eval squad": ["--model", model, "--data", data],
        "eval glue": ["--task", "mrpc", "--model", model, "--data", glue],
        "selftest": [],
    }
    for name, args in commands.items():
        r = run_cli(*name.split(), *args, check=False)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1, (name, r.stderr)
        assert lines[0].startswith(f"bert-of: error: {name} {NEEDS}"), lines
    assert sorted(os.listdir(tmp_path)) == ["of"]  # nothing written


@without_oneflow
def test_convert_verify_without_oneflow_runs_the_reference_in_both_layouts(tmp_path):
    """Every format that holds an HF checkpoint's numerics, from the tiny HF checkpoint, then back and across: each --verify
    compares the float64 reference on A's tensors in A's layout with the same reference on B's
    tensors in B's layout, and says bert_of's model did not run."""
    exact = ("of", "tf", "h5", "ofsd")  # formats that hold every numeric of an HF checkpoint
    paths = {"hf": HF_TINY}
    for fmt in exact:
        paths[fmt] = str(tmp_path / fmt)
        out = run_cli("convert", f"hf2{fmt}", HF_TINY, "-o", paths[fmt], "--verify", "--json").stdout
        report = json.loads(out)  # --json: stdout is the report alone
        assert report["ok"] and report["worst"] <= 1e-5, report
        assert list(report["max_abs_diff"]) == [f"B:numpy-float64 ({fmt} layout)"]
        assert report["bert_of_model"].startswith(f"not run: bert_of's model {NEEDS}")
    for a, b in [(a, "hf") for a in exact] + list(zip(exact, exact[1:] + exact[:1])):  # back, and a ring across
        run_cli("convert", f"{a}2{b}", paths[a], "-o", tmp_path / f"{a}2{b}", "--verify")
    r = run_cli("verify", paths["tf"], paths["h5"], "-o", tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text())["ok"]
    # a wrong number is still caught without OneFlow: the reference on B's own tensors sees it
    from safetensors.numpy import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for f in os.listdir(paths["of"]):
        (bad / f).write_bytes((tmp_path / "of" / f).read_bytes())
    t = load_file(str(bad / "model.safetensors"))
    name = next(k for k in t if k.endswith("attention.output.dense.weight"))
    t[name] = t[name] * np.float32(1.001)
    save_file(t, str(bad / "model.safetensors"))
    r = run_cli("verify", HF_TINY, bad, check=False)
    assert r.returncode == 1 and error_lines(r.stderr)[-1].startswith("bert-of: error: forward outputs differ")


def _other_numpy_env():
    """(python, NumPy version) of this checkout's other environment (.venv: NumPy 1.x; .venv-core:
    NumPy 2) when it is set up, else None."""
    mine = np.__version__.split(".")[0]
    for venv in (".venv", ".venv-core"):
        py = os.path.join(ROOT, venv, "bin", "python")
        if not os.path.isfile(py):
            continue
        r = subprocess.run([py, "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.split(".")[0] != mine:
            return py, r.stdout.strip()
    return None


def test_numpy_1_and_2_write_the_same_bytes(tmp_path):
    """Every writer, pretraining data and the scores: the same bytes under NumPy 1.x and 2.x (this
    interpreter and the checkout's other environment, both set up by ``make test``). The float64
    reference agrees to its last bits: NumPy 2's SIMD exp differs from 1.x's by an ulp."""
    other = _other_numpy_env()
    if other is None:
        pytest.skip("no environment with the other NumPy major version here (make test sets up both)")
    tables, refs = [], []
    for i, py in enumerate((sys.executable, other[0])):
        out = tmp_path / f"env{i}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERT_OF_")}
        env.update(PYTHONPATH=ROOT, BERT_OF_HOME=str(tmp_path / "home"))
        r = subprocess.run([py, "-m", "tests.scripts.core_outputs", str(out)], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
        tables.append(json.loads(r.stdout))
        refs.append(dict(np.load(out / "reference.npz")))
    assert len(tables[0]) > 40 and tables[0] == tables[1]
    assert refs[0].keys() == refs[1].keys()
    for k in refs[0]:
        scale = max(1.0, float(np.abs(refs[0][k]).max()))
        assert np.abs(refs[0][k] - refs[1][k]).max() <= 1e-13 * scale, k


def test_inspect_zoo_and_scores_run_in_the_core(tmp_path):
    home = tmp_path / "home"
    env = {"BERT_OF_HOME": str(home), "BERT_OF_OFFLINE": "1"}
    info = json.loads(run_cli("inspect", HF_TINY, "--json").stdout)
    assert info["format"] == "hf" and info["parameters"] > 0
    assert run_cli("zoo", "list", env=env).stdout.split()[0] == "NAME"
    ck = tmp_path / "ck"
    run_cli("convert", "hf2of", HF_TINY, "-o", ck)
    run_cli("zoo", "add", "--name", "my-tiny", ck, env=env)
    assert "my-tiny" in run_cli("zoo", "list", env=env).stdout
    run_cli("zoo", "verify", "my-tiny", env=env)
    assert "item(s)" in run_cli("zoo", "cache", "list", env=env).stdout
    data, preds = os.path.join(SQUAD, "dev-v1.1-mini.json"), os.path.join(SQUAD, "predictions-v1.1.json")
    score = json.loads(run_cli("eval", "squad-score", "--data", data, "--predictions", preds, "--no-record").stdout)
    assert 0 <= score["exact_match"] <= 100 and 0 <= score["f1"] <= 100
