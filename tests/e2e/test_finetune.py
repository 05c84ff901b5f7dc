"""Fine-tuning and prediction: `bert-of finetune / predict / eval squad|glue`, the results store,
`bert-of results` and `zoo list`.

No SQuAD or GLUE data can be downloaded here, so a tiny BERT (hidden 32, 2 layers, vocabulary built
from the fixture text) is fine-tuned on small files in the official formats
(tests/data/squad/*-finetune.json, written by make_finetune_fixtures.py; tests/data/glue/sst-2-train.tsv).
It learns from scratch, so the end-to-end tests measure MEMORISATION: the dev file asks the training
questions again (with extra gold answers), and EM/F1 must rise far above the same model with an untrained
head. That shows the whole path (features, windows, loss, optimizer, schedule, checkpoint, prediction,
post-processing, scoring, recording) works; the published numbers need BERT-base, the real data and a GPU.
"""

import contextlib
import hashlib
import io
import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import error_lines, run_cli, run_ranks
from tests.helpers.models import (DEV11, DEV20, GL, LENGTHS, SQ, SST_TRAIN, TRAIN11, TRAIN20, build_vocab,
                                   tiny_bert)

pytestmark = pytest.mark.oneflow

NBEST_KEYS = ["text", "probability", "start_logit", "end_logit"]
V2_KEYS = ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1",
           "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def cli(*args):
    """`bert-of ARGS` in this process: (exit code, stdout, stderr)."""
    from bert_of.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def ok(*args):
    rc, out, err = cli(*args)
    assert rc == 0, f"bert-of {' '.join(map(str, args))} failed:\n{out}\n{err}"
    return out, err


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    home = root / "home"
    saved = os.environ.get("BERT_OF_HOME")
    os.environ["BERT_OF_HOME"] = str(home)  # results store, eval outputs, zoo: all inside the test
    try:
        vocab, n = build_vocab(root / "vocab.txt")
        yield SimpleNamespace(root=root, home=home, results=str(home / "results.jsonl"),
                              base=tiny_bert(root / "tiny-bert", vocab, n),
                              base_nodrop=tiny_bert(root / "tiny-bert-nodrop", vocab, n, dropout=0.0))
    finally:
        if saved is None:
            os.environ.pop("BERT_OF_HOME", None)
        else:
            os.environ["BERT_OF_HOME"] = saved


@pytest.fixture(scope="module")
def sst2_graph(env):
    """SST-2 fine-tuned as a graph, dropout off, in this process: the one-process run that two tests
    compare with (a resumed run, a 2-rank run), trained once for both. ``args`` (without -o; the run
    added ``--log-every 1 --save-every 2``, which change no number) and ``run``, its directory."""
    args = ["finetune", "glue", "--task", "sst-2", "--model", env.base_nodrop, "--train", SST_TRAIN,
            "--max-seq-length", 32, "--batch-size", 10, "--steps", 4, "--lr", 1e-3, "--no-record", "--mode", "graph"]
    run = env.root / "sst2-graph"
    ok(*args, "--log-every", 1, "--save-every", 2, "--output", run)
    return SimpleNamespace(args=args, run=run)


@pytest.fixture(scope="module")
def squad(env):
    """The untrained model's score, then `bert-of finetune squad ... --eval-data dev` (graph mode)."""
    out, _ = ok("eval", "squad", "--model", env.base, "--data", DEV11, *LENGTHS, "--mode", "eager")
    before = json.loads(out.strip().splitlines()[-1])
    ft = str(env.root / "squad-ft")
    r = run_cli("finetune", "squad", "--model", env.base, "--train", TRAIN11, "--output", ft, *LENGTHS,
                "--batch-size", 32, "--steps", 40, "--lr", 3e-3, "--log-every", 10, "--eval-data", DEV11)
    after = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\nSQuAD v1.1 fixture, tiny BERT: untrained head EM {before['exact_match']:.2f} F1 {before['f1']:.2f}"
          f" -> fine-tuned EM {after['exact_match']:.2f} F1 {after['f1']:.2f}")
    return SimpleNamespace(before=before, after=after, ft=ft, log=r.stderr)


# --------------------------------------------------------------------------- SQuAD


def test_mode_auto_fine_tunes_and_predicts_eager_on_cpu(squad, env):
    """--mode unset (auto): on CPU the training steps and the prediction of --eval-data run eager,
    the faster there (docs/benchmarks.md); the record says which ran."""
    recs = [json.loads(line) for line in open(env.results)]
    rec = [r for r in recs if r["task"] == "squad-v1.1" and r["hparams"].get("steps") == 40][-1]
    assert rec["hparams"]["mode"] == "eager" and rec["settings"]["predict_mode"] == "eager"


def test_mode_auto_rules():
    from bert_of.training.runtime import Runtime

    cpu, gpu, ddp = Runtime("cpu"), Runtime("cuda"), Runtime("cuda", world=2, ddp=True)
    jobs = ("pretrain", "finetune", "predict")
    assert [cpu.mode("auto", j) for j in jobs] == ["graph", "eager", "eager"]
    assert [gpu.mode("auto", j) for j in jobs] == ["graph", "graph", "graph"]
    assert [ddp.mode("auto", j) for j in jobs] == ["eager"] * 3  # DDP has no graph
    assert all(rt.mode(m, j) == m for rt in (cpu, gpu, ddp) for m in ("graph", "eager") for j in jobs)
    with pytest.raises(ValueError, match="job 'train'"):
        cpu.mode("auto", "train")


def test_finetune_squad_lifts_em_f1_far_above_the_untrained_model(squad):
    assert squad.before["exact_match"] <= 10 and squad.before["f1"] <= 15
    assert squad.after["exact_match"] >= 35 and squad.after["f1"] >= 40
    assert squad.after["exact_match"] - squad.before["exact_match"] >= 30
    log = [l for l in error_lines(squad.log) if l.startswith("step ")]
    # step 1 at once, then every --log-every (10)
    assert len(log) == 5 and log[0].startswith("step 1/40") and log[-1].startswith("step 40/40"), log
    # the rate counts windows (SQuAD features), and the loss shown says it is the window's mean
    assert all(" windows/s " in l and "(mean of 10 step(s); step " in l for l in log[1:]), log
    first, last = (float(l.split()[3]) for l in (log[0], log[-1]))
    assert last < 0.5 * first


def test_finetuned_checkpoint_and_train_args(squad, env):
    # -o is the run folder, as pretrain's; the model is its final/, --eval-data's results its eval/
    # (the lock file stays, free, as in every run folder: the next writer takes it)
    assert sorted(os.listdir(squad.ft)) == [".bert_of.lock", "eval", "final", "metrics.jsonl", "run.json"]
    final = os.path.join(squad.ft, "final")
    assert sorted(os.listdir(final)) == ["config.json", "model.safetensors", "train_args.json", "vocab.txt"]
    assert not [f for f in os.listdir(env.root) if f.startswith(".")]  # nothing half-written left behind
    args = json.load(open(os.path.join(final, "train_args.json")))
    assert args["task"] == "squad-v1.1" and args["do_lower_case"] is True
    assert args["base_checkpoint"] == {"name": "tiny-bert", "path": env.base, "format": "bert_of",
                                       "sha256": sha256(os.path.join(env.base, "model.safetensors"))}
    assert args["train_data"]["sha256"] == sha256(TRAIN11)
    hp = args["hparams"]
    assert hp["lr"] == 3e-3 and hp["batch_size"] == 32 and hp["steps"] == 40 and hp["warmup_steps"] == 4
    assert (hp["max_seq_length"], hp["doc_stride"], hp["max_query_length"]) == (96, 48, 24)
    # Google's optimizer and schedule by default
    assert (hp["weight_decay"], hp["adam_eps"], hp["bias_correction"], hp["clip_grad_norm"]) == (0.01, 1e-6, False, 1.0)
    assert hp["warmup_proportion"] == 0.1 and hp["mode"] == "eager" and hp["ranks"] == 1
    assert args["train_examples"] == 28 and args["train_features"] == 70  # long contexts: several windows
    assert args["command"].startswith("bert-of finetune squad --model")
    from bert_of.checkpoint import load_checkpoint

    ck = load_checkpoint(final)
    assert "qa_outputs.weight" in ck.tensors and not any(k.startswith("cls.") for k in ck.tensors)


def test_every_evaluation_is_recorded_and_results_prints_it(squad, env):
    from bert_of.eval.results import load_results

    recs = [r for r in load_results(env.results) if r["task"] == "squad-v1.1"]
    assert len(recs) == 2
    base, ft = recs
    assert base["checkpoint"]["name"] == "tiny-bert" and base["head_trained"] is False
    assert base["metrics"] == {k: pytest.approx(v) for k, v in squad.before.items()}
    assert ft["metrics"] == {k: pytest.approx(v) for k, v in squad.after.items()} and ft["head_trained"] is True
    final = os.path.join(squad.ft, "final")  # the model of the run folder, named as the run
    assert ft["checkpoint"] == {"name": "squad-ft", "path": final, "format": "bert_of",
                                "sha256": sha256(os.path.join(final, "model.safetensors"))}
    assert ft["base_checkpoint"]["path"] == env.base and ft["note"] == "fine-tuned from tiny-bert"
    hp = ft["hparams"]
    assert hp["lr"] == 3e-3 and hp["n_best_size"] == 20 and hp["max_answer_length"] == 30
    assert ft["data"]["sha256"] == sha256(DEV11) and os.path.isfile(ft["predictions"]["path"])
    assert ft["hardware"]["cpus"] == os.cpu_count() and ft["date"][:2] == "20" and ft["tool"] == "bert-of eval squad"

    out, _ = ok("results", "--task", "squad-v1.1")
    rows = [l for l in out.splitlines() if l.startswith("| squad-v1.1 | dev-v1.1-finetune.json |")]
    assert len(rows) == 2
    em, f1 = squad.after["exact_match"], squad.after["f1"]
    assert f"| squad-ft | exact_match {em:.2f}, f1 {f1:.2f} | measured |" in rows[1]
    assert "fine-tuned from tiny-bert" in rows[1] and "task head not trained" in rows[0]
    assert "published (not measured)" in out  # the reference rows join the table


def test_predict_squad_writes_the_official_files(squad, env, tmp_path):
    """Settings come from train_args.json; eager prediction equals the graph run of `eval`."""
    ok("predict", "squad", "--model", squad.ft, "--data", DEV11, "--output", tmp_path, "--mode", "eager")
    assert sorted(os.listdir(tmp_path)) == ["nbest_predictions.json", "predictions.json"]  # v1.1: no null odds
    preds = json.load(open(tmp_path / "predictions.json"))
    qids = [qa["id"] for a in json.load(open(DEV11))["data"] for p in a["paragraphs"] for qa in p["qas"]]
    assert list(preds) == qids and all(isinstance(v, str) and v for v in preds.values())
    from bert_of.eval.results import load_results

    graph_run = [r for r in load_results(env.results) if r["checkpoint"]["name"] == "squad-ft"][0]
    assert preds == json.load(open(graph_run["predictions"]["path"]))
    nbest = json.load(open(tmp_path / "nbest_predictions.json"))
    assert list(nbest) == qids
    for qid, entries in nbest.items():
        assert 1 <= len(entries) <= 20 and all(list(e) == NBEST_KEYS for e in entries)
        assert entries[0]["text"] == preds[qid] and sum(e["probability"] for e in entries) == pytest.approx(1.0)
    assert (tmp_path / "predictions.json").read_text().startswith("{\n    \"dan-1\": ")  # run_squad's indent=4


def test_squad_windows_padded_to_the_batch_answer_as_windows_padded_to_384(squad, env, tmp_path):
    """Short windows run at their batch's longest row: the same answers, null odds and n-best
    logits (float rounding) as every window padded to --max-seq-length."""
    runs = {}
    for name, extra in (("batch", []), ("max", ["--pad-to-max-length"])):
        out = tmp_path / name
        ok("predict", "squad", "--model", squad.ft, "--data", DEV11, "--output", out,
           "--mode", "eager", *extra)
        runs[name] = (json.load(open(out / "predictions.json")), json.load(open(out / "nbest_predictions.json")))
    (preds, nbest), (preds_max, nbest_max) = runs["batch"], runs["max"]
    assert preds == preds_max
    for qid, entries in nbest.items():
        top = [(e["text"], e["start_logit"], e["end_logit"]) for e in entries[:3]]
        ref = [(e["text"], e["start_logit"], e["end_logit"]) for e in nbest_max[qid][:3]]
        assert [t for t, _, _ in top] == [t for t, _, _ in ref]
        np.testing.assert_allclose([x[1:] for x in top], [x[1:] for x in ref], rtol=0, atol=1e-5)


def test_zoo_list_shows_measured_squad_scores(squad, env):
    from bert_of.cli import main

    def zoo_main(args):
        return main(["zoo", *args])

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert zoo_main(["add", env.base, "--name", "tiny-squad-bert"]) == 0
        assert zoo_main(["list"]) == 0
    lines = out.getvalue().splitlines()
    row = next(l for l in lines if l.startswith("tiny-squad-bert "))
    # the fine-tuned model's result counts for the checkpoint it was fine-tuned from; the untrained one does not
    assert row.split()[-1] == f"{squad.after['exact_match']:.2f}/{squad.after['f1']:.2f}*"
    assert any(l.startswith("*: measured here") for l in lines)
    base = next(l for l in lines if l.startswith("bert-base-uncased "))
    assert base.split()[-1] == "80.72/88.41"  # published, not measured
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert zoo_main(["list", "--json"]) == 0
    entry = next(e for e in json.loads(out.getvalue())["entries"] if e["name"] == "tiny-squad-bert")
    assert entry["squad_v11_measured"]["checkpoint"] == "squad-ft"
    assert entry["squad_v11_measured"]["finetuned_from"] == "tiny-bert"


def test_squad_v2_finetune_predict_and_null_odds(env, tmp_path):
    """v2.0: impossible questions train towards [CLS]; predict writes null_odds.json; the threshold works."""
    ft = tmp_path / "v2"
    store = tmp_path / "v2.jsonl"
    out, err = ok("finetune", "squad", "--model", env.base, "--train", TRAIN20, "--output", ft, *LENGTHS,
                  "--batch-size", 16, "--steps", 12, "--lr", 3e-3, "--mode", "eager", "--eval-data", DEV20,
                  "--results", store)
    assert "finetune squad-v2.0: 12 examples" in err
    res = json.loads(out[out.index("{"):])
    assert list(res) == V2_KEYS and (res["total"], res["HasAns_total"], res["NoAns_total"]) == (12, 7, 5)
    args = json.load(open(ft / "final" / "train_args.json"))
    assert args["task"] == "squad-v2.0" and args["hparams"]["epochs"] == 2.0  # Google's v2.0 default
    rec = json.loads(open(store).read().splitlines()[-1])
    assert rec["task"] == "squad-v2.0" and rec["settings"]["version_2_with_negative"] is True
    # --eval-data's files in the run folder (-o), as run_squad.py writes them into --output_dir
    ev = ft / "eval" / os.path.splitext(os.path.basename(DEV20))[0]
    assert {"predictions.json", "nbest_predictions.json", "null_odds.json", "scores.json"} <= set(os.listdir(ev))
    assert json.load(open(ev / "scores.json"))["scores"] == res
    assert rec["predictions"]["path"] == str(ev / "predictions.json")

    qids = [qa["id"] for a in json.load(open(DEV20))["data"] for p in a["paragraphs"] for qa in p["qas"]]
    for thresh, expect_empty in (("-1e9", True), ("1e9", False)):
        d = tmp_path / f"pred{thresh}"
        ok("predict", "squad", "--model", ft, "--data", DEV20, "--output", d, "--mode", "eager",
           f"--null-score-diff-threshold={thresh}")
        assert sorted(os.listdir(d)) == ["nbest_predictions.json", "null_odds.json", "predictions.json"]
        odds = json.load(open(d / "null_odds.json"))
        assert list(odds) == qids and all(isinstance(v, float) and np.isfinite(v) for v in odds.values())
        preds = json.load(open(d / "predictions.json"))
        assert all((p == "") == expect_empty for p in preds.values())
        nbest = json.load(open(d / "nbest_predictions.json"))
        assert all(any(e["text"] == "" for e in v) and all(list(e) == NBEST_KEYS for e in v) for v in nbest.values())


# --------------------------------------------------------------------------- GLUE


def test_finetune_glue_lifts_accuracy(env, tmp_path):
    out, _ = ok("eval", "glue", "--model", env.base, "--task", "sst-2", "--data", SST_TRAIN, "--mode", "eager",
                "--max-seq-length", 32)
    before = json.loads(out)["accuracy"]
    ft = tmp_path / "sst2"
    r = run_cli("finetune", "glue", "--task", "sst-2", "--model", env.base, "--train", SST_TRAIN, "--output", ft,
                "--max-seq-length", 32, "--batch-size", 10, "--steps", 30, "--lr", 1e-3, "--log-every", 10,
                "--eval-data", SST_TRAIN)
    after = json.loads(r.stdout[r.stdout.index("{"):])
    print(f"\nSST-2 fixture (20 sentences, memorised): accuracy {before:.1f} -> {after['accuracy']:.1f}")
    assert after == {"task": "sst-2", "examples": 20, "accuracy": pytest.approx(after["accuracy"])}
    assert before <= 75 and after["accuracy"] >= 95
    args = json.load(open(ft / "final" / "train_args.json"))
    assert args["task"] == "sst-2" and args["labels"] == ["0", "1"] and args["hparams"]["max_seq_length"] == 32
    from bert_of.eval.results import load_results

    recs = [x for x in load_results(env.results) if x["task"] == "sst-2"]
    assert [x["checkpoint"]["name"] for x in recs] == ["tiny-bert", "sst2"]
    assert recs[1]["metrics"]["accuracy"] == pytest.approx(after["accuracy"])
    out, _ = ok("results", "--task", "sst-2", "--measured-only")
    assert f"| sst2 | accuracy {after['accuracy']:.2f} | measured |" in out

    # a test file (no labels): predict writes a GLUE submission file; the task comes from train_args.json
    preds = tmp_path / "SST-2"
    ok("predict", "glue", "--model", ft, "--data", os.path.join(GL, "sst-2-test.tsv"), "-o", preds,
       "--mode", "eager")
    lines = (preds / "predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and [l.split("\t")[0] for l in lines[1:]] == ["0", "1"]
    assert all(l.split("\t")[1] in ("0", "1") for l in lines[1:])
    rc, _, err = cli("eval", "glue", "--model", ft, "--data", os.path.join(GL, "sst-2-test.tsv"), "--mode", "eager")
    assert rc == 1 and err.strip().splitlines()[-1].endswith("has no labels (a test file?); `bert-of predict glue` "
                                                            "writes predictions for it")


def test_stsb_trains_a_regression_head(env, tmp_path):
    ft = tmp_path / "stsb"
    dev = os.path.join(GL, "sts-b-dev.tsv")
    # (no dropout: six pairs are too few for the tiny model to get past predicting their mean otherwise)
    out, _ = ok("finetune", "glue", "--task", "sts-b", "--model", env.base_nodrop, "--train", dev, "--output", ft,
                "--max-seq-length", 32, "--batch-size", 6, "--steps", 25, "--lr", 2e-3, "--mode", "eager",
                "--eval-data", dev, "--no-record")
    res = json.loads(out[out.index("{"):])
    assert res["task"] == "sts-b" and res["pearson"] > 50  # 6 pairs, memorised
    from bert_of.checkpoint import load_checkpoint

    ck = load_checkpoint(str(ft / "final"))
    assert ck.config.num_labels == 1 and ck.tensors["classifier.weight"].shape == (1, 32)
    preds = tmp_path / "STS-B"
    ok("predict", "glue", "--model", ft, "--data", os.path.join(GL, "sts-b-test.tsv"), "-o", preds,
       "--mode", "eager")
    vals = [float(l.split("\t")[1]) for l in (preds / "predictions.tsv").read_text().splitlines()[1:]]
    assert len(vals) == 2 and all(np.isfinite(vals))
    # a regression head cannot serve a two-class task
    rc, _, err = cli("eval", "glue", "--task", "sst-2", "--model", ft, "--data", SST_TRAIN)
    assert rc == 1 and err.strip().splitlines()[-1] == (
        "bert-of: error: stsb: its classifier head has 1 output(s) but SST-2 needs 2 (a checkpoint fine-tuned for "
        "another task?)")


def test_learning_rate_schedule_is_googles():
    """lr * step / warmup during the warmup, then lr * (1 - step / total)."""
    from bert_of._flow import flow
    from bert_of.training import TrainConfig, build_optimizer, build_scheduler

    opt = build_optimizer(flow.nn.Linear(2, 2), TrainConfig(lr=2.0), for_graph=False)
    sched = build_scheduler(opt, TrainConfig(steps=40, warmup_steps=4))
    got = []
    for _ in range(41):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert got == pytest.approx([2.0 * (s / 4 if s < 4 else 1 - s / 40) for s in range(41)], abs=1e-12)


def test_eager_and_graph_finetune_agree(env, tmp_path):
    """Without dropout the two modes take the same steps (AdamW, warmup + decay, clipping, weight decay)."""
    from bert_of.checkpoint import load_checkpoint

    results = {}
    for mode in ("eager", "graph"):
        ok("finetune", "glue", "--task", "sst-2", "--model", env.base_nodrop, "--train", SST_TRAIN, "--output",
           tmp_path / mode, "--max-seq-length", 32, "--batch-size", 10, "--steps", 6, "--lr", 1e-3,
           "--warmup-proportion", 0.5, "--clip-grad-norm", 0.5, "--mode", mode, "--no-record")
        final = tmp_path / mode / "final"
        results[mode] = (json.load(open(final / "train_args.json")), load_checkpoint(str(final)))
    (ea, ec), (ga, gc) = results["eager"], results["graph"]
    assert ea["first_loss"] == pytest.approx(ga["first_loss"], rel=1e-5)
    assert ea["final_loss"] == pytest.approx(ga["final_loss"], rel=1e-4)
    for name, t in ec.tensors.items():
        np.testing.assert_allclose(t, gc.tensors[name], atol=2e-5, err_msg=name)


# --------------------------------------------------------------------------- bad input


def _one_error(args):
    rc, out, err = cli(*args)
    lines = [l for l in err.splitlines() if l.startswith("bert-of: error:")]
    assert rc == 1 and len(lines) == 1, (args, out, err)
    return lines[0][len("bert-of: error: "):]


def test_bad_input_is_one_line_naming_the_record(env, tmp_path):
    out = ["--output", tmp_path / "out"]
    m = ["--model", env.base]
    assert _one_error(["finetune", "squad", *m, "--train", os.path.join(SQ, "bad-answer-start.json"), *out]) == (
        f"{os.path.join(SQ, 'bad-answer-start.json')}: question 'q5' answer 1: answer_start 70 does not match the "
        "context (expected 'Vistula', context has 'tula Ri' there)")
    assert "malformed JSON at line" in _one_error(["finetune", "squad", *m, "--train",
                                                   os.path.join(SQ, "malformed.json"), *out])
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\na fine film .\t1\na bad film .\tpositive\n")
    assert _one_error(["finetune", "glue", "--task", "sst-2", *m, "--train", bad, *out]) == \
        f"{bad}: line 3: label 'positive' is not a SST-2 label (0, 1)"
    assert _one_error(["finetune", "glue", "--task", "nope", *m, "--train", bad, *out]).startswith(
        "unknown task 'nope' (known: cola, sst-2")
    assert _one_error(["eval", "squad", "--model", tmp_path / "nowhere", "--data", DEV11]) == \
        f"--model {tmp_path / 'nowhere'}: no such file or directory, and not a zoo name " \
        "(`bert-of zoo list` shows the names)"
    assert _one_error(["finetune", "squad", *m, "--train", TRAIN11, *out, "--max-seq-length", 512]) == \
        f"--max-seq-length 512 exceeds the model's max_position_embeddings 128 ({env.base})"
    for extra in ((), ("--overwrite",)):  # the base model is an input: never replaced, even with --overwrite
        assert _one_error(["finetune", "squad", *m, "--train", TRAIN11, "--output", env.base, *extra]) == \
            f"{env.base}: is the source {env.base}; choose another destination"
    existing = tmp_path / "existing"
    existing.mkdir()
    assert _one_error(["finetune", "squad", *m, "--train", TRAIN11, "--output", existing]) == \
        f"{existing}: already exists (use --overwrite to replace it)"
    assert _one_error(["finetune", "squad", *m, "--train", TRAIN11, *out, "--batch-size", 0]) == \
        "--batch-size must be at least 1, got 0"
    assert not os.path.exists(tmp_path / "out")
    # through the installed entry point: exit code 1 and that single line
    r = run_cli("predict", "squad", *m, "--data", os.path.join(SQ, "empty.json"), *out, check=False)
    assert r.returncode == 1
    assert error_lines(r.stderr) == [f"bert-of: error: {os.path.join(SQ, 'empty.json')}: empty file "
                                     "(expected a SQuAD json file)"]


# --------------------------------------------------------------------------- several ranks


@pytest.mark.skipif(os.environ.get("BERT_OF_SKIP_DIST") == "1", reason="BERT_OF_SKIP_DIST=1")
def test_two_ranks_train_like_one(env, tmp_path):
    """`bert-of finetune glue ...` run as 2 ranks by a launcher (bert_of.launch's job: no --nproc, as under any
    external launcher; global
    tensors: parameters broadcast, batch split over the ranks) takes the same steps as one process. Eager
    here to keep the test short; the graph path is the same code with global inputs (checked by hand)."""
    base = ["finetune", "glue", "--task", "sst-2", "--model", env.base_nodrop, "--train", SST_TRAIN,
            "--max-seq-length", 32, "--batch-size", 10, "--steps", 4, "--lr", 1e-3, "--no-record",
            "--mode", "eager"]
    ok(*base, "--output", tmp_path / "one")
    r = run_ranks("-m", "bert_of.cli", *base, "--output", tmp_path / "two")
    assert r.returncode == 0, r.stderr[-3000:]
    one = json.load(open(tmp_path / "one" / "final" / "train_args.json"))
    two = json.load(open(tmp_path / "two" / "final" / "train_args.json"))
    assert two["hparams"]["ranks"] == 2
    assert two["first_loss"] == pytest.approx(one["first_loss"], rel=1e-5)
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-4)
    from bert_of.checkpoint import load_checkpoint

    a, b = load_checkpoint(str(tmp_path / "one" / "final")), load_checkpoint(str(tmp_path / "two" / "final"))
    for name, t in a.tensors.items():
        np.testing.assert_allclose(t, b.tensors[name], atol=2e-5, err_msg=name)
    shutil.rmtree(tmp_path / "two")


# --------------------------------------------------------------------------- the shared trainer: resume, AMP, --nproc


def _metrics(run_dir):
    from bert_of.files.atomic import read_jsonl

    return [{k: r[k] for k in ("step", "loss", "lr", "grad_norm")} for r in read_jsonl(str(run_dir / "metrics.jsonl"))]


def test_finetune_resumes_exactly_and_eager_amp_changes_nothing_on_cpu(env, tmp_path):
    """The run folder (-o) keeps metrics.jsonl and checkpoints: a run stopped after step 3 and resumed ends where
    the straight run ends (eager, dropout on). Eager AMP (the dynamic loss scaler) is allowed; on CPU the
    kernels stay fp32 and scaling by 2^16 is exact, so it trains to the same numbers."""
    from bert_of.checkpoint import load_checkpoint

    base = ["finetune", "glue", "--task", "sst-2", "--model", env.base, "--train", SST_TRAIN, "--max-seq-length", 32,
            "--batch-size", 10, "--steps", 6, "--lr", 1e-3, "--mode", "eager", "--no-record", "--log-every", 1]
    ok(*base, "--output", tmp_path / "a", "--save-every", 3)
    ok(*base, "--output", tmp_path / "b", "--save-every", 3, "--stop-after", 3)
    assert not os.path.exists(tmp_path / "b" / "final")  # "killed" after step 3: nothing published
    assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == ["step-0000003"]
    _, err = ok("finetune", "glue", "-o", tmp_path / "b", "--resume")  # the run's record says the rest
    assert "resuming" in err and "at step 3" in err
    straight, resumed = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert len(straight) == 6 and resumed == straight
    ok(*base, "--output", tmp_path / "c", "--amp")
    args = {k: json.load(open(tmp_path / k / "final" / "train_args.json")) for k in "abc"}
    assert args["c"]["hparams"]["amp"] is True
    # (a resumed run reads its step-1 loss back from metrics.jsonl, which keeps 7 decimals)
    assert args["b"]["first_loss"] == round(args["a"]["first_loss"], 7)
    assert (args["c"]["first_loss"], args["c"]["final_loss"]) == (args["a"]["first_loss"], args["a"]["final_loss"])
    assert args["b"]["final_loss"] == args["a"]["final_loss"]
    for k in "bc":
        ck, ref = load_checkpoint(str(tmp_path / k / "final")), load_checkpoint(str(tmp_path / "a" / "final"))
        for name, t in ref.tensors.items():
            assert np.array_equal(t, ck.tensors[name]), (k, name)
    assert _one_error([*base, "--output", tmp_path / "d", "--resume"]) == \
        f"{tmp_path / 'd'}: nothing to resume (no run.json: not a run of bert-of finetune glue)"


def test_a_run_resumes_in_the_mode_it_began_in(env, sst2_graph, tmp_path):
    """--mode auto is made concrete once, when a run begins: a run whose record says auto and whose
    checkpoint trained as nn.Graph (as auto chose for fine-tuning on CPU before 2026-12-03) resumes
    as a graph, to the straight graph run's numbers, not as today's eager. (Dropout off: OneFlow 0.9
    keeps a graph's dropout RNG inside the compiled job, so only eager resumes replay dropout.)"""
    base = [*sst2_graph.args, "--log-every", 1, "--save-every", 2]
    a = sst2_graph.run  # the straight run: base -o a
    ok(*base, "--output", tmp_path / "b", "--stop-after", 2)
    record = tmp_path / "b" / "run.json"
    rec = json.loads(record.read_text())
    assert rec["mode"] == "graph"
    rec["mode"] = "auto"  # the record an auto run wrote
    record.write_text(json.dumps(rec))
    _, err = ok("finetune", "glue", "-o", tmp_path / "b", "--resume")
    assert "resuming" in err and "graph mode" in err
    runs = {"a": a, "b": tmp_path / "b"}
    args = {k: json.load(open(runs[k] / "final" / "train_args.json")) for k in "ab"}
    assert args["b"]["hparams"]["mode"] == "graph" and args["b"]["final_loss"] == args["a"]["final_loss"]
    from bert_of.files.atomic import read_jsonl

    losses = {k: [(r["step"], r["loss"], r["mode"]) for r in read_jsonl(str(runs[k] / "metrics.jsonl"))]
              for k in "ab"}
    assert len(losses["a"]) == 4 and losses["b"] == losses["a"]



def test_finetune_run_dir_faults_are_one_line_and_publish_nothing(env, tmp_path):
    """The fine-tuning -o is a run directory like pretrain's: one writer, a resume with another setup
    refused, a non-finite loss stops the run and publishes no final/."""
    from bert_of.files.locks import LOCK_NAME, locked

    base = ["finetune", "glue", "--task", "sst-2", "--model", env.base, "--train", SST_TRAIN, "--max-seq-length", 32,
            "--batch-size", 10, "--steps", 4, "--lr", 1e-3, "--mode", "eager", "--no-record", "--log-every", 1]
    run = tmp_path / "run"
    ok(*base, "--output", run, "--save-every", 2, "--stop-after", 2)
    with locked(str(run / LOCK_NAME)):  # this process holds the run: a second writer is refused at once
        line = _one_error([*base, "--output", run, "--resume"])
    assert line.startswith(f"{run}: another bert_of process is writing it (pid {os.getpid()}: "), line
    line = _one_error([*base, "--output", run, "--resume", "--batch-size", 5])
    assert "cannot resume exactly with a different setup (" in line and "batch_size 10 -> 5" in line, line
    assert _one_error([*base, "--output", run]) == \
        f"{run}: already holds a run; use --resume to continue it or --overwrite to start again"
    line = _one_error([*base, "--output", tmp_path / "nan-run", "--lr", 1e30, "--warmup-proportion", 0,
                       "--save-every", 1])
    assert "the loss is not finite at step" in line and "training stopped, nothing published" in line, line
    assert not os.path.exists(run / "final") and not os.path.exists(tmp_path / "nan-run" / "final")
    assert all(r["loss"] is not None for r in _metrics(tmp_path / "nan-run"))  # strict JSON lines
    # --overwrite starts a run folder again
    ok(*base, "--output", run, "--overwrite", "--steps", 2)
    assert sorted(n for n in os.listdir(run) if n != LOCK_NAME) == ["final", "metrics.jsonl", "run.json"]


@pytest.mark.skipif(os.environ.get("BERT_OF_SKIP_DIST") == "1", reason="BERT_OF_SKIP_DIST=1")
def test_nproc_runs_the_command_on_two_ranks(env, sst2_graph, tmp_path):
    """`bert-of finetune ... --nproc 2` relaunches itself under OneFlow's launcher (graph mode, global
    tensors) and trains like one process; `predict --nproc 2` writes the same predictions."""
    one_run = sst2_graph.run  # the same command in one process
    run_cli(*sst2_graph.args, "--output", tmp_path / "two", "--nproc", 2)
    one = json.load(open(one_run / "final" / "train_args.json"))
    two = json.load(open(tmp_path / "two" / "final" / "train_args.json"))
    assert (one["hparams"]["ranks"], two["hparams"]["ranks"]) == (1, 2)
    assert two["first_loss"] == pytest.approx(one["first_loss"], rel=1e-5)
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-4)
    from bert_of.checkpoint import load_checkpoint

    a, b = load_checkpoint(str(one_run / "final")), load_checkpoint(str(tmp_path / "two" / "final"))
    for name, t in a.tensors.items():
        np.testing.assert_allclose(t, b.tensors[name], atol=2e-5, err_msg=name)
    pred = ["predict", "glue", "--model", one_run, "--data", SST_TRAIN, "--mode", "graph"]
    ok(*pred, "-o", tmp_path / "p1")
    run_cli(*pred, "--output", tmp_path / "p2", "--nproc", 2)
    assert (tmp_path / "p1" / "predictions.tsv").read_text() == (tmp_path / "p2" / "predictions.tsv").read_text()
