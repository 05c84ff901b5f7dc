"""The suite's verdicts and pictures: comparing loss curves, the experiment checks, the JSON
reports, the summary (JSON, markdown, text) and the plots."""

from __future__ import annotations

import textwrap

import numpy as np

from bert_of.align.plans import BY_NAME, CLIP_NORM, CONTROL_STEPS, FIRST_STEPS, TF_STEPS, TOL_ALL, TOL_FIRST, _tolerance
from bert_of.files.atomic import atomic_open
from bert_of.plots import FONT, draw, pyplot, styles

# --------------------------------------------------------------------------- comparisons


def compare(ref: list, other: list, expect: str = "equal", tol_first=TOL_FIRST, first_steps=FIRST_STEPS,
            tol_all=TOL_ALL) -> dict:
    """Step-by-step relative difference |other - ref| / |ref| of two loss curves."""
    n = min(len(ref), len(other))
    a = np.asarray(ref[:n], dtype=np.float64)
    b = np.asarray(other[:n], dtype=np.float64)
    absd = np.abs(b - a)
    rel = absd / np.maximum(np.abs(a), 1e-30)
    finite = bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b)))
    k = min(first_steps, n)
    out = {
        "steps": n,
        "max_abs_diff": float(absd.max()) if n else None,
        "max_rel_diff": float(rel.max()) if n else None,
        f"max_rel_diff_first_{first_steps}": float(rel[:k].max()) if n else None,
        "worst_step": int(rel.argmax()) if n else None,
        "identical_steps": int((absd == 0).sum()),
        "rel_diff": [float(x) for x in rel],
    }
    over = np.flatnonzero(np.concatenate([rel[:k] > tol_first, rel[k:] > tol_all])) if n else []
    out["first_step_over_tolerance"] = int(over[0]) if len(over) else None
    within = finite and n > 0 and len(over) == 0
    if expect == "equal":
        out["passed"] = within
    elif expect == "differ":
        out["passed"] = finite and n > 0 and not within
    else:
        out["passed"] = None
    return out


def _check(name, plan, results_by_label):
    r = results_by_label
    if name == "ddp_rank_mean":
        ddp = r.get("2 ranks, eager DDP", {})
        single = r.get("1 process, eager", {})
        ranks = ddp.get("ranks") or []
        if not ranks or "loss" not in single:
            return {"name": name, "passed": False, "detail": "runs missing"}
        local = np.array([rk["local_loss"] for rk in ranks], dtype=np.float64)  # [ranks, steps]
        mean = local.mean(0)
        c = compare(single["loss"], list(mean))
        spread = float(np.max(np.abs(local[0] - local[1]) / np.abs(mean)))
        return {"name": name, "passed": c["passed"],
                "detail": f"(l_1 + l_2) / 2 from the ranks' own losses vs the 1-process global loss: max rel diff "
                          f"{c['max_rel_diff']:.3g} (first {FIRST_STEPS}: "
                          f"{c[f'max_rel_diff_first_{FIRST_STEPS}']:.3g}); the ranks' losses themselves differ by "
                          f"up to {spread:.3g} relative",
                "rank_losses": local.tolist()}
    if name == "clipping_active":
        norms = r.get("1 process, eager", {}).get("grad_norm") or []
        if not norms:
            return {"name": name, "passed": False, "detail": "no gradient norms recorded"}
        frac = float(np.mean(np.asarray(norms) > CLIP_NORM))
        return {"name": name, "passed": frac >= 0.5,
                "detail": f"pre-clip global gradient norm above {CLIP_NORM:g} at {frac:.0%} of the steps "
                          f"(min {min(norms):.3g}, median {float(np.median(norms)):.3g}, max {max(norms):.3g}); "
                          f"at least half is required for the experiment to test clipping",
                "grad_norm": norms}
    if name == "tf_learning_rate":
        tf = r.get("TF reference", {})
        worst = 0.0
        for label in ("bert_of eager", "bert_of graph"):
            lrs = r.get(label, {}).get("lr") or []
            for a, b, e in zip(tf.get("lr", []), lrs, plan["expected_lr"]):
                worst = max(worst, abs(a - e) / e, abs(b - e) / e)
        ok = worst <= 1e-6 and bool(tf.get("lr"))
        return {"name": name, "passed": ok,
                "detail": f"learning rates of TF (fp32) and bert_of vs Google's schedule: max rel diff {worst:.3g} "
                          f"(<= 1e-6)"}
    raise AssertionError(name)


# --------------------------------------------------------------------------- reports


def _summary_line(rep, jpath, ppath):
    eq = [c for c in rep["comparisons"] if c["expect"] == "equal"]
    first = f"max_rel_diff_first_{FIRST_STEPS}"
    return {"number": rep["number"], "title": rep["title"], "status": rep["status"], "reason": rep.get("reason"),
            "steps": max((c["steps"] for c in eq), default=0),
            first: max((c[first] for c in eq if c[first] is not None), default=None),
            "max_rel_diff": max((c["max_rel_diff"] for c in eq if c["max_rel_diff"] is not None), default=None),
            "cpu_seconds": rep.get("cpu_seconds"), "report": jpath, "plot": ppath}


def _report(name, plan, results, ctx):
    num, _, title, _ = BY_NAME[name]
    rep = {"experiment": name, "number": num, "title": title, "description": plan.get("description", ""),
           "steps_requested": ctx.steps, "size": ctx.size_name, "model": ctx.model,
           "tolerance": _tolerance(plan), "runs": {}, "comparisons": [], "checks": [],
           "notes": list(plan.get("notes") or [])}
    if ctx.perturb_lr:
        rep["notes"].append(f"--perturb-lr {ctx.perturb_lr:g}: the compared side of every equal comparison "
                            f"trained with lr x (1 + {ctx.perturb_lr:g}) (self-test: this should fail)")
    if plan.get("skip"):
        rep.update(status="skipped", reason=plan["skip"])
        return rep
    if plan.get("error"):
        rep.update(status="error", reason=plan["error"], trace=plan.get("trace"))
        return rep
    by_label = {}
    errors = []
    for label, key in plan["keys"].items():
        res = results.get(key, {"error": "not run"})
        spec = dict(plan["runs"][label])
        entry = {"spec": spec}
        if "error" in res:
            errors.append(f"{label}: {res['error']}")
            entry["error"] = res["error"]
        else:
            entry.update({k: v for k, v in res.items() if k != "ranks"})
            if res.get("ranks") and res["ranks"][0].get("local_loss") is not None:
                entry["rank_local_loss"] = [rk.get("local_loss") for rk in res["ranks"]]
            by_label[label] = res
        rep["runs"][label] = entry
    if errors:
        rep.update(status="error", reason=errors[0][:4000])
        return rep
    rep["cpu_seconds"] = sum(_run_cpu(r) for r in by_label.values())
    tol = rep["tolerance"]
    for ref, other, expect, note in plan["comparisons"]:
        c = compare(by_label[ref]["loss"], by_label[other]["loss"], expect, tol["rel_first"], tol["first_steps"],
                    tol["rel_all"])
        rep["comparisons"].append(dict({"reference": ref, "other": other, "expect": expect, "note": note}, **c))
    for chk in plan.get("checks") or []:
        rep["checks"].append(_check(chk, plan, by_label))
    verdicts = [c["passed"] for c in rep["comparisons"] if c["expect"] != "info"] + \
               [c["passed"] for c in rep["checks"]]
    _round_series(rep)
    rep["status"] = "pass" if all(verdicts) else "fail"
    if rep["status"] == "fail":
        bad = [f"{c['other']} vs {c['reference']} ({c['expect']}: max rel diff {c['max_rel_diff']:.3g})"
               for c in rep["comparisons"] if c["passed"] is False]
        bad += [f"check {c['name']}: {c['detail']}" for c in rep["checks"] if not c["passed"]]
        rep["reason"] = "; ".join(bad)
    return rep


def _run_cpu(res) -> float:
    """CPU seconds of a run over all its processes."""
    if res.get("ranks"):
        return float(sum(r.get("cpu_seconds", 0.0) for r in res["ranks"]))
    return float(res.get("cpu_seconds", res.get("seconds", 0.0)))


def _round_series(rep):
    """Shorter reports: float32 losses keep 9 significant digits (exact), differences 4."""
    def r9(v):
        return [None if x is None else float(f"{x:.9g}") for x in v]

    for run in rep["runs"].values():
        for k in ("loss", "mlm_loss", "nsp_loss", "local_loss", "grad_norm"):
            if isinstance(run.get(k), list):
                run[k] = r9(run[k])
        if run.get("rank_local_loss"):
            run["rank_local_loss"] = [r9(v) for v in run["rank_local_loss"]]
    for c in rep["comparisons"]:
        c["rel_diff"] = [float(f"{x:.4g}") for x in c["rel_diff"]]
    for c in rep["checks"]:
        for k in ("rank_losses", "grad_norm"):
            if k in c:
                c[k] = [r9(v) for v in c[k]] if c[k] and isinstance(c[k][0], list) else r9(c[k])


def summary_markdown(summary: dict) -> str:
    """OUT/README.md: the table of experiments with their plots, for people looking at OUT."""
    first = f"max_rel_diff_first_{FIRST_STEPS}"

    def f(x):
        return "-" if x is None else f"{x:.2e}"

    m = summary["model"]
    lines = ["# `bert-of align` reports", "",
             f"{summary['steps']} steps per run (controls: up to {CONTROL_STEPS}; experiment 7: up to {TF_STEPS}); "
             f"size {summary['size']}: {m['num_hidden_layers']} layers, hidden {m['hidden_size']}, "
             f"seq {summary['data']['seq_length']}, {summary['data']['max_predictions']} masked, vocab "
             f"{m['vocab_size']}, batch {summary['batch_size']}, dropout off; "
             f"{summary['platform'].get('cpus')} CPUs, OneFlow {summary['platform'].get('oneflow')}. "
             f"Tolerance of an equal comparison: {TOL_FIRST:g} relative over the first {FIRST_STEPS} steps, "
             f"{TOL_ALL:g} at every step (each report states its own). Wall time {summary['wall_seconds']:.0f} s.", "",
             f"| # | experiment | status | steps | max rel diff, first {FIRST_STEPS} | max rel diff, all | report |",
             "|---|---|---|---|---|---|---|"]
    for name, e in summary["experiments"].items():
        status = e["status"] + (f" ({e['reason']})" if e["status"] != "pass" and e.get("reason") else "")
        lines.append(f"| {e['number']} | {e['title']} | {status} | {e['steps']} | {f(e[first])} | "
                     f"{f(e['max_rel_diff'])} | [{name}.json]({name}.json), [{name}.png]({name}.png) |")
    lines.append("")
    for name, e in summary["experiments"].items():
        lines += [f"## {e['number']}. {e['title']}", "", f"![{name}]({name}.png)", ""]
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    first = f"max_rel_diff_first_{FIRST_STEPS}"
    lines = [f"{'experiment':<17} {'status':<8} {'steps':>5}  {'rel diff <=10':>13}  {'rel diff all':>12}"]

    def f(x):
        return "-" if x is None else f"{x:.2e}"

    for name, e in summary["experiments"].items():
        lines.append(f"{e['number']} {name:<15} {e['status']:<8} {e['steps']:>5}  {f(e[first]):>13}  "
                     f"{f(e['max_rel_diff']):>12}" + (f"  {e['reason']}" if e["status"] != "pass" and e.get('reason')
                                                      else ""))
    lines.append(f"tolerance: {TOL_FIRST:g} relative over the first {FIRST_STEPS} steps, {TOL_ALL:g} over all "
                 f"(per experiment in its report); {summary['wall_seconds']:.0f} s wall, "
                 f"{summary.get('run_cpu_seconds', 0):.0f} s CPU in the runs; "
                 + ("all passed" if summary["passed"] else "FAILED"))
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots


def _smooth(y, window: int):
    """Running mean over ``window`` steps (the first steps average what there is)."""
    y = np.asarray(y, dtype=np.float64)
    if window <= 1 or len(y) < 2 * window:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    out[window - 1:] = (c[window:] - c[:-window]) / window
    out[:window - 1] = c[1:window] / np.arange(1, window)
    return out


def _legend(ax, width: int = 62) -> None:
    """The legend right of the plot, long labels wrapped."""
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [textwrap.fill(t, width, subsequent_indent="  ") for t in labels], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)


def plot_report(report: dict, path: str) -> None:
    """Top: every run's loss (long runs: a running mean, the reference's raw steps faint behind),
    each run its own colour, a run lying on another dashed over it and named so in the legend.
    Bottom: per-step relative differences of every comparison (dots) and their running maximum."""
    plt = pyplot()

    runs = {k: v for k, v in report["runs"].items() if "loss" in v}
    refs = [c["reference"] for c in report["comparisons"]]
    order = sorted(runs, key=lambda k: (k not in refs, refs.index(k) if k in refs else 0))
    n_max = max((len(r["loss"]) for r in runs.values()), default=1)
    window = 25 if n_max > 200 else 1
    drawn = {k: _smooth(runs[k]["loss"], window) for k in order}
    st = styles(drawn, order)  # what coincides on the plot is what the legend explains
    with plt.rc_context(FONT):
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(14, 10), sharex=True, gridspec_kw={"height_ratios": [3, 2]},
                                       layout="constrained")
        if window > 1 and order:
            first = runs[order[0]]["loss"]
            ax1.plot(np.arange(len(first)), first, color="0.6", lw=0.5, alpha=0.35, zorder=1,
                     label=f"{order[0]}: every step")
        for label in order:
            draw(ax1, np.arange(len(drawn[label])), drawn[label], st[label])
        ax1.set_ylabel("loss (MLM + NSP)" + (f", {window}-step mean" if window > 1 else ""))
        _legend(ax1)
        ax1.grid(alpha=0.3)
        ax1.set_title(f"{report['number']}. {report['title']}: {report['status'].upper()}")
        # per-step relative differences as dots (0 cannot be drawn on a log axis: counted in the
        # legend instead), and their running maximum as a line
        maxima, meta = {}, {}
        for c in report["comparisons"]:
            rel = np.asarray(c["rel_diff"], dtype=np.float64)
            tag = {"equal": "", "differ": " [control: must differ]", "info": " [info]"}[c["expect"]]
            zeros = int(c["identical_steps"])
            ident = f"; identical at {zeros}/{c['steps']} steps" if zeros else ""
            label = f"{c['other']} vs {c['reference']}{tag}"
            nz = rel > 0
            color = st.get(c["other"], {}).get("color", "k")
            ax2.plot(np.arange(len(rel))[nz], rel[nz], ".", color=color, ms=2.5 if len(rel) > 200 else 4, alpha=0.35)
            if nz.any():
                maxima[label] = np.maximum.accumulate(np.where(nz, rel, 0.0))
                meta[label] = (color, ident)
            else:
                ax2.plot([], [], "-", color=color, label=f"{label}: identical at every step")
        mst = styles(maxima)
        for label, run_max in maxima.items():
            kw = dict(mst[label], color=meta[label][0], lw=min(mst[label]["lw"], 2.0))
            kw["label"] = kw["label"].replace(label, f"{label}: running max{meta[label][1]}", 1)
            draw(ax2, np.arange(len(run_max)), np.where(run_max > 0, run_max, np.nan), kw)
        ax2.set_yscale("log")
        tol = report["tolerance"]
        if tol.get("rel_all") is not None:
            ax2.axhline(tol["rel_all"], color="k", ls="--", lw=1.0, label=f"tolerance {tol['rel_all']:g}")
            if tol.get("rel_first") is not None:
                ax2.hlines(tol["rel_first"], 0, tol["first_steps"] - 1, color="k", lw=2.5,
                           label=f"tolerance {tol['rel_first']:g} (first {tol['first_steps']} steps)")
        ax2.set_ylabel("|diff| / |reference loss|")
        ax2.set_xlabel("step")
        ax2.grid(alpha=0.3, which="both")
        _legend(ax2)
        with atomic_open(path, "wb") as f:
            fig.savefig(f, dpi=110, format="png")
        plt.close(fig)


def plot_skipped(report: dict, path: str) -> None:
    plt = pyplot()

    fig = plt.figure(figsize=(7, 2))
    fig.text(0.5, 0.5, f"{report['number']}. {report['title']}\n{report['status'].upper()}: {report['reason']}",
             ha="center", va="center", fontsize=9, wrap=True)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, dpi=100, format="png")
    plt.close(fig)
