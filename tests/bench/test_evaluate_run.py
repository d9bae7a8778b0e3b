"""The evaluation entries (:mod:`slmlab.bench.evaluate_run`): what ``slmlab eval`` prints is what they
return, value for value; they refuse what the command refuses."""

from __future__ import annotations

import json
import shutil

import pytest

from slmlab import cli
from slmlab.bench.evaluate_run import evaluate_run, evaluate_tasks_run
from slmlab.outputs import dumps_finite
from slmlab.train.checkpoint import list_checkpoints
from tiny_runs import train_tiny_run

BLOCK = 24


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real 2-step `slmlab train` run on a tiny local corpus (block size 24)."""
    return train_tiny_run(tmp_path_factory.mktemp("evaluate-run"), BLOCK, "Shall I compare thee to a summer's day?\n")


def printed_json(capsys, argv: list[str]) -> dict:
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_run_is_what_eval_prints_as_json(run_dir, capsys):
    result = evaluate_run(run_dir, batch_size=2, max_batches=2, device="cpu", progress=False)
    assert capsys.readouterr().out == ""  # the library prints nothing to stdout
    printed = printed_json(capsys, ["eval", str(run_dir), "--json", "--batch-size", "2", "--max-batches", "2",
                                    "--device", "cpu", "--no-progress"])
    assert json.loads(dumps_finite(result)) == printed
    assert list(result)[:3] == ["checkpoint", "data", "split"]
    assert result["checkpoint"] == str(list_checkpoints(run_dir / "checkpoints")[-1])
    assert result["tokens"] == 2 * 2 * (BLOCK - 1)  # two batches of two sequences at the trained context


def test_evaluate_run_takes_the_context_and_quantization_it_is_given(run_dir):
    plain = evaluate_run(run_dir, batch_size=2, max_batches=1, device="cpu", progress=False)
    short = evaluate_run(run_dir, batch_size=2, max_batches=1, block_size=12, device="cpu", progress=False)
    assert short["tokens"] == 2 * (12 - 1) and plain["tokens"] == 2 * (BLOCK - 1)  # predicted positions
    int8 = evaluate_run(run_dir, batch_size=2, max_batches=1, quantize="int8", device="cpu", progress=False)
    assert int8["loss"] != plain["loss"] and int8["loss"] == pytest.approx(plain["loss"], rel=0.05)


def test_evaluate_run_shows_progress_on_stderr_only(run_dir, capsys):
    evaluate_run(run_dir, batch_size=2, max_batches=2, device="cpu")
    out, err = capsys.readouterr()
    assert out == ""
    assert f"slmlab eval: {list_checkpoints(run_dir / 'checkpoints')[-1]} on " in err
    assert f"(validation): 2 batches of 2 sequences of {BLOCK} tokens on cpu" in err
    assert "eval batch 2/2" in err


def test_evaluate_run_without_data_or_tokenizer_is_refused(run_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(run_dir / "checkpoints")[-1], ckpt)
    (ckpt / "run.yaml").unlink()
    with pytest.raises(ValueError, match=f"^{ckpt} has no run.yaml naming its data; pass --data$"):
        evaluate_run(ckpt, device="cpu", progress=False)
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="has no tokenizer.json; evaluation needs the tokenizer"):
        evaluate_run(ckpt, data=str(run_dir.parent / "corpus"), device="cpu", progress=False)


def test_evaluate_tasks_run_is_what_eval_prints_as_json(run_dir, tmp_path, capsys):
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the optional extra `eval`")
    rows = [{"question": "The capital of France is", "choices": ["Paris", "a fish"], "label": 0},
            {"question": "Two plus two equals", "choices": ["four", "seven"], "label": 0}]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "mc.yaml").write_text(
        f"task: slmlab_run_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'items.jsonl'}\n"
        f"  cache_dir: {tmp_path / 'hf'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: choices\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    result = evaluate_tasks_run(run_dir, "slmlab_run_mc", include_path=tmp_path, block_size=16, batch_size=2,
                                device="cpu")
    capsys.readouterr()
    printed = printed_json(capsys, ["eval", str(run_dir), "--tasks", "slmlab_run_mc", "--include-path", str(tmp_path),
                                    "--block-size", "16", "--batch-size", "2", "--device", "cpu", "--json"])
    assert printed == json.loads(dumps_finite({"checkpoint": result["checkpoint"], "context": result["context"],
                                               "results": result["results"], "n-samples": result["n-samples"]},
                                              default=str))
    assert result["context"] == 16 and 0.0 <= result["results"]["slmlab_run_mc"]["acc,none"] <= 1.0
