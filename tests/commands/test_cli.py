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


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_top_level_help_separates_every_name_from_its_summary(name, capsys):
    """Regression: a name as long as the column (``transactions``) ran into its summary
    (``transactionsTransaction ...``); every name is followed by at least two spaces."""
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^  {name}  +\S", out, flags=re.M), out


def test_top_level_help_aligns_a_name_of_any_length(monkeypatch, capsys):
    long_name = "a-command-name-longer-than-any-column"
    monkeypatch.setitem(cli.COMMANDS, long_name, "slmlab.commands.models:models_command")
    assert cli.main(["--help"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ") and line.strip()]
    rows = [line for line in lines if line.split()[0] in cli.COMMANDS]
    assert len(rows) == len(cli.COMMANDS)
    assert re.match(rf"^  {long_name}  +List the model families", next(r for r in rows if long_name in r))
    summaries = {len(r) - len(r.split(maxsplit=1)[1]) for r in rows}
    assert len(summaries) == 1, rows  # one column for every summary


def test_readme_commands_run_as_written_on_a_fresh_clone():
    """Regression: README's bare ``slmlab ...`` lines failed with 'command not found' after the two
    set-up commands (they install into .venv, which nothing activated). The first two commands stay
    as they are, alone in their block; the sentence under them says ``source .venv/bin/activate``, and
    every ``slmlab`` / ``torchrun`` line of a command block comes after it (or names ``.venv/bin/``)."""
    text = README.read_text()
    blocks = [(m.start(), m.group(1).splitlines()) for m in re.finditer(r"```bash\n(.*?)```", text, flags=re.S)]
    first = blocks[0][1]
    assert first[0].startswith("bash scripts/quickstart.sh   # main job:")
    assert first[1].startswith("bash scripts/test.sh         # install, then run the test suite")
    assert len(first) == 2, first  # the README starts with the two set-up commands, nothing else
    activated = blocks[0][0] + text[blocks[0][0]:].index("source .venv/bin/activate")
    for start, lines in blocks:
        for line in lines:
            if re.match(r"(slmlab|torchrun|python) ", line):
                assert start > activated, f"{line!r} comes before `source .venv/bin/activate`"
    assert "`.venv/bin/slmlab`" in text  # the other way, said once
