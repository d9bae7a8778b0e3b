"""`slmlab transactions`: the run-folder guarantees of `slmlab train` (lock, no silent overwrite, checked
resume, trimmed metrics), the right kind of checkpoint, output paths checked before the work, schema drift."""

from __future__ import annotations

import json
import shutil

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("sklearn")

from slmlab.cli import main  # noqa: E402
from slmlab.train.lock import RunLock  # noqa: E402
from slmlab.transactions.data.bank import export  # noqa: E402

STEPS = ["max_steps=2", "batch_size=4", "progress=false", "log_every=1"]


@pytest.fixture(scope="module")
def runs(bank_data, tmp_path_factory):
    """A csv bank, a pretraining run (checkpoints at steps 1 and 2) and a fine-tuned run from it."""
    root = tmp_path_factory.mktemp("txn_runs")
    export(bank_data, root / "bank", "csv")
    common = ["--data", str(root / "bank"), "--threads", "1", "--device", "cpu"]
    assert main(["transactions", "pretrain", *common, "--out", str(root / "pre"), *STEPS, "checkpoint_every=1"]) == 0
    assert main(["transactions", "finetune", *common, "--encoder", str(root / "pre"), "--out", str(root / "ft"),
                 *STEPS]) == 0
    return root


def free_port() -> int:
    """A port nothing listens on now (a fixed one may be taken: the kind check must be what refuses)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _common(runs, bank=None):
    return ["--data", str(bank or runs / "bank"), "--threads", "1", "--device", "cpu"]


def _checkpoints(run):
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


# -- 1. run folders ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_second_run_into_a_locked_folder_is_refused(runs, tmp_path, capsys, stage):
    out = tmp_path / "run"
    with RunLock(out):
        code = main(["transactions", stage, *_common(runs), "--out", str(out), *STEPS])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"slmlab transactions: error: run folder {out} is locked" in err and ".lock" in err
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_fresh_run_over_an_existing_run_is_refused(runs, tmp_path, capsys, stage):
    out = tmp_path / "run"
    shutil.copytree(runs / ("pre" if stage == "pretrain" else "ft"), out)
    before = _checkpoints(out)
    code = main(["transactions", stage, *_common(runs), "--out", str(out), "max_steps=3", "batch_size=4",
                 "progress=false"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--resume" in err and "--out" in err and "slmlab transactions: error:" in err
    assert _checkpoints(out) == before


def test_resume_refuses_changed_seed_data_and_model_with_a_diff(runs, bank_data, tmp_path, capsys):
    out = tmp_path / "pre"
    shutil.copytree(runs / "pre", out)
    base = ["transactions", "pretrain", "--resume", "--out", str(out), "max_steps=3", "batch_size=4", "progress=false"]
    assert main([*base[:3], *_common(runs), *base[3:], "seed=7"]) == 2
    assert "seed: 0 -> 7" in capsys.readouterr().err
    other = bank_data.transactions[bank_data.transactions.customer_id != bank_data.transactions.customer_id.iloc[0]]
    export(type(bank_data)(other, bank_data.customers, bank_data.merchants, bank_data.fraud_cases), tmp_path / "b2",
           "csv")
    assert main([*base[:3], *_common(runs, tmp_path / "b2"), *base[3:]]) == 2
    assert "data: " in capsys.readouterr().err
    assert main([*base[:3], *_common(runs), "--max-transactions", "32", *base[3:]]) == 2
    assert "max_transactions" in capsys.readouterr().err
    assert _checkpoints(out) == _checkpoints(runs / "pre")
    assert main([*base[:3], *_common(runs), *base[3:], "seed=7", "--allow-change", "seed"]) == 0  # as train's
    assert "changed on resume: seed: 0 -> 7" in capsys.readouterr().out


def test_resume_says_where_and_drops_metrics_past_the_checkpoint(runs, tmp_path, capsys):
    out = tmp_path / "pre"
    shutil.copytree(runs / "pre", out)
    shutil.rmtree(out / "checkpoints" / "step_000002")  # killed after logging step 2, before its checkpoint
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "train", "step": 2, "loss": 1.0}\n{"kind": "tr')  # and a torn line
    capsys.readouterr()
    assert main(["transactions", "pretrain", *_common(runs), "--resume", "--out", str(out), *STEPS,
                 "checkpoint_every=1"]) == 0
    assert "resuming from step 1" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == [1, 2]


def test_finetune_resumes_its_run_and_refuses_a_changed_head_setting(runs, tmp_path, capsys):
    out = tmp_path / "ft"
    shutil.copytree(runs / "ft", out)
    argv = ["transactions", "finetune", *_common(runs), "--encoder", str(runs / "pre"), "--resume", "--out", str(out),
            "max_steps=3", "batch_size=4", "progress=false", "log_every=1"]
    assert main([*argv, "--keep-negative", "0.5"]) == 2
    assert "keep_negative" in capsys.readouterr().err
    assert main(argv) == 0
    assert "resuming from step 2" in capsys.readouterr().out
    assert _checkpoints(out)[-1] == "step_000003"


# -- 2. generate --out ------------------------------------------------------------------------------------
def test_generate_refuses_a_non_empty_out_without_force(tmp_path, capsys):
    out = tmp_path / "bank"
    out.mkdir()
    (out / "transactions.csv").write_text("a real export\n")
    small = ["n_customers=20", "n_days=20", "n_physical_merchants=50", "n_online_merchants=20"]
    assert main(["transactions", "generate", "--out", str(out), "--format", "csv", *small]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "another" in err
    assert (out / "transactions.csv").read_text() == "a real export\n"
    assert main(["transactions", "generate", "--out", str(out), "--format", "csv", "--force", *small]) == 0
    assert (out / "manifest.json").is_file()


# -- 3. the kind of checkpoint ----------------------------------------------------------------------------
@pytest.mark.parametrize("sub", ["score", "evaluate"])
def test_scoring_a_pretraining_run_is_refused(runs, tmp_path, capsys, sub):
    code = main(["transactions", sub, *_common(runs), "--model", str(runs / "pre"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "transactions pretrain" in err and "slmlab transactions finetune --encoder" in err
    assert not (tmp_path / "o").exists()


def test_demo_refuses_a_pretraining_run(runs, capsys):
    code = main(["transactions", "demo", "--checkpoint", str(runs / "pre"), "--data", str(runs / "bank"),
                 "--port", str(free_port())])
    err = capsys.readouterr().err
    assert code == 2 and "slmlab transactions finetune --encoder" in err, err


@pytest.mark.parametrize("stage", ["pre", "ft"])
def test_every_run_folder_says_how_to_tokenise_a_bank(runs, stage):
    """Issue 34.10: README's finetune -> `demo --checkpoint` failed (the fine-tuned run had no schema file)."""
    from slmlab.transactions.data.schema import FittedSchema

    saved = FittedSchema.load(runs / stage / "schema.fitted.json")
    assert saved.to_dict() == FittedSchema.load(runs / "pre" / "schema.fitted.json").to_dict()


def test_demo_loads_the_finetuned_run_of_the_readme(runs):
    pytest.importorskip("gradio")
    from slmlab.transactions import demo

    state = demo.load_state(runs / "ft", runs / "bank", baselines=False)
    assert state.test_scores["sequence"].shape == state.test_y.shape


def test_finetune_encoder_must_be_a_pretraining_run(runs, tmp_path, capsys):
    code = main(["transactions", "finetune", *_common(runs), "--encoder", str(runs / "ft"), "--out",
                 str(tmp_path / "a"), *STEPS])
    err = capsys.readouterr().err
    assert code == 2 and "fine-tuned" in err and "transactions pretrain" in err, err
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code = main(["transactions", "finetune", *_common(runs), "--encoder", str(lm), "--out", str(tmp_path / "b"),
                 *STEPS])
    err = capsys.readouterr().err
    assert code == 2 and "not a transactions checkpoint" in err and "llama" in err, err


# -- 4. outputs checked before the work -------------------------------------------------------------------
def test_score_checks_its_out_before_scoring(runs, tmp_path, capsys, monkeypatch):
    import slmlab.transactions.pipeline as pipeline

    calls = []
    monkeypatch.setattr(pipeline, "score_transactions", lambda *a, **k: calls.append(1) or pd.DataFrame())
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file" / "s.csv", tmp_path):
        code = main(["transactions", "score", *_common(runs), "--model", str(runs / "ft"), "--out", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and "slmlab transactions: error:" in err and "internal" not in err, err
    assert calls == []
    monkeypatch.undo()
    out = tmp_path / "missing" / "s.csv"
    assert main(["transactions", "score", *_common(runs), "--model", str(runs / "ft"), "--out", str(out)]) == 0
    assert len(pd.read_csv(out)) > 0


def test_evaluate_and_pretrain_check_their_out_before_the_work(runs, tmp_path, capsys, monkeypatch):
    import slmlab.transactions.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_bank", lambda *a, **k: pytest.fail("loaded the bank before checking --out"))
    (tmp_path / "file").write_text("x")
    for argv in (["evaluate", *_common(runs), "--out", str(tmp_path / "file")],
                 ["evaluate", *_common(runs), "--out", str(tmp_path / "file" / "rep")],
                 ["pretrain", *_common(runs), "--out", str(tmp_path / "file" / "run")],
                 ["finetune", *_common(runs), "--out", str(tmp_path / "file")]):
        code = main(["transactions", *argv])
        err = capsys.readouterr().err
        assert code == 2 and "internal" not in err and "file" in err, (argv, err)


# -- 5. schema drift --------------------------------------------------------------------------------------
def test_score_refuses_a_trained_column_missing_from_every_row(runs, bank_data, tmp_path, capsys):
    bank = tmp_path / "bank"
    shutil.copytree(runs / "bank", bank)
    tx = pd.read_csv(bank / "transactions.csv", dtype=str)
    tx.drop(columns=["mcc"]).to_csv(bank / "transactions.csv", index=False)
    for sub in ("score", "evaluate"):
        code = main(["transactions", sub, *_common(runs, bank), "--model", str(runs / "ft"), "--out",
                     str(tmp_path / f"{sub}.out")])
        err = capsys.readouterr().err
        assert code == 2 and "'mcc'" in err and "missing from every row" in err, err


def test_score_warns_about_a_column_unknown_to_the_fitted_schema(runs, tmp_path, capsys):
    bank = tmp_path / "bank"
    shutil.copytree(runs / "bank", bank)
    tx = pd.read_csv(bank / "transactions.csv", dtype=str)
    tx.assign(loyalty_tier="gold").to_csv(bank / "transactions.csv", index=False)
    assert main(["transactions", "score", *_common(runs, bank), "--model", str(runs / "ft"), "--out",
                 str(tmp_path / "s.csv")]) == 0
    err = capsys.readouterr().err
    assert "loyalty_tier" in err and "warning" in err


@pytest.mark.parametrize("argv", [["eval", "{run}", "--device", "cpu"], ["generate", "{run}", "--prompt", "hi"],
                                  ["export", "{run}", "{tmp}/x", "--to", "hf"], ["serve", "{run}", "--port", "{port}"]])
def test_lm_commands_name_a_transactions_run(runs, tmp_path, capsys, argv):
    code = main([a.format(run=runs / "ft", tmp=tmp_path, port=free_port()) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and "this is a transactions checkpoint (a fine-tuned model from `slmlab transactions finetune`);" \
        " use `slmlab transactions ...`" in err, err
