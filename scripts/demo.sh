#!/usr/bin/env bash
# `make demo`: the four things bert_of is for, end to end.
#   1. a training checkpoint in Google's TF1 layout (made with TensorFlow's Saver)
#   2. bert-of inspect
#   3. bert-of convert tf2of --verify   (TF reference vs bert_of eager + nn.Graph, tol 1e-5)
#   4. bert-of convert of2tf --with-optimizer, then a bit-exact tensor-by-tensor comparison
#   5. the Python API on the converted checkpoint
#   6. pretraining data, a 2-rank pretraining run into the (demo's own) zoo, its curves
#   7. SQuAD: fine-tune that checkpoint, predict, score (EM/F1), the results table
#   8. your own data: fine-tune a classifier on a sentiment CSV, predict with probabilities, score
#   9. alignment: eager = graph, 1 process = 2 ranks
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=demo-out
rm -rf "$OUT" && mkdir -p "$OUT"
export TF_CPP_MIN_LOG_LEVEL=2

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. A BERT-mini training checkpoint in Google's TF1 layout (L=4 H=256, Adam slots, step 1000)"
$BIN/python scripts/make_tf_checkpoint.py "$OUT/google" --layers 4 --hidden 256 --heads 4 --intermediate 1024 \
    --with-optimizer --global-step 1000

step "2. bert-of inspect $OUT/google"
$BIN/bert-of inspect "$OUT/google" | (head -4; echo "  ..."; tail -1)

step "3. bert-of convert tf2of $OUT/google -o $OUT/bert_of --verify"
$BIN/bert-of convert tf2of "$OUT/google" -o "$OUT/bert_of" --with-optimizer --verify

step "4. bert-of convert of2tf (back to TF1) and compare every tensor bit for bit"
$BIN/bert-of convert of2tf "$OUT/bert_of" -o "$OUT/google_again" --with-optimizer
$BIN/python - "$OUT/google" "$OUT/google_again" <<'PY'
import sys
from bert_of.converters.containers import tf1_bundle as tb
a, b = (tb.resolve_prefix(p) for p in sys.argv[1:3])
ea, eb = tb.read_index(a), tb.read_index(b)
assert list(ea) == list(eb), set(ea) ^ set(eb)
for name in ea:
    x, y = tb.read_tensor(a, ea[name]), tb.read_tensor(b, eb[name])
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
print(f"tf -> of -> tf: {len(ea)} of {len(ea)} tensors bit-exact (names, dtypes, shapes, bytes)")
PY

step "5. The Python API"
$BIN/python - "$OUT/bert_of" <<'PY'
import sys
import numpy as np
from bert_of import BertForPreTraining, BertGraph
from bert_of._flow import flow
model = BertForPreTraining.from_pretrained(sys.argv[1])
ids = flow.tensor([[101, 2000, 2001, 102, 2002, 2003, 102, 0]], dtype=flow.int64)
tt = flow.tensor([[0, 0, 0, 0, 1, 1, 1, 0]], dtype=flow.int64)
mask = flow.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=flow.int64)
out = model(ids, token_type_ids=tt, attention_mask=mask)
for k, v in out.to_dict().items():
    print(f"  {k:24s} {tuple(v.shape)}")
g = BertGraph(model)(ids, tt, mask)
print("  eager vs nn.Graph max |diff|:", max(float(np.abs(a.numpy() - g.to_dict()[k].numpy()).max())
                                           for k, a in out.to_dict().items()))
PY
step "6. Pretraining data from text, then a 2-rank pretraining run (graph mode, global tensors) into the local zoo"
export BERT_OF_HOME="$PWD/$OUT/bert_of_home"   # the demo's own zoo/cache, not ~/.cache
# The demo's vocabulary: the text fixture's, plus every word of the SQuAD-format file of step 7
# (a real model's 30k WordPieces cover them; 966 pieces would spell most of its words letter by letter).
$BIN/python - tests/data/text/vocab.txt tests/data/squad/train-v1.1-finetune.json "$OUT" <<'PY'
import json, sys
from bert_of.tokenization import BasicTokenizer
vocab_in, squad, out = sys.argv[1:4]
vocab = open(vocab_in, encoding="utf-8").read().split("\n")[:-1]
bt, known = BasicTokenizer(do_lower_case=True), set(vocab)
for article in json.load(open(squad, encoding="utf-8"))["data"]:
    for p in article["paragraphs"]:
        for text in [p["context"]] + [qa["question"] for qa in p["qas"]]:
            new = [w for w in bt.tokenize(text) if w not in known]
            vocab += new
            known.update(new)
open(f"{out}/vocab.txt", "w", encoding="utf-8").write("\n".join(vocab) + "\n")
json.dump({"vocab_size": len(vocab), "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu"},
          open(f"{out}/mini_config.json", "w"))
print(f"{out}/vocab.txt: {len(vocab)} tokens")
PY
$BIN/bert-of data create-pretraining --input tests/data/text/sample_text.txt tests/data/text/classics.txt \
    --vocab "$OUT/vocab.txt" --output "$OUT/pretrain_data" --max-seq-length 64 \
    --max-predictions-per-seq 10 --dupe-factor 3 --num-parts 2
# no --vocab: pretrain takes the one the data was made with
$BIN/bert-of pretrain --data "$OUT/pretrain_data" -o "$OUT/pretrain_run" --config "$OUT/mini_config.json" \
    --steps 40 --batch-size 16 --warmup-steps 4 --lr 2e-3 --save-every 20 --seed 0 \
    --log-every 10 --nproc 2 --zoo-name demo-mini-bert -q 2>&1 | grep -v "OMP_NUM\|\*\*\*\*\|libibverbs\|CUDA driver" || true
$BIN/python - "$OUT/pretrain_run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(f"  step {r['step']:3d}  loss {r['loss']:.4f}  mlm_acc {r['mlm_acc']:.3f}  lr {r['lr']:.2e}  world {r['world']}")
PY
$BIN/bert-of plot "$OUT/pretrain_run"   # -> pretrain_run/curves.png
$BIN/bert-of zoo list | grep -E "^NAME|demo-mini-bert"

step "7. SQuAD: fine-tune demo-mini-bert on the shipped SQuAD-format file (a run folder, as pretrain's: the model in squad_run/final), predict, score, record"
SQ=tests/data/squad
LENGTHS=(--max-seq-length 64 --doc-stride 32 --max-query-length 24)
$BIN/bert-of finetune squad --model demo-mini-bert --train $SQ/train-v1.1-finetune.json -o "$OUT/squad_run" \
    "${LENGTHS[@]}" --batch-size 16 --steps 60 --lr 3e-3 --log-every 20 --mode eager
$BIN/bert-of eval squad --model "$OUT/squad_run" --data $SQ/dev-v1.1-finetune.json -o "$OUT/squad_predictions" \
    --name demo-mini-bert-squad --mode eager
$BIN/bert-of results --task squad-v1.1 --measured-only

step "8. Your own data: a 3-class sentiment CSV: fine-tune demo-mini-bert, predict with probabilities, score, record"
U=tests/data/user
$BIN/bert-of finetune classify --model demo-mini-bert --train $U/sentiment-train.csv -o "$OUT/sentiment_run" \
    --max-seq-length 32 --batch-size 16 --steps 80 --lr 1e-3 --log-every 40 --mode eager
$BIN/bert-of predict classify --model "$OUT/sentiment_run" --data $U/sentiment-new.csv \
    -o "$OUT/sentiment_predictions.csv" --mode eager
head -4 "$OUT/sentiment_predictions.csv"
$BIN/bert-of eval classify --model "$OUT/sentiment_run" --data $U/sentiment-dev.csv --name demo-mini-bert-sentiment \
    -o "$OUT/sentiment_eval" --mode eager
$BIN/bert-of results --task classify --measured-only

step "9. Alignment: eager vs graph and 1 process vs 2 ranks train the same (12 steps, reports + plots)"
$BIN/bert-of align eager-graph data-parallel --steps 12 --size tiny -o "$OUT/align" -q 2>&1 \
    | grep -v "OMP_NUM\|\*\*\*\*"

printf '\ndemo done: outputs in %s/\n' "$OUT"
