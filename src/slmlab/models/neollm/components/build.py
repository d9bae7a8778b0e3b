"""Compatibility names of the residual / embedding / MLP side.

Every mechanism builds itself with ``Mechanism.from_config(config, layer_idx)``; these functions
forward there so earlier callers keep working.
"""

from __future__ import annotations

from torch import nn

from .flows import LayerFlow, Readout
from .mlp import NeoLLMMLP
from .multipliers import embedding_multipliers_active
from .spelling_bee import SpellingBee


def build_residual(config, layer_idx: int) -> nn.Module:
    """See :meth:`LayerFlow.from_config` (every residual flow, with LNS / GPAS when on)."""
    return LayerFlow.from_config(config, layer_idx)


def build_readout(config) -> nn.Module:
    """See :meth:`Readout.from_config`."""
    return Readout.from_config(config)


def build_mlp(config) -> NeoLLMMLP:
    """See :meth:`NeoLLMMLP.from_config`."""
    return NeoLLMMLP.from_config(config, 0)


def build_spelling_bee(config) -> nn.Module:
    """See :meth:`SpellingBee.from_config`."""
    return SpellingBee.from_config(config)


__all__ = [
    "build_mlp",
    "build_readout",
    "build_residual",
    "build_spelling_bee",
    "embedding_multipliers_active",
]
