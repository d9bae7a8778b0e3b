"""NanoHammer attention: T hidden queries over the interleaved keys of state and hidden tokens.

Key/value sequence (per layer, prefill and cache alike): ``[s_0, h_0, s_1, h_1, ...]`` where ``s_j``
is the state token and ``h_j`` the hidden token at cache index ``j``; both are keyed with RoPE at the
position of ``j``. Hidden query ``i`` may attend to key ``k`` iff ``k <= 2 i + 1`` (state and hidden
tokens ``<= i``) or, in the seed's mode, ``k <= 2 i`` (hidden tokens ``< i``), and key ``k`` is not
padding. State-token queries are never computed: the seed computed them and discarded the outputs
(only their keys/values matter), so one SDPA over ``T`` queries and ``2 (past + T)`` keys gives the
same hidden outputs at half the query/MLP work.
"""

from __future__ import annotations

import torch
from torch import nn

from ...layers.attention import CausalSelfAttention, sdpa
from ...layers.cache import KVState, LayerState, join_rows
from ...layers.masks import AttentionBias, has_padding
from ...layers.rotary import apply_rotary


def interleave(states: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``[B, T, ...]`` twice -> ``[B, 2T, ...]`` ordered ``s_0, h_0, s_1, h_1, ...``."""
    return torch.stack((states, hidden), dim=2).flatten(1, 2)


def hammer_bias(
    attention_mask: torch.Tensor | None, q_len: int, past: int, self_offset: int, device: torch.device
) -> AttentionBias:
    """The mask of ``q_len`` hidden queries (cache indices ``past .. past+q_len-1``) over the
    ``2 (past + q_len)`` interleaved keys.

    Args:
        attention_mask: ``[B, past + q_len]`` (1 = real token) or ``None``.
        self_offset: 1 if a hidden token attends to itself, 0 for the seed's self-exclusion.
    Returns:
        a boolean mask ``[1 or B, 1, q_len, 2 (past + q_len)]`` (``True`` = may attend), or no mask
        when a single query may see every key. Rows that may see nothing (padding) see everything,
        so SDPA stays finite; those rows are never read by real tokens.
    """
    kv_len = 2 * (past + q_len)
    padded = has_padding(attention_mask)
    if not padded and q_len == 1 and self_offset == 1:
        return AttentionBias(None, False)
    limit = 2 * torch.arange(past, past + q_len, device=device) + self_offset
    allowed = (torch.arange(kv_len, device=device)[None, :] <= limit[:, None])[None, None]
    if padded:
        keys_real = attention_mask[:, -(past + q_len) :].bool().repeat_interleave(2, dim=1)
        allowed = allowed & keys_real[:, None, None, :]
        allowed = allowed | ~allowed.any(-1, keepdim=True)
    return AttentionBias(allowed, False)


class HammerLayerState(KVState):
    """One layer's decoding state: the interleaved state/hidden keys and values
    ``[B, H_kv, 2 L, D]`` and the state-cell output at the last position ``last_state [B, 1, S]``
    (the shifted state of the next position). Cannot be cropped (the state summarises the past)."""

    slots_per_token = 2  # the state token and the hidden token of each position

    def __init__(self) -> None:
        super().__init__()
        self.last_state: torch.Tensor | None = None

    def crop_refusal(self) -> str | None:
        return (
            "NanoHammer's state tokens come from a running sum and the last state-cell output, which summarise the"
            " whole past and cannot be rolled back"
        )

    def crop(self, length: int) -> None:
        LayerState.crop(self, length)

    def join(self, other: HammerLayerState) -> None:
        last_state = join_rows(self.last_state, other.last_state, "HammerLayerState.last_state")
        super().join(other)
        self.last_state = last_state


class RunningSum(LayerState):
    """The model-level running cumulative sum ``total [B, 1, S]`` (fp32) of the rotated state inputs."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None

    def integrate(self, x: torch.Tensor) -> torch.Tensor:
        """``C_t = C_past + Σ_{i<=t} x_i`` over ``x [B, T, S]``, accumulated in fp32; returns ``x.dtype``."""
        out = x.float().cumsum(1)
        if self.total is not None:
            out = out + self.total
        self.total = out[:, -1:]
        return out.to(x.dtype)

    def left_pad(self, n: int) -> None:
        """Nothing to do: padded positions add zero to the sum."""

    def join(self, other: RunningSum) -> None:
        self.total = join_rows(self.total, other.total, "RunningSum.total")

    def drop_leading(self, n: int) -> None:
        """Nothing to do: the sum keeps no positions."""


class NanoHammerAttention(CausalSelfAttention):
    """Llama attention (Touvron et al. 2023, arXiv:2302.13971; GQA, Ainslie et al. 2023,
    arXiv:2305.13245) whose keys and values come from the state tokens and hidden tokens, and whose
    queries come from the hidden tokens only.

    ``out_i = o_proj(softmax(q_i K^T / sqrt(D) + mask) V)`` with ``K, V`` over the interleaved
    sequence (module docstring). ``o_proj`` carries a bias when ``bias`` is set, as in transformers'
    ``LlamaAttention`` with ``attention_bias=True``.

    Args:
        hidden_size, num_heads, num_kv_heads, head_dim, bias, dropout: as in ``CausalSelfAttention``.
    Shapes:
        hidden, states ``[B, T, d]`` (already normed); cos/sin ``[B, T, D]`` -> ``[B, T, d]``.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, bias=bias, dropout=dropout)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=bias)

    def forward(
        self,
        hidden: torch.Tensor,
        states: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: AttentionBias,
        cache: KVState | None = None,
    ) -> torch.Tensor:
        b, t, _ = hidden.shape
        q = self.q_proj(hidden).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        both = interleave(states, hidden)
        k = self.k_proj(both).view(b, 2 * t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(both).view(b, 2 * t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos.repeat_interleave(2, dim=1), sin.repeat_interleave(2, dim=1))
        if cache is not None:
            k, v = cache.update(k, v)
        out = sdpa(q, k, v, bias, self.dropout if self.training else 0.0)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
