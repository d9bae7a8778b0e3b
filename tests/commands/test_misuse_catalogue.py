"""The misuse catalogue (issue 46): each mistake a new user made, and its neighbours (the same mistake
through every other command), as one table. Each row is a command line that must be refused with one
line ``slmlab <cmd>: error: <what>; <what to do>`` and exit 2, naming what the row's needles say; the
rows that must instead give the correct result are tests of their own below the table.

The command lines are templates: ``{run}`` a tiny trained run (lumen-tiny, BPE of 300, block 128),
``{q8}`` / ``{q4}`` its ``slmlab quantize`` copies, ``{lora}`` a two-step LoRA fine-tune of it,
``{chat}`` a small chat file, ``{corpus}`` the run's text files, ``{tmp}`` a fresh folder per row."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from slmlab import cli
from tiny_runs import train_tiny_run

pytest.importorskip("peft")

QUIET = "progress=false tensorboard=false batch_size=2 checkpoint_every=0 sample_tokens=0"
TRAIN = f"--data {{corpus}} --out {{tmp}}/o --steps 1 block_size=32 {QUIET}"
FINETUNE = f"--data {{chat}} --out {{tmp}}/o --steps 1 {QUIET}"


@dataclass(frozen=True)
class Case:
    """One misuse: ``argv`` (a template, see the module docstring), the strings its error must hold, and
    ``prepare(world, tmp)``: files to write first (None: nothing)."""

    name: str
    argv: str
    needles: tuple[str, ...]
    prepare: object = None


QUANTIZED = ("quantized copy", "cannot be trained", "float run it was quantized from")
CASES = [
    # 1. training from a quantized folder trained a random model and exited 0
    Case("train --model int8", f"train --model {{q8}} {TRAIN}", ("int8", *QUANTIZED)),
    Case("train --model int4", f"train --model {{q4}} {TRAIN}", ("int4", *QUANTIZED)),
    Case("finetune int8", f"finetune {{q8}} {FINETUNE}", ("int8", *QUANTIZED)),
    Case("finetune int4", f"finetune {{q4}} {FINETUNE}", ("int4", *QUANTIZED)),
    Case("finetune --lora int8", f"finetune {{q8}} --lora r=2 {FINETUNE}", ("int8", *QUANTIZED)),
    Case("finetune --lora int4", f"finetune {{q4}} --lora r=2 {FINETUNE}", ("int4", *QUANTIZED)),
    Case("quantize a quantized folder", "quantize {q8} {tmp}/qq", ("already quantized", "float run")),
    Case("export a quantized folder", "export {q8} --to hf {tmp}/hf", ("quantized copy", "float run")),
    # the --quantize flag on a folder quantized with the other scheme silently kept that scheme
    Case("serve int8 --quantize int4", "serve {q8} --quantize int4", ("--quantize int4", "already int8", "drop --quantize")),
    Case("generate int8 --quantize int4", "generate {q8} --quantize int4 --prompt-ids 5",
         ("--quantize int4", "already int8")),
    Case("eval int4 --quantize int8", "eval {q4} --quantize int8 --data {corpus}", ("--quantize int8", "already int4")),
]


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    """A `serve` row that is not refused fails here instead of serving forever."""
    monkeypatch.setattr("slmlab.commands.serve.run_uvicorn", lambda *a: pytest.fail("serve started instead of refusing"))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from slmlab.data.chat_data import builtin_chat, write_chat_jsonl

    root = tmp_path_factory.mktemp("misuse")
    run = train_tiny_run(root, 128, "User: What is 2 + 2?\nAssistant: 4\n")
    chat = write_chat_jsonl(builtin_chat(30), root / "chat.jsonl")
    assert cli.main(["quantize", str(run), str(root / "q8")]) == 0
    assert cli.main(["quantize", str(run), str(root / "q4"), "--scheme", "int4"]) == 0
    assert cli.main(["finetune", str(run), "--data", str(chat), "--lora", "r=2,alpha=4", "--out", str(root / "lora"),
                     "--steps", "2", *QUIET.split()]) == 0
    return {"run": run, "q8": root / "q8", "q4": root / "q4", "lora": root / "lora", "chat": chat,
            "corpus": root / "corpus"}


def command_line(case: Case, world: dict, tmp: Path) -> list[str]:
    return shlex.split(case.argv.format(**{k: shlex.quote(str(v)) for k, v in world.items()}, tmp=shlex.quote(str(tmp))))


def refused(capsys, argv: list[str], needles) -> str:
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith(f"slmlab {argv[0]}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[-1], err
    return lines[-1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_misuse_is_a_one_line_refusal(case, world, tmp_path, capsys):
    if case.prepare is not None:
        case.prepare(world, tmp_path)
    refused(capsys, command_line(case, world, tmp_path), case.needles)


def test_a_refused_training_run_leaves_no_model_behind(world, tmp_path, capsys):
    """The quantized-folder refusal comes before any training: no checkpoint, no report."""
    refused(capsys, ["finetune", str(world["q8"]), "--data", str(world["chat"]), "--out", str(tmp_path / "o"),
                     *QUIET.split()], QUANTIZED)
    assert not (tmp_path / "o" / "checkpoints").exists() and not (tmp_path / "o" / "report.json").exists()


def test_a_full_finetune_of_a_lora_run_trains_every_parameter(world, tmp_path, capsys):
    """It said 'optimizer got an empty parameter list' (the merged model kept peft's frozen flags)."""
    import torch

    from slmlab.train.saved import load_for_inference

    out = tmp_path / "full"
    assert cli.main(["finetune", str(world["lora"]), "--data", str(world["chat"]), "--out", str(out), "--steps", "1",
                     *QUIET.split()]) == 0
    assert "100.00%" in capsys.readouterr().out
    before = load_for_inference(world["lora"], "cpu").model.state_dict()
    after = load_for_inference(out, "cpu").model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("mlp" in k for k in changed) and any("q_proj" in k for k in changed), changed
