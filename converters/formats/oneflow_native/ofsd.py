"""bert_of's own modules saved the OneFlow way: ``flow.save(model.state_dict(), "ckpt")``.

The keys are bert_of's canonical names (``bert.encoder.layer.0.attention.self.query.weight``;
a bare ``BertModel`` without the ``bert.`` prefix), so the name table is the identity, but for a
pre-LN model's LayerNorms, which its modules name where they sit (``bert_of.tensors.pre_ln_module_name``). The folder
holds no config: it is ``--config``, else ``config.json`` (bert_of's, ``model.config.to_json_string()``;
an HF or Google one is read with its numerics) in or beside the folder. Written folders get
bert_of's ``config.json`` and ``vocab.txt`` inside, which ``flow.load`` ignores, so
``model.load_state_dict(flow.load(dir), strict=True)`` and ``BertModel.from_pretrained(dir)`` both
read them. Every numerics bert_of computes (pre-LN included) travels in that config.
"""

from __future__ import annotations

from bert_of.tensors import expected_shapes, pre_ln_canonical_name, pre_ln_module_name
from bert_of.converters.formats.oneflow_native import steps as native
from bert_of.converters.formats.oneflow_native.steps import PARAM, Layout
from bert_of.converters.reader import Hit
from bert_of.converters.descriptor import Format
from bert_of.converters.verify import reference_np

NAME = "ofsd"


def _classify(name, config):
    if config.pre_ln:  # a pre-LN module's LayerNorms, named where they sit (the canonical spelling read too)
        name = pre_ln_canonical_name(name, config.num_hidden_layers)
    return Hit(name) if name in expected_shapes(config) else None


def _items(names, config, bare):
    order = {n: i for i, n in enumerate(expected_shapes(config))}
    out = []
    for n in sorted(names, key=lambda n: order.get(n, len(order))):
        key = pre_ln_module_name(n, config.num_hidden_layers) if config.pre_ln else n
        key = key[len("bert."):] if bare else key
        out.append((key, PARAM, ("canonical", n, None)))
    return out


LAYOUT = Layout(NAME, ("embeddings", "encoder", "pooler"), _classify, _items, lambda c: c.to_dict(),
                "bert_of model state dict")


detect, read, write_files = native.format_functions(LAYOUT)


FORMAT = Format(NAME, "bert_of module state dict saved by flow.save (pickled_data + tensor_N/ + config.json)",
                detect, read, write_files, reference_np.OfStateDict, owns=native.OWNS,
                pre_ln=True, records_numerics=True,  # its config is bert_of's: every numerics bert_of computes
                token_classifier=True, dtypes=native.DTYPES)
