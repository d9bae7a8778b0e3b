"""LoRA adapters through ``peft``: the spec, adding adapters to a model, saving, loading, merging.

LoRA (Hu et al., arXiv:2106.09685) freezes the model and learns ``W + (alpha / r) · B A`` for chosen
linear layers. Which layers: the family's ``lora_targets`` (its registry entry) or the
spec's ``targets``, matched against the last component of each module's name and kept only where the
module is a plain ``nn.Linear`` (a layer with its own maths around the matrix, such as NeoLLM's
multiplied linears, would not merge exactly). The adapter is saved in peft's own format
(``adapter_config.json`` + ``adapter_model.safetensors``, loadable by ``PeftModel.from_pretrained``);
slmlab's adapter folders also carry the base model's ``config.json``, so they resolve and check like
any checkpoint, and ``base_model_name_or_path`` names the base checkpoint folder (absolute).

``peft`` is an optional extra (``pip install 'slmlab[finetune]'``); it is imported only here, inside
the functions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from torch import nn

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSpec:
    """What ``--lora`` asks for.

    Args:
        r: the rank of ``B A``.
        alpha: the scale numerator (the update is ``alpha / r · B A``).
        dropout: dropout on the adapter's input during training.
        targets: module names (last name component) to adapt; empty = the family's ``lora_targets``.
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        out = asdict(self)
        out["targets"] = list(self.targets)
        return out


def parse_lora_spec(text: str) -> LoraSpec:
    """``"r=8,alpha=16,dropout=0.05,targets=q_proj,v_proj"`` -> :class:`LoraSpec` (an empty string: the
    defaults). Words after ``targets=`` without ``=`` are more targets."""
    values: dict = {}
    targets: list[str] = []
    key = None
    for word in (w.strip() for w in str(text).split(",")):
        if not word:
            continue
        name, sep, value = word.partition("=")
        if not sep:
            if key != "targets":
                raise ValueError(f"--lora: {word!r} is not key=value; write e.g. r=8,alpha=16,targets=q_proj,v_proj")
            targets.append(word)
            continue
        key = name.strip()
        if key == "targets":
            targets += [value.strip()] if value.strip() else []
            continue
        if key not in ("r", "alpha", "dropout"):
            raise ValueError(f"--lora: unknown key {key!r}; known: r, alpha, dropout, targets")
        try:
            values[key] = int(value) if key == "r" else float(value)
        except ValueError:
            raise ValueError(f"--lora: {key}={value!r} is not a number; write e.g. {key}=8") from None
    spec = LoraSpec(**values, targets=tuple(targets))
    if spec.r <= 0 or spec.alpha <= 0 or not 0.0 <= spec.dropout < 1.0:
        raise ValueError(f"--lora: need r > 0, alpha > 0 and 0 <= dropout < 1, got r={spec.r}, alpha={spec.alpha},"
                         f" dropout={spec.dropout}")
    return spec


def require_peft():
    """The ``peft`` module, or a ``ValueError`` saying how to install it."""
    try:
        import peft
    except ImportError:
        raise ValueError("LoRA needs the peft package; install it with: pip install 'slmlab[finetune]'") from None
    return peft


def target_modules(model: nn.Module, targets: tuple[str, ...] = ()) -> list[str]:
    """Full names of the modules of ``model`` that LoRA adapts: plain ``nn.Linear`` layers whose last name
    component is in ``targets`` (default: the family's ``lora_targets``), never the output head.

    Raises:
        ValueError: a requested target names no module, only modules that are not plain linear layers,
            or nothing is left to adapt.
    """
    from ..models.registry import get_family

    family = get_family(model.config.model_type)
    wanted = tuple(targets) or tuple(family.lora_targets)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    by_name: dict[str, list[tuple[str, nn.Module]]] = {}
    for name, module in model.named_modules():
        by_name.setdefault(name.rsplit(".", 1)[-1], []).append((name, module))
    chosen: list[str] = []
    for target in wanted:
        found = [(n, m) for n, m in by_name.get(target, []) if m is not head]
        plain = [n for n, m in found if type(m) is nn.Linear]
        if targets and not plain:
            have = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m) is nn.Linear and m is not head})
            what = (f"names only {type(found[0][1]).__name__} modules, not plain nn.Linear layers" if found
                    else f"matches no module of this {family.name} model")
            raise ValueError(f"--lora targets: {target!r} {what}; choose among {', '.join(have)}")
        chosen += plain
    if not chosen:
        raise ValueError(f"no plain linear layer of this {family.name} model matches the LoRA targets {list(wanted)};"
                         " name some with --lora targets=...")
    return sorted(set(chosen))


def add_lora(model: nn.Module, spec: LoraSpec, base_path: str | Path | None = None):
    """Wrap ``model`` in a ``peft`` ``PeftModel`` with fresh LoRA adapters (``B = 0``: the output is
    unchanged at the start); every other parameter is frozen. ``model`` is changed in place (its target
    layers become LoRA layers) and stays usable directly (``peft_model.get_base_model()`` is ``model``).

    Args:
        model: an slmlab causal LM.
        spec: rank, scale, dropout and targets.
        base_path: the base checkpoint folder, recorded as ``base_model_name_or_path``.
    """
    import warnings

    peft = require_peft()
    modules = target_modules(model, spec.targets)
    config = peft.LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=modules,
                             bias="none")
    with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = peft.get_peft_model(model, config)
    if base_path is not None:
        peft_model.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    return peft_model


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` distinct parameters of ``model``."""
    params = {id(p): p for p in model.parameters()}.values()
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def is_adapter_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a peft adapter (``adapter_config.json``)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> Path:
    """The base model folder an adapter folder was trained on (its ``base_model_name_or_path``)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{folder / ADAPTER_CONFIG} is unreadable ({err}); save the adapter again") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        raise ValueError(f"{folder / ADAPTER_CONFIG} names no base model (base_model_name_or_path); set it to the"
                         " folder of the model the adapter was trained on")
    base = Path(base)
    if not base.is_dir():
        raise FileNotFoundError(f"the base model of adapter {folder} is missing: {base} does not exist; restore it, or"
                                " point base_model_name_or_path in adapter_config.json at a copy")
    return base


def save_adapter(peft_model, folder: str | Path) -> None:
    """Write the adapter in peft's format plus the base model's ``config.json`` and generation config."""
    folder = Path(folder)
    peft_model.save_pretrained(str(folder))
    base = peft_model.get_base_model()
    base.config.save_pretrained(str(folder))
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(str(folder))


def load_adapter(model: nn.Module, folder: str | Path, trainable: bool = False):
    """``model`` (the base, loaded) with the adapter of ``folder`` on it, as a ``PeftModel``."""
    import warnings

    peft = require_peft()
    with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        return peft.PeftModel.from_pretrained(model, str(folder), is_trainable=trainable)


def load_adapter_weights(peft_model, folder: str | Path) -> None:
    """Put the adapter weights saved in ``folder`` into ``peft_model`` (same targets and rank)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from .checkpoint import CheckpointError

    result = set_peft_model_state_dict(peft_model, load_file(str(Path(folder) / ADAPTER_WEIGHTS)))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise CheckpointError(f"{folder}: the adapter does not fit this model (unexpected"
                              f" {list(result.unexpected_keys)[:3]}, missing {missing[:3]})")


def merge_adapter(peft_model) -> nn.Module:
    """The plain model with ``W + alpha/r · B A`` written into each adapted layer (peft's
    ``merge_and_unload``): the same outputs, no adapter left."""
    return peft_model.merge_and_unload()
