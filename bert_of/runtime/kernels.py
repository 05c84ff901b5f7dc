"""CPU kernel workarounds: the same maths as the plain formula, computed with the ops OneFlow 0.9
vectorises on CPU, or in bert_of's own C. On CUDA each uses OneFlow's fused kernel.

What OneFlow 0.9 does wrong: its CPU element-wise kernels (LayerNorm, GELU, bias add, copies) run
on one thread, and its CPU LayerNorm and tanh expression are slow even there. When no longer
needed: when ``bench/pretrain_profile.py``'s "alt:" rows (OneFlow's own LayerNorm and Google's tanh
expression) and ``bench/gelu_bench.py``'s OneFlow rows are as fast as these (the figures are in
bench/results/pretrain_profile.json, bench/results/gelu.json and docs/benchmarks.md).

- ``gelu_tanh`` through a sigmoid, ``LayerNorm`` through products with a ones vector (training and
  graphs: OneFlow's ops, differentiable).

For inference (no autograd, local eager float32 CPU tensors) the layer's element-wise work runs in
:file:`cpu_kernels.c`, one pass over every core instead of OneFlow's single-threaded kernels
(measured by ``bench/gelu_bench.py`` and ``bench/infer_worker.py --task profile``; numbers in
bench/results and docs/benchmarks.md). Each kernel is checked against OneFlow's own op on its first
use and stays off, with the reason in :func:`native_status`, where it does not hold:

- OneFlow's bits (the same float operations): the heads' split (with the projection's bias add) and merge.
- Bounded: both GELUs (vectorised without libm in :file:`gelu_vec.h`, where OneFlow calls libm's erff or
  exp once per value), within ``GELU_ULPS`` float ulps of |x| of the float64 GELU (:func:`gelu_ulps`;
  :func:`native_status` reports it beside OneFlow's own distance).
- Bounded (its sums cannot follow OneFlow's order): LayerNorm(x + residual), within
  ``LAYER_NORM_ULPS`` float ulps of the float64 LayerNorm, and no further from OneFlow's output
  than that is from float64; the attention core (scores, mask, softmax, product with v, heads'
  merge: :func:`attention`), within ``ATTENTION_ULPS`` ulps of :func:`attention_magnitude` of the
  float64 result, likewise. OneFlow runs the attention's two batched matmuls as B*N small GEMMs
  (each split over BLAS threads that rarely both run) and its softmax and merge as more passes over
  [B, N, S, S]; the kernel gives each thread whole (batch, head) pairs and keeps a block of scores
  in cache (docs/benchmarks.md, the attention core).

A whole post-LN layer (:func:`layer_stack`, for the encoder's default layer runner): the six GEMMs
through the ``cblas_sgemm`` OneFlow's CPU matmul reaches (bert_of's threaded BLAS shim, else
liboneflow's own), with the arguments OneFlow passes, and the kernels above, each bias add fused
into the pass after its GEMM, in one C call per layer; the hidden state stays in NumPy from the
first layer to the last (no OneFlow op or VM wait between them). The same bits as the same layer
run op by op with these kernels (checked on probe layers when first used; on only where the heads',
LayerNorm's and attention kernels are). Not for autograd, graphs, CUDA, pre-LN layers, activations
other than the two GELUs, active dropout, ``output_attentions``, ``output_hidden_states`` or a
``head_mask``: those run the layers op by op.

Not here, because they measured no faster than OneFlow's own (docs/benchmarks.md, 2026-12-06): a
standalone bias add (memory-bound, and each tensor handed to NumPy waits for OneFlow's VM) and a
standalone softmax (OneFlow's is oneDNN's, vectorised; only fused into the attention core is it faster).

A check's verdict is kept beside the built library (:class:`native.Verdicts`, keyed by the library's
bytes, the CPU and :func:`verdict_context`), so a process after the first on the same machine reads it
(~0.6 CPU-s of checks a process otherwise); ``BERT_OF_CPU_KERNELS_RECHECK=1`` runs them again.

``BERT_OF_CPU_KERNELS=0`` keeps OneFlow's ops throughout; ``BERT_OF_CPU_ATTENTION=0`` only for the
attention core (and the whole layer with it); ``BERT_OF_CPU_LAYER=0`` runs the layers op by op with
the other kernels. A training step (autograd) on CPU has its own kernels with a backward, LayerNorm and
the intermediate GELU: :mod:`bert_of.runtime.train_kernels` (off: ``BERT_OF_CPU_TRAIN_KERNELS=0``).

Shapes: T tokens (B*S), H hidden.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from typing import NamedTuple, Optional

import numpy as np

import bert_of.runtime.blas as blas
import bert_of.runtime.native as native
from bert_of.runtime.flow_import import flow
from bert_of.runtime.blas import default_threads

nn = flow.nn


def is_cuda(x) -> bool:
    return (x.placement.type if x.is_global else x.device.type) == "cuda"


def gelu_tanh(x):
    """Google's GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). x: any shape.

    On CUDA, OneFlow's fused kernel for this formula. On CPU, OneFlow's tanh (and
    fast_gelu) are scalar loops, 4.4x slower than this sigmoid form (the module's docstring);
    0.5(1 + tanh(u)) is sigmoid(2u) exactly, and without tanh's cancellation near -1.
    """
    if is_cuda(x):
        return flow._C.fast_gelu(x)
    return _gelu(x, 1)


def gelu_erf(x):
    """Exact GELU 0.5x(1 + erf(x/sqrt2)): HF's "gelu" and the lazy OneFlow kernel. x: any shape."""
    return _gelu(x, 0)


def _gelu(x, op: int):
    """GELU ``op`` (0 exact, 1 tanh): cpu_kernels.c where it applies, else OneFlow's ops."""
    y = native_gelu(x, op)
    return _ONEFLOW_GELU[op](x) if y is None else y


GELU_TANH_C = 2.0 * math.sqrt(2.0 / math.pi)
_ONEFLOW_GELU = {0: lambda x: flow.nn.functional.gelu(x),
                 1: lambda x: x * flow.sigmoid(GELU_TANH_C * (x + 0.044715 * (x * x * x)))}
_native = {"checked": False, "lib": None, "why": "not used yet", "threads": 1, "calls": 0, "kernels": {}, "recheck": False,
           "attention_calls": 0,  # of "calls", the attention core's (its fallback still calls merge_heads)
           "layer_calls": 0}  # of "calls", whole layers (layer_stack)
F32_EPS = 2.0 ** -24  # a float32 ulp at 1, relative
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = {
    "bert_of_gelu": [_PTR, _PTR, _I64, ctypes.c_int, ctypes.c_int],
    "bert_of_split_heads": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int],
    "bert_of_merge_heads": [_PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int],
    "bert_of_layer_norm": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, ctypes.c_double, ctypes.c_int],
    "bert_of_attention": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_float,
                          ctypes.c_float, ctypes.c_int, ctypes.c_int],
    "bert_of_layer": [_PTR, _PTR, ctypes.c_int, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, ctypes.c_float,
                      ctypes.c_float, ctypes.c_int, ctypes.c_double, ctypes.c_double, ctypes.c_int, ctypes.c_int],
    "bert_of_layer_scratch": [_I64, _I64, _I64],
    "bert_of_layer_blas": [],
}


def _same_bits(got, want) -> bool:
    """Equal to the last bit, any NaN matching any NaN."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(got)
    return np.array_equal(nan, np.isnan(want)) and np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


GELU_ULPS = 4  # cpu_kernels.c's GELUs (gelu_vec.h) vs float64, in float ulps of |x| (measured <= 2.4)


def gelu64(x, op: int) -> np.ndarray:
    """The float64 GELU ``op`` (0 exact, 1 tanh) of ``x`` (any shape): the reference the kernels' bound
    is measured from. NaN where the float formula gives NaN (-inf times 0)."""
    x = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        if op == 0:
            phi = 0.5 * np.frompyfunc(math.erfc, 1, 1)(-x / math.sqrt(2.0)).astype(np.float64)
        else:
            e = np.exp(-np.abs(GELU_TANH_C * (x + 0.044715 * x ** 3)))
            phi = np.where(x < 0, e / (1 + e), 1 / (1 + e))
        return x * phi


def gelu_ulps(got, x, op: int) -> float:
    """The largest distance of ``got`` from the float64 GELU of ``x``, in float ulps of |x| (2^-24 |x|,
    plus the least subnormal, 2^-149: x / 2 of the least subnormals rounds to 0) over finite x."""
    x = np.asarray(x, np.float32)
    fin = np.isfinite(x)
    xd = x[fin].astype(np.float64)
    err = np.abs(np.asarray(got, np.float32)[fin].astype(np.float64) - gelu64(xd, op))
    return float(np.nan_to_num(err / (np.abs(xd) * F32_EPS + 2.0 ** -149), nan=np.inf).max(initial=0.0))


def _check_gelu(lib, threads):
    """Bounded (gelu_vec.h: no libm, not OneFlow's bits): both GELUs within GELU_ULPS float ulps of |x| of
    the float64 GELU on a probe (every binade from 1e-38 to 1e38 of both signs, [-12, 12] densely), on 1
    thread and on ``threads``; the specials (+-inf, NaN, +-0) as OneFlow's kernels give them. Returns
    (None or why off, {op: {"bert_of": ulps, "oneflow": ulps}}) (OneFlow's own distance, for comparison)."""
    probe = np.concatenate([np.geomspace(1e-38, 1e38, 4096), np.linspace(0, 12, 1 << 16)])
    probe = np.concatenate([probe, -probe, [np.inf, -np.inf, np.nan, -0.0, 0.0]]).astype(np.float32)
    special = ~np.isfinite(probe) | (probe == 0)
    ulps = {}
    for op, ref in _ONEFLOW_GELU.items():
        theirs = ref(flow.tensor(probe)).numpy()
        ulps[op] = {"oneflow": round(gelu_ulps(theirs, probe, op), 2)}
        for th in sorted({1, threads}):
            got = np.empty_like(probe)
            lib.bert_of_gelu(probe.ctypes.data, got.ctypes.data, probe.size, th, op)
            ulps[op]["bert_of"] = max(ulps[op].get("bert_of", 0.0), round(gelu_ulps(got, probe, op), 2))
            if ulps[op]["bert_of"] > GELU_ULPS:
                return (f"off: GELU op {op} {ulps[op]['bert_of']} ulps of |x| from the float64 GELU, beyond "
                        f"{GELU_ULPS} ({th} threads)"), ulps
            if not _same_bits(got[special], theirs[special]):
                return f"off: GELU op {op} of +-inf, NaN or +-0 differs from OneFlow's kernel ({th} threads)", ulps
    return None, ulps


def _native_lib():
    """cpu_kernels.c, built and its GELUs checked against the float64 GELU (within GELU_ULPS) on this
    machine once per process; None, with the reason in :func:`native_status`, if not usable."""
    if _native["checked"]:
        return _native["lib"]
    _native.update(checked=True, why=None)
    if os.environ.get("BERT_OF_CPU_KERNELS", "1") == "0":
        _native["why"] = "off (BERT_OF_CPU_KERNELS=0)"
        return None
    try:
        path = native.build("cpu_kernels")
        lib = ctypes.CDLL(path)
    except OSError as e:
        _native["why"] = f"off: {e}"
        return None
    for name, argtypes in _ARGTYPES.items():
        getattr(lib, name).argtypes = argtypes
    lib.bert_of_layer_scratch.restype = _I64
    threads = default_threads()
    verdicts = _native["verdicts"] = native.Verdicts(path, verdict_context(threads), recheck=_native["recheck"])
    kept = verdicts.check("gelu", lambda: dict(zip(("why", "ulps"), _check_gelu(lib, threads))))
    why, _native["gelu_ulps"] = kept["why"], {int(op): u for op, u in kept["ulps"].items()}
    if why:
        _native["why"] = why
        return None
    _native.update(lib=lib, threads=threads)
    return lib


def check_again() -> None:
    """Every kernel's first-use check runs again at its next use in this process, whatever verdicts
    were kept beside the library (and the new ones are kept): what ``bert-of selftest`` asks."""
    _native.update(checked=False, lib=None, why="not used yet", kernels={}, verdicts=None, recheck=True)
    _native.pop("gelu_ulps", None)


def verdict_context(threads: int) -> dict:
    """What a kernel's check depends on besides its library and the CPU (:class:`native.Verdicts`):
    OneFlow's ops it is compared with, NumPy's float64 reference, the BLAS and the thread count."""
    b = blas.status()
    return {"oneflow": flow.__version__, "numpy": np.__version__, "threads": threads,
            "blas": [b.get(k) for k in ("blas", "library", "version", "threads")]}


def _applies(*tensors) -> bool:
    """cpu_kernels.c serves only inference (no autograd) on local eager float32 CPU tensors."""
    for x in tensors:
        if x is None:
            continue
        if (x.is_lazy or x.is_global or x.device.type != "cpu" or x.dtype != flow.float32
                or (x.requires_grad and flow.is_grad_enabled())):
            return False
    return True


def _arr(x) -> np.ndarray:
    """x's float32 values, C-contiguous (waits for x; shares its memory when contiguous)."""
    return np.ascontiguousarray(x.numpy())


def _out(shape):
    """A new float32 NumPy array for a kernel to write and the CPU tensor on its memory. (OneFlow's
    own allocator would save the page faults but its ``numpy()`` waits for the VM: dearer.)"""
    y = np.empty(shape, np.float32)
    return flow.from_numpy(y), y


def native_gelu(x, op: int):
    """GELU ``op`` (0 exact, 1 tanh) of ``x`` by cpu_kernels.c, or None where it does not apply:
    only for inference (no autograd), on local eager float32 CPU tensors."""
    if not _applies(x):
        return None
    lib = _native_lib()
    if lib is None:
        return None
    a = _arr(x)
    out, y = _out(a.shape)
    lib.bert_of_gelu(a.ctypes.data, y.ctypes.data, a.size, _native["threads"], op)
    _native["calls"] += 1
    return out


def native_status() -> dict:
    """{"active": bool, "threads", "calls": kernel calls so far, "off": {kernel: why} for kernels
    that failed their check, "why": when all are off, "gelu_ulps": {op: {"bert_of": ulps, "oneflow":
    ulps}} once checked: each GELU's largest distance from float64 on the probe, in float ulps of |x|,
    "verdicts_kept": checks whose verdict was read from beside the library instead of run}."""
    ulps = {"gelu_ulps": _native["gelu_ulps"]} if _native.get("gelu_ulps") else {}
    if _native.get("verdicts") is not None:
        ulps["verdicts_kept"] = _native["verdicts"].hits
    if _native["lib"] is None:
        return {"active": False, "why": _native["why"], **ulps}
    off = {k: v for k, v in _native["kernels"].items() if v is not None}
    return {"active": True, "threads": _native["threads"], "calls": _native["calls"], **ulps,
            **({"off": off} if off else {})}


# --------------------------------------------------------------------------- the layer's other kernels


def _kernel(name: str):
    """The library when kernel ``name`` passed its check against OneFlow (run on its first use), else None."""
    lib = _native_lib()
    if lib is None:
        return None
    if name not in _native["kernels"]:
        _native["kernels"][name] = "checking"
        counts = {k: _native[k] for k in ("calls", "attention_calls", "layer_calls")}
        why = _verdict(lib, name)
        _native.update(counts)  # a check's own kernel calls (the layer's runs the others) are not the caller's
        _native["kernels"][name] = why
    return lib if _native["kernels"][name] is None else None


def _verdict(lib, name: str):
    """None (kernel ``name`` may run) or why not: its switch, a kernel it needs, or its check's verdict
    (kept beside the library by :class:`native.Verdicts`, else its check run now)."""
    if os.environ.get(_OFF_SWITCH.get(name, ""), "1") == "0":
        return f"off ({_OFF_SWITCH[name]}=0)"
    for part in _NEEDS.get(name, ()):
        if _kernel(part) is None:
            return f"off: needs the {part} kernel ({_native['kernels'][part]})"
    return _native["verdicts"].check(name, lambda: _CHECKS[name](lib, _native["threads"]))


def _probe(rng, *shape) -> np.ndarray:
    """Values ~N(0, 3^2) with signed zeros, subnormals, huge and tiny values mixed in."""
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8] = [0.0, -0.0, 1e-39, -1e-39, 3e37, -3e37, 1e-30, 7.5]
    return x


def _check_heads(lib, threads):
    rng = np.random.default_rng(2)
    B, S, N, D = 3, 37, 4, 16
    x, b = _probe(rng, B, S, N * D), _probe(rng, N * D)
    b[:3] = [np.inf, -np.inf, np.nan]
    want = (flow.tensor(x) + flow.tensor(b)).reshape(B, S, N, D).permute(0, 2, 1, 3).contiguous().numpy()
    back = flow.tensor(want).permute(0, 2, 1, 3).reshape(B, S, N * D).numpy()
    for t in {1, threads}:
        y, z = np.empty_like(want), np.empty_like(x)
        lib.bert_of_split_heads(x.ctypes.data, b.ctypes.data, y.ctypes.data, B, S, N, D, t)
        lib.bert_of_merge_heads(want.ctypes.data, z.ctypes.data, B, N, S, D, t)
        if not (_same_bits(y, want) and _same_bits(z, back)):
            return f"off: the heads' split or merge differs from OneFlow's permute ({t} threads)"
    return None


LAYER_NORM_ULPS = 4  # cpu_kernels.c's LayerNorm vs float64, in float ulps of |normalised x w| + |b|


def _layer_norm64(t, w, b, eps):
    t = t.astype(np.float64)
    m = t.mean(-1, keepdims=True)
    n = (t - m) / np.sqrt(((t - m) ** 2).mean(-1, keepdims=True) + eps)
    return n * w + b, np.abs(n * w) + np.abs(b)


def _check_layer_norm(lib, threads):
    """Bounded (its sums run in another order than OneFlow's): within LAYER_NORM_ULPS x 2^-24 x (|n w| + |b|) of the float64
    LayerNorm (n the normalised value), and as near bert_of's OneFlow LayerNorm as that is to float64."""
    rng = np.random.default_rng(4)
    T, H = 45, 384
    x, r = (rng.standard_normal((T, H)) * 3 + 1).astype(np.float32), rng.standard_normal((T, H)).astype(np.float32)
    x[0] = 0.0  # a constant row: variance 0, eps alone
    x[1] *= 1e4
    w, b = (rng.standard_normal(H) * 0.5 + 1).astype(np.float32), (rng.standard_normal(H) * 0.1).astype(np.float32)
    ln = LayerNorm(H, eps=1e-12)
    with flow.no_grad():
        ln.weight.copy_(flow.tensor(w))
        ln.bias.copy_(flow.tensor(b))
        theirs = ln._oneflow(flow.tensor(x) + flow.tensor(r)).numpy()
    ref, scale = _layer_norm64((flow.tensor(x) + flow.tensor(r)).numpy(), w, b, 1e-12)
    for th in {1, threads}:
        y = np.empty_like(x)
        lib.bert_of_layer_norm(x.ctypes.data, r.ctypes.data, w.ctypes.data, b.ctypes.data, y.ctypes.data, T, H,
                               1e-12, th)
        bound = LAYER_NORM_ULPS * F32_EPS * scale
        if not (np.abs(y - ref) <= bound).all():
            return f"off: LayerNorm beyond {LAYER_NORM_ULPS} ulps of the float64 LayerNorm ({th} threads)"
        if not (np.abs(y - theirs) <= np.abs(theirs - ref) + bound).all():
            return f"off: LayerNorm further from OneFlow's than OneFlow's is from float64 ({th} threads)"
    return None


ATTENTION_ULPS = 8  # cpu_kernels.c's attention vs float64, in float ulps of attention_magnitude (measured <= 1.5)


def attention_magnitude(q, k, v, mask, scale):
    """The float64 attention context and the magnitude its float32 rounding errors scale with, both
    [B, S, N*D], for q, k, v [B, N, S, D] and an additive mask [B, 1, 1 or S, S] (or None).

    A score s_j = scale q.k_j + m_j carries an error of a few ulps of a_j = scale |q|.|k_j| + |m_j| (its
    products, its sum, the mask's add); p = softmax(s) moves by dp_j = p_j (ds_j - sum_i p_i ds_i); the
    products with v and their sums add ulps of M = sum_j p_j |v_j|. So each output's error is a few ulps
    of M + sum_j p_j a_j |v_j| + M sum_j p_j a_j. (The -10000 of a masked key counts only with its
    weight p_j; in a row whose keys are all masked every score is rounded at 10000's ulp, in OneFlow's
    ops as here, and the bound says so.)"""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    m = 0.0 if mask is None else np.asarray(mask, np.float64)
    s = np.einsum("bnid,bnjd->bnij", q, k) * scale + m
    a = np.einsum("bnid,bnjd->bnij", np.abs(q), np.abs(k)) * scale + np.abs(m)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mag = p @ np.abs(v)
    mag = mag + (p * a) @ np.abs(v) + mag * (p * a).sum(-1, keepdims=True)
    B, N, S, D = q.shape
    merged = lambda c: c.transpose(0, 2, 1, 3).reshape(B, S, N * D)
    return merged(p @ v), merged(mag)


def _attention_oneflow(q, k, v, mask, scale, coeff=None):
    """The attention core in OneFlow's ops, as BertSelfAttention.forward runs it: [B, N, S, D] -> [B, S, N*D]."""
    if coeff is not None:
        scores = flow.matmul(q, k, transpose_b=True, alpha=scale / coeff) * coeff
    else:
        scores = flow.matmul(q, k, transpose_b=True, alpha=scale)
    if mask is not None:
        scores = scores + mask
    ctx = flow.matmul(flow.softmax(scores, dim=-1), v)
    B, N, S, D = ctx.shape
    return ctx.permute(0, 2, 1, 3).reshape(B, S, N * D)


def _run_attention(lib, q, k, v, mask, scale, coeff, threads, y=None) -> np.ndarray:
    """cpu_kernels.c's attention on C-contiguous float32 arrays (q, k, v [B, N, S, D], mask [B, 1, 1 or
    S, S] or None) into y [B, S, N*D] (a new array when None)."""
    B, N, S, D = q.shape
    y = np.empty((B, S, N * D), np.float32) if y is None else y
    lib.bert_of_attention(q.ctypes.data, k.ctypes.data, v.ctypes.data, None if mask is None else mask.ctypes.data,
                          y.ctypes.data, B, N, S, D, int(mask is not None and mask.shape[2] != 1),
                          scale / (coeff or 1.0), coeff or 1.0, int(coeff is not None), threads)
    return y


def _check_attention(lib, threads):
    """Bounded (its sums run in other orders than OneFlow's): within ATTENTION_ULPS ulps of
    attention_magnitude of the float64 result, and as near OneFlow's ops as they are to float64;
    padded keys, a row of only masked keys, per-query masks, LiBai's coeff and a head size not a
    multiple of 8 on the probe."""
    rng = np.random.default_rng(5)
    # (rows: the mask's query rows) S = 37: a block of 32 query rows and a tail, 32 + 8 key columns;
    # D = 40: 32 + 8 columns of v, D = 20: 16 + 4 (every path of the micro-kernels)
    for B, N, S, D, rows, coeff in ((3, 2, 37, 40, 1, None), (2, 3, 19, 20, 19, 3.0)):
        q, k, v = (rng.standard_normal((B, N, S, D)).astype(np.float32) * 2 for _ in range(3))
        mask = np.zeros((B, 1, rows, S), np.float32)
        mask[0, ..., S // 2:] = -10000.0  # padding
        mask[0, 0, -1, :3] = -10000.0  # per query where the mask has rows
        mask[1] = -10000.0  # nothing to attend to
        scale = 1.0 / math.sqrt(D)
        theirs = _attention_oneflow(*(flow.tensor(t) for t in (q, k, v, mask)), scale, coeff).numpy()
        ref, mag = attention_magnitude(q, k, v, mask, scale)
        bound = ATTENTION_ULPS * F32_EPS * mag
        for th in {1, threads}:
            y = _run_attention(lib, q, k, v, mask, scale, coeff, th)
            if not (np.abs(y - ref) <= bound).all():
                return f"off: attention beyond {ATTENTION_ULPS} ulps of the float64 attention ({th} threads)"
            if not (np.abs(y - theirs) <= np.abs(theirs - ref) + bound).all():
                return f"off: attention further from OneFlow's ops than they are from float64 ({th} threads)"
    return None


def _check_layer(lib, threads):
    """The same bits: the whole layer in one call equals the same layer run op by op (OneFlow's
    Linear, this module's split, attention, LayerNorm and GELU) to the last bit, on probe layers
    with both GELUs, padded and per-query masks, LiBai's coeff and a GEMM longer than a BLAS block."""
    if not lib.bert_of_layer_blas():
        return "off: no cblas_sgemm in the process to run the layer's GEMMs"
    rng = np.random.default_rng(6)
    for B, S, H, N, I, rows, act, coeff in ((2, 37, 96, 3, 384, 1, 1, None), (3, 19, 64, 4, 1040, 19, 0, 3.0)):
        mods = [nn.Linear(H, H) for _ in range(4)] + [nn.Linear(H, I), nn.Linear(I, H)]
        lns = [LayerNorm(H, eps=1e-12), LayerNorm(H, eps=1e-6)]
        with flow.no_grad():
            for m in mods + lns:
                for t in (m.weight, m.bias):
                    t.copy_(flow.tensor((rng.standard_normal(tuple(t.shape)) * 0.1 + (m in lns)).astype(np.float32)))
            x = (rng.standard_normal((B, S, H)) * 2).astype(np.float32)
            mask = np.zeros((B, 1, rows, S), np.float32)
            mask[0, ..., S // 2:] = -10000.0
            mask[-1, 0, -1, :3] = -10000.0
            q, k, v, o, inter, out = mods
            xt, mt = flow.tensor(x), flow.tensor(mask)
            scale = 1.0 / math.sqrt(H // N)
            heads = [split_heads(m, xt, N) for m in (q, k, v)]
            a = lns[0](o(attention(*heads, mt, scale, coeff)), xt)
            want = lns[1](out(_gelu(inter(a), act)), a).numpy()
            spec = layer_spec([t for m in (q, k, v, o, lns[0], inter, out, lns[1]) for t in (m.weight, m.bias)], N,
                              scale, coeff, _NATIVE_ACT[act], (lns[0].eps, lns[1].eps))
            for th in {1, threads}:
                got = _run_layers(lib, [spec], x, mask, th)
                if not _same_bits(got, want):
                    return f"off: the layer differs from the same layer op by op ({th} threads)"
    return None


# a kernel's own off switch, beside BERT_OF_CPU_KERNELS=0 for all (to measure one against OneFlow's ops)
_OFF_SWITCH = {"attention": "BERT_OF_CPU_ATTENTION", "layer": "BERT_OF_CPU_LAYER"}
# kernels a kernel runs (each checked, or switched off, on its own: not part of the verdict kept for it)
_NEEDS = {"layer": ("heads", "layer_norm", "attention")}
_CHECKS = {"heads": _check_heads, "layer_norm": _check_layer_norm, "attention": _check_attention,
           "layer": _check_layer}


def split_heads(linear, x, num_heads: int):
    """``linear(x)`` split into heads: x [B, S, in] -> [B, N, S, D]. For CPU inference the bias add and
    the transpose are one pass of cpu_kernels.c (OneFlow's bits)."""
    B, S = x.shape[0], x.shape[1]
    lib = _kernel("heads") if linear.bias is not None and _applies(x, linear.weight, linear.bias) else None
    if lib is None:
        y = linear(x)
        return y.reshape(B, S, num_heads, y.shape[-1] // num_heads).permute(0, 2, 1, 3)
    a = _arr(flow.matmul(x, linear.weight, transpose_b=True))
    D = a.shape[-1] // num_heads
    out, y = _out((B, num_heads, S, D))
    lib.bert_of_split_heads(a.ctypes.data, _arr(linear.bias).ctypes.data, y.ctypes.data, B, S, num_heads, D,
                            _native["threads"])
    _native["calls"] += 1
    return out


def merge_heads(x):
    """[B, N, S, D] -> [B, S, N*D] (for CPU inference one pass of cpu_kernels.c, OneFlow's bits)."""
    B, N, S, D = x.shape
    lib = _kernel("heads") if _applies(x) else None
    if lib is None:
        return x.permute(0, 2, 1, 3).reshape(B, S, N * D)
    a = _arr(x)
    out, y = _out((B, S, N * D))
    lib.bert_of_merge_heads(a.ctypes.data, y.ctypes.data, B, N, S, D, _native["threads"])
    _native["calls"] += 1
    return out


class LayerNorm(nn.Module):
    """Google's layer_norm over the last axis: (x - mean) * rsqrt(var + eps) * weight + bias.

    Same parameters (``weight``, ``bias`` [H]) and formula as ``nn.LayerNorm`` (biased variance,
    eps inside the rsqrt). On CUDA it is OneFlow's fused kernel. On CPU, OneFlow 0.9's kernel
    does the row broadcasts ``x[T,H] - mean[T,1]`` and ``* inv_std[T,1]`` in oneDNN's scalar
    reference binary (~50 ms each at [2048, 256]; 43% of a pretraining step). Here the row
    sums and broadcasts are products with a ones vector (``x @ ones[H,1]``, ``m @ ones[1,H]``;
    the broadcast is exact), so only shapes oneDNN vectorises remain: forward + backward ~25x
    faster (bench/results/pretrain_profile.md), the same numbers to fp32 rounding.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(flow.ones(hidden_size))
        self.bias = nn.Parameter(flow.zeros(hidden_size))
        # not in state dicts; they move and go global with the parameters
        self.register_buffer("ones_row", flow.ones(1, hidden_size), persistent=False)
        self.register_buffer("ones_col", flow.ones(hidden_size, 1), persistent=False)

    def forward(self, x, residual=None):
        """LayerNorm(x + residual) (residual optional): x [..., H] -> [..., H]. For CPU inference one
        pass of cpu_kernels.c, within LAYER_NORM_ULPS float ulps of the float64 LayerNorm."""
        if residual is not None and not _applies(x, residual, self.weight, self.bias):
            x, residual = x + residual, None
        lib = _kernel("layer_norm") if _applies(x, residual, self.weight, self.bias) and not is_cuda(x) else None
        if lib is None:
            return _layer_norm(self, x if residual is None else x + residual)
        a = _arr(x)
        r = None if residual is None else _arr(residual)
        if r is not None and r.shape != a.shape:
            return _layer_norm(self, x + residual)
        H = a.shape[-1]
        out, y = _out(a.shape)
        lib.bert_of_layer_norm(a.ctypes.data, None if r is None else r.ctypes.data, _arr(self.weight).ctypes.data,
                               _arr(self.bias).ctypes.data, y.ctypes.data, a.size // H, H, self.eps,
                               _native["threads"])
        _native["calls"] += 1
        return out

    def _oneflow(self, x):
        """The same LayerNorm in OneFlow's ops (autograd, graphs, CUDA). x: [..., H] -> [..., H]."""
        return _layer_norm(self, x)


def _layer_norm(m, x):
    """LayerNorm ``m``'s maths in OneFlow's ops. A function of the module, not a method: in a graph
    ``m`` is OneFlow's proxy and its parameters must be read through it. x: [..., H] -> [..., H]."""
    if is_cuda(x):
        return flow.nn.functional.layer_norm(x, (x.shape[-1],), m.weight, m.bias, m.eps)
    shape, inv_h = x.shape, 1.0 / x.shape[-1]
    x2 = x.reshape(-1, shape[-1])  # [T, H]
    mean = flow.matmul(x2, m.ones_col) * inv_h  # [T, 1]
    xc = x2 - flow.matmul(mean, m.ones_row)
    var = flow.matmul(xc * xc, m.ones_col) * inv_h
    y = xc * flow.matmul(flow.rsqrt(var + m.eps), m.ones_row)
    return (y * m.weight + m.bias).reshape(shape)


def attention(q, k, v, mask_adder, scale: float, coeff=None):
    """The attention's context for inference on CPU, heads merged: q, k, v [B, N, S, D], mask_adder
    [B, 1, 1 or S, S] (additive) or None -> [B, S, N*D]; softmax(scale q k^T (LiBai: / coeff, then
    * coeff) + mask_adder) v in one pass of cpu_kernels.c over (batch, head) pairs, within
    ATTENTION_ULPS of the float64 result. None where it does not apply (autograd, graphs, CUDA,
    other dtypes or mask shapes): the caller runs OneFlow's ops. Dropout, head_mask and returning the
    probabilities are the caller's to exclude."""
    if not _applies(q, k, v, mask_adder) or q.ndim != 4 or is_cuda(q):
        return None
    B, N, S, D = q.shape
    if tuple(k.shape) != (B, N, S, D) or tuple(v.shape) != (B, N, S, D):
        return None
    if mask_adder is not None and (mask_adder.ndim != 4 or tuple(mask_adder.shape) not in ((B, 1, 1, S), (B, 1, S, S))):
        return None
    lib = _kernel("attention")
    if lib is None:
        return None
    out, y = _out((B, S, N * D))
    _run_attention(lib, _arr(q), _arr(k), _arr(v), None if mask_adder is None else _arr(mask_adder), scale, coeff,
                   _native["threads"], y)  # the arrays live until the call returns
    _native["calls"] += 1
    _native["attention_calls"] += 1
    return out


# --------------------------------------------------------------------------- a whole post-LN layer


_NATIVE_ACT = {0: gelu_erf, 1: gelu_tanh}


class LayerSpec(NamedTuple):
    """One post-LN layer for :func:`layer_stack`: its 16 parameters in cpu_kernels.c's order (query,
    key, value, attention output, LayerNorm 1, intermediate, output, LayerNorm 2: weight then bias
    each), its heads, the scores' scale, LiBai's coeff (or None), the GELU (0 exact, 1 tanh) and the
    two LayerNorms' eps."""

    params: tuple
    num_heads: int
    scale: float
    coeff: Optional[float]
    act: int
    eps: tuple


def layer_spec(params, num_heads: int, scale: float, coeff, act_fn, eps: tuple) -> Optional[LayerSpec]:
    """A :class:`LayerSpec`, or None when the layer's activation is not one of the native GELUs
    (``gelu_erf``, ``gelu_tanh``) or a parameter is missing (a Linear without bias)."""
    act = next((op for op, fn in _NATIVE_ACT.items() if fn is act_fn), None)
    if act is None or len(params) != 16 or any(p is None for p in params):
        return None
    return LayerSpec(tuple(params), int(num_heads), float(scale), coeff, act, tuple(eps))


_scratch = threading.local()  # each thread's scratch (ctypes releases the GIL: threads may run layers at once)


def _scratch_floats(n: int) -> np.ndarray:
    """This thread's scratch, at least n floats (grown, never shrunk: the widest batch so far)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size < n:
        buf = _scratch.buf = None  # the old one goes before the new one is made
        buf = _scratch.buf = np.empty(n, np.float32)
    return buf


def _layer_shapes_ok(spec: LayerSpec, H: int) -> bool:
    shapes = [tuple(p.shape) for p in spec.params]
    I = shapes[10][0] if len(shapes[10]) == 2 else -1
    want = [(H, H), (H,)] * 4 + [(H,), (H,), (I, H), (I,), (H, I), (H,), (H,), (H,)]
    return shapes == want and I > 0 and H % spec.num_heads == 0


def _run_layers(lib, specs, x: np.ndarray, mask, threads: int) -> np.ndarray:
    """cpu_kernels.c's bert_of_layer for each spec in turn on x [B, S, H] (C-contiguous float32, not
    written), mask [B, 1, 1 or S, S] or None; a new array [B, S, H]. The hidden state between layers
    stays here, in two arrays the layers write in turn (the last layer's is the result)."""
    B, S, H = x.shape
    out, mid = np.empty_like(x), (np.empty_like(x) if len(specs) > 1 else None)
    T, I_max = B * S, max(int(s.params[10].shape[0]) for s in specs)
    scratch = _scratch_floats(int(lib.bert_of_layer_scratch(T, H, I_max)))
    mask_ptr, mask_rows = (None, 0) if mask is None else (mask.ctypes.data, int(mask.shape[2] != 1))
    for i, spec in enumerate(specs):
        y = out if (len(specs) - 1 - i) % 2 == 0 else mid
        # Read each call, not cached: ~4 us a parameter (0.4 ms a MiniLM forward), and a cache could
        # outlive a parameter's memory (a module moved, its tensors replaced). Alive until the call returns.
        arrays = [_arr(p) for p in spec.params]
        ptrs = (_PTR * 16)(*[a.ctypes.data for a in arrays])
        coeff = spec.coeff
        rc = lib.bert_of_layer(x.ctypes.data, mask_ptr, mask_rows, y.ctypes.data, scratch.ctypes.data, ptrs, B, S, H,
                               spec.num_heads, arrays[10].shape[0], spec.scale / (coeff or 1.0), coeff or 1.0,
                               int(coeff is not None), spec.eps[0], spec.eps[1], spec.act, threads)
        if rc != 0:
            raise RuntimeError(f"bert_of_layer returned {rc}")  # the shapes were checked: a bug
        x = y
    return x


def layer_stack(specs, hidden, mask_adder):
    """Post-LN layers for inference on CPU, each in one call of cpu_kernels.c: ``specs()`` gives
    their :class:`LayerSpec` (called only where the kernel may apply); hidden [B, S, H], mask_adder
    [B, 1, 1 or S, S] (additive) or None -> [B, S, H], the same bits as the layers run op by op with
    this module's kernels. The hidden state stays in NumPy from the first layer to the last. None
    where it does not apply (a spec None, autograd, graphs, CUDA, other dtypes or shapes, the kernel
    off): the caller runs the layers op by op."""
    if not _applies(hidden, mask_adder) or hidden.ndim != 3 or is_cuda(hidden):
        return None
    specs = specs()
    if not specs or any(s is None for s in specs):
        return None
    B, S, H = hidden.shape
    if mask_adder is not None and (mask_adder.ndim != 4 or tuple(mask_adder.shape) not in ((B, 1, 1, S), (B, 1, S, S))):
        return None
    if not all(_applies(*s.params) and _layer_shapes_ok(s, H) for s in specs):
        return None
    if B * S * max(H, *(int(s.params[10].shape[0]) for s in specs)) > 2 ** 31 - 1:
        return None  # past the 32-bit sizes of a CBLAS call
    lib = _kernel("layer")
    if lib is None:
        return None
    y = _run_layers(lib, specs, _arr(hidden), None if mask_adder is None else _arr(mask_adder), _native["threads"])
    _native["calls"] += len(specs)
    _native["layer_calls"] += len(specs)
    _native["attention_calls"] += len(specs)  # each layer ran the attention core
    return flow.from_numpy(y)
