"""What every command shares: a parser built from the command's docstring and the split of positional
words into config files and ``key=value`` overrides. Loading a saved model for inference is
:func:`slmlab.train.saved.load_for_inference`.

Imports of torch/transformers stay inside the functions: ``slmlab --help`` imports every command
module and must not pay for them.
"""

from __future__ import annotations

import argparse


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


def add_quantize_argument(p) -> None:
    """``--quantize int8|int4`` (generate, eval, serve): weight-only quantized linears on the CPU."""
    p.add_argument("--quantize", default=None, choices=["int8", "int4"],
                   help="weight-only int8 (per output channel) or int4 (groups of 32 columns) linear layers (CPU;"
                        " docs/quantize.md); a folder written by `slmlab quantize` is quantized already")
