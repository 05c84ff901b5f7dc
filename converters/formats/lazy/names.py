"""The names of a legacy lazy OneFlow snapshot: file names, the lazy and convert_tf_ckpt_to_of.py
tables, optimizer slot suffixes, system variables, and which kind each variable folder is.

The layout and both spellings are described in converters/formats/lazy/.
"""

from __future__ import annotations

import re

from bert_of.converters.mapping import Table, spell

NAME = "lazy"
CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
SNAPSHOT_DONE = "snapshot_done"
DATA_FILE = "out"
META_FILE = "meta"


def _scope(canonical: str) -> str:
    return canonical.replace(".", "-").replace("layer-{i}", "layer_{i}")


# How the lazy BERT spells each kind of scope (dense weights [in, out]; positions [1, P, H]).
PARAMS = {
    "embedding": [("", ".weight")],
    "position": [("", ".weight", "squeeze0")],
    "dense": [("-weight", ".weight", "T"), ("-bias", ".bias")],
    "ln": [("-LayerNorm-gamma", ".LayerNorm.weight"), ("-LayerNorm-beta", ".LayerNorm.bias")],
    "bias": [("-output_bias", ".bias")],
    "out": [("-output_weights", ".weight"), ("-output_bias", ".bias")],  # already [out, in]
}
POSITION = "bert-embeddings-position_embeddings"
# What OneFlow-Benchmark's lazy BERT names its variables (the writer's table).
TABLE = Table(spell(_scope, PARAMS, {
    "bert.embeddings.position_embeddings": (POSITION, "position"),
    "cls.seq_relationship": ("cls-seq_relationship", "out"),
    "qa_outputs": ("cls-squad-output", "dense"),  # [H, 2]
    "classifier": ("classification", "out"),
}))
# convert_tf_ckpt_to_of.py's names for Google's variables (read only): TF's head names, [P, H] positions.
TF_TABLE = Table(spell(_scope, PARAMS, {
    "cls.seq_relationship": ("cls-seq_relationship", "out"),
    "qa_outputs": ("cls-squad", "out"),
    "classifier": ("", "out"),
}) + [("output_weight-output_weights", "classifier.weight"),  # the script's off-by-one split
      ("output_bia-output_bias", "classifier.bias")])

# slot suffix -> (canonical prefix, which snapshot variant names it)
SLOTS = {"m": ("m", "lazy"), "v": ("v", "lazy"), "beta1_t": ("beta1_t", "lazy"), "beta2_t": ("beta2_t", "lazy"),
         "momentum": ("momentum", "lazy"), "adam_m": ("m", "tf"), "adam_v": ("v", "tf")}
SCALAR_SLOTS = ("beta1_t", "beta2_t")  # float [1] per variable, not the variable's shape
_TRAIN_STEP = re.compile(r"^System-Train-TrainStep-(?P<job>.+)$")
_LOSS_SCALE = re.compile(r"^System-Train-DynamicLossScale-(?P<job>.+)-LossScale$")
_GOOD_STEPS = re.compile(r"^System-Train-DynamicLossScale-(?P<job>.+)-GoodStepCounter$")
_TF_STEPS = ("global_ste-global_step", "global_step")


def model_hit(name):
    """name -> (canonical, transform, variant evidence "lazy"|"tf"|None) or None."""
    a, b = TABLE.to_canonical(name), TF_TABLE.to_canonical(name)
    if a and b:
        return a[0], a[1], None
    if a:
        return a[0], a[1], "lazy"
    if b:
        return b[0], b[1], "tf"
    return None


def classify(name):
    """Variable folder name -> (kind, target, transform, evidence, extra).

    kind: model | slot | step | loss_scale | good_step_counter | tf_step | None.
    For slots, extra is (slot canonical prefix, base variable name).
    For system variables, extra is the job name.
    """
    hit = model_hit(name)
    if hit:
        return "model", hit[0], hit[1], hit[2], None
    base, _, suffix = name.rpartition("-")
    if base and suffix in SLOTS:
        prefix, evidence = SLOTS[suffix]
        bases = [base]
        if base.endswith("-kernel"):  # convert_tf_ckpt_to_of.py keeps "kernel" in slot paths
            bases.append(base[: -len("-kernel")] + "-weight")
        for b in bases:
            hit = model_hit(b)
            if hit:
                ev = evidence if hit[2] is None or hit[2] == evidence else "conflict"
                return "slot", f"{prefix}/{hit[0]}", hit[1], ev, (prefix, b)
    for rx, kind in ((_LOSS_SCALE, "loss_scale"), (_GOOD_STEPS, "good_step_counter"), (_TRAIN_STEP, "step")):
        m = rx.match(name)
        if m:
            return kind, kind, None, "lazy", m.group("job")
    if name in _TF_STEPS:
        return "tf_step", "step", None, "tf", None
    return None, None, None, None, None

