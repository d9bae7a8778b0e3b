"""The family registry: one entry per architecture family, filled by each family's ``__init__``.

The CLI (``slmlab models``, ``slmlab audit``), the trainer and the tests look families up here;
nothing else in the code base special-cases a family by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class Family:
    """How to build, describe and audit one family.

    Args:
        name: the short name users type (``lumen``, ``lfm2``, ...).
        config_class / model_class: the HF classes.
        presets: named config overrides (a table, never read by model code).
        audit: ``model -> {category: parameter count}``, in print order.
        description: one line for ``slmlab models``.
    The names of family-specific forward inputs the harness may supply (PGSM's
    ``retrieval_positions``) are the base model's ``family_inputs``: :attr:`extra_forward_inputs`.
    """

    name: str
    config_class: type[PretrainedConfig]
    model_class: type[PreTrainedModel]
    presets: dict[str, dict] = field(default_factory=dict)
    audit: Callable[[nn.Module], dict[str, int]] | None = None
    description: str = ""

    @property
    def extra_forward_inputs(self) -> tuple[str, ...]:
        """Family-specific forward keyword arguments (declared once, by the base model class)."""
        return tuple(getattr(getattr(self.model_class, "base_model_class", None), "family_inputs", ()))

    def make_config(self, preset: str | None = None, **overrides) -> PretrainedConfig:
        """A config from a preset (default: the class defaults) plus keyword overrides."""
        if preset is not None and preset not in self.presets:
            raise ValueError(f"unknown preset {preset!r} for family {self.name!r}; known: {sorted(self.presets)}")
        kwargs = {**(self.presets.get(preset, {}) if preset else {}), **overrides}
        return self.config_class(**kwargs)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Register ``family`` here and with ``AutoConfig``/``AutoModelForCausalLM`` (idempotent)."""
    _FAMILIES[family.name] = family
    AutoConfig.register(family.config_class.model_type, family.config_class, exist_ok=True)
    AutoModelForCausalLM.register(family.config_class, family.model_class, exist_ok=True)
    return family


def get_family(name: str) -> Family:
    """Look a family up by name or by its ``model_type``."""
    for fam in _FAMILIES.values():
        if name in (fam.name, fam.config_class.model_type):
            return fam
    raise ValueError(f"unknown model family {name!r}; known: {sorted(_FAMILIES)}")


def families() -> dict[str, Family]:
    return dict(_FAMILIES)


def resolve_model_spec(spec: str) -> tuple[Family, str | None]:
    """``"lumen"`` or ``"lumen:preset"`` or a bare preset name -> (family, preset)."""
    if ":" in spec:
        fam, preset = spec.split(":", 1)
        return get_family(fam), preset
    if spec in _FAMILIES or any(spec == f.config_class.model_type for f in _FAMILIES.values()):
        return get_family(spec), None
    owners = [f for f in _FAMILIES.values() if spec in f.presets]
    if len(owners) == 1:
        return owners[0], spec
    raise ValueError(f"{spec!r} is neither a family nor a unique preset; families: {sorted(_FAMILIES)}")
