"""`slmlab train | eval | generate | tokenizer` through the CLI table, on a tiny local corpus."""

from __future__ import annotations

import json

import pytest

from slmlab import cli
from slmlab.train.metrics import read_metrics

OURS = ("train", "eval", "generate", "tokenizer")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    text = "To be, or not to be, that is the question. Ünïcödé ✓ 東京.\n"
    for i in range(3):
        (folder / f"work{i}.txt").write_text(text * (40 + 10 * i), encoding="utf-8")
    return folder


def base_args(corpus, out):
    return ["--model", "lumen:lumen-tiny", "--data", str(corpus), "--out", str(out), "batch_size=2", "block_size=32",
            "vocab_size=300", "eval_batches=1", "eval_every=0", "checkpoint_every=0", "progress=false",
            "tensorboard=false", f"data_cache={out.parent / 'cache'}", "sample_tokens=5", "log_every=1"]


@pytest.mark.parametrize("name", OURS)
def test_commands_are_in_the_table_with_help(name, capsys):
    assert name in cli.COMMANDS
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0 and "slmlab" in capsys.readouterr().out


def test_train_resume_eval_generate(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *base_args(corpus, out), "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "validation bits per byte" in printed and "## Sample" in printed
    # a second fresh run into the same folder is refused; --resume continues it
    assert cli.main(["train", *base_args(corpus, out), "--steps", "4"]) == 2
    assert "--resume" in capsys.readouterr().err
    args = base_args(corpus, out)
    assert cli.main(["train", *args[:6], "--resume", *args[6:], "--steps", "4"]) == 0  # flag between overrides
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert steps == [1, 2, 3, 4]
    report = json.loads((out / "report.json").read_text())
    assert report["steps"] == 4 and report["checkpoint"].endswith("step_000004")
    capsys.readouterr()
    assert cli.main(["eval", str(out), "--json", "--batch-size", "2"]) == 0  # the report's figure: the whole split
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["loss"] == pytest.approx(report["final_eval"]["loss"], rel=1e-5)
    assert result["bits_per_byte"] > 0 and result["ppl"] > 1
    assert cli.main(["generate", str(out), "--prompt", "To be", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("To be")


def test_tokenizer_train_encode_decode_roundtrip(corpus, tmp_path, capsys):
    tok = tmp_path / "tok"
    assert cli.main(["tokenizer", "train", "--data", str(corpus), "--vocab-size", "300", "--out", str(tok)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["vocab_size"] <= 300 and info["eos"]
    text = "naïve 東京 ✓ question"
    assert cli.main(["tokenizer", "encode", str(tok), text]) == 0
    ids = capsys.readouterr().out.split()
    assert cli.main(["tokenizer", "decode", str(tok), *ids]) == 0
    assert capsys.readouterr().out.rstrip("\n") == text
    assert cli.main(["tokenizer", "decode", str(tok), "99999"]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "optim.lr=oops"], "optim.lr"),
        (["train", "no_such_key=1"], "no_such_key"),
        (["train", "notes.txt"], "notes.txt"),
        (["generate", "/nonexistent/run", "--prompt", "x"], "no run or checkpoint"),
        (["eval", "/nonexistent/run"], "no run or checkpoint"),
    ],
)
def test_bad_input_gives_a_clear_error(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_train_log_to_a_pipe_is_plain_lines(corpus, tmp_path):
    """`slmlab train ... > log` (stdout and stderr not terminals): one progress line per log_every
    steps, newline-separated, never a '\\r'."""
    import subprocess
    import sys

    out = tmp_path / "run"
    args = [a for a in base_args(corpus, out) if a not in ("progress=false", "log_every=1")]
    proc = subprocess.run([sys.executable, "-m", "slmlab.cli", "train", *args, "--steps", "6", "log_every=2"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    log = proc.stdout.decode()  # bytes: text mode would turn a '\r' into a newline
    assert proc.returncode == 0, log[-3000:]
    assert "\r" not in log
    progress = [line for line in log.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/6", "4/6", "6/6"]
    assert "validation bits per byte" in log


def test_eval_shows_its_progress_on_stderr(corpus, tmp_path, capsys):
    """Regression: ``slmlab eval`` printed nothing until it finished. Off a terminal it writes plain
    progress lines (batches done / total, tokens/s) on stderr, never a '\\r'; stdout keeps the result."""
    import re

    out = tmp_path / "run"
    assert cli.main(["train", *base_args(corpus, out), "--steps", "1", "sample_tokens=0"]) == 0
    capsys.readouterr()
    assert cli.main(["eval", str(out), "--json", "--batch-size", "2"]) == 0
    cap = capsys.readouterr()
    result = json.loads(cap.out)  # stdout: the one JSON line only
    total = -(-result["examples"] // 2)
    lines = [line for line in cap.err.splitlines() if line.startswith("eval batch ")]
    assert lines and "\r" not in cap.err
    done = [re.match(r"eval batch (\d+)/(\d+)  tok/s [\d,]+  eta \S+$", line) for line in lines]
    assert all(done), lines
    assert {int(m.group(2)) for m in done} == {total} and int(done[-1].group(1)) == total
    assert cli.main(["eval", str(out), "--json", "--batch-size", "2", "--no-progress"]) == 0
    assert "eval batch" not in capsys.readouterr().err


def test_eval_progress_is_a_live_bar_on_a_terminal():
    import io

    from slmlab.train.progress import Progress

    stream = io.StringIO()
    bar = Progress(3, live=True, stream=stream, desc="eval", unit="batch", label="eval batch")
    for i in range(1, 4):
        bar.advance(i, 100, 0.01)
    bar.close()
    text = stream.getvalue()
    assert "\r" in text and "eval" in text and "3/3" in text and "tok_s" in text


def test_the_reports_whole_split_evaluation_shows_progress_too(corpus, tmp_path, capsys):
    """The report's final figure is a pass over the whole validation split (as long as ``slmlab eval``);
    with progress on, it counts its batches like the training steps before it."""
    import re

    out = tmp_path / "run"
    args = [a for a in base_args(corpus, out) if a != "progress=false"]
    assert cli.main(["train", *args, "--steps", "2", "sample_tokens=0"]) == 0
    printed = capsys.readouterr().out
    lines = re.findall(r"^final eval batch (\d+)/(\d+)  tok/s", printed, flags=re.M)
    assert lines and lines[-1][0] == lines[-1][1]
    assert cli.main(["train", *base_args(corpus, tmp_path / "quiet"), "--steps", "2", "sample_tokens=0"]) == 0
    assert "final eval" not in capsys.readouterr().out  # progress=false: none
