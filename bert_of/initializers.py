"""Google's initializers in NumPy, shared by the model and the TF reference (no OneFlow, no TF)."""

from __future__ import annotations

import numpy as np


def truncated_normal(rng, shape, std: float) -> np.ndarray:
    """float32 N(0, std^2) redrawn beyond 2 std: TF's truncated_normal_initializer, Google's init."""
    w = rng.standard_normal(shape)
    bad = np.abs(w) > 2.0
    while bad.any():
        w[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(w) > 2.0
    return (w * std).astype(np.float32)
