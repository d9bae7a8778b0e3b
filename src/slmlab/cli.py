"""The ``slmlab`` command line: one table from command to function.

Each function takes ``argv`` (the words after the command), parses them with argparse, and its
docstring is the command's help. ``tests/test_cli.py`` keeps this table and the README in sync.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, str] = {
    "models": "slmlab.cli:models_command",
    "audit": "slmlab.cli:audit_command",
    "train": "slmlab.train.cli:train_command",
    "eval": "slmlab.evaluate.cli:eval_command",
    "generate": "slmlab.train.cli:generate_command",
    "tokenizer": "slmlab.train.cli:tokenizer_command",
}


def _parser(func, argv_prog: str) -> argparse.ArgumentParser:
    doc = (func.__doc__ or "").strip()
    head, _, rest = doc.partition("\n")
    return argparse.ArgumentParser(prog=f"slmlab {argv_prog}", description=head, epilog=rest.strip() or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def _parse_overrides(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def models_command(argv: list[str]) -> int:
    """List the model families and their presets with parameter counts.

    Parameter counts are computed by building each preset (on the meta device, so it is instant).
    """
    import torch

    import slmlab

    p = _parser(models_command, "models")
    p.add_argument("--family", help="only this family")
    args = p.parse_args(argv)
    for name, fam in sorted(slmlab.families().items()):
        if args.family and name != args.family:
            continue
        print(f"{name:<12} {fam.description}")
        for preset in fam.presets or {"(defaults)": {}}:
            cfg = fam.make_config(preset if preset in fam.presets else None)
            with torch.device("meta"):
                model = fam.model_class(cfg)
            n = sum(q.numel() for q in model.parameters())
            print(f"    {preset:<28}{n:>14,} parameters")
    return 0


def audit_command(argv: list[str]) -> int:
    """Print the parameter budget of a model, by the family's own categories.

    MODEL is a family (`lumen`), `family:preset`, a preset name, or a saved model folder.
    Config overrides follow as key=value (e.g. `slmlab audit lumen num_kv_heads=2`).
    """
    from pathlib import Path

    import torch
    from transformers import AutoConfig

    import slmlab
    from slmlab.evaluate.audit import audit_model, format_audit
    from slmlab.models.registry import resolve_model_spec

    p = _parser(audit_command, "audit")
    p.add_argument("model")
    p.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = p.parse_args(argv)
    overrides = _parse_overrides(args.overrides)
    if Path(args.model).is_dir():
        cfg = AutoConfig.from_pretrained(args.model, **overrides)
        fam = slmlab.get_family(cfg.model_type)
    else:
        fam, preset = resolve_model_spec(args.model)
        cfg = fam.make_config(preset, **overrides)
    with torch.device("meta"):
        model = fam.model_class(cfg)
    print(format_audit(audit_model(fam, model), f"Parameter audit: {fam.name} ({type(model).__name__})"))
    return 0


def _resolve(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: slmlab <command> [args]\n\ncommands:")
        for name, target in COMMANDS.items():
            doc = (_resolve(target).__doc__ or "").strip().splitlines()
            print(f"  {name:<12}{doc[0] if doc else ''}")
        print("\n`slmlab <command> --help` for a command's options.")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"slmlab: unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return int(_resolve(COMMANDS[name])(rest) or 0)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"slmlab {name}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
