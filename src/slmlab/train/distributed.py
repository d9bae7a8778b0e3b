"""Process-group setup for ``torchrun`` (DDP, FSDP2): nothing home-made, only ``torch.distributed``.

Under ``torchrun --nproc_per_node=N`` (one machine) or ``torchrun --nnodes=M --rdzv-backend=c10d``
(several) the environment carries ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; we join the group with gloo
on CPU and nccl on CUDA. A plain ``python`` run is world size 1 and never touches
``torch.distributed``, unless it asks for a group of one (``group=True``: FSDP2 shards over a process
group even when it holds a single process).
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
    grouped: bool = False  # this process joined a process group (a group of one included)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device, group: bool = False) -> DistInfo:
    """Join the torchrun process group if the environment describes one (idempotent).

    Args:
        device: where this rank computes (gloo for CPU, nccl for CUDA).
        group: also form a group of one when the environment describes none (a plain ``python``
            run of ``parallel=fsdp2``, which shards over a process group of any size).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if world <= 1:
        if not group:
            return DistInfo()
        if not dist.is_initialized():  # an in-process store: nothing listens on a port
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        return DistInfo(device=str(device), grouped=True)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=str(device), grouped=True)


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


def broadcast_int(value: int, info: DistInfo) -> int:
    """The main rank's ``value`` on every rank (e.g. the name of a checkpoint all ranks write into)."""
    if not info.enabled:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=info.device)
    dist.broadcast(t, src=0)
    return int(t.item())


def shutdown(info: DistInfo) -> None:
    if (info.enabled or info.grouped) and dist.is_initialized():
        dist.destroy_process_group()
