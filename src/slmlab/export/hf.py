"""``--to hf``: a transformers folder that loads without slmlab.

Each family declares how it leaves (its ``convert.py``'s ``EXPORT``, looked up through
:func:`slmlab.models.registry.get_export_info`):

* a family transformers implements has an ``hf_twin``: transformers' own class holding the same
  weights (e.g. ``LlamaForCausalLM``); the export runs both models on a probe batch and refuses to
  write a conversion whose logits differ by more than 1e-4. The twin may decline a configuration
  transformers computes differently, saying why;
* every other family, and a declined configuration -> a remote-code folder: the model's own source
  flattened beside the weights (:mod:`slmlab.export.remote_code`) and named in ``config.json``'s
  ``auto_map``, loaded with ``trust_remote_code=True``.

Every folder also holds the run's tokenizer (``model_max_length`` = the trained context; its chat
template, or slmlab's default one, :data:`slmlab.data.chat.DEFAULT_CHAT_TEMPLATE`), a
``generation_config.json`` with bos/eos/pad ids, and a model card ``README.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data.chat import ensure_chat_template
from .common import ExportSource, check_output_folder, load_source, output_folder

HF_DTYPES = ("f32", "f16", "bf16")
MAX_NATIVE_DIFF = 1e-4  # float32 conversions agree to ~1e-6; more means a wrong mapping


@dataclass
class HFExport:
    """What was written: ``kind`` is ``native`` or ``remote code``; ``architecture`` the class name;
    ``why_remote`` why a family with a transformers twin declined this configuration (the model
    card says it); ``no_twin`` why the family has no twin at all; ``max_diff`` the native
    conversion's measured largest logit difference from slmlab's model (float32 probe batch)."""

    out: Path
    family: str
    kind: str
    architecture: str
    dtype: str
    why_remote: str | None = None
    max_diff: float | None = None
    no_twin: str | None = None


def _torch_dtype(dtype: str):
    import torch

    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]


def native_model(src: ExportSource):
    """``(transformers model with slmlab's weights, None)`` from the family's ``hf_twin``;
    ``(None, why not)`` when the twin declines this configuration; ``(None, None)`` for a family
    without a twin."""
    from ..models.registry import get_export_info

    twin = get_export_info(src.family).hf_twin
    if twin is None:
        return None, None
    return twin(src.model, dict(src.special_ids))


def max_logit_difference(ours, theirs, vocab_size: int, length: int) -> float:
    """Largest ``|logit|`` difference of two models on a fixed random ``[2, length]`` batch."""
    import torch

    ids = torch.randint(0, vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((ours(input_ids=ids).logits - theirs(input_ids=ids).logits).abs().max())


def export_hf(source: str | Path, out: str | Path, *, force: bool = False, dtype: str = "f32") -> HFExport:
    """Export a run, checkpoint or saved slmlab model as a transformers folder ``out``.

    Args:
        source: a run folder (its newest checkpoint), a checkpoint folder, or a saved slmlab model.
        out: the folder to write; an existing non-empty one is refused unless ``force``.
        force: replace ``out``'s contents (never the folder holding ``source``).
        dtype: weights' dtype on disk: ``f32`` (default), ``f16`` or ``bf16``.
    Raises:
        ValueError: a non-empty ``out`` without ``force``, an unknown dtype, a model with no tokenizer.
        FileNotFoundError / CheckpointError: nothing usable at ``source``.
    """
    if dtype not in HF_DTYPES:  # checked before torch is imported: bad arguments fail at once
        raise ValueError(f"--dtype {dtype!r} is not available for --to hf; choose one of {', '.join(HF_DTYPES)}"
                         " (q8_0 is for --to gguf)")
    out = Path(out)
    check_output_folder(out, force=force, source=Path(source))
    from transformers import GenerationConfig

    from ..train.checkpoint import quiet_hf_progress

    torch_dtype = _torch_dtype(dtype)
    src = load_source(source)
    if src.tokenizer is None:
        raise ValueError(f"{src.checkpoint} has no tokenizer.json; an export carries the model's tokenizer: export a"
                         " checkpoint saved by slmlab train, or save the tokenizer the model was trained with beside it")
    hf, why_remote = native_model(src)
    result = HFExport(out, src.family, "native" if hf is not None else "remote code", "", dtype, why_remote)
    if hf is None and why_remote is None:
        from ..models.registry import get_export_info

        result.no_twin = get_export_info(src.family).hf_reason
    with output_folder(out, force=force, source=src.checkpoint) as tmp:
        if hf is not None:
            length = min(8, src.trained_context or 8, int(src.model.config.max_position_embeddings))
            result.max_diff = max_logit_difference(src.model, hf, int(src.model.config.vocab_size), length)
            if not result.max_diff <= MAX_NATIVE_DIFF:
                raise RuntimeError(f"{type(hf).__name__} built from {src.checkpoint} differs from slmlab's model by"
                                   f" {result.max_diff:.3g} in the logits (> {MAX_NATIVE_DIFF}); the conversion is wrong")
            model = hf
        else:
            from .remote_code import write_remote_code

            model = src.model
            model.config.auto_map = write_remote_code(model.config, model, tmp)
        for name, value in src.special_ids.items():
            setattr(model.config, name, value)
        result.architecture = type(model).__name__
        with quiet_hf_progress():
            model.to(torch_dtype).save_pretrained(str(tmp))
        GenerationConfig(**src.special_ids).save_pretrained(str(tmp))
        if src.trained_context is not None:
            src.tokenizer.model_max_length = src.trained_context
        ensure_chat_template(src.tokenizer)  # clients (trl's SFTTrainer, pipelines) need one; slmlab's default else
        src.tokenizer.save_pretrained(str(tmp))
        from .card import model_card

        (tmp / "README.md").write_text(model_card(src, result), encoding="utf-8")
    return result

