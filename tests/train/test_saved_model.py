"""Saved models (:mod:`slmlab.train.saved`): every command resolves and checks a checkpoint once, and
one trained context: ``slmlab train`` records the sequence length a model was trained on with every
checkpoint, :func:`slmlab.train.saved.trained_context` is its one reader (with a fallback for
checkpoints written before the record existed), and eval, export, serve and generate all read it.
Test data is made here, in code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slmlab import cli
from slmlab.train.checkpoint import list_checkpoints
from slmlab.train.saved import load_for_inference, open_checkpoint, trained_context
from tiny_runs import train_tiny_run

BLOCK = 24  # the run's block_size: no default of any family or of the CLI
RECORDED = 20  # a recorded value unlike every fallback, to show a consumer reads the record


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real 2-step `slmlab train` run on a tiny local corpus, block_size=BLOCK."""
    return train_tiny_run(tmp_path_factory.mktemp("context"), BLOCK, "Shall I compare thee to a summer's day?\n")


@pytest.fixture
def ckpt(run_dir, tmp_path):
    """A copy of the run's checkpoint (with run.yaml and the corpus path it names), free to damage."""
    copy = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(run_dir / "checkpoints")[-1], copy)
    return copy


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def test_training_records_its_block_size_with_the_checkpoint(run_dir):
    ckpt = list_checkpoints(run_dir / "checkpoints")[-1]
    assert json.loads((ckpt / "trainer" / "state.json").read_text())["trained_context"] == BLOCK
    assert trained_context(ckpt) == BLOCK
    saved = open_checkpoint(run_dir)  # a run folder resolves to its newest checkpoint, once
    assert (saved.checkpoint, saved.trained_context) == (ckpt, BLOCK)


@pytest.mark.parametrize("damage, expected", [
    # a checkpoint written before the record: the tokenizer's model_max_length, as `slmlab train` set it
    (lambda c: _edit_json(c / "trainer" / "state.json", trained_context=None), BLOCK),
    # ... and with no usable model_max_length either: a text run's block_size in run.yaml
    (lambda c: (_edit_json(c / "trainer" / "state.json", trained_context=None),
                _edit_json(c / "tokenizer_config.json", model_max_length=None)), BLOCK),
    (lambda c: (_edit_json(c / "trainer" / "state.json", trained_context=None),
                _edit_json(c / "tokenizer_config.json", model_max_length=int(1e30))), BLOCK),  # transformers' "no limit"
    # a synthetic task's block_size is not its sequence length: nothing is known
    (lambda c: (_edit_json(c / "trainer" / "state.json", trained_context=None),
                _edit_json(c / "tokenizer_config.json", model_max_length=None),
                (c / "run.yaml").write_text(f"data: mqar:cpu\nblock_size: {BLOCK}\n")), None),
    # a bare saved model: no trainer state, no run.yaml, no length on the tokenizer
    (lambda c: (shutil.rmtree(c / "trainer"), (c / "run.yaml").unlink(),
                _edit_json(c / "tokenizer_config.json", model_max_length=None)), None),
    # the record wins over every fallback
    (lambda c: _edit_json(c / "trainer" / "state.json", trained_context=RECORDED), RECORDED),
], ids=["tokenizer", "run-yaml", "no-limit-placeholder", "synthetic", "bare", "record-first"])
def test_checkpoints_without_the_record_fall_back(ckpt, damage, expected):
    damage(ckpt)
    assert trained_context(ckpt) == expected
    assert open_checkpoint(ckpt).trained_context == expected


# -- every consumer reads the same value -------------------------------------------------------------

def _eval(ckpt, tmp_path, capsys, monkeypatch):
    from slmlab.train import run
    from slmlab.train.saved import inference_context

    blocks, real = [], run.open_data
    def open_data(spec, tokenizer, block, *args, **kwargs):
        blocks.append(block)
        return real(spec, tokenizer, block, *args, **kwargs)

    monkeypatch.setattr(run, "open_data", open_data)
    assert cli.main(["eval", str(ckpt), "--max-batches", "1", "--json"]) == 0
    model = load_for_inference(ckpt, "cpu").model
    assert inference_context(model, RECORDED, requested=16) == 16  # --block-size still overrides (lm-eval tasks)
    assert inference_context(model, RECORDED) == blocks[0]  # the lm-eval window is the same value
    return blocks[0]


def _export_hf(ckpt, tmp_path, capsys, monkeypatch):
    out = tmp_path / "hf"
    assert cli.main(["export", str(ckpt), "--to", "hf", str(out)]) == 0
    assert f"trained context: {RECORDED} tokens" in (out / "README.md").read_text()
    return json.loads((out / "tokenizer_config.json").read_text())["model_max_length"]


def _export_gguf(ckpt, tmp_path, capsys, monkeypatch):
    gguf = pytest.importorskip("gguf", reason='the GGUF export needs the `gguf` package: pip install "slmlab[export]"')
    out = tmp_path / "m.gguf"
    assert cli.main(["export", str(ckpt), "--to", "gguf", str(out)]) == 0
    return int(gguf.GGUFReader(out).fields["llama.context_length"].contents())


def _serve(ckpt, tmp_path, capsys, monkeypatch):
    pytest.importorskip("fastapi", reason="slmlab serve needs the `serve` extra")
    from slmlab.serve.server import build_server

    server = build_server(ckpt, max_batch=1)
    assert f"trained on {server.trained_context})" in server.describe()[0]
    return server.trained_context


def _generate(ckpt, tmp_path, capsys, monkeypatch):
    capsys.readouterr()
    assert cli.main(["generate", str(ckpt), "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--temperature", "0"]) == 0
    assert "context the model was trained on" not in capsys.readouterr().err  # 7 tokens: inside it
    assert cli.main(["generate", str(ckpt), "--prompt-ids", "5,6,7", "--max-new-tokens", "30", "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert "3 prompt + 30 new tokens run past the" in err
    return int(err.split("run past the ")[1].split("-token context")[0])


@pytest.mark.parametrize("consumer", [_eval, _export_hf, _export_gguf, _serve, _generate],
                         ids=["eval", "export-hf", "export-gguf", "serve", "generate"])
def test_every_consumer_reads_the_recorded_trained_context(ckpt, tmp_path, capsys, monkeypatch, consumer):
    _edit_json(ckpt / "trainer" / "state.json", trained_context=RECORDED)  # unlike the tokenizer's and block_size
    assert consumer(ckpt, tmp_path, capsys, monkeypatch) == RECORDED


# -- one resolution per load -------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["export", "{ckpt}", "--to", "hf", "{tmp}/hf"],
    ["export", "{ckpt}", "--to", "gguf", "{tmp}/m.gguf"],
    ["generate", "{ckpt}", "--prompt-ids", "5,6", "--max-new-tokens", "2"],
    ["eval", "{ckpt}", "--max-batches", "1"],
    ["serve"],
], ids=["export-hf", "export-gguf", "generate", "eval", "serve"])
def test_a_command_resolves_its_checkpoint_once(run_dir, tmp_path, monkeypatch, argv):
    from slmlab.train import checkpoint, saved

    calls, real = [], checkpoint.resolve_checkpoint

    def counted(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(checkpoint, "resolve_checkpoint", counted)
    monkeypatch.setattr(saved, "resolve_checkpoint", counted)
    if argv == ["serve"]:
        pytest.importorskip("fastapi", reason="slmlab serve needs the `serve` extra")
        from slmlab.serve.server import build_server

        build_server(run_dir, max_batch=1)
    else:
        if "gguf" in argv:
            pytest.importorskip("gguf", reason='the GGUF export needs the `gguf` package: pip install "slmlab[export]"')
        assert cli.main([a.format(ckpt=run_dir, tmp=tmp_path) for a in argv]) == 0
    assert [Path(c) for c in calls] == [run_dir]  # the run folder, resolved to its newest checkpoint once


class _Positions:
    def __init__(self, limit):
        self.limit = limit

    def max_positions(self):
        return self.limit


@pytest.mark.parametrize("limit, trained, requested, expected", [
    (512, 128, None, 128),    # the trained context first
    (512, 128, 64, 64),       # a request overrides it
    (512, None, None, 512),   # then the position limit
    (None, None, None, 2048),  # a model with neither: the fixed default
    (None, None, 4096, 4096),  # an unbounded model takes any request
    (100, 128, None, 100),    # a trained context past the limit is cut to it
])
def test_one_inference_context_rule(limit, trained, requested, expected):
    from slmlab.train.saved import inference_context

    assert inference_context(_Positions(limit), trained, requested) == expected


def test_a_context_past_the_limit_is_refused_naming_the_option():
    from slmlab.train.saved import inference_context

    with pytest.raises(ValueError, match=r"block_size 600 exceeds the model's 512 positions"):
        inference_context(_Positions(512), 128, 600, "block_size")
