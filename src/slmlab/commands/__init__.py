"""The ``slmlab`` commands: one module per command, each exposing ``<name>_command(argv) -> int``.

A command parses its words with :func:`slmlab.commands._common.command_parser` (its docstring is
its ``--help``) and hands the work to the library (``slmlab.train``, ``slmlab.evaluate``,
``slmlab.generation``, ``slmlab.data``). ``slmlab.cli.COMMANDS`` is the one table from command name
to function; ``tests/commands/test_cli.py`` keeps it and the README in sync.

Adding a command ``foo``: write ``commands/foo.py`` with ``foo_command(argv: list[str]) -> int``
(first docstring line = its one-line summary), add ``"foo": "slmlab.commands.foo:foo_command"`` to
``slmlab.cli.COMMANDS``, a row to the README's command table and to ``docs/cli.md``. Expected
failures raise ``ValueError`` / ``FileNotFoundError`` (the CLI prints ``slmlab foo: error: ...``
and exits 2). Import torch and friends inside the function, after ``parse_args``: ``slmlab --help``,
``slmlab foo --help`` and argument errors then answer without them (``tests/commands/test_cli_startup.py``).
"""
