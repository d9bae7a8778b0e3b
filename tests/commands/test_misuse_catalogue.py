"""The misuse catalogue (issue 46): each mistake a new user made, and its neighbours (the same mistake
through every other command), as one table. Each row is a command line that must be refused with one
line ``slmlab <cmd>: error: <what>; <what to do>`` and exit 2, naming what the row's needles say; the
rows that must instead give the correct result are tests of their own below the table.

The command lines are templates: ``{run}`` a tiny trained run (lumen-tiny, BPE of 300, block 128),
``{q8}`` / ``{q4}`` its ``slmlab quantize`` copies, ``{lora}`` a two-step LoRA fine-tune of it,
``{chat}`` a small chat file, ``{corpus}`` the run's text files, ``{tmp}`` a fresh folder per row."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from slmlab import cli
from tiny_runs import train_tiny_run

pytest.importorskip("peft")

QUIET = "progress=false tensorboard=false batch_size=2 checkpoint_every=0 sample_tokens=0"
TRAIN = f"--data {{corpus}} --out {{tmp}}/o --steps 1 block_size=32 {QUIET}"
FINETUNE = f"--data {{chat}} --out {{tmp}}/o --steps 1 {QUIET}"


@dataclass(frozen=True)
class Case:
    """One misuse: ``argv`` (a template, see the module docstring), the strings its error must hold, and
    ``prepare(world, tmp)``: files to write first (None: nothing)."""

    name: str
    argv: str
    needles: tuple[str, ...]
    prepare: object = None


TXN = ("this is a transactions checkpoint", "slmlab transactions")
QUANTIZED = ("quantized copy", "cannot be trained", "float run it was quantized from")
CASES = [
    # 1. training from a quantized folder trained a random model and exited 0
    Case("train --model int8", f"train --model {{q8}} {TRAIN}", ("int8", *QUANTIZED)),
    Case("train --model int4", f"train --model {{q4}} {TRAIN}", ("int4", *QUANTIZED)),
    Case("finetune int8", f"finetune {{q8}} {FINETUNE}", ("int8", *QUANTIZED)),
    Case("finetune int4", f"finetune {{q4}} {FINETUNE}", ("int4", *QUANTIZED)),
    Case("finetune --lora int8", f"finetune {{q8}} --lora r=2 {FINETUNE}", ("int8", *QUANTIZED)),
    Case("finetune --lora int4", f"finetune {{q4}} --lora r=2 {FINETUNE}", ("int4", *QUANTIZED)),
    Case("quantize a quantized folder", "quantize {q8} {tmp}/qq", ("already quantized", "float run")),
    Case("export a quantized folder", "export {q8} --to hf {tmp}/hf", ("quantized copy", "float run")),
    # the --quantize flag on a folder quantized with the other scheme silently kept that scheme
    Case("serve int8 --quantize int4", "serve {q8} --quantize int4", ("--quantize int4", "already int8", "drop --quantize")),
    Case("generate int8 --quantize int4", "generate {q8} --quantize int4 --prompt-ids 5",
         ("--quantize int4", "already int8")),
    Case("eval int4 --quantize int8", "eval {q4} --quantize int8 --data {corpus}", ("--quantize int8", "already int4")),
    # 3. an output folder that holds something: refused, never written into
    Case("merge --out a non-empty folder", "finetune {lora} --merge --out {tmp}/victim",
         ("--out", "victim exists and is not an empty folder", "choose a new folder"), lambda w, t: victim(t)),
    Case("merge --out a run folder", "finetune {lora} --merge --out {run}", ("exists and is not an empty folder",)),
    Case("merge --out a file", "finetune {lora} --merge --out {chat}", ("is a file", "choose a new folder")),
    Case("merge a quantized folder", "finetune {q8} --merge --out {tmp}/m", QUANTIZED),
    Case("quantize into a non-empty folder", "quantize {run} {tmp}/victim", ("OUT", "exists and is not an empty folder"),
         lambda w, t: victim(t)),
    Case("quantize into a run folder", "quantize {run} {lora}", ("exists and is not an empty folder",)),
    Case("quantize into a file", "quantize {run} {chat}", ("is a file",)),
    Case("quantize onto a symbolic link", "quantize {run} {tmp}/link", ("is a symbolic link", "name the folder itself"),
         lambda w, t: (t / "empty").mkdir() or (t / "link").symlink_to(t / "empty")),
    Case("merge --out a symbolic link", "finetune {lora} --merge --out {tmp}/link", ("is a symbolic link",),
         lambda w, t: (t / "link").symlink_to(t / "nowhere")),
    Case("export onto a symbolic link", "export {run} --to hf {tmp}/link", ("is a symbolic link", "name the folder itself"),
         lambda w, t: (t / "empty").mkdir() or (t / "link").symlink_to(t / "empty")),
    Case("export --force onto a symbolic link", "export {run} --to hf {tmp}/link --force", ("is a symbolic link",),
         lambda w, t: victim(t) and (t / "link").symlink_to(t / "victim")),
    # 6. messages: each names the value and what to do
    Case("generate: undecodable --prompt", "generate {run} --prompt \udcffab",
         ("--prompt is not valid UTF-8", "byte 0xff at character 0", "pass UTF-8 text")),
    Case("chat: undecodable --system", "chat {run} --system \udcfe", ("--system is not valid UTF-8", "byte 0xfe")),
    Case("generate --prompt-ids 5,x", "generate {run} --prompt-ids 5,x",
         ("--prompt-ids: 'x' is not a token id", "--prompt-ids 5,6,7")),
    Case("train optim.betas=0.9", f"train --model lumen:lumen-tiny {TRAIN} optim.betas=0.9",
         ("optim.betas must be two numbers", "got 0.9", "optim.betas=[0.9,0.95]")),
    Case("finetune optim.betas=[0.9,x]", f"finetune {{run}} {FINETUNE} optim.betas=[0.9,x]",
         ("optim.betas must be two numbers", "'x'")),
    Case("finetune: a data file with a bad byte", f"finetune {{run}} {FINETUNE.replace('{chat}', '{tmp}/bad.jsonl')}",
         ("bad.jsonl:2: not valid UTF-8", "byte 0xff", "save the file as UTF-8"), lambda w, t: bad_bytes(t)),
    Case("finetune --eval-only: a data file with a bad byte", "finetune {run} --data {tmp}/bad.jsonl --eval-only",
         ("bad.jsonl:2: not valid UTF-8",), lambda w, t: bad_bytes(t)),
    Case("train --resume: a list-shaped state.json", f"train --model lumen:lumen-tiny {TRAIN} --resume-from {{tmp}}/r",
         ("state.json is damaged", "JSON list, not an object", "earlier checkpoint"), lambda w, t: list_state(w, t)),
    Case("finetune: a chat template the sandbox blocks", f"finetune {{tmp}}/j {FINETUNE}",
         ("chat template cannot be rendered", "SecurityError", "tokenizer_config.json"), lambda w, t: blocked_template(w, t)),
    Case("finetune --eval-only: a chat template the sandbox blocks", "finetune {tmp}/j --data {chat} --eval-only",
         ("chat template cannot be rendered",), lambda w, t: blocked_template(w, t)),
    Case("transactions pretrain: an empty table", "transactions pretrain --data {tmp}/bank --out {tmp}/o max_steps=1",
         ("transactions.csv holds no transactions (0 rows)", "slmlab transactions generate"),
         lambda w, t: (t / "bank").mkdir() or (t / "bank" / "transactions.csv").write_text("")),
    Case("finetune a transactions run", f"finetune {{tmp}}/txn {FINETUNE}", TXN, lambda w, t: txn_run(w, t)),
    Case("finetune --lora a transactions run", f"finetune {{tmp}}/txn --lora r=2 {FINETUNE}", TXN, lambda w, t: txn_run(w, t)),
    Case("finetune --merge a transactions run", "finetune {tmp}/txn --merge --out {tmp}/m", TXN, lambda w, t: txn_run(w, t)),
    Case("train --model a transactions run", f"train --model {{tmp}}/txn {TRAIN}", TXN, lambda w, t: txn_run(w, t)),
    Case("quantize a transactions run", "quantize {tmp}/txn {tmp}/q", TXN, lambda w, t: txn_run(w, t)),
    Case("compare --seeds -1", "compare --models lumen --tasks mqar:cpu --seeds -1 --out {tmp}/c",
         ("--seeds must be a whole number in [0, 2**32), got -1", "--seeds 0")),
    Case("train seed=-1", f"train --model lumen:lumen-tiny {TRAIN} seed=-1", ("seed must be a whole number", "seed=0")),
    Case("chat --max-new-tokens 0", "chat {run} --max-new-tokens 0", ("--max-new-tokens must be > 0",)),
]


def bad_bytes(tmp: Path) -> None:
    (tmp / "bad.jsonl").write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "\xff", "completion": "b"}\n')


def list_state(world: dict, tmp: Path) -> None:
    import shutil

    shutil.copytree(world["run"], tmp / "r")
    for state in (tmp / "r" / "checkpoints").glob("*/trainer/state.json"):
        state.write_text("[1, 2]")


def blocked_template(world: dict, tmp: Path) -> None:
    import shutil

    from slmlab.train.checkpoint import resolve_checkpoint

    shutil.copytree(resolve_checkpoint(world["run"]), tmp / "j")
    config = json.loads((tmp / "j" / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ ''.__class__.__mro__ }}{% for m in messages %}{{ m.content }}{% endfor %}"
    (tmp / "j" / "tokenizer_config.json").write_text(json.dumps(config))


def txn_run(world: dict, tmp: Path) -> None:
    """A folder shaped like a `slmlab transactions pretrain` checkpoint (its config names the encoder)."""
    import shutil

    from slmlab.train.checkpoint import resolve_checkpoint

    shutil.copytree(resolve_checkpoint(world["run"]), tmp / "txn")
    config = json.loads((tmp / "txn" / "config.json").read_text())
    (tmp / "txn" / "config.json").write_text(json.dumps({**config, "model_type": "slmlab_txn_encoder"}))
    (tmp / "txn" / "tokenizer.json").unlink()


def victim(tmp: Path) -> Path:
    """A folder holding someone's model files, which a command must not touch."""
    folder = tmp / "victim"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"precious weights")
    (folder / "config.json").write_text('{"precious": true}')
    return folder


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    """A `serve` row that is not refused fails here instead of serving forever."""
    monkeypatch.setattr("slmlab.serve.server.Server.run", lambda *a: pytest.fail("serve started instead of refusing"))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from slmlab.data.chat_data import builtin_chat, write_chat_jsonl

    root = tmp_path_factory.mktemp("misuse")
    run = train_tiny_run(root, 128, "User: What is 2 + 2?\nAssistant: 4\n")
    chat = write_chat_jsonl(builtin_chat(30), root / "chat.jsonl")
    assert cli.main(["quantize", str(run), str(root / "q8")]) == 0
    assert cli.main(["quantize", str(run), str(root / "q4"), "--scheme", "int4"]) == 0
    assert cli.main(["finetune", str(run), "--data", str(chat), "--lora", "r=2,alpha=4", "--out", str(root / "lora"),
                     "--steps", "2", *QUIET.split()]) == 0
    return {"run": run, "q8": root / "q8", "q4": root / "q4", "lora": root / "lora", "chat": chat,
            "corpus": root / "corpus"}


def command_line(case: Case, world: dict, tmp: Path) -> list[str]:
    return shlex.split(case.argv.format(**{k: shlex.quote(str(v)) for k, v in world.items()}, tmp=shlex.quote(str(tmp))))


def refused(capsys, argv: list[str], needles) -> str:
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith(f"slmlab {argv[0]}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[-1], err
    return lines[-1]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_misuse_is_a_one_line_refusal(case, world, tmp_path, capsys):
    if case.prepare is not None:
        case.prepare(world, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    refused(capsys, command_line(case, world, tmp_path), case.needles)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(tmp_path / "o")}
    assert after == before, "a refused command changed files it was pointed at"


def test_a_refused_training_run_leaves_no_model_behind(world, tmp_path, capsys):
    """The quantized-folder refusal comes before any training: no checkpoint, no report, no folder."""
    refused(capsys, ["finetune", str(world["q8"]), "--data", str(world["chat"]), "--out", str(tmp_path / "o"),
                     *QUIET.split()], QUANTIZED)
    assert not (tmp_path / "o").exists()  # not even the run lock's folder, which made --out non-empty


def test_a_full_finetune_of_a_lora_run_trains_every_parameter(world, tmp_path, capsys):
    """It said 'optimizer got an empty parameter list' (the merged model kept peft's frozen flags)."""
    import torch

    from slmlab.train.saved import load_for_inference

    out = tmp_path / "full"
    assert cli.main(["finetune", str(world["lora"]), "--data", str(world["chat"]), "--out", str(out), "--steps", "1",
                     *QUIET.split()]) == 0
    assert "100.00%" in capsys.readouterr().out
    before = load_for_inference(world["lora"], "cpu").model.state_dict()
    after = load_for_inference(out, "cpu").model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("mlp" in k for k in changed) and any("q_proj" in k for k in changed), changed


# -- 3. the output-folder promise: whole or nothing, an unchanged source, its own earlier output replaced --
def test_a_failed_write_leaves_no_partial_out_and_no_temporary(world, tmp_path, monkeypatch, capsys):
    import safetensors.torch

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "q"))

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", disk_full)
    refused(capsys, ["quantize", str(world["run"]), str(tmp_path / "q")], ("no space left",))
    refused(capsys, ["finetune", str(world["lora"]), "--merge", "--out", str(tmp_path / "m")], ("no space left",))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["quantize", "merge"])
def test_a_source_that_changes_while_read_is_refused(world, tmp_path, monkeypatch, capsys, command):
    """A live run rotating checkpoints removed files mid-copy; `quantize` wrote a folder without them."""
    import shutil

    from slmlab.train import saved

    source = tmp_path / "src"
    shutil.copytree(world["run"] if command == "quantize" else world["lora"], source)
    load = saved.load_for_inference

    def load_then_rotate(*a, **k):
        loaded = load(*a, **k)
        (loaded.checkpoint / "tokenizer.json").unlink()  # the run deleted the checkpoint meanwhile
        return loaded

    monkeypatch.setattr(saved, "load_for_inference", load_then_rotate)
    argv = (["quantize", str(source), str(tmp_path / "out")] if command == "quantize"
            else ["finetune", str(source), "--merge", "--out", str(tmp_path / "out")])
    refused(capsys, argv, ("changed while it was read", "tokenizer.json", "no run is writing"))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_merge_replaces_only_its_own_earlier_merge_and_publishes_plain_modes(world, tmp_path):
    import os
    import stat

    from slmlab.train.finetune import write_merged

    out = tmp_path / "merged"
    write_merged(world["lora"], out, replace_own=True)
    first = (out / "model.safetensors").stat().st_ino
    write_merged(world["lora"], out, replace_own=True)  # a fine-tune's own OUT/merged: replaced whole
    assert (out / "model.safetensors").stat().st_ino != first
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        write_merged(world["lora"], out)  # a standalone --merge --out never replaces
    other = victim(tmp_path)
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        write_merged(world["lora"], other, replace_own=True)  # someone else's folder is not the run's own
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o666 & ~mask}


# -- 4. --resume of a finished run adds nothing ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["train", "finetune"])
def test_resuming_a_finished_run_appends_no_second_final_eval(world, tmp_path, capsys, command):
    out = tmp_path / "run"
    if command == "train":
        argv = ["train", "--model", "lumen:lumen-tiny", *shlex.split(TRAIN.format(corpus=world["corpus"], tmp=tmp_path)),
                "--out", str(out), "vocab_size=300", "eval_batches=1", f"data_cache={tmp_path / 'cache'}"]
    else:
        argv = ["finetune", str(world["run"]), "--data", str(world["chat"]), "--out", str(out), "--steps", "1",
                *QUIET.split()]
    assert cli.main(argv) == 0
    records = (out / "metrics.jsonl").read_text()
    ckpt = sorted((out / "checkpoints").iterdir())[-1]
    stamp = (ckpt / "trainer" / "state.json").stat().st_mtime_ns
    assert cli.main([*argv, "--resume"]) == 0
    assert "resuming from step 1" in capsys.readouterr().out
    assert (out / "metrics.jsonl").read_text() == records  # no second final eval record
    assert (ckpt / "trainer" / "state.json").stat().st_mtime_ns == stamp  # its checkpoint is not written again
    assert cli.main([*argv[: argv.index("--steps") + 1], "2", *argv[argv.index("--steps") + 2:], "--resume"]) == 0
    evals = [line for line in (out / "metrics.jsonl").read_text().splitlines() if '"kind": "eval"' in line]
    assert [json.loads(line)["step"] for line in evals] == [1, 2]  # a longer resume still evaluates at its end


# -- 5. every report and JSON file is finite, valid JSON ------------------------------------------------------
def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_every_json_the_commands_wrote_parses_strictly(world, tmp_path, capsys):
    import math

    from slmlab.train.metrics import MetricsLogger

    capsys.readouterr()
    assert cli.main(["eval", str(world["run"]), "--data", str(world["corpus"]), "--json", "--no-progress"]) == 0
    strict_json(capsys.readouterr().out)
    logger = MetricsLogger(tmp_path / "run", False, True)  # a diverged step: what it logs is still JSON
    logger.log("eval", 1, {"loss": math.nan, "ppl": math.inf, "acc": 0.5})
    logger.close()
    files = [p for root in (world["run"].parent, tmp_path) for p in root.rglob("*") if p.suffix in (".json", ".jsonl")]
    assert len(files) > 20
    for path in files:
        for line in (path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]):
            strict_json(line)
    assert '"ppl": null' in (tmp_path / "run" / "metrics.jsonl").read_text()


def test_the_transactions_report_says_no_detections_not_nan(tmp_path):
    """A pattern with no detected case printed 'passed nan / nan' and metrics.json held a bare NaN."""
    pytest.importorskip("sklearn")
    import math

    from slmlab.transactions.evaluation.evaluate import write_report

    nan = math.nan
    model = {"pr_auc": nan, "roc_auc": 0.5, "recall_at_fpr_1pct": 0.0, "recall_at_fpr_0.1pct": 0.0,
             "card_precision_at_100": nan, "val_threshold_1pct": 0.5, "threshold_source": "validation",
             "val_threshold_fpr": 0.01, "val_pr_auc": nan, "per_pattern_recall": {"card_testing": 0.0},
             "amount_weighted_recall": nan,
             "detection_delay": {"card_testing": {"cases": 2, "detected": 0.0, "passed_median": nan, "passed_mean": nan,
                                                  "passed_mean_all": 3.0}}}
    write_report({"n_test": 10, "n_test_fraud": 2, "bootstrap": {}, "models": {"sequence": model}}, {}, None, tmp_path)
    metrics = strict_json((tmp_path / "metrics.json").read_text())
    assert metrics["models"]["sequence"]["pr_auc"] is None
    report = (tmp_path / "report.md").read_text()
    assert "card_testing 0/2 detected, passed n/a (no detections); all 3.00" in report and "nan / nan" not in report
    assert "| sequence | n/a [n/a, n/a] | 0.500 |" in report and "nan" not in report.lower().replace("n/a", "")


# -- 6. messages and flags that give the correct result --------------------------------------------------------
def test_generate_and_chat_share_their_length_flag(world, capsys):
    for flag in ("--max-new-tokens", "--max-tokens"):
        capsys.readouterr()
        assert cli.main(["generate", str(world["run"]), "--prompt-ids", "5,6", flag, "3", "--temperature", "0"]) == 0
        assert len(capsys.readouterr().out.split()) == 3
    for flag in ("--max-new-tokens", "--max-tokens"):
        refused(capsys, ["chat", str(world["run"]), flag, "100000"], ("--max-new-tokens 100000 leaves no room",))


def test_chat_survives_undecodable_input_and_keeps_its_history(world, monkeypatch, capsys):
    """Undecodable input ended the whole session (history lost) with a tokenizers TypeError."""
    from slmlab.generation import chat

    lines = iter(["What is 2 + 2?", "\udcff\udcfe", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
                  "/system \udcff", "/quit"])
    sessions = []
    real = chat.ChatSession

    def keep(*a, **k):
        sessions.append(real(*a, **k))
        return sessions[-1]

    def next_line(prompt=""):
        line = next(lines)
        if isinstance(line, Exception):
            raise line
        return line

    monkeypatch.setattr(chat, "ChatSession", keep)
    monkeypatch.setattr("builtins.input", next_line)
    assert cli.main(["chat", str(world["run"]), "--max-new-tokens", "4", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("(not sent: ") == 2 and "the message is not valid UTF-8 (byte 0xff" in out
    assert "(not set: the system line is not valid UTF-8" in out
    assert [t["role"] for t in sessions[0].turns] == ["user", "assistant"] and sessions[0].system is None


def test_running_out_of_memory_is_an_error_that_says_what_to_do(world, tmp_path, monkeypatch, capsys):
    """A 1e8-token vocabulary ended in 'internal error' (exit 70) when the allocation failed."""
    from slmlab.train import run

    def too_big(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried"
                           " to allocate 25600000000 bytes.")

    monkeypatch.setattr(run, "build_model", too_big)
    argv = ["train", "--model", "lumen:lumen-tiny", *shlex.split(TRAIN.format(corpus=world["corpus"], tmp=tmp_path)),
            "vocab_size=300"]
    refused(capsys, argv, ("out of memory", "not enough memory", "vocab_size"))


def test_demo_quick_removes_its_temporary_bank(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    import tempfile

    from slmlab.transactions import pipeline
    from slmlab.transactions.demo import app, state

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = []
    monkeypatch.setattr(state, "quick_state", lambda work: made.append(work) or (work / "bank").mkdir(parents=True) or
                        type("State", (), {"timings": {"generate_s": 0, "train_s": 0, "state_s": 0}})())
    monkeypatch.setattr(app, "check_port", lambda host, port: None)

    def stopped(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "launch", stopped)
    with pytest.raises(KeyboardInterrupt):
        pipeline.demo(quick=True, log=lambda line: None)
    assert made and made[0].name.startswith("slmlab-demo-") and list(tmp_path.iterdir()) == []
    kept = tmp_path / "mine"
    with pytest.raises(KeyboardInterrupt):
        pipeline.demo(quick=True, data=kept, log=lambda line: None)
    assert (kept / "bank").is_dir()  # a folder the user named is theirs: kept


def test_files_and_folders_have_ordinary_modes(world):
    """Model files were 0600 beside 0644 files, the token cache folder 0700."""
    import os
    import stat

    mask = os.umask(0o022)
    os.umask(mask)
    root = world["run"].parent
    paths = [p for p in root.rglob("*") if not p.name.startswith(".")]
    files = {p.relative_to(root).as_posix() for p in paths if p.is_file() and stat.S_IMODE(p.stat().st_mode) != 0o666 & ~mask}
    folders = {p.relative_to(root).as_posix() for p in paths if p.is_dir() and stat.S_IMODE(p.stat().st_mode) != 0o777 & ~mask}
    assert any(p.name == "model.safetensors" for p in paths) and any("tokens" in p.parts for p in paths)
    assert not files and not folders, (sorted(files)[:5], sorted(folders)[:5])


def test_exports_have_ordinary_modes(world, tmp_path):
    """An export folder is written through a temporary (0700) and a GGUF file through mkstemp (0600): both
    are published with the umask's modes, as every other file a command writes."""
    import os
    import stat

    mask = os.umask(0o022)
    os.umask(mask)
    assert cli.main(["export", str(world["run"]), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert cli.main(["export", str(world["run"]), "--to", "gguf", str(tmp_path / "m.gguf")]) == 0
    paths = [tmp_path / "hf", tmp_path / "m.gguf", *(tmp_path / "hf").rglob("*")]
    wrong = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in paths
             if stat.S_IMODE(p.stat().st_mode) != (0o777 if p.is_dir() else 0o666) & ~mask}
    assert len(paths) > 4 and not wrong, wrong


def test_a_comparison_whose_every_run_failed_is_not_a_success(tmp_path, monkeypatch, capsys):
    """`compare` exited 0 when every run failed; one run that works keeps the exit 0 (the report shows the rest)."""
    from slmlab.bench import compare

    argv = ["compare", "--models", "lumen", "--budget", "30k", "--tasks", "ar:cpu,T=16,n_train=64,n_test=32",
            "--batch-size", "8", "--seeds", "0", "--steps", "3", "--lrs", "1e-3", "--threads", "1"]
    real = compare.run_one

    def broken(*args, **kwargs):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(compare, "run_one", broken)
    refused(capsys, [*argv, "--out", str(tmp_path / "all")], ("all 1 runs failed", "the device fell over", "rerun"))
    monkeypatch.setattr(compare, "run_one", real)
    assert cli.main([*argv, "--out", str(tmp_path / "all")]) == 0  # the rerun retries the failed run, which now works
