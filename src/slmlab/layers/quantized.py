"""Weight-only int8 linear layers: per-output-channel symmetric int8 weights, computed by torch's own
CPU kernel ``torch.ops.aten._weight_int8pack_mm`` (no hand-written kernel).

Row ``i`` of a weight ``W [out, in]`` is stored as ``q_i = round(W_i / s_i)`` in ``[-127, 127]`` with
one scale ``s_i = max_j |W_ij| / 127`` per output channel, rounded *up* to the nearest bfloat16
value: the kernel reads its scales in the activation dtype (bfloat16, below), so a scale that is
already a bfloat16 number reaches it unchanged, and rounding up keeps ``|W_i / s_i| <= 127`` (no
clipping). The product is ``y = x Ŵ^T (+ b)`` with ``Ŵ_ij = q_ij s_i``.

The kernel has a vectorised (AVX2/AVX-512) path for bfloat16 activations only (float32 activations
take a scalar loop, ~10x slower than the float32 GEMV it would replace), so :func:`int8_linear`
rounds the input to bfloat16, the kernel accumulates in float32 and returns bfloat16, and the result
comes back in the input's dtype. Each output row depends only on its own input row (bit-identical
for any number of rows or threads), so a one-token decode step equals the same row of a prefill.
The kernel reads the input dimension in blocks of 16 (it crashes on any other width), so a weight
whose ``in_features`` is not a multiple of 16 is stored with zero columns up to the next multiple
(:func:`padded_width`) and the input is zero-padded to match (one small extra op per call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

KERNEL_DTYPE = torch.bfloat16  # the activation dtype of the kernel's vectorised path
K_MULTIPLE = 16  # the kernel reads the input dimension in blocks of 16


def padded_width(in_features: int) -> int:
    """The input width the int8 weight is stored with: ``in_features`` rounded up to a multiple of 16."""
    return -(-in_features // K_MULTIPLE) * K_MULTIPLE


@torch.no_grad()
def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q int8 [out, in], scale bfloat16 [out])``: per-output-channel symmetric int8 of ``weight``.

    ``scale`` is ``max |row| / 127`` rounded up to a bfloat16 number (exact in the kernel); an all-zero
    row gets scale 1 (its codes are 0).
    """
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax))
    rounded = scale.to(KERNEL_DTYPE)
    up = rounded.float() < scale  # round to nearest may go down: step one bfloat16 ulp up
    rounded = torch.where(up, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)
    q = torch.round(w / rounded.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, rounded


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x Ŵ^T + bias`` with ``Ŵ = qweight * scale[:, None]``, through ``aten._weight_int8pack_mm``.

    Args:
        x: ``[..., in]`` (any float dtype; rounded to bfloat16 for the kernel).
        qweight: int8 ``[out, in']``, ``in'`` = :func:`padded_width` of ``in`` (zero columns past ``in``).
        scale: bfloat16 ``[out]``.
        bias: ``[out]`` or None, added in the input's dtype.
    Returns:
        ``[..., out]`` in ``x``'s dtype.
    """
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 0:
        y = x.new_zeros(0, qweight.shape[0])
    else:
        rows = rows.to(KERNEL_DTYPE)
        if scale.dtype != KERNEL_DTYPE:  # e.g. after model.float(): the values are bfloat16-exact, nothing is lost
            scale = scale.to(KERNEL_DTYPE)
        if rows.shape[1] != qweight.shape[1]:  # fixed per layer: the weight's zero columns
            rows = F.pad(rows, (0, qweight.shape[1] - rows.shape[1]))
        y = torch.ops.aten._weight_int8pack_mm(rows.contiguous(), qweight, scale).to(x.dtype)
    y = y.view(*lead, qweight.shape[0])
    return y if bias is None else y + bias


class Int8Linear(nn.Module):
    """An ``nn.Linear`` with int8 weights (per-output-channel symmetric, bfloat16-exact scales), for
    inference. The bias (if any) stays a float parameter.

    Buffers (saved in the state dict): ``qweight`` int8 ``[out, in']`` (``in'`` = :func:`padded_width`
    of ``in``; zero columns past ``in``) and ``scale`` bfloat16 ``[out]``.
    ``weight`` is the dequantized ``qweight * scale`` in float32, built on each access: for code that
    reads a projection's weight directly (slow, but the same numbers as the int8 weight).

    Args:
        in_features, out_features: as ``nn.Linear``.
        bias: whether it has a bias.
    Shapes:
        x ``[..., in_features]`` -> ``[..., out_features]``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device=None, dtype=torch.float32) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        width = padded_width(in_features)
        self.register_buffer("qweight", torch.zeros(out_features, width, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(out_features, dtype=KERNEL_DTYPE, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """The int8 twin of ``linear`` (its weight quantized, its bias copied)."""
        weight = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, weight.device, weight.dtype)
        layer.qweight, layer.scale = quantize_rows(F.pad(weight.detach(), (0, layer.qweight.shape[1] - weight.shape[1])))
        if linear.bias is not None:
            layer.bias.data.copy_(linear.bias.detach())
        return layer

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight ``qweight * scale[:, None]`` (float32, ``[out, in]``)."""
        dtype = self.bias.dtype if self.bias is not None else torch.float32
        return (self.qweight[:, : self.in_features].float() * self.scale.float()[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"
