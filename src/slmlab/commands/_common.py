"""What every command shares: a parser built from the command's docstring, the split of positional
words into config files and ``key=value`` overrides, and loading a saved model for inference.

Imports of torch/transformers stay inside the functions: ``slmlab --help`` imports every command
module and must not pay for them.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def command_parser(func, name: str) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` for ``slmlab <name>`` whose description is ``func``'s docstring (first
    line: the summary; the rest, verbatim, below the options)."""
    doc = (func.__doc__ or "").strip()
    head, _, rest = doc.partition("\n")
    return argparse.ArgumentParser(prog=f"slmlab {name}", description=head, epilog=rest.strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional words -> (YAML config files, ``key=value`` overrides)."""
    files, overrides = [], []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif item.endswith((".yaml", ".yml")):
            files.append(item)
        else:
            raise ValueError(f"expected a .yaml config file or key=value, got {item!r}")
    return files, overrides


def parse_overrides(items: list[str]) -> dict:
    """``["num_kv_heads=2", "optim.lr=3e-4"]`` -> a (nested) dict, values parsed as YAML; the same
    parser the run config uses (:func:`slmlab.train.config.parse_overrides`)."""
    from ..train.config import parse_overrides as parse

    return parse(list(items))


def load_for_inference(path: str | Path, device: str = "auto"):
    """A saved model ready for inference: ``(checkpoint folder, model in eval mode on the device,
    tokenizer or None, device)``.

    The folder is checked before anything is loaded (JSON files parse, safetensors headers are
    whole, ``model_type`` is an slmlab family: no code shipped in the folder ever runs), and the
    loaded weights must be finite.

    Args:
        path: a run folder (its newest checkpoint), a checkpoint folder, or any saved model folder.
        device: ``auto`` (CUDA when present, else CPU) or a torch device string.
    Raises:
        FileNotFoundError / CheckpointError (a ValueError): nothing usable at ``path``.
    """
    from ..data import get_tokenizer
    from ..train.checkpoint import CheckpointError, non_finite_parameters, resolve_checkpoint
    from ..train.run import load_saved_model
    from ..train.trainer import resolve_device

    ckpt = resolve_checkpoint(path)
    dev = resolve_device(device)
    model = load_saved_model(ckpt)
    bad = non_finite_parameters(model)
    if bad:
        raise CheckpointError(
            f"{ckpt} holds non-finite weights (NaN/inf in {bad[:3]}); its outputs would be meaningless: use an earlier"
            " checkpoint of the run"
        )
    model = model.to(dev).eval()
    tokenizer = get_tokenizer(str(ckpt)) if (ckpt / "tokenizer.json").is_file() else None
    return ckpt, model, tokenizer, dev
