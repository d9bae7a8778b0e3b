"""Per-layer decoding state of a NeoLLM attention layer (docs/neollm-attention.md#decoding-state).

What crosses time in one layer: the final keys/values (post IHA mixing, rotation and shear), the
momentum one-token state (the last rotated, pre-shear q and k plus a has-predecessor flag) and the
IHA window frozen by the first cached call. Everything else in the block is per token.
"""

from __future__ import annotations

import torch

from .....layers.cache import KVState


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

    Tensors all have the batch on dim 0, so beam reordering and repetition work unchanged.
    """

    def __init__(self, pseudo_heads: int = 1) -> None:
        super().__init__()
        self.prev_q: torch.Tensor | None = None
        self.prev_k: torch.Tensor | None = None
        self.has_prev: torch.Tensor | None = None
        self.window: int | torch.Tensor | None = None
        self.pseudo_heads = pseudo_heads

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
