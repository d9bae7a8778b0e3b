"""The test suite never writes into the user's cache: ``tests/conftest.py`` points every cache
location slmlab reads (``$SLMLAB_CACHE`` for data, tokenizers and token caches; ``$SLMLAB_CACHE_DIR``
and ``$XDG_CACHE_HOME`` for the ``slmlab models`` table) at one temporary folder per session, for
this process and for every subprocess a test starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slmlab.bench import family_table as catalogue
from slmlab.data.paths import CACHE_ENV, resolve_cache_dir

CACHE_VARIABLES = (CACHE_ENV, catalogue.CACHE_ENV, "XDG_CACHE_HOME")


def _inside(path: Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def test_every_cache_variable_points_at_the_session_folder(tmp_path_factory):
    session_cache = tmp_path_factory.getbasetemp()
    for name in CACHE_VARIABLES:
        assert name in os.environ, f"tests/conftest.py leaves ${name} unset: a test would write under ~/.cache"
        assert _inside(os.environ[name], session_cache), f"${name}={os.environ[name]} is outside {session_cache}"
    home_cache = Path.home() / ".cache"
    assert not _inside(session_cache, home_cache)
    assert _inside(resolve_cache_dir(), session_cache)  # corpora, token caches, tokenizers
    assert _inside(catalogue.cache_path(), session_cache)  # the `slmlab models` table


def test_subprocesses_inherit_the_session_cache(tmp_path_factory):
    session_cache = tmp_path_factory.getbasetemp()
    code = ("import json; from slmlab.data.paths import resolve_cache_dir; from slmlab.bench.family_table import cache_path;"
            " print(json.dumps([str(resolve_cache_dir()), str(cache_path())]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    for path in json.loads(out.strip().splitlines()[-1]):
        assert _inside(path, session_cache), f"a subprocess resolves its cache to {path}, outside {session_cache}"


def test_models_table_follows_the_data_cache_variable(tmp_path, monkeypatch):
    """``$SLMLAB_CACHE`` (the variable the data layer documents) also moves the ``slmlab models``
    table; ``$SLMLAB_CACHE_DIR`` still wins; then ``$XDG_CACHE_HOME/slmlab``."""
    monkeypatch.delenv(catalogue.CACHE_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "data-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert catalogue.cache_dir() == tmp_path / "data-cache"
    monkeypatch.setenv(catalogue.CACHE_ENV, str(tmp_path / "models-cache"))
    assert catalogue.cache_dir() == tmp_path / "models-cache"
    monkeypatch.delenv(catalogue.CACHE_ENV)
    monkeypatch.delenv(CACHE_ENV)
    assert catalogue.cache_dir() == tmp_path / "xdg" / "slmlab"
