"""NeoLLM attention side (``docs/neollm-attention.md``): the ``NeoLLMAttention`` block, its per-layer
decoding state, the attention-function entries, and one module per mechanism.

Modules with special initialisations (IHA identity mixes, GRAPE ``s = 0``, Hadamard α/β, REPO
truncated normals, value-residual λ, MEA mod-identity mixes and norm gains, GOAT zeros, affine zeros,
routing directions and router) expose ``reset_parameters_with(init_module)``; the model's
``_init_weights`` calls it with ``transformers.initialization`` so loaded weights are never
overwritten.
"""

from .affine import AffineScale, AffineTerms, NoAffine
from .block import NeoLLMAttention
from .core import AttentionCore, automatic_window, training_window
from .functions import (
    ATTENTION_FUNCTIONS,
    AttentionCall,
    affine_attention,
    affine_attention_eager,
    softmax_attention,
    visible_mean,
)
from .goat import GoatPrior, NoGoat
from .iha import IHACollapse, IHAMix, NoIHAMix, SingleSlot
from .lucid import LucidPreconditioner, NoLucid, lucid_matrix
from .mea import MEAHeadMix, MEAHeadRMSNorm, NoHeadNorm, NoMEAHeadMix, component_heads
from .momentum import MomentumShear, NoMomentum
from .output import HadamardOutput, OutputGate, dense_output, fwht, hadamard_matrix
from .positions import FixedSpectrum, GrapeSpectrum, IntegerRoPE, RepoCoordinates, RepoRotation
from .rotation import rope_frequencies, rotate_channels
from .routing import DirectionalRouting, NoRouting
from .state import NeoLLMAttentionState
from .value_residual import NoValueResidual, ValueResidualMix, ValueResidualSource, make_value_residual
from .xsa import ConsumedValue, ExclusiveSelfAttention, NoXSA, RawValue

__all__ = [
    "ATTENTION_FUNCTIONS",
    "AffineScale",
    "AffineTerms",
    "ConsumedValue",
    "DirectionalRouting",
    "GoatPrior",
    "LucidPreconditioner",
    "MEAHeadMix",
    "MEAHeadRMSNorm",
    "NoAffine",
    "NoGoat",
    "NoHeadNorm",
    "NoLucid",
    "NoMEAHeadMix",
    "NoRouting",
    "RawValue",
    "affine_attention",
    "affine_attention_eager",
    "component_heads",
    "lucid_matrix",
    "visible_mean",
    "AttentionCall",
    "AttentionCore",
    "ExclusiveSelfAttention",
    "FixedSpectrum",
    "GrapeSpectrum",
    "HadamardOutput",
    "IHACollapse",
    "IHAMix",
    "IntegerRoPE",
    "MomentumShear",
    "NeoLLMAttention",
    "NeoLLMAttentionState",
    "NoIHAMix",
    "NoMomentum",
    "NoValueResidual",
    "NoXSA",
    "OutputGate",
    "RepoCoordinates",
    "RepoRotation",
    "SingleSlot",
    "ValueResidualMix",
    "ValueResidualSource",
    "dense_output",
    "fwht",
    "hadamard_matrix",
    "make_value_residual",
    "rope_frequencies",
    "rotate_channels",
    "softmax_attention",
    "automatic_window",
    "training_window",
]
