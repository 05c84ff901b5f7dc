"""The canonical-name hub: declarative name tables and the transforms they use.

Every format module declares ``TABLE``: rows ``(format_name, canonical_name,
transform)`` where names are templates (``{i}`` = a layer index) and the
transform turns the format's array into the canonical one:

    ("bert/encoder/layer_{i}/attention/self/query/kernel",
     "bert.encoder.layer.{i}.attention.self.query.weight", "T")

The same row read right-to-left maps back (each transform has an inverse), so
N formats need N tables and any-to-any conversion goes through canonical names.

Tables are not written out by hand: :func:`spell` derives a format's rows from the one BERT
scope list (:data:`bert_of.tensors.SCOPES`), given how the format spells a scope (a function
plus the few scopes it spells its own way) and each kind's parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

from bert_of.tensors import SCOPES

# transform -> (array fn, shape fn, inverse transform)
TRANSFORMS = {
    None: (lambda a: a, lambda s: tuple(s), None),
    "T": (lambda a: np.ascontiguousarray(a.T), lambda s: tuple(reversed(s)), "T"),
    "squeeze0": (lambda a: a.reshape(a.shape[1:]), lambda s: tuple(s[1:]), "unsqueeze0"),
    "unsqueeze0": (lambda a: a.reshape((1,) + a.shape), lambda s: (1,) + tuple(s), "squeeze0"),
    # a single value stored as [1] (or [1, 1]) read as a scalar: step counters, loss scales
    "scalar": (lambda a: a.reshape(()), lambda s: (), "scalar"),
    # Model Garden's einsum attention (converters/formats/tf2/): q/k/v kernels [in, heads, head_size], their
    # biases [heads, head_size], the output kernel [heads, head_size, out]. Splitting back needs the
    # head count, which only the config knows: tf2's writer does it (no inverse here).
    "heads_in": (lambda a: np.ascontiguousarray(a.reshape(a.shape[0], -1).T), lambda s: (s[1] * s[2], s[0]), None),
    "heads_bias": (lambda a: a.reshape(-1), lambda s: (s[0] * s[1],), None),
    "heads_out": (lambda a: np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T), lambda s: (s[2], s[0] * s[1]), None),
}


def apply(transform: Optional[str], arr: np.ndarray) -> np.ndarray:
    return TRANSFORMS[transform][0](arr)


def apply_shape(transform: Optional[str], shape) -> tuple:
    return TRANSFORMS[transform][1](shape)


def inverse(transform: Optional[str]) -> Optional[str]:
    return TRANSFORMS[transform][2]


def spell(scope_name, params, own=None, groups=None) -> list:
    """A format's table rows, derived from :data:`bert_of.tensors.SCOPES`.

    ``scope_name(canonical scope) -> format scope`` spells most scopes; ``own`` maps the scopes a
    format spells its own way to ``format scope`` or ``(format scope, kind)`` (a kind of its own:
    a dense layer stored [out, in] is "out" in TF1), or to None (the format has no such tensor).
    ``params[kind]`` lists ``(format suffix, canonical suffix, transform)``; a scope's rows are
    ``scope + suffix`` (an empty scope: the suffix without its leading separator). ``groups``
    keeps only the scopes of those groups (embeddings, layer, pooler, mlm, nsp, qa, classifier).
    A kind the format does not spell is an error here, at import: a new scope in SCOPES
    cannot be silently missing from a format.
    """
    own = own or {}
    rows = []
    for scope, kind, _, group in SCOPES:
        if groups is not None and group not in groups:
            continue
        name = own[scope] if scope in own else scope_name(scope)
        if name is None:
            continue
        if isinstance(name, tuple):
            name, kind = name
        if kind not in params:
            raise ValueError(f"no parameters of kind {kind!r} (scope {scope})")
        for suffix, canonical, *transform in params[kind]:
            rows.append((name + suffix if name else suffix[1:], scope + canonical, *transform))
    return rows


def _template_regex(t: str) -> re.Pattern:
    return re.compile("^" + re.escape(t).replace(re.escape("{i}"), r"(?P<i>\d+)") + "$")


@dataclass(frozen=True)
class Rule:
    name: str  # format-side template
    canonical: str  # canonical template
    transform: Optional[str] = None  # applied format -> canonical

    def __post_init__(self):
        if self.transform not in TRANSFORMS:
            raise ValueError(f"unknown transform {self.transform!r}")


class Table:
    """A compiled name table, both directions."""

    def __init__(self, rows):
        self.rules = [r if isinstance(r, Rule) else Rule(*r) for r in rows]
        self._fwd = [(_template_regex(r.name), r) for r in self.rules]
        self._bwd = [(_template_regex(r.canonical), r) for r in self.rules]

    def to_canonical(self, name: str):
        """format name -> (canonical name, transform) or None."""
        for rx, r in self._fwd:
            m = rx.match(name)
            if m:
                return r.canonical.format(**m.groupdict()), r.transform
        return None

    def from_canonical(self, canonical: str):
        """canonical name -> (format name, transform format->canonical) or None."""
        for rx, r in self._bwd:
            m = rx.match(canonical)
            if m:
                return r.name.format(**m.groupdict()), r.transform
        return None
