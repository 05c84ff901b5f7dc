"""Run as N ranks of bert_of's launcher (tests/conftest.py:run_ranks:
`python -m bert_of.launch --job N 1 0 127.0.0.1 0 tests/scripts/dist_train.py ...`).

Trains a BertForPreTraining from one initialisation for a few steps, data
parallel over the ranks in each of the WAYs given in turn (a fresh model and
trainer for each: one launch serves them all, instead of one launch of N
OneFlow processes per way), and writes the per-step losses of each (rank 0).
Usage: dist_train.py OUT.json WAY...   (WAY: global-graph | global-eager | ddp)
Output: {"world": N, "ways": {WAY: [loss per step], ...}}
"""

import json
import sys

from bert_of._flow import flow
from bert_of.config import BertConfig
from bert_of.heads import BertForPreTraining
from bert_of.training import Runtime, TrainConfig, Trainer
from tests.scripts.train_fixture import CONFIG, STEPS, TRAIN, global_batch

out_path, ways = sys.argv[1], sys.argv[2:]
rank, world = flow.env.get_rank(), flow.env.get_world_size()


def train(way):
    model = BertForPreTraining(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    runtime = Runtime.create("cpu", dist="ddp" if way == "ddp" else "global")
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode="graph" if way == "global-graph" else "eager")), runtime)
    losses = []
    for step in range(STEPS):
        batch = global_batch(step)
        n = len(batch["input_ids"])
        mine = {k: v[rank * n // world:(rank + 1) * n // world] for k, v in batch.items()}  # this rank's rows
        losses.append(trainer.step(mine)["loss"])
    return losses


report = {"world": world, "ways": {way: train(way) for way in ways}}
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(report, f)
