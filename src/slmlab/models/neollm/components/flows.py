"""Which residual flow a NeoLLM layer and the model's read-out are built with, and the wrapper that
adds LNS and GPAS to any of them (``docs/neollm-residual.md#residual-state-and-flows``).

The residual-flow mechanisms are mutually exclusive (the config enforces it), so the choice is one
table from flag to flow class: SiameseNorm (default), LAUREL, AttnRes, StackMemory, or the standard
pre-norm topology when none is on. LNS (a scale on every sublayer input) and GPAS (a gate on every
residual junction) combine with every flow; when either is on, :class:`NormScaledFlow` wraps the
flow (its parameters then live under ``residual.flow.*``), so no flow is edited for them.
"""

from __future__ import annotations

import torch
from torch import nn

from .attn_res import AttnResReadout, AttnResResidual
from .context import ResidualState
from .gpas import GPAS
from .laurel import LaurelResidual
from .lns import LayerNormScaling
from .residual import PreNormReadout, SiameseReadout, SiameseResidual
from .stack_memory import StackMemoryReadout, StackMemoryResidual


class NormScaledFlow(nn.Module):
    """Any residual flow with LNS on its sublayer inputs and GPAS on its junctions:
    ``u = LNS(flow.attn_input(state))``; ``flow.add(state, f)`` then
    ``state.streams[j] ← GPAS_k(state.streams[j])`` with ``j = flow.junction`` and ``k`` the sublayer.

    Args:
        flow: the wrapped per-layer flow; lns: :class:`LayerNormScaling` or identity; gpas:
            :class:`GPAS` or its no-op twin.
    """

    def __init__(self, flow: nn.Module, lns: nn.Module, gpas: nn.Module) -> None:
        super().__init__()
        self.flow, self.lns, self.gpas = flow, lns, gpas
        self.junction = flow.junction

    def attn_input(self, state: ResidualState) -> torch.Tensor:
        u = self.lns(self.flow.attn_input(state))
        state.sublayer = 0
        return u

    def mlp_input(self, state: ResidualState) -> torch.Tensor:
        u = self.lns(self.flow.mlp_input(state))
        state.sublayer = 1
        return u

    def add(self, state: ResidualState, update: torch.Tensor) -> None:
        self.flow.add(state, update)
        streams = list(state.streams)
        streams[self.junction] = self.gpas(streams[self.junction], state.sublayer)
        state.streams = tuple(streams)


def _flow_class(config):
    if config.use_laurel:
        return LaurelResidual
    if config.use_attn_res:
        return AttnResResidual
    if config.use_stack_memory:
        return StackMemoryResidual
    return SiameseResidual  # its from_config gives the pre-norm twin when use_siamesenorm=False


class LayerFlow:
    """The per-layer residual flow of a config (:class:`~.context.ResidualFlow`)."""

    @staticmethod
    def from_config(config, layer_idx: int) -> nn.Module:
        """The flow of layer ``layer_idx``, wrapped by :class:`NormScaledFlow` when LNS or GPAS is on."""
        flow = _flow_class(config).from_config(config, layer_idx)
        if not (config.use_lns or config.use_gpas):
            return flow
        return NormScaledFlow(flow, LayerNormScaling.from_config(config, layer_idx), GPAS.from_config(config, layer_idx))


class Readout:
    """The model-level ends of a config's residual flow (:class:`~.context.FlowEnds`)."""

    @staticmethod
    def from_config(config) -> nn.Module:
        if config.use_attn_res:
            return AttnResReadout(config.hidden_size, config.rms_norm_eps)
        if config.use_stack_memory:
            return StackMemoryReadout.from_config(config)
        if config.use_siamesenorm:
            return SiameseReadout(config.hidden_size, config.rms_norm_eps)
        return PreNormReadout(config.hidden_size, config.rms_norm_eps)


__all__ = ["LayerFlow", "NormScaledFlow", "Readout"]
