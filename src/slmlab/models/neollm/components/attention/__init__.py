"""NeoLLM attention side (``docs/neollm-attention.md``): the ``NeoLLMAttention`` block, its per-layer
decoding state, the attention-function entries, and one module per mechanism.

Modules with special initialisations (IHA identity mixes, GRAPE ``s = 0``, Hadamard α/β, REPO
truncated normals, value-residual λ) expose ``reset_parameters_with(init_module)``; the model's
``_init_weights`` calls it with ``transformers.initialization`` so loaded weights are never
overwritten.
"""

from .block import UNBUILT_FLAGS, NeoLLMAttention, check_built
from .core import AttentionCore, automatic_window, training_window
from .functions import ATTENTION_FUNCTIONS, AttentionCall, softmax_attention
from .iha import IHACollapse, IHAMix, NoIHAMix, SingleSlot
from .momentum import MomentumShear, NoMomentum
from .output import HadamardOutput, OutputGate, dense_output, fwht, hadamard_matrix
from .positions import FixedSpectrum, GrapeSpectrum, IntegerRoPE, RepoCoordinates, RepoRotation
from .rotation import rope_frequencies, rotate_channels
from .state import NeoLLMAttentionState
from .value_residual import NoValueResidual, ValueResidualMix, ValueResidualSource, make_value_residual
from .xsa import ExclusiveSelfAttention, NoXSA

__all__ = [
    "ATTENTION_FUNCTIONS",
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
    "UNBUILT_FLAGS",
    "ValueResidualMix",
    "ValueResidualSource",
    "check_built",
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
