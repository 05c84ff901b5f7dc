"""The training step's update on CPU: the gradients' global norm and clip, and AdamW, each one pass of
:file:`cpu_train_kernels.c` over all of a model's tensors at once, split over every core.

What OneFlow 0.9 does wrong: each of these is an op (or several) per tensor, each a single-threaded
pass, ~100 of them for MiniLM (22.6M parameters; bench/train_step_profile.py at batch 8 x 128, load
~2): the norm as ~200 products and sums 50 ms (transformers' clip, norm and scaling: 14), the scaling
10, AdamW's adam_update per parameter ~100. When no longer needed: when bench/update_kernels_bench.py's
OneFlow rows are as fast as the kernels'. (Zero-grad stays OneFlow's fill: a native memset over all
the gradients measured no faster, both bound by memory, and OneFlow's runs asynchronously.)

They apply to local eager float32 CPU tensors whose ``numpy()`` is their own memory (C-contiguous,
no two overlapping); otherwise, and in graphs, on CUDA and for global tensors, the callers
(:mod:`bert_of.training.optim`) run OneFlow's ops. Each is checked on its first use (with the
training kernels' library and kept verdicts, :func:`bert_of.runtime.train_kernels.kernel`):

- the norm: the sum of squares in float64 (each square exact, per-chunk sums added in chunk order, so
  the same bits on any thread count) within n 2^-53 (relative) of an exact sum; the norm is its
  square root rounded to float (OneFlow's float32 sum of ~100 float32 sums is ~1e-6 off, its
  sqrt_square_sum ~1% on an 11.7M-element gradient); the scaling bit for bit OneFlow's ``mul_`` by the
  float32 coefficient;
- AdamW: parameters and both moments bit for bit OneFlow's ``adam_update`` (flow.optim.AdamW's
  step) over two steps with and without bias correction and weight decay.

Each has its switch: ``BERT_OF_CPU_CLIP=0``, ``BERT_OF_CPU_ADAMW=0``
(``BERT_OF_CPU_TRAIN_KERNELS=0`` or ``BERT_OF_CPU_KERNELS=0``: all of them with the training kernels).

Reaching the memory: ``numpy()`` of a CPU tensor is a view of its memory (and keeps the tensor
alive), but each call waits for OneFlow's VM; :class:`Views` keeps them from one step to the next.
"""

from __future__ import annotations

import ctypes
import math
import os

import numpy as np

import bert_of.runtime.train_kernels as train_kernels
from bert_of.runtime.flow_import import flow

_I64, _PTR, _F = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_ARGTYPES = {
    "bert_of_multi_chunks": ([_PTR, _I64], _I64),
    "bert_of_multi_sqsum": ([_I64, _PTR, _PTR, _PTR, ctypes.c_int], ctypes.c_double),
    "bert_of_multi_scale": ([_I64, _PTR, _PTR, _F, ctypes.c_int], None),
    "bert_of_multi_adamw": ([_I64, _PTR, _PTR, _PTR, _PTR, _PTR] + [_F] * 10 + [ctypes.c_int], None),
}
_SWITCHES = {"clip": "BERT_OF_CPU_CLIP", "adamw": "BERT_OF_CPU_ADAMW"}
_calls = dict.fromkeys(_SWITCHES, 0)


def update_status() -> dict:
    """{kernel: calls so far in this process} (clip: norms; adamw: parameter groups updated)."""
    return dict(_calls)


def _typed(lib):
    """The library with this module's functions' argument and result types set."""
    if lib.bert_of_multi_sqsum.restype is not ctypes.c_double:
        for fn, (argtypes, restype) in _ARGTYPES.items():
            getattr(lib, fn).argtypes, getattr(lib, fn).restype = argtypes, restype
    return lib


def _lib(name: str):
    """The library when kernel ``name`` is on and passed its check, else None."""
    if os.environ.get(_SWITCHES[name], "1") == "0":
        return None
    lib = train_kernels.kernel(name, lambda lib_: _CHECKS[name](_typed(lib_)))
    return None if lib is None else _typed(lib)


def _local(tensors) -> bool:
    """Local eager float32 CPU tensors, at least one."""
    return bool(tensors) and all(not (t.is_lazy or t.is_global) and t.device.type == "cpu"
                                 and t.dtype == flow.float32 for t in tensors)


def _view(t):
    """t's memory as a flat float32 array (waits for t), or None when numpy() gives a copy."""
    a = t.numpy()
    if a.flags.owndata or not (a.flags.c_contiguous and a.flags.writeable) or a.dtype != np.float32:
        return None
    return a.reshape(-1)


class Views:
    """Tensors' memory as flat float32 arrays, kept from one call to the next: a tensor given in the
    previous call of the same ``role`` is not read again through ``numpy()`` (each waits for OneFlow's
    VM: ~0.02 ms at load 1, ~4 ms at load 3 with bert_of's ``ONEFLOW_VM_COMPUTE_ON_WORKER_THREAD=0``,
    ~100 of them a step); one wait for everything pending (OneFlow's Sync) stands for them.

    It holds the tensors of each role's last call (their arrays keep them, so an address stays
    valid while it is kept), and is owned by what calls every step (the trainer's eager step, the
    optimizer), so it goes with them. What it cannot see: a tensor whose storage is replaced in place
    (``t.data = other``) keeps its old address here; bert_of never does that to parameters, gradients
    (in place across steps, also under eager DDP's buckets) or optimizer state (load_state_dict makes
    new tensors)."""

    def __init__(self):
        self._roles = {}

    def arrays(self, role, tensors):
        """[flat float32 array] of ``tensors``, or None when one is not its own memory."""
        old, new, out, kept = self._roles.get(role, {}), {}, [], False
        for t in tensors:
            hit = old.get(id(t))
            if hit is not None and hit[0] is t:
                kept = True
            else:
                a = _view(t)
                if a is None:
                    return None
                hit = (t, a)
            new[id(t)] = hit
            out.append(hit[1])
        if kept:
            flow._oneflow_internal.eager.Sync()  # what OneFlow still has to write or read of them
        self._roles[role] = new
        return out


def _disjoint(*lists) -> bool:
    """No two arrays of the lists share a byte (a thread per chunk writes each once)."""
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for arrays in lists for a in arrays if a.size)
    return all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))


class _Table:
    """What the C functions take for a list of arrays: their starts in one index space [n + 1] and
    their addresses [n] (the arrays stay referenced while the table lives)."""

    def __init__(self, arrays):
        self.arrays, self.n = arrays, len(arrays)
        self.start = np.zeros(self.n + 1, np.int64)
        np.cumsum([a.size for a in arrays], out=self.start[1:])
        self.ptrs = np.array([a.ctypes.data for a in arrays], np.uintp)

    def args(self):
        return self.n, self.start.ctypes.data, self.ptrs.ctypes.data


def _sqsum(lib, arrays, threads) -> float:
    table = _Table(arrays)
    part = np.empty(max(1, lib.bert_of_multi_chunks(table.start.ctypes.data, table.n)), np.float64)
    return lib.bert_of_multi_sqsum(*table.args(), part.ctypes.data, threads)


def global_norm(grads, views: Views | None = None):
    """The L2 norm of all the tensors ``grads`` together (float64 sum, rounded to np.float32), or None
    where the kernel does not apply (the caller's OneFlow ops then). ``views``: the caller's
    :class:`Views` (role "grads"), else each tensor's memory is read anew."""
    if not _local(grads):
        return None
    lib = _lib("clip")
    arrays = None if lib is None else (views or Views()).arrays("grads", grads)
    if arrays is None:
        return None
    _calls["clip"] += 1
    return np.float32(math.sqrt(_sqsum(lib, arrays, train_kernels.threads())))


def scale(grads, coef, views: Views | None = None) -> bool:
    """``g *= coef`` (np.float32) for every tensor of ``grads``; False (nothing done) where the kernel
    does not apply."""
    if not _local(grads):
        return False
    lib = _lib("clip")
    arrays = None if lib is None else (views or Views()).arrays("grads", grads)
    if arrays is None or not _disjoint(arrays):
        return False
    lib.bert_of_multi_scale(*_Table(arrays).args(), float(coef), train_kernels.threads())
    return True


def adamw(params, grads, exp_avgs, exp_avg_sqs, *, lr, beta1, beta2, eps, weight_decay, bias_correction1,
          bias_correction2, views: Views | None = None, group=0) -> bool:
    """One AdamW step of one parameter group, as OneFlow's ``adam_update`` (no amsgrad; the scalars as
    its float attributes): parameters, moments updated in place. False (nothing done) where the kernel
    does not apply. ``views``: the optimizer's :class:`Views` (roles per ``group``)."""
    everything = [*params, *grads, *exp_avgs, *exp_avg_sqs]
    if not (_local(everything) and len(params) == len(grads) == len(exp_avgs) == len(exp_avg_sqs)):
        return False
    lib = _lib("adamw")
    if lib is None:
        return False
    views = views or Views()
    lists = [views.arrays((kind, group), ts) for kind, ts in zip("pgmv", (params, grads, exp_avgs, exp_avg_sqs))]
    if any(v is None for v in lists) or not _disjoint(*lists):
        return False
    if any(len({a.size for a in same}) != 1 for same in zip(*lists)):
        return False
    _run_adamw(lib, *lists, (lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2),
               train_kernels.threads())
    _calls["adamw"] += 1
    return True


def _run_adamw(lib, p, g, m, v, hyper, threads):
    """hyper: (lr, beta1, beta2, eps, weight decay, bias correction 1, 2); scale 1, l1 = l2 = 0 (OneFlow's)."""
    tables = [_Table(arrays) for arrays in (p, g, m, v)]
    lib.bert_of_multi_adamw(*tables[0].args(), *(t.ptrs.ctypes.data for t in tables[1:]), *map(float, hyper),
                            1.0, 0.0, 0.0, threads)


# --------------------------------------------------------------------------- the checks


def _arrays(rng, sizes, scale_=1.0):
    return [(rng.standard_normal(n) * scale_ * np.exp(rng.uniform(-8, 8))).astype(np.float32) for n in sizes]


SIZES = (0, 1, 7, 65536 * 2 + 3, 1000, 70001, 64)  # an empty tensor, ones across chunk boundaries


def _check_clip(lib):
    """The sum of squares within n 2^-53 of the exact (math.fsum of the float64 squares), the same
    bits on 1 thread and all; the scaling OneFlow's ``mul_`` bit for bit."""
    rng = np.random.default_rng(11)
    arrays = _arrays(rng, SIZES)
    exact = math.fsum(float(x) for a in arrays for x in (a.astype(np.float64) ** 2))
    n = sum(a.size for a in arrays)
    sums = {th: _sqsum(lib, arrays, th) for th in {1, 2, train_kernels.threads()}}
    if len(set(sums.values())) != 1:
        return "off: the sum of squares differs with the thread count"
    got = sums[1]
    if abs(got - exact) > n * 2.0 ** -53 * exact:
        return f"off: the sum of squares {got!r} is not the exact {exact!r} within n 2^-53"
    if _sqsum(lib, [np.zeros(5, np.float32)], 1) != 0.0:
        return "off: the sum of squares of zeros is not 0"
    coef = np.float32(0.3183099)
    want = [(flow.tensor(a).mul_(flow.tensor(coef))).numpy() for a in arrays]
    for th in sorted({1, train_kernels.threads()}):
        got_arrays = [a.copy() for a in arrays]
        lib.bert_of_multi_scale(*_Table(got_arrays).args(), float(coef), th)
        if not all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(got_arrays, want)):
            return f"off: the scaling differs from OneFlow's mul_ ({th} threads)"
    return None


def _check_adamw(lib):
    """Two steps of flow.optim.AdamW (OneFlow's adam_update) and of the kernel from the same start, with
    bias correction and weight decay and without: parameters, exp_avg and exp_avg_sq bit for bit."""
    rng = np.random.default_rng(12)
    sizes = (3, 65536 + 5, 1000)
    for bias_correction, wd, lr in ((True, 0.01, 1e-3), (False, 0.0, 5e-5)):
        start = _arrays(rng, sizes)
        grads = [_arrays(rng, sizes) for _ in range(2)]
        params = [flow.nn.Parameter(flow.tensor(a)) for a in start]
        opt = flow.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=wd,
                               do_bias_correction=bias_correction)
        for th in sorted({1, train_kernels.threads()}):
            p, m, v = [a.copy() for a in start], [np.zeros_like(a) for a in start], [np.zeros_like(a) for a in start]
            for step, gs in enumerate(grads):
                bc1 = 1.0 - 0.9 ** (step + 1) if bias_correction else 1.0
                bc2 = 1.0 - 0.999 ** (step + 1) if bias_correction else 1.0
                _run_adamw(lib, p, gs, m, v, (lr, 0.9, 0.999, 1e-6, wd, bc1, bc2), th)
            if th == 1:
                for gs in grads:
                    for t, gr in zip(params, gs):
                        t.grad = flow.tensor(gr)
                    opt.step()
            state = opt.state_dict()["state"]
            want = [(t.numpy(), state[i]["exp_avg"].numpy(), state[i]["exp_avg_sq"].numpy())
                    for i, t in enumerate(params)]
            for i, (wp, wm, wv) in enumerate(want):
                for name, x, y in (("parameters", p[i], wp), ("exp_avg", m[i], wm), ("exp_avg_sq", v[i], wv)):
                    if not np.array_equal(x.view(np.uint32), y.view(np.uint32)):
                        return (f"off: AdamW's {name} differ from OneFlow's adam_update (bias correction "
                                f"{bias_correction}, {th} threads)")
    return None


_CHECKS = {"clip": _check_clip, "adamw": _check_adamw}
