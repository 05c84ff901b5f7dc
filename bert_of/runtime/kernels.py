"""CPU kernel workarounds: the same maths as the plain formula, computed with the ops OneFlow 0.9
vectorises on CPU. On CUDA each uses OneFlow's fused kernel.

Each is justified by a measurement, forward + backward at a pretraining step's shapes (B=16, S=128,
H=256, I=1024; 2 CPUs), by ``bench/pretrain_profile.py`` (bench/results/pretrain_profile.json,
column "of", min wall ms per call):

- ``gelu_tanh`` through a sigmoid: 43.8 ms, against 193.8 ms for Google's tanh expression
  ("alt: GELU tanh as Google's element-wise expression"): 4.4x.
- ``LayerNorm`` through products with a ones vector: 9.5 ms, against 240.7 ms for OneFlow's CPU
  kernel ("alt: LayerNorm [B,S,H] with OneFlow's CPU kernel (nn.LayerNorm)"): 25x.

For inference, both GELUs run in :file:`cpu_kernels.c`: OneFlow's own float operations and libm
calls, so the same bits, in one pass over every core instead of single-threaded kernels (one per
op): a BERT-base FFN activation at 4 x 384 tokens, Google's tanh GELU 79-87 -> 28-34 ms, the
exact GELU 57-76 -> 38-39 ms (2 CPUs; ``bench/gelu_bench.py``). ``BERT_OF_CPU_KERNELS=0`` keeps OneFlow's.

Shapes: T tokens (B*S), H hidden.
"""

from __future__ import annotations

import ctypes
import math
import os

import numpy as np

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
_native = {"checked": False, "lib": None, "why": "not used yet", "threads": 1, "calls": 0}


def _native_lib():
    """cpu_kernels.c, built and checked bit for bit against OneFlow's GELU kernels on this machine
    (its libm) once per process; None, with the reason in :func:`native_status`, if not usable."""
    if _native["checked"]:
        return _native["lib"]
    _native.update(checked=True, why=None)
    if os.environ.get("BERT_OF_CPU_KERNELS", "1") == "0":
        _native["why"] = "off (BERT_OF_CPU_KERNELS=0)"
        return None
    try:
        lib = ctypes.CDLL(native.build("cpu_kernels"))
    except OSError as e:
        _native["why"] = f"off: {e}"
        return None
    lib.bert_of_gelu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    # every binade from 1e-38 to 1e38 of both signs, the range around zero densely, and the specials
    probe = np.concatenate([np.geomspace(1e-38, 1e38, 4096), np.linspace(0, 12, 1 << 16)])
    probe = np.concatenate([probe, -probe, [np.inf, -np.inf, np.nan, -0.0]]).astype(np.float32)
    threads = default_threads()
    for op, ref in _ONEFLOW_GELU.items():
        want = ref(flow.tensor(probe)).numpy()
        got = np.empty_like(probe)
        lib.bert_of_gelu(probe.ctypes.data, got.ctypes.data, probe.size, threads, op)
        differ = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))  # any NaN
        if differ.any():
            bad = int(differ.sum())
            _native["why"] = f"off: differs from OneFlow's kernel at {bad} of {probe.size} probe values (op {op})"
            return None
    _native.update(lib=lib, threads=threads)
    return lib


def native_gelu(x, op: int):
    """GELU ``op`` (0 exact, 1 tanh) of ``x`` by cpu_kernels.c, or None where it does not apply:
    only for inference (no autograd), on local eager float32 CPU tensors."""
    if (x.is_lazy or x.is_global or x.device.type != "cpu" or x.dtype != flow.float32
            or (x.requires_grad and flow.is_grad_enabled())):
        return None
    lib = _native_lib()
    if lib is None:
        return None
    a = np.ascontiguousarray(x.numpy())  # waits for x; shares its memory when contiguous
    y = np.empty_like(a)
    lib.bert_of_gelu(a.ctypes.data, y.ctypes.data, a.size, _native["threads"], op)
    _native["calls"] += 1
    return flow.from_numpy(y)


def native_status() -> dict:
    """{"active": bool, "threads", "calls": GELUs computed so far, "why": when off}."""
    if _native["lib"] is None:
        return {"active": False, "why": _native["why"]}
    return {"active": True, "threads": _native["threads"], "calls": _native["calls"]}


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

    def forward(self, x):
        """x: [..., H] -> [..., H]."""
        if is_cuda(x):
            return flow.nn.functional.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        shape, inv_h = x.shape, 1.0 / x.shape[-1]
        x2 = x.reshape(-1, shape[-1])  # [T, H]
        mean = flow.matmul(x2, self.ones_col) * inv_h  # [T, 1]
        xc = x2 - flow.matmul(mean, self.ones_row)
        var = flow.matmul(xc * xc, self.ones_col) * inv_h
        y = xc * flow.matmul(flow.rsqrt(var + self.eps), self.ones_row)
        return (y * self.weight + self.bias).reshape(shape)
