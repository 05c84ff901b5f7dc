"""`bert-of align`, reduced: every experiment at the tiny size for a few steps, in ONE invocation
(one dataset, one 2-rank launch for all multi-rank runs), then the reports are checked; plus a
negative test through the real CLI (a perturbed learning rate must fail) and unit tests of the
comparison rule and the derived datasets.

The full 1000-step runs: `bert-of align all --steps 1000` (docs/alignment.md).
"""

import json
import os

import numpy as np
import pytest

from bert_of.align import plans, report
from bert_of.cli import main as bert_of_main
from bert_of.align import data as align_data
from tests.conftest import run_cli

pytestmark = pytest.mark.oneflow

STEPS = 12
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("align")
    rc = bert_of_main(["align", "all", "--steps", str(STEPS), "--size", "tiny", "--output", str(out), "--quiet"])
    with open(out / "summary.json") as f:
        summary = json.load(f)
    reports = {}
    for name in summary["experiments"]:
        with open(out / f"{name}.json") as f:
            reports[name] = json.load(f)
    return rc, out, summary, reports


def test_reduced_suite_passes_and_writes_reports(suite):
    rc, out, summary, reports = suite
    status = {n: e["status"] for n, e in summary["experiments"].items()}
    assert rc == 0 and summary["passed"], status
    assert list(status) == [name for _, name, _, _ in plans.EXPERIMENTS]
    for name, rep in reports.items():
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000, name
        if rep["status"] == "skipped":
            continue
        assert rep["status"] == "pass", (name, rep.get("reason"))
        assert rep["tolerance"]["rel_first"] == 1e-5 and rep["tolerance"]["rel_all"] == 1e-3
        for label, run in rep["runs"].items():
            assert len(run["loss"]) == STEPS and all(np.isfinite(run["loss"])), (name, label)
            assert len(run["lr"]) == STEPS
        equal = [c for c in rep["comparisons"] if c["expect"] == "equal"]
        assert equal, name
        for c in rep["comparisons"]:
            assert c["steps"] == STEPS and len(c["rel_diff"]) == STEPS
            assert {"max_abs_diff", "max_rel_diff", "max_rel_diff_first_10", "passed"} <= set(c)
        for c in equal:
            assert c["passed"] and c["max_rel_diff_first_10"] <= 1e-5, (name, c["other"])
    md = (out / "README.md").read_text()
    assert all(f"[{name}.png]({name}.png)" in md for name in reports)
    # --replot redraws the plots from the reports alone
    before = {name: (out / f"{name}.png").stat().st_mtime_ns for name in reports}
    assert bert_of_main(["align", "all", "-o", str(out), "--replot"]) == 0
    assert all((out / f"{name}.png").stat().st_mtime_ns > before[name] for name in reports)
    assert not [p for p in os.listdir(out) if p.startswith(".work") or ".tmp" in p]  # nothing half-written


def test_eager_and_graph_coincide(suite):
    rep = suite[3]["eager-graph"]
    c = rep["comparisons"][0]
    assert (c["reference"], c["other"]) == ("eager", "graph")
    assert c["max_rel_diff"] <= 1e-6
    assert rep["runs"]["graph"]["loss"][0] == rep["runs"]["eager"]["loss"][0]  # one initialisation


def test_controls_have_teeth(suite):
    """Every "differ" control differs: the defaults drift, data_repeat, the lazy reader bug, no clipping,
    a fresh Adam state."""
    reps = suite[3]
    controls = [(n, c) for n, r in reps.items() for c in r["comparisons"] if c["expect"] == "differ"]
    assert {n for n, _ in controls} == {"schedulers", "data-sharding", "clipping", "tf-checkpoint"}
    for name, c in controls:
        assert c["passed"] and c["first_step_over_tolerance"] is not None, (name, c["other"])


def test_data_parallel_loss_convention(suite):
    rep = suite[3]["data-parallel"]
    chk = {c["name"]: c for c in rep["checks"]}["ddp_rank_mean"]
    assert chk["passed"]
    ranks = np.array(chk["rank_losses"])
    assert ranks.shape == (2, STEPS)
    assert np.max(np.abs(ranks[0] - ranks[1])) > 1e-3  # the ranks' own losses differ ...
    single = np.array(rep["runs"]["1 process, eager"]["loss"])
    assert np.max(np.abs(ranks.mean(0) - single) / single) < 1e-5  # ... their mean is the global loss
    assert rep["runs"]["2 ranks, global graph"]["world"] == 2


def test_clipping_was_active_and_tf_schedule_matches(suite):
    reps = suite[3]
    clip = {c["name"]: c for c in reps["clipping"]["checks"]}["clipping_active"]
    assert clip["passed"] and min(clip["grad_norm"]) > plans.CLIP_NORM
    tf = reps["tf-checkpoint"]
    assert {c["name"]: c["passed"] for c in tf["checks"]} == {"tf_learning_rate": True}
    assert tf["runs"]["TF reference"]["global_step"][0] == 200


def test_amp_is_skipped_on_cpu_with_the_reason(suite):
    from bert_of._flow import flow

    e = suite[2]["experiments"]["amp"]
    if flow.cuda.is_available():
        pytest.skip("CUDA present: AMP ran")
    assert e["status"] == "skipped"
    assert e["reason"] == "skipped: AMP needs CUDA (fp16 kernels do not exist on CPU)"


def test_a_different_learning_rate_fails_through_the_cli(tmp_path):
    """The check has teeth: graph trained with lr x 1.01 is not 'the same training'."""
    r = run_cli("align", "eager-graph", "--steps", 8, "--size", "tiny", "-o", tmp_path,
                "--perturb-lr", "0.01", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads((tmp_path / "eager-graph.json").read_text())
    assert rep["status"] == "fail" and "graph vs eager" in rep["reason"]
    c = rep["comparisons"][0]
    assert not c["passed"] and c["first_step_over_tolerance"] is not None
    assert rep["runs"]["graph"]["spec"]["train"]["lr"] == pytest.approx(1.01e-3)
    assert "FAILED" in r.stdout and (tmp_path / "eager-graph.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "summary.json").read_text())["passed"] is False


def test_compare_rule():
    ref = [10.0] * 30
    ok = report.compare(ref, [10.0 * (1 + 9e-6)] * 10 + [10.0 * (1 + 9e-4)] * 20)
    assert ok["passed"] and ok["first_step_over_tolerance"] is None
    early = report.compare(ref, [10.0] * 9 + [10.0 * (1 + 2e-5)] + [10.0] * 20)
    assert not early["passed"] and early["first_step_over_tolerance"] == 9
    late = report.compare(ref, [10.0] * 29 + [10.0 * (1 + 2e-3)])
    assert not late["passed"] and late["worst_step"] == 29
    assert report.compare(ref, [11.0] * 30, expect="differ")["passed"]
    assert not report.compare(ref, ref, expect="differ")["passed"]
    assert not report.compare(ref, [float("nan")] * 30)["passed"]
    assert report.compare(ref, ref, expect="info")["passed"] is None
    assert report.compare(ref, ref)["identical_steps"] == 30


def test_derived_datasets(tmp_path):
    """data_shuffle swaps the two ranks' shards, data_repeat is part 0 four times."""
    dirs = align_data.prepare_data(str(tmp_path), plans.SIZES["tiny"], align_data.DEFAULT_CORPUS, align_data.DEFAULT_VOCAB,
                              quiet=True)
    data = {"batch_size": 8, "shards": 2, "seq_length": 16, "max_predictions": 2}

    def rows(which, rank, world=2, reader="sharded"):
        s = align_data.BatchStream(dict(data, dir=dirs[which], reader=reader), rank, world)
        b = s.next()
        s.close()
        return b["input_ids"]

    np.testing.assert_array_equal(rows("shuffle", 0), rows("base", 1))
    np.testing.assert_array_equal(rows("shuffle", 1), rows("base", 0))
    np.testing.assert_array_equal(rows("repeat", 1), rows("base", 0))
    both = align_data.BatchStream(dict(data, dir=dirs["base"], reader="sharded"))
    np.testing.assert_array_equal(both.next()["input_ids"], np.concatenate([rows("base", 0), rows("base", 1)]))
    both.close()
    np.testing.assert_array_equal(rows("base", 0, reader="all-parts"), rows("base", 1, reader="all-parts"))


def test_existing_records_in_any_format_are_the_suites_data(tmp_path):
    """--data: Google-style TFRecords (no bert_of_data.json) of the same records give the same parts."""
    S, P = plans.SIZES["tiny"]["seq_length"], plans.SIZES["tiny"]["max_predictions"]
    tf_dir = tmp_path / "tf"
    run_cli("data", "create-pretraining", "--input", *align_data.DEFAULT_CORPUS, "--vocab", align_data.DEFAULT_VOCAB,
            "-o", tf_dir, "--num-parts", align_data.NUM_PARTS, "--max-seq-length", S,
            "--max-predictions-per-seq", P, "--format", "tfrecord")
    os.remove(tf_dir / "bert_of_data.json")
    made = align_data.prepare_data(str(tmp_path / "a"), plans.SIZES["tiny"], align_data.DEFAULT_CORPUS,
                                   align_data.DEFAULT_VOCAB, quiet=True)
    read = align_data.prepare_data(str(tmp_path / "b"), plans.SIZES["tiny"], (), align_data.DEFAULT_VOCAB,
                                   quiet=True, data=str(tf_dir / "part-*"))
    for i in range(align_data.NUM_PARTS):
        name = f"part-{i:05d}"
        for k in ("base", "shuffle", "repeat"):
            assert (open(os.path.join(made[k], name), "rb").read() == open(os.path.join(read[k], name), "rb").read())
    with pytest.raises(align_data.AlignError, match=r"records of seq_length/max_predictions \(16, 2\), this --size"):
        align_data.prepare_data(str(tmp_path / "c"), plans.SIZES["small"], (), align_data.DEFAULT_VOCAB, quiet=True,
                                data=str(tf_dir))


def test_list_and_unknown_experiment(capsys):
    assert bert_of_main(["align", "list"]) == 0
    listed = capsys.readouterr().out
    assert "1 eager-graph" in listed and "8 amp" in listed
    assert bert_of_main(["align", "nine", "-o", "/nonexistent/never-written"]) == 1
    assert "unknown experiment 'nine'" in capsys.readouterr().err
    with pytest.raises(align_data.AlignError, match="unknown experiment 'nine'"):
        plans.resolve_experiments(["nine"])
    assert plans.resolve_experiments(["4", "data-parallel", "1"]) == ["data-parallel", "eager-graph"]
