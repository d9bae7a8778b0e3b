"""Per-layer decoding state of a NeoLLM attention layer (docs/neollm-attention.md#decoding-state).

What crosses time in one layer: the final keys/values (post IHA mixing, rotation and shear), the
momentum one-token state (the last rotated, pre-shear q and k plus a has-predecessor flag) and the
IHA window frozen by the first cached call. Everything else in the block is per token.
"""

from __future__ import annotations

import torch

from .....layers.cache import CannotBatch, KVState, join_rows, same_setting


class NeoLLMAttentionState(KVState):
    """Keys/values ``[B, H_kv, S·P, D]`` in the interleaved pseudo-token layout (token ``s``, slot
    ``p`` at index ``s·P + p``), plus:

    Attributes:
        prev_q: ``[B, 1, H, P, D]`` last rotated pre-shear query (None before the first call).
        prev_k: ``[B, 1, H_kv, P, D]`` last rotated pre-shear key.
        has_prev: ``[B]`` bool, a token was already seen in this row.
        window: the IHA window ``W`` frozen by the first cached call: an int, or a ``[B]`` tensor of per-row
            windows when it was derived from each row's real length (None until then / on non-local layers).
        pseudo_heads: ``P`` of this layer (for token counts).

    Tensors all have the batch on dim 0, so beam reordering and repetition work unchanged; a batch
    join concatenates the momentum state and per-row windows, and needs an int window to agree.
    """

    def __init__(self, pseudo_heads: int = 1) -> None:
        super().__init__()
        self.prev_q: torch.Tensor | None = None
        self.prev_k: torch.Tensor | None = None
        self.has_prev: torch.Tensor | None = None
        self.window: int | torch.Tensor | None = None
        self.pseudo_heads = pseudo_heads

    @property
    def slots_per_token(self) -> int:
        """``P`` key/value slots per token (the interleaved pseudo-token layout)."""
        return self.pseudo_heads

    @property
    def num_tokens(self) -> int:
        """Cached tokens (not pseudo-tokens)."""
        return self.length // self.pseudo_heads

    def crop_refusal(self) -> str | None:
        """Refused when the state summarises the last token (momentum) or holds pseudo-tokens."""
        if self.pseudo_heads != 1:
            return "IHA layers store interleaved pseudo-tokens; re-run the prefill instead"
        if self.prev_q is not None:
            return "the momentum shear keeps the last token's pre-shear q/k; re-run the prefill instead"
        return None

    def crop(self, length: int) -> None:
        reason = self.crop_refusal()
        if reason is not None:
            raise ValueError(f"a NeoLLM attention state cannot be cropped: {reason}")
        super().crop(length)

    def join(self, other: NeoLLMAttentionState) -> None:
        same_setting(self.pseudo_heads, other.pseudo_heads, "NeoLLMAttentionState.pseudo_heads")
        if isinstance(self.window, torch.Tensor) != isinstance(other.window, torch.Tensor):
            raise CannotBatch("NeoLLMAttentionState.window is set in one cache only")
        if not isinstance(self.window, torch.Tensor):
            same_setting(self.window, other.window, "NeoLLMAttentionState.window")
        name = "NeoLLMAttentionState"
        prev_q = join_rows(self.prev_q, other.prev_q, f"{name}.prev_q")
        prev_k = join_rows(self.prev_k, other.prev_k, f"{name}.prev_k")
        has_prev = join_rows(self.has_prev, other.has_prev, f"{name}.has_prev")
        window = join_rows(self.window, other.window, f"{name}.window") if isinstance(self.window, torch.Tensor) else self.window
        super().join(other)
        self.prev_q, self.prev_k, self.has_prev, self.window = prev_q, prev_k, has_prev, window
