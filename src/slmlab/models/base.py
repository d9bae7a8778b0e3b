"""What every slmlab causal LM shares: input validation, the loss, cache handling."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..layers.cache import ModelCache
from ..layers.fused import frozen_weights
from ..layers.masks import position_ids_from_mask


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


def causal_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100, num_items_in_batch=None
) -> torch.Tensor:
    """Next-token cross entropy in fp32: ``labels`` are aligned with the inputs and shifted here,
    as in transformers; positions labelled ``ignore_index`` do not count. The mean is over counted
    tokens, or the sum divided by ``num_items_in_batch`` when given (gradient accumulation)."""
    # shift the labels, not the logits: no copy of the [B, T, V] logits (nor a zero-fill in backward)
    shift_logits = logits.reshape(-1, logits.shape[-1]).float()
    shift_labels = F.pad(labels[:, 1:], (0, 1), value=ignore_index).reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return F.cross_entropy(shift_logits, shift_labels, ignore_index=ignore_index)
    total = F.cross_entropy(shift_logits, shift_labels, ignore_index=ignore_index, reduction="sum")
    return total / torch.as_tensor(num_items_in_batch, device=total.device, dtype=total.dtype)


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
    must not create a ``DynamicCache`` for it). The input embedding table is found by
    transformers' ``get/set_input_embeddings`` under ``_input_embed_layer`` (``embed_tokens``)."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _supports_sdpa = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        """An empty cache for this model. Families override this."""
        raise TypeError(f"{type(self).__name__} does not define a decoding cache")


@dataclass
class StepInputs:
    """What a base model's forward needs after the shared boundary checks.

    Args:
        embeds: ``[B, T, d]`` input embeddings.
        cache: the cache to read and update (built fresh when ``use_cache`` and none was given), or None.
        past: tokens already in the cache.
        position_ids: ``[B, T]`` positions of the current tokens (real tokens only under left padding).
        use_cache: whether the caller asked for the cache back.
    """

    embeds: torch.Tensor
    cache: ModelCache | None
    past: int
    position_ids: torch.Tensor
    use_cache: bool


def prepare_step(
    model: "SLMPreTrainedModel",
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: ModelCache | None,
    past_key_values: ModelCache | None,
    use_cache: bool | None,
    embed: Callable[[torch.Tensor], torch.Tensor] | None,
    max_positions: int | None,
    positions_field: str = "max_position_embeddings",
) -> StepInputs:
    """The boundary of every base model's forward: validate the inputs, embed them, pick or build
    the cache, check the length and the mask, and derive position ids from the mask."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    cache = resolve_cache_arg(cache, past_key_values)
    config = model.config
    if input_ids is not None:
        validate_input_ids(input_ids, config.vocab_size)
        inputs_embeds = embed(input_ids)
    else:
        validate_embeds(inputs_embeds, config.hidden_size)
    use_cache = bool(getattr(config, "use_cache", True) if use_cache is None else use_cache)
    if use_cache and cache is None:
        cache = model.new_cache(inputs_embeds.shape[0])
    b, t, _ = inputs_embeds.shape
    past = cache.seen_tokens if cache is not None else 0
    validate_length(past + t, max_positions, positions_field)
    if attention_mask is not None and tuple(attention_mask.shape) != (b, past + t):
        raise ValueError(
            f"attention_mask must have shape [batch, past + seq_len] = {(b, past + t)}, got {tuple(attention_mask.shape)}"
        )
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask, past, t, b, inputs_embeds.device)
    return StepInputs(inputs_embeds, cache, past, position_ids, use_cache)


class SLMForCausalLM(SLMPreTrainedModel, GenerationMixin):
    """A family's causal LM: its base model (``self.model``) plus an LM head, tied to the
    embedding table when ``config.tie_word_embeddings``.

    A family sets ``base_model_class`` (and ``_tied_weights_keys`` if its table is not
    ``model.embed_tokens``); family-specific forward inputs (PGSM's ``retrieval_positions``) pass
    through ``**family_inputs`` to the base model. ``labels`` are shifted inside; a family with
    auxiliary losses overrides :meth:`compute_loss`. A family with a decode plan
    (:mod:`slmlab.layers.decode`) sets ``decode_plan_builder``.
    """

    base_model_class: type[nn.Module]
    decode_plan_builder: Callable | None = None  # (model, capacity) -> DecodePlan
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config) -> None:
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        return self.model.new_cache(batch_size)

    def max_positions(self) -> int | None:
        """The longest sequence the model accepts (None: unbounded)."""
        for name in ("max_seq_len", "max_position_embeddings", "block_size"):
            if getattr(self.config, name, None):
                return int(getattr(self.config, name))
        return None

    def decode_plan(self, capacity: int):
        """An inference-only one-token step over ``capacity`` positions, or None if the family has none."""
        builder = type(self).decode_plan_builder
        return None if builder is None else builder(self, capacity)

    def generate(self, *args, **kwargs):
        """transformers' ``generate``; weights are frozen for its duration (fused weights cached)."""
        with frozen_weights():
            return super().generate(*args, **kwargs)

    def _validate_model_kwargs(self, model_kwargs: dict) -> None:
        # family inputs reach the base model through **family_inputs: generate() must accept their names
        family = set(inspect.signature(self.model.forward).parameters) - {"kwargs"}
        super()._validate_model_kwargs({k: v for k, v in model_kwargs.items() if k not in family})

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor, base_output, num_items_in_batch=None) -> torch.Tensor:
        return causal_lm_loss(logits, labels, getattr(self.config, "ignore_index", -100), num_items_in_batch)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ModelCache | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch=None,
        **family_inputs,
    ) -> CausalLMOutputWithPast:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=resolve_cache_arg(cache, past_key_values),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **family_inputs,
        )
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = self.compute_loss(logits, labels, out, num_items_in_batch) if labels is not None else None
        result = CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=out.cache, hidden_states=getattr(out, "hidden_states", None)
        )
        return result if return_dict is not False else result.to_tuple()
