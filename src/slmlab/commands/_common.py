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


def add_run_arguments(p, resume_help: str, allow_change_help: str) -> None:
    """The run-folder options of the training commands (train, finetune): ``--out``, ``--steps``, ``--resume``
    (``resume_help``), ``--resume-from`` and ``--allow-change`` (``allow_change_help``); :func:`run_overrides`
    turns the first two into overrides."""
    p.add_argument("--out", help="run folder (= out_dir=...)")
    p.add_argument("--steps", type=int, help="optimiser steps (= max_steps=...)")
    p.add_argument("--resume", action="store_true", help=resume_help)
    p.add_argument("--resume-from", metavar="PATH", help="continue from this run or checkpoint folder")
    p.add_argument("--allow-change", metavar="FIELD", action="append", default=[], help=allow_change_help)


def run_overrides(args) -> list[str]:
    """``out_dir=...`` and ``max_steps=...`` for the ``--out`` and ``--steps`` given (:func:`add_run_arguments`)."""
    return [f"{key}={value}" for key, value in (("out_dir", args.out), ("max_steps", args.steps)) if value is not None]


def add_quantize_argument(p) -> None:
    """``--quantize int8|int4`` (generate, eval, serve): weight-only quantized linears on the CPU, one choice
    per row of :data:`slmlab.quant_schemes.SCHEMES`."""
    from ..quant_schemes import SCHEMES

    p.add_argument("--quantize", default=None, choices=list(SCHEMES),
                   help=f"weight-only {' or '.join(row.flag_help for row in SCHEMES.values())} linear layers (CPU;"
                        " docs/quantize.md); a folder written by `slmlab quantize` is quantized already")


def add_max_new_tokens_argument(p, default: int) -> None:
    """``--max-new-tokens`` (alias ``--max-tokens``; generate and chat take both): the longest reply."""
    p.add_argument("--max-new-tokens", "--max-tokens", dest="max_new_tokens", type=int, default=default,
                   metavar="N", help=f"the most new tokens of a reply (default {default}; --max-tokens is the same flag)")


def utf8_text(text: str, what: str) -> str:
    """``text`` when it is valid UTF-8; a command line or a terminal that was not carries the bytes it could
    not decode as surrogates, which no tokenizer takes.

    Raises:
        ValueError: naming ``what``, the first bad byte and what to do.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"character U+{code:04X}"
        raise ValueError(f"{what} is not valid UTF-8 ({byte} at character {err.start}); pass UTF-8 text (check the"
                         " terminal's or the file's encoding)") from None
    return text


def parse_token_ids(text: str, flag: str = "--prompt-ids") -> list[int]:
    """``"5,6, 7"`` -> ``[5, 6, 7]``.

    Raises:
        ValueError: a word that is not a whole number, named with the flag.
    """
    ids = []
    for word in text.replace(" ", "").split(","):
        if not word:
            continue
        try:
            ids.append(int(word))
        except ValueError:
            raise ValueError(f"{flag}: {word!r} is not a token id (a whole number); write comma-separated ids, e.g."
                             f" {flag} 5,6,7") from None
    return ids
