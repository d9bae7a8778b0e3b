"""The run report tells the truth: loss.png, the size of every validation figure, the environment.

A 5-step run on a tiny local corpus through ``slmlab train``: its folder holds a non-empty
``loss.png`` linked from ``report.md``; the report's bits per byte is measured on the whole
validation split at the end (equal to ``slmlab eval`` on the whole split) while the curves name the
subset they read; ``report.json`` records versions, commit, device, dtype, threads and date.
"""

from __future__ import annotations

import datetime
import json
import re

import pytest
import torch
import transformers

from slmlab import cli
from slmlab.train.metrics import read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    text = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer.\n"
    for i in range(3):
        (folder / f"work{i}.txt").write_text(text * (40 + 10 * i), encoding="utf-8")
    return folder


def args_for(corpus, out, *extra):
    return ["--model", "lumen:lumen-tiny", "--data", str(corpus), "--out", str(out), "batch_size=2", "block_size=32",
            "vocab_size=300", "eval_batches=1", "eval_every=2", "checkpoint_every=0", "progress=false",
            "tensorboard=false", f"data_cache={out.parent / 'cache'}", "sample_tokens=4", "log_every=1", *extra]


@pytest.fixture(scope="module")
def five_steps(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert cli.main(["train", *args_for(corpus, out), "--steps", "5"]) == 0
    return out, json.loads((out / "report.json").read_text())


def test_run_folder_holds_a_loss_plot_linked_from_the_report(five_steps):
    out, report = five_steps
    png = out / "loss.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == PNG_MAGIC
    assert report["plot"] == "loss.png"
    assert "](loss.png)" in (out / "report.md").read_text()


def test_report_json_records_the_environment(five_steps):
    _, report = five_steps
    env = report["environment"]
    assert env["torch"] == torch.__version__ and env["transformers"] == transformers.__version__
    assert env["slmlab"] and env["python"]
    assert env["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", env["git_commit"])
    assert env["device"] == "cpu" and env["dtype"] == "float32" and env["precision"] == "fp32"
    assert env["threads"] == torch.get_num_threads() and env["world_size"] == 1
    assert datetime.datetime.fromisoformat(env["date"]).tzinfo is not None


def test_final_figure_is_the_whole_split_and_the_curves_name_their_subset(five_steps, capsys):
    out, report = five_steps
    final, periodic = report["final_eval"], report["periodic_eval"]
    assert final["scope"] == "whole validation split" and final["measured_at_end"] and final["step"] == 5
    evals = read_metrics(out / "metrics.jsonl", "eval")
    assert [r["step"] for r in evals] == [2, 4, 5]
    assert periodic["scope"] == "first 1 batches of 2 sequences" and periodic["tokens"] == evals[-1]["tokens"]
    assert final["tokens"] > 3 * periodic["tokens"]  # the split is far larger than the subset
    capsys.readouterr()
    assert cli.main(["eval", str(out), "--json", "--batch-size", "3"]) == 0  # slmlab eval: the whole split
    whole = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert whole["tokens"] == final["tokens"]
    assert whole["bits_per_byte"] == pytest.approx(final["bits_per_byte"], rel=1e-5)
    md = (out / "report.md").read_text()
    assert f"validation bits per byte: {final['bits_per_byte']:.4f} (whole validation split, {final['tokens']:,} tokens" in md
    assert f"first 1 batches of 2 sequences, {periodic['tokens']:,} tokens each" in md


def test_whole_split_evaluations_are_not_repeated(corpus, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["train", *args_for(corpus, out, "eval_batches=0", "eval_every=0", "sample_tokens=0"),
                     "--steps", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["final_eval"]["scope"] == report["periodic_eval"]["scope"] == "whole validation split"
    assert not report["final_eval"]["measured_at_end"]
    assert report["final_eval"]["tokens"] == read_metrics(out / "metrics.jsonl", "eval")[-1]["tokens"]


def test_an_interrupted_run_names_the_subset_instead_of_measuring(corpus, tmp_path, monkeypatch):
    from slmlab.train import trainer as trainer_mod

    real = trainer_mod.Trainer.train_step

    def interrupt_at_3(self, stream):
        if self.state.step == 3:
            raise KeyboardInterrupt
        return real(self, stream)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupt_at_3)
    out = tmp_path / "run"
    assert cli.main(["train", *args_for(corpus, out, "sample_tokens=0"), "--steps", "10"]) == 130
    report = json.loads((out / "report.json").read_text())
    final = report["final_eval"]
    assert final["scope"] == "first 1 batches of 2 sequences" and final["step"] == 2 and not final["measured_at_end"]
    assert "(first 1 batches of 2 sequences" in (out / "report.md").read_text()
    assert (out / "loss.png").stat().st_size > 0


def test_training_curves_overlay_runs_for_comparisons(tmp_path):
    from slmlab.plots import training_curves

    def records(scale):
        train = [{"kind": "train", "step": s, "loss": scale * 5 / s, "lr": 1e-3} for s in range(1, 11)]
        return train + [{"kind": "eval", "step": s, "loss": scale * 6 / s, "acc": s / 10} for s in (5, 10)]

    path = training_curves({"a": records(1.0), "b": records(1.5)}, tmp_path / "sub" / "cmp.png", "two runs",
                           final={"a": {"step": 10, "loss": 0.5, "acc": 0.9}})
    assert path.read_bytes()[:8] == PNG_MAGIC
    empty = training_curves({"": []}, tmp_path / "empty.png")  # no records yet: still a figure
    assert empty.stat().st_size > 0


def test_a_run_stopped_by_the_time_cap_is_reported_incomplete(corpus, tmp_path, capsys):
    """A run that ``max_time`` stopped before ``max_steps`` says so in report.json, report.md and on
    stderr: its numbers are not those of the configured run."""
    out = tmp_path / "run"
    assert cli.main(["train", *args_for(corpus, out, "sample_tokens=0", "max_time=1e-9"), "--steps", "5"]) == 0
    capped = "stopped by the max_time safety cap at step 1 of 5; the result is not the configured run"
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 1 and report["stop_reason"] == capped
    assert report["incomplete"] is True
    md = (out / "report.md").read_text()
    assert md.splitlines()[2].startswith("**Incomplete run**") and capped in md
    assert capped in capsys.readouterr().err
    assert cli.main(["train", *args_for(corpus, out, "sample_tokens=0"), "--resume", "--steps", "5"]) == 0  # finishes
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 5 and report["incomplete"] is False and "Incomplete" not in (out / "report.md").read_text()


def test_a_large_validation_split_is_measured_on_a_named_seeded_sample(corpus, tmp_path, capsys):
    """Issue 28: a 1 GB corpus made every run (even max_steps=1) read 35M validation tokens at the end."""
    out = tmp_path / "run"
    assert cli.main(["train", *args_for(corpus, out, "final_eval_tokens=96"), "--steps", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    final = report["final_eval"]
    assert final["measured_at_end"] and final["tokens"] == 3 * 31  # 3 sequences of 32 (the labels shift once)
    assert final["scope"].startswith("validation sample: 3 of ") and "seed 0; final_eval_tokens=96" in final["scope"]
    md = (out / "report.md").read_text()
    assert "validation sample: 3 of" in md
    from slmlab.data import get_source, get_tokenizer
    from slmlab.train.run import final_eval_sample

    source = get_source(str(corpus), get_tokenizer("byte"), 32, cache_dir=tmp_path / "c")
    rows = source.n_eval_rows("validation")
    assert final_eval_sample(source, 0) == (None, "whole validation split")
    assert final_eval_sample(source, rows * 32) == (None, "whole validation split")
    assert final_eval_sample(source, rows * 32 - 1)[0] == rows - 1
    once = [b["input_ids"] for b in source.eval_batches("validation", 2, sample=5)]
    again = [b["input_ids"] for b in source.eval_batches("validation", 2, sample=5)]
    assert [len(b) for b in once] == [2, 2, 1] and all(torch.equal(a, b) for a, b in zip(once, again))
    whole = torch.cat([b["input_ids"] for b in source.eval_batches("validation", 64)])
    picked = torch.cat(once)
    assert all(any(torch.equal(row, w) for w in whole) for row in picked)  # rows of the split, none invented
