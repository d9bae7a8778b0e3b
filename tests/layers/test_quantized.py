"""Int8 weight-only linear layers (slmlab.layers.quantized): the quantization grid, the kernel's product
against a float64 transcription of the same maths, row independence (decode == prefill) and padding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slmlab.layers.quantized import Int8Linear, int8_linear, padded_width, quantize_rows

BF16_ULP = 2.0**-8  # a bfloat16 number carries 8 significant bits: relative spacing <= 2^-7, rounding <= 2^-8


def reference(x: torch.Tensor, layer: Int8Linear) -> torch.Tensor:
    """``bf16(x) @ (q * s)^T + b`` in float64: the layer's maths before the kernel rounds its output."""
    w = layer.qweight[:, : layer.in_features].double() * layer.scale.double()[:, None]
    y = x.to(torch.bfloat16).double() @ w.t()
    return y if layer.bias is None else y + layer.bias.double()


def test_rows_get_bfloat16_exact_scales_that_never_clip():
    w = torch.randn(37, 64) * torch.logspace(-3, 1, 37)[:, None]
    w[5] = 0.0
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16
    absmax = w.abs().amax(1)
    assert torch.all(scale.float()[absmax > 0] >= absmax[absmax > 0] / 127)  # rounded up: |w / s| <= 127
    assert torch.all(scale.float() <= absmax / 127 * (1 + 2 * BF16_ULP) + (absmax == 0))  # by at most one ulp
    assert int(q.abs().max()) <= 127 and scale[5] == 1 and torch.all(q[5] == 0)
    # round to nearest on the grid: every weight within half a step of its code
    err = (q.float() * scale.float()[:, None] - w).abs()
    assert torch.all(err <= scale.float()[:, None] / 2 * (1 + 1e-6))


@pytest.mark.parametrize("in_features", [64, 40])  # 40: not a multiple of 16, stored zero-padded to 48
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_computes_the_dequantized_product(in_features, bias):
    linear = nn.Linear(in_features, 24, bias=bias)
    layer = Int8Linear.from_linear(linear)
    assert layer.qweight.shape == (24, padded_width(in_features)) and torch.all(layer.qweight[:, in_features:] == 0)
    x = torch.randn(3, 5, in_features)
    y, ref = layer(x).double(), reference(x, layer)
    assert y.shape == (3, 5, 24) and layer(x).dtype == torch.float32
    # the kernel accumulates in fp32 and rounds its output to bfloat16 (the bias is added after, in fp32)
    scale = ref.abs() if not bias else (ref - layer.bias.double()).abs()
    assert torch.all((y - ref).abs() <= scale * BF16_ULP + 1e-6)
    torch.testing.assert_close(layer.weight, layer.qweight[:, :in_features].float() * layer.scale.float()[:, None])


def test_int8_is_close_to_the_float_layer():
    """Weight error only: per-channel int8 of a Kaiming-uniform layer, bf16 activations; measured
    ~0.5% relative (the bound 1.5% leaves room for seeds, far below a wrong scale or row order)."""
    linear = nn.Linear(256, 128)
    x = torch.randn(64, 256)
    y, ref = Int8Linear.from_linear(linear)(x), linear(x).detach()
    assert float((y - ref).norm() / ref.norm()) < 0.015


def test_each_row_is_computed_alone_so_decode_equals_prefill():
    layer = Int8Linear.from_linear(nn.Linear(96, 80))
    x = torch.randn(37, 96)
    full = layer(x)
    for rows in (1, 2, 5, 16):
        assert torch.equal(layer(x[:rows]), full[:rows])
    assert torch.equal(torch.cat([layer(x[i : i + 1]) for i in range(37)]), full)
    assert layer(x[:0]).shape == (0, 80)


def test_the_int8_state_dict_round_trips():
    layer = Int8Linear.from_linear(nn.Linear(32, 8, bias=True))
    assert set(layer.state_dict()) == {"qweight", "scale", "bias"}
    again = Int8Linear(32, 8, bias=True)
    again.load_state_dict(layer.state_dict())
    x = torch.randn(4, 32)
    assert torch.equal(again(x), layer(x))


def test_casting_the_model_to_float32_changes_nothing():
    """``model.float()`` turns the bfloat16 scales into float32 buffers; they hold bfloat16-exact values,
    so the layer converts them back for the kernel and computes the same."""
    layer = Int8Linear.from_linear(nn.Linear(32, 8))
    x = torch.randn(3, 32)
    before = layer(x)
    layer.float()
    assert layer.scale.dtype == torch.float32 and layer.qweight.dtype == torch.int8
    assert torch.equal(layer(x), before)


def test_functional_form_matches_the_module():
    layer = Int8Linear.from_linear(nn.Linear(48, 16))
    x = torch.randn(2, 48)
    assert torch.equal(int8_linear(x, layer.qweight, layer.scale, layer.bias), layer(x))
