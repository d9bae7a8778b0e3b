"""Trainer: config, schedules, exact resume, atomic checkpoints, NaN stop, Ctrl-C, corrupt files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from slmlab.models.lumen import LumenConfig, LumenForCausalLM
from slmlab.train import CheckpointError, Trainer, TrainingDiverged, load_config, load_training_state
from slmlab.train import checkpoint as ckpt_mod
from slmlab.train.checkpoint import flatten_state, list_checkpoints, resolve_checkpoint, unflatten_state
from slmlab.train.metrics import read_metrics
from slmlab.train.optim import build_optimizer, lr_factor, split_parameters
from test_train_toydata import ToySource

TINY = dict(vocab_size=61, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=48, max_seq_len=64)


def tiny_model(seed: int = 0) -> LumenForCausalLM:
    torch.manual_seed(seed)
    return LumenForCausalLM(LumenConfig(**TINY))


def make_cfg(tmp_path, *items):
    base = ["batch_size=4", "eval_every=0", "eval_batches=1", "checkpoint_every=0", "progress=false",
            "tensorboard=false", "log_every=1", "optim.lr=3e-3", f"out_dir={tmp_path}"]
    return load_config([], base + list(items))


def run(cfg, source=None, resume=None, model=None):
    trainer = Trainer(cfg, model or tiny_model(), source or ToySource(), None, cfg.out_dir)
    if resume is not None:
        trainer.resume(resume)
    trainer.train()
    return trainer


# -- config ----------------------------------------------------------------------------------------
def test_config_overrides_and_yaml(tmp_path):
    yml = tmp_path / "c.yaml"
    yml.write_text("model: lumen:lumen-tiny\noptim:\n  lr: 1e-3\n  name: muon\nmax_steps: 7\n")
    cfg = load_config([yml], ["optim.lr=3e-4", "model_config.num_layers=3", "schedule.name=wsd"])
    assert cfg.model == "lumen:lumen-tiny" and cfg.max_steps == 7
    assert cfg.optim.lr == pytest.approx(3e-4) and cfg.optim.name == "muon"
    assert cfg.model_config == {"num_layers": 3} and cfg.schedule.name == "wsd"


@pytest.mark.parametrize(
    "item, field",
    [("batch_size=0", "batch_size"), ("optim.name=sgd", "optim.name"), ("bogus=1", "bogus"),
     ("optim.lr=-1", "optim.lr"), ("precision=fp8", "precision"), ("optim.nope=1", "nope"),
     ("max_steps=abc", "max_steps"), ("schedule.min_lr_ratio=2", "schedule.min_lr_ratio")],
)
def test_config_errors_name_the_field(item, field):
    with pytest.raises(ValueError, match=field):
        load_config([], [item])


def test_missing_config_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config([tmp_path / "nope.yaml"])


# -- optimiser and schedule ------------------------------------------------------------------------
def test_schedules():
    cfg = load_config([], ["schedule.warmup=10", "schedule.min_lr_ratio=0.1"]).schedule
    f = [lr_factor(s, 100, cfg) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and f[-1] == pytest.approx(0.1, abs=1e-3)
    wsd = load_config([], ["schedule.name=wsd", "schedule.warmup=0.1", "schedule.decay_frac=0.2"]).schedule
    g = [lr_factor(s, 100, wsd) for s in range(100)]
    assert g[10:80] == [1.0] * 70 and g[-1] == pytest.approx(wsd.min_lr_ratio) and g[85] < 1.0


def test_parameter_groups_and_muon(tmp_path):
    model = tiny_model()
    parts = split_parameters(model)
    names = {k: [n for n, _ in v] for k, v in parts.items()}
    assert names["embedding"] == ["model.embed_tokens.weight"]  # tied head counted once
    assert all("norm" in n for n in names["other"]) and all("proj" in n for n in names["matrix"])
    opt = build_optimizer(model, make_cfg(tmp_path).optim)
    decays = {g["name"]: g["weight_decay"] for g in opt.param_groups}
    assert decays == {"matrix": 0.1, "no_decay": 0.0}
    trainer = run(make_cfg(tmp_path, "max_steps=6", "optim.name=muon", "optim.muon_lr=0.02"))
    assert [g["name"] for g in trainer.optimizer.param_groups] == ["muon", "no_decay"]
    assert trainer.losses[-1] < trainer.losses[0]
    # the combined optimiser state round-trips through the checkpoint
    fresh = Trainer(trainer.cfg, tiny_model(1), ToySource(), None, trainer.run_dir)
    fresh.resume(trainer.last_checkpoint())
    a, b = trainer.optimizer.state_dict(), fresh.optimizer.state_dict()
    buf = lambda sd: sd["optimizers"][0]["state"][0]["momentum_buffer"]  # noqa: E731
    assert torch.equal(buf(a), buf(b))


def test_state_flattening_roundtrip():
    state = {"state": {0: {"step": torch.tensor(3.0), "m": torch.randn(2, 3)}}, "param_groups": [{"betas": (0.9, 0.95), "params": [0]}]}
    tensors: dict = {}
    structure = json.loads(json.dumps(flatten_state(state, tensors)))
    back = unflatten_state(structure, tensors)
    assert list(back["state"]) == [0] and back["param_groups"][0]["betas"] == (0.9, 0.95)
    assert torch.equal(back["state"][0]["m"], state["state"][0]["m"])


# -- resume, checkpoints, failures -----------------------------------------------------------------
def test_resume_reproduces_the_uninterrupted_losses(tmp_path):
    n = 5
    full = run(make_cfg(tmp_path / "full", f"max_steps={2 * n}", "grad_accum=2", "schedule.warmup=2"))
    first = run(make_cfg(tmp_path / "split", f"max_steps={2 * n}", "grad_accum=2", "schedule.warmup=2",
                         f"checkpoint_every={n}", "keep_checkpoints=0"), source=_StopAt(n * 2))
    assert first.state.step == n and "interrupted" in first.state.stop_reason
    ckpt = resolve_checkpoint(tmp_path / "split")
    assert ckpt.name == f"step_{n:06d}"
    second = run(make_cfg(tmp_path / "split", f"max_steps={2 * n}", "grad_accum=2", "schedule.warmup=2"),
                 resume=ckpt, model=tiny_model(seed=123))
    assert first.losses + second.losses == full.losses  # bit-identical, every step
    logged = [r["loss"] for r in read_metrics(tmp_path / "split" / "metrics.jsonl", "train")]
    assert logged == full.losses


class _StopAt(ToySource):
    """Raises KeyboardInterrupt when micro-batch ``stop`` is requested (a simulated Ctrl-C)."""

    def __init__(self, stop: int, **kw) -> None:
        super().__init__(**kw)
        self.stop = stop

    def batches(self, split, batch_size, *, seed, step=0, rank=0, world_size=1):
        for i, batch in enumerate(super().batches(split, batch_size, seed=seed, step=step, rank=rank, world_size=world_size)):
            if step + i == self.stop:
                raise KeyboardInterrupt
            yield batch


def test_ctrl_c_saves_and_exits(tmp_path):
    trainer = run(make_cfg(tmp_path, "max_steps=20"), source=_StopAt(3))
    assert trainer.state.step == 3 and trainer.state.stop_reason.startswith("interrupted")
    state = json.loads((tmp_path / "checkpoints" / "step_000003" / "trainer" / "state.json").read_text())
    assert state["step"] == 3 and state["data_step"] == 3


def test_crash_while_writing_leaves_previous_checkpoint(tmp_path, monkeypatch):
    trainer = run(make_cfg(tmp_path, "max_steps=2"))
    good = trainer.last_checkpoint()

    def boom(*a, **k):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt_mod, "write_trainer_files", boom)
    trainer.state.step = 3
    with pytest.raises(OSError, match="simulated"):
        trainer.save()
    assert list_checkpoints(tmp_path / "checkpoints") == [good]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    model = tiny_model(7)
    state = load_training_state(resolve_checkpoint(tmp_path), model, build_optimizer(model, trainer.cfg.optim))
    assert state["step"] == 2
    for a, b in zip(model.state_dict().values(), trainer.model.state_dict().values()):
        assert torch.equal(a, b)


def test_nan_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path):
    model = tiny_model()
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == 5 else output

    model.get_output_embeddings().register_forward_hook(poison)
    cfg = make_cfg(tmp_path, "max_steps=10", "checkpoint_every=2")
    trainer = Trainer(cfg, model, ToySource(), None, tmp_path)
    with pytest.raises(TrainingDiverged, match=r"nan at step 5.*step_000004"):
        trainer.train()
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")][-1] == "step_000004"
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad update was not applied


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda c: (c / "trainer" / "state.json").unlink(), "state.json is missing"),
        (lambda c: (c / "model.safetensors").unlink(), "model.safetensors is missing"),
        (lambda c: (c / "model.safetensors").write_bytes(b"\x00garbage"), "model.safetensors is corrupt"),
        (lambda c: (c / "trainer" / "optimizer.safetensors").write_bytes((c / "trainer" / "optimizer.safetensors").read_bytes()[:100]),
         "optimizer.safetensors is corrupt"),
        (lambda c: (c / "trainer" / "state.json").write_text("{not json"), "state.json is corrupt"),
    ],
)
def test_corrupt_or_missing_checkpoint_files_give_clear_errors(tmp_path, damage, message):
    trainer = run(make_cfg(tmp_path, "max_steps=1"))
    ckpt = trainer.last_checkpoint()
    damage(ckpt)
    with pytest.raises(CheckpointError, match=message):
        Trainer(trainer.cfg, tiny_model(), ToySource(), None, tmp_path).resume(ckpt)


def test_missing_run_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run or checkpoint"):
        resolve_checkpoint(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        resolve_checkpoint(tmp_path / "empty")


def test_checkpoint_is_a_hf_model_and_metrics_are_written(tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = run(make_cfg(tmp_path, "max_steps=4", "eval_every=2", "tensorboard=true", "keep_checkpoints=1", "checkpoint_every=2"))
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_000004"]
    reloaded = AutoModelForCausalLM.from_pretrained(str(trainer.last_checkpoint()))
    ids = torch.randint(0, 61, (2, 10))
    torch.testing.assert_close(reloaded(ids).logits, trainer.model.eval()(ids).logits, rtol=0, atol=0)
    evals = read_metrics(tmp_path / "metrics.jsonl", "eval")
    assert [r["step"] for r in evals] == [2, 4]
    assert evals[-1]["bits_per_byte"] == pytest.approx(evals[-1]["loss"] / math.log(2) / 1.5)
    assert any((tmp_path / "tb").iterdir())


def test_early_stop_on_accuracy(tmp_path):
    trainer = run(make_cfg(tmp_path, "max_steps=50", "eval_every=2", "early_stop_acc=0.0001"), source=ToySource(synthetic=True))
    evals = read_metrics(tmp_path / "metrics.jsonl", "eval")
    first_pass = next(r["step"] for r in evals if r["acc"] > 0.0001)
    assert trainer.state.step == first_pass < 50 and "accuracy" in trainer.state.stop_reason
    assert set(trainer.state.last_eval["acc_by_group"]) == {"0", "1"}


def test_evaluation_hooks_see_each_periodic_result_and_may_stop_the_run(tmp_path):
    seen, late = [], []

    def stop_at_six(step, result):
        seen.append((step, result["loss"]))
        return "enough at step 6" if step == 6 else ""

    trainer = Trainer(make_cfg(tmp_path, "max_steps=20", "eval_every=2"), tiny_model(), ToySource(), None, tmp_path,
                      on_evaluation=[stop_at_six])
    trainer.on_evaluation.append(lambda step, result: late.append(step) or "")
    trainer.train()
    evals = read_metrics(tmp_path / "metrics.jsonl", "eval")
    assert seen == [(r["step"], r["loss"]) for r in evals] and [s for s, _ in seen] == [2, 4, 6]
    assert trainer.state.stop_reason == "enough at step 6" and trainer.state.step == 6
    assert late == [2, 4]  # hooks run in order, and none after one has stopped the run


def test_bf16_autocast_and_wsd_train_on_cpu(tmp_path):
    trainer = run(make_cfg(tmp_path, "max_steps=3", "precision=bf16", "schedule.name=wsd"))
    assert trainer.autocast is not None and all(math.isfinite(x) for x in trainer.losses)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # autocast, not a cast


def test_in_training_evaluation_sees_the_current_weights(tmp_path):
    """Regression: evaluations during training must match a fresh load of the saved weights (the fused
    optimiser does not bump parameter versions; a version-keyed weight cache once went stale)."""
    from slmlab.evaluate import evaluate_source
    from slmlab.train.checkpoint import load_model_weights

    trainer = run(make_cfg(tmp_path, "max_steps=6", "eval_every=2", "eval_batches=2", "optim.lr=1e-2"))
    fresh = tiny_model(5)
    load_model_weights(fresh, trainer.last_checkpoint())
    again = evaluate_source(fresh.eval(), ToySource(), "validation", 4, 2)
    assert trainer.state.last_eval["loss"] == pytest.approx(again["loss"], rel=1e-6)


# -- one step, the autocast choice, readable logs --------------------------------------------------
def test_train_step_returns_its_numbers_and_advances_the_state(tmp_path):
    trainer = Trainer(make_cfg(tmp_path, "max_steps=4", "grad_accum=2"), tiny_model(), ToySource(), None, tmp_path)
    stream = trainer.source.batches("train", 4, seed=0)
    out = trainer.train_step(stream)
    assert trainer.state.step == 1 and trainer.losses == [out.loss] and math.isfinite(out.loss)
    assert out.tokens == trainer.state.tokens_seen > 0 and out.seconds > 0 and out.grad_norm > 0


def test_one_autocast_choice_for_trainer_and_evaluator():
    from slmlab.train.precision import autocast_factory

    assert autocast_factory("cpu") is None and autocast_factory("cpu", "fp32") is None
    assert autocast_factory("cuda:0", "fp32") is None and autocast_factory("cuda:0") is not None
    with autocast_factory("cpu", "bf16")():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="precision"):
        autocast_factory("cpu", "fp8")


def test_progress_off_a_terminal_prints_plain_lines(tmp_path, capfd):
    """Regression: tqdm redirected to a file wrote every refresh on one '\\r'-joined line."""
    run(make_cfg(tmp_path, "max_steps=7", "progress=true", "log_every=2", "eval_every=4"))
    out, err = capfd.readouterr()
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2/7", "4/7", "4:", "6/7", "7/7"]
    assert all(" loss " in line and " lr " in line and " tok/s " in line and " eta " in line for line in lines if "/" in line)
    assert "\r" not in out + err


def test_progress_lines_also_come_every_few_seconds(capsys):
    from slmlab.train.progress import Progress, format_duration

    p = Progress(total=1000, every_steps=100, every_s=0.0, live=False)
    for step in range(1, 4):
        p.update(step, 2.5, 1e-3, 64, 0.01)
    p.close()
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert [format_duration(s) for s in (12, 372, 4000)] == ["12s", "6m12s", "1h06m"]


def test_gradient_checkpointing_option_trains_the_same_steps(tmp_path):
    """``gradient_checkpointing=true`` turns checkpointing on for every decoder layer; the losses of
    three optimiser steps equal the plain run's (1e-6)."""
    plain = run(make_cfg(tmp_path / "plain", "max_steps=3"))
    ckpt = run(make_cfg(tmp_path / "ckpt", "max_steps=3", "gradient_checkpointing=true"))
    assert ckpt.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    assert all(layer.gradient_checkpointing for layer in ckpt.model.model.layers)
    assert ckpt.losses == pytest.approx(plain.losses, abs=1e-6)
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        load_config([], ["gradient_checkpointing=sometimes"])


# -- max_steps is the budget; max_time only a safety cap that says so -------------------------------
CAPPED = "stopped by the max_time safety cap at step 1 of 6; the result is not the configured run"


def test_max_time_is_a_safety_cap_that_says_so(tmp_path, capfd):
    """Regression: the quickstart's time budget ended a 1,500-step run at step 141 with nothing but
    'time budget of 600 s reached'. The cap still stops the run (with a checkpoint), and the progress
    output says plainly that the result is not the configured run."""
    trainer = run(make_cfg(tmp_path, "max_steps=6", "max_time=1e-9", "progress=true", "log_every=1"))
    assert trainer.state.step == 1 and trainer.state.stop_reason == CAPPED
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_000001"]
    out = capfd.readouterr().out
    assert CAPPED in out and "max_time" in out.split(CAPPED, 1)[1].splitlines()[0]  # and how to finish it


def test_without_the_cap_a_run_ends_at_max_steps(tmp_path):
    trainer = run(make_cfg(tmp_path, "max_steps=3"))
    assert trainer.state.step == 3 and trainer.state.stop_reason == "max_steps reached"


def test_quickstart_is_bounded_by_steps_with_a_generous_safety_cap():
    """configs/quickstart.yaml: max_steps is its budget; max_time, if set, is an hour or more (a cap
    that a slow machine does not reach), never the 10 minutes that cut a run to a tenth of its steps."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    cfg = load_config([path])
    assert cfg.max_steps == 1500
    assert cfg.max_time == 0 or cfg.max_time >= 3600, f"quickstart max_time={cfg.max_time}: steps must be its budget"
    line = next(line for line in path.read_text().splitlines() if line.startswith("max_time:"))
    assert "safety cap" in line
