"""How a family leaves slmlab: what each export target needs from it, declared once in the family's
``convert.py`` as ``EXPORT = ExportInfo(...)`` and registered with the family
(``Family(export=EXPORT)``).

The exporters (:mod:`slmlab.export`) look a family's declaration up through the registry
(:func:`slmlab.models.registry.get_export_info`) and never name a family. This module imports
nothing heavy: torch, transformers and gguf are imported by the hooks themselves, when they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GGUFLayout:
    """How a family's model is written as one llama.cpp architecture. :mod:`slmlab.export.gguf` does
    the rest for every family: tensor names from ``gguf``'s name map of the architecture, the dtypes,
    the tokenizer, the file.

    Args:
        arch: llama.cpp's architecture name, as ``gguf.MODEL_ARCH_NAMES`` spells it (``"llama"``).
        metadata: ``config -> {key: value}``: the architecture's hyper-parameters, in the order they are
            written, each key a ``gguf`` writer method less its ``add_`` (``{"block_count": 4, ...}`` is
            ``writer.add_block_count(4)``); raises ``ValueError``, saying why and what to use instead, for a
            configuration llama.cpp cannot run.
        tensor: ``(slmlab tensor name, float32 numpy array, config) -> array`` in llama.cpp's layout;
            None keeps every tensor as it is.
        keep_f32: fragments of GGUF tensor names stored as f32 whatever the export dtype, besides the
            norms and 1-D tensors every architecture keeps in f32 (e.g. a convolution kernel).
    """

    arch: str
    metadata: Callable[[Any], dict[str, Any]]
    tensor: Callable[[str, Any, Any], Any] | None = None
    keep_f32: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExportInfo:
    """What the export targets need from one family.

    Args:
        display_name: the family's name in a model card (``"SAGE-Lumen"``).
        hf_twin: ``(model, special_ids) -> (twin, None)`` where transformers implements the family:
            transformers' own class (e.g. ``LlamaForCausalLM``) holding the model's weights, in eval
            mode, its config carrying ``special_ids`` (``{"bos_token_id": .., ...}``); ``(None, why)``
            for a configuration of the family transformers computes differently. None: the family has
            no transformers twin and is exported as remote code (its own source beside the weights).
        hf_reason: why a family without ``hf_twin`` has none (said by ``slmlab export``).
        gguf: how the family is written for llama.cpp (:class:`GGUFLayout`); None: no llama.cpp
            architecture runs it, so it has no GGUF export.
    """

    display_name: str
    hf_twin: Callable[[Any, dict], tuple[Any, str | None]] | None = None
    hf_reason: str | None = None
    gguf: GGUFLayout | None = None

    def __post_init__(self) -> None:
        if self.hf_twin is None and not self.hf_reason:
            raise ValueError(f"ExportInfo({self.display_name!r}): a family without hf_twin must say why (hf_reason)")

    @property
    def gguf_arch(self) -> str | None:
        """llama.cpp's architecture name for the family, or None when it has no GGUF export."""
        return self.gguf.arch if self.gguf is not None else None


def same_names_twin(twin_class, hf_config, model) -> tuple[Any, None]:
    """``(twin_class(hf_config) holding model's state_dict as it is, in eval mode, None)``: the
    :attr:`ExportInfo.hf_twin` result of a family whose parameter names are transformers' own."""
    twin = twin_class(hf_config)
    twin.load_state_dict(model.state_dict(), strict=True)
    return twin.eval(), None
