"""BERT in OneFlow, computing what Google's modeling.py computes.

One class per checkpoint scope; attribute names are the canonical parameter
names (``bert.encoder.layer.0.attention.self.query.weight`` ...), so a
state dict reads like the model. Linear weights are [out, in] as in
``nn.Linear``; converters transpose TF's [in, out] kernels on the way in.

Op order follows the original where it affects rounding: embeddings are summed
as (word + token_type) + position, scores are ``(q @ k^T) * 1/sqrt(d)`` plus
``(1 - mask) * -10000``. Everything here is global-tensor safe: no constants are
created inside ``forward`` and nothing slices a split tensor, so with
parameters broadcast and a batch split(0) no S->B conversion creeps in.
The task heads (pretraining, MLM, SQuAD, classifiers) are in :mod:`bert_of.heads`; the output
classes and the heads' losses in :mod:`bert_of.outputs`. Loading and saving are
:mod:`bert_of.model_io`; the CPU kernel workarounds :mod:`bert_of.runtime.kernels`.

Shapes: B batch, S sequence, H hidden, N heads, D = H/N, I intermediate, V vocab.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

from bert_of._flow import (DropoutGenerator, LayerNorm, attention, dense_act, dropout, dropout_attention, flow,
                           gelu_erf, gelu_tanh, layer_spec, layer_stack, merge_heads, softmax_dropout, split_heads)
from bert_of.config import BertConfig
from bert_of.inputs import as_input, check_inputs
from bert_of.outputs import BertModelOutput
from bert_of.model_io import PreTrained
from bert_of.tensors import pre_ln_canonical_name

nn = flow.nn

# --------------------------------------------------------------------------- activations

ACT_FN = {
    "gelu_tanh": gelu_tanh,
    "gelu_erf": gelu_erf,
    "relu": flow.relu,
    "tanh": flow.tanh,
    "silu": flow.nn.functional.silu,
    "linear": lambda x: x,
}


# --------------------------------------------------------------------------- scopes


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        # Pre-LN (LiBai's embeddings) has no LayerNorm here: the first layer normalises its input.
        self.LayerNorm = None if config.pre_ln else LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, position_ids=None, inputs_embeds=None):
        """input_ids, token_type_ids: int64 [B, S] -> [B, S, H]. transformers' ``inputs_embeds``
        [B, S, H] stands for the word vectors (``input_ids`` None), ``position_ids`` int64 [B, S] or
        [1, S] for the positions 0..S-1, summed in the same order."""
        words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        x = words + self.token_type_embeddings(token_type_ids)
        if position_ids is None:
            # Positions 0..S-1 are a slice of the (broadcast) table: no index tensor to place.
            x = x + self.position_embeddings.weight.narrow(0, 0, token_type_ids.shape[1]).unsqueeze(0)
        else:
            x = x + self.position_embeddings(position_ids)
        if self.LayerNorm is None:
            return dropout(self.dropout, x)
        return dropout(self.dropout, self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig, layer_index: int = 0):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scale = 1.0 / math.sqrt(float(self.head_dim))
        # LiBai's query-key layer scaling: (q k^T) / (sqrt(D) * c), then * c, with c = i + 1.
        self.coeff = float(layer_index + 1) if config.query_key_layer_scaling else None
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, linear, x):
        """linear(x) as heads: [B, S, H] -> [B, N, S, D]."""
        return split_heads(linear, x, self.num_heads)

    def forward(self, hidden, mask_adder, probs_out: Optional[list] = None, head_mask=None):
        """hidden [B, S, H], mask_adder [B, 1, 1, S] -> context [B, S, H]. ``probs_out`` (a list)
        receives the attention probabilities [B, N, S, S] (before dropout, as transformers');
        ``head_mask`` [1, N, 1, 1] multiplies them (transformers' head_mask: 0 silences a head)."""
        q, k, v = self._heads(self.query, hidden), self._heads(self.key, hidden), self._heads(self.value, hidden)
        if probs_out is None and head_mask is None and not (self.training and self.dropout.p > 0):
            # CPU inference: scores, softmax, product with v and the heads' merge in one kernel
            ctx = attention(q, k, v, mask_adder, self.scale, self.coeff)
            if ctx is not None:
                return ctx  # [B, S, H]
        if self.coeff is None and probs_out is None and head_mask is None:
            # a CPU training step: the scores, mask add, softmax, dropout, product with v and the
            # heads' merge in one Function, forward and backward (batched GEMMs, native kernels)
            ctx = dropout_attention(q, k, v, mask_adder, self.scale, self.dropout)
            if ctx is not None:
                return ctx  # [B, S, H]
        # The scale rides in the GEMM's alpha (the same single rounding as a separate multiply, bit
        # for bit on CPU with either BLAS): one pass over [B, N, S, S] fewer, ~4% of a layer on CPU.
        if self.coeff is not None:
            scores = flow.matmul(q, k, transpose_b=True, alpha=self.scale / self.coeff) * self.coeff + mask_adder
        else:
            scores = flow.matmul(q, k, transpose_b=True, alpha=self.scale)  # [B, N, S, S]
            if probs_out is None and head_mask is None:
                # a CPU training step: mask add, softmax and dropout in one kernel, forward and backward
                dropped = softmax_dropout(scores, mask_adder, self.dropout)
                if dropped is not None:
                    return merge_heads(flow.matmul(dropped, v))
            scores = scores + mask_adder
        probs = flow.softmax(scores, dim=-1)
        if head_mask is not None:  # before dropout: the same product as transformers' after it
            probs = probs * head_mask
        if probs_out is not None:
            probs_out.append(probs)
        ctx = flow.matmul(self.dropout(probs), v)  # [B, N, S, D]
        return merge_heads(ctx)  # [B, S, H]


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, residual):
        return self.LayerNorm(dropout(self.dropout, self.dense(hidden)), residual)  # LayerNorm(dense + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig, layer_index: int = 0):
        super().__init__()
        self.self = BertSelfAttention(config, layer_index)
        self.output = BertSelfOutput(config)

    def forward(self, hidden, mask_adder, probs_out: Optional[list] = None, head_mask=None):
        return self.output(self.self(hidden, mask_adder, probs_out, head_mask), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT_FN[config.hidden_act]

    def forward(self, hidden):
        """[B, S, H] -> [B, S, I]: act(dense(hidden)) (a CPU training step: the bias add in the GELU's kernel)."""
        return dense_act(self.dense, hidden, self.act)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, intermediate, residual):
        """intermediate [B, S, I], residual [B, S, H] -> [B, S, H]."""
        return self.LayerNorm(dropout(self.dropout, self.dense(intermediate)), residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig, layer_index: int = 0):
        super().__init__()
        self.attention = BertAttention(config, layer_index)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden, mask_adder, probs_out: Optional[list] = None, head_mask=None):
        """hidden [B, S, H], mask_adder [B, 1, 1, S] -> [B, S, H]."""
        attn = self.attention(hidden, mask_adder, probs_out, head_mask)
        return self.output(self.intermediate(attn), attn)

    def native_spec(self):
        """This layer for :func:`~bert_of.runtime.kernels.layer_stack` (one native call per layer
        for CPU inference), or None where that cannot run what :meth:`forward` runs: active dropout
        or an activation other than the native GELUs."""
        sa, so, out = self.attention.self, self.attention.output, self.output
        if self.training and any(d.p > 0 for d in (sa.dropout, so.dropout, out.dropout)):
            return None
        mods = (sa.query, sa.key, sa.value, so.dense, so.LayerNorm, self.intermediate.dense, out.dense, out.LayerNorm)
        return layer_spec([t for m in mods for t in (m.weight, m.bias)], sa.num_heads, sa.scale, sa.coeff,
                          self.intermediate.act, (so.LayerNorm.eps, out.LayerNorm.eps))


def run_layers(layers, hidden, mask_adder):
    """Each layer in turn: what an encoder does unless given another ``layer_runner``. Post-LN layers
    for CPU inference run one native call each (:func:`~bert_of.runtime.kernels.layer_stack`, the
    same bits; off with ``BERT_OF_CPU_LAYER=0``)."""
    if all(type(layer) is BertLayer for layer in layers):
        out = layer_stack(lambda: [layer.native_spec() for layer in layers], hidden, mask_adder)
        if out is not None:
            return out
    for layer in layers:
        hidden = layer(hidden, mask_adder)
    return hidden


class BertEncoder(nn.Module):
    """The stack of layers (post-LN: each layer ends with its LayerNorm).

    ``layer_runner(layers, hidden, mask_adder) -> hidden`` runs the layers when neither the
    states nor the attention probabilities are asked for (default :func:`run_layers`); inference
    may give another (bert_of.training.inference: one compiled layer graph for every layer)
    through :meth:`layers_run_by`."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList([self.layer_class(config, i) for i in range(config.num_hidden_layers)])
        self.layer_runner = run_layers

    layer_class = BertLayer

    @contextlib.contextmanager
    def layers_run_by(self, runner):
        """``with encoder.layers_run_by(runner):`` the encoder's forward runs its layers through
        ``runner(layers, hidden, mask_adder) -> hidden`` for the block."""
        self.layer_runner = runner
        try:
            yield
        finally:
            self.layer_runner = run_layers

    def _layers(self, hidden, mask_adder, states: Optional[list], probs_out: Optional[list], head_mask=None):
        """hidden [B, S, H] through every layer; ``states`` receives the input and each layer's output;
        ``head_mask``: one [1, N, 1, 1] per layer (or None)."""
        if states is None and probs_out is None and head_mask is None:
            return self.layer_runner(self.layer, hidden, mask_adder)
        if states is not None:
            states.append(hidden)
        for i, layer in enumerate(self.layer):
            hidden = layer(hidden, mask_adder, probs_out, None if head_mask is None else head_mask[i])
            if states is not None:
                states.append(hidden)
        return hidden

    def forward(self, hidden, mask_adder, states: Optional[list] = None, probs_out: Optional[list] = None,
                head_mask=None):
        """hidden [B, S, H] -> [B, S, H].

        ``states`` (a list) receives the input and each layer's output, L + 1 tensors [B, S, H],
        the last being the result; ``probs_out`` each layer's attention probabilities [B, N, S, S];
        ``head_mask`` one [1, N, 1, 1] per layer."""
        return self._layers(hidden, mask_adder, states, probs_out, head_mask)


# --------------------------------------------------------------------------- pre-LN
#
# LiBai's default BERT (apply_residual_post_layernorm=False), nanoGPT's Block: every layer
# normalises its sub-layers' inputs, x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), and a final
# LayerNorm closes the stack. Its LayerNorms sit where LiBai has them; bert_of's checkpoints spell
# them with original BERT's names, each shifted one place as LiBai's own HF loader shifts them
# (:func:`bert_of.tensors.pre_ln_canonical_name`), so every format's table stays the one original BERT's.


class BertProjection(nn.Module):
    """A pre-LN sub-layer's output: dense, dropout (no residual, no LayerNorm)."""

    def __init__(self, in_size: int, out_size: int, dropout: float):
        super().__init__()
        self.dense = nn.Linear(in_size, out_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        """[..., in] -> [..., out]."""
        return self.dropout(self.dense(x))


class BertPreLNAttention(nn.Module):
    def __init__(self, config: BertConfig, layer_index: int = 0):
        super().__init__()
        self.self = BertSelfAttention(config, layer_index)
        self.output = BertProjection(config.hidden_size, config.hidden_size, config.hidden_dropout_prob)

    def forward(self, hidden, mask_adder, probs_out: Optional[list] = None, head_mask=None):
        """normalised hidden [B, S, H] -> the attention's contribution to the residual [B, S, H]."""
        return self.output(self.self(hidden, mask_adder, probs_out, head_mask))


class BertPreLNLayer(nn.Module):
    """x + attn(input_layer_norm(x)), then x + mlp(post_attention_layer_norm(x))."""

    def __init__(self, config: BertConfig, layer_index: int = 0):
        super().__init__()
        self.input_layer_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = BertPreLNAttention(config, layer_index)
        self.post_attention_layer_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = BertIntermediate(config)
        self.output = BertProjection(config.intermediate_size, config.hidden_size, config.hidden_dropout_prob)

    def forward(self, hidden, mask_adder, probs_out: Optional[list] = None, head_mask=None):
        """hidden [B, S, H], mask_adder [B, 1, 1, S] -> [B, S, H] (not normalised)."""
        hidden = hidden + self.attention(self.input_layer_norm(hidden), mask_adder, probs_out, head_mask)
        return hidden + self.output(self.intermediate(self.post_attention_layer_norm(hidden)))


class BertPreLNEncoder(BertEncoder):
    """Pre-LN layers, then the final LayerNorm (LiBai's final_layernorm)."""

    layer_class = BertPreLNLayer

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.final_layer_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden, mask_adder, states: Optional[list] = None, probs_out: Optional[list] = None,
                head_mask=None):
        """hidden [B, S, H] -> [B, S, H]; ``states`` as :class:`BertEncoder`'s, the last one the
        result normalised (as transformers' Megatron-BERT)."""
        hidden = self.final_layer_norm(self._layers(hidden, mask_adder, states, probs_out, head_mask))
        if states is not None:
            states[-1] = hidden
        return hidden


def _state_name(self, key: str) -> str:
    """``key`` canonically spelled (see :meth:`bert_of.model_io.PreTrained.state_name`)."""
    if not self.config.pre_ln:
        return key
    full = pre_ln_canonical_name(self._ckpt_prefix + key, self.config.num_hidden_layers)
    return full[len(self._ckpt_prefix):]


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output):
        """[B, S, H] -> tanh(dense(first token)) [B, H]."""
        first = sequence_output.narrow(1, 0, 1).squeeze(1)
        return flow.tanh(self.dense(first))


def _mask_adder(attention_mask, dtype):
    """1/0 mask [B, S] (or [B, S, S], [B, 1, S, S]: per query) -> additive [B, 1, 1 or S, S]:
    0 keep, -10000 drop."""
    m = attention_mask.to(dtype)
    m = m.unsqueeze(1).unsqueeze(2) if m.ndim == 2 else m.unsqueeze(1) if m.ndim == 3 else m
    return (1.0 - m) * -10000.0


def _per_layer(head_mask, layers: int, dtype):
    """transformers' head_mask, [N] (every layer) or [L, N], as one [1, N, 1, 1] per layer."""
    if head_mask is None:
        return None
    m = head_mask.to(dtype)
    if not m.is_lazy and not m.is_global and bool((m == 1).all().numpy()):
        return None  # p * 1 == p exactly: the unmasked path computes the same bits (its kernels included)
    if m.ndim == 1:
        return [m.reshape(1, -1, 1, 1)] * layers
    return [m.narrow(0, i, 1).reshape(1, -1, 1, 1) for i in range(layers)]


class BertModel(PreTrained):
    """Embeddings, encoder, pooler. Loads from any checkpoint's ``bert.*`` tensors.

    ``dropout_generator``: the one ``flow.Generator`` every dropout of the model draws from (each
    ``nn.Dropout`` otherwise makes its own, unseeded). Seed it for repeatable masks (the trainer
    does, every step); its state is the dropout RNG a training checkpoint keeps.
    """

    _ckpt_prefix = "bert."
    state_name = _state_name

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = (BertPreLNEncoder if config.pre_ln else BertEncoder)(config)
        self.pooler = BertPooler(config)
        self.dropout_generator = DropoutGenerator()  # flow.Generator(), counting the dropout kernels' calls
        for m in self.modules():
            if isinstance(m, nn.Dropout):
                m.generator = self.dropout_generator

    @property
    def base_model(self) -> "BertModel":
        """The model itself (a head's ``base_model`` is its BertModel)."""
        return self

    def forward(self, input_ids=None, token_type_ids=None, attention_mask=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, *, position_ids=None, head_mask=None,
                inputs_embeds=None) -> BertModelOutput:
        """input_ids, token_type_ids, attention_mask: int64 [B, S] (tensors, NumPy arrays or lists).

        transformers' keywords, with its meaning: ``position_ids`` int64 [B, S] or [1, S] (default
        0..S-1); ``head_mask`` [N] or [L, N] of 1 (keep) / 0 (silence), multiplying each layer's
        attention probabilities; ``inputs_embeds`` float [B, S, H] in place of ``input_ids`` (the
        word vectors; exactly one of the two).

        Returns sequence_output [B, S, H] and pooled_output [B, H]; as transformers' BertModel,
        with ``output_hidden_states`` also hidden_states (the embeddings' output and each layer's,
        L + 1 tensors [B, S, H]), with ``output_attentions`` attentions (each layer's attention
        probabilities [B, N, S, S]); ``return_dict=False``: the tuple (sequence_output,
        pooled_output[, hidden_states][, attentions]). Ids the embeddings cannot look up are an
        :class:`InputError` (see :func:`check_inputs`).
        """
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        like = self.embeddings.word_embeddings.weight
        input_ids = as_input(input_ids, "input_ids", like)
        token_type_ids = as_input(token_type_ids, "token_type_ids", like)
        attention_mask = as_input(attention_mask, "attention_mask", like, ids=False)  # 1/0, or 1.0/0.0
        position_ids = as_input(position_ids, "position_ids", like)
        head_mask = as_input(head_mask, "head_mask", like, ids=False)
        inputs_embeds = as_input(inputs_embeds, "inputs_embeds", like, ids=False)
        check_inputs(self.config, input_ids, token_type_ids, attention_mask, position_ids=position_ids,
                     head_mask=head_mask, inputs_embeds=inputs_embeds)
        ids_like = input_ids if inputs_embeds is None else \
            flow.zeros_like(inputs_embeds.narrow(2, 0, 1).squeeze(2)).to(flow.int64)  # [B, S], its placement
        if token_type_ids is None:
            token_type_ids = flow.zeros_like(ids_like)
        if attention_mask is None:
            attention_mask = flow.ones_like(ids_like)
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        states = [] if output_hidden_states else None
        probs = [] if output_attentions else None
        seq = self.encoder(hidden, _mask_adder(attention_mask, hidden.dtype), states=states, probs_out=probs,
                           head_mask=_per_layer(head_mask, self.config.num_hidden_layers, hidden.dtype))
        out = BertModelOutput(sequence_output=seq, pooled_output=self.pooler(seq),
                              hidden_states=None if states is None else tuple(states),
                              attentions=None if probs is None else tuple(probs))
        return out if return_dict is None or return_dict else out.to_tuple()


class BertGraph(nn.Graph):
    """Inference graph over a model: shares its parameters, same outputs.

    ``BertGraph(model)(input_ids, token_type_ids, attention_mask)`` returns a
    :class:`BertModelOutput` like the eager call.

    Memory on CPU: OneFlow 0.9 shares no memory between a CPU graph's tensors (every activation
    of the compiled batch stays allocated, ~440 MB per row for MiniLM at 384 tokens) and frees
    nothing of a graph when it is deleted; each new input shape compiles a graph of its own. Keep
    batches small and shapes few; ``bert-of predict`` runs one compiled layer for every layer.
    ``outputs`` (field names): the graph returns only those (the others stay None).
    """

    def __init__(self, model, outputs: Optional[tuple] = None):
        super().__init__()
        self.model, self.outputs = model, outputs
        self._names, self._cls = None, BertModelOutput

    def build(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids, token_type_ids, attention_mask)
        values = out.to_dict() if self.outputs is None else {k: getattr(out, k) for k in self.outputs}
        self._cls, self._names = type(out), tuple(values)
        return tuple(values.values())

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        if token_type_ids is None:
            token_type_ids = flow.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = flow.ones_like(input_ids)
        check_inputs(self.model.config, input_ids, token_type_ids, attention_mask)  # traced, the forward cannot
        values = super().__call__(input_ids, token_type_ids, attention_mask)
        return self._cls(**dict(zip(self._names, values)))
