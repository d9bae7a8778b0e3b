"""Generation: the streaming decode loop (:mod:`.loop`) and the decode-plan engine (:mod:`.plan`).

``generate`` prefills through the model, then steps one token at a time through the family's decode
plan (Lumen, LFM2; their step functions live beside each model in ``models/<family>/decode.py``) or
through the model's own forward and cache (every family).
"""

from .loop import (
    COMPILED_PLAN,
    MODEL_FORWARD,
    PLAN,
    GeneratedTokens,
    SamplingConfig,
    build_plan,
    compiled_step,
    forward_decoder,
    generate,
    plan_decoder,
    sample_next,
)
from .plan import DecodePlan, FeedForwardWeights, StackWeights

__all__ = [
    "COMPILED_PLAN",
    "DecodePlan",
    "FeedForwardWeights",
    "GeneratedTokens",
    "MODEL_FORWARD",
    "PLAN",
    "SamplingConfig",
    "StackWeights",
    "build_plan",
    "compiled_step",
    "forward_decoder",
    "generate",
    "plan_decoder",
    "sample_next",
]
