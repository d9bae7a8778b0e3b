"""Attention masks and position ids, built once per forward and shared by the layers.

Conventions: ``attention_mask`` is the transformers 2-D mask ``[B, S]`` over past + current tokens
(1 = real token, 0 = padding). Masks passed to SDPA are boolean, ``True`` = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionBias:
    """What an attention layer passes to ``F.scaled_dot_product_attention``.

    ``mask`` is ``None`` when the pattern is plain causal over a fresh sequence (``is_causal``) or
    a single query with nothing to hide. ``weights`` is the forward's list of attention weights when
    the caller asked for them (``output_attentions=True``): every attention given this bias then
    runs the eager path and appends its ``[B, H, T, S]`` probabilities (see ``layers.attention.sdpa``).
    """

    mask: torch.Tensor | None
    is_causal: bool
    weights: list[torch.Tensor] | None = None

    def visible(self, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
        """The boolean pattern ``[B | 1, 1, q_len, kv_len]`` (``True`` = may attend) this bias stands
        for, or None when every query sees every key."""
        if self.mask is not None:
            return self.mask
        if self.is_causal:  # SDPA's is_causal: query i sees keys <= i (top-left aligned)
            return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril()[None, None]
        return None


def has_padding(attention_mask: torch.Tensor | None) -> bool:
    """Whether ``attention_mask`` hides any position. A captured graph (torch.export, ONNX,
    torch.compile) cannot branch on the mask's values: it always takes the padded path, which is
    exact for an all-ones mask too."""
    if attention_mask is None:
        return False
    return torch.compiler.is_compiling() or not bool(attention_mask.all())


def position_ids_from_mask(
    attention_mask: torch.Tensor | None, past_length: int, q_len: int, batch_size: int, device: torch.device
) -> torch.Tensor:
    """Positions ``[B, T]`` of the current tokens: counted over real tokens only, so a left-padded
    row starts at 0 at its first real token."""
    if attention_mask is None:
        return torch.arange(past_length, past_length + q_len, device=device).expand(batch_size, q_len)
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp_(min=0)[:, -q_len:]


def causal_bias(
    attention_mask: torch.Tensor | None,
    q_len: int,
    kv_len: int,
    device: torch.device,
    sliding_window: int | None = None,
) -> AttentionBias:
    """The causal (optionally sliding-window) bias for ``q_len`` queries over ``kv_len`` keys,
    the queries being the last ``q_len`` of the keys.

    Query rows that may see nothing (a padded slot at the left edge) are allowed to see every
    key so SDPA returns finite values; those rows are padding and never read by real tokens.
    """
    padded = has_padding(attention_mask)
    if not padded and sliding_window is None:
        if q_len == kv_len:
            return AttentionBias(None, True)
        if q_len == 1:
            return AttentionBias(None, False)
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        allowed = allowed & (k_pos > q_pos - sliding_window)
    allowed = allowed[None, None]
    if padded:
        allowed = allowed & attention_mask[:, None, None, -kv_len:].bool()
        allowed = allowed | ~allowed.any(-1, keepdim=True)
    return AttentionBias(allowed, False)
