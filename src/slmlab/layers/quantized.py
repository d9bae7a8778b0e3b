"""Weight-only int8 and int4 linear layers. Int8: per-output-channel symmetric int8 weights, computed by torch's own
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

Each class here is the layer of one row of :data:`slmlab.quant_schemes.SCHEMES` (:func:`layer_class`,
:func:`scheme_of_layer`): ``from_linear`` quantizes an ``nn.Linear``, ``settings()`` names what a saved
record holds besides the row's own entries, ``for_record`` builds an empty layer a saved folder loads into.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..quant_schemes import SCHEMES, Scheme

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

    @classmethod
    def for_record(cls, in_features: int, out_features: int, bias: bool, record: dict) -> Int8Linear:
        """An empty layer of these shapes, to load a saved folder's buffers into (``record``: its
        ``quantization_config``)."""
        return cls(in_features, out_features, bias)

    def settings(self) -> dict:
        """What a saved record holds for this layer besides its scheme's entries: nothing."""
        return {}

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight ``qweight * scale[:, None]`` (float32, ``[out, in]``)."""
        dtype = self.bias.dtype if self.bias is not None else torch.float32
        return (self.qweight[:, : self.in_features].float() * self.scale.float()[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


# -- int4, group-wise -------------------------------------------------------------------------------
#
# Torch's CPU kernel ``aten._weight_int4pack_mm_for_cpu`` multiplies bfloat16 activations by 4-bit codes
# ``q`` in ``[0, 15]`` with one (scale, zero) pair per group of ``g`` consecutive input columns of an output
# row: ``Ŵ_ij = (q_ij - 8) s_{i, j // g} + z_{i, j // g}``. It takes groups of 32, 64, 128 or 256 columns, an
# output count that is a multiple of 16 and an input count that is a multiple of the group (weights are
# stored padded with zero rows / columns to those sizes), and its own packed layout of the codes
# (``aten._convert_weight_to_int4pack_for_cpu``), which this module builds from a portable one: two codes
# per byte, the even column in the low nibble.

INT4_GROUPS = (32, 64, 128, 256)  # the group sizes the kernel takes
INT4_GROUP = 32  # the default: the smallest group, the least rounding error
N_MULTIPLE = 16  # the kernel's output rows come in blocks of 16


def int4_shape(out_features: int, in_features: int, group: int) -> tuple[int, int]:
    """``(out', in')``: the stored weight's rows and columns, padded to the kernel's multiples."""
    if group not in INT4_GROUPS:
        raise ValueError(f"int4 group size must be one of {INT4_GROUPS}, got {group}")
    return -(-out_features // N_MULTIPLE) * N_MULTIPLE, -(-in_features // group) * group


@torch.no_grad()
def quantize_groups(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes uint8 [out, in] in [0, 15], scales_zeros bfloat16 [in / group, out, 2])``: asymmetric
    4-bit codes of ``weight`` (``in`` a multiple of ``group``), one (scale, zero) pair per group.

    The scale ``(max - min) / 15`` and the zero ``min + 8 s`` are rounded to bfloat16 first (what the kernel
    reads) and the codes computed against the rounded pair, so the rounding of the pair is absorbed by the
    codes; a constant group gets scale 1 and codes 8 (its value is the zero).
    """
    out, width = weight.shape
    w = weight.detach().float().reshape(out, width // group, group)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scale = torch.where(hi > lo, (hi - lo) / 15.0, torch.ones_like(hi)).to(KERNEL_DTYPE)
    zero = torch.where(hi > lo, lo + 8.0 * scale.float(), lo).to(KERNEL_DTYPE)
    codes = torch.round((w - zero.float()[..., None]) / scale.float()[..., None] + 8.0).clamp_(0, 15)
    return codes.reshape(out, width).to(torch.uint8), torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous()


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` codes in ``[0, 15]`` -> ``[out, in / 2]`` bytes, the even column in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def kernel_pack(codes: torch.Tensor) -> torch.Tensor:
    """The kernel's own layout of ``[out', in']`` codes (``aten._convert_weight_to_int4pack_for_cpu``)."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int, out_features: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x Ŵ^T + bias`` through ``aten._weight_int4pack_mm_for_cpu``.

    Args:
        x: ``[..., in]`` (any float dtype; rounded to bfloat16 for the kernel).
        packed: the kernel-packed codes of ``[out', in']`` (:func:`kernel_pack`).
        scales_zeros: bfloat16 ``[in' / group, out', 2]``.
        group: columns per (scale, zero) pair.
        out_features: the real output count (``out'`` minus the padding rows).
        bias: ``[out]`` or None, added in the input's dtype.
    Returns:
        ``[..., out_features]`` in ``x``'s dtype.
    """
    lead = x.shape[:-1]
    width = scales_zeros.shape[0] * group
    rows = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
    if rows.shape[1] != width:  # fixed per layer: the weight's zero columns
        rows = F.pad(rows, (0, width - rows.shape[1]))
    if rows.shape[0] == 0:
        y = x.new_zeros(0, out_features)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.contiguous(), packed, group, scales_zeros)
        y = y[:, :out_features].to(x.dtype)
    y = y.reshape(*lead, out_features)
    return y if bias is None else y + bias


class Int4Linear(nn.Module):
    """An ``nn.Linear`` with group-wise asymmetric 4-bit weights (:func:`quantize_groups`), for inference.

    Buffers (saved in the state dict): ``qweight`` uint8 ``[out', in' / 2]`` (two codes per byte,
    :func:`pack_nibbles`; ``out'``, ``in'`` from :func:`int4_shape`, zero rows and columns past the real ones)
    and ``scales_zeros`` bfloat16 ``[in' / group, out', 2]``. The kernel's own packed codes are built from
    them on first use and rebuilt whenever the buffers change (a load, a copy). ``weight`` is the
    dequantized weight in float32, built on each access.

    Args:
        in_features, out_features: as ``nn.Linear``.
        bias: whether it has a bias.
        group: input columns per (scale, zero) pair, one of :data:`INT4_GROUPS`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, group: int = INT4_GROUP, device=None,
                 dtype=torch.float32) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        rows, width = int4_shape(out_features, in_features, group)
        self.register_buffer("qweight", torch.full((rows, width // 2), 0x88, dtype=torch.uint8, device=device))
        self.register_buffer("scales_zeros", torch.zeros(width // group, rows, 2, dtype=KERNEL_DTYPE, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False) if bias else None
        self._packed: tuple[tuple, torch.Tensor] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: int = INT4_GROUP) -> Int4Linear:
        """The int4 twin of ``linear`` (its weight quantized, its bias copied)."""
        weight = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group, weight.device, weight.dtype)
        rows, width = int4_shape(linear.out_features, linear.in_features, group)
        padded = F.pad(weight.detach().float(), (0, width - weight.shape[1], 0, rows - weight.shape[0]))
        codes, layer.scales_zeros = quantize_groups(padded, group)
        layer.qweight = pack_nibbles(codes)
        if linear.bias is not None:
            layer.bias.data.copy_(linear.bias.detach())
        return layer

    @classmethod
    def for_record(cls, in_features: int, out_features: int, bias: bool, record: dict) -> Int4Linear:
        """An empty layer of these shapes and the record's ``group_size``, to load a saved folder's buffers into."""
        return cls(in_features, out_features, bias, int(record["group_size"]))

    def settings(self) -> dict:
        """What a saved record holds for this layer besides its scheme's entries: its group size."""
        return {"group_size": self.group}

    def codes(self) -> torch.Tensor:
        """The ``[out', in']`` codes in ``[0, 15]``."""
        return unpack_nibbles(self.qweight)

    def packed(self) -> torch.Tensor:
        """The kernel's layout of the codes, cached until ``qweight`` changes."""
        try:
            version = self.qweight._version
        except RuntimeError:  # an inference tensor has no version counter; it cannot change in place either
            version = -1
        key = (self.qweight.data_ptr(), version)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, kernel_pack(self.codes()))
        return self._packed[1]

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (float32, ``[out, in]``)."""
        codes = self.codes().float()
        rows, width = codes.shape
        s, z = self.scales_zeros.float().transpose(0, 1).unbind(-1)  # [out', groups] each
        w = ((codes.reshape(rows, -1, self.group) - 8.0) * s[..., None] + z[..., None]).reshape(rows, width)
        dtype = self.bias.dtype if self.bias is not None else torch.float32
        return w[: self.out_features, : self.in_features].to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int4_linear(x, self.packed(), self.scales_zeros, self.group, self.out_features, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None},"
                f" int4 group {self.group}")


def layer_class(scheme: Scheme) -> type[Int8Linear | Int4Linear]:
    """The class of this module that a scheme's row names (:attr:`~slmlab.quant_schemes.Scheme.layer`)."""
    return globals()[scheme.layer]


def scheme_of_layer(module: nn.Module) -> Scheme | None:
    """The row whose layer ``module`` is (None: not a quantized linear)."""
    return next((row for row in SCHEMES.values() if isinstance(module, layer_class(row))), None)
