"""What a newcomer from transformers or google-research/bert meets on the command line: the
checkpoint's lower-casing reaches fine-tuning and prediction, plain text is tagged word by word,
a run folder resolves to its model, --eval-data is checked before training, writers agree on
-o / --overwrite. A tiny BERT (hidden 32, 2 layers) and a few steps: the paths, not the accuracy."""

import csv
import json
import os
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, error_lines, run_cli
from tests.helpers.models import tiny_bert

pytestmark = pytest.mark.oneflow

USER = os.path.join(ROOT, "tests", "data", "user")
S_TRAIN, S_DEV, S_NEW = (os.path.join(USER, f"sentiment-{s}.csv") for s in ("train", "dev", "new"))
N_TRAIN, N_DEV = (os.path.join(USER, f"ner-{s}.conll") for s in ("train", "dev"))
FAST = ["--max-seq-length", 32, "--batch-size", 8, "--mode", "eager", "--log-every", 100, "--no-record"]


def _cased_vocab(path):
    """Every word of the user fixtures with its capitals (a cased vocabulary), plus characters."""
    from bert_of.tokenization import BasicTokenizer

    bt = BasicTokenizer(do_lower_case=False)
    words = set()
    for name in os.listdir(USER):
        with open(os.path.join(USER, name), encoding="utf-8-sig", newline="") as f:
            if name.endswith(".csv"):
                for row in csv.DictReader(f):
                    for v in row.values():
                        words.update(bt.tokenize(v))
            elif name.endswith(".conll"):
                words.update(w for line in f for w in bt.tokenize(line))
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)
    vocab += [c for c in chars if c not in words] + ["##" + c for c in chars]
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(path), len(vocab)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("habits")
    saved = os.environ.get("BERT_OF_HOME")
    os.environ["BERT_OF_HOME"] = str(root / "home")  # the zoo's cache (converted copies) inside the test
    try:
        vocab, n = _cased_vocab(root / "vocab.txt")
        yield SimpleNamespace(root=root, cased=tiny_bert(root / "cased", vocab, n, dropout=0.0))
    finally:
        if saved is None:
            os.environ.pop("BERT_OF_HOME", None)
        else:
            os.environ["BERT_OF_HOME"] = saved


# --------------------------------------------------------------------------- provenance


def test_a_cased_checkpoint_fine_tuned_through_the_cli_keeps_case(env, tmp_path):
    from bert_of import BertTokenizer

    hf = tmp_path / "hf"
    run_cli("convert", "of2hf", env.cased, "-o", hf)
    assert json.loads((hf / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert BertTokenizer.from_pretrained(str(hf)).do_lower_case is False  # the Python API's answer
    ft = tmp_path / "ft"
    run_cli("finetune", "classify", "--model", hf, "--train", S_TRAIN, "-o", ft, "--steps", 1, *FAST)
    args = json.loads((ft / "final" / "train_args.json").read_text())
    assert args["do_lower_case"] is False and args["do_lower_case_from"] == "checkpoint"
    assert BertTokenizer.from_pretrained(str(ft)).do_lower_case is False
    # what the fine-tuned folder records reaches predict: no flag, the same case as training
    r = run_cli("predict", "classify", "--model", ft, "--data", S_NEW, "-o", tmp_path / "p.jsonl", "-v")
    assert "looks like a CASED vocabulary" not in r.stderr, r.stderr  # what lower-casing it would say
    # an explicit flag still wins, and says what it overrides
    ft2 = tmp_path / "ft2"
    r = run_cli("finetune", "classify", "--model", hf, "--train", S_TRAIN, "-o", ft2, "--steps", 1, *FAST,
                "--do-lower-case")
    args = json.loads((ft2 / "final" / "train_args.json").read_text())
    assert args["do_lower_case"] is True and args["do_lower_case_from"] == "given"
    said = [ln for ln in r.stderr.splitlines() if "--do-lower-case overrides the checkpoint's do_lower_case false" in ln]
    assert said and said[0].endswith(f"({hf} (converted copy))"), r.stderr  # the user's path, not the cache's


# --------------------------------------------------------------------------- plain text to tag


@pytest.fixture(scope="module")
def tagger(env):
    ft = env.root / "tagger"
    run_cli("finetune", "tag", "--model", env.cased, "--train", N_TRAIN, "-o", ft, "--steps", 1, *FAST)
    return ft


def test_predict_tag_on_plain_text_tags_every_word(tagger, tmp_path):
    text = tmp_path / "sentences.txt"
    lines = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "BRUSSELS 1996-08-22 today"]
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "tags.jsonl"
    run_cli("predict", "tag", "--model", tagger, "--data", text, "-o", out)
    got = [json.loads(ln) for ln in out.read_text(encoding="utf-8").splitlines()]
    assert [g["tokens"] for g in got] == [ln.split() for ln in lines]
    assert all(len(g["prediction"]) == len(g["tokens"]) for g in got)
    # a CoNLL file (a word a line) is still read as CoNLL, and tagged data must be CoNLL or JSON Lines
    run_cli("predict", "tag", "--model", tagger, "--data", N_DEV, "-o", tmp_path / "dev.jsonl")
    words = [ln.split()[0] for ln in open(N_DEV, encoding="utf-8") if ln.split() and ln.split()[0] != "-DOCSTART-"]
    assert sum(len(json.loads(ln)["tokens"]) for ln in open(tmp_path / "dev.jsonl")) == len(words)
    r = run_cli("eval", "tag", "--model", tagger, "--data", text, "-o", tmp_path / "ev", check=False)
    assert r.returncode == 1 and "reads as plain text" in error_lines(r.stderr)[0], r.stderr


# --------------------------------------------------------------------------- --eval-data before training


def test_eval_data_problems_are_found_before_training(env, tmp_path):
    unseen = tmp_path / "unseen.csv"
    unseen.write_text("text,label\nfine words,positive\nodd words,ecstatic\n", encoding="utf-8")
    wrong_column = tmp_path / "cols.csv"
    wrong_column.write_text("text\nfine words\n", encoding="utf-8")  # no label column
    bad_tags = tmp_path / "tags.conll"
    bad_tags.write_text("EU B-ORG\nrejects B-NOTATAG\n", encoding="utf-8")
    cases = [(["classify", "--train", S_TRAIN, "--eval-data", tmp_path / "missing.csv"], "no such file"),
             (["classify", "--train", S_TRAIN, "--eval-data", unseen], "'ecstatic' is not one of"),
             (["classify", "--train", S_TRAIN, "--eval-data", wrong_column], "column"),
             (["tag", "--train", N_TRAIN, "--eval-data", bad_tags], "'B-NOTATAG' is not one of the tags")]
    for args, needle in cases:
        out = tmp_path / "never"
        r = run_cli("finetune", args[0], "--model", env.cased, *args[1:], "-o", out, "--steps", 1, *FAST,
                    check=False, process=True)
        lines = error_lines(r.stderr)
        assert r.returncode == 1 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
        assert "steps" not in r.stderr and not out.exists(), r.stderr  # no training started, nothing written


# --------------------------------------------------------------------------- output


def test_verify_prints_a_one_line_verdict_and_json_on_request(tmp_path):
    hf = os.path.join(ROOT, "tests", "data", "hf", "tiny_pt")
    run_cli("convert", "hf2of", hf, "-o", tmp_path / "of")
    r = run_cli("verify", hf, tmp_path / "of", "--modes", "eager")
    assert len(r.stdout.splitlines()) == 1 and r.stdout.startswith("verify: ok: "), r.stdout
    assert "(of) computes what" in r.stdout and "<= 1e-05" in r.stdout
    r = run_cli("verify", hf, tmp_path / "of", "--modes", "eager", "--json", "-o", tmp_path / "r.json")
    report = json.loads(r.stdout)
    assert report["ok"] and report == json.loads((tmp_path / "r.json").read_text())


def test_predict_o_is_a_folder_as_for_eval_and_replaces_only_with_overwrite(tagger, tmp_path):
    out = tmp_path / "preds"
    run_cli("predict", "tag", "--model", tagger, "--data", N_DEV, "-o", out)
    assert os.listdir(out) == ["predictions.jsonl"]
    first = (out / "predictions.jsonl").read_text()
    r = run_cli("predict", "tag", "--model", tagger, "--data", N_DEV, "-o", out, check=False)
    assert r.returncode == 1 and error_lines(r.stderr) == [
        f"bert-of: error: {out / 'predictions.jsonl'}: exists (pass --overwrite to replace it)"], r.stderr
    run_cli("predict", "tag", "--model", tagger, "--data", N_DEV, "-o", out, "--overwrite")
    assert (out / "predictions.jsonl").read_text() == first
    # a file named by its extension is still the file itself (the older spelling), under the same rule
    conll = tmp_path / "p.conll"
    run_cli("predict", "tag", "--model", tagger, "--data", N_DEV, "-o", conll)
    assert run_cli("predict", "tag", "--model", tagger, "--data", N_DEV, "-o", conll, check=False).returncode == 1


def test_a_model_with_64_positions_is_fine_tuned_at_64(env, tmp_path):
    from bert_of.config import BertConfig
    from bert_of.heads import BertForPreTraining

    cfg = BertConfig.from_json_file(os.path.join(env.cased, "config.json"))
    cfg.max_position_embeddings = 64
    model = BertForPreTraining(cfg)
    model.init_weights(seed=0)
    short = tmp_path / "p64"
    model.save_pretrained(str(short), vocab_file=os.path.join(env.cased, "vocab.txt"))
    ft = tmp_path / "ft"
    fast = [a for a in FAST if a not in ("--max-seq-length", 32)]  # the default: 128
    r = run_cli("finetune", "classify", "--model", short, "--train", S_TRAIN, "-o", ft, "--steps", 1, *fast)
    assert f"max_seq_length 128 capped to 64, the model's max_position_embeddings ({short})" in r.stderr, r.stderr
    assert json.loads((ft / "final" / "train_args.json").read_text())["hparams"]["max_seq_length"] == 64
    r = run_cli("finetune", "classify", "--model", short, "--train", S_TRAIN, "-o", tmp_path / "x", "--steps", 1,
                *fast, "--max-seq-length", 100, check=False)  # a length asked for is not silently cut
    assert r.returncode == 1 and "--max-seq-length 100 exceeds the model's max_position_embeddings 64" in r.stderr


# --------------------------------------------------------------------------- a run folder is not a model


def test_a_run_folder_resolves_to_its_final_checkpoint(env, tmp_path):
    import shutil

    run = tmp_path / "runs" / "x"
    (run / "checkpoints" / "step-0000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    shutil.copytree(env.cased, run / "final")
    r = run_cli("zoo", "add", run, "--name", "my-run")
    assert f"a training run; adding the checkpoint it stands for, {run / 'final'}" in r.stderr, r.stderr
    assert json.loads(run_cli("zoo", "info", "my-run", "--json").stdout)["path"] == str(run / "final")
    ft = tmp_path / "ft"
    r = run_cli("finetune", "classify", "--model", run, "--train", S_TRAIN, "-o", ft, "--steps", 1, *FAST, "-v")
    assert f"{run}: a training run; using its final checkpoint {run / 'final'}" in r.stderr, r.stderr  # -v: the
    # common case (every `finetune -o RUN` then `predict --model RUN`) says it only when asked
    assert json.loads((ft / "final" / "train_args.json").read_text())["base_checkpoint"]["path"] == str(run / "final")
    shutil.rmtree(run / "final")  # a run stopped before its end: the error names what there is
    r = run_cli("finetune", "classify", "--model", run, "--train", S_TRAIN, "-o", tmp_path / "ft2", "--steps", 1,
                *FAST, check=False)
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1 and "a training run with no final/ checkpoint" in lines[0] and \
        str(run / "checkpoints" / "step-0000002") in lines[0], r.stderr


def test_a_vocabulary_or_config_that_is_no_regular_file_is_refused_not_read(tmp_path):
    from bert_of.errors import BertOfError
    from bert_of.files.reading import read_json
    from bert_of.vocab import read_vocab_lines

    os.symlink("/dev/zero", tmp_path / "vocab.txt")  # read whole, it never ends
    os.mkfifo(tmp_path / "config.json")  # opened for reading, it blocks until a writer comes
    with pytest.raises(BertOfError, match="not a regular file"):
        read_vocab_lines(str(tmp_path / "vocab.txt"))
    with pytest.raises(BertOfError, match="not a regular file"):
        read_json(str(tmp_path / "config.json"))
