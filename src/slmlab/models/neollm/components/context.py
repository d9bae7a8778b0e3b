"""What travels through one NeoLLM forward: the per-forward context every layer reads, the
cross-layer residual state the residual flow owns, and the interface a residual flow implements
(``docs/neollm-residual.md#residual-state-and-flows``).

* :class:`ForwardContext` — built once per forward by the model and passed, as one argument, to
  every decoder layer and its attention: token ids, positions, the padding mask, the token
  generator's latent coordinate for JTok-M, and a sink for auxiliary losses (JTok-M's balance loss
  adds itself there).
* :class:`ResidualState` — everything that crosses layers: the residual stream(s), the value
  residual's ``v0`` (layer 0's values), and room for AttnRes' depth sources and StackMemory's stack.
  A new cross-layer mechanism adds a field here and a flow class, never a return value or a new
  argument of the decoder layer.
* :class:`ResidualFlow` / :class:`FlowEnds` — the two halves of a residual flow. The per-layer half
  (``attn_input / add / mlp_input``) owns the norms around one layer's sublayers; the model-level half
  (``start / hidden``) turns the embedding into the first state and the last state into the final
  hidden state. They are separate modules because their parameters live under
  ``model.layers.N.residual`` and ``model.readout`` (state-dict keys that saved checkpoints use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class ForwardContext:
    """Per-forward values shared by every layer.

    Args:
        position_ids: ``[B, T]`` positions of the current tokens (counted over real tokens).
        attention_mask: ``[B, past + T]`` (1 = real token) or None.
        input_ids: ``[B, T]`` or None (``inputs_embeds`` forwards).
        aux_losses: the sink for auxiliary losses (weighted scalars), or None when this forward does not
            collect them (no labels): a mechanism then skips computing its loss.
        latents: the token generator's latent coordinate of the ids (a ``TokenLatents``: unique-id
            ``z̃ [U, d]``, ``B(z̃) [U, d, K]`` and the ``[B, T]`` inverse index) when JTok-M is on, else None.
        attention_weights: the sink for attention weights when the forward asked for them
            (``output_attentions``): each layer's core appends ``[B, H, T·P, S·P]``; else None.
    """

    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    input_ids: torch.Tensor | None = None
    aux_losses: list[torch.Tensor] | None = None
    latents: Any = None
    attention_weights: list[torch.Tensor] | None = None

    def add_aux_loss(self, loss: torch.Tensor) -> None:
        """Record an auxiliary loss (the caller weights it before adding); only call when
        ``aux_losses`` is not None."""
        self.aux_losses.append(loss)


@dataclass
class ResidualState:
    """The cross-layer state of one forward, owned by the residual flow.

    Attributes:
        streams: residual streams, each ``[B, T, D]``: ``(x, y)`` under SiameseNorm, ``(h,)`` for the
            standard pre-norm topology. ``streams[-1]`` is what hidden-state outputs record.
        v0: layer 0's values ``[B, T, H_kv, D]`` for the value residual (None when it is off).
        sources: AttnRes' completed depth sources, each ``[B, T, D]`` (the embedding first, then one
            partial sum per closed block); empty for the other flows.
        stack: StackMemory's ``(stack [B, T, H, S, d_s], mask [B, T, H, S])``, carried over depth;
            None for the other flows.
        sublayer: which sublayer's input was taken last (0 attention, 1 MLP); set by ``*_input`` of
            the flows whose ``add`` treats the two sublayers differently (LAUREL, AttnRes, GPAS).
        mlp_stream: ``h̃ [B, T, D]``, the residual stream after the attention sublayer as the MLP side
            reads it before its norm (SiameseNorm's ``y``, the plain ``h``, AttnRes' aggregate ``h_m``);
            set by every flow's ``mlp_input``; JTok-M's router reads it.
    """

    streams: tuple[torch.Tensor, ...]
    v0: torch.Tensor | None = None
    sources: list[torch.Tensor] = field(default_factory=list)
    stack: Any = None
    sublayer: int = 0
    mlp_stream: torch.Tensor | None = None


@runtime_checkable
class ResidualFlow(Protocol):
    """The per-layer half of a residual flow: the decoder layer's only view of the residual rule.

    ``attn_input`` / ``mlp_input`` update the state's streams (e.g. post-norm the bounded stream) and
    return the sublayer input ``u [B, T, D]``; ``add`` folds a sublayer's output into the streams.
    """

    def attn_input(self, state: ResidualState) -> torch.Tensor: ...

    def add(self, state: ResidualState, update: torch.Tensor) -> None: ...

    def mlp_input(self, state: ResidualState) -> torch.Tensor: ...


@runtime_checkable
class FlowEnds(Protocol):
    """The model-level half of a residual flow: ``start(e)`` builds the first state from the
    embedding ``e [B, T, D]``; ``hidden(state)`` gives the final, normalised hidden state;
    ``stream(state)`` gives the ``[B, T, D]`` residual stream recorded after each layer for
    ``output_hidden_states`` (SiameseNorm's ``y``, the plain ``h``, AttnRes' sum of its sources)."""

    def start(self, e: torch.Tensor) -> ResidualState: ...

    def hidden(self, state: ResidualState) -> torch.Tensor: ...

    def stream(self, state: ResidualState) -> torch.Tensor: ...


__all__ = ["FlowEnds", "ForwardContext", "ResidualFlow", "ResidualState"]
