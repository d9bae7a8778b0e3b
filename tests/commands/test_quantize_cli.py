"""``slmlab quantize`` and the ``--quantize int8`` flag of generate / eval: an int8 folder written from a
real run loads everywhere a run loads, decodes the same tokens as quantizing on the fly, and the
refusals say what to do."""

from __future__ import annotations

import json

import pytest

from slmlab import cli
from tiny_runs import train_tiny_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("quantize"), 32, "to be or not to be, that is the question. ")


@pytest.fixture(scope="module")
def int8_folder(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8") / "run-int8"
    assert cli.main(["quantize", str(run), str(out)]) == 0
    return out


def generated(capsys, *args) -> str:
    capsys.readouterr()
    assert cli.main(["generate", *args, "--prompt-ids", "5,6,7", "--max-new-tokens", "12", "--temperature", "0"]) == 0
    return capsys.readouterr().out.strip()


def test_quantize_writes_a_folder_that_records_its_int8_modules(int8_folder):
    config = json.loads((int8_folder / "config.json").read_text())
    record = config["quantization_config"]
    assert record["quant_method"] == "slmlab_int8" and "lm_head" in record["modules"]
    assert all((int8_folder / name).is_file() for name in ("model.safetensors", "tokenizer.json", "run.yaml"))


def test_the_int8_folder_decodes_like_quantizing_on_the_fly(run, int8_folder, capsys):
    saved = generated(capsys, str(int8_folder))
    on_the_fly = generated(capsys, str(run), "--quantize", "int8")
    assert saved == on_the_fly and len(saved.split()) == 12


def test_eval_with_int8_stays_within_a_percent_of_float32(run, int8_folder, capsys):
    def loss(*args) -> float:
        capsys.readouterr()
        assert cli.main(["eval", *args, "--max-batches", "2", "--json", "--no-progress"]) == 0
        return json.loads(capsys.readouterr().out)["loss"]

    fp32, flag, folder = loss(str(run)), loss(str(run), "--quantize", "int8"), loss(str(int8_folder))
    assert flag == folder  # the same int8 model either way
    assert flag != fp32 and abs(flag - fp32) / fp32 < 0.01


def test_refusals_name_what_to_do(run, int8_folder, tmp_path, capsys):
    assert cli.main(["quantize", str(run), str(int8_folder)]) == 2
    assert "exists and is not an empty folder (its files would be replaced" in capsys.readouterr().err
    assert cli.main(["quantize", str(int8_folder), str(tmp_path / "again")]) == 2
    assert "is already quantized; quantize the float run it came from" in capsys.readouterr().err
    assert cli.main(["export", str(int8_folder), "--to", "hf", str(tmp_path / "hf")]) == 2
    assert "is a quantized copy (`slmlab quantize`); export the float run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", str(run), "--quantize", "int2"])
    assert exc.value.code == 2 and "invalid choice: 'int2'" in capsys.readouterr().err
    assert cli.main(["quantize", str(run), str(tmp_path / "x"), "--scheme", "int2"]) == 2
    assert "unknown --scheme 'int2'; choose one of: int8, int4" in capsys.readouterr().err


def test_an_int4_folder_decodes_like_quantizing_on_the_fly_and_costs_more_loss_than_int8(run, int8_folder,
                                                                                         tmp_path, capsys):
    out = tmp_path / "run-int4"
    assert cli.main(["quantize", str(run), str(out), "--scheme", "int4"]) == 0
    assert "int4 linear layers" in capsys.readouterr().out
    record = json.loads((out / "config.json").read_text())["quantization_config"]
    assert record["quant_method"] == "slmlab_int4" and record["bits"] == 4 and record["group_size"] == 32
    assert generated(capsys, str(out)) == generated(capsys, str(run), "--quantize", "int4")

    def loss(*args) -> float:
        capsys.readouterr()
        assert cli.main(["eval", *args, "--max-batches", "2", "--json", "--no-progress"]) == 0
        return json.loads(capsys.readouterr().out)["loss"]

    fp32, int8, int4 = loss(str(run)), loss(str(int8_folder)), loss(str(out))
    assert int4 == loss(str(run), "--quantize", "int4")
    assert abs(int8 - fp32) < abs(int4 - fp32) < 0.1 * fp32
