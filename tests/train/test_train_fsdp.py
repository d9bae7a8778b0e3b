"""FSDP2 (``parallel=fsdp2``) on CPU with gloo: 2 ranks follow one process with the same global batch.

Ranks are started with ``torch.multiprocessing`` on localhost (a free port); the one-process reference
runs in the test's own process. :func:`spawn_ranks` and :func:`train_toy` are reused by the DCP and
multi-node tests.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

FAMILIES = ("lumen", "lfm2", "pgsm", "nanohammer", "neollm")
NO_DROPOUT = {"neollm": {"dropout_rate": 0.0, "attention_dropout": 0.0}}  # the others have none


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toy_model(family: str):
    """The family's tiny preset at the toy source's vocabulary (61 ids), seeded; NeoLLM without its
    seed's dropout (ranks draw their own masks, so no two layouts of a batch could agree), its Spelling
    Bee embeddings given a byte table (as ``slmlab train`` gives them the tokenizer's)."""
    from slmlab.models import get_family

    fam = get_family(family)
    preset = next(p for p in fam.presets if "tiny" in p)
    torch.manual_seed(0)
    overrides = NO_DROPOUT.get(family, {})
    model = fam.model_class(fam.make_config(preset, vocab_size=61, **overrides))
    if getattr(model.config, "use_spelling_bee_embeddings", False):
        model.model.spelling_bee.set_byte_table_from_bytes([bytes((t * 7 + i) % 256 for i in range(t % 8)) for t in range(61)])
    return model


def train_toy(job: dict, dist_info=None) -> dict:
    """Train ``job["family"]`` on the toy source with ``job["overrides"]`` (resuming from
    ``job["resume"]`` when given); returns the per-step losses, the gradient norms and the validation loss."""
    from slmlab.train import Trainer, load_config
    from test_train_toydata import ToySource

    cfg = load_config([], ["progress=false", "tensorboard=false", "device=cpu", "eval_every=0", "eval_batches=1",
                           "eval_batch_size=4", "optim.lr=3e-3", "checkpoint_every=0", "schedule.warmup=2",
                           *job["overrides"]])
    trainer = Trainer(cfg, toy_model(job["family"]), ToySource(seq_len=16), None, cfg.out_dir, dist_info)
    if job.get("resume"):
        trainer.resume(job["resume"])
    grad_norms = []
    step = trainer.train_step

    def recorded(stream):
        out = step(stream)
        grad_norms.append(out.grad_norm)
        return out

    trainer.train_step = recorded
    trainer.train()
    return {"losses": trainer.losses, "grad_norms": grad_norms, "val": trainer.state.last_eval.get("loss"),
            "world": trainer.dist.world_size, "parallel": trainer.parallel.name,
            "checkpoint": str(trainer.last_checkpoint())}


def _rank(rank: int, world: int, port: int, jobs: list[dict], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from slmlab.train.distributed import init_distributed, shutdown

    info = init_distributed(torch.device("cpu"))
    try:
        results = [train_toy(job, info) for job in jobs]
    finally:
        shutdown(info)
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def spawn_ranks(world: int, jobs: list[dict], tmp_path: Path) -> list[dict]:
    """Run ``jobs`` (one after another, see :func:`train_toy`) on ``world`` ranks; returns rank 0's results."""
    out = tmp_path / f"ranks-{world}-{free_port()}.json"
    mp.spawn(_rank, args=(world, free_port(), jobs, str(out)), nprocs=world, join=True)
    return json.loads(out.read_text())


def fsdp_job(family: str, out: Path, steps: int, rows: int, *extra: str) -> dict:
    return {"family": family, "overrides": [f"batch_size={rows}", f"max_steps={steps}", f"out_dir={out}",
                                            "parallel=fsdp2", *extra]}


def assert_close(a: list[float], b: list[float], tol: float = 1e-5) -> None:
    assert len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b)), (a, b)


def test_fsdp2_two_ranks_match_one_process_lumen(tmp_path):
    """The quick check of the default suite: one family, 6 steps, accumulation of 2 micro-batches, an
    evaluation at step 3 in between (a forward without backward leaves FSDP2's root gathered)."""
    [fsdp] = spawn_ranks(2, [fsdp_job("lumen", tmp_path / "fsdp", 6, 2, "grad_accum=2", "eval_every=3")], tmp_path)
    single = train_toy({"family": "lumen", "overrides": ["batch_size=4", "max_steps=6", "grad_accum=2", "eval_every=3",
                                                         f"out_dir={tmp_path / 'single'}"]})
    assert fsdp["world"] == 2 and fsdp["parallel"] == "FSDP2" and single["parallel"] == "single process"
    assert_close(fsdp["losses"], single["losses"])
    assert_close(fsdp["grad_norms"], single["grad_norms"], 1e-4)
    assert abs(fsdp["val"] - single["val"]) <= 1e-5
    assert (Path(fsdp["checkpoint"]) / "dcp" / "model").is_dir()  # a sharded checkpoint, one file per rank
    assert len(list((Path(fsdp["checkpoint"]) / "dcp" / "model").glob("*.safetensors"))) == 2


@pytest.mark.slow
def test_fsdp2_two_ranks_match_one_process_for_every_family_over_20_steps(tmp_path):
    jobs = [fsdp_job(f, tmp_path / f, 20, 2) for f in FAMILIES]
    results = spawn_ranks(2, jobs, tmp_path)
    for family, fsdp in zip(FAMILIES, results):
        single = train_toy({"family": family, "overrides": ["batch_size=4", "max_steps=20",
                                                            f"out_dir={tmp_path / (family + '-single')}"]})
        assert_close(fsdp["losses"], single["losses"])


@pytest.mark.slow
def test_fsdp2_composes_with_checkpointing_compile_bf16_and_offload(tmp_path):
    """Gradient checkpointing, torch.compile and CPU offload change no loss; the bf16 policy stays close."""
    base = [fsdp_job("lfm2", tmp_path / "base", 4, 2)]
    variants = {
        "checkpointing": ("gradient_checkpointing=true",),
        "compile": ("compile=true",),
        "offload": ("fsdp_cpu_offload=true",),
        "bf16": ("precision=bf16",),
    }
    jobs = base + [fsdp_job("lfm2", tmp_path / name, 4, 2, *extra) for name, extra in variants.items()]
    results = dict(zip(["base", *variants], spawn_ranks(2, jobs, tmp_path)))
    for name in ("checkpointing", "compile", "offload"):
        assert_close(results[name]["losses"], results["base"]["losses"], 1e-5 if name != "compile" else 1e-4)
    assert_close(results["bf16"]["losses"], results["base"]["losses"], 5e-2)
    assert results["bf16"]["losses"] != results["base"]["losses"]  # the policy did compute in bf16


def test_fsdp2_in_one_process_forms_a_group_of_one(tmp_path):
    """``parallel=fsdp2`` in a plain process shards over a group of one: the same losses as the plain model."""
    from slmlab.train.distributed import init_distributed, shutdown

    info = init_distributed(torch.device("cpu"), group=True)
    try:
        sharded = train_toy(fsdp_job("pgsm", tmp_path / "one", 3, 4), info)
    finally:
        shutdown(info)
    plain = train_toy({"family": "pgsm", "overrides": ["batch_size=4", "max_steps=3", f"out_dir={tmp_path / 'plain'}"]})
    assert sharded["parallel"] == "FSDP2" and sharded["world"] == 1
    assert_close(sharded["losses"], plain["losses"])


def test_the_config_refuses_what_fsdp2_cannot_do():
    from slmlab.train import load_config
    from slmlab.train.config import PARALLEL_CHOICES
    from slmlab.train.parallel import NEEDS_GROUP, PARALLEL

    assert set(PARALLEL) == set(NEEDS_GROUP) == set(PARALLEL_CHOICES)
    with pytest.raises(ValueError, match="parallel must be one of ddp, fsdp2"):
        load_config([], ["parallel=fsdp"])
    with pytest.raises(ValueError, match="Muon orthogonalises whole matrices"):
        load_config([], ["parallel=fsdp2", "optim.name=muon"])
    with pytest.raises(ValueError, match="needs parallel=fsdp2"):
        load_config([], ["fsdp_cpu_offload=true"])


def test_fsdp2_wraps_each_decoder_layer_of_every_family():
    from slmlab.train.fsdp import decoder_layers

    for family in FAMILIES:
        model = toy_model(family)
        layers = decoder_layers(model)
        assert len(layers) >= model.config.num_hidden_layers, family  # PGSM adds its post-retrieval block
        assert all(type(m).__name__ in model._no_split_modules for m in layers)
    with pytest.raises(ValueError, match="_no_split_modules"):
        decoder_layers(torch.nn.Linear(2, 2))
