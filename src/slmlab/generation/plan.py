"""Decode plans: one-token decoding over pre-arranged weights and fixed-size state buffers.

A model's ``forward`` serves training, prefill, padding and ``generate()``; per decoded token it
pays for that generality in small dispatches. A *decode plan* is an inference-only twin of the
one-token step, built from the model's current weights for one generation:

* weights are pre-arranged once (q|k|v and gate|up concatenated and transposed; each head's q/k
  rows reordered so that RoPE's rotate-half pairs ``(j, j + D/2)`` sit side by side, which turns
  RoPE into one complex multiply; attention scores are unchanged because q and k get the same
  order), and held in frozen dataclasses: :class:`StackWeights` for the stack, one per-family
  dataclass per layer (``LumenLayerWeights``, ``Lfm2LayerWeights``), so a misspelt field raises
  instead of silently skipping a sublayer;
* states live in buffers of fixed size (K/V for ``capacity`` positions, conv windows), written in
  place (``index_copy_``, ``copy_``); attention reads the whole buffer under a position mask, so
  every step has the same shapes and ``torch.compile`` compiles it once;
* the step is a pure function of ``(weights, states, tokens, position)``.
* a quantized model (:mod:`slmlab.models.quantize`) keeps its projections quantized in the plan,
  in the class its scheme's row names (:attr:`slmlab.quant_schemes.Scheme.columns`: int8 rows in
  :class:`Int8Columns`, int4 in :class:`Int4Columns`, rows concatenated and reordered the same way),
  and the step multiplies through the scheme's kernel (:func:`project`).

The model's own forward runs the prefill; :meth:`DecodePlan.start` copies its
:class:`~slmlab.layers.cache.ModelCache` into the buffers. Each family's step function and plan
builder live beside its model (``models/<family>/decode.py``); this module holds what they share.
Tests check plan steps against the model's own decode (fp32, 1e-5) for every family that has a plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..layers.cache import KVState, ModelCache
from ..layers.quantized import (
    N_MULTIPLE,
    Int4Linear,
    Int8Linear,
    int4_linear,
    int8_linear,
    kernel_pack,
    scheme_of_layer,
)
from ..layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class Int8Columns:
    """A projection kept in int8 for the decode step (a model after
    :func:`slmlab.models.quantize.quantize_int8`): ``project(x, it)`` runs torch's int8 kernel.

    Args:
        qweight: int8 ``[out, in]`` (rows in the plan's order, e.g. q|k|v concatenated).
        scale: bfloat16 ``[out]``, one per row.
    """

    qweight: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def stack(cls, linears: tuple[Int8Linear, ...], rows: tuple[torch.Tensor | None, ...]) -> Int8Columns:
        """The layers' rows (each in ``rows`` order) concatenated."""
        q = torch.cat([layer.qweight if r is None else layer.qweight[r] for layer, r in zip(linears, rows)])
        s = torch.cat([layer.scale if r is None else layer.scale[r] for layer, r in zip(linears, rows)])
        return cls(q.contiguous(), s.contiguous())

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``x Ŵ^T`` through torch's int8 kernel."""
        return int8_linear(x, self.qweight, self.scale)


@dataclass(frozen=True)
class Int4Columns:
    """A projection kept in int4 for the decode step (a model after
    :func:`slmlab.models.quantize.quantize_int4`): ``project(x, it)`` runs torch's int4 kernel.

    Args:
        packed: the kernel's packed codes of ``[out', in']`` (rows in the plan's order, zero rows to a multiple of 16).
        scales_zeros: bfloat16 ``[in' / group, out', 2]``.
        group: input columns per (scale, zero) pair.
        out: the real output count.
    """

    packed: torch.Tensor
    scales_zeros: torch.Tensor
    group: int
    out: int

    @classmethod
    def stack(cls, linears: tuple[Int4Linear, ...], rows: tuple[torch.Tensor | None, ...]) -> Int4Columns | None:
        """The layers' real rows (each in ``rows`` order) stacked and padded again to the kernel's 16; None
        for layers of different group sizes (no one kernel call takes them)."""
        if len({layer.group for layer in linears}) != 1:
            return None
        codes, pairs = [], []
        for layer, r in zip(linears, rows):
            keep = torch.arange(layer.out_features, device=layer.qweight.device) if r is None else r
            codes.append(layer.codes()[keep])
            pairs.append(layer.scales_zeros[:, keep])
        code, pair = torch.cat(codes), torch.cat(pairs, dim=1)
        out = code.shape[0]
        pad = -out % N_MULTIPLE
        code, pair = F.pad(code, (0, 0, 0, pad)), F.pad(pair, (0, 0, 0, pad))
        return cls(kernel_pack(code), pair.contiguous(), linears[0].group, out)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``x Ŵ^T`` through torch's int4 kernel."""
        return int4_linear(x, self.packed, self.scales_zeros, self.group, self.out)


Projection = torch.Tensor | Int8Columns | Int4Columns  # a float ``[in, out]`` matrix (``x @ it``) or int8 / int4 rows


def project(x: torch.Tensor, weight: Projection) -> torch.Tensor:
    """``x @ weight`` for a float ``[in, out]`` matrix; quantized rows multiply through their scheme's kernel."""
    if isinstance(weight, torch.Tensor):  # fixed per plan: the branch is resolved once under torch.compile
        return x @ weight
    return weight.project(x)


def columns(*linears: torch.nn.Module, rows: tuple[torch.Tensor | None, ...] | None = None) -> Projection:
    """``[in, out]`` columns of bias-free linears, their outputs concatenated (``project(x, it)`` is
    ``[l_1(x) | l_2(x) | ...]``), each one's output rows reordered by ``rows`` (None: as they are).
    Layers all of one quantization scheme keep its rows, in the class its row names
    (:attr:`~slmlab.quant_schemes.Scheme.columns`, e.g. :class:`Int8Columns`), when that class can stack
    them (int4: one group size); otherwise float (a quantized layer mixed with float ones contributes its
    dequantized weight)."""
    rows = rows or (None,) * len(linears)
    scheme = scheme_of_layer(linears[0])
    if scheme is not None and all(scheme_of_layer(layer) is scheme for layer in linears):
        stacked = globals()[scheme.columns].stack(linears, rows)
        if stacked is not None:
            return stacked
    weights = [layer.weight.detach() for layer in linears]
    return torch.cat([w if r is None else w[r] for w, r in zip(weights, rows)]).t().contiguous()


@dataclass(frozen=True)
class FeedForwardWeights:
    """A pre-norm SwiGLU feed-forward: ``x + down(silu(gate) * up)`` of ``rms_norm(x) * norm``.

    Args:
        norm: ``[d]`` RMSNorm weight.
        gate_up: ``[d, 2 F]`` gate and up projections, concatenated and transposed (or int8 rows).
        down: ``[F, d]`` down projection, transposed (or int8 rows).
    """

    norm: torch.Tensor
    gate_up: Projection
    down: Projection

    @classmethod
    def from_linears(cls, norm: torch.Tensor, gate: torch.nn.Module, up: torch.nn.Module, down: torch.nn.Module) -> FeedForwardWeights:
        """From the gate, up and down ``nn.Linear`` layers (or their int8 twins)."""
        return cls(norm, columns(gate, up), columns(down))


@dataclass(frozen=True)
class StackWeights:
    """The entries every attention decode step reads besides its layers.

    Args:
        eps: RMSNorm epsilon.
        hidden: model width ``d``.
        head_dim: ``D``.
        qk_width: ``(H + H_kv) D``, the q|k columns of a fused q|k|v projection.
        split: ``(H D, H_kv D)``, to split q|k into q and k.
        embed: ``[V, d]`` embedding table.
        head: ``[d, V]`` LM head, transposed (or int8 rows).
        norm: ``[d]`` final norm weight.
        rope: ``[capacity, (H + H_kv) D / 2, 2]`` RoPE factors for q|k in adjacent-pair order, as real
            ``(cos, sin)`` pairs (:func:`rope_multipliers`).
        slots: ``[1, 1, 1, capacity]`` slot indices (``slots <= position`` marks the filled ones).
        layers: one per-family layer dataclass per decoder layer.
    """

    eps: float
    hidden: int
    head_dim: int
    qk_width: int
    split: tuple[int, int]
    embed: torch.Tensor
    head: Projection
    norm: torch.Tensor
    rope: torch.Tensor
    slots: torch.Tensor
    layers: tuple[Any, ...]


StepFn = Callable[[StackWeights, list, torch.Tensor, torch.Tensor], torch.Tensor]


def adjacent_pair_order(head_dim: int) -> torch.Tensor:
    """Channel order that puts rotate-half pairs side by side: ``[0, D/2, 1, D/2 + 1, ...]``."""
    half = head_dim // 2
    return torch.stack((torch.arange(half), torch.arange(half, head_dim)), dim=1).flatten()


def pair_rows(weight: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Reorder the output rows of a ``[heads * D, in]`` projection into :func:`adjacent_pair_order`."""
    order = adjacent_pair_order(head_dim).to(weight.device)
    return weight.view(heads, head_dim, -1)[:, order].reshape(heads * head_dim, -1)


def pair_row_index(heads: int, head_dim: int, device: torch.device | None = None) -> torch.Tensor:
    """Row indices of a ``[heads * D, ...]`` projection in :func:`adjacent_pair_order` per head:
    ``weight[it]`` equals :func:`pair_rows` of ``weight`` (and also reorders a per-row scale)."""
    order = adjacent_pair_order(head_dim)
    return (torch.arange(heads)[:, None] * head_dim + order[None, :]).flatten().to(device)


def rope_multipliers(capacity: int, head_dim: int, base: float, heads: int, device: torch.device) -> torch.Tensor:
    """Per-position factors ``e^{i p θ_j}`` for a ``[heads * D]`` row in adjacent-pair order, from the
    model's own :class:`RotaryEmbedding` tables (identical angles), stored as real ``(cos, sin)`` pairs
    (``torch.view_as_complex`` of a row is the complex factor; a real table keeps complex tensors out
    of compiled graphs, which inductor cannot generate code for).

    Returns:
        float32 ``[capacity, heads * D / 2, 2]``.
    """
    cos, sin = RotaryEmbedding(head_dim, base, 1.0, capacity).tables(capacity, device)
    half = head_dim // 2  # the tables repeat each angle for channels j and j + D/2
    return torch.stack((cos[:capacity, :half], sin[:capacity, :half]), dim=-1).repeat(1, heads, 1).contiguous()


def rotate_pairs(x: torch.Tensor, multipliers: torch.Tensor) -> torch.Tensor:
    """Multiply adjacent pairs of ``x [..., 2n]`` as complex numbers by ``multipliers [..., n, 2]``
    (real ``(cos, sin)`` pairs, :func:`rope_multipliers`).

    Eager PyTorch does it in one complex multiply; under ``torch.compile`` / ``torch.export`` it is
    written in real arithmetic, which inductor fuses into neighbouring kernels (it does not generate
    code for complex tensors and would call back into eager for them).
    """
    if not torch.compiler.is_compiling():
        turn = torch.view_as_complex(multipliers)
        return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * turn).flatten(-2)
    pairs = x.unflatten(-1, (-1, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    cos, sin = multipliers[..., 0], multipliers[..., 1]
    return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2)


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    buffers: tuple[torch.Tensor, torch.Tensor],
    position: torch.Tensor,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """Write one token's keys/values at ``position`` and attend over the fixed-size buffers.

    Eager PyTorch runs ``F.scaled_dot_product_attention``; a compiled step writes the same maths out
    (one query: ``softmax(q K^T / sqrt(D)) V``, query heads grouped over their key/value head), which
    inductor fuses into its own kernels around two small batched products, where the fused CPU
    attention kernel costs more in set-up (allocations, blocking) than a one-token step computes.

    Args:
        q: ``[B, 1, H * D]``; k, v: ``[B, 1, H_kv * D]`` (RoPE already applied to q and k).
        buffers: ``(keys, values)``, each ``[B, H_kv, L, D]``, updated in place.
        position: ``[1]`` int64.
        allowed: bool ``[1, 1, 1, L]``, the filled positions (``<= position``).
    Returns:
        ``[B, 1, H * D]``.
    """
    keys, values = buffers
    b, kv_heads, _, head_dim = keys.shape
    heads = q.shape[-1] // head_dim
    keys.index_copy_(2, position, k.view(b, kv_heads, 1, head_dim))
    values.index_copy_(2, position, v.view(b, kv_heads, 1, head_dim))
    if not torch.compiler.is_compiling():
        out = F.scaled_dot_product_attention(
            q.view(b, heads, 1, head_dim), keys, values, attn_mask=allowed, enable_gqa=heads != kv_heads
        )
        return out.view(b, 1, heads * head_dim)  # one query: [B, H, 1, D] is laid out as [B, 1, H * D]
    grouped = q.view(b, kv_heads, heads // kv_heads, head_dim)  # query heads h = g * (H / H_kv) + j share K/V head g
    scores = torch.matmul(grouped, keys.transpose(-1, -2)) * head_dim**-0.5  # [B, H_kv, H / H_kv, L]
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.matmul(weights, values).reshape(b, 1, heads * head_dim)


def feed_forward(x: torch.Tensor, ff: FeedForwardWeights, eps: float) -> torch.Tensor:
    """``x + down(silu(gate) * up)`` over ``rms_norm(x)``, for ``x [B, 1, d]``."""
    gate, up = project(F.rms_norm(x, (x.shape[-1],), ff.norm, eps), ff.gate_up).chunk(2, dim=-1)
    return x + project(F.silu(gate) * up, ff.down)


def kv_buffers_from(state: KVState, capacity: int, key_order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys, values)`` buffers ``[B, H_kv, capacity, D]`` holding a prefilled :class:`KVState`,
    the keys' channels reordered by ``key_order``."""
    keys, values = state.keys[:, :, : state.length], state.values[:, :, : state.length]
    b, h, n, d = keys.shape
    key_buf, value_buf = keys.new_zeros(b, h, capacity, d), values.new_zeros(b, h, capacity, d)
    key_buf[:, :, :n] = keys[..., key_order.to(keys.device)]
    value_buf[:, :, :n] = values
    return key_buf, value_buf


def position_mask(capacity: int, device: torch.device) -> torch.Tensor:
    """``[1, 1, 1, capacity]`` slot indices; ``slots <= position`` marks the filled ones."""
    return torch.arange(capacity, device=device).view(1, 1, 1, capacity)


def qkv_columns(q_proj: torch.nn.Module, k_proj: torch.nn.Module, v_proj: torch.nn.Module, heads: int, kv_heads: int,
                head_dim: int) -> Projection:
    """``[d, (H + 2 H_kv) D]`` (or int8 rows) from the q, k, v linears: ``project(x, it)`` gives
    ``q | k | v`` with q and k in adjacent-pair order."""
    device = (q_proj.weight if scheme_of_layer(q_proj) is None else q_proj.qweight).device
    rows = (pair_row_index(heads, head_dim, device), pair_row_index(kv_heads, head_dim, device), None)
    return columns(q_proj, k_proj, v_proj, rows=rows)


def stack_weights(model, final_norm: torch.Tensor, eps: float, heads: int, kv_heads: int, head_dim: int,
                  rope_theta: float, capacity: int, layers: list) -> StackWeights:
    """The :class:`StackWeights` of ``model``: embedding table, transposed LM head, final norm, RoPE
    factors for ``q | k``, the slot indices and the shapes, around the family's ``layers``."""
    table = model.get_input_embeddings().weight
    return StackWeights(
        eps=eps,
        hidden=table.shape[1],
        head_dim=head_dim,
        qk_width=(heads + kv_heads) * head_dim,
        split=(heads * head_dim, kv_heads * head_dim),
        embed=table,
        head=columns(model.get_output_embeddings()),
        norm=final_norm,
        rope=rope_multipliers(capacity, head_dim, rope_theta, heads + kv_heads, table.device),
        slots=position_mask(capacity, table.device),
        layers=tuple(layers),
    )


@dataclass
class DecodePlan:
    """An inference-only one-token step for one model and one generation.

    Args:
        weights: the pre-arranged tensors the step reads (never written).
        step_fn: ``step_fn(weights, states, tokens [B, 1], position [1]) -> logits [B, V]``; pure,
            so ``torch.compile`` can compile it once for every plan of the same shapes.
        load_cache: ``load_cache(cache) -> states``: the buffers holding a prefilled model cache.
        capacity: positions the buffers hold.
        states: per layer, a tuple of fixed-size buffers the step updates in place (filled by
            :meth:`start` from the model's prefilled cache).
    """

    weights: StackWeights
    step_fn: StepFn
    load_cache: Callable[[ModelCache], list]
    capacity: int
    states: list = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    def start(self, cache: ModelCache) -> None:
        """Take over a prefilled cache (the model's own forward ran the prompt)."""
        if cache.seen_tokens == 0:
            raise ValueError("the decode plan starts from a prefilled cache; run the prompt through the model first")
        if cache.seen_tokens >= self.capacity:
            raise ValueError(f"the prompt fills all {self.capacity} positions of the decode plan")
        self.states = self.load_cache(cache)

    def step(self, tokens: torch.Tensor, position: torch.Tensor, step_fn: StepFn | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` after feeding ``tokens [B, 1]`` at ``position`` (a ``[1]`` int64 tensor)."""
        return (step_fn or self.step_fn)(self.weights, self.states, tokens, position)
