"""Weight-only int8 and int4 for every family: a module swap applied after loading, and saved folders.

:func:`quantize_int8` replaces each plain ``nn.Linear`` of a model (the LM head included, tied or
not) by an :class:`~slmlab.layers.quantized.Int8Linear` holding int8 weights and one bfloat16-exact
scale per output channel; :func:`quantize_int4` by an :class:`~slmlab.layers.quantized.Int4Linear`
holding 4-bit codes with a (scale, zero) pair per group of 32 input columns (the maths:
``docs/quantize.md``). The same modules are swapped by both. What stays float32, and why:

* embedding tables: a lookup reads one row per token, so int8 would not make decoding faster, and
  several families read the table directly (the decode plans, NeoLLM's Spelling Bee, the audits).
  A tied LM head gets its own int8 copy of the table (``V x d`` bytes more memory, 4x less traffic
  per token than the float32 head);
* norms, convolution kernels (LFM2's and PGSM's depthwise ``[C, 1, K]`` kernels: ``C K`` numbers,
  read once per token), biases, gates and other small parameters that are not ``nn.Linear`` weights;
* ``nn.Linear`` subclasses with a forward of their own, unless they can fold into a plain linear
  (``fold_multipliers()``: NeoLLM's learnable row/column multipliers ``diag(r) W diag(c)`` are folded
  into ``W`` first, then ``W`` is quantized); no other forward is silently replaced;
* modules a family names in a class attribute ``keep_float_linears`` (children read as float32
  weights by design, e.g. NeoLLM's JTok-M router).

What differs between int8 and int4 (the layer class, the record, the flag's help, the refusals) is a row
of :data:`slmlab.quant_schemes.SCHEMES`; this module swaps, records and loads through the rows.

A saved int8 folder (:func:`save_quantized`) holds ``model.safetensors`` with the int8 buffers
(``<name>.qweight``, ``<name>.scale``) and a ``config.json`` whose ``quantization_config`` records
the method and the swapped modules; :func:`load_quantized` rebuilds the family's model from that
config (an slmlab family: no code from the folder runs), swaps the same modules, and loads the
tensors strictly. Load such a folder through slmlab (:func:`slmlab.train.saved.load_for_inference`,
every command): transformers' own ``from_pretrained`` does not know the format; it warns ("Unknown
quantization type") and leaves the swapped linears randomly initialised.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from ..layers.quantized import INT4_GROUP, layer_class, scheme_of_layer
from ..quant_schemes import INT4, INT8, Scheme, scheme_named, scheme_with_method

WEIGHTS = "model.safetensors"
# files of a saved model that travel with its int8 copy (the tokenizer, generation settings, the run's
# record of its data and context)
CARRIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                 "run.yaml", "trainer/state.json")


def plain_linear(module: nn.Module) -> bool:
    """Whether ``module`` computes ``x W^T + b`` from its ``weight`` and ``bias`` alone, or can be made
    to (a multiplied linear layer with ``fold_multipliers()``, e.g. NeoLLM's ``RowMultipliedLinear``)."""
    return type(module) is nn.Linear or callable(getattr(module, "fold_multipliers", None))


def int8_targets(model: nn.Module) -> list[str]:
    """Names of the modules :func:`quantize_int8` swaps: plain linears (:func:`plain_linear`), minus
    those a parent keeps in float32 (``keep_float_linears``)."""
    keep = set()
    for name, module in model.named_modules():
        for child in getattr(module, "keep_float_linears", ()):
            keep.add(f"{name}.{child}" if name else child)
    return [name for name, module in model.named_modules()
            if plain_linear(module) and name not in keep]


def float_linears(model: nn.Module) -> list[str]:
    """Names of the linear modules (``nn.Linear`` and its subclasses, multiplied linears) that stay float32
    after :func:`quantize_int8`."""
    swapped = set(int8_targets(model))
    return [name for name, module in model.named_modules()
            if (isinstance(module, nn.Linear) or plain_linear(module)) and name not in swapped]


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def quantize_int8(model: nn.Module) -> list[str]:
    """Swap ``model``'s eligible linears for :class:`Int8Linear` in place (inference only).

    A model that is already quantized is left as it is. Records the swap in ``model.config``'s
    ``quantization_config`` (when the model has a config), which :func:`save_quantized` writes.

    Returns:
        the names of the swapped modules.
    """
    return _swap(model, INT8)


def quantize_int4(model: nn.Module, group: int = INT4_GROUP) -> list[str]:
    """Swap ``model``'s eligible linears for :class:`Int4Linear` (``group`` input columns per scale and
    zero) in place, as :func:`quantize_int8` does for int8."""
    return _swap(model, INT4, group=group)


def quantize(model: nn.Module, scheme: str) -> list[str]:
    """Swap ``model``'s eligible linears for the layers of the scheme called ``scheme`` (a name of
    :data:`slmlab.quant_schemes.SCHEMES`: ``"int8"`` as :func:`quantize_int8`, ``"int4"`` as :func:`quantize_int4`)."""
    return _swap(model, scheme_named(scheme, "quantization scheme"))


@torch.no_grad()
def _swap(model: nn.Module, scheme: Scheme, **options) -> list[str]:
    if quantized_modules(model):
        return quantized_modules(model)
    names = int8_targets(model)
    layers = []
    for name in names:
        linear = model.get_submodule(name)
        if type(linear) is not nn.Linear:
            linear.fold_multipliers()  # diag(r) W diag(c) into W: the layer is now x W^T + b
        layers.append(layer_class(scheme).from_linear(linear, **options))
        _set_module(model, name, layers[-1])
    model.eval()
    if getattr(model, "config", None) is not None:
        model.config.quantization_config = scheme.record(names, layers[0].settings() if layers else {})
    return names


def quantized_modules(model: nn.Module) -> list[str]:
    """Names of ``model``'s quantized linear modules, of any scheme (empty for a float model)."""
    return [name for name, module in model.named_modules() if scheme_of_layer(module) is not None]


def apply_quantization(model: nn.Module, scheme: str | None, device) -> list[str]:
    """What the ``--quantize`` flag of ``generate`` / ``serve`` / ``eval`` does: nothing for None, else
    :func:`quantize` (a no-op on a model loaded from a folder quantized with the same scheme).

    Raises:
        ValueError: an unknown scheme, a device its kernel does not run on (torch's CPU kernels), or a
            model already quantized with another scheme (it would silently stay in that one).
    """
    if scheme is None:
        return []
    row = scheme_named(scheme, "--quantize scheme")
    refusal = row.refusal(torch.device(device), scheme_of(model))
    if refusal is not None:
        raise ValueError(refusal)
    return _swap(model, row)


def scheme_of(model: nn.Module) -> Scheme | None:
    """The scheme of a quantized model (its first quantized module's row), None for a float one."""
    return next((row for row in map(scheme_of_layer, model.modules()) if row is not None), None)


def quantization_of(folder: str | Path) -> dict | None:
    """The ``quantization_config`` a saved folder's ``config.json`` records (None for a float model).

    Raises:
        ValueError: a ``quantization_config`` this slmlab did not write.
    """
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    record = config.get("quantization_config") if isinstance(config, dict) else None
    if record is None:
        return None
    if (not isinstance(record, dict) or scheme_with_method(record.get("quant_method")) is None
            or not isinstance(record.get("modules"), list)):
        raise ValueError(f"{folder}/config.json has a quantization_config slmlab cannot load ({record!r}); load the"
                         " float model and pass --quantize int8, or write the folder with `slmlab quantize`")
    return record


def save_quantized(model: nn.Module, source: str | Path | None, out: str | Path,
                   source_files: dict[str, tuple[int, int]] | None = None) -> Path:
    """Write a quantized ``model`` to the folder ``out``: ``config.json`` (with ``quantization_config``),
    ``model.safetensors`` and, from ``source`` (the folder it was loaded from), the tokenizer,
    generation config and run record (:data:`CARRIED_FILES`). ``out`` keeps the promise of
    :mod:`slmlab.outputs`: it is written through a temporary sibling and appears whole or not at all.

    Args:
        source_files: ``source``'s fingerprint (:func:`slmlab.outputs.snapshot`) taken before its weights
            were read; default: taken now. A source that changed since (a live run rotating its
            checkpoints) is refused, not half-copied.
    Raises:
        ValueError: ``model`` holds no quantized module, ``out`` exists and is not an empty folder, or
            ``source`` changed while it was read.
    """
    from safetensors.torch import save_file

    from ..outputs import check_unchanged, snapshot, staged_folder

    names = quantized_modules(model)
    if not names:
        raise ValueError("the model has no quantized module; call slmlab.models.quantize.quantize_int8(model) first")
    if source is not None and source_files is None:
        source_files = snapshot(source)
    record = getattr(model.config, "quantization_config", None)
    if not isinstance(record, dict) or record.get("modules") != names:
        first = model.get_submodule(names[0])
        record = scheme_of_layer(first).record(names, first.settings())
    model.config.quantization_config = record
    with staged_folder(out) as tmp:
        model.config.to_json_file(str(tmp / "config.json"))
        # tied tensors are written once per name (a plain copy each): safetensors refuses shared storage
        state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt", "quantization": record["quant_method"]})
        if source is not None:
            try:
                for name in CARRIED_FILES:
                    if name in source_files:
                        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(Path(source) / name, tmp / name)
            except FileNotFoundError:  # removed since the snapshot: said as the change it is
                check_unchanged(source, source_files)
                raise
            check_unchanged(source, source_files)
    return Path(out)


@torch.no_grad()
def load_quantized(folder: str | Path) -> nn.Module:
    """The quantized model saved in ``folder`` by :func:`save_quantized`, in eval mode on the CPU.

    ``config.json`` must name an slmlab family (checked by the caller, :func:`slmlab.train.saved.open_checkpoint`);
    the model is built from that config, the recorded modules swapped for empty layers of the recorded
    scheme (``for_record``: :class:`Int8Linear`, or :class:`Int4Linear` with the recorded group size), and
    every tensor of ``model.safetensors`` loaded strictly (a missing or unexpected name raises).
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    folder = Path(folder)
    record = quantization_of(folder)
    if record is None:
        raise ValueError(f"{folder} holds a float model; load it with load_for_inference, or quantize it first")
    layer = layer_class(scheme_with_method(record["quant_method"]))
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    model = model.float()
    for name in record["modules"]:
        linear = model.get_submodule(name)
        if not plain_linear(linear):
            raise ValueError(f"{folder}: module {name!r} is not a linear layer of this {config.model_type} model; the"
                             " folder does not match its config: quantize the float model again")
        _set_module(model, name, layer.for_record(linear.in_features, linear.out_features, linear.bias is not None, record))
    state = load_file(str(folder / WEIGHTS))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}/{WEIGHTS} does not match its quantization config (missing {missing[:3]}, unexpected"
                         f" {unexpected[:3]}); quantize the float model again")
    model.config.quantization_config = record
    return model.eval()
