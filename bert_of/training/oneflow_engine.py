"""OneFlow's engine for :func:`bert_of.training.inference.infer`: many rows within a memory budget,
batches cut to fit, length buckets, and on CPU one compiled encoder layer run for every layer
(OneFlow 0.9's CPU graphs share no memory).

Memory budgets (``graph_rows``, ``graph_accum_steps``; ``eager_rows`` is padding.py's) and
:func:`infer_oneflow`; each batch padded to its longest row (:mod:`bert_of.training.padding`).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from bert_of._flow import flow
from bert_of.modeling import BertGraph
from bert_of.progress import Progress, log
from bert_of.training.padding import Gathered, eager_rows, length_batches, padded_width, row_lengths
from bert_of.training.runtime import Runtime, to_numpy


class _LayerGraph(flow.nn.Graph):
    """One encoder layer (a copy of layer 0) as a graph: hidden [b, S, H], mask adder [b, 1, 1, S]."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def build(self, hidden, mask_adder):
        return self.layer(hidden, mask_adder)


class LayerwiseRunner:
    """A CPU graph for the encoder that holds one layer's activations instead of every layer's:
    ONE compiled layer graph runs each layer in turn, that layer's weights copied into the graph's
    own first (~28 MB per BERT-base layer, once per batch), ``rows`` rows per call (the last call
    padded). Embeddings, pooler and head stay eager (a few % of the work). The encoder runs its
    layers through it (``encoder.layers_run_by``) while ``infer`` runs; the layer is the model's
    own module code."""

    def __init__(self, encoder, config, rows: int):
        self.rows = rows
        self.template = type(encoder.layer[0])(config).eval()  # weights: copied in per layer
        self.graph, self.build_seconds = _LayerGraph(self.template), 0.0
        self.own = list(self.template.parameters())

    def __call__(self, layers, hidden, mask_adder):
        """hidden [B, S, H] through ``layers`` in turn -> [B, S, H]."""
        b = hidden.shape[0]
        for layer in layers:
            for mine, theirs in zip(self.own, layer.parameters()):
                mine.copy_(theirs)
            outs = []
            for lo in range(0, b, self.rows):
                h, m = hidden[lo:lo + self.rows], mask_adder[lo:lo + self.rows]
                real = h.shape[0]
                if real < self.rows:  # one shape: pad with copies of the chunk's first row
                    h = flow.cat([h, h[:1].repeat(self.rows - real, 1, 1)])
                    m = flow.cat([m, m[:1].repeat(self.rows - real, 1, 1, 1)])
                t0 = time.perf_counter() if not self.build_seconds else None
                out = self.graph(h, m)
                if t0 is not None:  # the first call compiles
                    out.numpy()
                    self.build_seconds = time.perf_counter() - t0
                outs.append(out[:real])
            hidden = flow.cat(outs) if len(outs) > 1 else outs[0]
        return hidden


# OneFlow 0.9 never shares memory between a CPU graph's intermediate tensors (its planner skips CPU
# tasks: oneflow/core/job/intra_job_mem_sharing_util.cpp, InitMemoryChains), so a compiled CPU graph
# holds every activation of its batch for its whole life: ~440 MB per row for MiniLM at 384 tokens,
# where eager frees each tensor after use. A CPU graph therefore runs few rows per call (smaller
# graphs are no slower per row: docs/benchmarks.md, fine-tuning and prediction); CUDA graphs reuse memory and keep the batch.
GRAPH_CPU_BUDGET = 512 * 2 ** 20  # bytes of activations one CPU predict graph may hold


def graph_rows(config, length: int, device: str, budget: int = GRAPH_CPU_BUDGET, layers: int | None = None) -> int | None:
    """Rows per call of a CPU predict graph over ``length`` tokens (None: no limit, CUDA) of
    ``layers`` encoder layers (default: the model's). The estimate counts a layer's activations
    per row as its graph keeps them: ~10 [heads, L, L] attention tensors and a few [L, I] / [L, H]
    ones (measured: MiniLM, BERT-base)."""
    if device != "cpu":
        return None
    c = config
    per_row = 4 * (layers or c.num_hidden_layers) * (10 * c.num_attention_heads * length * length
                                         + 4 * length * c.intermediate_size + 12 * length * c.hidden_size)
    return max(1, int(budget // per_row))


# A CPU train graph keeps, besides the forward's activations, their gradients and the backward's
# temporaries, none shared either: ~3.5x a predict graph per row (MiniLM at 128 tokens: 276 MB/row).
TRAIN_GRAPH_FACTOR = 3.5
GRAPH_CPU_TRAIN_BUDGET = 768 * 2 ** 20  # bytes of activations one CPU train graph may hold


def graph_accum_steps(config, length: int, rows: int, device: str, k: int = 1,
                      budget: int = GRAPH_CPU_TRAIN_BUDGET) -> int:
    """Micro-batches per step of a CPU train graph over ``rows`` (this rank's batch) of ``length``
    tokens: the fewest, a multiple of ``k`` (the asked accumulation) dividing ``rows``, whose
    micro-batch fits ``budget``. Fine-tuning losses are means over rows, so equal micro-batches
    give the same step to float rounding (the graph scales each micro-batch's loss by 1/k)."""
    if device != "cpu":
        return k
    cap = graph_rows(config, length, device, int(budget / TRAIN_GRAPH_FACTOR))
    for m in range(k, rows + 1, k):
        if rows % m == 0 and rows // m <= cap:
            return m
    return k


def infer_oneflow(model, inputs: list, outputs: tuple, batch_size: int, mode: str, rt: Runtime, *,
                  pad_to_batch: bool = True, positions: tuple = (), fill: float = 0.0,
                  graph_budget: int | None = None, stats: dict | None = None) -> list:
    """:func:`bert_of.training.inference.infer` for a OneFlow ``model`` (the inputs already checked
    there): the arguments and what comes back are described there."""
    graph_budget = GRAPH_CPU_BUDGET if graph_budget is None else graph_budget
    model.eval()
    n = len(inputs[0])
    width = int(inputs[0].shape[1])
    lengths = row_lengths(inputs[2]) if pad_to_batch else np.full(n, width)
    batch_size = max(1, min(batch_size, n))
    encoder = model.base_model.encoder
    layerwise = None
    # graph: one shape for every call (a graph per width would each keep its memory)
    gwidth = padded_width(lengths, width) if mode == "graph" else None
    # (post-LN without query-key layer scaling: every layer then computes the same function of its weights)
    if mode == "graph" and rt.device == "cpu" and rt.world == 1 and \
            not model.config.pre_ln and not model.config.query_key_layer_scaling:
        cap = min(graph_rows(model.config, gwidth, rt.device, graph_budget, layers=1), batch_size)
        rows = max(r for r in range(1, cap + 1) if batch_size % r == 0)  # a batch splits with no padding
        if 2 * rows < cap:  # unless that makes calls too small: fewest calls, least padding
            rows = -(-batch_size // -(-batch_size // cap))
        layerwise = LayerwiseRunner(encoder, model.config, rows)
    elif mode == "graph":
        cap = graph_rows(model.config, gwidth, rt.device, graph_budget)
        if cap is not None:
            batch_size = min(batch_size, cap * rt.world)
    batch_size = -(-batch_size // rt.world) * rt.world
    whole_graph = mode == "graph" and layerwise is None
    results = Gathered(outputs, n, width, positions, fill)
    graph, build_s = None, 0.0
    calls = {"positions": 0, "rows": 0}

    def calls_of(idx, tokens):
        """(row indices, tokens) of each call of a batch: eager CPU calls hold what fits at its width."""
        if mode == "graph":
            yield idx, gwidth
            return
        cap = eager_rows(model.config, tokens, rt.device)
        step = len(idx) if cap is None else max(rt.world, min(len(idx), cap * rt.world) // rt.world * rt.world)
        for lo in range(0, len(idx), step):
            yield idx[lo:lo + step], tokens

    runner = encoder.layers_run_by(layerwise) if layerwise is not None else contextlib.nullcontext()
    with runner, flow.no_grad(), Progress("predict", total=n, unit="window") as bar:
        for batch_idx, batch_tokens in length_batches(lengths, batch_size, width):
            for idx, tokens in calls_of(batch_idx, batch_tokens):
                real = len(idx)
                rows = [a[idx, :tokens] for a in inputs]
                size = batch_size if whole_graph else -(-real // rt.world) * rt.world
                if real < size:  # static shapes / whole ranks: pad with copies of row 0
                    rows = [np.concatenate([r, np.repeat(r[:1], size - real, axis=0)]) for r in rows]
                tensors = [rt.tensor(rt.rank_rows(r)) for r in rows]
                calls["positions"] += rows[0].size
                calls["rows"] = max(calls["rows"], len(rows[0]))
                t0 = None
                if whole_graph and graph is None:
                    graph, t0 = BertGraph(model, outputs), time.perf_counter()
                out = (graph if whole_graph else model)(*tensors)
                vals = [to_numpy(getattr(out, k)) for k in outputs]
                if t0 is not None:  # the first graph call compiles
                    build_s = time.perf_counter() - t0
                results.put(idx, vals)
                bar.update(real)
    built = 1 if (graph is not None or (layerwise is not None and layerwise.build_seconds)) else 0
    if layerwise is not None:
        build_s, per_call, what = layerwise.build_seconds, layerwise.rows, "one encoder layer"
    else:
        per_call, what = (batch_size if mode == "graph" else calls["rows"]), "the model"
    if stats is not None:
        stats.update(graphs=built, build_seconds=round(build_s, 3), batch_size=per_call,
                     positions=calls["positions"], layerwise=layerwise is not None,
                     width=gwidth if mode == "graph" else width)
    if built:
        log.info(f"predict: graph of {what}, {per_call} x {gwidth} tokens, compiled (and run once) in {build_s:.1f} s")
    return results.arrays
