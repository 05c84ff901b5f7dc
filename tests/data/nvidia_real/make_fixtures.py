"""Make tests/data/nvidia_real/: checkpoints written by NVIDIA DeepLearningExamples' own PyTorch BERT
scripts (run_pretraining.py, run_squad.py), run on CPU OUTSIDE this repository.

Not part of bert_of and never imported by it or its tests: it documents how the fixtures were made.
Run with a torch venv (torch 2.13 CPU, numpy, h5py, tqdm, six):

    python make_fixtures.py NVIDIA_CHECKOUT WORKDIR OUT

NVIDIA_CHECKOUT holds ``<commit>/PyTorch/LanguageModeling/BERT`` for 482fe9ac (2020-09-15, the erf
GELU) and 729963dd (2024-03, HEAD; modeling.py as of a9e2c1d5, the tanh GELU), each exported with
``git archive <commit> PyTorch/LanguageModeling/BERT``. Nothing of NVIDIA's code is copied here: the
scripts run from that checkout. What this file adds is what a CPU user has to add:

- stand-ins for the CUDA-only modules the scripts import (apex, amp_C, apex_C, fused_lamb_CUDA,
  dllogger, lddl, and boto3/requests/botocore that file_utils.py imports for downloads it never does),
  written below as small CPU modules (apex's FusedLAMB and the multi_tensor_lamb kernel as plain
  torch code, LAMB as apex documents it);
- a few source edits applied at run time (``PATCHES``: CUDA device -> CPU, synchronize -> nothing),
  each of which must match exactly once, and the AdamW variant (``ADAMW``): ``torch.optim.AdamW``
  in place of the LAMB line, as a user configuring AdamW would edit it;
- tiny data: a 110-token vocabulary (NVIDIA pads it to 112 at run time), HDF5 shards in its
  create_pretraining_data.py layout, and a two-question SQuAD v1.1 file.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np

COMMITS = {"old": "482fe9ac", "new": "729963dd"}
HIDDEN, LAYERS, HEADS, INTER, SEQ, PRED = 32, 2, 2, 64, 32, 4
WORDS = ["the", "a", "of", "and", "to", "in", "is", "was", "for", "on", "with", "as", "by", "at", "from",
         "it", "that", "this", "an", "be", "are", "or", "his", "her", "their", "which", "who", "what", "when",
         "where", "city", "river", "king", "queen", "war", "year", "name", "born", "died", "built", "north",
         "south", "east", "west", "old", "new", "first", "last", "great", "small", "large", "long", "short",
         "red", "blue", "green", "black", "white", "paris", "london", "rome", "france", "england", "italy",
         "church", "castle", "bridge", "tower", "school", "book", "song", "film", "game", "team", "ship",
         "one", "two", "three", "four", "five", "1066", "1492", "1789", "1815", "1914", "##s", "##ed", "##ing",
         "##ly", "##er", "##est", "century", "empire", "capital", "founded", "called", "known", "made",
         "there", "had", "has", "he", "?", ".", ","]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
assert len(VOCAB) == 110, len(VOCAB)

# ---- stand-ins for the CUDA-only imports (CPU code a user writes) -------------------------------
STANDINS = {
    "amp_C.py": '''
import torch

def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """apex's kernel: (the L2 norm of all tensors [1], per-tensor norms)."""
    ts = [t.float() for t in tensor_lists[0]]
    per = torch.stack([t.norm() for t in ts]) if ts else torch.zeros(0)
    return per.norm().reshape(1), per

def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    for src, dst in zip(tensor_lists[0], tensor_lists[1]):
        dst.copy_(src * scale)

def multi_tensor_lamb(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, bias_correction,
                      weight_decay, grad_averaging, mode, global_grad_norm, max_grad_norm, use_nvlamb=False,
                      found_inf=None, inv_scale=None):
    """apex's multi_tensor_lamb on CPU: clip by the global norm, Adam moments, trust ratio."""
    g_list, p_list, m_list, v_list = tensor_lists[:4]
    step = float(step.item() if torch.is_tensor(step) else step)
    lr = float(lr.item() if torch.is_tensor(lr) else lr)
    gnorm = float(global_grad_norm.item() if torch.is_tensor(global_grad_norm) else global_grad_norm)
    mnorm = float(max_grad_norm.item() if torch.is_tensor(max_grad_norm) else max_grad_norm)
    clip = gnorm / mnorm if gnorm > mnorm else 1.0
    scale = float(inv_scale.item()) if inv_scale is not None else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    c1 = 1 - beta1 ** step if bias_correction else 1.0
    c2 = 1 - beta2 ** step if bias_correction else 1.0
    for g, p, m, v in zip(g_list, p_list, m_list, v_list):
        g = g.float() * scale / clip
        m.mul_(beta1).add_(g, alpha=beta3)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        update = (m / c1) / ((v / c2).sqrt() + eps)
        if mode == 1 and weight_decay != 0:
            update = update + weight_decay * p
        pn, un = p.norm(), update.norm()
        ratio = (pn / un).item() if (use_nvlamb or weight_decay != 0) and pn > 0 and un > 0 else 1.0
        p.add_(update, alpha=-lr * ratio)

multi_tensor_lamb_stage1_cuda = multi_tensor_lamb_stage2_cuda = None
''',
    "fused_lamb_CUDA.py": "from amp_C import multi_tensor_l2norm, multi_tensor_lamb\n",
    "apex_C.py": "def flatten(ts):\n    raise RuntimeError('not used on one CPU process')\nunflatten = flatten\n",
    "apex/__init__.py": "from . import amp\n",
    "apex/amp/__init__.py": '''
import contextlib

class _State:
    loss_scalers = []
_amp_state = _State()

def master_params(optimizer):
    """fp32 training: the optimizer's own parameters (what apex yields without amp.initialize)."""
    for group in optimizer.param_groups:
        yield from group["params"]

@contextlib.contextmanager
def scale_loss(loss, optimizer, **kw):
    yield loss

def initialize(model, optimizer, **kw):
    raise RuntimeError("no fp16 on CPU")
''',
    "apex/optimizers/__init__.py": '''
import torch
import amp_C

class FusedLAMB(torch.optim.Optimizer):
    """apex.optimizers.FusedLAMB's interface and state on CPU: per group an int 'step', per
    parameter 'exp_avg' / 'exp_avg_sq'; the global gradient norm clipped to max_grad_norm."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 set_grad_none=True, max_grad_norm=1.0, use_nvlamb=False):
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.use_nvlamb = use_nvlamb

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        gnorm = amp_C.multi_tensor_l2norm(0, None, [grads], False)[0]
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            ps = [p for p in group["params"] if p.grad is not None]
            for p in ps:
                st = self.state[p]
                if not st:
                    st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            amp_C.multi_tensor_lamb(0, None, [[p.grad for p in ps], ps, [self.state[p]["exp_avg"] for p in ps],
                                             [self.state[p]["exp_avg_sq"] for p in ps]],
                                    group["lr"], group["betas"][0], group["betas"][1], group["eps"], group["step"],
                                    int(group["bias_correction"]), group["weight_decay"],
                                    int(group["grad_averaging"]), self.adam_w_mode, gnorm,
                                    group["max_grad_norm"], self.use_nvlamb)

class FusedAdam(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, bias_correction=True, **kw):
        super().__init__(params, lr=lr)
''',
    "apex/multi_tensor_apply/__init__.py": '''
class _Applier:
    available = True
    def __call__(self, op, noop_flag, tensor_lists, *args):
        return op(2048 * 32, noop_flag, tensor_lists, *args)
multi_tensor_applier = _Applier()
''',
    "apex/parallel/__init__.py": "DistributedDataParallel = None\n",
    "apex/parallel/distributed.py": "def flat_dist_call(*a, **k):\n    raise RuntimeError('one process')\n",
    "dllogger.py": '''
import json
class Verbosity:
    OFF, DEFAULT, VERBOSE = 0, 0, 1
class JSONStreamBackend:
    def __init__(self, verbosity=0, filename=None, **kw):
        self.filename = filename
class StdOutBackend:
    def __init__(self, verbosity=0, step_format=None, **kw):
        pass
_backends = []
def init(backends):
    _backends[:] = backends
def metadata(*a, **k):
    pass
def log(step, data, verbosity=1):
    for b in _backends:
        if isinstance(b, JSONStreamBackend) and b.filename:
            with open(b.filename, "a") as f:
                f.write("DLLL " + json.dumps({"step": str(step), "data": {k: str(v) for k, v in data.items()}}) + "\\n")
def flush():
    pass
''',
    "lddl/__init__.py": "",
    "lddl/torch.py": '''
"""LDDL's BERT loader, on the HDF5 shards of NVIDIA's older pipeline: dict batches of
input_ids, token_type_ids, attention_mask, labels (-1 except at masked positions), next_sentence_labels."""
import os
import h5py
import numpy as np
import torch

class _Shards(torch.utils.data.Dataset):
    def __init__(self, d):
        rows = []
        for n in sorted(os.listdir(d)):
            if n.endswith(".hdf5"):
                with h5py.File(os.path.join(d, n), "r") as f:
                    rows += list(zip(*[f[k][:] for k in ("input_ids", "input_mask", "segment_ids",
                                                         "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")]))
        self.rows = rows
    def __len__(self):
        return len(self.rows)
    def __getitem__(self, i):
        ids, mask, seg, pos, lm, nsp = self.rows[i]
        labels = np.full(len(ids), -1, np.int64)
        n = int((pos != 0).sum()) or len(pos)
        labels[pos[:n]] = lm[:n]
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "token_type_ids": torch.tensor(seg, dtype=torch.long),
                "attention_mask": torch.tensor(mask, dtype=torch.long), "labels": torch.tensor(labels),
                "next_sentence_labels": torch.tensor(int(nsp), dtype=torch.long)}

def get_bert_pretrain_data_loader(path, local_rank=0, vocab_file=None, data_loader_kwargs=None, base_seed=0,
                                  log_dir=None, log_level=None, start_epoch=0, **kw):
    kw = dict(data_loader_kwargs or {})
    kw["num_workers"] = 0
    kw["pin_memory"] = False
    return torch.utils.data.DataLoader(_Shards(path), shuffle=True,
                                       generator=torch.Generator().manual_seed(base_seed), **kw)
''',
    "boto3.py": "def resource(*a, **k):\n    raise RuntimeError('no network')\n",
    "requests.py": "def get(*a, **k):\n    raise RuntimeError('no network')\nhead = get\n",
    "botocore/__init__.py": "",
    "botocore/exceptions.py": "class ClientError(Exception):\n    pass\n",
}

_SQUAD = [("self._overflow_buf = torch.cuda.IntTensor([0])", "self._overflow_buf = torch.IntTensor([0])", 1),
          # --no_cuda leaves n_gpu = 0 (the batch size is multiplied by it)
          ("n_gpu = torch.cuda.device_count()", "n_gpu = max(torch.cuda.device_count(), 1)", 1)]
# ---- source edits a CPU user makes (each must match exactly once; "*" = every occurrence) --------
PATCHES = {
    ("new", "run_pretraining.py"): [
        ("    assert (torch.cuda.is_available())\n", "    pass  # CPU\n", 1),
        ('device = torch.device("cuda", 0)', 'device = torch.device("cpu")', 1),
        ("torch.cuda.synchronize()", "pass  # CPU", "*"),
        (".pin_memory()", "", "*"),  # host stats pinned for async copies from the GPU
    ],
    ("old", "run_pretraining.py"): [
        ("    assert (torch.cuda.is_available())\n", "    pass  # CPU\n", 1),
        ('        device = torch.device("cuda")\n        args.n_gpu = torch.cuda.device_count()',
         '        device = torch.device("cpu")\n        args.n_gpu = 1', 1),
        ("average_loss = torch.tensor(average_loss, dtype=torch.float32).cuda()",
         "average_loss = torch.tensor(average_loss, dtype=torch.float32)", 1),
    ],
    ("new", "run_squad.py"): _SQUAD,
    ("old", "run_squad.py"): _SQUAD,
}
# modeling.py at 729963dd calls F.gelu(x, approximate=True): the NGC container's torch took a bool there,
# torch 2.x takes the string "tanh" for the same function (the tanh form); the text is set to that.
MODELING = {"old": [], "new": [("gelu(x, approximate=True)", 'gelu(x, approximate="tanh")', 1)]}
ADAMW = {
    "new": [("optimizer = FusedLAMBAMP(optimizer_grouped_parameters,\n                             lr=args.learning_rate)",
             "optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate, foreach=False)", 1),
            ("    optimizer.setup_fp32_params()\n", "", 1),
            ("device_func=(lambda: optimizer.param_groups[0]['step'])",
             "device_func=(lambda: optimizer.state[optimizer.param_groups[0]['params'][0]]['step'])", 1)],
    "old": [("optimizer = FusedLAMB(optimizer_grouped_parameters, \n                          lr=args.learning_rate)",
             "optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)", 1)],
}

# NVIDIA's own modeling.py computes the encoder's output for fixed inputs: what the maker's numerics give
# (initializer_range 0.2 above makes the two GELUs differ well beyond 1e-5 on these tiny weights)
FORWARD = '''
import json, os, sys, numpy as np, torch
import torch._dynamo
ckpt, config_file, out, bert = sys.argv[1:5]
sys.path.insert(0, bert)
import types
path = os.path.join(bert, "modeling.py")
msrc = open(path).read()
for old, new, count in json.loads(os.environ.get("MODELING_PATCHES", "[]")):
    assert msrc.count(old) == count, (path, old)
    msrc = msrc.replace(old, new)
modeling = types.ModuleType("modeling")
modeling.__file__ = path
sys.modules["modeling"] = modeling
exec(compile(msrc, path, "exec"), modeling.__dict__)
config = modeling.BertConfig.from_json_file(config_file)
if config.vocab_size % 8 != 0:  # as run_pretraining.py / run_squad.py
    config.vocab_size += 8 - (config.vocab_size % 8)
model = modeling.BertModel(config)
sd = torch.load(ckpt, map_location="cpu", weights_only=False)["model"]
missing, unexpected = model.load_state_dict({k[5:]: v for k, v in sd.items() if k.startswith("bert.")}, strict=False)
assert not [m for m in missing if "position_ids" not in m], missing
model.eval()
g = np.random.default_rng(1)
ids = g.integers(5, 110, (2, 12)); ids[:, 0] = 2; ids[:, -1] = 3
mask = np.ones_like(ids); mask[1, 9:] = 0
seg = np.zeros_like(ids); seg[:, 6:] = 1
with torch.no_grad():
    o = model(torch.tensor(ids), torch.tensor(seg), torch.tensor(mask))
seq = o[0][-1] if isinstance(o[0], (list, tuple)) else o[0]
np.savez(out, input_ids=ids.astype(np.int32), token_type_ids=seg.astype(np.int32),
         attention_mask=mask.astype(np.int32), sequence_output=seq.numpy(), pooled_output=o[1].numpy())
'''

LAUNCHER = '''
import os, sys, torch
import torch._dynamo  # before the BERT folder joins sys.path: its triton/ (Triton server files) shadows the package
script, patches = sys.argv[1], __import__("json").loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(script))
modeling_patches = __import__("json").loads(os.environ.get("MODELING_PATCHES", "[]"))
if modeling_patches:  # modeling.py with the same kind of exact-once edits, imported as 'modeling'
    import types
    path = os.path.join(os.path.dirname(script), "modeling.py")
    msrc = open(path).read()
    for old, new, count in modeling_patches:
        assert msrc.count(old) == count, (path, old)
        msrc = msrc.replace(old, new)
    mod = types.ModuleType("modeling")
    mod.__file__ = path
    sys.modules["modeling"] = mod
    exec(compile(msrc, path, "exec"), mod.__dict__)
# FusedLAMBAMP (lamb_amp_opt) puts its lr/step tensors on torch.cuda.current_device(): the CPU here.
torch.cuda.current_device = lambda: "cpu"
src = open(script).read()
for old, new, count in patches:
    n = src.count(old)
    assert (n >= 1) if count == "*" else (n == count), (script, old, n)
    src = src.replace(old, new)
sys.argv = [script] + sys.argv[3:]
code = compile(src, script, "exec")
main = sys.modules["__main__"]  # the script's functions live in __main__ (its worker pool pickles them)
main.__file__ = script
exec(code, main.__dict__)
'''


def write_data(d):
    """Tiny pretraining shards in NVIDIA's create_pretraining_data.py HDF5 layout, the vocab, SQuAD."""
    import h5py
    os.makedirs(os.path.join(d, "hdf5"), exist_ok=True)
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    rng = np.random.default_rng(0)
    for shard in range(2):
        n = 24
        ids = np.zeros((n, SEQ), np.int32)
        mask = np.zeros((n, SEQ), np.int32)
        seg = np.zeros((n, SEQ), np.int32)
        pos = np.zeros((n, PRED), np.int32)
        lm = np.zeros((n, PRED), np.int32)
        for i in range(n):
            a, b = rng.integers(4, 12), rng.integers(4, 12)
            toks = [2] + list(rng.integers(5, 110, a)) + [3] + list(rng.integers(5, 110, b)) + [3]
            ids[i, :len(toks)] = toks
            mask[i, :len(toks)] = 1
            seg[i, a + 2:len(toks)] = 1
            p = np.sort(rng.choice([j for j in range(1, len(toks)) if toks[j] != 3], PRED - 1, replace=False))
            pos[i, :len(p)] = p
            lm[i, :len(p)] = ids[i, p]
            ids[i, p] = 4
        nsp = rng.integers(0, 2, n).astype(np.int8)
        with h5py.File(os.path.join(d, "hdf5", f"training_shard_{shard}.hdf5"), "w") as f:
            for k, v in (("input_ids", ids), ("input_mask", mask), ("segment_ids", seg),
                         ("masked_lm_positions", pos), ("masked_lm_ids", lm), ("next_sentence_labels", nsp)):
                f.create_dataset(k, data=v, compression="gzip")
    ctx = "paris is the capital of france . the tower was built in 1789 by the king ."
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": [
        {"id": "q1", "question": "what is the capital of france ?",
         "answers": [{"text": "paris", "answer_start": 0}]},
        {"id": "q2", "question": "when was the tower built ?",
         "answers": [{"text": "1789", "answer_start": ctx.index("1789")}]}]}]}]}
    with open(os.path.join(d, "squad.json"), "w") as f:
        json.dump(squad, f)
    with open(os.path.join(d, "bert_config.json"), "w") as f:
        json.dump({"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                   "hidden_size": HIDDEN, "initializer_range": 0.2, "intermediate_size": INTER,
                   "max_position_embeddings": 64, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
                   "type_vocab_size": 2, "vocab_size": len(VOCAB)}, f, indent=2)


def run(checkout, work, era, script, args, extra=()):
    bert = os.path.join(checkout, COMMITS[era], "PyTorch/LanguageModeling/BERT")
    stand = os.path.join(work, "standins")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([stand, os.path.join(bert, "lamb_amp_opt")]),
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MODELING_PATCHES=json.dumps(MODELING[era]))
    patches = PATCHES.get((era, script), []) + list(extra)
    cmd = [sys.executable, os.path.join(work, "launch.py"), os.path.join(bert, script), json.dumps(patches)] + args
    print("$", " ".join(cmd[:2] + [cmd[2], "<patches>"] + args), flush=True)
    subprocess.run(cmd, cwd=bert, env=env, check=True)


def forward(checkout, work, era, ckpt, config, out):
    bert = os.path.join(checkout, COMMITS[era], "PyTorch/LanguageModeling/BERT")
    env = dict(os.environ, PYTHONPATH=os.path.join(work, "standins"), OMP_NUM_THREADS="1",
               MODELING_PATCHES=json.dumps(MODELING[era]))
    subprocess.run([sys.executable, os.path.join(work, "forward.py"), ckpt, config, out, bert], cwd=work, env=env,
                   check=True)


def main():
    checkout, work, out = (os.path.abspath(a) for a in sys.argv[1:4])
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    for name, text in STANDINS.items():
        p = os.path.join(work, "standins", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(textwrap.dedent(text).lstrip())
    with open(os.path.join(work, "launch.py"), "w") as f:
        f.write(LAUNCHER.lstrip())
    with open(os.path.join(work, "forward.py"), "w") as f:
        f.write(FORWARD.lstrip())
    data = os.path.join(work, "data")
    write_data(data)
    os.makedirs(out, exist_ok=True)
    for era in ("old", "new"):
        for opt in ("lamb", "adamw"):
            o = os.path.join(work, f"{era}_{opt}")
            args = ["--input_dir", os.path.join(data, "hdf5"), "--output_dir", o,
                    "--config_file", os.path.join(data, "bert_config.json"),
                    "--train_batch_size", "8", "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PRED),
                    "--max_steps", "6", "--warmup_proportion", "0.5", "--num_steps_per_checkpoint", "6",
                    "--learning_rate", "1e-2", "--seed", "42", "--do_train", "--json-summary",
                    os.path.join(work, f"{era}_{opt}.json"), "--disable_progress_bar"]
            if era == "new":
                args += ["--disable_jit_fusions", "--num_workers", "0", "--vocab_file", os.path.join(data, "vocab.txt")]
            run(checkout, work, era, "run_pretraining.py", args, ADAMW[era] if opt == "adamw" else ())
            dst = os.path.join(out, f"pretrain_{era}_{opt}")
            os.makedirs(dst, exist_ok=True)
            shutil.copy(os.path.join(o, "ckpt_6.pt"), dst)
            shutil.copy(os.path.join(data, "bert_config.json"), dst)
            shutil.copy(os.path.join(data, "vocab.txt"), dst)
            forward(checkout, work, era, os.path.join(dst, "ckpt_6.pt"), os.path.join(dst, "bert_config.json"),
                    os.path.join(dst, "nvidia_outputs.npz"))
        sq = os.path.join(work, f"{era}_squad")
        run(checkout, work, era, "run_squad.py",
            ["--init_checkpoint", os.path.join(work, f"{era}_lamb", "ckpt_6.pt"), "--bert_model", "bert-base-uncased",
             "--do_train", "--do_predict", "--train_file", os.path.join(data, "squad.json"),
             "--predict_file", os.path.join(data, "squad.json"), "--do_lower_case", "--no_cuda",
             "--train_batch_size", "2", "--predict_batch_size", "2", "--learning_rate", "1e-3",
             "--num_train_epochs", "2", "--max_seq_length", str(SEQ), "--doc_stride", "16",
             "--max_query_length", "12", "--output_dir", sq, "--vocab_file", os.path.join(data, "vocab.txt"),
             "--config_file", os.path.join(data, "bert_config.json"), "--json-summary",
             os.path.join(work, f"{era}_squad.json"), "--skip_cache"])
        dst = os.path.join(out, f"squad_{era}")
        os.makedirs(dst, exist_ok=True)
        for n in os.listdir(sq):
            if n in ("pytorch_model.bin", "bert_config.json", "config.json", "predictions.json"):
                shutil.copy(os.path.join(sq, n), dst)
        # modeling.CONFIG_NAME: bert_config.json at 482fe9ac, config.json at 729963dd
        cfg = next(os.path.join(dst, n) for n in ("bert_config.json", "config.json") if os.path.isfile(os.path.join(dst, n)))
        forward(checkout, work, era, os.path.join(dst, "pytorch_model.bin"), cfg, os.path.join(dst, "nvidia_outputs.npz"))
    shutil.copy(os.path.join(data, "vocab.txt"), out)
    os.makedirs(os.path.join(out, "hdf5"), exist_ok=True)  # the pretraining data both eras trained on
    for n in sorted(os.listdir(os.path.join(data, "hdf5"))):
        shutil.copy(os.path.join(data, "hdf5", n), os.path.join(out, "hdf5"))


if __name__ == "__main__":
    main()
