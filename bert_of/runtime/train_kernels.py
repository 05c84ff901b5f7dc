"""CPU kernels for training: the layer's LayerNorm(x + residual) and its intermediate dense layer's
GELU(a + bias) as autograd Functions whose forward and backward run :file:`cpu_train_kernels.c`,
one pass each over every core.

What OneFlow 0.9 does wrong: for a local eager CPU step with autograd, bert_of's LayerNorm is ~10
OneFlow ops forward (:func:`bert_of.runtime.kernels._layer_norm`: products with a ones vector, so
oneDNN vectorises them) and more backward, and a GELU is several, each a single-threaded pass over
the tensor (bench/op_profile_worker.py: LayerNorm fwd+bwd ~10x PyTorch's, GELU ~3x). The inference
kernels (:mod:`bert_of.runtime.kernels`) have no backward, so training ran OneFlow's ops throughout.
When no longer needed: when bench/op_profile_worker.py's OneFlow LayerNorm and GELU rows, run with
``BERT_OF_CPU_TRAIN_KERNELS=0``, are as fast as these.

They apply only to local eager float32 CPU tensors with autograd on (some input requiring grad);
inference keeps :mod:`bert_of.runtime.kernels`, graphs and CUDA OneFlow's ops. Each is checked on its
first use against float64 and OneFlow's ops, forward and gradients, and stays off with the reason in
:func:`train_status` where it does not hold:

- LayerNorm(x + residual): output within ``LAYER_NORM_ULPS`` float ulps of (|n w| + |b|) of the float64
  LayerNorm (n normalised); gradients within ``GRAD_ULPS`` ulps of their float64 magnitudes (sums
  of absolute terms, below); each no further from OneFlow's than OneFlow's is from float64 plus that.
- GELU(a + bias), exact or tanh: vectorised without libm (gelu_vec.h, the inference kernels' GELU too;
  OneFlow's CPU GELUs call libm's erff or exp per element), the output within ``GELU_ULPS`` float ulps of |a + bias| of the float64 GELU
  (the rounding of a + bias itself moves it by half an ulp of that); the input's and bias's
  gradients within GRAD_ULPS of their magnitudes, as above.

On by default: ``BERT_OF_CPU_TRAIN_KERNELS=0`` keeps OneFlow's ops for training steps
(``BERT_OF_CPU_KERNELS=0``: every CPU kernel).

What else OneFlow 0.9 does wrong, which these Functions work around: its ``FunctionCtx`` hands out
an attribute set on it (``ctx.saved = ...`` in the forward, read back in the backward) as a borrowed
reference where Python expects a new one (its getattro returns PyDict_GetItem's result), so every
``ctx.saved`` read drops the object's refcount by one: the object is freed while ctx's attribute dict
still points at it, and when the ctx dies the dict releases whatever lives at that address by then.
A step stopped by a non-finite loss keeps its graph, so its ctxs, alive in the exception's traceback
long enough for that address to hold a live object: a NaN step then more work in the process
corrupted the Python heap (PYTHONMALLOC=debug: a freed block's header overwritten; a segfault later,
in unrelated allocations; tests/integration/test_train_kernels.py runs that sequence). So the
backward reads it through :func:`_saved` (``object.__getattribute__``: Python's generic lookup,
which finds the same dict through the type's dict offset and returns a new reference), never as
``ctx.<name>`` (tests/unit/test_architecture.py holds every Function to that). Saving NumPy arrays
as tensors through ``ctx.save_for_backward`` would do too, but each ``numpy()`` of them in the
backward waits for OneFlow's VM (~1 ms of CPU at load 2-3, four per layer). When no longer needed:
when reading ``ctx.saved`` twice leaves the object's refcount as it was.

Shapes: T rows (B*S), H hidden, C columns (the intermediate size).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os

import numpy as np

import bert_of.runtime.kernels as kernels
import bert_of.runtime.native as native
from bert_of.runtime.blas import default_threads
from bert_of.runtime.flow_import import flow

F32_EPS = kernels.F32_EPS
LAYER_NORM_ULPS = kernels.LAYER_NORM_ULPS
GELU_ULPS = kernels.GELU_ULPS  # the GELU's output vs float64, in float ulps of |input| (gelu_vec.h, inference's too)
GRAD_ULPS = 16  # gradients vs float64, in float ulps of their magnitudes (each a few roundings of float inputs)
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = {
    "bert_of_ln_fwd": [_PTR] * 7 + [_I64, _I64, ctypes.c_double, ctypes.c_int],
    "bert_of_ln_bwd": [_PTR] * 8 + [_I64, _I64, ctypes.c_int],
    "bert_of_gelu_fwd": [_PTR] * 4 + [_I64, _I64, ctypes.c_int, ctypes.c_int],
    "bert_of_gelu_bwd": [_PTR] * 5 + [_I64, _I64, ctypes.c_int, ctypes.c_int],
}
_state = {"checked": False, "lib": None, "why": "not used yet", "threads": 1, "calls": 0, "kernels": {}, "paused": False}


def _lib():
    """cpu_train_kernels.c, built once per process; None, with the reason in :func:`train_status`."""
    if _state["checked"]:
        return _state["lib"]
    _state.update(checked=True, why=None)
    if os.environ.get("BERT_OF_CPU_KERNELS", "1") == "0":
        _state["why"] = "off (BERT_OF_CPU_KERNELS=0)"
        return None
    if os.environ.get("BERT_OF_CPU_TRAIN_KERNELS", "1") == "0":
        _state["why"] = "off (BERT_OF_CPU_TRAIN_KERNELS=0)"
        return None
    try:
        lib = ctypes.CDLL(native.build("cpu_train_kernels"))
    except OSError as e:
        _state["why"] = f"off: {e}"
        return None
    for name, argtypes in _ARGTYPES.items():
        getattr(lib, name).argtypes = argtypes
    _state.update(lib=lib, threads=default_threads())
    return lib


def _kernel(name: str):
    """The library when kernel ``name`` passed its check (run on its first use), else None."""
    if _state["paused"]:
        return None
    lib = _lib()
    if lib is None:
        return None
    if name not in _state["kernels"]:
        _state["kernels"][name] = "checking"
        _state["kernels"][name] = _CHECKS[name](lib)
    return lib if _state["kernels"][name] is None else None


def train_status() -> dict:
    """{"active": bool, "threads", "calls": forward calls so far, "off": {kernel: why} for kernels that
    failed their check, "why": when all are off}."""
    if _state["lib"] is None:
        return {"active": False, "why": _state["why"]}
    off = {k: v for k, v in _state["kernels"].items() if v is not None}
    return {"active": True, "threads": _state["threads"], "calls": _state["calls"], **({"off": off} if off else {})}


@contextlib.contextmanager
def off():
    """``with off():`` OneFlow's ops for the block, as with BERT_OF_CPU_TRAIN_KERNELS=0 (for A/B
    measurements in one process: bench/train_kernels_bench.py)."""
    before = _state["paused"]
    _state["paused"] = True
    try:
        yield
    finally:
        _state["paused"] = before


def trains(*tensors) -> bool:
    """Autograd on, local eager float32 CPU tensors (None skipped), at least one requiring grad."""
    if not flow.is_grad_enabled():
        return False
    grad = False
    for x in tensors:
        if x is None:
            continue
        if x.is_lazy or x.is_global or x.device.type != "cpu" or x.dtype != flow.float32:
            return False
        grad = grad or x.requires_grad
    return grad


def _arr(x) -> np.ndarray:
    """x's float32 values, C-contiguous (waits for x; shares its memory when contiguous)."""
    return np.ascontiguousarray(x.numpy())


def _run_ln_fwd(lib, x, r, w, b, eps, threads):
    """LayerNorm(x + r) of C-contiguous float32 arrays [T, H] (r may be None): y, x_hat [T, H], rstd [T]."""
    T, H = x.shape
    y, xhat, rstd = np.empty_like(x), np.empty_like(x), np.empty(T, np.float32)
    lib.bert_of_ln_fwd(x.ctypes.data, None if r is None else r.ctypes.data, w.ctypes.data, b.ctypes.data,
                       y.ctypes.data, xhat.ctypes.data, rstd.ctypes.data, T, H, eps, threads)
    return y, xhat, rstd


def _run_ln_bwd(lib, g, xhat, rstd, w, threads):
    """The LayerNorm's gradients for the output's g [T, H]: dx [T, H], dw, db [H]."""
    T, H = g.shape
    dx, dw, db = np.empty_like(g), np.empty(H, np.float32), np.empty(H, np.float32)
    part = np.empty(2 * max(threads, 1) * H, np.float64)
    lib.bert_of_ln_bwd(g.ctypes.data, xhat.ctypes.data, rstd.ctypes.data, w.ctypes.data, dx.ctypes.data,
                       dw.ctypes.data, db.ctypes.data, part.ctypes.data, T, H, threads)
    return dx, dw, db


def _run_gelu_fwd(lib, a, bias, op, threads):
    """GELU op of a [T, C] + bias [C] (or None): y and the saved a + bias, both [T, C]."""
    T, C = a.shape
    y, pre = np.empty_like(a), np.empty_like(a)
    lib.bert_of_gelu_fwd(a.ctypes.data, None if bias is None else bias.ctypes.data, y.ctypes.data, pre.ctypes.data,
                         T, C, op, threads)
    return y, pre


def _run_gelu_bwd(lib, g, pre, op, with_bias, threads):
    """GELU op's gradients for the output's g [T, C]: dx [T, C] and db [C] (None without a bias)."""
    T, C = g.shape
    dx = np.empty_like(g)
    db = np.empty(C, np.float32) if with_bias else None
    part = np.empty(max(threads, 1) * C, np.float64)
    lib.bert_of_gelu_bwd(g.ctypes.data, pre.ctypes.data, dx.ctypes.data, None if db is None else db.ctypes.data,
                         part.ctypes.data, T, C, op, threads)
    return dx, db


def _saved(ctx):
    """What the forward set as ``ctx.saved``, read through Python's generic attribute lookup (a new
    reference): never as ``ctx.saved``, which OneFlow 0.9's ctx hands out as a borrowed one (the
    module's docstring). An attribute kept anywhere but ctx's instance dict raises AttributeError."""
    return object.__getattribute__(ctx, "saved")


@functools.lru_cache(maxsize=None)
def _layer_norm_fn(eps: float, has_res: bool):
    """The autograd Function of LayerNorm(x + residual) with this eps (OneFlow 0.9's ``apply`` takes
    only tensors, and a None among them crashes it): apply(x [..., H], residual [..., H] (only
    ``has_res``), weight [H], bias [H]) -> [..., H]. Its forward saves x_hat [T, H] and rstd [T]
    (NumPy, the kernel's own layout) for the backward."""

    def forward(ctx, x, *rest):
        residual, weight, bias = rest if has_res else (None, *rest)
        shape, H = tuple(x.shape), x.shape[-1]
        a = _arr(x).reshape(-1, H)
        r = None if residual is None else _arr(residual).reshape(-1, H)
        w = _arr(weight)
        y, xhat, rstd = _run_ln_fwd(_state["lib"], a, r, w, _arr(bias), eps, _state["threads"])
        ctx.saved = (xhat, rstd, w, shape)
        _state["calls"] += 1
        return flow.from_numpy(y.reshape(shape))

    def backward(ctx, dy):
        xhat, rstd, w, shape = _saved(ctx)
        dx, dw, db = _run_ln_bwd(_state["lib"], _arr(dy).reshape(xhat.shape), xhat, rstd, w, _state["threads"])
        dx = flow.from_numpy(dx.reshape(shape))
        return (dx, dx, flow.from_numpy(dw), flow.from_numpy(db)) if has_res else (dx, flow.from_numpy(dw),
                                                                                    flow.from_numpy(db))

    return type("LayerNormFunction", (flow.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


@functools.lru_cache(maxsize=None)
def _gelu_fn(op: int, has_bias: bool):
    """The autograd Function of GELU op (0 exact, 1 tanh): apply(a [..., C], bias [C] (only
    ``has_bias``)) -> GELU(a + bias) [..., C]; its forward saves a + bias (NumPy)."""

    def forward(ctx, a, *rest):
        bias = rest[0] if has_bias else None
        shape, C = tuple(a.shape), a.shape[-1]
        y, pre = _run_gelu_fwd(_state["lib"], _arr(a).reshape(-1, C), None if bias is None else _arr(bias), op,
                               _state["threads"])
        ctx.saved = (pre, shape)
        _state["calls"] += 1
        return flow.from_numpy(y.reshape(shape))

    def backward(ctx, dy):
        pre, shape = _saved(ctx)
        dx, db = _run_gelu_bwd(_state["lib"], _arr(dy).reshape(pre.shape), pre, op, has_bias, _state["threads"])
        dx = flow.from_numpy(dx.reshape(shape))
        return (dx, flow.from_numpy(db)) if has_bias else dx

    return type("GeluFunction", (flow.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


class LayerNorm(kernels.LayerNorm):
    """:class:`bert_of.runtime.kernels.LayerNorm` (same parameters, formula and state dict), whose
    forward for a local eager float32 CPU step with autograd runs cpu_train_kernels.c forward and
    backward; everything else as its parent (inference kernels, OneFlow's ops in graphs, on CUDA)."""

    def forward(self, x, residual=None):
        """LayerNorm(x + residual) (residual optional): x [..., H] -> [..., H]."""
        if (trains(x, residual, self.weight, self.bias) and x.ndim >= 2
                and (residual is None or tuple(residual.shape) == tuple(x.shape))
                and _kernel("layer_norm") is not None):
            args = (x, self.weight, self.bias) if residual is None else (x, residual, self.weight, self.bias)
            return _layer_norm_fn(float(self.eps), residual is not None).apply(*args)
        # the parent's by name: in a graph ``self`` is OneFlow's proxy of the module, which super() refuses
        return kernels.LayerNorm.forward(self, x, residual)


def gelu_bias(a, bias, op: int):
    """GELU op (0 exact, 1 tanh) of ``a + bias`` for a training step on CPU (a [..., C], bias [C] or
    None) by cpu_train_kernels.c, forward and backward; None where it does not apply (the caller runs
    OneFlow's ops)."""
    if not (trains(a, bias) and a.ndim >= 1 and (bias is None or tuple(bias.shape) == (a.shape[-1],))):
        return None
    if _kernel("gelu") is None:
        return None
    return _gelu_fn(op, bias is not None).apply(*((a,) if bias is None else (a, bias)))


def dense_act(linear, x, act):
    """``act(linear(x))``: x [..., in] -> [..., out]. For a training step on CPU with a GELU
    (:func:`~bert_of.runtime.kernels.gelu_erf` or ``gelu_tanh``), the bias add rides in the GELU's kernel (one pass forward, its gradient's row sums
    in the backward's): OneFlow's matmul, then cpu_train_kernels.c."""
    op = _GELU_OP.get(act)
    if op is not None and linear.bias is not None and trains(x, linear.weight, linear.bias):
        y = gelu_bias(flow.matmul(x, linear.weight, transpose_b=True), linear.bias, op)
        if y is not None:
            return y
    return act(linear(x))


# the model's GELUs (the inference kernels' functions: what kernels.layer_spec recognises too)
_GELU_OP = {kernels.gelu_erf: 0, kernels.gelu_tanh: 1}


# --------------------------------------------------------------------------- the checks


def _grads(fn, inputs, dy):
    """OneFlow's gradients of sum(fn(*inputs) * dy) for NumPy inputs: the output and each input's grad."""
    ts = [flow.tensor(v, requires_grad=True) for v in inputs]
    y = fn(*ts)
    (y * flow.tensor(dy)).sum().backward()
    return [y.numpy()] + [t.grad.numpy() for t in ts]


_same_bits = kernels._same_bits


def _within(got, ref, theirs, mag, ulps) -> bool:
    """got within ulps x 2^-24 x mag of the float64 ref, and as near OneFlow's as that is to ref."""
    bound = ulps * F32_EPS * mag
    return bool((np.abs(got - ref) <= bound).all() and (np.abs(got - theirs) <= np.abs(theirs - ref) + bound).all())


def _ln_ref(t, w, b, g, eps):
    """Float64 LayerNorm of t [T, H] and its gradients for the output's g: y, dt, dw, db and their
    magnitudes (the sums of the absolute values of the terms each is made of)."""
    t, w, b, g = (np.asarray(v, np.float64) for v in (t, w, b, g))
    H = t.shape[-1]
    m = t.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((t - m) ** 2).mean(-1, keepdims=True) + eps)
    n = (t - m) * rstd
    gw = g * w
    dt = rstd * (gw - gw.mean(-1, keepdims=True) - n * (gw * n).mean(-1, keepdims=True))
    # x_hat is rounded to float: each term carries an error of a few ulps of |n| (and rstd's)
    dt_mag = rstd * (np.abs(gw) + np.abs(gw).sum(-1, keepdims=True) / H
                     + np.abs(n) * (np.abs(gw * n)).sum(-1, keepdims=True) / H * 2)
    return ((n * w + b, np.abs(n * w) + np.abs(b)), (dt, dt_mag), ((g * n).sum(0), np.abs(g * n).sum(0) * 2),
            (g.sum(0), np.abs(g).sum(0)))


def _check_layer_norm(lib):
    """Forward and gradients of LayerNorm(x + r) against float64 and bert_of's LayerNorm in OneFlow's
    ops (a constant row, a row at 1e4, H not a multiple of 8, 1 thread and all)."""
    rng = np.random.default_rng(7)
    for T, H in ((45, 384), (7, 37)):
        x = (rng.standard_normal((T, H)) * 3 + 1).astype(np.float32)
        r = rng.standard_normal((T, H)).astype(np.float32)
        x[0], r[0] = 0.0, 0.0  # variance 0: eps alone
        x[1] *= 1e4
        w = (rng.standard_normal(H) * 0.5 + 1).astype(np.float32)
        b = (rng.standard_normal(H) * 0.1).astype(np.float32)
        g = rng.standard_normal((T, H)).astype(np.float32)
        eps = 1e-12
        ln = kernels.LayerNorm(H, eps=eps)
        of = _grads(lambda x_, r_, w_, b_: kernels._layer_norm(
            _Params(w_, b_, eps, ln), x_ + r_), (x, r, w, b), g)
        t = (flow.tensor(x) + flow.tensor(r)).numpy()
        refs = _ln_ref(t, w, b, g, eps)
        for th in {1, _state["threads"]}:
            y, xhat, rstd = _run_ln_fwd(lib, x, r, w, b, eps, th)
            dx, dw, db = _run_ln_bwd(lib, g, xhat, rstd, w, th)
            for name, got, theirs, (ref, mag), ulps in (
                    ("output", y, of[0], refs[0], LAYER_NORM_ULPS), ("x's gradient", dx, of[1], refs[1], GRAD_ULPS),
                    ("residual's gradient", dx, of[2], refs[1], GRAD_ULPS),
                    ("weight's gradient", dw, of[3], refs[2], GRAD_ULPS), ("bias's gradient", db, of[4], refs[3], GRAD_ULPS)):
                if not _within(got, ref, theirs, mag, ulps):
                    return f"off: LayerNorm's {name} beyond {ulps} ulps of float64 or OneFlow's ({th} threads, H {H})"
    return None


class _Params:
    """What kernels._layer_norm reads of its module, for tensors the check differentiates."""

    def __init__(self, weight, bias, eps, ln):
        self.weight, self.bias, self.eps = weight, bias, eps
        self.ones_row, self.ones_col = ln.ones_row, ln.ones_col


def _gelu_ref(s, g, op):
    """Float64 d/ds of GELU op times g, and its magnitude."""
    s, g = np.asarray(s, np.float64), np.asarray(g, np.float64)
    if op == 0:
        cdf = 0.5 * (1 + np.vectorize(math.erf)(s / math.sqrt(2)))
        d = cdf + s * np.exp(-0.5 * s * s) / math.sqrt(2 * math.pi)
        mag = cdf + np.abs(s) * np.exp(-0.5 * s * s) / math.sqrt(2 * math.pi)
    else:
        c, a = 2 * math.sqrt(2 / math.pi), 0.044715
        with np.errstate(over="ignore"):  # exp(inf): sg 0, as it should be
            sg = 1 / (1 + np.exp(-c * (s + a * s ** 3)))
        d = sg + s * sg * (1 - sg) * c * (1 + 3 * a * s * s)
        mag = sg + np.abs(s) * sg * (1 - sg) * c * (1 + 3 * a * s * s)
    # s itself is a float (a + bias rounded): its ulp moves GELU' by |s GELU''| <~ 1 of the magnitude
    return g * d, np.abs(g) * (mag + 1)


_gelu64 = kernels.gelu64  # the float64 GELU op of s


def _check_gelu(lib):
    """GELU(a + bias), both ops: the output within GELU_ULPS of |a + bias| of float64 and as near
    OneFlow's (bias add then bert_of's GELU in OneFlow's ops) as that is to float64; a's and the
    bias's gradients within GRAD_ULPS of float64 and OneFlow's."""
    rng = np.random.default_rng(8)
    T, C = 33, 517
    a = (rng.standard_normal((T, C)) * 3).astype(np.float32)
    a[0, :6] = [0.0, -0.0, 1e-39, 30.0, -30.0, 1e-30]
    bias = (rng.standard_normal(C) * 0.5).astype(np.float32)
    g = rng.standard_normal((T, C)).astype(np.float32)
    for op in (0, 1):
        of = _grads(lambda a_, b_: kernels._ONEFLOW_GELU[op](a_ + b_), (a, bias), g)
        s = (flow.tensor(a) + flow.tensor(bias)).numpy()
        da, da_mag = _gelu_ref(s, g, op)
        refs = ((da, da_mag), (da.sum(0), np.abs(da_mag).sum(0)))
        for th in {1, _state["threads"]}:
            y, pre = _run_gelu_fwd(lib, a, bias, op, th)
            if not (_same_bits(pre, s) and _within(y, _gelu64(s, op), of[0], np.abs(s), GELU_ULPS)):
                return f"off: GELU (op {op}) beyond {GELU_ULPS} ulps of float64 or OneFlow's ({th} threads)"
            dx, db = _run_gelu_bwd(lib, g, pre, op, True, th)
            for name, got, theirs, (ref, mag) in (("input's", dx, of[1], refs[0]), ("bias's", db, of[2], refs[1])):
                if not _within(got, ref, theirs, mag, GRAD_ULPS):
                    return f"off: GELU's (op {op}) {name} gradient beyond {GRAD_ULPS} ulps of float64 or OneFlow's ({th} threads)"
    return None


_CHECKS = {"layer_norm": _check_layer_norm, "gelu": _check_gelu}
