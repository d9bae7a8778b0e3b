"""slmlab: build, train, evaluate, compare and serve small language models.

``import slmlab`` registers every family with transformers' ``AutoConfig`` and
``AutoModelForCausalLM``.

The one exception is the ``slmlab`` command itself (the console script, or ``python -m slmlab.cli``):
there the package stays light, so ``slmlab --help``, ``slmlab --version``, ``slmlab models`` and
argument errors do not pay for importing torch and transformers (seconds); each command imports
what it needs once its arguments parse. ``families``, ``get_family`` and ``models`` are module
attributes that import the families on first use either way.
"""

from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"
__all__ = ["families", "get_family", "models", "__version__"]

_LAZY = ("families", "get_family", "models")
_CLI_MODULES = ("slmlab.cli", "slmlab")


def _started_as_command() -> bool:
    """Whether this interpreter was started to run the ``slmlab`` command line (the console script,
    ``python -m slmlab.cli`` or ``python -m slmlab``), read from the command line that started it."""
    if os.path.basename(sys.argv[0] if sys.argv else "").removesuffix(".exe") == "slmlab":
        return True
    words = iter(getattr(sys, "orig_argv", ())[1:])
    for word in words:  # the interpreter's options up to its `-m MODULE` (or `-mMODULE`)
        if word == "-m":
            return next(words, None) in _CLI_MODULES
        if word.startswith("-m"):
            return word[2:] in _CLI_MODULES
        if word in ("-X", "-W", "--check-hash-based-pycs"):
            next(words, None)  # the option's value
        elif word == "-c" or not word.startswith("-"):
            return False
    return False


def __getattr__(name: str):
    if name in _LAZY:
        models = importlib.import_module(f"{__name__}.models")  # (not `from . import`: that asks this hook again)
        return models if name == "models" else getattr(models, name)
    raise AttributeError(f"module 'slmlab' has no attribute {name!r}")


if not _started_as_command():
    importlib.import_module(f"{__name__}.models")  # registers every family with the Auto classes
