"""Run as N ranks of bert_of's launcher (tests/conftest.py:run_ranks:
`python -m bert_of.launch --job N 1 0 127.0.0.1 0 tests/scripts/dist_forward.py ...`).

Loads a bert_of checkpoint, makes parameters global broadcast and each rank's
slice of the batch global split(0), runs the model eagerly and in an nn.Graph,
and writes on rank 0: the gathered outputs and the sbp every output had.
Usage: dist_forward.py CKPT BATCH.npz OUT.json OUT.npz
"""

import json
import sys

import numpy as np

from bert_of._flow import flow
from bert_of.checkpoint import load_checkpoint
from bert_of.heads import model_class_for
from bert_of.modeling import BertGraph

ckpt_dir, batch_path, out_json, out_npz = sys.argv[1:5]
rank, world = flow.env.get_rank(), flow.env.get_world_size()
placement = flow.placement("cpu", ranks=list(range(world)))
B, S = flow.sbp.broadcast, flow.sbp.split(0)

ckpt = load_checkpoint(ckpt_dir)
model = model_class_for(ckpt.tensors, ckpt.config)(ckpt.config)
model.load_canonical(ckpt.tensors, strict_heads=True)
model.eval()
model.to_global(placement=placement, sbp=B)

with np.load(batch_path, allow_pickle=False) as z:
    batch = {k: z[k] for k in z.files}
n = batch["input_ids"].shape[0]
assert n % world == 0, "batch must divide by the ranks"
lo, hi = rank * n // world, (rank + 1) * n // world
# Each rank contributes its own rows: the global tensor is their concatenation.
args = [flow.tensor(batch[k][lo:hi], dtype=flow.int64).to_global(placement=placement, sbp=S)
        for k in ("input_ids", "token_type_ids", "attention_mask")]

report, arrays = {"world": world}, {}
with flow.no_grad():
    for mode, fn in (("eager", model), ("graph", BertGraph(model))):
        out = fn(*args).to_dict()
        report[mode] = {k: [str(s) for s in v.sbp] for k, v in out.items()}
        for k, v in out.items():
            arrays[f"{mode}/{k}"] = v.to_global(sbp=B).to_local().numpy()
param_sbp = sorted({str(p.sbp) for p in model.parameters()})
report["param_sbp"] = param_sbp
if rank == 0:
    np.savez(out_npz, **arrays)
    with open(out_json, "w") as f:
        json.dump(report, f)
