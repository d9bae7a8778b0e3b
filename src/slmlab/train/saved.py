"""A saved model folder, opened once: resolve, check, load.

Everything that runs a saved slmlab model (``slmlab eval``, ``generate``, ``serve``, ``export``, the
benchmarks) goes through :func:`load_for_inference`: the path is resolved to one checkpoint folder
and checked once (:func:`open_checkpoint`: JSON files parse, safetensors headers are whole,
``model_type`` is an slmlab family, so no code shipped in the folder ever runs), then the weights
are loaded and must be finite. What the run recorded beside the weights comes with them: the run
config (``run.yaml``) and the trained context (:func:`trained_context`, the one reader of it).

The commands import this module inside their functions: ``slmlab --help`` must not pay for torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import TRAINED_CONTEXT, real_length, resolve_checkpoint


@dataclass(frozen=True)
class SavedCheckpoint:
    """A resolved and checked checkpoint folder, its weights not read yet.

    Attributes:
        checkpoint: the checkpoint folder (a run folder resolves to its newest checkpoint).
        family: the slmlab :class:`~slmlab.models.registry.Family` its ``config.json`` names.
        run_config: its ``run.yaml`` (empty when it has none).
        trained_context: the sequence length the model was trained on (None if not recorded).
    """

    checkpoint: Path
    family: object
    run_config: dict = field(default_factory=dict)
    trained_context: int | None = None


@dataclass
class LoadedModel:
    """A saved model ready for inference, and what its run recorded.

    Attributes:
        checkpoint: the checkpoint folder it was loaded from.
        family: its slmlab :class:`~slmlab.models.registry.Family`.
        model: the model in eval mode, float32, on ``device``.
        tokenizer: the tokenizer saved with it (None if it has none).
        device: the ``torch.device`` it is on.
        run_config: the checkpoint's ``run.yaml`` (empty when it has none).
        trained_context: the sequence length the model was trained on (None if not recorded).
    """

    checkpoint: Path
    family: object
    model: object
    tokenizer: object
    device: object
    run_config: dict = field(default_factory=dict)
    trained_context: int | None = None

    def context(self, requested: int | None = None, option: str = "--block-size") -> int:
        """The context window to run this model with: the one rule that eval, chat, fine-tune
        evaluation and the lm-eval tasks share (:func:`inference_context`)."""
        return inference_context(self.model, self.trained_context, requested, option)


# The context of a model that records neither a trained context nor a position limit.
UNBOUNDED_MODEL_CONTEXT = 2048


def inference_context(model, trained: int | None, requested: int | None = None, option: str = "--block-size") -> int:
    """The context window to run ``model`` with: ``requested`` (the user's ``option``), else
    ``trained`` (the sequence length it was trained on, :func:`trained_context`), else its position
    limit (``max_positions()``), else :data:`UNBOUNDED_MODEL_CONTEXT`; never more than the model
    accepts. A request past the limit is refused (ValueError naming ``option``); a trained context past
    it (a config edited after training) is cut to it."""
    limit = model.max_positions()
    length = requested or trained or limit or UNBOUNDED_MODEL_CONTEXT
    if limit is not None and length > limit:
        if requested:
            raise ValueError(f"{option} {requested} exceeds the model's {limit} positions (max_position_embeddings);"
                             " lower it")
        length = limit
    return int(length)


def saved_run_config(ckpt: Path) -> dict:
    """A checkpoint's ``run.yaml`` as a dict (empty when it has none); malformed YAML names the file."""
    import yaml

    path = Path(ckpt) / "run.yaml"
    if not path.is_file():
        return {}
    try:
        with path.open(encoding="utf-8") as stream:  # a YAML error then names the file
            saved = yaml.safe_load(stream)
    except yaml.YAMLError as err:
        raise ValueError(f"malformed YAML in {path} ({err}); fix the file's syntax or use an earlier checkpoint") from None
    return saved if isinstance(saved, dict) else {}


def is_synthetic_run(run_config: dict) -> bool:
    """Whether a run config's ``data`` is a synthetic task (whose ids and sequence length are its own)."""
    from ..data import parse_task_spec

    data = run_config.get("data")
    return isinstance(data, str) and parse_task_spec(data) is not None


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``; empty when the file is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def trained_context(checkpoint: str | Path, run_config: dict | None = None) -> int | None:
    """The sequence length the model in ``checkpoint`` (a checkpoint folder, as
    :func:`slmlab.train.checkpoint.resolve_checkpoint` returns) was trained on; None when nothing
    records it. Every consumer (eval, export, serve, generate) reads it here.

    ``slmlab train`` records it with every checkpoint: ``trained_context`` in ``trainer/state.json``
    (:func:`slmlab.train.checkpoint.save_checkpoint`). For a folder without that record (checkpoints
    written before it existed, saved models) it falls back to:

    1. ``tokenizer_config.json``'s ``model_max_length``, which ``slmlab train`` has always set to the
       trained length (transformers' "no limit" placeholder is not a length);
    2. a text run's ``block_size`` in ``run.yaml`` (``run_config`` when the caller has read it; a
       synthetic task fixes its own length, so its ``block_size`` says nothing).
    """
    ckpt = Path(checkpoint)
    recorded = real_length(read_json_object(ckpt / "trainer" / "state.json").get(TRAINED_CONTEXT))
    if recorded is not None:
        return recorded
    length = real_length(read_json_object(ckpt / "tokenizer_config.json").get("model_max_length"))
    if length is not None:
        return length
    run_config = saved_run_config(ckpt) if run_config is None else run_config
    block = real_length(run_config.get("block_size"))
    if block is not None and run_config.get("data") and not is_synthetic_run(run_config):
        return block
    return None


def open_checkpoint(path: str | Path) -> SavedCheckpoint:
    """Resolve ``path`` to one checkpoint folder and check it, reading no weights.

    Args:
        path: a run folder (its newest checkpoint), a checkpoint folder, or any saved model folder.
    Raises:
        FileNotFoundError / CheckpointError (a ValueError): nothing usable at ``path``.
        ValueError: ``model_type`` is not an slmlab family, or ``run.yaml`` is malformed.
    """
    from ..models.registry import check_saved_model_type
    from .checkpoint import check_checkpoint

    ckpt = resolve_checkpoint(path)
    check_checkpoint(ckpt, need_trainer=False)
    family = check_saved_model_type(ckpt)
    run_config = saved_run_config(ckpt)
    return SavedCheckpoint(ckpt, family, run_config, trained_context(ckpt, run_config))


def _load_model(ckpt: Path):
    """The model of a checked checkpoint folder (float32, ``trust_remote_code=False``), whatever kind it
    is: a quantized folder (``slmlab quantize``, :func:`slmlab.models.quantize.load_quantized`); a LoRA
    adapter folder (:mod:`slmlab.train.lora`), whose base is loaded (checked the same way, through this
    function) and the adapter merged into it, so every reader gets a plain model with the outputs of base +
    adapter; a sharded checkpoint (``parallel=fsdp2``, :func:`slmlab.train.dcp.load_dcp_model`); or a
    plain (or merged) model folder. No reader calls ``from_pretrained`` itself: transformers does not
    know the quantized format and would leave its linears randomly initialised."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..models.quantize import load_quantized, quantization_of
    from ..models.registry import check_saved_model_type
    from .checkpoint import is_dcp_checkpoint, quiet_hf_progress
    from .lora import adapter_base, is_adapter_folder, load_adapter, merge_adapter

    if is_adapter_folder(ckpt):
        base = open_checkpoint(adapter_base(ckpt))
        if base.family is not check_saved_model_type(ckpt):
            raise ValueError(f"adapter {ckpt} is a {check_saved_model_type(ckpt).name} adapter but its base {base.checkpoint}"
                             f" is a {base.family.name} model; point base_model_name_or_path at the right base")
        return merge_adapter(load_adapter(_load_model(base.checkpoint), ckpt))
    if quantization_of(ckpt):  # `slmlab quantize`: int8 / int4 buffers
        return load_quantized(ckpt)
    if is_dcp_checkpoint(ckpt):  # parallel=fsdp2: the model's shards, written at any world size
        from .dcp import load_dcp_model

        return load_dcp_model(ckpt)
    with quiet_hf_progress():
        return AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32, trust_remote_code=False)


def check_trainable(ckpt: str | Path) -> None:
    """Refuse to train from a quantized folder (``slmlab quantize``; directly, or as the base of a LoRA
    adapter): its linear weights are int8 / int4 codes, which no optimiser can update, and loading it as
    a float model would start from random weights.

    Raises:
        ValueError: naming the folder, its format, and what to train from instead.
    """
    from ..models.quantize import quantization_of
    from .lora import adapter_base, is_adapter_folder

    ckpt = Path(ckpt)
    record = quantization_of(ckpt)
    if record is not None:
        raise ValueError(f"{ckpt} is an int{record.get('bits', 8)} quantized copy (written by slmlab quantize): its linear"
                         " weights are integer codes that cannot be trained; train or fine-tune the float run it was"
                         " quantized from, then quantize the result")
    if is_adapter_folder(ckpt):
        check_trainable(resolve_checkpoint(adapter_base(ckpt)))


def load_saved_model(folder: str | Path):
    """A saved slmlab model to train further (``train --model FOLDER``, ``finetune``): every parameter
    trainable (a LoRA run comes merged into its base, peft's frozen flags cleared), loaded without running
    any code shipped in the folder (its ``config.json`` must name an slmlab family).

    Raises:
        ValueError: a quantized folder (:func:`check_trainable`).
    """
    ckpt = open_checkpoint(folder).checkpoint
    check_trainable(ckpt)
    return _load_model(ckpt).requires_grad_(True)


def load_for_inference(path: str | Path | SavedCheckpoint, device: str = "auto") -> LoadedModel:
    """A saved model ready for inference (:class:`LoadedModel`), its folder resolved and checked once.

    Args:
        path: a run folder (its newest checkpoint), a checkpoint folder, any saved model folder, or
            a :class:`SavedCheckpoint` already opened (:func:`open_checkpoint`).
        device: ``auto`` (CUDA when present, else CPU) or a torch device string.
    Raises:
        FileNotFoundError / CheckpointError (a ValueError): nothing usable at ``path``, or weights
            that are not finite.
    """
    from ..data import get_tokenizer
    from .checkpoint import CheckpointError, non_finite_parameters
    from .environment import resolve_device

    saved = path if isinstance(path, SavedCheckpoint) else open_checkpoint(path)
    ckpt = saved.checkpoint
    dev = resolve_device(device)
    model = _load_model(ckpt)
    bad = non_finite_parameters(model)
    if bad:
        raise CheckpointError(
            f"{ckpt} holds non-finite weights (NaN/inf in {bad[:3]}); its outputs would be meaningless: use an earlier"
            " checkpoint of the run"
        )
    model = model.to(dev).eval()
    tokenizer = get_tokenizer(str(ckpt)) if (ckpt / "tokenizer.json").is_file() else None
    return LoadedModel(ckpt, saved.family, model, tokenizer, dev, saved.run_config, saved.trained_context)
