"""Resume compares the data, not the ``--data`` text: a run records what its data is (a local
path's resolved folder and content fingerprint; a named corpus's or task's spec) in every checkpoint,
and ``--resume`` compares that identity."""

from __future__ import annotations

import json
from pathlib import Path

from slmlab import cli
from slmlab.train.checkpoint import list_checkpoints

LINE = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer.\n"
OTHER = "All the world's a stage, and all the men merely players; they have their exits.\n"


def make_data(root: Path, line: str) -> Path:
    """``root/data/good`` holding three small text files of ``line``."""
    folder = root / "data" / "good"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"w{i}.txt").write_text(line * (30 + 10 * i), encoding="utf-8")
    return folder


def train(capsys, data: str, out: Path, *extra: str) -> tuple[int, str, str]:
    code = cli.main(["train", "--model", "lumen:lumen-tiny", "--data", data, "--out", str(out), "batch_size=2",
                     "block_size=32", "vocab_size=300", "eval_batches=1", "eval_every=0", "checkpoint_every=0",
                     "progress=false", "tensorboard=false", f"data_cache={out.parent / 'cache'}", "sample_tokens=0",
                     *extra])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def first_run(capsys, monkeypatch, tmp_path) -> tuple[Path, Path]:
    """Two steps on ``data/good`` spelt relative to ``tmp_path/a``; returns (data folder, run folder)."""
    data = make_data(tmp_path / "a", LINE)
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a")
    code, _, err = train(capsys, "data/good", out, "--steps", "2")
    assert code == 0, err
    return data, out


def test_same_data_text_in_another_folder_is_refused(capsys, monkeypatch, tmp_path):
    data, out = first_run(capsys, monkeypatch, tmp_path)
    other = make_data(tmp_path / "b", OTHER)
    monkeypatch.chdir(tmp_path / "b")
    code, printed, err = train(capsys, "data/good", out, "--resume", "--steps", "3")
    assert code == 2, printed + err
    assert "resuming would change what this run computes" in err and "data: " in err
    assert str(data.resolve()) in err and str(other.resolve()) in err  # old and new identity named
    assert "--allow-change data" in err


def test_another_spelling_of_the_same_folder_resumes(capsys, monkeypatch, tmp_path):
    data, out = first_run(capsys, monkeypatch, tmp_path)
    code, printed, err = train(capsys, "./data/good/", out, "--resume", "--steps", "3")
    assert code == 0, err
    assert "resuming from step 2 (checkpoint" in printed
    code, printed, err = train(capsys, str(data.resolve()), out, "--resume", "--steps", "4")  # absolute
    assert code == 0, err
    assert "resuming from step 3 (checkpoint" in printed


def test_changed_content_in_the_same_folder_is_refused_unless_allowed(capsys, monkeypatch, tmp_path):
    data, out = first_run(capsys, monkeypatch, tmp_path)
    with (data / "w1.txt").open("a", encoding="utf-8") as f:
        f.write(OTHER * 5)
    code, printed, err = train(capsys, "data/good", out, "--resume", "--steps", "3")
    assert code == 2, printed + err
    saved = json.loads((list_checkpoints(out / "checkpoints")[-1] / "data_identity.json").read_text())
    assert saved["kind"] == "local" and saved["path"] == str(data.resolve()) and saved["fingerprint"]
    assert "data: " in err and saved["fingerprint"] in err and "--allow-change data" in err
    code, printed, err = train(capsys, "data/good", out, "--resume", "--steps", "3", "--allow-change", "data")
    assert code == 0, err
    assert "changed on resume: data: " in printed and saved["fingerprint"] in printed
    newer = json.loads((list_checkpoints(out / "checkpoints")[-1] / "data_identity.json").read_text())
    assert newer["path"] == saved["path"] and newer["fingerprint"] != saved["fingerprint"]


def test_a_checkpoint_without_a_data_identity_resumes_by_the_data_text(capsys, monkeypatch, tmp_path):
    data, out = first_run(capsys, monkeypatch, tmp_path)
    ckpt = list_checkpoints(out / "checkpoints")[-1]
    (ckpt / "data_identity.json").unlink(missing_ok=True)  # as written before identities were recorded
    code, printed, err = train(capsys, "./data/good/", out, "--resume", "--steps", "3")
    assert code == 2 and "data: 'data/good' -> './data/good/'" in err  # today's comparison: the text
    code, printed, err = train(capsys, "data/good", out, "--resume", "--steps", "3")
    assert code == 0, err
    assert "resuming from step 2 (checkpoint" in printed
    assert (list_checkpoints(out / "checkpoints")[-1] / "data_identity.json").is_file()  # recorded from now on
