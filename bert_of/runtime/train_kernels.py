"""CPU kernels for training: the layer's LayerNorm(x + residual), its intermediate dense layer's
GELU(a + bias), the dropouts, the attention's softmax(scores + mask) with its dropout, the heads'
split and merge and the attention's whole core as autograd Functions whose forward and backward run
:file:`cpu_train_kernels.c`, one pass each over every core (the core's GEMMs: the BLAS's batched one).

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
- Dropout, and softmax(scores + mask [B, 1, 1, S]) with its dropout (the section below): masks of the
  same rate drawn by a counter-based hash from a seed of the module's generator, not OneFlow's draws
  (``BERT_OF_CPU_DROPOUT=0`` keeps OneFlow's dropout, softmax and mask add); the probabilities within
  ``SOFTMAX_ULPS`` of P (1 + |t - row max|) of float64, the scores' gradient within GRAD_ULPS.
- From ATTENTION_MIN_TOKENS (384) tokens (``BERT_OF_CPU_TRAIN_ATTENTION_TOKENS``), the two below.
- The heads' split (a Linear's output plus its bias as [B, N, S, D]) and merge, one pass each way
  (``BERT_OF_CPU_HEADS=0``: OneFlow's reshape and permute): OneFlow's bits; the bias's gradient
  within GRAD_ULPS.
- The attention's core, dropout(softmax(q k^T scale + mask)) v with the heads merged, its GEMMs the
  BLAS's batched routine around the softmax kernel (``BERT_OF_CPU_TRAIN_ATTENTION=0``: OneFlow's
  batched matmuls): output and gradients within GRAD_ULPS of magnitudes carried through the chain.

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

Shapes: T rows (B*S), H hidden, C columns (the intermediate size); B batch, N heads, S tokens, D head size.
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
from bert_of.runtime.blas import batched_sgemm, default_threads
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
_state = {"checked": False, "lib": None, "why": "not used yet", "threads": 1, "calls": 0, "kernels": {}, "paused": False,
          "recheck": False}


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
        path = native.build("cpu_train_kernels")
        lib = ctypes.CDLL(path)
    except OSError as e:
        _state["why"] = f"off: {e}"
        return None
    for name, argtypes in _ARGTYPES.items():
        getattr(lib, name).argtypes = argtypes
    threads = default_threads()
    _state.update(lib=lib, threads=threads, verdicts=native.Verdicts(path, kernels.verdict_context(threads),
                                                                     recheck=_state["recheck"]))
    return lib


def check_again() -> None:
    """Every training kernel's first-use check runs again at its next use in this process, whatever
    verdicts were kept beside the library (``bert-of selftest``)."""
    _state.update(checked=False, lib=None, why="not used yet", kernels={}, verdicts=None, recheck=True)


def _kernel(name: str, check=None):
    """The library when kernel ``name`` passed its check (run on its first use), else None.
    ``check(lib)`` (None: this module's own for ``name``) -> None when it holds, else why not."""
    if _state["paused"]:
        return None
    lib = _lib()
    if lib is None:
        return None
    if name not in _state["kernels"]:
        _state["kernels"][name] = "checking"
        calls = _state["calls"]
        # the verdict kept beside the library (native.Verdicts), else the check run now
        why = _state["verdicts"].check(name, lambda: (check or _CHECKS[name])(lib))
        _state.update(calls=calls)  # a check's own kernel calls are not the caller's
        _state["kernels"][name] = why
    return lib if _state["kernels"][name] is None else None


kernel = _kernel  # for the step's update kernels (bert_of.runtime.update_kernels): the same library and checks


def threads() -> int:
    """The training kernels' thread count (after the library loaded)."""
    return _state["threads"]


def train_status() -> dict:
    """{"active": bool, "threads", "calls": forward calls so far (not the checks'), "verdicts_kept": checks
    whose verdict was read from beside the library instead of run, "on": the kernels asked for that
    passed their check (sorted), "off": {kernel: why} for kernels that failed their check, "why": when
    all are off}."""
    if _state["lib"] is None:
        return {"active": False, "why": _state["why"]}
    off = {k: v for k, v in _state["kernels"].items() if v is not None}
    return {"active": True, "threads": _state["threads"], "calls": _state["calls"],
            "verdicts_kept": _state["verdicts"].hits, "on": sorted(k for k, v in _state["kernels"].items() if v is None),
            **({"off": off} if off else {})}


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


# --------------------------------------------------------------------------- dropout, softmax + dropout
#
# OneFlow 0.9's CPU dropout draws its mask element by element from the module's generator on one thread
# (bench/train_step_profile.py: 16 ms forward for one MiniLM layer's attention probabilities at
# 8 x 12 x 128 x 128, more than its softmax and both batched matmuls); its softmax, the mask add and
# their backward are single-threaded passes too. cpu_train_kernels.c's dropout keeps element i when a
# counter-based hash of (i, the call's seed) clears the threshold, so the backward recomputes the mask
# from the seed; the seed is drawn from the dropout module's generator (bert_of's model gives all its
# dropouts one, the trainer seeds it), so runs repeat and a checkpoint's generator state resumes them.
# The masks are not OneFlow's (the same rate, other draws): ``BERT_OF_CPU_DROPOUT=0`` keeps OneFlow's
# dropout, softmax and mask add (its draws).

DROPOUT_BITS = 24  # the mask's uniform: a keep threshold of p 2^24
SOFTMAX_ULPS = 8  # probabilities vs float64, in float ulps of P (1 + |score - row max|): exp, sum, division
_ARGTYPES.update({
    "bert_of_dropout": [_PTR, _PTR, _I64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_float,
                        ctypes.c_int],
    "bert_of_softmax_dropout_fwd": [_PTR] * 4 + [_I64, _I64, _I64, ctypes.c_uint32, ctypes.c_uint32,
                                                 ctypes.c_uint32, ctypes.c_float, ctypes.c_int],
    "bert_of_softmax_dropout_bwd": [_PTR] * 3 + [_I64, _I64, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                                 ctypes.c_float, ctypes.c_int],
})
_seeds: dict = {}  # id(generator) -> (generator, its initial seed, calls drawn since)
_mask: list = [None, None]  # the last mask_adder tensor (kept, so its id stays its own) and its rows


def _dropout_consts(p: float):
    """(thr, scale) of dropout rate p: keep when the 24-bit uniform >= thr; kept values times scale
    (1 / (1 - p) rounded to float, OneFlow's)."""
    return int(round(p * (1 << DROPOUT_BITS))), float(np.float32(1.0 / (1.0 - p)))


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that scatters nearby inputs."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class DropoutGenerator(type(flow.Generator())):
    """OneFlow's generator (device "auto", as ``flow.Generator()``) for a model's dropouts, which also
    counts the dropout kernels' calls since it was last seeded: seeding it (``manual_seed``, also with
    the seed it has, or ``set_state``) restarts the count, so the kernels' masks repeat as OneFlow's
    draws would."""

    def __init__(self, device: str = "auto"):
        super().__init__(device)
        self.kernel_calls = 0

    def manual_seed(self, seed):
        self.kernel_calls = 0
        return super().manual_seed(seed)

    def set_state(self, state):
        self.kernel_calls = 0
        return super().set_state(state)


def _seed(generator):
    """The next call's stream (s0, s1) for a dropout drawing from ``generator`` (None: OneFlow's
    default): a hash of the generator's seed and the number of calls since it was seeded (a
    :class:`DropoutGenerator`, bert_of's models'), or since a call found it with another seed (any
    other generator: seeding it again with the seed it has does not restart the count). No draw from the generator itself (reading a tensor waits for OneFlow's VM, ~4 ms on a loaded machine): the trainer seeds
    the model's generator every step from (seed, step, rank), so a step's masks follow from those
    and resumes replay."""
    g = flow.default_generator if generator is None else generator
    seed = int(g.initial_seed())
    if isinstance(g, DropoutGenerator):  # bert_of's models: the count since its last seeding
        n, g.kernel_calls = g.kernel_calls, g.kernel_calls + 1
    else:  # another generator: the count since it took another seed
        held = _seeds.get(id(g))
        n = held[2] + 1 if held is not None and held[0] is g and held[1] == seed else 0
        if len(_seeds) > 64:  # generators come and go with models: keep the recent
            _seeds.clear()
        _seeds[id(g)] = (g, seed, n)
    x = _mix64((seed * 0x9E3779B97F4A7C15 + n) & 0xFFFFFFFFFFFFFFFF)
    return x & 0xFFFFFFFF, x >> 32


def _mask_rows(mask_adder, B: int, S: int):
    """mask_adder [B, 1, 1, S] as a C-contiguous [B, S] array: read once for all the layers of a step
    (each read waits for OneFlow's VM)."""
    if _mask[0] is not mask_adder:
        _mask[:] = [mask_adder, _arr(mask_adder).reshape(B, S)]
    return _mask[1]


def _run_dropout(lib, x, seed, thr, scale, threads, y=None):
    """dropout of the C-contiguous float32 array x (any shape) with seed (s0, s1): a new array (or ``y``)."""
    y = np.empty_like(x) if y is None else y
    lib.bert_of_dropout(x.ctypes.data, y.ctypes.data, x.size, seed[0], seed[1], thr, scale, threads)
    return y


def _run_softmax_fwd(lib, x, mask, rows_per_mask, seed, thr, scale, threads, y=None):
    """softmax(x + mask) over the last axis of x [R, S] (mask [R / rows_per_mask, S] or None), and
    its dropout (None when thr is 0; into ``y`` [R, S] when given): P, y."""
    R, S = x.shape
    P = np.empty_like(x)
    y = None if not thr else np.empty_like(x) if y is None else y
    lib.bert_of_softmax_dropout_fwd(x.ctypes.data, None if mask is None else mask.ctypes.data, P.ctypes.data,
                                    None if y is None else y.ctypes.data, R, S, rows_per_mask, seed[0], seed[1], thr,
                                    scale, threads)
    return P, y


def _run_softmax_bwd(lib, g, P, seed, thr, scale, threads, dx=None):
    """The scores' gradient [R, S] for the output's g [R, S] (into ``dx``, which may be g, when given)."""
    R, S = g.shape
    dx = np.empty_like(g) if dx is None else dx
    lib.bert_of_softmax_dropout_bwd(g.ctypes.data, P.ctypes.data, dx.ctypes.data, R, S, seed[0], seed[1], thr,
                                    scale, threads)
    return dx


def _apply(name: str, forward, backward, *inputs):
    """OneFlow's autograd Function call (what ``Function.apply`` runs) with this call's own forward
    and backward closures (inputs: tensors only). What the backward needs (NumPy arrays, the seed)
    stays in the closures, which OneFlow holds until the graph is released: nothing on ``ctx`` (see
    the module's docstring) and no saved tensor read back through ``numpy()`` (each waits for
    OneFlow's VM, ~4 ms on a loaded machine), and no lookup of the call's state by key."""
    return flow._oneflow_internal.autograd.AutogradFunctionBase.apply(name, forward, backward, *inputs)


def _dropout_call(x, seed, thr: int, scale: float):
    """dropout(x) [...] with stream ``seed`` as an autograd Function."""
    lib, threads = _state["lib"], _state["threads"]

    def forward(ctx, x_):
        _state["calls"] += 1
        return flow.from_numpy(_run_dropout(lib, _arr(x_), seed, thr, scale, threads))

    def backward(ctx, dy):
        return flow.from_numpy(_run_dropout(lib, _arr(dy), seed, thr, scale, threads))

    return _apply("DropoutFunction", forward, backward, x)


def _softmax_dropout_call(scores, mask, seed, thr: int, scale: float):
    """dropout(softmax(scores + mask)) over the last axis of scores [B, N, Sq, S] (mask [B, S] rows or
    None) as an autograd Function; P stays for the backward."""
    lib, threads = _state["lib"], _state["threads"]
    saved = []

    def forward(ctx, x):
        shape = tuple(x.shape)
        a = _arr(x).reshape(-1, shape[-1])
        rows = a.shape[0] // mask.shape[0] if mask is not None else 1
        P, y = _run_softmax_fwd(lib, a, mask, rows, seed, thr, scale, threads)
        saved.append(P)
        _state["calls"] += 1
        return flow.from_numpy((P if y is None else y).reshape(shape))

    def backward(ctx, dy):
        P = saved[0]
        dx = _run_softmax_bwd(lib, _arr(dy).reshape(P.shape), P, seed, thr, scale, threads)
        return flow.from_numpy(dx.reshape(tuple(dy.shape)))

    return _apply("SoftmaxDropoutFunction", forward, backward, scores)


def _dropout_on() -> bool:
    return os.environ.get("BERT_OF_CPU_DROPOUT", "1") != "0"


def dropout(module, x):
    """``module(x)`` for an ``nn.Dropout`` module: for a training step on CPU with p > 0,
    cpu_train_kernels.c's dropout (its own draws, see above) forward and backward; otherwise the
    module (OneFlow's)."""
    p = float(module.p)
    if not (module.training and 0.0 < p < 1.0 and _dropout_on() and trains(x)) or _kernel("dropout") is None:
        return module(x)
    thr, scale = _dropout_consts(p)
    return _dropout_call(x, _seed(getattr(module, "generator", None)), thr, scale)


def softmax_dropout(scores, mask_adder, module):
    """``module(softmax(scores + mask_adder, -1))`` for the attention's probabilities in a training step
    on CPU (scores [B, N, Sq, S], mask_adder [B, 1, 1, S] or None, ``module`` its ``nn.Dropout``),
    forward and backward by cpu_train_kernels.c; None where it does not apply (the caller runs
    OneFlow's ops)."""
    if not (_dropout_on() and scores.ndim == 4 and trains(scores)):
        return None
    B, S = scores.shape[0], scores.shape[-1]
    if mask_adder is not None and (tuple(mask_adder.shape) != (B, 1, 1, S) or mask_adder.requires_grad
                                   or not trains(mask_adder, scores)):  # the kernel gives the mask no gradient
        return None
    p = float(module.p) if module.training else 0.0
    if not 0.0 <= p < 1.0 or _kernel("softmax_dropout") is None:
        return None
    thr, scale = _dropout_consts(p)
    mask = None if mask_adder is None else _mask_rows(mask_adder, B, S)
    return _softmax_dropout_call(scores, mask, _seed(getattr(module, "generator", None)) if thr else (0, 0), thr,
                                 scale)


def _check_dropout(lib):
    """The dropout's rate over 2^16 elements within 6 sigma of p, kept values x * scale exactly (OneFlow's
    product), the rest 0, the same draws on 1 thread and all, other draws for another seed."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal(1 << 16).astype(np.float32) + 2.0
    for p in (0.1, 0.5):
        thr, scale = _dropout_consts(p)
        ys = [_run_dropout(lib, x, (12345, 678), thr, scale, th) for th in {1, _state["threads"]}]
        y = ys[0]
        kept = y != 0
        rate = 1.0 - kept.mean()
        if abs(rate - p) > 6 * math.sqrt(p * (1 - p) / x.size):
            return f"off: dropout's rate {rate:.4f}, not {p}"
        if not (_same_bits(y[kept], x[kept] * np.float32(scale)) and all(_same_bits(v, y) for v in ys)):
            return "off: dropout's kept values differ from x * scale, or with the thread count"
        other = _run_dropout(lib, x, (12346, 678), thr, scale, _state["threads"])
        if ((other != 0) == kept).mean() > 1 - p * (1 - p):  # another seed: other draws
            return "off: dropout's mask does not change with the seed"
    return None


def _check_softmax_dropout(lib):
    """softmax(x + mask) within SOFTMAX_ULPS of P (1 + |x + mask - row max|) of float64 and as near OneFlow's
    softmax as that is; its dropout the dropout kernel's mask times scale; the scores' gradient (with
    and without dropout) within GRAD_ULPS of float64 and OneFlow's (softmax, then OneFlow's product
    with the same mask)."""
    rng = np.random.default_rng(10)
    B, N, Sq, S = 2, 3, 5, 37
    x = (rng.standard_normal((B, N, Sq, S)) * 4).astype(np.float32)
    x[0, 0, 0] = 0.0
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., 30:] = -10000.0
    g = rng.standard_normal((B, N, Sq, S)).astype(np.float32)
    t = (flow.tensor(x) + flow.tensor(mask)).numpy().astype(np.float64)
    e = np.exp(t - t.max(-1, keepdims=True))
    P64 = e / e.sum(-1, keepdims=True)
    # t - max is a float: its rounding moves P by |t - max| ulps of P (OneFlow's softmax as much)
    P_mag = P64 * (1 + np.abs(t - t.max(-1, keepdims=True)))
    for p in (0.0, 0.1):
        thr, scale = _dropout_consts(p)
        keep = (_run_dropout(lib, np.ones(x.size, np.float32), (77, 88), thr, 1.0, 1) != 0).reshape(x.shape)
        km = keep.astype(np.float32) * np.float32(scale)
        of = _grads(lambda x_: flow.softmax(x_ + flow.tensor(mask), dim=-1) * flow.tensor(km), (x,), g)
        ofP = flow.softmax(flow.tensor(x) + flow.tensor(mask), dim=-1).numpy()
        gk = g.astype(np.float64) * km
        dx64 = P64 * (gk - (gk * P64).sum(-1, keepdims=True))
        dx_mag = P_mag * (np.abs(gk) + np.abs(gk * P64).sum(-1, keepdims=True))  # P's rounding, as above
        for th in {1, _state["threads"]}:
            P, y = _run_softmax_fwd(lib, x.reshape(-1, S), mask.reshape(B, S), N * Sq, (77, 88), thr, scale, th)
            P = P.reshape(x.shape)
            if not _within(P, P64, ofP, P_mag, SOFTMAX_ULPS):
                return f"off: softmax beyond {SOFTMAX_ULPS} ulps of float64 or OneFlow's ({th} threads)"
            if y is not None and not _same_bits(y.reshape(x.shape), P * km):
                return "off: softmax's dropout is not the dropout kernel's mask times scale"
            dx = _run_softmax_bwd(lib, g.reshape(-1, S), P.reshape(-1, S), (77, 88), thr, scale, th).reshape(x.shape)
            if not _within(dx, dx64, of[1], dx_mag, GRAD_ULPS):
                return f"off: softmax's gradient beyond {GRAD_ULPS} ulps of float64 or OneFlow's (p {p}, {th} threads)"
    return None


_CHECKS.update(dropout=_check_dropout, softmax_dropout=_check_softmax_dropout)


# --------------------------------------------------------------------------- the heads' split and merge
#
# OneFlow 0.9's backward of the heads' split (reshape [B, S, H] -> [B, S, N, D], permute to [B, N, S, D])
# makes the permuted gradient contiguous in a single-threaded strided copy (~60 ms of CPU for one of a
# MiniLM layer's three at 8 x 384 tokens: five times its Linear's GEMMs backward,
# bench/train_backward_ops.py), and the Linear's bias gradient is one more single-threaded pass. Here
# the split with the bias add, and the merge, are one pass of cpu_train_kernels.c each way (every core),
# the bias's gradient the split's backward's row sums; the forward's output is contiguous, so the
# batched matmuls after it copy nothing. ``BERT_OF_CPU_HEADS=0`` keeps OneFlow's reshape and permute.

_ARGTYPES.update({
    "bert_of_heads_split": [_PTR] * 3 + [_I64] * 4 + [ctypes.c_int],
    "bert_of_heads_merge": [_PTR] * 4 + [_I64] * 4 + [ctypes.c_int],
})


def _run_heads_split(lib, x, bias, N, threads):
    """x [B, S, N*D] (+ bias [N*D] or None) as heads [B, N, S, D]."""
    B, S, H = x.shape
    y = np.empty((B, N, S, H // N), np.float32)
    lib.bert_of_heads_split(x.ctypes.data, None if bias is None else bias.ctypes.data, y.ctypes.data, B, S, N,
                            H // N, threads)
    return y


def _run_heads_merge(lib, x, with_bias, threads):
    """Heads x [B, N, S, D] merged to [B, S, N*D], and (``with_bias``) its sum over B and S [N*D] (else None)."""
    B, N, S, D = x.shape
    y = np.empty((B, S, N * D), np.float32)
    db = np.empty(N * D, np.float32) if with_bias else None
    part = np.empty(max(threads, 1) * N * D, np.float64) if with_bias else None
    lib.bert_of_heads_merge(x.ctypes.data, y.ctypes.data, None if db is None else db.ctypes.data,
                            None if part is None else part.ctypes.data, B, S, N, D, threads)
    return y, db


# From how many tokens the heads' and the core's Functions serve (below, OneFlow's ops). Each Function
# waits for OneFlow's VM to finish its inputs, where OneFlow's own ops queue and run beside the
# Python thread's work: at fewer tokens on a quiet machine the waits cost more than the batched GEMM
# saves (a MiniLM step at batch 8 with them vs without, load ~1-2: at 128 tokens forward 240 vs 190 ms,
# backward 302 vs 247; at 256 336 vs 365 and 612 vs 544); at 384 the per-matrix GEMMs' thread waits
# dominate and they win (1002 vs 1273 and 881 vs 1013 ms; under load 5 forward CPU 1.6 vs 3.2-3.8 s,
# backward 3.0 vs 4.6-5.6 s: docs/benchmarks.md, 2026-12-06 17:55).
# ``BERT_OF_CPU_TRAIN_ATTENTION_TOKENS`` sets another (1: always, as the tests do at their few tokens).
ATTENTION_MIN_TOKENS = 384


def _min_tokens() -> int:
    try:
        return int(os.environ.get("BERT_OF_CPU_TRAIN_ATTENTION_TOKENS", ATTENTION_MIN_TOKENS))
    except ValueError:
        return ATTENTION_MIN_TOKENS


def _heads_on(tokens: int) -> bool:
    return tokens >= _min_tokens() and os.environ.get("BERT_OF_CPU_HEADS", "1") != "0"


def _split_call(a, bias, N: int):
    """a [B, S, N*D] + bias [N*D] as heads [B, N, S, D], an autograd Function (a's and bias's gradients)."""
    lib, threads = _state["lib"], _state["threads"]

    def forward(ctx, a_, b_):
        _state["calls"] += 1
        return flow.from_numpy(_run_heads_split(lib, _arr(a_), _arr(b_), N, threads))

    def backward(ctx, dy):
        da, db = _run_heads_merge(lib, _arr(dy), True, threads)
        return flow.from_numpy(da), flow.from_numpy(db)

    return _apply("SplitHeadsFunction", forward, backward, a, bias)


def _merge_call(x):
    """Heads x [B, N, S, D] merged to [B, S, N*D], an autograd Function."""
    lib, threads = _state["lib"], _state["threads"]
    N = x.shape[1]

    def forward(ctx, x_):
        _state["calls"] += 1
        return flow.from_numpy(_run_heads_merge(lib, _arr(x_), False, threads)[0])

    def backward(ctx, dy):
        return flow.from_numpy(_run_heads_split(lib, _arr(dy), None, N, threads))

    return _apply("MergeHeadsFunction", forward, backward, x)


def split_heads(linear, x, num_heads: int):
    """``linear(x)`` split into heads: x [B, S, in] -> [B, N, S, D]. For a training step on CPU:
    OneFlow's matmul, then the bias add and split by cpu_train_kernels.c forward and backward;
    otherwise :func:`bert_of.runtime.kernels.split_heads` (inference kernels, or OneFlow's ops)."""
    if (linear.bias is not None and x.ndim == 3 and linear.weight.shape[0] % num_heads == 0 and _heads_on(x.shape[1])
            and trains(x, linear.weight, linear.bias) and _kernel("heads") is not None):
        return _split_call(flow.matmul(x, linear.weight, transpose_b=True), linear.bias, num_heads)
    return kernels.split_heads(linear, x, num_heads)


def merge_heads(x):
    """[B, N, S, D] -> [B, S, N*D]: for a training step on CPU by cpu_train_kernels.c forward and
    backward; otherwise :func:`bert_of.runtime.kernels.merge_heads`."""
    if x.ndim == 4 and _heads_on(x.shape[2]) and trains(x) and _kernel("heads") is not None:
        return _merge_call(x)
    return kernels.merge_heads(x)


def _check_heads(lib):
    """The split (with and without the bias) and the merge, forward and backward, the same bits as
    OneFlow's reshape and permute; the bias's gradient within GRAD_ULPS of float64 and OneFlow's."""
    rng = np.random.default_rng(11)
    B, S, N, D = 3, 70, 4, 37  # 70 x 148 elements: two threads' rows
    x = (rng.standard_normal((B, S, N * D)) * 3).astype(np.float32)
    bias = rng.standard_normal(N * D).astype(np.float32)
    g = rng.standard_normal((B, N, S, D)).astype(np.float32)
    of = _grads(lambda x_, b_: (x_ + b_).reshape(B, S, N, D).permute(0, 2, 1, 3), (x, bias), g)
    merged = _grads(lambda h_: h_.permute(0, 2, 1, 3).reshape(B, S, N * D), (g,), x)
    g_rows = g.transpose(0, 2, 1, 3).reshape(-1, N * D)
    db_ref, db_mag = g_rows.astype(np.float64).sum(0), np.abs(g_rows.astype(np.float64)).sum(0)
    for th in {1, _state["threads"]}:
        y = _run_heads_split(lib, x, bias, N, th)
        da, db = _run_heads_merge(lib, g, True, th)
        if not (_same_bits(y, of[0]) and _same_bits(da, of[1])):
            return f"off: the heads' split or its input's gradient differs from OneFlow's ({th} threads)"
        if not _within(db, db_ref, of[2], db_mag, GRAD_ULPS):
            return f"off: the bias's gradient beyond {GRAD_ULPS} ulps of float64 or OneFlow's ({th} threads)"
        if not (_same_bits(_run_heads_split(lib, x, None, N, th), x.reshape(B, S, N, D).transpose(0, 2, 1, 3))
                and _same_bits(_run_heads_merge(lib, g, False, th)[0], merged[0])
                and _same_bits(_run_heads_split(lib, x, None, N, th), merged[1])):
            return f"off: the heads' merge or its gradient differs from OneFlow's ({th} threads)"
    return None


_CHECKS.update(heads=_check_heads)


# --------------------------------------------------------------------------- the attention's core
#
# OneFlow 0.9's CPU batched matmul calls cblas_sgemm once per matrix, and the threaded BLAS splits each
# small GEMM (a MiniLM head's [S, S] x [S, 32]) over the cores and waits for them: 96 waits per
# product of a layer at batch 8, four products in a layer's backward, two in its forward (~0.4-1 s
# per product at 384 tokens on the shared 2-core machine, 17-27 ms for the same GEMMs in one
# cblas_sgemm_batch_strided call: bench/train_backward_ops.py). Here the attention's core, scores =
# q k^T scale, dropout(softmax(scores + mask)), times v, the heads merged, is one autograd Function:
# its GEMMs the BLAS's batched routine (each matrix's own sums: OneFlow's bits), the softmax and its
# dropout cpu_train_kernels.c's (the kernel above, the same seeds drawn in the same order, so its
# masks), the merge the heads' kernel. ``BERT_OF_CPU_TRAIN_ATTENTION=0`` keeps OneFlow's batched
# matmuls around the softmax kernel.

_ROW, _N, _T = 101, 111, 112  # CBLAS row-major, no transpose, transpose


def _bmm(gemm, a, b, ta: bool, tb: bool, alpha: float, out):
    """out [G, M, N] = alpha op(a) op(b) for G matrices at once (a [G, M, K] or [G, K, M] when ``ta``,
    b [G, K, N] or [G, N, K] when ``tb``; C-contiguous float32)."""
    G, M, N = out.shape
    K = a.shape[1] if ta else a.shape[2]
    gemm(_ROW, _T if ta else _N, _T if tb else _N, M, N, K, alpha, a.ctypes.data, a.shape[2], a.shape[1] * a.shape[2],
         b.ctypes.data, b.shape[2], b.shape[1] * b.shape[2], 0.0, out.ctypes.data, N, M * N, G)
    return out


_spare: list = []  # float32 buffers for the core's transient [B*N, S, S] arrays, kept between calls


def _borrow(n: int):
    """A float32 buffer of at least n elements: a spare one (its pages already mapped: a fresh
    [B*N, S, S] array at 384 tokens is 56 MB of pages the kernel zeroes, ~20% of a step's CPU), else new."""
    for i, b in enumerate(_spare):
        if b.size >= n:
            return _spare.pop(i)
    return np.empty(n, np.float32)


def _give(*bufs) -> None:
    """Buffers from :func:`_borrow` back, the two largest kept (a step needs two at a time)."""
    _spare.extend(bufs)
    _spare.sort(key=lambda b: -b.size)
    del _spare[2:]


def _run_attention_fwd(lib, gemm, q, k, v, mask, scale, seed, thr, drop_scale, threads):
    """q, k, v [B, N, S, D] (C-contiguous), mask [B, S] rows or None: the context [B, S, N*D] and P
    [B*N, S, S] (the dropped probabilities are recomputed from P and the seed in the backward)."""
    B, N, S, D = q.shape
    G = B * N
    a, b = _borrow(G * S * max(S, D)), _borrow(G * S * S) if thr else None  # a: the scores, then the context
    try:
        scores = _bmm(gemm, q.reshape(G, S, D), k.reshape(G, S, D), False, True, scale, a[:G * S * S].reshape(G, S, S))
        P, y = _run_softmax_fwd(lib, scores.reshape(-1, S), mask, N * S, seed, thr, drop_scale, threads,
                                None if b is None else b[:G * S * S].reshape(-1, S))
        y = P if y is None else y
        # the context into the scores' buffer (free after the softmax)
        ctx = _bmm(gemm, y.reshape(G, S, S), v.reshape(G, S, D), False, False, 1.0, a[:G * S * D].reshape(G, S, D))
        out = _run_heads_merge(lib, ctx.reshape(B, N, S, D), False, threads)[0]
    finally:
        _give(*(x for x in (a, b) if x is not None))
    return out, P.reshape(G, S, S)


def _run_attention_bwd(lib, gemm, g, q, k, v, P, scale, seed, thr, drop_scale, threads):
    """The gradients of q, k, v [B, N, S, D] for the context's g [B, S, N*D]."""
    B, N, S, D = q.shape
    G = B * N
    a, b = _borrow(G * S * S), _borrow(G * S * S) if thr else None
    try:
        y = P if b is None else _run_dropout(lib, P.reshape(-1), seed, thr, drop_scale, threads,
                                             b[:G * S * S]).reshape(G, S, S)  # the forward's dropped P
        dC = _run_heads_split(lib, g, None, N, threads).reshape(G, S, D)
        dY = _bmm(gemm, dC, v.reshape(G, S, D), False, True, 1.0, a[:G * S * S].reshape(G, S, S))
        dv = _bmm(gemm, y, dC, True, False, 1.0, np.empty((G, S, D), np.float32))
        dS = _run_softmax_bwd(lib, dY.reshape(-1, S), P.reshape(-1, S), seed, thr, drop_scale, threads,
                              dY.reshape(-1, S)).reshape(G, S, S)  # in place
        dq = _bmm(gemm, dS, k.reshape(G, S, D), False, False, scale, np.empty((G, S, D), np.float32))
        dk = _bmm(gemm, dS, q.reshape(G, S, D), True, False, scale, np.empty((G, S, D), np.float32))
    finally:
        _give(*(x for x in (a, b) if x is not None))
    return dq.reshape(B, N, S, D), dk.reshape(B, N, S, D), dv.reshape(B, N, S, D)


def _attention_call(q, k, v, mask, scale: float, seed, thr: int, drop_scale: float, gemm):
    """The attention's core as an autograd Function: q, k, v [B, N, S, D] -> context [B, S, N*D]. The
    inputs (their tensors, so their memory stays) and P stay in the closure for the backward."""
    lib, threads = _state["lib"], _state["threads"]
    saved = []

    def forward(ctx, q_, k_, v_):
        arrs = [_arr(t) for t in (q_, k_, v_)]
        out, P = _run_attention_fwd(lib, gemm, *arrs, mask, scale, seed, thr, drop_scale, threads)
        saved.extend([(q_, k_, v_), arrs, P])
        _state["calls"] += 1
        return flow.from_numpy(out)

    def backward(ctx, dy):
        _, (qa, ka, va), P = saved
        dq, dk, dv = _run_attention_bwd(lib, gemm, _arr(dy), qa, ka, va, P, scale, seed, thr, drop_scale, threads)
        return flow.from_numpy(dq), flow.from_numpy(dk), flow.from_numpy(dv)

    return _apply("AttentionFunction", forward, backward, q, k, v)


def _attention_on(tokens: int) -> bool:
    return tokens >= _min_tokens() and os.environ.get("BERT_OF_CPU_TRAIN_ATTENTION", "1") != "0"


def dropout_attention(q, k, v, mask_adder, scale: float, module):
    """``merge(module(softmax(q k^T scale + mask_adder)) v)`` for a training step on CPU: q, k, v
    [B, N, S, D], mask_adder [B, 1, 1, S] or None, ``module`` the probabilities' ``nn.Dropout`` ->
    the context [B, S, N*D], forward and backward by the BLAS's batched GEMM and cpu_train_kernels.c;
    None where it does not apply (the caller runs :func:`softmax_dropout` or OneFlow's ops)."""
    if not (q.ndim == 4 and _attention_on(q.shape[2]) and _dropout_on()
            and tuple(k.shape) == tuple(q.shape) == tuple(v.shape) and trains(q, k, v)):
        return None
    B, S = q.shape[0], q.shape[2]
    if mask_adder is not None and (tuple(mask_adder.shape) != (B, 1, 1, S) or mask_adder.requires_grad
                                   or not trains(mask_adder, q)):
        return None
    p = float(module.p) if module.training else 0.0
    gemm = batched_sgemm()
    if (not 0.0 <= p < 1.0 or gemm is None or _kernel("softmax_dropout") is None or _kernel("heads") is None
            or _kernel("attention") is None):
        return None
    thr, drop_scale = _dropout_consts(p)
    mask = None if mask_adder is None else _mask_rows(mask_adder, B, S)
    seed = _seed(getattr(module, "generator", None)) if thr else (0, 0)
    return _attention_call(q, k, v, mask, float(scale), seed, thr, drop_scale, gemm)


def _check_attention(lib):
    """The core's output and q's, k's, v's gradients (with and without dropout, a padded row, S and D
    not multiples of 8) within GRAD_ULPS of their float64 magnitudes and as near OneFlow's ops
    (batched matmuls around the softmax kernel, the same masks) as those are to float64."""
    gemm = batched_sgemm()
    if gemm is None:
        return "off: the BLAS has no cblas_sgemm_batch_strided"
    rng = np.random.default_rng(12)
    B, N, S, D = 2, 3, 37, 5
    q, k, v = ((rng.standard_normal((B, N, S, D)) * 2).astype(np.float32) for _ in range(3))
    mask = np.zeros((B, 1, 1, S), np.float32)
    mask[1, ..., 30:] = -10000.0
    g = rng.standard_normal((B, S, N * D)).astype(np.float32)
    scale, seed = 1.0 / math.sqrt(D), (77, 88)
    q64, k64, v64, g64 = (x.astype(np.float64) for x in (q, k, v, g))
    t = np.einsum("bnsd,bntd->bnst", q64, k64) * scale + mask
    t_mag = np.einsum("bnsd,bntd->bnst", np.abs(q64), np.abs(k64)) * scale
    e = np.exp(t - t.max(-1, keepdims=True))
    P64 = e / e.sum(-1, keepdims=True)
    P_mag = P64 * (1 + np.abs(t - t.max(-1, keepdims=True)) + 2 * t_mag)  # the scores' rounding moves P by P |dt|
    for p in (0.0, 0.1):
        thr, drop_scale = _dropout_consts(p)
        keep = (_run_dropout(lib, np.ones(q.size // D * S, np.float32), seed, thr, 1.0, 1) != 0).reshape(B, N, S, S)
        km = keep.astype(np.float32) * np.float32(drop_scale)
        of = _grads(lambda q_, k_, v_: flow.matmul(flow.softmax(flow.matmul(q_, k_, transpose_b=True, alpha=scale)
                                                                + flow.tensor(mask), dim=-1) * flow.tensor(km), v_)
                    .permute(0, 2, 1, 3).reshape(B, S, N * D), (q, k, v), g)
        y64, y_mag = P64 * km, P_mag * km
        merge = lambda x: x.transpose(0, 2, 1, 3).reshape(B, S, N * D)  # noqa: E731
        C64, C_mag = merge(y64 @ v64), merge(y_mag @ np.abs(v64) + np.abs(y64) @ np.abs(v64))
        dC = g64.reshape(B, S, N, D).transpose(0, 2, 1, 3)
        dY, dY_mag = dC @ v64.transpose(0, 1, 3, 2), np.abs(dC) @ np.abs(v64).transpose(0, 1, 3, 2)
        dv64 = y64.transpose(0, 1, 3, 2) @ dC
        dv_mag = (y_mag + np.abs(y64)).transpose(0, 1, 3, 2) @ np.abs(dC)
        gk, gk_mag = dY * km, dY_mag * km
        dS = P64 * (gk - (gk * P64).sum(-1, keepdims=True))
        dS_mag = P_mag * (gk_mag + (gk_mag * P64).sum(-1, keepdims=True)) + np.abs(dS)
        dq64, dq_mag = dS @ k64 * scale, np.abs(dS_mag) @ np.abs(k64) * scale
        dk64, dk_mag = dS.transpose(0, 1, 3, 2) @ q64 * scale, dS_mag.transpose(0, 1, 3, 2) @ np.abs(q64) * scale
        for th in {1, _state["threads"]}:
            out, P = _run_attention_fwd(lib, gemm, q, k, v, mask.reshape(B, S), scale, seed, thr, drop_scale, th)
            grads = _run_attention_bwd(lib, gemm, g, q, k, v, P, scale, seed, thr, drop_scale, th)
            for name, got, theirs, ref, mag in (("output", out, of[0], C64, C_mag),
                                                ("q's gradient", grads[0], of[1], dq64, dq_mag),
                                                ("k's gradient", grads[1], of[2], dk64, dk_mag),
                                                ("v's gradient", grads[2], of[3], dv64, dv_mag)):
                if not _within(got, ref, theirs, mag, GRAD_ULPS):
                    return (f"off: the attention's {name} beyond {GRAD_ULPS} ulps of float64 or OneFlow's "
                            f"(p {p}, {th} threads)")
    return None


_CHECKS.update(attention=_check_attention)
