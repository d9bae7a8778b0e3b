"""Model families. Each subpackage registers itself in :mod:`slmlab.models.registry` on import."""

import importlib
import pkgutil

from .registry import Family, families, get_family, register_family, resolve_model_spec

for _info in pkgutil.iter_modules(__path__):
    if _info.ispkg:
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Family", "families", "get_family", "register_family", "resolve_model_spec"]
