"""The distribution claims one import name, `bert_of`, and works outside the repository.

converters/, zoo/ and eval/ are folders of this repository but install as bert_of.converters,
bert_of.zoo and bert_of.eval; a user's own `zoo/`, `eval/` or `converters/` package (common in ML
repositories) must not shadow them.
"""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT, TINY

SUBPACKAGES = ("bert_of", "bert_of.data", "bert_of.converters", "bert_of.zoo", "bert_of.eval")


def _user_project(path):
    """A project folder with its own zoo/, eval/ and converters/ packages, as ML repositories have."""
    for name in ("zoo", "eval", "converters"):
        os.makedirs(path / name)
        (path / name / "__init__.py").write_text(f"WHO = 'user {name}'\n")
    return path


@pytest.mark.oneflow
def test_api_and_cli_from_a_folder_with_its_own_zoo_eval_converters(tmp_path):
    proj = _user_project(tmp_path / "proj")
    env = dict(os.environ, BERT_OF_HOME=str(tmp_path / "home"), BERT_OF_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    ck = str(tmp_path / "ck")
    code = ("import zoo, eval, converters; assert zoo.WHO == 'user zoo' and eval.WHO == 'user eval';"
            "from bert_of import BertConfig, BertModel; import bert_of.zoo, bert_of.eval.results;"
            "import bert_of.converters.convert;"
            f"m = BertModel(BertConfig.from_google_dict({TINY!r})); m.init_weights(); m.save_pretrained({ck!r});"
            f"m = BertModel.from_pretrained({ck!r}); print(m.config.num_hidden_layers, zoo.WHO)")
    r = subprocess.run([sys.executable, "-c", code], cwd=proj, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-3:] == [str(TINY["num_hidden_layers"]), "user", "zoo"]
    r = subprocess.run([sys.executable, "-m", "bert_of.cli", "zoo", "list"], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[0] == "NAME" and "bert-base" in r.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the sources: setuptools writes build/ (and *.egg-info) into the tree it builds.
    src = tmp_path_factory.mktemp("src") / "bert_of"
    keep = ("bert_of", "converters", "zoo", "eval", "pyproject.toml", "README.md")
    os.makedirs(src)
    for name in keep:
        p = os.path.join(ROOT, name)
        if os.path.isdir(p):
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(p, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", str(src), "-w", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (whl,) = [p for p in os.listdir(out) if p.endswith(".whl")]
    return os.path.join(out, whl)


def test_wheel_holds_only_the_bert_of_namespace(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"bert_of"}, tops
    for f in ("bert_of/zoo/registry.json", "bert_of/eval/published.json", "bert_of/converters/formats/tf1.py",
              *(f"bert_of/align/default-corpus/{n}" for n in ("sample_text.txt", "classics.txt", "vocab.txt"))):
        assert f in names, f
    assert not [n for n in names if n.endswith("serve.py") or "/tests/" in n]  # test servers stay in tests/
    # every module of the checkout ships (a new subpackage missing from pyproject's list would not)
    shipped = {"bert_of": "bert_of", "converters": "bert_of/converters", "zoo": "bert_of/zoo", "eval": "bert_of/eval"}
    for top, where in shipped.items():
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), os.path.join(ROOT, top))
                    assert f"{where}/{rel}" in names, rel


def test_the_shipped_align_corpus_is_the_test_corpus():
    """align's default corpus ships with the package; it is the same text the tests use."""
    for name in ("sample_text.txt", "classics.txt", "vocab.txt"):
        with open(os.path.join(ROOT, "bert_of", "align", "default-corpus", name), "rb") as a, \
                open(os.path.join(ROOT, "tests", "data", "text", name), "rb") as b:
            assert a.read() == b.read(), name


@pytest.mark.oneflow
def test_wheel_installed_outside_the_repo_imports_every_subpackage(wheel, tmp_path):
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "--target", str(target), wheel], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    proj = _user_project(tmp_path / "proj")
    code = ("import importlib, pkgutil, sys\n"
            f"subs = {SUBPACKAGES!r}\n"
            "for name in subs:\n"
            "    m = importlib.import_module(name)\n"
            f"    assert m.__file__.startswith({str(target)!r}), (name, m.__file__)\n"
            "    for info in pkgutil.iter_modules(m.__path__, name + '.'):\n"
            "        if not info.name.endswith('__main__'):\n"
            "            importlib.import_module(info.name)\n"
            "bad = [n for n, m in list(sys.modules.items()) if n.split('.')[0] in ('zoo', 'eval', 'converters')]\n"
            "assert not bad, bad\n"
            "from bert_of.zoo.registry import SHIPPED; import os; assert os.path.isfile(SHIPPED)\n"
            "from bert_of.align.data import DEFAULT_CORPUS, DEFAULT_VOCAB\n"
            f"assert all(p.startswith({str(target)!r}) and os.path.isfile(p) for p in (*DEFAULT_CORPUS, DEFAULT_VOCAB))\n"
            "print('ok', len(sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code], cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
