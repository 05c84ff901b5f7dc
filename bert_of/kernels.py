"""CPU kernel workarounds: the same maths as the plain formula, computed with the ops OneFlow 0.9
vectorises on CPU. On CUDA each uses OneFlow's fused kernel.

Each is justified by a measurement, forward + backward at a pretraining step's shapes (B=16, S=128,
H=256, I=1024; 2 CPUs), by ``bench/pretrain_profile.py`` (bench/results/pretrain_profile.json,
column "of", min wall ms per call):

- ``gelu_tanh`` through a sigmoid: 43.8 ms, against 193.8 ms for Google's tanh expression
  ("alt: GELU tanh as Google's element-wise expression"): 4.4x.
- ``LayerNorm`` through products with a ones vector: 9.5 ms, against 240.7 ms for OneFlow's CPU
  kernel ("alt: LayerNorm [B,S,H] with OneFlow's CPU kernel (nn.LayerNorm)"): 25x.

Shapes: T tokens (B*S), H hidden.
"""

from __future__ import annotations

import math

from bert_of._flow import flow

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
    return x * flow.sigmoid((2.0 * math.sqrt(2.0 / math.pi)) * (x + 0.044715 * (x * x * x)))


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
