"""DDP: ``torchrun --nproc_per_node=2`` (gloo, CPU) follows the same loss trajectory as one process
with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from slmlab.models.lumen import LumenConfig, LumenForCausalLM
    from slmlab.train import Trainer, load_config
    from slmlab.train.distributed import init_distributed, shutdown
    from test_train_toydata import ToySource

    batch, out = int(sys.argv[1]), sys.argv[2]
    dist = init_distributed(torch.device("cpu"))
    cfg = load_config([], [f"batch_size={{batch}}", "grad_accum=2", "max_steps=6", "eval_every=3", "eval_batches=2",
                           "eval_batch_size=4", "checkpoint_every=3", "progress=false", "tensorboard=false",
                           "optim.lr=3e-3", "device=cpu", f"out_dir={{out}}"])
    torch.manual_seed(0)
    model = LumenForCausalLM(LumenConfig(vocab_size=61, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                         intermediate_dim=48, max_seq_len=64))
    trainer = Trainer(cfg, model, ToySource(), None, out, dist)
    trainer.train()
    if dist.is_main:
        print("LOSSES " + json.dumps({{"losses": trainer.losses, "val": trainer.state.last_eval["loss"],
                                       "world": dist.world_size}}))
    shutdown(dist)
    """
)


def _run(cmd: list[str], cwd: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("LOSSES "))
    return json.loads(line[len("LOSSES "):])


@pytest.mark.slow
def test_torchrun_two_ranks_matches_one_process_with_the_global_batch(tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    single = _run([sys.executable, str(script), "4", str(tmp_path / "single")], tmp_path)
    ddp = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                str(script), "2", str(tmp_path / "ddp")], tmp_path)
    assert single["world"] == 1 and ddp["world"] == 2
    assert len(ddp["losses"]) == len(single["losses"]) == 6
    for a, b in zip(ddp["losses"], single["losses"]):
        assert abs(a - b) <= 1e-4, (ddp["losses"], single["losses"])
    assert abs(ddp["val"] - single["val"]) <= 1e-4
    assert (tmp_path / "ddp" / "checkpoints" / "step_000006" / "model.safetensors").is_file()
