"""Several machines: two ``torchrun`` "nodes" of one process each on localhost, joined by the c10d
rendezvous (the command docs/training.md shows), follow one process with the same global batch, under
DDP and under FSDP2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_train_fsdp import assert_close, free_port, train_toy

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = {paths!r}
    import torch
    torch.set_num_threads(1)
    from slmlab.train.distributed import init_distributed, shutdown
    from test_train_fsdp import train_toy

    info = init_distributed(torch.device("cpu"))
    jobs = json.loads(sys.argv[2])
    results = [train_toy(job, info) for job in jobs]
    shutdown(info)
    if info.is_main:
        open(sys.argv[1], "w").write(json.dumps(results))
    """
)


def node(script: Path, port: int, out: Path, jobs: list[dict]) -> subprocess.Popen:
    """One "machine": a torchrun agent with one process, rendezvous at 127.0.0.1:port."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=slmlab-multinode-test", str(script), str(out),
           json.dumps(jobs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_nodes_of_one_process_match_one_process(tmp_path):
    tests = Path(__file__).resolve().parents[1]
    script = tmp_path / "node.py"
    script.write_text(SCRIPT.format(paths=[str(tests / "train"), str(tests / "models"), str(tests)]))
    jobs = [{"family": "lfm2", "overrides": ["batch_size=2", "max_steps=5", f"out_dir={tmp_path / name}",
                                             f"parallel={name}"]} for name in ("ddp", "fsdp2")]
    out, port = tmp_path / "results.json", free_port()
    agents = [node(script, port, out, jobs) for _ in range(2)]
    logs = [agent.communicate(timeout=600)[0] for agent in agents]
    assert all(a.returncode == 0 for a in agents), "\n".join(log[-3000:] for log in logs)
    ddp, fsdp = json.loads(out.read_text())
    single = train_toy({"family": "lfm2", "overrides": ["batch_size=4", "max_steps=5", f"out_dir={tmp_path / 'one'}"]})
    assert ddp["world"] == fsdp["world"] == 2 and (ddp["parallel"], fsdp["parallel"]) == ("DDP", "FSDP2")
    assert_close(ddp["losses"], single["losses"])
    assert_close(fsdp["losses"], single["losses"])
