"""Sharded (DCP) checkpoints reshard: a ``parallel=fsdp2`` run saved at 2 ranks resumes at 1 (and at 4)
with the next steps' losses of the uninterrupted run; ``slmlab eval`` and ``slmlab export`` read them.

The ranks run on CPU with gloo (:func:`test_train_fsdp.spawn_ranks`); one process reads a sharded
checkpoint without any process group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slmlab import cli
from slmlab.train.checkpoint import CheckpointError, check_checkpoint, is_dcp_checkpoint, list_checkpoints
from test_train_fsdp import FAMILIES, assert_close, fsdp_job, spawn_ranks, toy_model, train_toy


def resume_job(family: str, out: Path, ckpt: Path, rows: int, *extra: str) -> dict:
    return {"family": family, "resume": str(ckpt),
            "overrides": [f"batch_size={rows}", "max_steps=6", f"out_dir={out}", *extra]}


def test_saved_at_two_ranks_resumes_in_one_process_with_the_same_losses(tmp_path):
    [whole] = spawn_ranks(2, [fsdp_job("lumen", tmp_path / "two", 6, 2, "checkpoint_every=3")], tmp_path)
    ckpt = tmp_path / "two" / "checkpoints" / "step_000003"
    assert is_dcp_checkpoint(ckpt) and not (ckpt / "model.safetensors").exists()
    state = json.loads((ckpt / "trainer" / "state.json").read_text())
    assert state["world_size"] == 2 and state["global_batch_rows"] == 4
    # one plain process (parallel=ddp, no group) with the same global batch: steps 4..6 as the 2 ranks ran them
    one = train_toy(resume_job("lumen", tmp_path / "one", ckpt, 4))
    assert_close(one["losses"], whole["losses"][3:])
    assert not is_dcp_checkpoint(Path(one["checkpoint"]))  # it goes on writing whole checkpoints


@pytest.mark.slow
def test_saved_at_two_ranks_resumes_at_four_and_at_one_for_every_family(tmp_path):
    """Every family 2 -> 4 ranks and 2 ranks -> 1 process; and a whole checkpoint of one process -> 4 ranks."""
    saved = spawn_ranks(2, [fsdp_job(f, tmp_path / f, 6, 2, "checkpoint_every=3") for f in FAMILIES], tmp_path)
    ckpts = {f: tmp_path / f / "checkpoints" / "step_000003" for f in FAMILIES}
    plain = train_toy({"family": "lfm2", "overrides": ["batch_size=4", "max_steps=6", "checkpoint_every=3",
                                                       f"out_dir={tmp_path / 'plain'}"]})
    jobs = [resume_job(f, tmp_path / f"{f}-4", ckpts[f], 1, "parallel=fsdp2") for f in FAMILIES]
    jobs.append(resume_job("lfm2", tmp_path / "plain-4", tmp_path / "plain" / "checkpoints" / "step_000003", 1,
                           "parallel=fsdp2"))
    *fours, from_whole = spawn_ranks(4, jobs, tmp_path)
    for family, whole, four in zip(FAMILIES, saved, fours):
        one = train_toy(resume_job(family, tmp_path / f"{family}-1", ckpts[family], 4))
        assert_close(four["losses"], whole["losses"][3:])
        assert_close(one["losses"], whole["losses"][3:])
        shards = tmp_path / f"{family}-4" / "checkpoints" / "step_000006" / "dcp" / "model"
        assert len(list(shards.glob("*.safetensors"))) == 4
    assert_close(from_whole["losses"], plain["losses"][3:])


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """A real ``slmlab train parallel=fsdp2`` run in this process (a group of one): 2 steps of lumen-tiny."""
    root = tmp_path_factory.mktemp("dcp")
    (root / "corpus").mkdir()
    for i in range(3):
        (root / "corpus" / f"w{i}.txt").write_text("Shall I compare thee to a summer's day?\n" * (40 + 10 * i))
    out = root / "run"
    assert cli.main(["train", "--model", "lumen:lumen-tiny", "--data", str(root / "corpus"), "--out", str(out),
                     "batch_size=2", "block_size=24", "vocab_size=300", "eval_batches=0", "eval_every=0",
                     "checkpoint_every=0", "progress=false", "tensorboard=false", f"data_cache={root / 'cache'}",
                     "sample_tokens=8", "parallel=fsdp2", "--steps", "2"]) == 0
    assert not torch.distributed.is_initialized()  # the group of one is gone with the run
    return out


def test_eval_and_export_read_a_sharded_checkpoint(sharded_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from slmlab.train.saved import load_for_inference

    ckpt = list_checkpoints(sharded_run / "checkpoints")[-1]
    assert is_dcp_checkpoint(ckpt)
    report = json.loads((sharded_run / "report.json").read_text())
    assert report["sample"]  # the report's sample came from the gathered model
    loaded = load_for_inference(sharded_run, device="cpu")
    capsys.readouterr()
    assert cli.main(["eval", str(sharded_run), "--json", "--no-progress", "--device", "cpu"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(evaluated["loss"] - report["final_eval"]["loss"]) <= 1e-5  # what training measured at the end
    out = tmp_path / "hf"
    assert cli.main(["export", str(sharded_run), "--to", "hf", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.randint(0, loaded.model.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, loaded.model(input_ids=ids).logits, atol=1e-5)


def test_a_sharded_checkpoint_missing_its_shards_is_named(sharded_run, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(list_checkpoints(sharded_run / "checkpoints")[-1], ckpt)
    check_checkpoint(ckpt)
    for shard in (ckpt / "dcp" / "optimizer").glob("*.safetensors"):
        shard.unlink()
    check_checkpoint(ckpt, need_trainer=False)  # inference needs only the model's shards
    with pytest.raises(CheckpointError, match="dcp/optimizer/ holds no shard"):
        check_checkpoint(ckpt)
    [shard] = (ckpt / "dcp" / "model").glob("*.safetensors")
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated|corrupt"):
        check_checkpoint(ckpt, need_trainer=False)


def test_sharded_weights_load_into_a_whole_model_by_name_with_the_tied_head_once(tmp_path):
    """The format in one process: tensors by state_dict name (the tied LM head stored once, under the
    embedding's name); a model of another shape is refused naming the weight."""
    from slmlab.train.dcp import load_model_tensors, model_tensors
    from slmlab.train.distributed import init_distributed, shutdown

    model = toy_model("lumen")
    assert "lm_head.weight" not in model_tensors(model) and "model.embed_tokens.weight" in model_tensors(model)
    info = init_distributed(torch.device("cpu"), group=True)
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        dcp.save(model_tensors(model), storage_writer=HuggingFaceStorageWriter(str(tmp_path / "m"), save_distributed=True))
    finally:
        shutdown(info)
    torch.manual_seed(1)
    other = toy_model("lumen")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    load_model_tensors(other, tmp_path / "m")
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    from slmlab.models import get_family

    fam = get_family("lumen")
    wider = fam.model_class(fam.make_config("lumen-tiny", vocab_size=67))
    with pytest.raises(CheckpointError, match="model.embed_tokens.weight has shape"):
        load_model_tensors(wider, tmp_path / "m")


def test_resuming_at_another_world_size_keeps_the_global_batch(tmp_path):
    """``--resume`` at another world size: the per-rank batch_size may change with it when the global
    batch stays; any other change of batch_size is still refused by the resume check."""
    from slmlab.train import load_config
    from slmlab.train.distributed import DistInfo
    from slmlab.train.run import same_global_batch

    ckpt = tmp_path / "ckpt"
    (ckpt / "trainer").mkdir(parents=True)
    (ckpt / "trainer" / "state.json").write_text(json.dumps({"world_size": 2, "global_batch_rows": 8}))
    saved = {"batch_size": 4, "seed": 0}
    fits, changes = same_global_batch(saved, ckpt, load_config([], ["batch_size=8"]), DistInfo())
    assert fits["batch_size"] == 8 and changes == [
        "batch_size: 4 -> 8 per rank, 2 -> 1 ranks (the same global batch of 8 rows)"]
    four = DistInfo(rank=0, world_size=4)
    assert same_global_batch(saved, ckpt, load_config([], ["batch_size=2"]), four)[0]["batch_size"] == 2
    assert same_global_batch(saved, ckpt, load_config([], ["batch_size=6"]), DistInfo()) == (saved, [])
