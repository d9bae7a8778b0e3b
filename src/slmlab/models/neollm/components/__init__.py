"""NeoLLM components, one module per mechanism; each builds itself with
``Mechanism.from_config(config, layer_idx)``. ``attention/`` holds the attention block and its
positional machinery; the files here hold the residual flow and its typed state (``context.py``),
norms, MLP, the embedding side and the one table of unbuilt options (``unbuilt.py``)."""

from .activations import XIELU, PolyNorm, make_activation
from .attn_res import AttnResReadout, AttnResResidual, DepthAttention
from .build import build_mlp, build_readout, build_residual, build_spelling_bee, check_built
from .context import FlowEnds, ForwardContext, ResidualFlow, ResidualState
from .fan import FANFeatures, NoFAN, make_fan
from .flows import LayerFlow, NormScaledFlow, Readout
from .gpas import GPAS, NoGPAS
from .laurel import LaurelResidual
from .lns import LayerNormScaling
from .mlp import NeoLLMMLP
from .multipliers import (
    EmbeddingMultipliers,
    NoEmbeddingMultipliers,
    RowColMultipliedLinear,
    RowMultipliedLinear,
    multiplied_linear,
)
from .residual import PreNormReadout, PreNormResidual, SiameseReadout, SiameseResidual
from .spelling_bee import NoSpellingBee, SpellingBee
from .stack_memory import StackMemory, StackMemoryReadout, StackMemoryResidual
from .unbuilt import UNBUILT

__all__ = [
    "AttnResReadout",
    "AttnResResidual",
    "DepthAttention",
    "EmbeddingMultipliers",
    "GPAS",
    "LaurelResidual",
    "LayerFlow",
    "LayerNormScaling",
    "NoEmbeddingMultipliers",
    "NoGPAS",
    "NormScaledFlow",
    "PolyNorm",
    "Readout",
    "StackMemory",
    "StackMemoryReadout",
    "StackMemoryResidual",
    "FANFeatures",
    "FlowEnds",
    "ForwardContext",
    "ResidualFlow",
    "ResidualState",
    "UNBUILT",
    "NeoLLMMLP",
    "NoFAN",
    "NoSpellingBee",
    "PreNormReadout",
    "PreNormResidual",
    "RowColMultipliedLinear",
    "RowMultipliedLinear",
    "SiameseReadout",
    "SiameseResidual",
    "SpellingBee",
    "XIELU",
    "build_mlp",
    "build_readout",
    "build_residual",
    "build_spelling_bee",
    "check_built",
    "make_activation",
    "make_fan",
    "multiplied_linear",
]
