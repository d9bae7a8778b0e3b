"""Process-group setup for ``torchrun`` (DDP): nothing home-made, only ``torch.distributed``.

Under ``torchrun --nproc_per_node=N`` the environment carries ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
we join the group with gloo on CPU and nccl on CUDA. A plain ``python`` run is world size 1 and never
touches ``torch.distributed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size``; ``is_main`` logs and writes checkpoints."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistInfo:
    """Join the torchrun process group if the environment describes one (idempotent)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=str(device))


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Average a tensor over ranks (no-op in a single process)."""
    if info.enabled:
        value = value.detach().to(info.device).clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value.cpu()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_flag(flag: bool, info: DistInfo) -> bool:
    """True on every rank if it is True on any rank (stop requests, early stop)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
