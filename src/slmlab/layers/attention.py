"""Causal multi-head self-attention with GQA/MQA through ``F.scaled_dot_product_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cache import KVState
from .fused import ConcatenatedWeights, fusable, project_each
from .masks import AttentionBias
from .norm import RMSNorm
from .rotary import apply_rotary


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: AttentionBias,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """SDPA over ``q [B, H, T, D]`` and ``k, v [B, H_kv, S, D]``; K/V heads are shared by
    ``H / H_kv`` query heads without being copied (``enable_gqa``). When the forward asked for
    attention weights (``bias.weights`` is a list) the eager path runs instead and appends them."""
    if bias.weights is not None:
        out, weights = eager_attention(q, k, v, bias, dropout_p, scale)
        bias.weights.append(weights)
        return out
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=bias.mask,
        dropout_p=dropout_p,
        is_causal=bias.is_causal,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: AttentionBias,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with the probabilities materialised, as transformers' eager attention computes it:
    ``p = dropout(softmax_fp32(q k^T · scale, masked))``, ``out = p v``.

    Args:
        q: ``[B, H, T, D]``; k, v: ``[B, H_kv, S, D]`` (each K/V head serves ``H / H_kv`` query heads).
        bias: which keys each query may read; scale: default ``1/√D``.
    Returns:
        ``(out [B, H, T, D], weights [B, H, T, S])``.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    visible = bias.visible(q.shape[2], k.shape[2], q.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = F.dropout(weights, dropout_p, training=dropout_p > 0)
    return weights @ v, weights


def attend_projected(
    qkv: torch.Tensor,
    heads: tuple[int, int, int],
    q_norm: nn.Module,
    k_norm: nn.Module,
    cos: torch.Tensor,
    sin: torch.Tensor,
    bias: AttentionBias,
    state: KVState | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention from projected rows: split ``q | k | v``, per-head norms, RoPE, the cache, SDPA.

    Args:
        qkv: ``[B, T, (H + 2 H_kv) D]``.
        heads: ``(H, H_kv, D)``.
        q_norm, k_norm: per-head norms over ``D`` (``nn.Identity`` for none).
        cos, sin: ``[B, T, R]`` RoPE tables; state: the layer's :class:`KVState` when decoding.
    Returns:
        ``[B, T, H * D]``, before the output projection.
    """
    num_heads, num_kv_heads, head_dim = heads
    b, t, _ = qkv.shape
    q, k, v = qkv.split((num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim), dim=-1)
    q = q_norm(q.view(b, t, num_heads, head_dim)).transpose(1, 2)
    k = k_norm(k.view(b, t, num_kv_heads, head_dim)).transpose(1, 2)
    v = v.view(b, t, num_kv_heads, head_dim).transpose(1, 2)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if state is not None:
        k, v = state.update(k, v)
    return sdpa(q, k, v, bias, dropout_p).transpose(1, 2).reshape(b, t, -1)


def check_head_layout(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int | None) -> int:
    """Validate a head layout and return the head dimension."""
    if num_heads <= 0 or num_kv_heads <= 0:
        raise ValueError(f"num_attention_heads ({num_heads}) and num_key_value_heads ({num_kv_heads}) must be positive")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_attention_heads ({num_heads}) must be divisible by num_key_value_heads ({num_kv_heads})"
        )
    if head_dim is None:
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_heads})")
        head_dim = hidden_size // num_heads
    return head_dim


class CausalSelfAttention(nn.Module):
    """Llama-style attention: projections, RoPE, optional per-head QK RMSNorm, SDPA, output.

    q, k and v come from one GEMM over the concatenated weights (:class:`ConcatenatedWeights`).
    Parameter names follow transformers' ``LlamaAttention`` (``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``; with ``qk_norm`` also ``q_norm``/``k_norm`` as in Qwen3).

    Args:
        hidden_size: model width ``d``.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``H_kv`` (``H % H_kv == 0``; 1 = MQA).
        head_dim: ``D`` (default ``d // H``).
        bias: bias on q/k/v projections.
        qk_norm: RMS-normalise q and k per head before RoPE.
        eps: epsilon of the QK norms.
        dropout: attention-probability dropout in training.
    Shapes:
        x ``[B, T, d]``; cos/sin ``[B, T, R]`` -> ``[B, T, d]``.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int | None = None,
        bias: bool = False,
        qk_norm: bool = False,
        eps: float = 1e-6,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.head_dim = check_head_layout(hidden_size, num_heads, num_kv_heads, head_dim)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)
        self._qkv_weight = ConcatenatedWeights()
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps)
            self.k_norm = RMSNorm(self.head_dim, eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """``[q | k | v]`` from one GEMM over the concatenated projection weights."""
        if not fusable(self.q_proj, self.k_proj, self.v_proj):  # e.g. LoRA-wrapped: each its own forward
            return project_each(x, self.q_proj, self.k_proj, self.v_proj)
        w = self._qkv_weight(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        if self.q_proj.bias is None:
            return F.linear(x, w)
        return F.linear(x, w, torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: AttentionBias,
        state: KVState | None = None,
    ) -> torch.Tensor:
        heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        dropout = self.dropout if self.training else 0.0
        out = attend_projected(self.project_qkv(x), heads, self.q_norm, self.k_norm, cos, sin, bias, state, dropout)
        return self.o_proj(out)
