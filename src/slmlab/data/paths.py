"""Where slmlab keeps downloaded corpora, token caches and trained tokenizers."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SLMLAB_CACHE"


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$SLMLAB_CACHE``, else ``~/.cache/slmlab`` (created on demand)."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "slmlab"
    path = Path(cache_dir).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
