"""The command line starts fast: ``slmlab --help``, ``--version``, every command's ``--help``,
argument errors and a cached ``slmlab models`` import neither torch nor transformers, while
``import slmlab`` still registers every family with the Auto classes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import torch

import slmlab
from slmlab.bench import family_table as catalogue
from slmlab.cli import COMMANDS, main

# What the console script does (`from slmlab.cli import main` with argv[0] = .../slmlab), then a report
# of the heavy modules that were imported.
PROBE = """
import json, sys
sys.argv = ["slmlab", *json.loads(sys.argv[1])]
from slmlab.cli import main
try:
    rc = main()
except SystemExit as exit:
    rc = exit.code
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)}))
"""


def run_cli(args: list[str], env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["help"], ["no-such-command"]])
def test_top_level_imports_neither_torch_nor_transformers(args):
    report = run_cli(args)
    assert report["heavy"] == [], f"slmlab {' '.join(args)} imported {report['heavy']}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_and_argument_errors_are_light(command):
    """Every command (those added later too) parses its arguments before importing torch."""
    for args in ([command, "--help"], [command, "--no-such-option"]):
        report = run_cli(args)
        assert report["rc"] in (0, 2), report
        assert report["heavy"] == [], f"slmlab {' '.join(args)} imported {report['heavy']}"


def test_python_m_is_light():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "slmlab.cli", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"slmlab {slmlab.__version__}", proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "transformers"}


def test_import_slmlab_still_registers_families():
    code = ("import slmlab\nfrom transformers import AutoConfig, AutoModelForCausalLM\n"
            "config = AutoConfig.for_model('sage_lumen', num_layers=1)\n"
            "print(type(AutoModelForCausalLM.from_config(config)).__name__, sorted(slmlab.families()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "LumenForCausalLM"


@pytest.mark.parametrize("code", [
    # slmlab first: the families register the moment transformers is imported
    "import slmlab, sys\nassert 'transformers' not in sys.modules and 'torch' not in sys.modules\n"
    "from transformers import AutoConfig",
    # transformers first: they register at `import slmlab`
    "from transformers import AutoConfig\nimport slmlab",
    # a transformers submodule first (its package is imported before it)
    "import slmlab\nimport transformers.configuration_utils\nfrom transformers import AutoConfig",
    # a script run under another name, started with -m, or as the console script would be: same rule
    "import sys\nsys.argv = ['slmlab', '--help']\nimport slmlab\nfrom transformers import AutoConfig",
])
def test_registration_does_not_depend_on_how_python_started(code):
    code += "\nprint(AutoConfig.for_model('sage_lumen').model_type, AutoConfig.for_model('slm_lfm2').model_type)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["sage_lumen", "slm_lfm2"]


def test_registration_hook_runs_once_and_leaves():
    code = ("import slmlab, sys\nfinders = [f for f in sys.meta_path if type(f).__name__ == '_AfterImport']\n"
            "import importlib; importlib.reload(slmlab)\n"
            "again = [f for f in sys.meta_path if type(f).__name__ == '_AfterImport']\n"
            "import transformers\nafter = [f for f in sys.meta_path if type(f).__name__ == '_AfterImport']\n"
            "print(len(finders), len(again), len(after), 'lumen' in slmlab.families())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "0", "True"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"slmlab {slmlab.__version__}"
    assert slmlab.__version__ == importlib.metadata.version("slmlab")


def test_models_cache(tmp_path, monkeypatch, capsys):
    """The first call builds the table and caches it; the next answers from the cache without torch;
    a change to the model code (another fingerprint) rebuilds it."""
    monkeypatch.setenv(catalogue.CACHE_ENV, str(tmp_path))
    assert main(["models"]) == 0
    first = capsys.readouterr().out
    assert "lumen-3m" in first and "2,754,816 parameters" in first  # the README's SAGE-Lumen budget
    cached = list(tmp_path.glob("models-*.json"))
    assert len(cached) == 1
    assert json.loads(cached[0].read_text()) == catalogue.family_table()
    assert main(["models", "--family", "sage_lumen"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("lumen ")
    report = run_cli(["models"], env={**os.environ, catalogue.CACHE_ENV: str(tmp_path)})
    assert report == {"rc": 0, "heavy": []}
    monkeypatch.setattr(catalogue, "code_fingerprint", lambda: "other-code")
    assert main(["models"]) == 0
    assert capsys.readouterr().out == first
    assert [p.name for p in tmp_path.glob("models-*.json")] == ["models-other-code.json"]  # the stale table is gone
    with pytest.raises(ValueError, match="unknown model family 'nope'; known: "):
        main(["models", "--family", "nope", "--debug"])


def test_models_cache_damaged_or_unwritable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(catalogue.CACHE_ENV, str(tmp_path))
    catalogue.cache_path().write_text("{not json")
    assert main(["models"]) == 0
    assert "lumen-3m" in capsys.readouterr().out
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(catalogue.CACHE_ENV, str(blocked / "sub"))  # a path under a file: cannot be written
    assert main(["models"]) == 0
    assert "lumen-3m" in capsys.readouterr().out


def test_generate_threads(tmp_path, capsys):
    from slmlab.models.lumen import LumenConfig, LumenForCausalLM

    LumenForCausalLM(LumenConfig(vocab_size=32, hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=32,
                                 max_seq_len=32)).save_pretrained(tmp_path)
    before = torch.get_num_threads()
    try:
        assert main(["generate", str(tmp_path), "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        assert len(capsys.readouterr().out.split()) == 3
        assert main(["generate", str(tmp_path), "--prompt-ids", "1", "--threads", "-1"]) == 2
        assert "--threads must be >= 0" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)
