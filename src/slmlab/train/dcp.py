"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP): every rank writes its shard,
any world size reads them back (2 ranks -> 1, 2 -> 4, FSDP2 -> one process or DDP).

A checkpoint of a ``parallel=fsdp2`` run is the usual folder (:mod:`slmlab.train.checkpoint`) with the
tensors sharded::

    config.json, generation_config.json, tokenizer files, run.yaml, data_identity.json   (main rank)
    dcp/model/shard-0000R-model-00001-of-00001.safetensors       one file per rank: its model shards
    dcp/optimizer/shard-0000R-model-00001-of-00001.safetensors   its optimiser-state shards
    trainer/optimizer.json   the optimiser state's structure, keyed by parameter name (not by position)
    trainer/rng.safetensors, trainer/state.json                  as in a whole checkpoint

The files are written by DCP's ``HuggingFaceStorageWriter``: safetensors whose JSON header records
where each shard sits in the whole tensor, read back by ``HuggingFaceStorageReader``. DCP's default
format keeps its metadata in a pickle; this one parses JSON and safetensors only, so loading a
checkpoint still unpickles nothing. All ranks write into one folder: several machines need a shared
filesystem for their run folder.

Model tensors are keyed by their ``state_dict`` names (the tied LM head once, under the embedding's
name, as ``save_pretrained`` does), so :func:`load_model_tensors` reads a whole ``model.safetensors``
folder the same way: a run saved without sharding resumes under FSDP2 at any world size too.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch

from .checkpoint import (
    DCP_MODEL,
    DCP_OPTIMIZER,
    TRAINED_CONTEXT,
    CheckpointError,
    NonFiniteWeights,
    check_checkpoint,
    flatten_state,
    is_dcp_checkpoint,
    load_training_state,
    non_finite_parameters,
    prune_checkpoints,
    publish_checkpoint,
    read_optimizer_state,
    read_trainer_state,
    restore_rng,
    temporary_folder,
    unflatten_state,
    write_rng_and_state,
    write_run_files,
)
from .distributed import DistInfo, barrier, broadcast_flag, broadcast_int


def model_class(model: torch.nn.Module) -> type:
    """The model's own class (FSDP2 puts ``FSDP<Name>`` in front of it)."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(model)
    return next(c for c in cls.__mro__ if not issubclass(c, FSDPModule)) if issubclass(cls, FSDPModule) else cls


def reshard(model: torch.nn.Module) -> torch.nn.Module:
    """Put every FSDP2 unit of ``model`` back into shards (a no-op for a whole model). The root unit keeps
    its parameters gathered after a forward without backward (an evaluation), and then
    ``named_parameters`` would not be the sharded parameters the optimiser holds."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint holds, by ``state_dict`` name: every parameter once (a tied one under its
    first name) and the persistent buffers; sharded models give their DTensors (DCP writes and fills
    each rank's shard in place)."""
    persistent = set(reshard(model).state_dict().keys())
    params = dict(model.named_parameters())
    buffers = {n: b for n, b in model.named_buffers() if n in persistent}
    return {n: t.detach() for n, t in {**params, **buffers}.items()}


def _aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """name -> every name of the same parameter (tied weights have several)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def _reader(folder: Path):
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    return HuggingFaceStorageReader(str(folder))


def _load(state: dict[str, torch.Tensor], folder: Path) -> None:
    """``dcp.load`` of ``state`` (filled in place) from ``folder``; in one process without a group."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "torch.distributed is disabled ... load in a single process": meant
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, storage_reader=_reader(folder))


def _stored(folder: Path) -> dict[str, tuple[int, ...]]:
    """name -> whole shape of every tensor stored in ``folder`` (all its shards together)."""
    try:
        meta = _reader(folder).read_metadata()
    except Exception as err:  # safetensors raises its own error types for damaged headers
        raise CheckpointError(f"{folder}: the sharded tensors are unreadable ({err})") from err
    return {name: tuple(m.size) for name, m in meta.state_dict_metadata.items()}


def load_model_tensors(model: torch.nn.Module, folder: Path) -> None:
    """Fill ``model`` (whole or sharded) from the safetensors files of ``folder``: a checkpoint's
    ``dcp/model`` shards written at any world size, or a whole ``model.safetensors`` folder.

    Raises:
        CheckpointError: a weight is missing, unknown to the model or of another shape.
    """
    stored = _stored(folder)
    own = model_tensors(model)
    aliases = _aliases(model)
    wanted: dict[str, torch.Tensor] = {}
    for name, tensor in own.items():
        found = next((a for a in aliases.get(name, [name]) if a in stored), None)
        if found is None:
            raise CheckpointError(f"{folder}: the checkpoint lacks the weight {name}")
        if stored[found] != tuple(tensor.shape):
            raise CheckpointError(f"{folder}: weight {found} has shape {stored[found]}, the model expects"
                                  f" {tuple(tensor.shape)}")
        wanted[found] = tensor
    known = {a for name in own for a in aliases.get(name, [name])}
    unexpected = sorted(set(stored) - known)
    if unexpected:
        raise CheckpointError(f"{folder}: weights {unexpected[:5]} do not belong to {model_class(model).__name__}")
    _load(wanted, folder)


def _optimizers(optimizer) -> list:
    """The ``torch.optim`` optimisers behind ``optimizer`` (a CombinedOptimizer holds several)."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimiser state keyed by parameter name (DCP's ``get_optimizer_state_dict``: the same keys at
    every world size). An optimiser that has not stepped yet gives its groups and an empty state
    (``get_optimizer_state_dict`` would create the state with a zero step, which a resumed run would
    then count)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    optimizers = _optimizers(optimizer)
    if any(opt.state for opt in optimizers):
        return get_optimizer_state_dict(reshard(model), optimizers)
    names = {id(p): n for n, p in reshard(model).named_parameters()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
              for opt in optimizers for g in opt.param_groups]
    return {"state": {}, "param_groups": groups}


def _flatten_optimizer(state: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(structure, tensors)``: the JSON structure of an optimiser state keyed by parameter name, each
    tensor replaced by ``{"__tensor__": "state.<param>.<key>"}`` (:func:`unflatten_state` reads it)."""
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for name, entry in state["state"].items():
        fields = []
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):  # kept as it is (a DTensor shard stays one)
                tensors[f"state.{name}.{key}"] = value
                value = {"__tensor__": f"state.{name}.{key}"}
            else:
                value = flatten_state(value, tensors, f"state.{name}.{key}")
            fields.append([key, value])
        entries.append([name, {"__dict__": fields}])
    groups = flatten_state(state["param_groups"], tensors, "param_groups")
    return {"__dict__": [["state", {"__dict__": entries}], ["param_groups", groups]]}, tensors


def _tensor_keys(structure) -> set[str]:
    """Every ``__tensor__`` key a flattened structure refers to."""
    if isinstance(structure, dict):
        if "__tensor__" in structure:
            return {structure["__tensor__"]}
        return set().union(*(_tensor_keys(v) for v in structure.values()))
    if isinstance(structure, list):
        return set().union(*(_tensor_keys(v) for v in structure))
    return set()


def load_optimizer_tensors(model: torch.nn.Module, optimizer, ckpt: Path) -> None:
    """Restore the optimiser state of a sharded checkpoint into ``optimizer`` (of ``model``, whole or
    sharded, at any world size)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    structure = json.loads((ckpt / "trainer" / "optimizer.json").read_text())
    # the state of every parameter, created if need be (the saved state may hold fewer: those that had
    # no gradient yet have none, and keep none after loading)
    _, own = _flatten_optimizer(get_optimizer_state_dict(reshard(model), _optimizers(optimizer)))
    wanted = _tensor_keys(structure)
    if wanted - set(own):
        raise CheckpointError(f"{ckpt}/trainer/optimizer.json does not match this model/optimiser"
                              f" (no such state here: {sorted(wanted - set(own))[:3]})")
    own = {k: own[k] for k in wanted}
    _load(own, ckpt / DCP_OPTIMIZER)
    try:
        # strict=False: a parameter without saved state (no gradient yet) is left without one
        set_optimizer_state_dict(model, _optimizers(optimizer), unflatten_state(structure, own),
                                 options=StateDictOptions(strict=False))
    except (KeyError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{ckpt}/trainer/optimizer.*: does not match this model/optimiser: {err}") from err


def load_dcp_training_state(ckpt: Path, model: torch.nn.Module, optimizer) -> dict:
    """Restore weights, optimiser state and RNG from a sharded checkpoint into ``model`` (whole or
    sharded, at any world size); returns the trainer state (``trainer/state.json``)."""
    ckpt = Path(ckpt)
    check_checkpoint(ckpt)
    load_model_tensors(model, ckpt / DCP_MODEL)
    load_optimizer_tensors(model, optimizer, ckpt)
    restore_rng(ckpt)
    return read_trainer_state(ckpt)


def load_whole_into_sharded(ckpt: Path, model: torch.nn.Module, optimizer) -> dict:
    """Restore a whole checkpoint (``model.safetensors``, the optimiser state by position) into a sharded
    model and its optimiser: the weights through DCP's reader, the optimiser state renamed by parameter
    and split into this rank's shards; returns the trainer state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    ckpt = Path(ckpt)
    check_checkpoint(ckpt)
    load_model_tensors(model, ckpt)
    saved = read_optimizer_state(ckpt)
    if "optimizers" in saved:
        raise CheckpointError(f"{ckpt} holds the state of several optimisers (Muon + AdamW), which parallel=fsdp2"
                              " does not train; resume it with parallel=ddp")
    names = {id(p): n for n, p in reshard(model).named_parameters()}
    order = [names[id(p)] for opt in _optimizers(optimizer) for g in opt.param_groups for p in g["params"]]
    try:
        by_name = {"state": {order[int(i)]: entry for i, entry in saved["state"].items()},
                   "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in saved["param_groups"]]}
        set_optimizer_state_dict(model, _optimizers(optimizer), by_name,
                                 options=StateDictOptions(full_state_dict=True, strict=False))
    except (IndexError, KeyError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"{ckpt}/trainer/optimizer.*: does not match this model/optimiser: {err}") from err
    restore_rng(ckpt)
    return read_trainer_state(ckpt)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (DTensors)."""
    return any(hasattr(p, "to_local") for p in model.parameters())


def load_any_training_state(ckpt: Path, model: torch.nn.Module, optimizer) -> dict:
    """Resume from ``ckpt`` whatever wrote it and whatever reads it: a sharded checkpoint at any world
    size (:func:`load_dcp_training_state`), a whole one into a sharded model
    (:func:`load_whole_into_sharded`), a whole one into a whole model
    (:func:`slmlab.train.checkpoint.load_training_state`)."""
    ckpt = Path(ckpt)
    if is_dcp_checkpoint(ckpt):
        return load_dcp_training_state(ckpt, model, optimizer)
    if is_sharded(model):
        return load_whole_into_sharded(ckpt, model, optimizer)
    return load_training_state(ckpt, model, optimizer)


def save_dcp_checkpoint(root: Path, step: int, model: torch.nn.Module, tokenizer, optimizer, trainer_state: dict,
                        run_config: dict, keep: int, trained_context: int | None, extra_json: dict | None,
                        dist_info: DistInfo) -> Path | None:
    """Write ``root/step_{step:06d}`` as a sharded checkpoint (a collective: every rank calls it and
    writes its shards); the main rank writes the rest and publishes the folder atomically, as
    :func:`slmlab.train.checkpoint.save_checkpoint` does. Returns the folder on the main rank.

    Raises:
        NonFiniteWeights: some rank's shard holds NaN/inf (on every rank; nothing is written).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    bad = non_finite_parameters(model)
    if broadcast_flag(bool(bad), dist_info):
        raise NonFiniteWeights(f"refusing to save step {step}: parameters {bad[:3] or 'on another rank'} hold NaN/inf")
    root = Path(root)
    tmp = temporary_folder(root, step, broadcast_int(os.getpid(), dist_info))  # one folder for every rank
    structure, optim_tensors = _flatten_optimizer(optimizer_state(model, optimizer))
    error: BaseException | None = None
    if dist_info.is_main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            config = model.config
            config.architectures = [model_class(model).__name__]
            config.save_pretrained(str(tmp))
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(str(tmp))
            write_run_files(tmp, tokenizer, run_config, extra_json)
            (tmp / "trainer").mkdir()
            (tmp / "trainer" / "optimizer.json").write_text(json.dumps(structure))
            write_rng_and_state(tmp / "trainer", {**trainer_state, TRAINED_CONTEXT: trained_context})
        except BaseException as err:  # every rank hears of it before the collective writes begin
            shutil.rmtree(tmp, ignore_errors=True)
            error = err
    if broadcast_flag(error is not None, dist_info):
        if error is not None:
            raise error
        raise CheckpointError(f"the main rank could not write {tmp}; see its error")
    try:
        for tensors, where in ((model_tensors(model), DCP_MODEL), (optim_tensors, DCP_OPTIMIZER)):
            dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(tmp / where), save_distributed=True))
        barrier(dist_info)
        final = publish_checkpoint(tmp, root, step) if dist_info.is_main else None
    except BaseException:
        if dist_info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final is not None:
        prune_checkpoints(root, keep)
    return final


def load_dcp_model(ckpt: Path):
    """The whole model of a sharded checkpoint, in one process (float32, eval mode): built from its
    ``config.json`` (an slmlab family, ``trust_remote_code=False``) and filled from its ``dcp/model``
    shards, whatever the world size that wrote them. Building it leaves the random generators as they were."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    ckpt = Path(ckpt)
    config = AutoConfig.from_pretrained(str(ckpt), trust_remote_code=False)
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    load_model_tensors(model, ckpt / DCP_MODEL)
    if (ckpt / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(ckpt))
    return model.eval()
