"""slmlab: build, train, evaluate, compare and serve small language models.

``import slmlab`` registers every family with transformers' ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM``: at once when transformers is already imported, otherwise the moment it is
(the families' classes are transformers classes, so nobody can ask an Auto class for them earlier).
The package itself therefore stays light whoever imports it and however Python was started:
``slmlab --help``, ``--version`` and argument errors never pay for torch and transformers (seconds),
and each command imports what it needs once its arguments parse. ``families``, ``get_family`` and
``models`` are module attributes that import the families on first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

__version__ = "0.1.0"
__all__ = ["families", "get_family", "models", "__version__"]

_LAZY = ("families", "get_family", "models")


def __getattr__(name: str):
    if name in _LAZY:
        models = importlib.import_module(f"{__name__}.models")  # (not `from . import`: that asks this hook again)
        return models if name == "models" else getattr(models, name)
    raise AttributeError(f"module 'slmlab' has no attribute {name!r}")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` right after the module ``name`` has been executed by its own loader, once: the
    finder takes itself off ``sys.meta_path``, asks the other finders for the module's spec and wraps
    that spec's loader."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__spec__.loader = module.__loader__ = self.loader  # (reloads go to the real loader)
        self.then()


def _register_families() -> None:
    importlib.import_module(f"{__name__}.models")  # each family registers itself with the Auto classes


if "transformers" in sys.modules:
    _register_families()
elif not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path):  # (once, even after a reload)
    sys.meta_path.insert(0, _AfterImport("transformers", _register_families))
