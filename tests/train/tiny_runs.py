"""A real `slmlab train` run small enough for a test fixture (shared by the train, export and serve tests)."""

from __future__ import annotations

from pathlib import Path

from slmlab import cli


def train_tiny_run(root: Path, block_size: int, line: str, steps: int = 2) -> Path:
    """``steps`` steps of ``lumen:lumen-tiny`` (BPE of 300) on three small text files of ``line``
    repeated, at ``block_size``; returns the run folder ``root/run``."""
    (root / "corpus").mkdir()
    for i in range(3):
        (root / "corpus" / f"w{i}.txt").write_text(line * (40 + 10 * i))
    out = root / "run"
    args = ["train", "--model", "lumen:lumen-tiny", "--data", str(root / "corpus"), "--out", str(out), "batch_size=2",
            f"block_size={block_size}", "vocab_size=300", "eval_batches=1", "eval_every=0", "checkpoint_every=0",
            "progress=false", "tensorboard=false", f"data_cache={root / 'cache'}", "sample_tokens=0",
            "--steps", str(steps)]
    assert cli.main(args) == 0
    return out
