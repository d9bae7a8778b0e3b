"""The one table of NeoLLM options that are accepted by the config but not built yet.

Each flag maps to the documentation section that describes what it will build. The model checks
the table once, at construction (:func:`check_built`, called by ``NeoLLMModel.__init__``), so a
config that asks for an unbuilt mechanism fails before any weight exists, naming the flag and the
section. Building a mechanism removes its row.
"""

from __future__ import annotations

ATTENTION_DOC = "docs/neollm-attention.md"
RESIDUAL_DOC = "docs/neollm-residual.md"

# flag -> the docs section that describes the mechanism it will build.
UNBUILT: dict[str, str] = {
    "use_token_generator": f"{RESIDUAL_DOC}#token-generator",
    "use_jtokm": f"{RESIDUAL_DOC}#jtok-m",
}


def embedding_multipliers_active(config) -> bool:
    """Embedding multipliers exist only with learnable multipliers, no generator and no tying
    (otherwise the config already warned that the flag is inactive)."""
    return bool(
        config.use_embedding_multipliers
        and config.use_learnable_multipliers
        and not config.use_token_generator
        and not config.tie_word_embeddings
    )


def is_active(config, flag: str) -> bool:
    """Whether ``config`` asks for the mechanism of ``flag``."""
    if flag == "use_embedding_multipliers":
        return embedding_multipliers_active(config)
    return bool(getattr(config, flag, False))


def refuse(flag: str) -> None:
    """Raise the one error for an unbuilt option.

    Raises:
        NotImplementedError: naming the flag and the docs section.
    """
    raise NotImplementedError(
        f"`{flag}=True` is not built yet (NeoLLM part 2/3; it will be described in {UNBUILT[flag]}). Set `{flag}=False`."
    )


def check_built(config) -> None:
    """Refuse, at model construction, every enabled option that is not built yet."""
    for flag in UNBUILT:
        if is_active(config, flag):
            refuse(flag)


__all__ = ["UNBUILT", "check_built", "embedding_multipliers_active", "is_active", "refuse"]
