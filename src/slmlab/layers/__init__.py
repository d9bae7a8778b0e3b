"""Shared building blocks, one concern per file."""

from .attention import CausalSelfAttention, attend_projected, check_head_layout, sdpa
from .cache import ConvState, KVState, LayerState, ModelCache, TensorState
from .conv import CausalDepthwiseConv1d
from .fused import ConcatenatedWeights, frozen_weights
from .masks import AttentionBias, causal_bias, has_padding, position_ids_from_mask
from .mlp import SwiGLU
from .norm import RMSNorm
from .rotary import RotaryEmbedding, apply_rotary, rotate_half

__all__ = [
    "AttentionBias",
    "CausalDepthwiseConv1d",
    "CausalSelfAttention",
    "attend_projected",
    "ConcatenatedWeights",
    "ConvState",
    "KVState",
    "LayerState",
    "ModelCache",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "TensorState",
    "apply_rotary",
    "causal_bias",
    "frozen_weights",
    "check_head_layout",
    "has_padding",
    "position_ids_from_mask",
    "rotate_half",
    "sdpa",
]
