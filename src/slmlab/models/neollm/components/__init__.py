"""NeoLLM components, one module per mechanism; each builds itself with
``Mechanism.from_config(config, layer_idx)``. ``attention/`` holds the attention block and its
positional machinery; the files here hold the residual flow and its typed state (``context.py``),
norms, MLP, the embedding side (table, Leviathan generator, Spelling Bee) and JTok-M."""

from .activations import XIELU, PolyNorm, make_activation
from .attn_res import AttnResReadout, AttnResResidual, DepthAttention
from .context import FlowEnds, ForwardContext, ResidualFlow, ResidualState
from .fan import FANFeatures, NoFAN, make_fan
from .flows import LayerFlow, NormScaledFlow, Readout
from .generator import LeviathanGenerator, TokenLatents
from .gpas import GPAS, NoGPAS
from .jtokm import JTokM, NoModulation
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

__all__ = [
    "AttnResReadout",
    "AttnResResidual",
    "DepthAttention",
    "EmbeddingMultipliers",
    "GPAS",
    "JTokM",
    "LeviathanGenerator",
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
    "TokenLatents",
    "FANFeatures",
    "FlowEnds",
    "ForwardContext",
    "ResidualFlow",
    "ResidualState",
    "NeoLLMMLP",
    "NoFAN",
    "NoModulation",
    "NoSpellingBee",
    "PreNormReadout",
    "PreNormResidual",
    "RowColMultipliedLinear",
    "RowMultipliedLinear",
    "SiameseReadout",
    "SiameseResidual",
    "SpellingBee",
    "XIELU",
    "make_activation",
    "make_fan",
    "multiplied_linear",
]
