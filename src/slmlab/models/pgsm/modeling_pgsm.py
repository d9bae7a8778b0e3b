"""PGSM (seed 001) as a transformers causal LM: conv backbone + query-only sparse RoPE retrieval.

``PGSMModel`` keeps the seed's module names (``token_emb``, ``blocks``, ``retriever``,
``post_retrieval_block``, ``final_norm``), so a seed state_dict maps onto ``PGSMForCausalLM`` by
prefixing ``model.`` (:func:`.convert.convert_seed_state_dict`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from ...layers import CausalDepthwiseConv1d, ConvState, KVState, ModelCache, TensorState
from ..base import ForwardInputs, SLMBaseModel, SLMForCausalLM, SLMPreTrainedModel
from .blocks import IdentityBlock, ParallelGeometricBlock
from .configuration_pgsm import PGSMConfig
from .positions import resolve_retrieval_positions
from .retriever import QueryOnlyRoPERetriever


class RetrievalMode(TensorState):
    """The model-level retrieval bookkeeping of one sequence: ``active`` (whether the retriever runs,
    fixed by the first call) and ``positions`` (explicit positions given at prefill)."""

    def crop_refusal(self) -> str | None:
        return (
            "PGSM's retriever reads at positions chosen per forward call (the last token of a call, or query tokens"
            " after the prompt), so re-feeding verified draft tokens in one call would change which tokens read"
        )

    def batch_refusal(self) -> str | None:
        if getattr(self, "positions", None) is not None:
            return "explicit retrieval positions name columns of one prefill, which padding or trimming would move"
        return None


class PGSMPreTrainedModel(SLMPreTrainedModel):
    config_class = PGSMConfig
    _input_embed_layer = "token_emb"  # transformers' get/set_input_embeddings find the table by this name
    _no_split_modules = ["ParallelGeometricBlock"]

    def _init_weights(self, module: nn.Module) -> None:
        """The seed's init: Linear/Embedding ~ N(0, init_std) with zero biases (the base class),
        LayerNorm ones/zeros, and the convs keep PyTorch's default ``Conv1d`` init as in the seed."""
        if isinstance(module, CausalDepthwiseConv1d):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1.0 / math.sqrt(module.weight.shape[1] * module.weight.shape[2])
                init.uniform_(module.bias, -bound, bound)
            return
        super()._init_weights(module)


class PGSMModel(SLMBaseModel, PGSMPreTrainedModel):
    """Embedding, backbone blocks, optional retriever + post-retrieval block, final LayerNorm."""

    family_inputs = ("retrieval_positions",)

    def __init__(self, config: PGSMConfig) -> None:
        super().__init__(config)
        self.token_emb = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(
            ParallelGeometricBlock(config.dim, config.hidden, config.kernel_size, config.dropout) for _ in range(config.layers)
        )
        self.retriever = None
        self.post_retrieval_block = None
        if config.use_sparse_retrieval:
            self.retriever = QueryOnlyRoPERetriever(
                config.dim,
                config.retrieval_dim,
                config.retrieval_heads,
                config.retrieval_dropout,
                config.rope_layout,
                config.block_size,
            )
            self.post_retrieval_block = (
                ParallelGeometricBlock(config.dim, config.hidden, config.kernel_size, config.dropout)
                if config.use_post_retrieval_block
                else IdentityBlock()
            )
        self.final_norm = nn.LayerNorm(config.dim)
        self.post_init()

    def new_cache(self, batch_size: int | None = None) -> ModelCache:
        """Per block a :class:`ConvState`; with retrieval also the retriever's :class:`KVState`, the
        post-retrieval block's :class:`ConvState`, and ``extra["retrieval"].active`` (fixed by the
        first call: whether the retriever runs for this sequence)."""
        states = [ConvState() for _ in self.blocks]
        if self.retriever is None:
            return ModelCache(states)
        return ModelCache(states + [KVState(), ConvState()], extra={"retrieval": RetrievalMode()})

    def _positions_for_call(self, explicit, input_ids, attention_mask, cache, past, b, t, device, decoding):
        """The ``[B, Q]`` retrieval columns of this call, or None when the retriever does not run.

        With a cache: explicit positions are remembered for later calls, and whether retrieval runs
        is fixed by the first call of the sequence (the post-retrieval conv must see all of it).
        """
        mode = cache.extra.get("retrieval") if cache is not None else None
        if mode is not None and past == 0:
            mode.positions, mode.active = None, None
        if mode is not None and explicit is None:
            explicit = getattr(mode, "positions", None)  # given once at prefill (the lean loop)
        limit = self.config.block_size if decoding and cache is not None else past + t
        positions = resolve_retrieval_positions(self.config, explicit, input_ids, attention_mask, past, b, t, device, limit)
        if mode is None:
            return positions
        if explicit is not None:
            mode.positions = positions
        if mode.active is None:
            mode.active = positions is not None
        elif positions is not None and not mode.active:
            raise ValueError(
                "retrieval_positions were given, but the cached prefix was run without retrieval; pass them (or enable"
                " a retrieval mode) from the first forward call of the sequence"
            )
        elif positions is None and mode.active:
            positions = torch.full((b, 0), -1, dtype=torch.long, device=device)
        return positions

    def layer_loop(self, inputs: ForwardInputs, retrieval_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The backbone blocks, then (when retrieval runs for this call) the retriever and the
        post-retrieval block. ``hidden_states`` always has ``layers + 1`` entries: the embeddings and
        one per block, where the retrieval stage belongs to the last block's entry (so the count does
        not depend on whether a token retrieves, and the last entry is the returned, normalised state).

        Args:
            retrieval_positions: ``[B]`` or ``[B, Q]`` column indices (``-1`` pads) where the
                retriever reads; overrides the config's automatic modes. With a cache they are
                remembered: each is applied by the call that processes its token, whether the caller
                passes them once (prefill) or at every step (``generate()``). Only a decoding call
                (a cache passed in, or ``use_cache=True``) may name positions of tokens still to come.
        """
        x, cache, past = inputs.embeds, inputs.cache, inputs.past
        b, t, _ = x.shape
        key_mask = inputs.attention_mask.bool() if inputs.attention_mask is not None else None
        keep = key_mask[:, -t:, None].to(x.dtype) if key_mask is not None else x.new_ones(b, t, 1)
        n = len(self.blocks)
        for i, block in enumerate(self.blocks):
            x = block(x, keep, inputs.state(i))
            if i < n - 1:  # the last block's entry is recorded after the retrieval stage
                inputs.record(x)

        positions = self._positions_for_call(
            retrieval_positions, inputs.input_ids, inputs.attention_mask, cache, past, b, t, x.device, inputs.decoding
        )
        if positions is not None:
            x = self.retriever(x, positions, inputs.position_ids, key_mask, past, inputs.state(n), inputs.attentions)
            x = self.post_retrieval_block(x, keep, inputs.state(n + 1))
        inputs.record(x)
        return self.final_norm(x)


class PGSMForCausalLM(SLMForCausalLM, PGSMPreTrainedModel):
    """PGSM with an LM head (tied to the embedding table when ``tie_weights``).

    ``labels`` follow transformers (aligned with the inputs, shifted inside, ``-100`` ignored);
    ``retrieval_positions`` pass through to :class:`PGSMModel`; :meth:`seed_forward` keeps the
    seed's ``(logits, loss)`` call with pre-shifted labels.
    """

    base_model_class = PGSMModel
    _tied_weights_keys = {"lm_head.weight": "model.token_emb.weight"}

    def seed_forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        retrieval_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The seed's call ``logits, loss = model(input_ids, labels, retrieval_positions)``: no
        cache, and ``labels`` are already the next-token targets of each position (not shifted)."""
        logits = self(input_ids=input_ids, retrieval_positions=retrieval_positions, use_cache=False).logits
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=self.config.ignore_index
            )
        return logits, loss


def build_pgsm_model(size: str = "small", vocab_size: int = 256, block_size: int = 1024, **overrides) -> PGSMForCausalLM:
    """The seed's factory: a named size (tiny/small/medium/large) plus overrides -> a model."""
    return PGSMForCausalLM(PGSMConfig.from_size(size, vocab_size, block_size, **overrides))


def audit_parameters(model: PGSMForCausalLM) -> dict[str, int]:
    """Parameter budget by part (shared tensors counted once), in print order."""
    inner = model.model

    def count(module) -> int:
        return sum(p.numel() for p in module.parameters()) if module is not None else 0

    total = sum(p.numel() for p in model.parameters())
    return {
        **model.embedding_rows(),
        "Backbone blocks": count(inner.blocks),
        "Retriever": count(inner.retriever),
        "Post-retrieval block": count(inner.post_retrieval_block),
        "Final norm": count(inner.final_norm),
        "Unique (without embedding table)": total - inner.token_emb.weight.numel(),
        "Total": total,
    }
