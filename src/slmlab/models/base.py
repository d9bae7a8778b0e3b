"""What every slmlab causal LM shares: input validation, the loss, cache handling."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..layers.cache import ModelCache


def validate_input_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise an actionable error for ids a model cannot embed."""
    if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}")
    if input_ids.numel():
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"token id {bad} is outside the vocabulary [0, {vocab_size}); check that the tokenizer matches the"
                " model (config.vocab_size)"
            )


def validate_length(total_length: int, max_positions: int | None, field: str = "max_position_embeddings") -> None:
    if max_positions is not None and total_length > max_positions:
        raise ValueError(
            f"sequence length {total_length} (cached + new tokens) exceeds {field}={max_positions}; shorten the input"
            " or build the model with a larger context"
        )


def validate_embeds(inputs_embeds: torch.Tensor, hidden_size: int) -> None:
    if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden_size:
        raise ValueError(f"inputs_embeds must have shape [batch, seq_len, {hidden_size}], got {tuple(inputs_embeds.shape)}")
    if not inputs_embeds.is_floating_point():
        raise TypeError(f"inputs_embeds must be floating point, got {inputs_embeds.dtype}")


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Next-token cross entropy: ``labels`` are aligned with the inputs and shifted here, as in
    transformers; positions labelled ``ignore_index`` do not count."""
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    shift_labels = labels[:, 1:].reshape(-1).to(logits.device)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=ignore_index)


def resolve_cache_arg(cache, past_key_values):
    """Accept both ``cache`` (transformers >= 5.24) and the older ``past_key_values`` name."""
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("pass the cache as `cache` or `past_key_values`, not both")
    cache = cache if cache is not None else past_key_values
    if cache is not None and not isinstance(cache, ModelCache):
        raise TypeError(
            f"slmlab models decode through slmlab.layers.ModelCache, got {type(cache).__name__}; let the model build"
            " its cache (use_cache=True) or call model.new_cache()"
        )
    return cache


class SLMPreTrainedModel(PreTrainedModel):
    """Base class of every slmlab model: it builds its own :class:`ModelCache` (so ``generate()``
    must not create a ``DynamicCache`` for it)."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _supports_sdpa = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        """An empty cache for this model. Families override this."""
        raise TypeError(f"{type(self).__name__} does not define a decoding cache")
