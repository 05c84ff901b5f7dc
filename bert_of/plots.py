"""Curves people can tell apart: every run its own colour; a curve that coincides with one drawn
before it is dashed on top of it, and the legend says so. Used by ``bert-of plot`` and the
``bert-of align`` reports. Matplotlib is the optional ``plots`` extra: :func:`pyplot` imports it when a
figure is drawn."""

from __future__ import annotations

import numpy as np

from bert_of.errors import BertOfError

PLOTS_EXTRA = "pip install 'bert_of[plots]'"


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no display); without matplotlib, one line naming the extra."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise BertOfError(f"drawing a plot needs matplotlib: {PLOTS_EXTRA}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

# matplotlib's tab10 without grey, then more (colour-blind friendly first)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#7f7f7f", "#393b79", "#ad494a"]
DASHES = [(0, (6, 3))]  # one curve over another; several over one: DASH-long dashes at shifted phases
DASH = 5
FONT = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 9, "xtick.labelsize": 10,
        "ytick.labelsize": 10}
COINCIDE = 2e-3  # max |a - b| over the curve's value range below which the eye sees one line


def coincide(a, b, rel: float = COINCIDE) -> str | None:
    """"identical" / "coincides" when curve ``b`` lies on ``a`` (over their common steps), else None."""
    n = min(len(a), len(b))
    if n == 0:
        return None
    x, y = np.asarray(a[:n], np.float64), np.asarray(b[:n], np.float64)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        return None
    if np.array_equal(x, y):
        return "identical"
    span = float(np.ptp(x)) or float(np.max(np.abs(x))) or 1.0
    return "coincides" if float(np.max(np.abs(x - y))) <= rel * span else None


def styles(curves: dict, order=None) -> dict:
    """{label: matplotlib keyword arguments} for ``curves`` ({label: y values}).

    Every curve gets its own colour. A curve lying on one drawn earlier (in ``order``, default
    the dict's) is dashed, thinner and drawn above it, labelled "... (identical to X)" or
    "... (coincides with X)"; the others are solid. Several curves on the same one share a dash
    pattern at shifted phases, so each colour shows in turn along the line.
    """
    order = list(order or curves)
    base_of, solid = {}, []
    for label in order:
        hit = next(((s, how) for s in solid for how in [coincide(curves[s], curves[label])] if how), None)
        if hit is None:
            solid.append(label)
        else:
            base_of[label] = hit
    over = {s: [k for k in order if base_of.get(k, (None,))[0] == s] for s in solid}
    out = {}
    for i, label in enumerate(order):
        color = PALETTE[i % len(PALETTE)]
        if label not in base_of:
            out[label] = dict(color=color, ls="-", lw=2.6, zorder=2, label=label)
            continue
        s, how = base_of[label]
        k, m = over[s].index(label), len(over[s])
        ls = DASHES[0] if m == 1 else (k * DASH, (DASH, m * DASH))  # the base shows in every (m+1)th slot
        note = "identical to" if how == "identical" else "coincides with"
        out[label] = dict(color=color, ls=ls, lw=1.8, zorder=3 + k, label=f"{label} ({note} {s})")
    return out


def draw(ax, x, y, style: dict) -> None:
    """``ax.plot`` with a :func:`styles` entry; the legend shows a plain dash for a dashed curve
    (a phase-shifted pattern can fall into its gap on the legend's short sample)."""
    kw = dict(style)
    label = kw.pop("label", None)
    ax.plot(x, y, **kw)
    if label is not None:
        ax.plot([], [], color=kw.get("color"), lw=kw.get("lw", 1.5), ls="-" if kw.get("ls", "-") == "-" else DASHES[0],
                label=label)


__all__ = ["COINCIDE", "DASH", "DASHES", "FONT", "PALETTE", "coincide", "draw", "styles"]
