"""The ``slmlab`` command line: one table from command to function.

Each function lives in its own module of :mod:`slmlab.commands`, takes ``argv`` (the words after
the command), parses them with argparse, and its docstring is the command's help. Expected failures
(``ValueError``, ``TypeError``, ``FileNotFoundError``) print ``slmlab <command>: error: ...`` and
exit with status 2. ``tests/test_cli.py`` keeps this table and the README in sync.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, str] = {
    "models": "slmlab.commands.models:models_command",
    "audit": "slmlab.commands.audit:audit_command",
    "train": "slmlab.commands.train:train_command",
    "eval": "slmlab.commands.eval:eval_command",
    "generate": "slmlab.commands.generate:generate_command",
    "tokenizer": "slmlab.commands.tokenizer:tokenizer_command",
}


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
