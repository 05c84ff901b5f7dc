"""Pretraining core: the loss, eager == graph for every optimizer, accumulation, clipping,
weight-decay excludes, and 2-rank data parallelism (global graph, global eager, DDP)."""

import json
import os

import numpy as np
import pytest

from bert_of._flow import flow
from bert_of.config import BertConfig
from bert_of.heads import BertForPreTraining
from bert_of.outputs import pretraining_loss
from bert_of.training import TrainConfig, Trainer
from tests.conftest import ROOT, run_ranks
from tests.scripts.train_fixture import CONFIG, STEPS, TRAIN, global_batch

pytestmark = pytest.mark.oneflow


def _train(steps=STEPS, **kw):
    model = BertForPreTraining(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, **kw)))
    return [trainer.step(global_batch(s)) for s in range(steps)], model


def test_loss_matches_googles_formula():
    rng = np.random.default_rng(0)
    B, P, V = 3, 4, 11
    logits = rng.standard_normal((B, P, V)).astype(np.float32)
    nsp = rng.standard_normal((B, 2)).astype(np.float32)
    ids = rng.integers(0, V, (B, P))
    w = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], np.float32)
    labels = np.array([0, 1, 1])
    got = pretraining_loss(*(flow.tensor(x) for x in (logits, nsp, ids, w, labels)))

    def logsm(x):
        x = x.astype(np.float64)
        return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))

    nll = -np.take_along_axis(logsm(logits), ids[..., None], -1)[..., 0]
    mlm = (w * nll).sum() / (w.sum() + 1e-5)
    nsp_loss = -np.take_along_axis(logsm(nsp), labels[:, None], -1).mean()
    acc = (w * (logits.argmax(-1) == ids)).sum() / (w.sum() + 1e-5)
    assert abs(got["mlm_loss"].item() - mlm) < 1e-5 and abs(got["nsp_loss"].item() - nsp_loss) < 1e-5
    assert abs(got["loss"].item() - (mlm + nsp_loss)) < 1e-5
    assert abs(got["mlm_acc"].item() - acc) < 1e-6
    assert abs(got["nsp_acc"].item() - (nsp.argmax(-1) == labels).mean()) < 1e-6


@pytest.mark.parametrize("optimizer", ["adamw", "lamb", "sgd"])
def test_eager_and_graph_train_the_same(optimizer):
    """Warmup + polynomial decay, weight decay with excludes, global-norm clipping: same losses."""
    kw = dict(optimizer=optimizer, weight_decay=0.1, clip_grad_norm=0.5)
    eager, m_eager = _train(mode="eager", **kw)
    graph, m_graph = _train(mode="graph", **kw)
    for a, b in zip(eager, graph):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * a["loss"], (a, b)
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)
    for (n, p), (_, q) in zip(m_eager.named_parameters(), m_graph.named_parameters()):
        if n == "qa_outputs.bias":
            # Its gradient is exactly 0 (the start/end softmax runs over positions and a bias shifts them
            # all alike): what eager and graph compute is rounding noise, which Adam scales to ~lr steps.
            # Both must still be bounded by those steps; equality would compare noise.
            assert np.abs(p.numpy()).max() <= 3 * len(eager) * TRAIN["lr"], p.numpy()
            assert np.abs(q.numpy()).max() <= 3 * len(graph) * TRAIN["lr"], q.numpy()
            continue
        np.testing.assert_allclose(p.numpy(), q.numpy(), atol=2e-6, err_msg=n)
    assert [r["lr"] for r in eager[:3]] == pytest.approx([0.0, 5e-4, 1e-3 * (1 - 2 / 20)], rel=1e-9)  # Google's


def test_clipping_and_weight_decay_matter():
    """The knobs the equality test covers are live: changing them changes the numbers."""
    base, _ = _train(mode="graph", clip_grad_norm=None, weight_decay=0.0)
    clipped, _ = _train(mode="graph", clip_grad_norm=0.05, weight_decay=0.0)
    decayed, m = _train(mode="graph", clip_grad_norm=None, weight_decay=0.5)
    assert abs(base[-1]["loss"] - clipped[-1]["loss"]) > 1e-4
    assert abs(base[-1]["loss"] - decayed[-1]["loss"]) > 1e-6
    # LayerNorm and bias are excluded from decay in the graph as in the eager groups
    eager, m_eager = _train(mode="eager", clip_grad_norm=None, weight_decay=0.5)
    for name in ("bert.embeddings.LayerNorm.weight", "bert.pooler.dense.bias", "cls.predictions.bias"):
        np.testing.assert_allclose(dict(m.named_parameters())[name].numpy(),
                                   dict(m_eager.named_parameters())[name].numpy(), atol=2e-6, err_msg=name)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_adam_bias_correction_takes_torch_adamws_first_step(mode):
    """`--adam-bias-correction` (TrainConfig.bias_correction): the first AdamW update is
    lr * g / (|g| + eps), torch.optim.AdamW's; Google's AdamWeightDecay (the default) has no bias
    correction and moves (1 - 0.9) / sqrt(1 - 0.999) = 3.16x as far where |g| >> eps."""
    from bert_of.cli import build_parser
    from bert_of.finetuning.task import TASKS
    from bert_of.options import from_args

    squad_options = TASKS["squad"].options
    argv = ["finetune", "squad", "--model", "m", "--train", "t.json", "-o", "out"]
    flagged = from_args(squad_options, build_parser().parse_args(argv + ["--adam-bias-correction"]))
    assert TrainConfig.of(flagged, steps=1).bias_correction is True
    assert TrainConfig.of(from_args(squad_options, build_parser().parse_args(argv)), steps=1).bias_correction is False
    start = BertForPreTraining(BertConfig(**CONFIG))
    start.init_weights(seed=0)
    w0 = {n: p.numpy().copy() for n, p in start.named_parameters()}
    kw = dict(mode=mode, warmup_steps=0, weight_decay=0.0, clip_grad_norm=None)
    _, google = _train(steps=1, **kw)
    _, torch_like = _train(steps=1, bias_correction=True, **kw)
    lr = TRAIN["lr"]
    moved = 0
    for (n, p), (_, q) in zip(google.named_parameters(), torch_like.named_parameters()):
        dg, dt = p.numpy() - w0[n], q.numpy() - w0[n]
        assert np.abs(dt).max() <= lr * (1 + 1e-4), n  # a corrected first step is never longer than lr
        big = np.abs(dt) > lr * (1 - 1e-3)  # |g| > ~1e3 eps: the step is lr * sign(g)
        moved += int(big.sum())
        np.testing.assert_allclose(dg[big] / dt[big], 0.1 / np.sqrt(1e-3), rtol=0.04, err_msg=n)
    assert moved > 1000


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_gradient_accumulation_matches_the_full_batch(mode):
    full, _ = _train(mode=mode, optimizer="sgd", clip_grad_norm=None, weight_decay=0.0)
    accum, _ = _train(mode=mode, optimizer="sgd", clip_grad_norm=None, weight_decay=0.0, grad_accum_steps=4)
    for a, b in zip(full, accum):
        # per-micro-batch MLM normalisation differs from the full batch's only through the 1e-5
        # in the denominator and rows with padded predictions
        assert abs(a["loss"] - b["loss"]) <= 2e-3 * a["loss"]
    full_w, _ = _train(mode=mode, optimizer="sgd", clip_grad_norm=None, weight_decay=0.0)
    assert [r["loss"] for r in full_w] == [r["loss"] for r in full]  # deterministic


def test_it_learns():
    model = BertForPreTraining(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    trainer = Trainer(model, TrainConfig(mode="graph", optimizer="adamw", lr=5e-3, warmup_steps=3, steps=40))
    losses = [trainer.step(global_batch(0))["loss"] for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]


def test_two_ranks_global_graph_global_eager_and_ddp_match_one_process(tmp_path):
    single = [r["loss"] for r in _train(mode="eager")[0]]
    ways = ("global-graph", "global-eager", "ddp")
    out = tmp_path / "ways.json"
    r = run_ranks(os.path.join(ROOT, "tests/scripts/dist_train.py"), out, *ways)  # one launch, each way in turn
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["world"] == 2 and sorted(got["ways"]) == sorted(ways)
    for way in ways:
        losses = got["ways"][way]
        assert len(losses) == STEPS
        for a, b in zip(single, losses):
            assert abs(a - b) <= 1e-6 * a, (way, single, losses)


def test_eager_loss_scaler_skips_backs_off_and_grows():
    """AMP's loss-scaler logic on CPU: inject non-finite gradients, watch skip / backoff / growth."""
    model = BertForPreTraining(BertConfig(**CONFIG))
    model.init_weights(seed=0)
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode="eager", amp=True, warmup_steps=0)))  # lr > 0 at once
    trainer.scaler.growth_interval = 2
    poison = {1, 4}

    def inject(grad):  # a gradient hook on one parameter (OneFlow's own mechanism; the trainer has no seam)
        if trainer.global_step in poison:
            grad = grad.clone()
            grad[0] = float("inf") if trainer.global_step == 1 else float("nan")
        return grad

    [p for p in model.parameters() if p.requires_grad][3].register_hook(inject)
    scales, skipped = [], []
    for s in range(6):
        before = {n: p.numpy().copy() for n, p in model.named_parameters()}
        out = trainer.step(global_batch(s))
        scales.append(out["loss_scale"])
        skipped.append(out["skipped"])
        changed = any(not np.array_equal(before[n], p.numpy()) for n, p in model.named_parameters())
        assert changed == (s not in poison), s  # a skipped step leaves every parameter alone
        assert np.isfinite(out["loss"])
    s0 = 2.0 ** 16
    assert skipped == [0, 1, 0, 0, 1, 0]
    # step 0 good (1/2), step 1 bad: halve; steps 2,3 good: grow at the 2nd; step 4 bad: halve
    assert scales == [s0, s0 / 2, s0 / 2, s0, s0 / 2, s0 / 2]
    # Scaling is exact in fp32 math: unscaled grads drive the same update as without AMP
    ref, _ = _train(steps=1, mode="eager")
    scaled = Trainer(BertForPreTraining(BertConfig(**CONFIG)), TrainConfig(**dict(TRAIN, mode="eager", amp=True)))
    scaled.model.init_weights(seed=0)
    assert abs(scaled.step(global_batch(0))["loss"] - ref[0]["loss"]) < 1e-6


def test_graph_amp_runs_on_cpu_and_changes_nothing():
    fp32, _ = _train(steps=3, mode="graph")
    amp, _ = _train(steps=3, mode="graph", amp=True)
    assert [r["loss"] for r in amp] == [r["loss"] for r in fp32]


def _qa_batch(step, B=8, S=16):
    r = np.random.default_rng(2000 + step)
    return dict(input_ids=r.integers(5, 99, (B, S)), token_type_ids=np.zeros((B, S), np.int64),
                attention_mask=np.ones((B, S), np.int64), start_positions=r.integers(0, S, B),
                end_positions=r.integers(0, S, B))


def _train_head(cls, batch_fn, steps=4, cfg=CONFIG, **kw):
    model = cls(BertConfig(**cfg))
    model.init_weights(seed=0)
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, **kw)))
    return [trainer.step(batch_fn(s)) for s in range(steps)], model


def test_one_trainer_for_every_head():
    """The trainer has no task code: SQuAD and GLUE heads train from their labels, eager == graph,
    and eager AMP (the dynamic loss scaler) serves fine-tuning too (on CPU it changes nothing)."""
    from bert_of.heads import BertForQuestionAnswering, BertForSequenceClassification

    eager, m_eager = _train_head(BertForQuestionAnswering, _qa_batch, mode="eager")
    graph, m_graph = _train_head(BertForQuestionAnswering, _qa_batch, mode="graph")
    for a, b in zip(eager, graph):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * a["loss"] and set(a) >= {"loss", "lr", "grad_norm"}
    for (n, p), (_, q) in zip(m_eager.named_parameters(), m_graph.named_parameters()):
        if n == "qa_outputs.bias":
            # Its gradient is exactly 0 (the start/end softmax runs over positions and a bias shifts them
            # all alike): what eager and graph compute is rounding noise, which Adam scales to ~lr steps.
            # Both must still be bounded by those steps; equality would compare noise.
            assert np.abs(p.numpy()).max() <= 3 * len(eager) * TRAIN["lr"], p.numpy()
            assert np.abs(q.numpy()).max() <= 3 * len(graph) * TRAIN["lr"], q.numpy()
            continue
        np.testing.assert_allclose(p.numpy(), q.numpy(), atol=2e-6, err_msg=n)

    def glue_batch(step):
        b = _qa_batch(step)
        return dict(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                    labels=b["start_positions"] % 2)

    fp32, m32 = _train_head(BertForSequenceClassification, glue_batch, mode="eager")
    amp, m16 = _train_head(BertForSequenceClassification, glue_batch, mode="eager", amp=True)
    assert [r["loss"] for r in amp] == [r["loss"] for r in fp32]
    assert all(r["loss_scale"] == 2.0 ** 16 and r["skipped"] == 0.0 for r in amp)
    for (n, p), (_, q) in zip(m32.named_parameters(), m16.named_parameters()):
        assert np.array_equal(p.numpy(), q.numpy()), n  # scaling by 2^16 and back is exact


def test_every_dropout_draws_from_the_models_one_generator():
    """What the trainer seeds every step: the model's own generator, the heads' dropout included;
    seeding it repeats the masks, another seed draws others."""
    from bert_of.heads import BertForSequenceClassification, BertForTokenClassification

    ids = flow.tensor(global_batch(0)["input_ids"])
    for cls in (BertForPreTraining, BertForSequenceClassification, BertForTokenClassification):
        model = cls(BertConfig(**dict(CONFIG, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)))
        model.train()
        drops = [m for m in model.modules() if isinstance(m, flow.nn.Dropout)]
        assert len(drops) >= 1 + 3 * CONFIG["num_hidden_layers"] and all(m.generator is model.dropout_generator
                                                                     for m in drops), cls.__name__

        def forward(seed):
            model.dropout_generator.manual_seed(seed)
            out = model(ids)
            head = out.prediction_logits if cls is BertForPreTraining else out.logits
            return [out.sequence_output.numpy(), head.numpy()]

        a, b, c = forward(1), forward(1), forward(2)
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), cls.__name__
        assert not any(np.array_equal(x, z) for x, z in zip(a, c)), cls.__name__


def test_a_batch_without_labels_is_refused():
    from bert_of.errors import ConfigError

    model = BertForPreTraining(BertConfig(**CONFIG))
    trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode="eager")))
    batch = {k: v for k, v in global_batch(0).items() if k in ("input_ids", "token_type_ids", "attention_mask")}
    with pytest.raises(ConfigError, match="the model computed no loss"):
        trainer.step(batch)


def test_pre_ln_layers_own_their_layer_norms_and_store_them_under_the_canonical_names():
    """A pre-LN layer normalises its own input (x + attn(ln_1(x))); checkpoints and optimizer state
    keep original BERT's names for it (LiBai's shift: layer i's input norm is layer i-1's output
    LayerNorm), eager and graph alike, and weight decay spares its LayerNorms."""
    config = BertConfig(**CONFIG, layernorm_placement="pre")
    names = set(BertForPreTraining(BertConfig(**CONFIG)).canonical_state())
    slots, after = {}, {}
    for mode, decay in (("eager", 0.5), ("graph", 0.5), ("eager", 0.0)):
        model = BertForPreTraining(config)
        model.init_weights(seed=0)
        assert model.bert.embeddings.LayerNorm is None and model.bert.encoder.final_layer_norm is not None
        state = model.canonical_state()
        assert set(state) == names
        np.testing.assert_array_equal(state["bert.encoder.layer.0.output.LayerNorm.bias"],
                                      model.bert.encoder.layer[1].input_layer_norm.bias.numpy())
        trainer = Trainer(model, TrainConfig(**dict(TRAIN, mode=mode, weight_decay=decay, warmup_steps=0)))
        trainer.step(global_batch(0))
        slots[mode, decay], _ = trainer.optimizer_state()
        assert {k.partition("/")[2] for k in slots[mode, decay] if k != "step"} == names
        after[mode, decay] = model.canonical_state()
        again = Trainer(model, TrainConfig(**dict(TRAIN, mode=mode)))
        again.load_optimizer_state(slots[mode, decay])  # canonical names in, found again
    for k in slots["eager", 0.5]:
        np.testing.assert_allclose(slots["eager", 0.5][k], slots["graph", 0.5][k], rtol=1e-4, atol=1e-7, err_msg=k)
    for mode in ("eager", "graph"):  # decay moved the dense weights, not one LayerNorm
        decayed, plain = after[mode, 0.5], after["eager", 0.0]
        assert not np.allclose(decayed["bert.encoder.layer.0.attention.self.query.weight"],
                               plain["bert.encoder.layer.0.attention.self.query.weight"], rtol=0, atol=1e-7)
        for k in names:
            if ".LayerNorm." in k:
                np.testing.assert_allclose(decayed[k], plain[k], rtol=0, atol=1e-6, err_msg=(mode, k))


def test_clip_by_global_norm_scales_only_beyond_the_limit():
    """Within max_norm the gradients keep their bits (the factor is exactly 1, the pass skipped); beyond
    it each is scaled by max_norm / ||g|| (||g|| over every parameter, float64 within float noise)."""
    from bert_of.training.optim import clip_by_global_norm

    rng = np.random.default_rng(4)
    grads = [rng.standard_normal(shape).astype(np.float32) for shape in ((7, 5), (5,), (300,))]
    total = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
    for max_norm in (total * 1.5, total / 3):
        params = [flow.nn.Parameter(flow.zeros(*g.shape)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = flow.tensor(g)
        norm = float(clip_by_global_norm(params, max_norm).numpy())
        assert abs(norm - total) <= 1e-6 * total
        for p, g in zip(params, grads):
            if max_norm > total:
                assert np.array_equal(p.grad.numpy(), g)
            else:
                np.testing.assert_allclose(p.grad.numpy(), g * (max_norm / total), rtol=1e-6)
