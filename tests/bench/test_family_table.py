"""The families table behind ``slmlab models`` (:mod:`slmlab.bench.family_table`): built, cached,
read back, and printed by the command row for row."""

from __future__ import annotations

import pytest

from slmlab import cli
from slmlab.bench import family_table as catalogue


def test_models_table_builds_caches_and_reads_back(tmp_path, monkeypatch):
    monkeypatch.setenv(catalogue.CACHE_ENV, str(tmp_path))
    built = catalogue.models_table(use_cache=False)
    assert not list(tmp_path.iterdir())  # use_cache=False neither reads nor writes
    assert built == catalogue.family_table() and built == sorted(built, key=lambda f: f["name"])
    assert catalogue.models_table() == built and catalogue.cache_path().is_file()
    monkeypatch.setattr(catalogue, "family_table", lambda: pytest.fail("rebuilt despite the cache"))
    assert catalogue.models_table() == built


def test_choose_family_by_name_or_model_type():
    table = [{"name": "lumen", "model_type": "sage_lumen", "description": "", "presets": {}}]
    assert catalogue.choose_family(table, "lumen") is table[0]
    assert catalogue.choose_family(table, "sage_lumen") is table[0]
    with pytest.raises(ValueError, match=r"^unknown model family 'nope'; known: \['lumen'\]$"):
        catalogue.choose_family(table, "nope")


def test_models_command_prints_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(catalogue.CACHE_ENV, str(tmp_path))
    table = catalogue.models_table()
    assert cli.main(["models"]) == 0
    expected = []
    for fam in table:
        expected.append(f"{fam['name']:<12} {fam['description']}")
        expected += [f"    {preset:<28}{n:>14,} parameters" for preset, n in fam["presets"].items()]
    assert capsys.readouterr().out == "\n".join(expected) + "\n"
