"""Compatibility names of the residual / embedding / MLP side.

Every mechanism now builds itself with ``Mechanism.from_config(config, layer_idx)`` and the unbuilt
options live in one table (:mod:`.unbuilt`); these functions forward there so earlier callers keep
working.
"""

from __future__ import annotations

from torch import nn

from .flows import LayerFlow, Readout
from .mlp import NeoLLMMLP
from .spelling_bee import SpellingBee
from .unbuilt import UNBUILT, check_built, embedding_multipliers_active

# Residual / embedding options not built yet (the rows of `UNBUILT` on this side).
UNBUILT_FLAGS = tuple(flag for flag, doc in UNBUILT.items() if "neollm-residual" in doc and flag != "use_embedding_multipliers")


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
    "UNBUILT_FLAGS",
    "build_mlp",
    "build_readout",
    "build_residual",
    "build_spelling_bee",
    "check_built",
    "embedding_multipliers_active",
]
