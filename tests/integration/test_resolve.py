"""ONE resolver from "a name or a path" to a checkpoint, and from_pretrained on top of it.

Real checkpoints in every format (Google's TF1 written by TensorFlow's own Saver, then converted
by bert_of to lazy, HF and Keras), a zoo entry served from a real zip through a file:// URL, real
subprocesses racing for one conversion. The model layer reaches the zoo only through the hook in
bert_of.checkpoint: checked statically (imports) and at run time (modules loaded).
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from bert_of.checkpoint import load_checkpoint, resolve_checkpoint
from bert_of.converters.verify import tf_reference_checkpoint as ref
from bert_of.converters.convert import convert
from bert_of.errors import CheckpointError, ConfigError
from bert_of.files.locks import locked
from bert_of.resolver import register_resolver
from bert_of.zoo import NotCachedError, OfflineError, UnknownEntryError, Zoo
from bert_of.zoo.cache import MANIFEST
from bert_of.zoo.resolve import content_key, source_key
from tests.conftest import ROOT, TINY, run_cli, write_vocab
from tests.zoo_support.release import make_release_dir, registry_entry, write_registry, zip_release

pytestmark = pytest.mark.oneflow


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    """One tiny model in every format: {"tf": Google's folder, "of": ..., "lazy": ..., "hf": ..., "h5": ...}."""
    root = tmp_path_factory.mktemp("formats")
    google = root / "google"
    google.mkdir()
    ref.make_checkpoint(str(google / "bert_model.ckpt"), TINY, seed=7, heads=("pretraining",), realistic=True)
    (google / "bert_config.json").write_text(json.dumps(TINY))
    write_vocab(google / "vocab.txt", TINY["vocab_size"])
    out = {"tf": str(google), "of": str(root / "of")}
    convert("tf2of", out["tf"], out["of"])
    for f in ("lazy", "hf", "h5"):
        out[f] = str(root / f)
        convert(f"of2{f}", out["of"], out[f])
    return out


@pytest.fixture
def home(tmp_path, monkeypatch):
    for k in ("BERT_OF_OFFLINE", "BERT_OF_ENDPOINT", "BERT_OF_REGISTRY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("BERT_OF_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def converted_dirs(home):
    d = home / "converted"
    return sorted(x for x in os.listdir(d) if not x.startswith(".")) if d.is_dir() else []


# --------------------------------------------------------------------------- paths in any format


@pytest.mark.parametrize("fmt", ["tf", "lazy", "hf", "h5"])
def test_any_format_is_converted_once_and_loads_the_same_numbers(formats, home, fmt, capsys):
    from bert_of import BertForPreTraining, zoo

    want = load_checkpoint(formats["of"]).tensors
    r = zoo.resolve_details(formats[fmt])
    assert os.path.dirname(r.path) == str(home / "converted") and len(os.path.basename(r.path)) == 32
    assert (r.name, r.source_format, r.source_path) == (fmt if fmt != "tf" else "google", fmt, formats[fmt])
    assert r.conversion["direction"] == f"{fmt}2of" and "source tensors" in r.conversion["report"]
    man = json.load(open(os.path.join(r.path, MANIFEST)))
    assert man["kind"] == "converted" and man["source"]["path"] == formats[fmt] and man["source"]["format"] == fmt
    assert set(man["files"]) == {"config.json", "model.safetensors", "vocab.txt"}
    assert f"converting it to bert_of ({fmt}2of)" in capsys.readouterr().err
    got = load_checkpoint(r.path).tensors
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    # from_pretrained takes the same path, reuses the conversion, and loads those numbers
    stamp = os.stat(os.path.join(r.path, MANIFEST)).st_mtime_ns
    model = BertForPreTraining.from_pretrained(formats[fmt])
    assert "converting" not in capsys.readouterr().err
    assert os.stat(os.path.join(r.path, MANIFEST)).st_mtime_ns == stamp and converted_dirs(home) == [
        os.path.basename(r.path)]
    state = model.canonical_state()
    for k in ("bert.encoder.layer.2.output.dense.weight", "cls.predictions.bias"):
        assert state[k].tobytes() == want[k].tobytes()


def test_bert_of_dirs_stay_put_and_changed_sources_convert_again(formats, home, tmp_path, capsys):
    from bert_of import zoo

    r = zoo.resolve_details(formats["of"])
    assert tuple(r) == (formats["of"], "of", "of", None, formats["of"])
    assert zoo.resolve(formats["of"]) == formats["of"] and converted_dirs(home) == []
    # a TF prefix (not only its folder) resolves; a source that changes gets a fresh conversion
    src = tmp_path / "google-copy"
    convert("of2tf", formats["of"], str(src))
    prefix = str(src / "bert_model.ckpt")
    first = zoo.resolve(prefix)
    assert zoo.resolve(prefix) == first and len(converted_dirs(home)) == 1
    os.utime(src / "vocab.txt", ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: the same content
    assert zoo.resolve(prefix) == first and len(converted_dirs(home)) == 1
    err = capsys.readouterr().err
    assert err.count("converting it to bert_of (tf2of)") == 1 and "same content as a copy converted before" in err
    cfg = json.loads((src / "bert_config.json").read_text())
    (src / "bert_config.json").write_text(json.dumps(dict(cfg, initializer_range=0.5)))  # changed
    second = zoo.resolve(prefix)
    assert second != first and len(converted_dirs(home)) == 2
    assert capsys.readouterr().err.count("converting it to bert_of (tf2of)") == 1
    # the vocab given for a source without one is part of the key
    assert source_key(prefix, "tf", str(src / "vocab.txt"))[0] != source_key(prefix, "tf")[0]


def _cache_items(home):
    r = run_cli("zoo", "cache", "list", "--json", env={"BERT_OF_HOME": str(home)})
    return {i["id"]: i for i in json.loads(r.stdout)["items"] if i["kind"] == "converted"}


def test_converted_copies_are_listed_sized_removed_and_pruned(formats, home, tmp_path):
    from bert_of import zoo

    hf, lazy = tmp_path / "hf", tmp_path / "lazy"
    shutil.copytree(formats["hf"], hf)
    shutil.copytree(formats["lazy"], lazy)
    a, b = zoo.resolve(str(hf)), zoo.resolve(str(lazy))
    items = _cache_items(home)
    assert sorted(items) == sorted([os.path.basename(a), os.path.basename(b)])
    ia = items[os.path.basename(a)]
    assert (ia["source"], ia["format"], ia["state"]) == (str(hf), "hf", "current")
    assert ia["size"] == sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a) for f in fs) > 0
    table = run_cli("zoo", "cache", "list", env={"BERT_OF_HOME": str(home)}).stdout
    assert f"{str(hf)} (hf)" in table and "current" in table and "2 item(s)" in table
    # a copy of the same files elsewhere shares the converted copy; the first source can then go
    hf2 = tmp_path / "hf-copy"
    shutil.copytree(hf, hf2)
    assert zoo.resolve(str(hf2)) == a and len(converted_dirs(home)) == 2
    shutil.rmtree(hf)
    assert _cache_items(home)[os.path.basename(a)]["state"] == "current"  # hf-copy still uses it
    # a source that is gone, or holds other content now, is what prune removes
    shutil.rmtree(lazy)
    assert _cache_items(home)[os.path.basename(b)]["state"] == "source gone"
    os.utime(hf2 / "config.json", ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: kept
    assert _cache_items(home)[os.path.basename(a)]["state"] == "source changed"
    r = run_cli("zoo", "cache", "prune", "--dry-run", env={"BERT_OF_HOME": str(home)})
    assert f"would remove {b} " in r.stdout and "would remove 1 converted copy" in r.stdout
    assert len(converted_dirs(home)) == 2
    r = run_cli("zoo", "cache", "prune", env={"BERT_OF_HOME": str(home)})
    assert f"removed {b} " in r.stdout and converted_dirs(home) == [os.path.basename(a)]
    r = run_cli("zoo", "cache", "remove", hf2, env={"BERT_OF_HOME": str(home)})  # by its source's path
    assert r.stdout.strip() == f"removed {a}" and converted_dirs(home) == []
    assert os.listdir(home / "converted" / ".refs") == []
    r = run_cli("zoo", "cache", "remove", "no-such-thing", env={"BERT_OF_HOME": str(home)}, check=False)
    assert r.returncode == 1 and r.stderr.strip().endswith("`bert-of zoo cache list` shows what is)")


def test_names_that_are_nothing_fail_in_one_line(formats, home, tmp_path):
    from bert_of import BertModel, zoo

    with pytest.raises(UnknownEntryError) as ei:
        zoo.resolve("bert-bsae")
    assert str(ei.value) == ("bert-bsae: no such file or directory, and not a zoo name; did you mean bert-base, "
                             "bert-small, bert-large? (`bert-of zoo list` shows the names)")
    with pytest.raises(UnknownEntryError, match="^no/such/dir: no such file or directory, and not a zoo name"):
        BertModel.from_pretrained("no/such/dir")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("hello\n")
    with pytest.raises(CheckpointError, match=f"^{junk}: not a checkpoint in any known format"):
        zoo.resolve(str(junk))
    # a source that cannot be converted leaves nothing behind
    bad = tmp_path / "hf-no-vocab"
    bad.mkdir()
    for f in ("config.json", "model.safetensors"):
        os.link(os.path.join(formats["hf"], f), bad / f)
    with pytest.raises(CheckpointError, match="no vocab.txt"):
        zoo.resolve(str(bad))
    assert converted_dirs(home) == [] and os.listdir(home / "converted") == []
    assert zoo.resolve(str(bad), vocab=os.path.join(formats["of"], "vocab.txt")).startswith(str(home / "converted"))


# --------------------------------------------------------------------------- zoo names


@pytest.fixture(scope="module")
def release_zip(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    files = make_release_dir(str(root / "files"), dict(TINY, num_hidden_layers=2))
    hashes = zip_release(files, str(root / "tiny.zip"), "uncased_L-2_H-32_A-4")
    return root / "tiny.zip", hashes


def test_zoo_names_resolve_download_offline_and_not_cached(home, tmp_path, release_zip, monkeypatch):
    from bert_of import BertForQuestionAnswering, zoo

    zip_path, hashes = release_zip
    reg = write_registry(tmp_path / "reg.json", [
        registry_entry("tiny", zip_path.as_uri(), hashes, aliases=["tiny-alias"]),
        registry_entry("far", "https://bert-of-test.invalid/far.zip", hashes)])
    monkeypatch.setenv("BERT_OF_REGISTRY", reg)
    with pytest.raises(NotCachedError, match=r"^tiny \(of\) is not in the cache"):
        zoo.resolve("tiny", download=False)
    r = zoo.resolve_details("tiny-alias")
    assert r.path == str(home / "models" / "tiny" / "of") and r.name == "tiny" and r.source_format == "tf"
    assert r.conversion["direction"] == "tf2of" and r.source_path == r.path
    assert zoo.resolve("tiny", download=False) == r.path
    model = BertForQuestionAnswering.from_pretrained("tiny", num_labels=2)
    assert model.config.num_hidden_layers == 2 and model.loading_info["missing"] == ["qa_outputs.weight",
                                                                                     "qa_outputs.bias"]
    monkeypatch.setenv("BERT_OF_OFFLINE", "1")
    with pytest.raises(OfflineError, match="^far \\(of\\) is not in the cache"):
        BertForQuestionAnswering.from_pretrained("far")
    # `zoo add` entries: an of folder is used in place; another format is converted into the cache
    z = Zoo()
    tf_dir = z.download("tiny", "tf", verify=False)
    z.add(tf_dir, "mine-tf")
    r = zoo.resolve_details("mine-tf")
    assert r.path == str(home / "models" / "mine-tf" / "of") and r.source_path == tf_dir
    z.add(r.path, "mine-of")
    assert tuple(zoo.resolve_details("mine-of")) == (r.path, "mine-of", "of", None, r.path)


# --------------------------------------------------------------------------- from_pretrained's keywords


def test_from_pretrained_keywords_are_config_fields_validated(formats, home):
    from bert_of import BertForSequenceClassification, BertModel

    with pytest.raises(TypeError) as ei:
        BertModel.from_pretrained(formats["of"], hiden_dropout_prob=0.0)
    assert str(ei.value).startswith("BertModel.from_pretrained() got unexpected keyword argument(s) "
                                    "hiden_dropout_prob (did you mean hidden_dropout_prob?)")
    with pytest.raises(TypeError, match="extra"):
        BertModel.from_pretrained(formats["of"], extra={})
    with pytest.raises(ConfigError, match="hidden_act 'gelu' is not one of"):
        BertModel.from_pretrained(formats["of"], hidden_act="gelu")
    with pytest.raises(ConfigError, match="hidden_size 32 is not a multiple of num_attention_heads 5"):
        BertModel.from_pretrained(formats["of"], num_attention_heads=5)
    base = load_checkpoint(formats["of"]).config
    m = BertForSequenceClassification.from_pretrained(formats["of"], num_labels=3, hidden_dropout_prob=0.0)
    assert (m.config.num_labels, m.config.hidden_dropout_prob) == (3, 0.0)
    assert m.classifier.weight.shape == (3, 32)
    assert (base.num_labels, base.hidden_dropout_prob) == (2, 0.1)  # the checkpoint's config is not mutated
    assert load_checkpoint(formats["of"]).config.hidden_dropout_prob == 0.1


# --------------------------------------------------------------------------- the hook and the layers


def test_hook_handles_bert_of_dirs_itself_and_delegates_the_rest(formats, tmp_path):
    import bert_of

    try:
        register_resolver(None)
        assert resolve_checkpoint(formats["of"]) == formats["of"]
        with pytest.raises(CheckpointError, match="not a bert_of checkpoint directory"):
            resolve_checkpoint(formats["hf"])  # config.json + model.safetensors, but HF's
        seen = []
        register_resolver(lambda p: seen.append(p) or formats["of"])
        assert resolve_checkpoint(formats["hf"]) == formats["of"] and seen == [formats["hf"]]
    finally:
        register_resolver(bert_of._resolve_with_zoo)
    # a bert_of folder with a damaged config is not sent elsewhere: loading it names the file
    from bert_of import BertModel

    broken = tmp_path / "broken"
    broken.mkdir()
    os.link(os.path.join(formats["of"], "model.safetensors"), broken / "model.safetensors")
    (broken / "config.json").write_text(open(os.path.join(formats["of"], "config.json")).read()[:40])
    with pytest.raises(ConfigError, match=f"^{broken / 'config.json'}: malformed JSON"):
        BertModel.from_pretrained(str(broken))


MODEL_AND_BASE = ("errors", "version", "runtime", "files", "progress", "config", "resolver", "tensors", "checkpoint",
                  "tokenization", "vocab", "initializers", "protobuf", "_flow", "inputs", "outputs", "model_io",
                  "modeling", "heads")


def _model_or_base_imports_only(path, mod):
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n == "bert_of" or n.startswith("bert_of."):
                top = n.split(".")[1] if "." in n else None
                assert top in MODEL_AND_BASE, f"{path} ({mod}) imports {n}"


def test_model_layer_never_imports_zoo_converters_or_eval(formats):
    for mod in MODEL_AND_BASE:
        path = os.path.join(ROOT, "bert_of", mod + ".py")
        if not os.path.isfile(path):  # a package (bert_of/files/): its modules
            path = os.path.join(ROOT, "bert_of", mod)
        for path in [path] if path.endswith(".py") else \
                [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".py")]:
            _model_or_base_imports_only(path, mod)
    # importing bert_of (which registers the zoo's resolver) loads neither the zoo nor NumPy
    code = "import sys, bert_of; print(sorted(m for m in sys.modules if m.startswith(('numpy', 'bert_of.zoo'))))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    # at run time: loading a bert_of checkpoint touches neither the zoo nor the converters
    code = ("import sys; from bert_of import BertModel; BertModel.from_pretrained(sys.argv[1]);"
            "print([m for m in sys.modules if m.startswith(('bert_of.zoo', 'bert_of.converters', 'bert_of.eval'))])")
    r = subprocess.run([sys.executable, "-c", code, formats["of"]], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


# --------------------------------------------------------------------------- concurrent callers


def test_concurrent_callers_share_one_conversion(formats, home):
    src = formats["tf"]
    key, _ = source_key(src, "tf")
    lock = home / "locks" / f"converted-{key}.lock"
    code = "import sys; from bert_of import zoo; print(zoo.resolve(sys.argv[1]))"
    env = dict(os.environ, PYTHONPATH=ROOT, BERT_OF_HOME=str(home))
    procs, logs = [], []
    with locked(str(lock), "test", wait=True):  # both callers find the conversion under way
        for i in range(2):
            logs.append(home.parent / f"stderr{i}.txt")
            procs.append(subprocess.Popen([sys.executable, "-c", code, src], stdout=subprocess.PIPE,
                                          stderr=open(logs[-1], "w"), text=True, cwd=ROOT, env=env))
        deadline = time.monotonic() + 90
        while not all(p.exists() and "waiting for its lock" in p.read_text() for p in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.1)
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    ckey = content_key(src, "tf")
    assert outs[0] == outs[1] == str(home / "converted" / ckey)
    assert sum("converting it to bert_of" in p.read_text() for p in logs) == 1
    assert converted_dirs(home) == [ckey] and sorted(os.listdir(home / "converted" / ".refs")) == [key]


def test_commands_name_their_option_in_resolver_errors(home):
    from bert_of.zoo import resolve_for

    with pytest.raises(UnknownEntryError, match=r"^--init-checkpoint no-such-model: no such file or directory, "
                                                r"and not a zoo name"):
        resolve_for("--init-checkpoint", "no-such-model")
    with pytest.raises(UnknownEntryError, match=r"^--model: expected a checkpoint"):
        resolve_for("--model", "")
