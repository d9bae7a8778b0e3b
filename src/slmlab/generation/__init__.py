"""Generation: one steppable decoder (:mod:`.decoder`) over the decode paths of :mod:`.loop` and the
decode-plan engine (:mod:`.plan`), and what reads its tokens: streamed text with stop strings
(:mod:`.text`), a chat session (:mod:`.chat`), fitting a prompt to the context (:mod:`.context`).

:class:`Decoder` prefills through the model, then steps one token at a time through the family's
decode plan (Lumen, LFM2; their step functions live beside each model in
``models/<family>/decode.py``) or through the model's own forward and cache (every family);
:func:`generate` runs one to its end.
"""

from .decoder import Decoder, GeneratedTokens, generate
from .loop import COMPILED_PLAN, MODEL_FORWARD, PLAN, build_plan, compiled_step, plan_decoder
from .plan import DecodePlan, FeedForwardWeights, StackWeights
from .sampling import SamplingConfig, sample_next

__all__ = [
    "COMPILED_PLAN",
    "DecodePlan",
    "Decoder",
    "FeedForwardWeights",
    "GeneratedTokens",
    "MODEL_FORWARD",
    "PLAN",
    "SamplingConfig",
    "StackWeights",
    "build_plan",
    "compiled_step",
    "generate",
    "plan_decoder",
    "sample_next",
]
