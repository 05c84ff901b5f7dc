"""Four eager AdamW steps of a tiny BertForQuestionAnswering on CPU (a padded row, clip 1.0), for the
training kernels' tests to run in a process of their own under the environment they choose.

    python tests/scripts/eager_finetune_steps.py CONFIG_JSON [HIDDEN_ACT [PARAM_SUBSTRINGS]]

CONFIG_JSON: a Google-style config; HIDDEN_ACT: replaces its activation ("" keeps it);
PARAM_SUBSTRINGS: comma-separated, the parameters printed are those whose name holds one (default all).
Prints one JSON line: {"status": train_status(), "update": update_status(), "losses": [4 floats],
"grad_norms": [4 floats], "params": {name: values}}.
"""

import json
import sys

import numpy as np

from bert_of import BertConfig, BertForQuestionAnswering
from bert_of._flow import flow
from bert_of.options import TrainConfig
from bert_of.runtime.train_kernels import train_status
from bert_of.runtime.update_kernels import update_status
from bert_of.training.runtime import Runtime
from bert_of.training.trainer import Trainer

cfg = BertConfig.from_google_dict(json.loads(sys.argv[1]))
if len(sys.argv) > 2 and sys.argv[2]:
    cfg.hidden_act = sys.argv[2]
keep = [s for s in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if s]
flow.manual_seed(0)
model = BertForQuestionAnswering(cfg)
model.init_weights(seed=3)
rng = np.random.default_rng(0)
B, S = 4, 21
batch = dict(input_ids=rng.integers(5, cfg.vocab_size, (B, S)),
             token_type_ids=(np.arange(S) > 8).astype(np.int64)[None].repeat(B, 0),
             attention_mask=np.ones((B, S), np.int64), start_positions=rng.integers(9, S, B),
             end_positions=rng.integers(9, S, B))
batch["attention_mask"][1, 15:] = 0
trainer = Trainer(model, TrainConfig(mode="eager", optimizer="adamw", lr=1e-3, steps=10, weight_decay=0.01,
                                     clip_grad_norm=1.0, seed=0), Runtime.create("cpu"))
outs = [trainer.step({k: v.astype(np.int64) for k, v in batch.items()}) for _ in range(4)]
params = {k: v.numpy().tolist() for k, v in model.state_dict().items() if not keep or any(s in k for s in keep)}
print(json.dumps({"status": train_status(), "update": update_status(), "losses": [o["loss"] for o in outs],
                  "grad_norms": [o["grad_norm"] for o in outs], "params": params}))
