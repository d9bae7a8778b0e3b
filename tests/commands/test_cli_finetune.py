"""`slmlab finetune` end to end: LoRA and merge through the CLI, the readers of an adapter folder, the errors."""

from __future__ import annotations

import json

import pytest
import torch

from slmlab import cli
from slmlab.data.chat_data import builtin_chat, read_chat_jsonl, write_chat_jsonl
from slmlab.train.checkpoint import resolve_checkpoint
from slmlab.train.saved import load_for_inference
from tiny_runs import train_tiny_run

pytest.importorskip("peft")

QUIET = ["progress=false", "tensorboard=false", "batch_size=2", "block_size=128", "checkpoint_every=0"]


@pytest.fixture(scope="module")
def base_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune-cli")
    run = train_tiny_run(root, 128, "User: What is 2 + 2?\nAssistant: 4\n")
    return run, write_chat_jsonl(builtin_chat(30), root / "chat.jsonl")


def test_lora_finetune_merge_and_every_reader(base_and_data, tmp_path, capsys):
    run, data = base_and_data
    out = tmp_path / "lora"
    assert cli.main(["finetune", str(run), "--data", str(data), "--lora", "r=2,alpha=4,targets=q_proj,v_proj", "--out",
                     str(out), "--steps", "2", "--merge", *QUIET]) == 0
    printed = capsys.readouterr().out
    assert "LoRA r=2 alpha=4" in printed and "% )" not in printed and "held-out assistant-token loss" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["finetune"]["method"] == "lora" and report["finetune"]["lora"]["targets"] == ["q_proj", "v_proj"]
    assert 0 < report["finetune"]["trainable_share"] < 0.2 and report["final_eval"]["tokens"] > 0
    assert "## Fine-tune" in (out / "report.md").read_text() and (out / "loss.png").is_file()
    ckpt = resolve_checkpoint(out)
    assert (ckpt / "adapter_model.safetensors").is_file() and (out / "merged" / "model.safetensors").is_file()
    ids = torch.tensor([[5, 80, 81, 82, 10]])
    with torch.no_grad():
        adapter = load_for_inference(out, "cpu").model(input_ids=ids).logits
        merged = load_for_inference(out / "merged", "cpu").model(input_ids=ids).logits
    torch.testing.assert_close(merged, adapter, atol=1e-5, rtol=0)
    # eval, generate and export read the adapter folder unchanged (merged into its base by the one loader)
    text = tmp_path / "text.txt"
    text.write_text("User: What is 2 + 2?\nAssistant: 4\n" * 400)
    assert cli.main(["eval", str(out), "--data", str(text), "--no-progress"]) == 0
    assert cli.main(["generate", str(out), "--prompt", "User: hi\nAssistant:", "--max-new-tokens", "4"]) == 0
    assert cli.main(["export", str(out), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file() and not (tmp_path / "hf" / "adapter_config.json").exists()
    capsys.readouterr()
    assert cli.main(["finetune", str(out), "--data", str(data), "--eval-only", "block_size=128"]) == 0
    line = capsys.readouterr().out
    assert f"assistant-token loss {report['final_eval']['loss']:.4f} nats/token" in line
    # a standalone merge of the adapter run
    assert cli.main(["finetune", str(out), "--merge", "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "model.safetensors").is_file()


def test_full_finetune_and_resume_through_the_cli(base_and_data, tmp_path, capsys):
    run, data = base_and_data
    out = tmp_path / "full"
    args = ["finetune", str(run), "--data", str(data), "--out", str(out), *QUIET]
    assert cli.main([*args, "--steps", "2"]) == 0
    assert cli.main([*args, "--steps", "3", "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resuming from step 2" in printed and "full fine-tune" in printed
    assert json.loads((out / "report.json").read_text())["finetune"]["trainable_share"] == 1.0
    assert (resolve_checkpoint(out) / "model.safetensors").is_file()
    assert cli.main([*args, "--steps", "4", "--resume", "--lora"]) == 2
    assert "change the fine-tune's lora" in capsys.readouterr().err


def test_make_data_writes_the_builtin_set(tmp_path, capsys):
    assert cli.main(["finetune", "--make-data", str(tmp_path / "chat.jsonl")]) == 0
    assert "wrote 4,000 conversations" in capsys.readouterr().out
    assert read_chat_jsonl(tmp_path / "chat.jsonl") == builtin_chat()


@pytest.mark.parametrize(("extra", "message"), [
    (["--lora", "rank=4"], "--lora: unknown key 'rank'"),
    (["--lora", "targets=nope"], "'nope' matches no module"),
    (["block_size=4"], "no train conversation fits block_size=4"),
])
def test_finetune_errors_are_one_line(base_and_data, tmp_path, capsys, extra, message):
    run, data = base_and_data
    assert cli.main(["finetune", str(run), "--data", str(data), "--out", str(tmp_path / "o"), "--steps", "1", *QUIET, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slmlab finetune: error: ") and message in err and "Traceback" not in err


def test_malformed_chat_file_names_file_and_line(base_and_data, tmp_path, capsys):
    run, _ = base_and_data
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert cli.main(["finetune", str(run), "--data", str(bad), "--out", str(tmp_path / "o"), *QUIET]) == 2
    assert f"slmlab finetune: error: {bad}:2: the conversation has no assistant turn" in capsys.readouterr().err
    assert cli.main(["finetune", str(tmp_path / "nothing"), "--data", str(bad)]) == 2
    assert "no saved model at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["finetune", str(run)])  # neither --data nor --merge: an argparse error
