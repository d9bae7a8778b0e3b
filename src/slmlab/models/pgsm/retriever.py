"""Query-only sparse RoPE retrieval (seed 001): a strictly backward attention read at chosen positions.

At a retrieval position ``p`` the query is taken from that position only and attends over the keys of
the positions ``j < p`` (never ``p`` itself, never the future):
``r = W_o · softmax(q_p K_{<p}^T / √d) V_{<p}``, ``x_p ← x_p + σ(W_g [h_p, r]) ⊙ r`` with
``h = LN(x)`` and RoPE (Su et al. 2021, arXiv:2104.09864) on ``q`` and ``K``. Every other position
is left unchanged, so a read costs O(T) per retrieval position, not O(T²).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...layers import AttentionBias, KVState, RotaryEmbedding, apply_rotary
from ...layers.attention import eager_attention

ROPE_BASE = 10000.0


class HalfPairRotary(nn.Module):
    """RoPE as a true rotation of channel pairs ``(j, j + d/2)`` by ``p·θ_j`` (the shared layer)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary(x, cos, sin)


class SeedPairRotary(nn.Module):
    """The seed's RoPE, kept for its checkpoints (``rope_layout="seed"``).

    ``x' = x ⊙ cos + R(x) ⊙ sin`` with ``R(x)_{2j} = -x_{2j+1}``, ``R(x)_{2j+1} = x_{2j}`` (adjacent
    pairs) while ``cos``/``sin`` hold the duplicated frequency vector ``[θ_0..θ_{d/2-1}, θ_0..]``: the
    two members of a pair turn by different angles, so this is not a rotation.

    Shapes:
        x ``[B, H, T, D]``, cos/sin ``[B, T, D]`` -> ``[B, H, T, D]``.
    """

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos = cos.unsqueeze(1).to(x.dtype)
        sin = sin.unsqueeze(1).to(x.dtype)
        turned = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        return x * cos + turned * sin


ROTARY_LAYOUTS = {"rotate_half": HalfPairRotary, "seed": SeedPairRotary}


class QueryOnlyRoPERetriever(nn.Module):
    """Sparse, strictly backward retrieval at chosen positions (seed 001's key primitive).

    Several positions per row are supported (``[B, Q]``, ``-1`` = no position), vectorised over the
    batch. With a :class:`KVState` the rotated keys and values of every token are cached, so a read
    at a decoded token costs one O(context) attention row. A position with nothing before it (the
    first real token of a row) reads nothing and is left unchanged (the seed returns NaN there).

    Args:
        dim: model width ``D``.
        retrieval_dim: width of Q/K/V (``H · d``).
        retrieval_heads: ``H``.
        dropout: dropout on the attention weights (training only).
        rope_layout: ``"rotate_half"`` or ``"seed"`` (see :class:`SeedPairRotary`).
        max_positions: initial length of the RoPE tables (grown on demand).
    Shapes:
        x ``[B, T, D]`` (the current tokens) -> ``[B, T, D]``.
    """

    def __init__(
        self,
        dim: int,
        retrieval_dim: int,
        retrieval_heads: int,
        dropout: float = 0.0,
        rope_layout: str = "rotate_half",
        max_positions: int = 2048,
    ) -> None:
        super().__init__()
        if retrieval_dim % retrieval_heads != 0:
            raise ValueError("retrieval_dim must be divisible by retrieval_heads")
        self.retrieval_dim = retrieval_dim
        self.retrieval_heads = retrieval_heads
        self.head_dim = retrieval_dim // retrieval_heads
        if self.head_dim % 2 != 0:
            raise ValueError("retrieval_dim / retrieval_heads must be even for RoPE")
        self.attn_dropout = float(dropout)
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, retrieval_dim)
        self.k = nn.Linear(dim, retrieval_dim)
        self.v = nn.Linear(dim, retrieval_dim)
        self.out = nn.Linear(retrieval_dim, dim)
        self.gate = nn.Linear(2 * dim, dim)
        self.rotary = RotaryEmbedding(self.head_dim, ROPE_BASE, 1.0, max_positions)
        self.rotate = ROTARY_LAYOUTS[rope_layout]()

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        position_ids: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        past: int = 0,
        state: KVState | None = None,
        weights: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Apply the retrieval reads that fall on the current tokens.

        Args:
            x: ``[B, T, D]`` hidden states of the current tokens (the last ``T`` of the sequence).
            positions: ``[B, Q]`` int64 column indices into the whole sequence (past + current);
                ``-1`` pads; columns before ``past`` were handled by earlier calls and are skipped.
            position_ids: ``[B, T]`` RoPE positions of the current tokens.
            key_mask: ``[B, past + T]`` bool, True = real token (None = no padding).
            past: number of cached tokens before ``x``.
            state: the retriever's :class:`KVState` when decoding through a cache.
            weights: the forward's attention-weight list (``output_attentions``): the read runs on the
                eager path and appends ``[B, H, T, past + T]``, whose row ``i`` is the read of current
                token ``i`` (zeros where the token is not a retrieval position).
        Returns:
            ``[B, T, D]``: ``x`` with the gated read added at the retrieval positions.
        """
        b, t, d = x.shape
        h = self.norm(x)
        cos, sin = self.rotary(position_ids)
        k = self.rotate(self.k(h).view(b, t, self.retrieval_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v(h).view(b, t, self.retrieval_heads, self.head_dim).transpose(1, 2)
        if state is not None:
            k, v = state.update(k, v)

        local = positions - past
        valid = (positions >= 0) & (local >= 0) & (local < t)
        if positions.shape[1] > t:  # at most T positions can fall on T tokens: drop the rest
            local = torch.where(valid, local, torch.full_like(local, t)).sort(dim=1).values[:, :t]
            valid = local < t
        # Without autograd (decoding) skip the read when no position falls here; with autograd always
        # run it, so every parameter is in the graph on every rank (DDP) and no host sync is needed.
        if positions.shape[1] == 0 or (not torch.is_grad_enabled() and not bool(valid.any())):
            if weights is not None:
                weights.append(x.new_zeros(b, self.retrieval_heads, t, k.shape[2]))
            return x
        idx = local.clamp(0, t - 1)  # [B, Q]
        qh = h.gather(1, idx[..., None].expand(-1, -1, d))  # [B, Q, D]
        qcos = cos.gather(1, idx[..., None].expand(-1, -1, cos.shape[-1]))
        qsin = sin.gather(1, idx[..., None].expand(-1, -1, sin.shape[-1]))
        q = self.q(qh).view(b, -1, self.retrieval_heads, self.head_dim).transpose(1, 2)
        q = self.rotate(q, qcos, qsin)  # [B, H, Q, d]

        key_cols = torch.arange(k.shape[2], device=x.device)
        allowed = key_cols[None, None, :] < (idx + past)[..., None]  # strictly before the query: [B, Q, S]
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, :]
        readable = allowed.any(-1)  # [B, Q]; rows with no key read nothing
        allowed = allowed | ~readable[..., None]
        dropout = self.attn_dropout if self.training else 0.0
        if weights is None:
            read = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], dropout_p=dropout)
        else:
            read, probs = eager_attention(q, k, v, AttentionBias(allowed[:, None], False), dropout)  # probs [B, H, Q, S]
            probs = probs * (valid & readable)[:, None, :, None].to(probs.dtype)
            rows = probs.new_zeros(b, self.retrieval_heads, t, k.shape[2])
            weights.append(rows.scatter_add(2, idx[:, None, :, None].expand_as(probs), probs))
        read = self.out(read.transpose(1, 2).reshape(b, -1, self.retrieval_dim))  # [B, Q, D]
        gate = torch.sigmoid(self.gate(torch.cat((qh, read), dim=-1)))
        delta = gate * read * (valid & readable)[..., None].to(read.dtype)
        return x.scatter_add(1, idx[..., None].expand(-1, -1, d), delta)
