"""NeoLLM (seed 000) as a transformers causal LM, assembled from one module per mechanism.

Forward with the default flags (``docs/neollm.md#forward``)::

    e = ½(W_E[ids] + Spell(ids))                    # Spelling Bee (docs/neollm.md#spelling-bee)
    x = y = e                                       # SiameseNorm streams (docs/neollm-residual.md#siamesenorm)
    per layer l:  x ← RMSNorm_ax(x); u = RMSNorm_ai(s ⊙ x + RMSNorm_ay(y))
                  a = Dropout(Attn_l(u));           x ← x + a / c_l;  y ← y + a
                  x ← RMSNorm_mx(x); u = RMSNorm_mi(x + RMSNorm_my(y))
                  m = MLP_l(u);                     x ← x + m / c_l;  y ← y + m
    logits = lm_head(RMSNorm_f(RMSNorm_fx(x) + RMSNorm_fy(y)))

Every mechanism builds itself once in ``__init__`` with ``Mechanism.from_config(config, layer_idx)``
(the mechanism or its identity twin). The token source is the ``V × D`` table ``embed_tokens`` or
the Leviathan generator ``token_generator`` (``docs/neollm.md#token-generator``); with JTok-M each
layer adds a token-indexed modulation to its MLP update and a balance loss to the output's
``aux_loss`` (``docs/neollm.md#jtok-m``). Cross-layer state lives in one :class:`ResidualState` owned by the residual flow
(``docs/neollm-residual.md#residual-state-and-flows``), and per-forward values in one
:class:`ForwardContext`. The only cross-time state is each attention layer's own state in the
:class:`ModelCache`; everything else here is position-wise, so decoding equals the full forward.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer

from ...layers import ModelCache
from ..base import ForwardInputs, SLMBaseModel, SLMForCausalLM, SLMPreTrainedModel, validate_embeds
from .components import EmbeddingMultipliers, LayerFlow, NeoLLMMLP, Readout, RowMultipliedLinear, SpellingBee
from .components.attention import AttentionCore, NeoLLMAttention, training_window
from .components.context import ForwardContext, ResidualState
from .components.generator import LeviathanGenerator, no_latents
from .components.jtokm import JTokM
from .components.recompute import checkpoint_contexts
from .configuration_neollm import NeoLLMConfig

logger = logging.getLogger(__name__)


class NeoLLMDecoderLayer(GradientCheckpointingLayer):
    """One decoder layer: residual flow (SiameseNorm, pre-norm, LAUREL, AttnRes or StackMemory, with
    optional LNS / GPAS; ``docs/neollm-residual.md``), attention, dropout, MLP and the MLP update's
    modulation (JTok-M, or the identity).

    Args:
        config: the model config; ``layer_idx``: this layer's index ``l``.
    Shapes:
        state: the :class:`ResidualState` (streams of ``[B, T, D]``, ``v0``, ...); the layer updates
        and returns a copy, leaving its input as it was (a checkpointed layer runs again in backward
        from the same input); ctx: the :class:`ForwardContext` (position_ids ``[B, T]``, attention_mask
        ``[B, past + T]`` or None, ids, auxiliary-loss sink); cache_state: this layer's cache entry.
    """

    def __init__(self, config: NeoLLMConfig, layer_idx: int) -> None:
        super().__init__()
        self.residual = LayerFlow.from_config(config, layer_idx)
        self.self_attn = NeoLLMAttention(config, layer_idx)
        self.dropout = nn.Dropout(config.dropout_rate)  # on the attention block output (docs/neollm.md#decisions)
        self.mlp = NeoLLMMLP.from_config(config, layer_idx)
        self.modulation = JTokM.from_config(config, layer_idx)

    def forward(self, state: ResidualState, ctx: ForwardContext, cache_state=None) -> ResidualState:
        state = replace(state, sources=list(state.sources))  # flows reassign fields; AttnRes appends sources
        u = self.residual.attn_input(state)
        self.residual.add(state, self.dropout(self.self_attn(u, ctx, cache_state, state)))
        u = self.residual.mlp_input(state)
        self.residual.add(state, self.modulation(self.mlp(u), state, ctx))
        return state


class NeoLLMPreTrainedModel(SLMPreTrainedModel):
    """Shared init: truncated normal (±2σ, σ = ``initializer_range``) for every matrix and table,
    RMSNorm weights 1, and the special inits of the components (multipliers 1, xIELU scalars, the
    SiameseNorm ``s``, the attention side's identity inits) through each module's
    ``reset_parameters_with(init_module)``; everything goes through ``transformers.initialization``
    so weights loaded by ``from_pretrained`` are never overwritten."""

    config_class = NeoLLMConfig
    _no_split_modules = ["NeoLLMDecoderLayer"]

    def crop_refusal(self) -> str | None:
        """The fresh cache's refusal (IHA pseudo-tokens), or the momentum shear's: its state, the last
        token's pre-shear q/k, exists only after a forward."""
        reason = super().crop_refusal()
        if reason is None and self.config.use_momentum_attention:
            reason = "use_momentum_attention=True: the momentum shear keeps the last token's pre-shear q/k, which cannot be rolled back"
        return reason

    def _activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, every_n_layers=1, offload=False):
        """transformers' checkpointing switch (``gradient_checkpointing_enable()``), refusing
        ``use_reentrant=True``: a layer passes its :class:`ResidualState` (not tensors) from layer to
        layer, which only the non-reentrant checkpoint (the default) differentiates through."""
        if (activation_checkpointing_kwargs or {}).get("use_reentrant", False):
            raise ValueError(
                "NeoLLM supports gradient checkpointing with use_reentrant=False only (the default): its layers pass"
                " a ResidualState, not tensors, which the reentrant checkpoint cannot differentiate through;"
                " call gradient_checkpointing_enable() without use_reentrant=True"
            )
        # each checkpointed call gets a CheckpointRun, so stateful modules (affine attention's EMA)
        # step once and see the same state when recomputed in backward
        kwargs = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
        kwargs["context_fn"] = checkpoint_contexts(kwargs.get("context_fn"))
        super()._activation_checkpointing_enable(kwargs, every_n_layers, offload)

    def prepare_for_training(self, seq_len: int) -> None:
        """Harness hook (``slmlab train`` calls it before training): with the automatic local window
        (``iha_sliding_window=None``) write the window the local layers will train with,
        ``max(1, seq_len // (2P²))``, into the config and the attention cores, so checkpoints carry
        it and generation decodes the trained function (``docs/neollm-attention.md#local-window``).
        Does nothing when the config fixes the window or no layer is local.

        Args:
            seq_len: the training sequence length in tokens.
        """
        window = training_window(self.config, seq_len)
        if window is None:
            return
        self.config.iha_sliding_window = window
        for module in self.modules():
            if isinstance(module, AttentionCore):
                module.window = window
        logger.info(
            "NeoLLM: iha_sliding_window=None resolved to %d for %d-token training sequences; written into the config",
            window,
            seq_len,
        )

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding, RowMultipliedLinear)):
            init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
            if hasattr(module, "reset_multipliers"):
                module.reset_multipliers(init)
        elif hasattr(module, "reset_parameters_with"):
            module.reset_parameters_with(init)
        else:
            super()._init_weights(module)


class NeoLLMModel(SLMBaseModel, NeoLLMPreTrainedModel):
    """Embedding path, decoder stack and read-out; returns the final hidden state ``h``.

    The token source is ``embed_tokens`` (a ``V × D`` table) or, with ``use_token_generator``,
    ``token_generator`` (:class:`LeviathanGenerator`; no table exists then).
    ``spelling_bee`` needs its byte table: ``model.model.spelling_bee.set_byte_table(tokenizer)``.
    :meth:`bake_inference_table` precomputes the whole embedding path for eval.
    """

    def __init__(self, config: NeoLLMConfig) -> None:
        super().__init__(config)
        if config.use_token_generator:
            self._input_embed_layer = "token_generator"
            self.token_generator = LeviathanGenerator.from_config(config)
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # JTok-M's inputs: the generator's latent coordinate of the ids (mode 1), once per forward
        self._token_latents = self.token_generator.latents if config.use_jtokm else no_latents
        self.embed_multipliers = EmbeddingMultipliers.from_config(config)
        self.spelling_bee = SpellingBee.from_config(config)
        self.layers = nn.ModuleList(NeoLLMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.readout = Readout.from_config(config)
        self.register_buffer("baked_embeddings", None, persistent=False)
        self._baked_version = -1
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token source: ``embed_tokens``, or the Leviathan generator when it is on."""
        return getattr(self, self._input_embed_layer)

    def set_input_embeddings(self, value: nn.Module) -> None:
        setattr(self, self._input_embed_layer, value)
        self.drop_inference_table()

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        """One attention state per layer (K/V, momentum state, frozen IHA window)."""
        return ModelCache([layer.self_attn.new_state() for layer in self.layers])

    # -- embedding path and its baked table (docs/neollm.md#spelling-bee)-------------------------------------------
    def _table_version(self) -> int:
        return getattr(self.spelling_bee, "table_version", 0)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``e = SpellingBee(ρ_ids·(W_E[ids] ⊙ κ), ids)`` (the multipliers only when built; the
        generator's output in place of ``W_E[ids]`` when it is on), or one lookup in the baked table
        (eval only)."""
        if self.baked_embeddings is not None and not self.training and self._baked_version == self._table_version():
            return self.baked_embeddings[input_ids]
        return self._embed_live(input_ids)

    def _embed_live(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.spelling_bee(self.embed_multipliers(self.get_input_embeddings()(input_ids), input_ids), input_ids)

    @torch.no_grad()
    def bake_inference_table(self, chunk_size: int = 4096) -> torch.Tensor:
        """Precompute the final embedding of every id (``[V, D]``, a non-persistent buffer) so that
        eval-mode forwards embed with a single lookup. Dropped by ``train()``, by a new byte table
        and by ``load_state_dict``; it never writes into ``W_E``. With the generator the table holds
        its output; JTok-M's latent coordinate still runs per forward on the ids."""
        rows = []
        device = next(self.get_input_embeddings().parameters()).device
        for start in range(0, self.config.vocab_size, chunk_size):
            ids = torch.arange(start, min(start + chunk_size, self.config.vocab_size), device=device)
            rows.append(self._embed_live(ids[None])[0])
        self.baked_embeddings = torch.cat(rows)
        self._baked_version = self._table_version()
        return self.baked_embeddings

    def drop_inference_table(self) -> None:
        self.baked_embeddings = None
        self._baked_version = -1

    def train(self, mode: bool = True):
        if mode:
            self.drop_inference_table()
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs):
        self.drop_inference_table()
        return super()._load_from_state_dict(*args, **kwargs)

    # -- layers (the shared frame in SLMBaseModel.forward does the rest) --------------------------
    def check_inputs_embeds(self, inputs_embeds: torch.Tensor) -> None:
        cfg = self.config
        needs_ids = [f for f in ("use_spelling_bee_embeddings", "use_token_generator", "use_jtokm") if getattr(cfg, f)]
        if needs_ids:
            raise ValueError(f"inputs_embeds cannot be used with {', '.join(f'{f}=True' for f in needs_ids)}: these need token ids")
        validate_embeds(inputs_embeds, cfg.hidden_size)

    def layer_loop(self, inputs: ForwardInputs) -> torch.Tensor:
        ids = inputs.input_ids
        ctx = ForwardContext(inputs.position_ids, inputs.attention_mask, ids, inputs.aux_losses, self._token_latents(ids))
        ctx.attention_weights = inputs.attentions
        state = self.readout.start(inputs.embeds)
        for i, layer in enumerate(self.layers):
            state = layer(state, ctx, inputs.state(i))
            if inputs.hidden_states is not None:  # the flow's residual stream, computed only when asked for
                inputs.record(self.readout.stream(state))
        return self.readout.hidden(state)


class NeoLLMForCausalLM(SLMForCausalLM, NeoLLMPreTrainedModel):
    """NeoLLM with an (untied by default) LM head; HF-standard forward returning
    :class:`CausalLMOutputWithPast` with ``cache`` (and ``hidden_states`` when asked)."""

    base_model_class = NeoLLMModel

    def bake_inference_table(self, chunk_size: int = 4096) -> torch.Tensor:
        """See :meth:`NeoLLMModel.bake_inference_table`."""
        return self.model.bake_inference_table(chunk_size)

    def resize_token_embeddings(self, *args, **kwargs):
        """transformers' resize, refused with the generator: its coordinates and codebooks are sized
        for the vocabulary it was built with, and it has no table rows to add."""
        if isinstance(self.get_input_embeddings(), LeviathanGenerator):
            raise ValueError(
                "resize_token_embeddings is not supported with use_token_generator=True: the Leviathan generator has no"
                " table to resize (its codebooks are sized for vocab_size); build a new model with the new vocab_size"
            )
        return super().resize_token_embeddings(*args, **kwargs)

    def embedding_rows(self) -> dict[str, int]:
        """The shared audit rows, or with the generator its parameter count (the dense table it
        replaces named in the label) and the untied head."""
        source = self.get_input_embeddings()
        if not isinstance(source, LeviathanGenerator):
            return super().embedding_rows()
        dense = self.config.vocab_size * self.config.hidden_size
        label = f"Leviathan generator (replaces a {dense:,}-parameter V x D table)"
        return {label: sum(p.numel() for p in source.parameters()), "LM head (untied)": self.lm_head.weight.numel()}


_ATTENTION_LABELS = {
    "fan": "FAN_attn",
    "iha": "IHA mix",
    "collapse": "IHA collapse",
    "positions": "REPO / GRAPE",
    "value_residual": "FAN value residual",
    "mea": "MEA head mix (W_K, W_V)",
    "head_norm": "MEA head RMSNorm",
    "goat": "REPO-GOAT prior",
    "affine": "affine-scaled alpha",
    "routing": "directional routing",
}


def _attention_part(name: str, hadamard: bool) -> str:
    """``layers.N.self_attn.<part>....`` -> a readable component label."""
    part = name.split(".self_attn.", 1)[1].split(".")[0]
    label = "Hadamard o_proj (alpha, beta)" if part == "o_proj" and hadamard else _ATTENTION_LABELS.get(part, part)
    return f"attention: {label}" + (" multipliers" if "multiplier" in name else "")


def _mlp_part(name: str, polynorm: bool) -> str:
    part = name.split(".mlp.", 1)[1].split(".")[0]
    labels = {"fan": "FAN_ffn", "act_fn": "PolyNorm" if polynorm else "xIELU"}
    return f"mlp: {labels.get(part, part)}" + (" multipliers" if "multiplier" in name else "")


_RESIDUAL_LABELS = {
    ".laurel.": "LAUREL (per layer)",
    "_agg.": "AttnRes pseudo-queries (per layer)",
    "readout.agg.": "AttnRes pseudo-queries (read-out)",
    ".stack_memory.": "StackMemory (per layer)",
    ".gpas.": "GPAS gates (per layer)",
}


def _residual_part(name: str, siamese: bool) -> str:
    """``layers.N.residual....`` / ``readout....`` -> a readable residual-side label."""
    for key, label in _RESIDUAL_LABELS.items():
        if key in name:
            return f"residual: {label}"
    norms = "SiameseNorm / norms" if siamese else "residual: pre-norms"
    return f"{norms} (read-out)" if "readout" in name else f"{norms} (per layer)"


def audit_parameters(model: NeoLLMForCausalLM) -> dict[str, int]:
    """Parameter count per component (every tensor counted once), then subtotals per side and the
    total. For the seed's defaults the total is 113,131,288 (``docs/neollm.md#parameter-budget``)."""
    rows: dict[str, int] = {}
    sides = {"Attention total": 0, "MLP total": 0, "SiameseNorm / residual norms total": 0}
    table_and_head = model.embedding_rows()
    seen = {id(p) for p in model.get_input_embeddings().parameters()} | {id(model.lm_head.weight)}
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if ".self_attn." in name:
            key, side = _attention_part(name, model.config.use_hadamard_o_proj), "Attention total"
        elif ".mlp." in name:
            key, side = _mlp_part(name, model.config.polynorm_exclusive), "MLP total"
        elif ".residual." in name or name.startswith("model.readout."):
            key, side = _residual_part(name, model.config.use_siamesenorm), "SiameseNorm / residual norms total"
        elif name.startswith("model.embed_multipliers."):
            key, side = "embedding multipliers (rho, kappa)", None
        elif name.startswith("model.spelling_bee."):
            key, side = "Spelling Bee byte table", None
        elif ".modulation." in name:
            key, side = "JTok-M modulation (all layers)", None
        else:
            key, side = name.rsplit(".", 1)[0], None
        rows[key] = rows.get(key, 0) + p.numel()
        if side is not None:
            sides[side] += p.numel()
    big = sum(table_and_head.values())
    total = sum(rows.values()) + big
    order = ("embedding", "Spelling", "attention", "mlp", "SiameseNorm", "residual")
    rank = {k: next((i for i, p in enumerate(order) if k.startswith(p)), len(order)) for k in rows}
    rows = {**table_and_head, **{k: rows[k] for k in sorted(rows, key=lambda k: rank[k])}}  # layer order kept
    rows.update(sides)
    rows["Without W_E and lm_head"] = total - big
    rows["Total"] = total
    return rows


__all__ = ["NeoLLMDecoderLayer", "NeoLLMForCausalLM", "NeoLLMModel", "NeoLLMPreTrainedModel", "audit_parameters"]
