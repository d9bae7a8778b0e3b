"""The ``slmlab`` command line: one table from command to function.

Each function lives in its own module of :mod:`slmlab.commands`, takes ``argv`` (the words after
the command), parses them with argparse, and its docstring is the command's help. The table holds
module paths, imported only when needed, and a command module imports torch and friends only after
its arguments parse: ``slmlab --help``, ``--version`` and argument errors never load them
(``tests/commands/test_cli_startup.py``). :func:`main` is the one error boundary
(:mod:`slmlab.commands.errors`): an expected failure prints ``slmlab <command>: error: ...`` and
exits 2, Ctrl-C exits 130; ``--debug`` or ``SLMLAB_DEBUG=1`` shows tracebacks.
``tests/commands/test_cli.py`` keeps this table and the README in sync.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, str] = {
    "models": "slmlab.commands.models:models_command",
    "audit": "slmlab.commands.audit:audit_command",
    "train": "slmlab.commands.train:train_command",
    "finetune": "slmlab.commands.finetune:finetune_command",
    "eval": "slmlab.commands.eval:eval_command",
    "generate": "slmlab.commands.generate:generate_command",
    "chat": "slmlab.commands.chat:chat_command",
    "tokenizer": "slmlab.commands.tokenizer:tokenizer_command",
    "transactions": "slmlab.commands.transactions:transactions_command",
    "bench": "slmlab.commands.bench:bench_command",
    "compare": "slmlab.commands.compare:compare_command",
    "export": "slmlab.commands.export:export_command",
    "quantize": "slmlab.commands.quantize:quantize_command",
    "serve": "slmlab.commands.serve:serve_command",
}


def _resolve(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str] | None = None) -> int:
    from .commands.errors import DEBUG_ENV, EXIT_INTERNAL, EXIT_USAGE, debug_requested, expected_error_message

    debug, argv = debug_requested(list(sys.argv[1:] if argv is None else argv))
    if argv and argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"slmlab {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: slmlab <command> [args]\n\ncommands:")
        width = max(len(name) for name in COMMANDS) + 2  # every name, however long, then two spaces or more
        for name, target in COMMANDS.items():
            doc = (_resolve(target).__doc__ or "").strip().splitlines()
            print(f"  {name:<{width}}{doc[0] if doc else ''}".rstrip())
        print("\n`slmlab <command> --help` for a command's options; --debug (or SLMLAB_DEBUG=1) shows tracebacks;"
              " --version prints the version.")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"slmlab: unknown command {name!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return int(_resolve(COMMANDS[name])(rest) or 0)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM during `slmlab train` (slmlab.train.signals)
        if debug:
            raise
        from .train.signals import exit_status

        reason = getattr(err, "stop_reason", "interrupted (Ctrl-C)")
        print(f"slmlab {name}: {reason}", file=sys.stderr)
        return exit_status(reason)
    except Exception as err:
        if debug:
            raise
        message = expected_error_message(err)
        if message is None:  # a bug: say so, and how to see where
            print(f"slmlab {name}: internal error: {type(err).__name__}: {err}; rerun with --debug (or"
                  f" {DEBUG_ENV}=1) for the traceback and report it", file=sys.stderr)
            return EXIT_INTERNAL
        print(f"slmlab {name}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
