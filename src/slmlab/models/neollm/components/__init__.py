"""NeoLLM components, one module per mechanism. ``attention/`` holds the attention block and its
positional machinery; the files here hold the residual flow, norms, MLP and embedding side."""

from .activations import XIELU, make_activation
from .build import build_mlp, build_readout, build_residual, build_spelling_bee, check_built
from .fan import FANFeatures, NoFAN, make_fan
from .mlp import NeoLLMMLP
from .multipliers import RowColMultipliedLinear, RowMultipliedLinear, multiplied_linear
from .residual import PreNormReadout, PreNormResidual, SiameseReadout, SiameseResidual
from .spelling_bee import NoSpellingBee, SpellingBee

__all__ = [
    "FANFeatures",
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
