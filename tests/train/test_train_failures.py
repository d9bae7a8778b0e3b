"""Nothing lost, nothing silent: run lock, finite checkpoints, tokenizer provenance, what resume
compares, SIGTERM, and the crash-safety of checkpoint writes (issue 12)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from slmlab import cli
from slmlab.train import Trainer, TrainingDiverged
from slmlab.train import checkpoint as ckpt_mod
from slmlab.train.checkpoint import NonFiniteWeights, list_checkpoints, save_checkpoint
from slmlab.train.lock import RunLock
from slmlab.train.metrics import read_metrics
from slmlab.train.optim import build_optimizer
from test_train import make_cfg, tiny_model
from test_train_toydata import ToySource

TEXT = "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer.\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for i in range(3):
        (folder / f"work{i}.txt").write_text(TEXT * (30 + 10 * i), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def other_corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("other")
    for i in range(3):
        (folder / f"doc{i}.txt").write_text("All the world's a stage, and all the men merely players.\n" * 40, encoding="utf-8")
    return folder


def args_for(corpus, out, *extra):
    return ["--model", "lumen:lumen-tiny", "--data", str(corpus), "--out", str(out), "batch_size=2", "block_size=32",
            "vocab_size=300", "eval_batches=1", "eval_every=0", "checkpoint_every=0", "progress=false",
            "tensorboard=false", f"data_cache={Path(out).parent / 'cache'}", "sample_tokens=0", "log_every=1", *extra]


def train(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["train", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


# -- 1. one run, one folder --------------------------------------------------------------------------
def test_a_second_run_on_a_held_folder_exits_2_naming_the_holder(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    with RunLock(out):
        code, _, err = train(capsys, *args_for(corpus, out), "--steps", "1")
    assert code == 2
    assert f"in use by another slmlab train (pid {os.getpid()})" in err
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
    code, _, _ = train(capsys, *args_for(corpus, out), "--steps", "1")  # released: the folder is free again
    assert code == 0


def test_the_lock_dies_with_its_process(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from slmlab.train.lock import RunLock;"
                               f" RunLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ValueError, match=f"pid {holder.pid}"):
        RunLock(tmp_path).acquire()
    holder.kill()
    holder.wait()
    RunLock(tmp_path).acquire().release()


def test_the_holder_may_enter_its_lock_again_and_the_last_release_frees_it(tmp_path):
    lock = RunLock(tmp_path / "run").acquire()
    with lock:  # re-entry by the holder: no refusal of its own process
        with lock:
            pass
        with pytest.raises(ValueError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path / "run").acquire()  # another instance is still refused while any hold remains
    with pytest.raises(ValueError, match="in use"):
        RunLock(tmp_path / "run").acquire()  # the first acquire still holds it
    lock.release()
    RunLock(tmp_path / "run").acquire().release()  # the last release frees the folder
    lock.release()  # a release with nothing held does nothing


# -- 2. a checkpoint never holds non-finite weights --------------------------------------------------
def test_a_non_finite_gradient_norm_stops_before_the_update(tmp_path):
    model = tiny_model()
    calls = {"n": 0}

    def poison(grad):
        calls["n"] += 1
        return grad * float("nan") if calls["n"] == 3 else grad

    model.get_input_embeddings().weight.register_hook(poison)  # finite loss, NaN gradient at step 3
    trainer = Trainer(make_cfg(tmp_path, "max_steps=6", "checkpoint_every=1", "keep_checkpoints=0"), model, ToySource(),
                      None, tmp_path)
    with pytest.raises(TrainingDiverged, match=r"gradient norm became nan at step 3.*step_000002"):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    for ckpt in list_checkpoints(tmp_path / "checkpoints"):
        assert all(torch.isfinite(t).all() for t in load_file(ckpt / "model.safetensors").values())


def test_no_clipping_still_checks_the_gradient_norm(tmp_path):
    model = tiny_model()
    model.get_input_embeddings().weight.register_hook(lambda g: g * float("inf"))
    trainer = Trainer(make_cfg(tmp_path, "max_steps=3", "optim.grad_clip=0"), model, ToySource(), None, tmp_path)
    with pytest.raises(TrainingDiverged, match="gradient norm became"):
        trainer.train()


def test_non_finite_weights_are_never_saved(tmp_path):
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights, match="NaN/inf"):
        save_checkpoint(tmp_path, 1, model, None, build_optimizer(model, make_cfg(tmp_path).optim), {}, {})
    assert not list(tmp_path.iterdir())


def test_huge_learning_rate_exits_1_and_every_checkpoint_is_finite(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = train(capsys, *args_for(corpus, out, "optim.lr=1e4", "checkpoint_every=1", "keep_checkpoints=0"),
                         "--steps", "8")
    assert code == 1, err
    assert "became" in err and "Last good checkpoint" in err
    for ckpt in list_checkpoints(out / "checkpoints"):
        assert all(torch.isfinite(t).all() for t in load_file(ckpt / "model.safetensors").values()), ckpt


def _poison_weights(ckpt: Path) -> None:
    state = load_file(ckpt / "model.safetensors")
    name = next(iter(state))
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


def test_eval_and_generate_refuse_non_finite_weights(trained_run, tmp_path, capsys):
    import shutil

    ckpt = tmp_path / "bad"
    shutil.copytree(list_checkpoints(trained_run / "checkpoints")[-1], ckpt)
    _poison_weights(ckpt)
    for argv in (["eval", str(ckpt), "--max-batches", "1"], ["generate", str(ckpt), "--prompt", "To"]):
        assert cli.main(argv) == 2
        assert "non-finite weights" in capsys.readouterr().err


@pytest.fixture(scope="module")
def trained_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    assert cli.main(["train", *args_for(corpus, out, "model_config.max_seq_len=32"), "--steps", "2"]) == 0
    return out


# -- 3. tokenizer provenance ------------------------------------------------------------------------
def test_fine_tuning_reuses_the_checkpoints_tokenizer(trained_run, corpus, tmp_path, capsys):
    ckpt = list_checkpoints(trained_run / "checkpoints")[-1]
    out = tmp_path / "ft"
    argv = [a for a in args_for(corpus, out) if not a.startswith("vocab_size")]
    argv[argv.index("--model") + 1] = str(ckpt)
    code, _, err = train(capsys, *argv, "vocab_size=512", "--steps", "1")
    assert code == 2 and "vocab_size=512 conflicts with the tokenizer" in err and "drop vocab_size=" in err
    code, _, err = train(capsys, *argv, "tokenizer=byte", "--steps", "1")
    assert code == 2 and "tokenizer='byte' conflicts" in err
    code, _, err = train(capsys, *argv, "--steps", "1")
    assert code == 0, err
    mine = (list_checkpoints(out / "checkpoints")[-1] / "tokenizer.json").read_text()
    assert mine == (ckpt / "tokenizer.json").read_text()


def test_a_failed_run_leaves_no_tokenizer_for_a_later_run(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = train(capsys, *args_for(corpus, out, "model_config.num_layers=0"), "--steps", "1")
    assert code == 2, err
    assert not (out / "tokenizer").exists()
    code, _, err = train(capsys, *args_for(corpus, out, "vocab_size=280"), "--steps", "1")
    assert code == 0, err
    tok = json.loads((list_checkpoints(out / "checkpoints")[-1] / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) <= 280 + 3


def test_a_half_written_tokenizer_names_the_file_and_the_fix(trained_run, tmp_path, capsys):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(trained_run / "checkpoints")[-1], ckpt)
    path = ckpt / "tokenizer.json"
    path.write_text(path.read_text()[:0])
    assert cli.main(["generate", str(ckpt), "--prompt", "To"]) == 2  # checked before anything is loaded
    err = capsys.readouterr().err
    assert f"{path} is corrupt" in err and "half-written" in err and "Traceback" not in err
    assert cli.main(["tokenizer", "encode", str(ckpt), "To be"]) == 2
    err = capsys.readouterr().err
    assert f"{path} is not a valid tokenizer file" in err and "half-written" in err


# -- 4. resume means the same run -------------------------------------------------------------------
def test_resume_refuses_protected_changes_with_a_diff_and_logs_harmless_ones(corpus, other_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code, printed, _ = train(capsys, *args_for(corpus, out), "--steps", "2")
    assert code == 0 and f"no checkpoint in {out / 'checkpoints'}; starting fresh" in printed
    for change, field in ((["--data", str(other_corpus)], "data"), (["seed=7"], "seed"), (["block_size=16"], "block_size"),
                          (["vocab_size=400"], "vocab_size"), (["tokenizer=byte"], "tokenizer")):
        code, _, err = train(capsys, *args_for(corpus, out), *change, "--resume", "--steps", "3")
        assert code == 2 and "resuming would change what this run computes" in err and f"{field}: " in err, err
        assert f"--allow-change {field}" in err
    code, printed, err = train(capsys, *args_for(corpus, out), "seed=7", "--allow-change", "seed", "--resume", "--steps", "3")
    assert code == 0, err
    assert "resuming from step 2 (checkpoint" in printed and "step_000002" in printed
    assert "changed on resume: max_steps: 2 -> 3" in printed and "changed on resume: seed: 0 -> 7" in printed


def test_resume_trims_metrics_to_the_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, *args_for(corpus, out, "checkpoint_every=2", "keep_checkpoints=0"), "--steps", "4")[0] == 0
    import shutil

    shutil.rmtree(out / "checkpoints" / "step_000004")  # as if killed after logging step 4, before its checkpoint
    code, printed, err = train(capsys, *args_for(corpus, out, "checkpoint_every=2", "keep_checkpoints=0"), "--resume",
                               "--steps", "4")
    assert code == 0, err
    assert "resuming from step 2" in printed
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2, 3, 4]


# -- 7. SIGTERM is Ctrl-C ---------------------------------------------------------------------------
def test_sigterm_saves_a_checkpoint_writes_the_report_and_exits_143(corpus, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "slmlab.cli", "train", *args_for(corpus, out), "--steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["stop_reason"] == "terminated (SIGTERM)" and report["steps"] >= 3
    assert list_checkpoints(out / "checkpoints")[-1].name == f"step_{report['steps']:06d}"


def test_ctrl_c_exits_130_after_saving(corpus, tmp_path, capsys, monkeypatch):
    from slmlab.train import trainer as trainer_mod

    real = trainer_mod.Trainer.train_step

    def interrupt_at_3(self, stream):
        if self.state.step == 3:
            raise KeyboardInterrupt
        return real(self, stream)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupt_at_3)
    out = tmp_path / "run"
    code, _, err = train(capsys, *args_for(corpus, out), "--steps", "10")
    assert code == 130 and "interrupted (Ctrl-C); resume with --resume" in err
    assert list_checkpoints(out / "checkpoints")[-1].name == "step_000003"


# -- crash safety ------------------------------------------------------------------------------------
def test_stale_temporaries_are_removed_at_the_next_start(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    stale = out / "checkpoints" / ".tmp-step_000001-99999"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{")
    assert train(capsys, *args_for(corpus, out), "--steps", "1")[0] == 0
    assert not stale.exists()


def test_resaving_a_step_swaps_atomically_and_fsyncs(tmp_path, monkeypatch):
    model = tiny_model()
    opt = build_optimizer(model, make_cfg(tmp_path).optim)
    first = save_checkpoint(tmp_path, 1, model, None, opt, {"step": 1}, {})
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ckpt_mod.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(ckpt_mod.os, "replace", lambda a, b: (renames.append((a, b)), real_replace(a, b)))
    again = save_checkpoint(tmp_path, 1, model, None, opt, {"step": 1, "again": True}, {})
    assert again == first and json.loads((again / "trainer" / "state.json").read_text())["again"] is True
    assert renames == []  # renameat2(RENAME_EXCHANGE): no moment without step_000001
    assert len(synced) >= 8  # every file, the folders, and the checkpoints root
    assert [p.name for p in tmp_path.iterdir()] == ["step_000001"]


KILL_SCRIPT = r"""
import sys
from slmlab import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_random_kills_never_lose_the_run(corpus, tmp_path):
    """SIGKILL a run that checkpoints every step at 10 random moments (some inside checkpoint writes
    and pruning), resume each time: the per-step losses equal an uninterrupted run's."""
    import random

    steps = 14
    extra = ["checkpoint_every=1", "keep_checkpoints=2", "eval_every=0"]
    full = tmp_path / "full"
    subprocess.run([sys.executable, "-c", KILL_SCRIPT, "train", *args_for(corpus, full, *extra), "--steps", str(steps)],
                   check=True, capture_output=True)
    want = {r["step"]: r["loss"] for r in read_metrics(full / "metrics.jsonl", "train")}
    out = tmp_path / "killed"
    rng = random.Random(0)
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, "train", *args_for(corpus, out, *extra), "--resume",
                                 "--steps", str(steps)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(3.0, 7.0))
        proc.kill()
        proc.wait()
    done = subprocess.run([sys.executable, "-c", KILL_SCRIPT, "train", *args_for(corpus, out, *extra), "--resume",
                           "--steps", str(steps)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    assert {r["step"]: r["loss"] for r in got} == want
