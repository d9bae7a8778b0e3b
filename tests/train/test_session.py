"""The run session (src/slmlab/train/session.py): one lifecycle for every training entry point. A fresh
run, a resumed one, a refused resume in the house error form, a folder another process holds, SIGTERM
ending with a saved checkpoint and exit 143, and what a command's RunKind row changes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from slmlab import cli
from slmlab.train import Trainer
from slmlab.train.checkpoint import list_checkpoints
from slmlab.train.lock import RunLocked
from slmlab.train.metrics import read_metrics
from slmlab.train.session import TRAIN, RunKind, RunSession, held, start_point
from test_train import make_cfg, tiny_model
from test_train_toydata import ToySource

STRICT = RunKind("demo", "run folder", "--out", fresh_needs_empty=True, announce_fresh=False, torchrun=False,
                 locked="run folder {run_dir} is locked ({lock}, held by pid {pid}); choose another --out")


def trainer_for(run, *items) -> Trainer:
    cfg = make_cfg(run, "max_steps=4", "checkpoint_every=2", *items)
    return Trainer(cfg, tiny_model(), ToySource(), None, run)


@pytest.fixture
def finished(tmp_path):
    """A four-step run with checkpoints at steps 2 and 4, trained inside a session."""
    run = tmp_path / "run"
    with RunSession(run, TRAIN) as session:
        trainer = trainer_for(run)
        session.start(trainer)
        trainer.train()
    return run


@pytest.fixture
def holder(tmp_path):
    """Another live process holding ``tmp_path/run``'s lock."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; from slmlab.train.lock import RunLock;"
                             f" RunLock({str(tmp_path / 'run')!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_fresh_session_holds_the_lock_says_so_and_leaves_no_empty_folder(tmp_path, capsys):
    run = tmp_path / "run"
    with RunSession(run, TRAIN) as session:
        assert session.checkpoint is None and session.main
        assert (run / ".lock").read_text().strip() == str(os.getpid())
        session.start(trainer_for(run))
    assert capsys.readouterr().out == f"slmlab train: no checkpoint in {run / 'checkpoints'}; starting fresh\n"
    assert not run.exists()  # the lock made the folder; a run that wrote nothing leaves nothing


def test_a_resumed_session_continues_the_newest_checkpoint_and_trims_the_metrics(finished, capsys):
    capsys.readouterr()
    (list_checkpoints(finished / "checkpoints")[-1]).rename(finished / "checkpoints" / "gone")  # killed before step 4's
    with RunSession(finished, TRAIN, resume=True, allow_change=("seed",)) as session:
        assert session.checkpoint.name == "step_000002"
        trainer = trainer_for(finished, "seed=7", "max_steps=6")
        session.check_resume(trainer.cfg)
        session.start(trainer)
        assert trainer.state.step == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"slmlab train: resuming from step 2 (checkpoint {session.checkpoint})"
    assert out[1:3] == ["slmlab train: changed on resume: max_steps: 4 -> 6", "slmlab train: changed on resume: seed: 0 -> 7"]
    assert out[3].startswith("slmlab train: dropped ") and out[3].endswith(" metrics.jsonl records past step 2")
    assert max(r["step"] for r in read_metrics(finished / "metrics.jsonl")) == 2
    with RunSession(finished, TRAIN, resume=finished / "checkpoints" / "step_000002") as session:  # a path: that one
        assert session.checkpoint.name == "step_000002"


def test_a_fresh_run_over_checkpoints_and_a_changed_resume_are_refused_in_the_house_form(finished, capsys):
    with pytest.raises(ValueError, match="already holds checkpoints \\(newest: step_000004\\); pass --resume"):
        RunSession(finished, TRAIN).__enter__()
    with RunSession(finished, TRAIN, resume=True) as session, pytest.raises(ValueError) as refused:
        session.check_resume(trainer_for(finished, "seed=7").cfg)
    assert "seed: 0 -> 7" in str(refused.value) and "--allow-change seed" in str(refused.value)
    base = ["max_steps=4", "checkpoint_every=2", "batch_size=4", "eval_every=0", "eval_batches=1", "progress=false",
            "tensorboard=false", "log_every=1", "optim.lr=3e-3"]
    capsys.readouterr()
    assert cli.main(["train", "--out", str(finished), *base]) == 2
    assert capsys.readouterr().err == (f"slmlab train: error: out_dir {finished} already holds checkpoints (newest:"
                                       " step_000004); pass --resume to continue that run, or choose another out_dir\n")
    assert cli.main(["train", "--out", str(finished), "--resume", *base, "seed=7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slmlab train: error: resuming would change what this run computes:") and "seed: 0 -> 7" in err
    assert [p.name for p in list_checkpoints(finished / "checkpoints")] == ["step_000002", "step_000004"]


def test_a_folder_another_process_holds_is_refused_in_the_kinds_words(tmp_path, holder):
    run = tmp_path / "run"
    with pytest.raises(RunLocked, match=f"in use by another slmlab train \\(pid {holder.pid}\\)"):
        RunSession(run, TRAIN).__enter__()
    with pytest.raises(ValueError) as refused:
        RunSession(run, STRICT).__enter__()
    assert str(refused.value) == f"run folder {run} is locked ({run / '.lock'}, held by pid {holder.pid}); choose another --out"


def test_sigterm_ends_the_run_with_its_checkpoint_and_exit_143(tmp_path, capsys):
    run, before = tmp_path / "run", signal.getsignal(signal.SIGTERM)

    def terminate_at_3(step, result):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, mid-run
        return ""

    with RunSession(run, TRAIN) as session:
        assert signal.getsignal(signal.SIGTERM) is not before
        trainer = trainer_for(run, "max_steps=50", "checkpoint_every=0", "eval_every=1", "eval_batches=1")
        trainer.on_evaluation.append(terminate_at_3)
        session.start(trainer)
        trainer.train()
        status = session.exit_status(trainer)
    assert signal.getsignal(signal.SIGTERM) is before  # the session's handler ends with it
    assert status == 143 and trainer.state.stop_reason == "terminated (SIGTERM)"
    assert trainer.state.step == 3 and [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000003"]
    assert capsys.readouterr().err == "slmlab train: terminated (SIGTERM); resume with --resume\n"
    assert TRAIN.exit_status("max_steps reached") == 0 and TRAIN.exit_status("interrupted (Ctrl-C)") == 130


def test_a_kind_row_sets_the_folder_rules_and_the_words(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("an earlier run's file")
    assert start_point(run, False, TRAIN) is None  # train minds only checkpoints
    with pytest.raises(ValueError) as refused:
        start_point(run, False, STRICT)
    assert str(refused.value) == (f"run folder {run} already holds files of an earlier run; pass --resume to continue"
                                  " that run, or choose another --out")
    (run / "notes.txt").unlink()
    with RunSession(run, STRICT) as session:
        session.start(trainer_for(run))  # a fresh run it was not asked to resume: nothing to say
    with RunSession(run, STRICT, resume=True) as session:
        session.start(trainer_for(run))
    assert capsys.readouterr().out == f"slmlab demo: no checkpoint in {run / 'checkpoints'}; starting fresh\n"
    checked = []
    with RunSession(tmp_path / "other", RunKind("x", check=checked.append)):
        assert checked == [tmp_path / "other"]


def test_under_torchrun_only_rank_0_locks(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with RunSession(tmp_path / "run", TRAIN) as session:
        assert not session.main and not (tmp_path / "run" / ".lock").exists()
    with RunSession(tmp_path / "run", STRICT) as session:  # a kind that never runs under torchrun
        assert session.main and (tmp_path / "run" / ".lock").is_file()


def test_held_reuses_an_open_session_and_opens_one_only_when_none_is_given(tmp_path):
    run = tmp_path / "run"
    with RunSession(run, TRAIN) as outer:
        with held(outer, run, TRAIN) as inner:  # a second lock of the same folder would be refused
            assert inner is outer
    with held(None, run, TRAIN) as opened:
        assert opened.run_dir == run and (run / ".lock").is_file()
    assert not run.exists()
