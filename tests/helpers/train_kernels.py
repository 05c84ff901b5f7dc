"""What the training kernels' tests share (bert_of/runtime/train_kernels.py): the kernels switched on
afresh for a test module, and a dropout module drawing from the kernels' generator. Needs OneFlow."""

import contextlib
import os

from bert_of._flow import flow
from bert_of.runtime import train_kernels as TK


@contextlib.contextmanager
def kernels_on(switches, always=None):
    """The training kernels on (their default) and checked anew, whatever the caller's environment says
    of ``switches`` (variable names), with ``always`` (name -> value) set meanwhile; the environment and
    the kernels' state as before afterwards. The kernels count their calls from 0 inside."""
    before, state = {k: os.environ.get(k) for k in switches}, dict(TK._state)
    for k in switches:
        os.environ.pop(k, None)
    os.environ.update(always or {})
    TK._state.update(checked=False, lib=None, kernels={}, calls=0)
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
        TK._state.clear()
        TK._state.update(state)


def dropout_module(p: float, seed: int = 5):
    """A training-mode ``nn.Dropout(p)`` on a :class:`TK.DropoutGenerator` seeded with ``seed``."""
    d = flow.nn.Dropout(p, generator=TK.DropoutGenerator())
    d.generator.manual_seed(seed)
    d.train()
    return d
