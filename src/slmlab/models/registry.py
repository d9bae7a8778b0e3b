"""The family registry: one entry per architecture family, filled by each family's ``__init__``.

The CLI (``slmlab models``, ``slmlab audit``), the trainer and the tests look families up here;
nothing else in the code base special-cases a family by name.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import functools
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from .export_info import ExportInfo


@dataclass(frozen=True)
class Family:
    """How to build, describe and audit one family.

    Args:
        name: the short name users type (``lumen``, ``lfm2``, ...).
        config_class / model_class: the HF classes.
        presets: named config overrides (a table, never read by model code).
        audit: ``model -> {category: parameter count}``, in print order.
        description: one line for ``slmlab models``.
        scaling: the budget-fitting rule (:class:`slmlab.models.budget.ScalingRule`) ``slmlab compare
            --budget`` fits the family with, or None.
        export: how the family leaves slmlab (:class:`slmlab.models.export_info.ExportInfo`, the
            ``EXPORT`` of its ``convert.py``); None: remote code only (:func:`get_export_info`).
        lora_targets: the module names (last name component) ``slmlab finetune --lora`` adapts by default
            (the family's LoRA targets); only plain ``nn.Linear`` layers are adapted.
    Each family declares its entry, with these values written in it, in its ``__init__.py``.
    The names of family-specific forward inputs the harness may supply (PGSM's
    ``retrieval_positions``) are the base model's ``family_inputs``: :attr:`extra_forward_inputs`.
    """

    name: str
    config_class: type[PretrainedConfig]
    model_class: type[PreTrainedModel]
    presets: dict[str, dict] = field(default_factory=dict)
    audit: Callable[[nn.Module], dict[str, int]] | None = None
    description: str = ""
    scaling: object | None = None
    export: ExportInfo | None = None
    lora_targets: tuple[str, ...] = ()

    def fit_budget(self, non_embedding_budget: int, **base) -> dict:
        """Config overrides giving about ``non_embedding_budget`` non-embedding parameters (±10%),
        by the family's ``scaling`` rule; ``base`` holds fields every candidate keeps
        (:func:`slmlab.models.budget.fit_budget`)."""
        from .budget import fit_budget

        return fit_budget(self, non_embedding_budget, base)

    def parameter_audit(self, model: nn.Module) -> dict[str, int]:
        """Parameters by the family's own categories (``audit``), or per top-level module when it has
        none (:func:`slmlab.models.audit.module_breakdown`); ends with ``Total``."""
        from .audit import module_breakdown

        return self.audit(model) if self.audit is not None else module_breakdown(model)

    @property
    def extra_forward_inputs(self) -> tuple[str, ...]:
        """Family-specific forward keyword arguments (declared once, by the base model class)."""
        return tuple(getattr(getattr(self.model_class, "base_model_class", None), "family_inputs", ()))

    def make_config(self, preset: str | None = None, **overrides) -> PretrainedConfig:
        """A config from a preset (default: the class defaults) plus keyword overrides."""
        if preset is not None and preset not in self.presets:
            raise ValueError(f"unknown preset {preset!r} for family {self.name!r}; known: {sorted(self.presets)}")
        check_config_keys(self.config_class, overrides, f"{self.name} config", f"docs/{self.name}.md")
        kwargs = {**(self.presets.get(preset, {}) if preset else {}), **overrides}
        return self.config_class(**kwargs)


# Keys transformers itself writes into (or reads from) any config.json besides the model's own fields.
_TRANSFORMERS_KEYS = frozenset({
    "architectures", "auto_map", "transformers_version", "model_type", "torch_dtype", "dtype", "_name_or_path",
    "_commit_hash", "_attn_implementation", "attn_implementation", "name_or_path", "use_cache", "tie_word_embeddings",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript", "id2label", "label2id", "num_labels", "problem_type",
    "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "add_cross_attention", "tokenizer_class",
    "prefix", "task_specific_params", "finetuning_task", "cross_attention_hidden_size", "tf_legacy_loss",
    "use_bfloat16", "pruned_heads", "layer_types", "rope_scaling", "rope_parameters",
    # read by PretrainedConfig's post-init (the two internal names are skipped there when a hub config
    # carries them), or written by from_pretrained's quantizers
    "experts_implementation", "per_layer_config", "_attn_implementation_internal", "_experts_implementation_internal",
    "quantization_config",
})


def _generation_keys() -> frozenset[str]:
    """The generation parameters an older ``config.json`` may carry: PretrainedConfig's post-init drops
    them (they belong in ``generation_config.json``), reading the names from the same table."""
    from transformers import GenerationConfig

    table = getattr(GenerationConfig, "_get_default_generation_params", None)
    return frozenset(table()) if callable(table) else frozenset()


@functools.cache
def config_keys(config_class: type[PretrainedConfig]) -> frozenset[str]:
    """Every key ``config_class`` accepts: its constructor's parameters, the fields its defaults
    serialise, its ``attribute_map`` aliases (``hidden_size`` for Lumen's ``hidden_dim``) and the
    keys transformers writes into (or reads from) any ``config.json``."""
    keys = set(_TRANSFORMERS_KEYS) | _generation_keys() | set(config_class.attribute_map)
    for cls in config_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is not None:
            params = inspect.signature(init).parameters.values()
            keys |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}
    keys |= set(config_class().to_dict())
    return frozenset(keys)


def check_config_keys(config_class: type[PretrainedConfig], keys: Iterable[str], what: str = "config",
                      docs: str | None = None) -> None:
    """Raise ``ValueError`` for a key ``config_class`` does not know, listing close matches
    (``hiden_dim`` -> ``hidden_dim``): a typo must never be stored silently as an unused attribute.
    ``docs`` names the page that lists the fields (``docs/lumen.md``)."""
    known = config_keys(config_class)
    unknown = [k for k in keys if k not in known]
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        hints.append(f"{key!r}" + (f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""))
    where = docs or f"the docstring of {config_class.__name__}"
    raise ValueError(f"unknown {what} key(s): {'; '.join(hints)}; fix the key (every field is listed in {where})")


# True while a config is rebuilt from a saved dict (``from_dict``, hence ``from_pretrained``).
_LOADING_SAVED = contextvars.ContextVar("slmlab_loading_saved_config", default=False)


class KeepsSavedKeys:
    """Mixin for every family config: a config rebuilt from a saved dict keeps every key it carries.

    A typo is refused where a person types it (the CLI, a YAML file, :meth:`Family.make_config`, the
    config class called directly in Python: :func:`reject_unknown_keys`). A config that *was saved*,
    though, may carry attributes its class does not declare: transformers' own tests set epsilon
    names (``batch_norm_eps``), clients add their own tags, and ``save_pretrained`` writes them all.
    Refusing those on load would break ``save_pretrained`` -> ``from_pretrained``, so ``from_dict``
    (which ``from_pretrained`` calls) stores them as attributes, as transformers does for its own
    configs, and they are saved again with the config."""

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        token = _LOADING_SAVED.set(True)
        try:
            return super().from_dict(config_dict, **kwargs)
        finally:
            _LOADING_SAVED.reset(token)


def reject_unknown_keys(config: PretrainedConfig, kwargs: Mapping[str, object]) -> None:
    """The Python side of :func:`check_config_keys`: every family config calls it with the keywords
    its own signature did not take (from ``__init__``, or ``__post_init__`` for a dataclass-style
    config), before they reach ``PretrainedConfig``, which would store each one as an attribute that
    nothing reads. Raises ``ValueError`` for a key the class does not know, with the CLI's message
    (``unknown lumen config key(s): 'hiden_dim' (did you mean 'hidden_dim'?); ...``); every key
    transformers passes or writes into ``config.json`` is known (:func:`config_keys`). While a saved
    config is loaded (:class:`KeepsSavedKeys`) nothing is refused: the extra keys are kept."""
    if not kwargs or _LOADING_SAVED.get():
        return
    cls = type(config)
    try:
        name = get_family(cls.model_type).name
    except ValueError:  # a config class not registered here (e.g. exported as remote code)
        check_config_keys(cls, kwargs, cls.__name__)
        return
    check_config_keys(cls, kwargs, f"{name} config", f"docs/{name}.md")


def is_positive_int(value) -> bool:
    """Whether ``value`` is a positive ``int`` (not a bool, not a float such as 2.5 or 256.0): what every
    size and count of a family config must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_positive_ints(config: PretrainedConfig, names: tuple[str, ...]) -> None:
    """Refuse a config whose fields ``names`` are not positive integers (:func:`is_positive_int`), with
    the one message every family gives: ``hidden_dim must be a positive integer, got 2.5``."""
    for name in names:
        value = getattr(config, name)
        if not is_positive_int(value):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def take_aliases(config: PretrainedConfig, kwargs: dict) -> None:
    """Move the transformers names among ``kwargs`` (``hidden_size=96`` for Lumen's ``hidden_dim``: the
    class's ``attribute_map``) onto the family's own fields, so a typed config's ``__post_init__``
    derives and checks the values it was given, not its defaults (transformers applies the aliases
    only in its own post-init, after the family's checks). An alias wins over its field, as in
    transformers. Every family config calls it first in ``__post_init__``."""
    for alias, name in type(config).attribute_map.items():
        if alias in kwargs:
            setattr(config, name, kwargs.pop(alias))


def accept_keywords(config: PretrainedConfig, kwargs: dict) -> None:
    """What every typed family config does first in ``__post_init__`` with the keywords that are not its
    fields: move the transformers aliases onto the fields (:func:`take_aliases`), then refuse unknown keys
    (:func:`reject_unknown_keys`)."""
    take_aliases(config, kwargs)
    reject_unknown_keys(config, kwargs)


class InitOnly(NamedTuple):
    """A keyword a typed config takes but stores under no field of its own name (NeoLLM's and
    NanoHammer's ``rope_scaling``, PGSM's ``tie_weights``, LFM2's ``layer_types``): its ``__post_init__``
    pops it from the keywords. ``after``: the field it follows in the seed's signature (None: last)."""

    default: object
    annotation: str
    after: str | None = None


def config_signature(init_only: Mapping[str, InitOnly] = MappingProxyType({})):
    """Class decorator for a typed config (annotated fields with defaults, checks in ``__post_init__``):
    show its keywords on the ``__init__`` that ``PretrainedConfig.__init_subclass__`` generates, keyword-only
    as every transformers 5 config: the fields the class and its slmlab bases declare, in order, with
    their defaults, the ``init_only`` keywords where they stood in the seed's signature, then ``**kwargs``
    (handed to ``__post_init__``). Without it ``inspect.signature`` shows ``PretrainedConfig``'s fields
    and no ``**kwargs``; :func:`config_keys` reads the keywords from it."""

    def describe(cls: type[PretrainedConfig]) -> type[PretrainedConfig]:
        if "__init__" not in cls.__dict__:  # the wrapper PretrainedConfig.__init_subclass__ generates for `cls`
            raise TypeError(f"{cls.__name__} has no generated __init__ of its own to describe.")
        inherited = {f.name for f in dataclasses.fields(PretrainedConfig)}
        keyword = inspect.Parameter.KEYWORD_ONLY
        params = [inspect.Parameter(f.name, keyword, default=f.default, annotation=f.type)
                  for f in dataclasses.fields(cls) if f.name not in inherited]
        for name, spec in init_only.items():
            at = len(params) if spec.after is None else [p.name for p in params].index(spec.after) + 1
            params.insert(at, inspect.Parameter(name, keyword, default=spec.default, annotation=spec.annotation))
        self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        kwargs = inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)
        cls.__init__.__signature__ = inspect.Signature([self, *params, kwargs])
        return cls

    return describe


def check_saved_model_type(folder: str | Path) -> Family:
    """The slmlab family of a saved model folder, read from its ``config.json`` without running any
    code: a folder whose ``model_type`` is not an slmlab family (e.g. one that ships its own
    ``.py`` through ``auto_map``) is refused."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; expected a saved slmlab model folder") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the folder is damaged: save the model again") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(model_type, str) and model_type.startswith("slmlab_txn"):
        what = ("a pretrained encoder from `slmlab transactions pretrain`" if model_type == "slmlab_txn_encoder"
                else "a fine-tuned model from `slmlab transactions finetune`")
        raise ValueError(f"{path}: this is a transactions checkpoint ({what}); use `slmlab transactions ...`:"
                         " score, evaluate and demo take a fine-tuned run, finetune --encoder a pretraining run")
    try:
        return get_family(str(model_type))
    except ValueError:
        raise ValueError(
            f"{path} has model_type {model_type!r}, which is not an slmlab family (known: {sorted(_FAMILIES)});"
            " slmlab never runs code shipped in a model folder"
        ) from None


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Register ``family`` here and with ``AutoConfig``, ``AutoModelForCausalLM`` and (its base model,
    the causal LM's ``base_model_class``) ``AutoModel``; idempotent."""
    _FAMILIES[family.name] = family
    AutoConfig.register(family.config_class.model_type, family.config_class, exist_ok=True)
    AutoModelForCausalLM.register(family.config_class, family.model_class, exist_ok=True)
    base = getattr(family.model_class, "base_model_class", None)
    if base is not None:
        AutoModel.register(family.config_class, base, exist_ok=True)
    return family


def get_family(name: str) -> Family:
    """Look a family up by name or by its ``model_type``."""
    for fam in _FAMILIES.values():
        if name in (fam.name, fam.config_class.model_type):
            return fam
    raise ValueError(f"unknown model family {name!r}; known: {sorted(_FAMILIES)}")


def families() -> dict[str, Family]:
    return dict(_FAMILIES)


def get_export_info(family: str | Family) -> ExportInfo:
    """How ``family`` (a name, a ``model_type`` or a :class:`Family`) leaves slmlab: the ``export`` it
    registered, else remote code only, under its own name."""
    fam = family if isinstance(family, Family) else get_family(family)
    if fam.export is not None:
        return fam.export
    return ExportInfo(display_name=fam.name, hf_reason=f"the {fam.name} family declares no transformers twin")


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
