"""What every slmlab causal LM shares: input validation, the loss, cache handling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from ..layers.cache import LayerState, ModelCache
from ..layers.fused import frozen_weights
from ..layers.masks import AttentionBias, position_ids_from_mask

logger = logging.get_logger(__name__)


def validate_input_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise an actionable error for ids a model cannot embed."""
    if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [batch, seq_len], got {tuple(input_ids.shape)}")
    # The range check reads the ids' values, which a captured graph (torch.export, torch.onnx.export,
    # torch.compile(fullgraph=True)) cannot branch on: it is an eager-only check, and a caller of a
    # captured graph validates its ids itself (docs/graph-capture.md).
    if input_ids.numel() and not torch.compiler.is_compiling():
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"token id {bad} is outside the vocabulary [0, {vocab_size}); check that the tokenizer matches the"
                " model (config.vocab_size)"
            )


_MAX_POSITIONS = "max_position_embeddings"


def validate_length(total_length: int, max_positions: int | None, field: str = "max_position_embeddings") -> None:
    if max_positions is not None and total_length > max_positions:
        raise ValueError(
            f"sequence length {total_length} (cached + new tokens) exceeds {field}={max_positions}; shorten the input"
            " or build the model with a larger context"
        )


def validate_nonempty(shape: tuple[int, ...], name: str) -> None:
    """An empty batch or an empty sequence reaches no layer: say so before torch does."""
    if shape[0] == 0 or shape[1] == 0:
        what = "batch" if shape[0] == 0 else "sequence"
        raise ValueError(f"{name} has an empty {what} (shape {tuple(shape)}); pass at least one sequence of at least one token")


def validate_position_ids(position_ids: torch.Tensor, batch: int, length: int) -> None:
    if tuple(position_ids.shape) not in ((batch, length), (1, length)):
        raise ValueError(
            f"position_ids must have shape [batch, seq_len] = {(batch, length)} (or [1, seq_len]), got {tuple(position_ids.shape)}"
        )


def validate_labels(labels: torch.Tensor, shape: tuple[int, int], vocab_size: int, ignore_index: int = -100) -> None:
    """``labels`` are aligned with the inputs: same ``[batch, seq_len]``, ids in ``[0, V)`` or ``ignore_index``."""
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(
            f"labels must have the inputs' shape [batch, seq_len] = {tuple(shape)}, got {tuple(labels.shape)}; labels are"
            " aligned with input_ids (the model shifts them)"
        )
    if labels.is_floating_point():
        raise TypeError(f"labels must be an integer tensor, got dtype {labels.dtype}")
    if torch.compiler.is_compiling():  # the range check reads values: eager only (see validate_input_ids)
        return
    bad = labels[(labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))]
    if bad.numel():
        raise ValueError(
            f"label {int(bad[0])} is outside the vocabulary [0, {vocab_size}); use {ignore_index} for positions that do not"
            " count, and check that the tokenizer matches the model (config.vocab_size)"
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


@dataclass
class SLMModelOutput(BaseModelOutputWithPast):
    """``BaseModelOutputWithPast`` plus ``aux_loss``: the sum of the (already weighted) auxiliary
    losses the layers added during the forward, or None when none was collected."""

    aux_loss: torch.FloatTensor | None = None


@dataclass
class SLMCausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus ``aux_loss``. With labels, ``loss`` already includes
    ``aux_loss`` (so transformers' Trainer and slmlab's trainer optimise both); ``aux_loss`` reports
    the auxiliary part alone, and is None for families without one or without labels."""

    aux_loss: torch.FloatTensor | None = None


class SLMPreTrainedModel(PreTrainedModel):
    """Base class of every slmlab model: it builds its own :class:`ModelCache` (so ``generate()``
    must not create a ``DynamicCache`` for it). The input embedding table is found by
    transformers' ``get/set_input_embeddings`` under ``_input_embed_layer`` (``embed_tokens``)."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        """An empty cache for this model. Families override this."""
        raise TypeError(f"{type(self).__name__} does not define a decoding cache")

    def crop_refusal(self) -> str | None:
        """Why this model's cache cannot be rolled back (what assisted and prompt-lookup decoding do
        after each draft), or None when it can. Read from a fresh cache that records its past;
        a family whose refusal depends on what a forward stores overrides this."""
        cache = self.new_cache(1)
        cache.activate_past_recording()
        return cache.crop_refusal()

    def max_positions(self) -> int | None:
        """The longest sequence (cached + new tokens) the model accepts; None: unbounded. Every
        family's config names it ``max_position_embeddings`` (an alias where the family has its own
        name, e.g. Lumen's ``max_seq_len`` or PGSM's ``block_size``)."""
        return getattr(self.config, _MAX_POSITIONS, None)


@dataclass
class ForwardInputs:
    """What a family's layer loop receives from the shared forward frame.

    Args:
        embeds: ``[B, T, d]`` input embeddings.
        cache: the cache to read and update (built fresh when ``use_cache`` and none was given), or None.
        past: tokens already in the cache.
        position_ids: ``[B, T]`` positions of the current tokens (real tokens only under left padding).
        use_cache: whether the caller asked for the cache back.
        decoding: the caller passed a cache or asked for one explicitly (``use_cache=True``), as
            ``generate()`` does; a plain forward (training) is not decoding.
        input_ids: ``[B, T]`` token ids, or None when the caller passed ``inputs_embeds``.
        attention_mask: ``[B, past + T]``, 1 = real token, 0 = padding (left padding), or None.
        hidden_states: the per-layer outputs collected so far when ``output_hidden_states``, else None.
        attentions: the attention weights collected so far when ``output_attentions``, else None
            (attention layers append to it through the bias they are given: :meth:`collect_weights`).
        aux_losses: the auxiliary losses (weighted scalars) a family's layers added, collected only when
            the causal LM has labels (else None); the frame sums them into ``aux_loss``.
    """

    embeds: torch.Tensor
    cache: ModelCache | None
    past: int
    position_ids: torch.Tensor
    use_cache: bool
    decoding: bool = False
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    hidden_states: list[torch.Tensor] | None = None
    attentions: list[torch.Tensor] | None = None
    aux_losses: list[torch.Tensor] | None = None

    @property
    def length(self) -> int:
        """``T``, the number of tokens in this call."""
        return self.embeds.shape[1]

    def state(self, index: int) -> LayerState | None:
        """Layer ``index``'s cache entry, or None without a cache."""
        return self.cache[index] if self.cache is not None else None

    def record(self, hidden: torch.Tensor) -> None:
        """Keep one layer's output for ``output_hidden_states`` (a no-op when not asked for)."""
        if self.hidden_states is not None:
            self.hidden_states.append(hidden)

    def collect_weights(self, bias: AttentionBias) -> AttentionBias:
        """Hand ``bias`` the list of attention weights when ``output_attentions`` was asked for, so
        every attention layer that reads it runs the eager path and appends its probabilities
        (``layers.attention.sdpa``); returns ``bias``."""
        bias.weights = self.attentions
        return bias


def prepare_inputs(
    model: SLMBaseModel,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: ModelCache | None,
    use_cache: bool | None,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
) -> ForwardInputs:
    """The boundary of every base model's forward: validate the inputs, embed them, pick or build
    the cache, check the length and the mask, and derive position ids from the mask."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    config = model.config
    decoding = cache is not None or use_cache is True
    if input_ids is not None:
        validate_input_ids(input_ids, config.vocab_size)
        validate_nonempty(tuple(input_ids.shape), "input_ids")
        inputs_embeds = model.embed(input_ids)
    else:
        model.check_inputs_embeds(inputs_embeds)
        validate_nonempty(tuple(inputs_embeds.shape), "inputs_embeds")
    use_cache = bool(getattr(config, "use_cache", True) if use_cache is None else use_cache)
    if use_cache and cache is None:
        cache = model.new_cache(inputs_embeds.shape[0])
    b, t, _ = inputs_embeds.shape
    past = cache.seen_tokens if cache is not None else 0
    validate_length(past + t, model.max_positions(), type(config).attribute_map.get(_MAX_POSITIONS, _MAX_POSITIONS))
    if attention_mask is not None and tuple(attention_mask.shape) != (b, past + t):
        raise ValueError(
            f"attention_mask must have shape [batch, past + seq_len] = {(b, past + t)}, got {tuple(attention_mask.shape)}"
        )
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask, past, t, b, inputs_embeds.device)
    else:
        validate_position_ids(position_ids, b, t)
    hidden_states = [inputs_embeds] if output_hidden_states else None
    return ForwardInputs(
        inputs_embeds, cache, past, position_ids, use_cache, decoding, input_ids, attention_mask, hidden_states,
        [] if output_attentions else None,
    )


class SLMBaseModel(SLMPreTrainedModel):
    """The forward frame every family's base model shares.

    ``forward`` validates and embeds the inputs, picks or builds the cache, derives positions
    (:func:`prepare_inputs`), runs the family's :meth:`layer_loop`, advances the cache by the
    tokens of the call and returns a ``BaseModelOutputWithPast`` (with ``hidden_states`` when
    asked). A family implements only :meth:`layer_loop`: its maths. Hooks a family may override:
    :meth:`embed` (token ids to vectors) and :meth:`check_inputs_embeds`; ``family_inputs`` names
    the extra forward keyword arguments handed to :meth:`layer_loop` (PGSM's
    ``retrieval_positions``).
    """

    family_inputs: tuple[str, ...] = ()
    # True after gradient_checkpointing_enable(): each decoder layer (a transformers
    # GradientCheckpointingLayer) is recomputed in backward instead of keeping its activations
    gradient_checkpointing = False

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` token ids -> ``[B, T, d]`` input embeddings."""
        return self.get_input_embeddings()(input_ids)

    def check_inputs_embeds(self, inputs_embeds: torch.Tensor) -> None:
        """Raise an actionable error for ``inputs_embeds`` this model cannot take."""
        validate_embeds(inputs_embeds, self.config.hidden_size)

    def layer_loop(self, inputs: ForwardInputs, **family_inputs) -> torch.Tensor:
        """The family's stack over ``inputs.embeds``: returns the final (normalised) hidden state
        ``[B, T, d]``. Layer ``i`` reads and updates ``inputs.state(i)``; after each layer the loop
        calls ``inputs.record(x)`` (the hidden states transformers returns: the embeddings, then
        one entry per layer, the last replaced by the returned, normalised state)."""
        raise TypeError(f"{type(self).__name__} must define layer_loop(inputs) (see SLMBaseModel)")

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: ModelCache | None = None,
        return_dict: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        collect_aux_loss: bool = False,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Args:
            input_ids: ``[B, T]`` token ids (or ``inputs_embeds [B, T, d]``).
            attention_mask: ``[B, past + T]``, 1 = real token, 0 = padding (left padding).
            position_ids: ``[B, T]``; by default counted over real tokens only.
            cache: a :class:`ModelCache` from an earlier call (built here when ``use_cache``);
                ``past_key_values`` is the older name of the same argument.
            use_cache: build/return a cache (default ``config.use_cache``); never under gradient
                checkpointing in training (a checkpointed layer runs twice).
            return_dict: False returns the output's ``to_tuple()`` (default ``config.return_dict``).
            output_hidden_states: also return the embeddings and every layer's output
                (default ``config.output_hidden_states``).
            output_attentions: also return the attention weights ``[B, H, T, S]`` of every attention
                layer, in layer order, computed on the eager path (default ``config.output_attentions``).
                Layers without attention (convolutions) add no entry, as in transformers' LFM2.
            collect_aux_loss: let the layers add their auxiliary losses (the causal LM asks when it
                has labels); their sum is the output's ``aux_loss`` (None when none was added).
            kwargs: the family inputs named in ``family_inputs``; other keys are ignored.
        """
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # a checkpointed layer runs again in backward: a cache would be written twice, so none is kept
            if use_cache or cache is not None or past_key_values is not None:
                logger.warning_once("gradient checkpointing is on: the forward keeps no cache (use_cache=False)")
            cache = past_key_values = None
            use_cache = False
        if output_hidden_states is None:
            output_hidden_states = bool(getattr(self.config, "output_hidden_states", False))
        if output_attentions is None:
            output_attentions = bool(getattr(self.config, "output_attentions", False))
        inputs = prepare_inputs(
            self, input_ids, inputs_embeds, attention_mask, position_ids, resolve_cache_arg(cache, past_key_values),
            use_cache, output_hidden_states, output_attentions,
        )
        inputs.aux_losses = [] if collect_aux_loss else None
        hidden = self.layer_loop(inputs, **{name: kwargs[name] for name in self.family_inputs if name in kwargs})
        if inputs.cache is not None:
            inputs.cache.advance(inputs.length)
        hidden_states = None
        if inputs.hidden_states is not None:
            inputs.hidden_states[-1] = hidden
            hidden_states = tuple(inputs.hidden_states)
        aux_loss = torch.stack(inputs.aux_losses).sum() if inputs.aux_losses else None
        attentions = tuple(inputs.attentions) if inputs.attentions is not None else None
        output = SLMModelOutput(
            last_hidden_state=hidden, cache=inputs.cache if inputs.use_cache else None, hidden_states=hidden_states,
            attentions=attentions, aux_loss=aux_loss,
        )
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()


class SLMForCausalLM(SLMPreTrainedModel, GenerationMixin):
    """A family's causal LM: its base model (``self.model``) plus an LM head, tied to the
    embedding table when ``config.tie_word_embeddings``.

    A family sets ``base_model_class`` (and ``_tied_weights_keys`` if its table is not
    ``model.embed_tokens``); family-specific forward inputs (PGSM's ``retrieval_positions``) pass
    through ``**family_inputs`` to the base model. ``labels`` are shifted inside; auxiliary losses
    the layers add (``ForwardInputs.aux_losses``) are added to ``loss`` and reported as ``aux_loss``
    (:meth:`weighted_aux_loss`). A family with a decode plan
    (:mod:`slmlab.generation.plan`) sets ``decode_plan_builder``.
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

    def embedding_rows(self) -> dict[str, int]:
        """The audit rows of the token table and the LM head, shared by every family's audit:
        ``{"Tied embedding table": n}`` when the head reuses the table, else the table and
        ``"LM head (untied)"``."""
        table, head = self.get_input_embeddings().weight, self.lm_head.weight
        if head is table:
            return {"Tied embedding table": table.numel()}
        return {"Embedding table": table.numel(), "LM head (untied)": head.numel()}

    def decode_plan(self, capacity: int):
        """An inference-only one-token step over ``capacity`` positions, or None if the family has none."""
        builder = type(self).decode_plan_builder
        return None if builder is None else builder(self, capacity)

    def generate(self, *args, **kwargs):
        """transformers' ``generate``; weights are frozen for its duration (fused weights cached). A draft
        model (``assistant_model=``) whose cache cannot be rolled back is refused up front, naming why."""
        assistant = kwargs.get("assistant_model")
        refusal = getattr(assistant, "crop_refusal", None)
        reason = refusal() if callable(refusal) else None
        if reason is not None:
            raise ValueError(
                f"assisted decoding rolls the draft model's cache back after each draft, and the draft"
                f" {type(assistant).__name__}'s cannot be: {reason}"
            )
        with frozen_weights():
            out = super().generate(*args, **kwargs)
        if getattr(kwargs.get("generation_config"), "is_assistant", False):
            return out  # a draft model's cache: the assisted loop crops it again after this call
        for cache in (kwargs.get("cache"), kwargs.get("past_key_values"), getattr(out, "cache", None)):
            if isinstance(cache, ModelCache):  # assisted decoding made conv states record their inputs
                cache.stop_past_recording()
        return out

    def _prepare_cache_for_generation(
        self, generation_config, model_kwargs: dict, generation_mode, batch_size: int, max_cache_length: int
    ) -> None:
        """transformers' ``generate`` hook, for our cache: a :class:`ModelCache` from the first step
        (so assisted decoding finds one), a returned cache to continue from (``past_key_values=``),
        and clear refusals for what the family cannot do."""
        impl = generation_config.cache_implementation
        if impl not in (None, "dynamic"):
            plan = (
                f"{type(self).__name__}'s decode plan preallocates fixed-size buffers and compiles one step"
                if type(self).decode_plan_builder is not None
                else f"{type(self).__name__} has no decode plan yet, so it decodes through its ModelCache there too"
            )
            raise ValueError(
                f"cache_implementation={impl!r} is not supported: slmlab models decode through their own growing"
                " ModelCache (continue from a returned one with past_key_values=). The fixed-size, compiled fast path"
                f" is slmlab.generation's decode plans: slmlab.generation.generate(model, input_ids, ..., compile=True)"
                f" ({plan})"
            )
        if generation_mode == GenerationMode.ASSISTED_GENERATION:
            reason = self.crop_refusal()
            if reason is not None:
                raise ValueError(
                    f"assisted and prompt-lookup decoding roll the cache back after each draft, and {type(self).__name__}'s"
                    f" cache cannot be rolled back: {reason}. Use plain generate() (greedy or sampling) instead"
                )
        cache = model_kwargs.get("cache")
        if cache is not None:
            resolve_cache_arg(cache, None)  # a DynamicCache or a tuple gets our actionable TypeError
            cache._is_user_defined = True
            return
        if generation_config.use_cache is False:
            return
        cache = self.new_cache(batch_size)
        if generation_config.is_assistant:
            cache.activate_past_recording()
        model_kwargs["cache"] = cache

    def _validate_model_kwargs(self, model_kwargs: dict) -> None:
        # family inputs reach the base model through **family_inputs: generate() must accept their names
        family = set(self.model.family_inputs)
        super()._validate_model_kwargs({k: v for k, v in model_kwargs.items() if k not in family})

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor, base_output, num_items_in_batch=None) -> torch.Tensor:
        return causal_lm_loss(logits, labels, getattr(self.config, "ignore_index", -100), num_items_in_batch)

    def weighted_aux_loss(self, aux_loss: torch.Tensor | None, labels: torch.Tensor, num_items_in_batch=None):
        """The auxiliary term added to ``loss``: ``aux_loss`` itself, or, when ``num_items_in_batch``
        is given (gradient accumulation: each micro-batch's cross entropy is a sum over the whole
        step's counted tokens), ``aux_loss`` times this micro-batch's share of them, so the
        accumulated micro-batches add up to one token-weighted auxiliary term per step."""
        if aux_loss is None or num_items_in_batch is None:
            return aux_loss
        counted = (labels[:, 1:] != getattr(self.config, "ignore_index", -100)).sum().to(aux_loss)
        return aux_loss * counted / torch.as_tensor(num_items_in_batch, device=aux_loss.device, dtype=aux_loss.dtype)

    def scored_logits_and_loss(self, hidden: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None):
        """The LM head only where the shifted label is scored (``forward(..., scored_only=True)``).

        Synthetic tasks score a few positions per row (MQAR: ``N`` of ``T``), so the ``[B, T, V]``
        output projection is mostly wasted; gathering the scored hidden states first gives the same
        loss and gradients (the ignored positions contribute nothing to either).

        Args:
            hidden: ``[B, T, d]`` final hidden states.
            labels: ``[B, T]`` aligned labels (shifted here, as :func:`causal_lm_loss` does).
        Returns:
            ``(logits [n, V], loss)``: one row per scored prediction, in row-major order of ``(b, p)``.
        """
        ignore = getattr(self.config, "ignore_index", -100)
        target = F.pad(labels[:, 1:], (0, 1), value=ignore).to(hidden.device)
        keep = target != ignore
        logits = self.lm_head(hidden[keep])
        if num_items_in_batch is None:
            return logits, F.cross_entropy(logits.float(), target[keep])
        total = F.cross_entropy(logits.float(), target[keep], reduction="sum")
        return logits, total / torch.as_tensor(num_items_in_batch, device=total.device, dtype=total.dtype)

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
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        scored_only: bool = False,
        **family_inputs,
    ) -> CausalLMOutputWithPast:
        """transformers' causal-LM forward; ``scored_only=True`` (with ``labels``) runs the LM head only
        at the positions whose shifted label is not ``ignore_index`` (:meth:`scored_logits_and_loss`):
        the same loss, ``logits`` of shape ``[n_scored, V]``."""
        if labels is not None:
            given = input_ids if input_ids is not None else inputs_embeds
            if given is not None:
                validate_labels(labels, tuple(given.shape[:2]), self.config.vocab_size, getattr(self.config, "ignore_index", -100))
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            past_key_values=past_key_values,
            return_dict=True,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            collect_aux_loss=labels is not None,
            **family_inputs,
        )
        hidden = out.last_hidden_state
        if scored_only and labels is not None:
            logits, loss = self.scored_logits_and_loss(hidden, labels, num_items_in_batch)
        else:
            if logits_to_keep:
                hidden = hidden[:, -logits_to_keep:]
            logits = self.lm_head(hidden)
            loss = self.compute_loss(logits, labels, out, num_items_in_batch) if labels is not None else None
        aux_loss = None
        if loss is not None:
            aux_loss = self.weighted_aux_loss(getattr(out, "aux_loss", None), labels, num_items_in_batch)
            loss = loss if aux_loss is None else loss + aux_loss
        result = SLMCausalLMOutput(
            loss=loss, logits=logits, cache=out.cache, hidden_states=out.hidden_states, attentions=out.attentions,
            aux_loss=aux_loss,
        )
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return result if return_dict else result.to_tuple()
