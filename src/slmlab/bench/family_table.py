"""The installed model families and their presets with parameter counts (``slmlab models``), cached.

Counts come from building each preset on the meta device, which needs torch and every family
(seconds to import). So the table is kept in a cache file keyed by a hash of the model code
(``src/slmlab/models``, ``src/slmlab/layers``): reading it imports neither torch nor the families,
and any change to that code recomputes it. This module imports only the standard library at the
top, and lives here (not in ``models/``, whose package imports every family) for that reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE_ENV = "SLMLAB_CACHE_DIR"
DATA_CACHE_ENV = "SLMLAB_CACHE"  # slmlab.data.paths.CACHE_ENV: the data layer's cache, read here without importing it


def models_table(use_cache: bool = True) -> list[dict]:
    """:func:`family_table`, read from the cache when this code's table is there (``use_cache``),
    else built and (``use_cache``) written to it; ``use_cache=False`` neither reads nor writes."""
    table = read_cached_table() if use_cache else None
    if table is None:
        table = family_table()
        if use_cache:
            write_cached_table(table)
    return table


def choose_family(table: list[dict], name: str) -> dict:
    """The row of the family named ``name`` (its short name or its ``model_type``)."""
    for fam in table:
        if name in (fam["name"], fam["model_type"]):
            return fam
    raise ValueError(f"unknown model family {name!r}; known: {sorted(f['name'] for f in table)}")


def family_table() -> list[dict]:
    """Every registered family, sorted by name: ``{name, model_type, description, presets: {preset:
    parameters}}`` (``(defaults)`` for a family without presets). Imports torch and the families."""
    import torch

    from slmlab.models import families

    table = []
    for name, fam in sorted(families().items()):
        counts = {}
        for preset in fam.presets or {"(defaults)": {}}:
            cfg = fam.make_config(preset if preset in fam.presets else None)
            with torch.device("meta"):
                model = fam.model_class(cfg)
            counts[preset] = sum(q.numel() for q in model.parameters())
        table.append({"name": name, "model_type": fam.config_class.model_type, "description": fam.description,
                      "presets": counts})
    return table


def code_fingerprint() -> str:
    """A hash of the slmlab version and every source file that shapes a model (models/, layers/)."""
    from slmlab import __version__

    root = Path(__file__).resolve().parent.parent  # src/slmlab
    digest = hashlib.sha256(__version__.encode())
    for path in sorted([*root.glob("models/**/*.py"), *root.glob("layers/**/*.py")]):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]



def cache_dir() -> Path:
    """``$SLMLAB_CACHE_DIR``, else ``$SLMLAB_CACHE`` (where the data layer caches), else
    ``$XDG_CACHE_HOME/slmlab``, else ``~/.cache/slmlab``."""
    for name in (CACHE_ENV, DATA_CACHE_ENV):
        if os.environ.get(name):
            return Path(os.environ[name])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slmlab"


def cache_path() -> Path:
    """The cache file of this code's table: ``<cache_dir()>/models-<code_fingerprint()>.json``."""
    return cache_dir() / f"models-{code_fingerprint()}.json"


def read_cached_table() -> list[dict] | None:
    """The cached table for this code, or None (absent, unreadable or damaged: it is then rebuilt)."""
    try:
        table = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(table, list) and all(
        isinstance(f, dict) and {"name", "model_type", "description", "presets"} <= set(f) for f in table
    )
    return table if ok else None


def write_cached_table(table: list[dict]) -> None:
    """Write the table atomically and drop the tables of older code; a cache that cannot be written
    (read-only home) is skipped."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
        for old in path.parent.glob("models-*.json"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass
