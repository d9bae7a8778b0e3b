"""The module factory of the residual / embedding / MLP side: config -> modules, chosen once at
construction time (the blocks never branch on flags in ``forward``).

Optional (non-core) mechanisms of this side that are not built yet raise ``NotImplementedError``
here, at construction time, naming the flag and the part that adds it.
"""

from __future__ import annotations

from torch import nn

from .mlp import NeoLLMMLP
from .residual import PreNormReadout, PreNormResidual, SiameseReadout, SiameseResidual
from .spelling_bee import NoSpellingBee, SpellingBee

# Residual / embedding options of the overview's "res opt" phase (NeoLLM parts 2 and 3).
UNBUILT_FLAGS = (
    "use_laurel",
    "use_attn_res",
    "use_stack_memory",
    "use_lns",
    "use_gpas",
    "use_token_generator",
    "use_jtokm",
    "polynorm_exclusive",
)


def embedding_multipliers_active(config) -> bool:
    """Embedding multipliers exist only with learnable multipliers, no generator and no tying (R§8)."""
    return bool(
        config.use_embedding_multipliers
        and config.use_learnable_multipliers
        and not config.use_token_generator
        and not config.tie_word_embeddings
    )


def check_built(config) -> None:
    """Raise ``NotImplementedError`` for every enabled option of this side not built in part 1."""
    for flag in UNBUILT_FLAGS:
        if getattr(config, flag, False):
            raise NotImplementedError(f"{flag}=True is not built yet: it arrives with NeoLLM part 2/3")
    if embedding_multipliers_active(config):
        raise NotImplementedError("use_embedding_multipliers=True is not built yet: it arrives with NeoLLM part 2/3")


def build_residual(config, layer_idx: int) -> nn.Module:
    """SiameseNorm (default) or the standard pre-norm topology for decoder layer ``layer_idx``."""
    if config.use_siamesenorm:
        return SiameseResidual(
            config.hidden_size,
            layer_idx,
            eps=config.rms_norm_eps,
            x_scale_init=config.siamese_attn_x_scale_init,
            normalized_input=config.siamese_normalized_input,
            depth_scaling=config.siamese_depth_scaling,
            input_norm=config.use_embedding_input_norm,
        )
    return PreNormResidual(config.hidden_size, layer_idx, config.rms_norm_eps, config.use_embedding_input_norm)


def build_readout(config) -> nn.Module:
    """The model-level stream start and final norm matching :func:`build_residual`."""
    cls = SiameseReadout if config.use_siamesenorm else PreNormReadout
    return cls(config.hidden_size, config.rms_norm_eps)


def build_mlp(config) -> NeoLLMMLP:
    return NeoLLMMLP(
        config.hidden_size,
        config.intermediate_size,
        fan_ratio=config.fan_ratio_ffn,
        hidden_act=config.hidden_act,
        dropout=config.dropout_rate,
        use_multipliers=config.use_learnable_multipliers,
        polynorm_exclusive=config.polynorm_exclusive,
    )


def build_spelling_bee(config) -> nn.Module:
    if config.use_spelling_bee_embeddings:
        return SpellingBee(config.vocab_size, config.hidden_size)
    return NoSpellingBee()
