"""scripts/cli_snapshot.py, the before/after pass over the command line: its masking hides what varies
from run to run (timings, the work folder) and nothing else, so a difference it shows is a real one."""

from __future__ import annotations

from scripts_module import load_script

snapshot = load_script("cli_snapshot")


def test_timing_lines_are_masked_and_results_are_not():
    text = ("- tokens seen: 3,072 at 14,304 tokens/s (0.2 s)\n"
            "validation bits per byte: 2.4545\n"
            "    acc 0.0528 [0.048, 0.058]  steps 800  369 s\n"
            "checkpoint /tmp/w1/run/checkpoints/step_000006")
    out = snapshot.mask(text, "/tmp/w1").split("\n")
    assert out[0] == "- tokens seen: N at N tokens/s (N s)"
    assert out[1] == "validation bits per byte: 2.4545"  # a result: a change in it must show
    assert out[2] == "    acc N [N, N]  steps N  N s"  # a line with a timing is masked whole
    assert out[3] == "checkpoint <W>/run/checkpoints/step_000006"


def test_safetensors_content_ignores_the_header_order(tmp_path):
    import torch
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(4.0), "a": torch.ones(2, 2)}
    save_file(tensors, tmp_path / "x.safetensors", metadata={"format": "pt", "quantization": "int8"})
    save_file(dict(reversed(tensors.items())), tmp_path / "y.safetensors", metadata={"quantization": "int8", "format": "pt"})
    assert snapshot.safetensors_content(tmp_path / "x.safetensors") == snapshot.safetensors_content(tmp_path / "y.safetensors")
    save_file({**tensors, "a": torch.zeros(2, 2)}, tmp_path / "z.safetensors", metadata={"format": "pt"})
    assert snapshot.safetensors_content(tmp_path / "z.safetensors") != snapshot.safetensors_content(tmp_path / "x.safetensors")


def test_every_command_of_the_pass_is_a_known_slmlab_command(tmp_path):
    from slmlab.cli import COMMANDS

    names = {argv[0] for _, argv, _ in snapshot.commands(tmp_path)}
    assert names <= set(COMMANDS), names - set(COMMANDS)
