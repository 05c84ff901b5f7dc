"""The model's one door to OneFlow: ``flow`` itself, and the CPU kernels that stand in for some of
OneFlow 0.9's own for inference (LayerNorm, the GELUs, the heads' split and merge, the attention core, a
whole post-LN layer: every core, each checked against OneFlow's ops), and for a training step on CPU
the LayerNorm, the intermediate dense layer's GELU, the dropouts, the attention's core (its softmax
alone where the core does not apply) and the heads' split and merge, whose forward and backward run
bert_of's C and the BLAS's batched GEMM (:mod:`bert_of.runtime.train_kernels`, checked likewise).

Everything that exists only because of OneFlow 0.9's last release (how it is imported, its
graph-launch race, the BLAS under its CPU GEMMs, its signal and environment habits, the C shims)
lives in :mod:`bert_of.runtime`; the model layer sees it only through this module, so it reads as
maths.
"""

from bert_of.runtime.flow_import import flow
from bert_of.runtime.kernels import attention, gelu_erf, gelu_tanh, layer_spec, layer_stack
from bert_of.runtime.train_kernels import (DropoutGenerator, LayerNorm, dense_act, dropout, dropout_attention,
                                          merge_heads, softmax_dropout, split_heads)

__all__ = ["flow", "DropoutGenerator", "LayerNorm", "attention", "dense_act", "dropout", "dropout_attention", "gelu_erf",
           "gelu_tanh", "layer_spec", "layer_stack", "merge_heads", "softmax_dropout", "split_heads"]
