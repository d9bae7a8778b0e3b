"""The CLI table, its help, the README, and the audit/models commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slmlab import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_command_is_documented_in_the_readme_and_vice_versa():
    text = README.read_text()
    documented = set(re.findall(r"^\| `slmlab (\w+)", text, flags=re.M))
    assert documented == set(cli.COMMANDS), f"README documents {sorted(documented)}, CLI has {sorted(cli.COMMANDS)}"


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip()


def test_audit_lumen_prints_the_true_budget(capsys):
    assert cli.main(["audit", "lumen"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Total\s+2,754,816", out)
    assert re.search(r"Unique \(without embedding table\)\s+2,230,528", out)


def test_audit_with_overrides_and_unknown_model(capsys):
    assert cli.main(["audit", "lumen", "num_kv_heads=4"]) == 0
    assert "Total" in capsys.readouterr().out
    assert cli.main(["audit", "no-such-model"]) == 2
    assert "neither a family nor a unique preset" in capsys.readouterr().err


def test_models_lists_lumen(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "lumen" in out and "2,754,816" in out


def test_unknown_command_and_top_level_help(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert cli.main([]) == 0
    assert "audit" in capsys.readouterr().out


def test_a_bare_word_among_overrides_is_an_actionable_error(capsys):
    assert cli.main(["audit", "lumen", "word"]) == 2
    err = capsys.readouterr().err
    assert "slmlab audit: error: expected key=value, got 'word'; write each override as key=value" in err
